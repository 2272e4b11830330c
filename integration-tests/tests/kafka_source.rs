//! The Kafka source against the real broker: start positions, restored offsets winning over them,
//! group offsets committed only on completed checkpoints, read_committed isolation, partition and
//! topic discovery, rescaling across restores, and the poison-record policies.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use exactly_core::coordinator::CheckpointConfig;
use exactly_core::restart::RestartStrategy;
use exactly_core::runtime::{JobBuilder, JobConfig, JobHandle};
use exactly_integration_tests::{
    create_topic, create_topic_with, delete_records_before, eventually, produce, read_committed, recreate_topic,
    subtask_info, transactional_producer, unique, Committed, CommittingCollector, TestEnv,
};
use exactly_kafka_source::{
    Json, KafkaRecord, KafkaSource, KafkaSourceConfig, PoisonPolicy, RawBytes, ResetPosition, StartPosition,
};
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

#[path = "kafka_source/group_offsets.rs"]
mod group_offsets;
#[path = "kafka_source/positions.rs"]
mod positions;
#[path = "kafka_source/records.rs"]
mod records;
#[path = "kafka_source/transactions_and_discovery.rs"]
mod transactions_and_discovery;

const T: Duration = Duration::from_secs(60);

/// Topic settings for records stamped in 2023 (fixed timestamps the tests assert): without them
/// the broker's 7-day time retention deletes the records at its next check (every 5 minutes), and
/// a test that reads them during the few seconds that straddle a check finds nothing (seen: a
/// timestamp start position then rightly started at the end and waited 60 s for records).
const OLD_TIMESTAMPS: &[(&str, &str)] = &[("retention.ms", "-1")];

fn job_config(dir: &Path, interval: Duration) -> JobConfig {
    let mut c = CheckpointConfig::new(dir);
    c.interval = interval;
    let mut config = JobConfig::new("source-test");
    config.checkpointing = Some(c);
    config.restart = RestartStrategy::None;
    config
}

fn start_job(config: JobConfig, source: KafkaSourceConfig, parallelism: u32, out: Committed<KafkaRecord>) -> JobHandle {
    let mut job = JobBuilder::new(config);
    job.source("kafka", parallelism, move |_| {
        KafkaSource::new(source.clone(), RawBytes)
    })
    .sink("collect", move |_| CommittingCollector::new(out.clone()));
    job.build().expect("valid job").start()
}

fn values(out: &Committed<KafkaRecord>) -> Vec<String> {
    let mut v: Vec<String> = out
        .lock()
        .unwrap()
        .iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    v.sort();
    v
}

fn count(out: &Committed<KafkaRecord>) -> usize {
    out.lock().unwrap().len()
}

/// Ten records v0..v9 in partition 0 with timestamps base + i seconds.
fn produce_timed(env: &TestEnv, topic: &str, base: i64) -> Result<()> {
    let p: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()?;
    for i in 0..10i64 {
        let v = format!("v{i}");
        p.send(
            BaseRecord::<str, str>::to(topic)
                .partition(0)
                .payload(&v)
                .timestamp(base + i * 1000),
        )
        .map_err(|(e, _)| e)?;
    }
    p.flush(T)?;
    Ok(())
}

async fn run_until(env: &TestEnv, topic: &str, start: StartPosition, expect: usize) -> Result<Vec<String>> {
    let dir = tempfile::tempdir()?;
    let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.to_owned()], unique("g"));
    source.start = start;
    let out: Committed<KafkaRecord> = Arc::default();
    let handle = start_job(
        job_config(dir.path(), Duration::from_millis(100)),
        source,
        1,
        out.clone(),
    );
    eventually("records", T, || count(&out) >= expect).await?;
    handle.stop().await?;
    handle.join().await?;
    Ok(values(&out))
}

fn group_offset(env: &TestEnv, group: &str, topic: &str) -> Result<Offset> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .set("group.id", group)
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    Ok(c.committed_offsets(tpl, T)?
        .find_partition(topic, 0)
        .map_or(Offset::Invalid, |p| p.offset()))
}

/// A source with `config`, driven by hand as subtask `info`, initialized with `restored`.
async fn started(
    config: KafkaSourceConfig,
    info: &exactly_core::runtime::SubtaskInfo,
    restored: Option<&exactly_core::state::RestoredState>,
) -> exactly_core::Result<KafkaSource<KafkaRecord, RawBytes>> {
    use exactly_core::runtime::{InitContext, Source};
    let mut source = KafkaSource::new(config, RawBytes);
    source.initialize_state(&InitContext::new(info, restored)).await?;
    Ok(source)
}

/// Reads from a source driven by hand until it has handed on `n` records or `T` passed; the
/// values read (fewer than `n` if none came for `T`).
async fn read_values(source: &mut KafkaSource<KafkaRecord, RawBytes>, n: usize) -> Result<Vec<String>> {
    use exactly_core::runtime::Source;
    let mut out = Vec::new();
    let until = std::time::Instant::now() + T;
    while out.len() < n && std::time::Instant::now() < until {
        source.poll_next(&mut out).await?;
    }
    Ok(out
        .iter()
        .map(|r: &KafkaRecord| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect())
}

/// What a restore of a source driven by hand gets back from its snapshot now.
async fn snapshot_of(source: &mut KafkaSource<KafkaRecord, RawBytes>) -> Result<exactly_core::state::RestoredState> {
    use exactly_core::runtime::{SnapshotContext, Source};
    let mut ctx = SnapshotContext::new(1, exactly_core::SnapshotKind::Checkpoint, 0);
    source.snapshot_state(&mut ctx).await?;
    ctx.finish_deferred().await?;
    Ok(ctx.into_restored())
}

/// A topic `prefix-…` holding a0..a9, read by a source driven by hand (subtask `uid`), and what a
/// restore would get back from that source's snapshot then (position 10, with the topic's ID).
async fn ten_read_and_snapshotted(
    env: &TestEnv,
    prefix: &str,
    uid: &str,
) -> Result<(
    String,
    KafkaSourceConfig,
    exactly_core::runtime::SubtaskInfo,
    exactly_core::state::RestoredState,
)> {
    let topic = unique(prefix);
    create_topic(env, &topic, 1).await?;
    produce(env, &topic, &labelled("a", 10))?;
    let config = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    let info = subtask_info(uid);
    let mut source = started(config.clone(), &info, None).await?;
    assert_eq!(read_values(&mut source, 10).await?, values_of("a", 10));
    let state = snapshot_of(&mut source).await?;
    Ok((topic, config, info, state))
}

fn labelled(prefix: &str, n: usize) -> Vec<(String, String)> {
    (0..n).map(|i| ("k".into(), format!("{prefix}{i}"))).collect()
}

fn values_of(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}
