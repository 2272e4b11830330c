//! A Kafka-to-MySQL exactly-once job for crash tests: reads `--input` (delimited `id,key,seq`
//! records), writes rows to `--table` in `--mode` xa or upsert, checkpoints into `--checkpoints`.
//! Runs until killed. Fail points come from `EXACTLY_FAILPOINTS`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use exactly_core::coordinator::CheckpointConfig;
use exactly_core::restart::RestartStrategy;
use exactly_core::runtime::{JobBuilder, JobConfig};
use exactly_kafka_source::{KafkaRecord, KafkaSource, KafkaSourceConfig, RawBytes};
use exactly_mysql_sink::{
    Column, ColumnType, Format, Mapping, Mode, MysqlSink, MysqlSinkConfig, OnError, Origin, SinkRecord,
};

fn arg(name: &str) -> Result<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .with_context(|| format!("missing {name} VALUE"))
}

fn column(name: &str, ty: ColumnType, key: bool) -> Column {
    let c = Column::new(name, ty).length(64);
    if key {
        c.key()
    } else {
        c
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    let mut checkpoint = CheckpointConfig::new(PathBuf::from(arg("--checkpoints")?));
    checkpoint.interval = humantime::parse_duration(&arg("--interval")?)?;
    checkpoint.timeout = Duration::from_secs(10);
    checkpoint.tolerable_failures = 100;
    checkpoint.retained = 2;
    let mut config = JobConfig::new("k2m");
    config.checkpointing = Some(checkpoint);
    config.restart = RestartStrategy::FixedDelay {
        attempts: 50,
        delay: Duration::from_millis(500),
    };
    let source = KafkaSourceConfig::new(arg("--bootstrap")?, vec![arg("--input")?], arg("--group")?);
    let mode = match arg("--mode")?.as_str() {
        "xa" => Mode::Xa,
        _ => Mode::Upsert,
    };
    // Upsert needs its key. XA writes plain INSERTs: without a primary key on `id`, a record
    // written twice is a second row the test sees, not a "Duplicate entry" error and a restart
    // loop that would hide it.
    let id_is_key = mode == Mode::Upsert;
    let sink = MysqlSinkConfig {
        url: arg("--mysql")?,
        table: arg("--table")?,
        mode,
        job_id: arg("--job")?,
        sink_id: "rows".into(),
        mapping: Mapping {
            format: Format::Delimited { delimiter: ',' },
            columns: vec![
                column("id", ColumnType::Bigint, id_is_key),
                column("k", ColumnType::Varchar, false),
                column("seq", ColumnType::Bigint, false),
            ],
        },
        batch_size: 200,
        create_table: true,
        progress_table: arg("--progress")?,
        on_error: OnError::Fail,
    };
    sink.validate()?;
    let parallelism: u32 = arg("--parallelism")?.parse()?;
    let mut job = JobBuilder::new(config);
    job.source("kafka-in", parallelism, move |_| {
        KafkaSource::new(source.clone(), RawBytes)
    })
    .map(|r: KafkaRecord| SinkRecord {
        tombstone: r.value.is_none(),
        payload: r.value.unwrap_or_default(),
        key: r.key,
        origin: Some(Origin {
            topic: r.topic.to_string(),
            partition: r.partition,
            offset: r.offset,
        }),
    })
    .sink("mysql-out", move |_| {
        MysqlSink::new(sink.clone()).expect("validated configuration")
    });
    job.build()?.run().await?;
    Ok(())
}
