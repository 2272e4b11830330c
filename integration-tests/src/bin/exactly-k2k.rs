//! A Kafka-to-Kafka exactly-once job for crash tests: reads `--input`, writes every record
//! (key, value, timestamp, headers) to `--output` through the transactional sink, checkpoints
//! into `--checkpoints`. Runs until killed (or, with `--no-restart`, until its first failure).
//! Fail points come from `EXACTLY_FAILPOINTS`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use exactly_core::coordinator::CheckpointConfig;
use exactly_core::restart::RestartStrategy;
use exactly_core::runtime::{JobBuilder, JobConfig};
use exactly_kafka_sink::{DeliveryGuarantee, KafkaSink, KafkaSinkConfig, ProducerRecord};
use exactly_kafka_source::{KafkaRecord, KafkaSource, KafkaSourceConfig, RawBytes};

fn arg(name: &str) -> Result<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .with_context(|| format!("missing {name} VALUE"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    let bootstrap = arg("--bootstrap")?;
    let parallelism: u32 = arg("--parallelism")?.parse()?;
    let interval = humantime::parse_duration(&arg("--interval")?)?;
    let timeout = humantime::parse_duration(&arg("--checkpoint-timeout")?)?;
    let mut checkpoint = CheckpointConfig::new(PathBuf::from(arg("--checkpoints")?));
    checkpoint.interval = interval;
    checkpoint.timeout = timeout;
    checkpoint.tolerable_failures = 100;
    checkpoint.retained = 2;
    let mut config = JobConfig::new("k2k");
    config.checkpointing = Some(checkpoint);
    config.restart = if std::env::args().any(|a| a == "--no-restart") {
        RestartStrategy::None
    } else {
        RestartStrategy::FixedDelay {
            attempts: 20,
            delay: Duration::from_millis(200),
        }
    };
    let source = KafkaSourceConfig::new(&bootstrap, vec![arg("--input")?], arg("--group")?);
    let sink = KafkaSinkConfig::new(
        &bootstrap,
        arg("--output")?,
        DeliveryGuarantee::ExactlyOnce {
            transactional_id_prefix: arg("--prefix")?,
            pool_size: 3,
            transaction_timeout: Duration::from_secs(120),
        },
    );
    sink.validate_against_checkpoints(interval, timeout, config.restart.longest_delay())?;
    let mut job = JobBuilder::new(config);
    job.source("kafka-in", parallelism, move |_| {
        KafkaSource::new(source.clone(), RawBytes)
    })
    .map(|r: KafkaRecord| ProducerRecord {
        key: r.key,
        value: r.value,
        timestamp: r.timestamp,
        headers: r.headers,
    })
    .sink("kafka-out", move |_| {
        KafkaSink::new(sink.clone()).expect("validated configuration")
    });
    job.build()?.run().await?;
    Ok(())
}
