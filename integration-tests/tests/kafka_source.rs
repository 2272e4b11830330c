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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_start_position_and_restored_offsets_winning_over_it() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-start");
    create_topic_with(env, &topic, 1, OLD_TIMESTAMPS).await?;
    let base = 1_700_000_000_000;
    produce_timed(env, &topic, base)?;
    let all: Vec<String> = (0..10).map(|i| format!("v{i}")).collect();

    assert_eq!(run_until(env, &topic, StartPosition::Earliest, 10).await?, all);
    assert_eq!(
        run_until(env, &topic, StartPosition::Timestamp { ms: base + 5000 }, 5).await?,
        all[5..]
    );
    let specific = StartPosition::Specific {
        offsets: [(format!("{topic}:0"), 4)].into(),
        reset: ResetPosition::None,
    };
    assert_eq!(run_until(env, &topic, specific, 6).await?, all[4..]);

    // Group offsets: commit 7 for the group first.
    let group = unique("g-committed");
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .set("group.id", &group)
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Offset(7))?;
    c.commit(&tpl, CommitMode::Sync)?;
    let dir = tempfile::tempdir()?;
    let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], &group);
    source.start = StartPosition::GroupOffsets {
        reset: ResetPosition::Earliest,
    };
    let out: Committed<KafkaRecord> = Arc::default();
    let h = start_job(
        job_config(dir.path(), Duration::from_millis(100)),
        source,
        1,
        out.clone(),
    );
    eventually("records", T, || count(&out) >= 3).await?;
    h.stop().await?;
    h.join().await?;
    assert_eq!(values(&out), all[7..]);

    // Latest: only records produced after the start; then restored offsets beat `latest`.
    let dir = tempfile::tempdir()?;
    let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    source.start = StartPosition::Latest;
    let out: Committed<KafkaRecord> = Arc::default();
    let h = start_job(
        job_config(dir.path(), Duration::from_millis(100)),
        source.clone(),
        1,
        out.clone(),
    );
    let mut n = 0;
    eventually("a record produced after the start", T, || {
        n += 1;
        produce(env, &topic, &[("k".into(), format!("new{n:03}"))]).expect("produce");
        count(&out) > 0
    })
    .await?;
    h.stop().await?;
    h.join().await?;
    let seen = values(&out);
    assert!(seen.iter().all(|v| v.starts_with("new")), "{seen:?}");
    let before_restart = seen.len();
    // Produced while the job is down: `latest` would skip these, the checkpoint does not.
    produce(
        env,
        &topic,
        &[("k".into(), "down-1".into()), ("k".into(), "down-2".into())],
    )?;
    let h = start_job(
        job_config(dir.path(), Duration::from_millis(100)),
        source,
        1,
        out.clone(),
    );
    eventually("records produced while down", T, || {
        values(&out).iter().filter(|v| v.starts_with("down")).count() == 2
    })
    .await?;
    h.stop().await?;
    h.join().await?;
    let seen = values(&out);
    let news = seen.iter().filter(|v| v.starts_with("new")).count();
    assert!(news >= before_restart && news <= n, "new records: {news}");
    let mut dedup = seen.clone();
    dedup.dedup();
    assert_eq!(dedup, seen, "nothing read twice");
    Ok(())
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_offsets_advance_only_when_a_checkpoint_completes() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-group");
    create_topic_with(env, &topic, 1, OLD_TIMESTAMPS).await?;
    produce_timed(env, &topic, 1_700_000_000_000)?;
    let group = unique("g");
    let dir = tempfile::tempdir()?;
    let source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], &group);
    // No periodic checkpoint in this test's lifetime.
    let config = job_config(dir.path(), Duration::from_secs(3600));

    let seen_first: Committed<KafkaRecord> = Arc::default();
    let staged = Arc::new(std::sync::Mutex::new(0usize));
    let h = {
        let mut job = JobBuilder::new(config.clone());
        let s2 = staged.clone();
        job.source("kafka", 1, {
            let source = source.clone();
            move |_| KafkaSource::new(source.clone(), RawBytes)
        })
        .map(move |r: KafkaRecord| {
            *s2.lock().unwrap() += 1;
            r
        })
        .sink("collect", {
            let out = seen_first.clone();
            move |_| CommittingCollector::new(out.clone())
        });
        job.build()?.start()
    };
    eventually("all ten read", T, || *staged.lock().unwrap() == 10).await?;
    assert_eq!(
        group_offset(env, &group, &topic)?,
        Offset::Invalid,
        "read, but no checkpoint completed"
    );
    // Crash before any checkpoint completes: group offsets unchanged, the next run re-reads.
    h.cancel();
    h.join().await?;
    assert_eq!(group_offset(env, &group, &topic)?, Offset::Invalid);
    assert_eq!(count(&seen_first), 0, "nothing was committed by the cancelled run");

    let out: Committed<KafkaRecord> = Arc::default();
    let read_again = Arc::new(std::sync::Mutex::new(0usize));
    let h = {
        let mut job = JobBuilder::new(config);
        let r2 = read_again.clone();
        job.source("kafka", 1, move |_| KafkaSource::new(source.clone(), RawBytes))
            .map(move |r: KafkaRecord| {
                *r2.lock().unwrap() += 1;
                r
            })
            .sink("collect", {
                let out = out.clone();
                move |_| CommittingCollector::new(out.clone())
            });
        job.build()?.start()
    };
    eventually("all ten read again", T, || *read_again.lock().unwrap() == 10).await?;
    h.stop().await?; // final checkpoint: completes, commits offsets
    h.join().await?;
    assert_eq!(values(&out).len(), 10, "the restarted job re-read from the beginning");
    eventually("group offset 10", T, || {
        matches!(group_offset(env, &group, &topic), Ok(Offset::Offset(10)))
    })
    .await?;
    Ok(())
}

/// Each completed checkpoint's offsets go to the group — not only the first's — and the commit
/// does not hold the source: it is sent, and its result served by the polls that follow (it was a
/// synchronous round trip on the source's task, which a group coordinator that stopped
/// answering held for a minute). One commit is on its way at a time: a checkpoint completed
/// meanwhile is committed after it, never before. Every commit is counted, and the per-partition
/// figures show what the group holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_offsets_follow_every_completed_checkpoint_one_commit_at_a_time() -> Result<()> {
    use exactly_core::runtime::{SnapshotContext, Source};
    let env = TestEnv::get().await?;
    let topic = unique("src-commits");
    create_topic(env, &topic, 1).await?;
    let group = unique("g");
    let config = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], &group);
    let mut source = started(config, &subtask_info("commits"), None).await?;
    let metrics = source.metrics();
    // Checkpoint `id` of what the source has read, completed.
    async fn checkpoint(source: &mut KafkaSource<KafkaRecord, RawBytes>, id: u64) -> Result<()> {
        let mut ctx = SnapshotContext::new(id, exactly_core::SnapshotKind::Checkpoint, 0);
        source.snapshot_state(&mut ctx).await?;
        ctx.finish_deferred().await?;
        source.notify_checkpoint_complete(id).await?;
        Ok(())
    }
    let mut commits = 0;
    for round in 1..=3u64 {
        let label = format!("r{round}-");
        produce(env, &topic, &labelled(&label, 5))?;
        assert_eq!(read_values(&mut source, 5).await?, values_of(&label, 5));
        checkpoint(&mut source, round).await?;
        commits += 1;
        wait_committed(env, &mut source, &group, &topic, 5 * round as i64, commits).await?;
    }
    // Two checkpoints complete before any poll: the first's commit is on its way (its result is
    // served only by a poll), so the second's waits and goes after it.
    produce(env, &topic, &labelled("r4-", 5))?;
    assert_eq!(read_values(&mut source, 5).await?, values_of("r4-", 5));
    checkpoint(&mut source, 4).await?;
    produce(env, &topic, &labelled("r5-", 5))?;
    assert_eq!(read_values(&mut source, 5).await?, values_of("r5-", 5));
    checkpoint(&mut source, 5).await?;
    commits += 2;
    wait_committed(env, &mut source, &group, &topic, 25, commits).await?;
    assert_eq!(metrics.commits_failed(), 0);
    // Two completions again, and the source dropped at once (a job stopping after its final
    // checkpoint): the waiting commit is sent then, and the group holds the last checkpoint's
    // offsets.
    // Both snapshots first, then both completions with no poll between: 7's commit waits.
    produce(env, &topic, &labelled("r6-", 5))?;
    assert_eq!(read_values(&mut source, 5).await?, values_of("r6-", 5));
    let mut six = SnapshotContext::new(6, exactly_core::SnapshotKind::Checkpoint, 0);
    source.snapshot_state(&mut six).await?;
    six.finish_deferred().await?;
    produce(env, &topic, &labelled("r7-", 5))?;
    assert_eq!(read_values(&mut source, 5).await?, values_of("r7-", 5));
    let mut seven = SnapshotContext::new(7, exactly_core::SnapshotKind::Checkpoint, 0);
    source.snapshot_state(&mut seven).await?;
    seven.finish_deferred().await?;
    source.notify_checkpoint_complete(6).await?;
    source.notify_checkpoint_complete(7).await?;
    drop(source);
    assert_eq!(group_offset(env, &group, &topic)?, Offset::Offset(35));
    Ok(())
}

/// Polls `source` (serving its commits' results) until the group holds `offset` for partition 0
/// of `topic` and the source counted `commits` successful commits, whose figures show `offset`.
async fn wait_committed(
    env: &TestEnv,
    source: &mut KafkaSource<KafkaRecord, RawBytes>,
    group: &str,
    topic: &str,
    offset: i64,
    commits: u64,
) -> Result<()> {
    use exactly_core::runtime::Source;
    let metrics = source.metrics();
    let until = std::time::Instant::now() + T;
    let mut more = Vec::new();
    loop {
        source.poll_next(&mut more).await?;
        let held = group_offset(env, group, topic)?;
        let counted = metrics.commits_succeeded();
        let shown = metrics.partitions().values().next().and_then(|p| p.committed);
        if held == Offset::Offset(offset) && counted == commits && shown == Some(offset) {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the group holds {held:?}, {counted} commits counted, the figures show {shown:?}; expected offset {offset} after {commits} commits"
        );
    }
    assert!(more.is_empty(), "read more than was written: {}", more.len());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_aborted_and_open_transactions_are_not_delivered() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-isolation");
    create_topic(env, &topic, 1).await?;
    let send = |p: &rdkafka::producer::BaseProducer, v: &str| -> Result<()> {
        p.send(BaseRecord::<str, str>::to(&topic).partition(0).payload(v))
            .map_err(|(e, _)| e)?;
        p.flush(T)?;
        Ok(())
    };
    let committer = transactional_producer(env, &unique("tx-c"))?;
    committer.begin_transaction()?;
    send(&committer, "c1")?;
    committer.commit_transaction(T)?;
    let aborter = transactional_producer(env, &unique("tx-a"))?;
    aborter.begin_transaction()?;
    send(&aborter, "a1")?;
    aborter.abort_transaction(T)?;
    let open = transactional_producer(env, &unique("tx-o"))?;
    open.begin_transaction()?;
    send(&open, "o1")?;
    committer.begin_transaction()?;
    send(&committer, "c2")?;
    committer.commit_transaction(T)?;

    let dir = tempfile::tempdir()?;
    let source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    let out: Committed<KafkaRecord> = Arc::default();
    let h = start_job(
        job_config(dir.path(), Duration::from_millis(100)),
        source,
        1,
        out.clone(),
    );
    eventually("c1", T, || count(&out) >= 1).await?;
    // o1 is open: nothing after it (c2 included) may be delivered yet.
    assert_eq!(values(&out), ["c1"]);
    open.commit_transaction(T)?;
    eventually("o1 and c2", T, || count(&out) >= 3).await?;
    h.stop().await?;
    h.join().await?;
    assert_eq!(values(&out), ["c1", "c2", "o1"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_and_topics_appearing_at_runtime_are_read_once_from_earliest() -> Result<()> {
    let env = TestEnv::get().await?;
    let stem = unique("disc");
    let first = format!("{stem}-a");
    create_topic(env, &first, 1).await?;
    produce(env, &first, &[("k".into(), "a-0".into())])?;
    let dir = tempfile::tempdir()?;
    let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![], unique("g"));
    source.topic_pattern = Some(format!("^{stem}-.*"));
    source.discovery_interval = Some(Duration::from_millis(300));
    source.start = StartPosition::Latest; // new partitions still start at their earliest
    let out: Committed<KafkaRecord> = Arc::default();
    let h = start_job(
        job_config(dir.path(), Duration::from_millis(100)),
        source,
        2,
        out.clone(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()?;
    admin
        .create_partitions(&[NewPartitions::new(&first, 2)], &AdminOptions::new())
        .await?;
    let second = format!("{stem}-b");
    create_topic(env, &second, 2).await?;
    // Produced before discovery sees them: read from earliest all the same.
    let p: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()?;
    p.send(
        BaseRecord::<str, str>::to(&first)
            .partition(1)
            .payload("a-new-partition"),
    )
    .map_err(|(e, _)| e)?;
    p.send(BaseRecord::<str, str>::to(&second).partition(0).payload("b-0"))
        .map_err(|(e, _)| e)?;
    p.send(BaseRecord::<str, str>::to(&second).partition(1).payload("b-1"))
        .map_err(|(e, _)| e)?;
    p.flush(T)?;
    eventually("discovered records", T, || count(&out) >= 3).await?;
    h.stop().await?;
    h.join().await?;
    assert_eq!(
        values(&out),
        ["a-new-partition", "b-0", "b-1"],
        "a-0 predates the start (latest)"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rescaling_across_restores_delivers_every_offset_exactly_once() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-rescale");
    create_topic(env, &topic, 6).await?;
    let batch = |from: usize| -> Vec<(String, String)> {
        (from..from + 300)
            .map(|i| (format!("k{}", i % 37), format!("r{i:05}")))
            .collect()
    };
    let dir = tempfile::tempdir()?;
    let source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    let out: Committed<KafkaRecord> = Arc::default();
    let config = job_config(dir.path(), Duration::from_millis(100));

    produce(env, &topic, &batch(0))?;
    let h = start_job(config.clone(), source.clone(), 2, out.clone());
    eventually("run 1 (2 subtasks)", T, || count(&out) >= 300).await?;
    h.stop().await?;
    h.join().await?;

    produce(env, &topic, &batch(300))?;
    let h = start_job(config.clone(), source.clone(), 3, out.clone());
    eventually("run 2 (3 subtasks) commits some", T, || count(&out) >= 400).await?;
    h.cancel(); // crash-like: what it had not committed is read again by the next run
    h.join().await?;

    produce(env, &topic, &batch(600))?;
    let h = start_job(config, source, 1, out.clone());
    eventually("run 3 (1 subtask)", T, || count(&out) >= 900).await?;
    h.stop().await?;
    h.join().await?;

    let mut by_offset: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for r in out.lock().unwrap().iter() {
        *by_offset.entry((r.partition, r.offset)).or_default() += 1;
    }
    assert_eq!(by_offset.len(), 900, "every offset delivered");
    assert!(by_offset.values().all(|n| *n == 1), "none twice");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_fail_skip_or_go_to_the_dead_letter_topic() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-poison");
    create_topic(env, &topic, 1).await?;
    produce(
        env,
        &topic,
        &[
            ("k".into(), "1".into()),
            ("k".into(), "{oops".into()),
            ("k".into(), "3".into()),
        ],
    )?;

    let run = |policy: PoisonPolicy| {
        let dir = tempfile::tempdir().unwrap();
        let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
        source.on_deserialization_error = policy;
        let out: Committed<serde_json::Value> = Arc::default();
        let mut job = JobBuilder::new(job_config(dir.path(), Duration::from_millis(100)));
        job.source("kafka", 1, move |_| KafkaSource::new(source.clone(), Json))
            .sink("collect", {
                let out = out.clone();
                move |_| CommittingCollector::new(out.clone())
            });
        (job.build().unwrap().start(), out, dir)
    };

    // fail: the job stops for good, naming the record; no restart loop.
    let (h, _, _dir) = run(PoisonPolicy::Fail);
    let err = h.join().await.unwrap_err().to_string();
    let chain = err.clone();
    assert!(chain.contains("kafka source failed"), "{chain}");
    let (h, _, _dir) = run(PoisonPolicy::Fail);
    let err = format!("{:?}", h.join().await.unwrap_err());
    assert!(err.contains(topic.as_str()) && err.contains("offset: 1"), "{err}");

    // skip
    let (h, out, _dir) = run(PoisonPolicy::Skip);
    eventually("two good records", T, || out.lock().unwrap().len() >= 2).await?;
    h.stop().await?;
    h.join().await?;
    assert_eq!(*out.lock().unwrap(), vec![serde_json::json!(1), serde_json::json!(3)]);

    // dead letter
    let dlq = unique("src-dlq");
    create_topic(env, &dlq, 1).await?;
    let (h, out, _dir) = run(PoisonPolicy::DeadLetter { topic: dlq.clone() });
    eventually("two good records", T, || out.lock().unwrap().len() >= 2).await?;
    h.stop().await?;
    h.join().await?;
    let dead = read_committed(env, &dlq, T)?;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].value_str(), "{oops");
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .set("group.id", unique("dlq-headers"))
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&dlq, 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let m = loop {
        if let Some(m) = c.poll(T) {
            break m?;
        }
    };
    use rdkafka::message::{Headers, Message};
    let headers: BTreeMap<String, String> = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| {
                    (
                        h.key.to_owned(),
                        String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(headers.get("exactly.source.topic"), Some(&topic));
    assert_eq!(headers.get("exactly.source.offset").map(String::as_str), Some("1"));
    assert!(headers.get("exactly.error").is_some_and(|e| !e.is_empty()));
    Ok(())
}

/// Collects the watermarks that reach it.
struct Watermarks(Arc<std::sync::Mutex<Vec<i64>>>);

impl exactly_core::runtime::CheckpointedFunction for Watermarks {}
impl exactly_core::runtime::CheckpointListener for Watermarks {}
impl exactly_core::runtime::ProcessFunction<KafkaRecord, KafkaRecord> for Watermarks {
    fn process(
        &mut self,
        r: KafkaRecord,
        out: &mut exactly_core::runtime::Collector<'_, KafkaRecord>,
    ) -> exactly_core::Result<()> {
        out.emit(r)
    }
    fn on_watermark(
        &mut self,
        w: exactly_core::Watermark,
        _out: &mut exactly_core::runtime::Collector<'_, KafkaRecord>,
    ) -> exactly_core::Result<()> {
        self.0.lock().unwrap().push(w.0);
        Ok(())
    }
}

/// `records` (partition, timestamp) written with explicit partitions and timestamps.
fn produce_at(env: &TestEnv, topic: &str, records: &[(i32, i64)]) -> Result<()> {
    let p: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()?;
    for (partition, ts) in records {
        p.send(
            BaseRecord::<str, str>::to(topic)
                .partition(*partition)
                .payload("x")
                .timestamp(*ts),
        )
        .map_err(|(e, _)| e)?;
    }
    p.flush(T)?;
    Ok(())
}

/// Source subtasks (`parallelism`) → rebalance into one collecting stage; `later` is produced
/// once the first `records` were read and 800 ms passed; returns the watermarks the stage saw.
async fn watermarks_seen(
    env: &TestEnv,
    topic: &str,
    parallelism: u32,
    watermarks: exactly_kafka_source::WatermarkConfig,
    records: usize,
    later: &[(i32, i64)],
) -> Result<Vec<i64>> {
    let dir = tempfile::tempdir()?;
    let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.to_owned()], unique("g"));
    source.watermarks = Some(watermarks);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let out: Committed<KafkaRecord> = Arc::default();
    let mut job = JobBuilder::new(job_config(dir.path(), Duration::from_millis(200)));
    let (s, o) = (seen.clone(), out.clone());
    job.source("kafka", parallelism, move |_| {
        KafkaSource::new(source.clone(), RawBytes)
    })
    .rebalance(1)
    .process("watermarks", move |_| Watermarks(s.clone()))
    .sink("collect", move |_| CommittingCollector::new(o.clone()));
    let handle = job.build()?.start();
    eventually("every record", T, || count(&out) >= records).await?;
    if !later.is_empty() {
        tokio::time::sleep(Duration::from_millis(800)).await;
        produce_at(env, topic, later)?;
        eventually("the later records", T, || count(&out) >= records + later.len()).await?;
    }
    // A few more polls, for watermarks that follow the last records.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    handle.cancel();
    handle.join().await?;
    let w = seen.lock().unwrap().clone();
    Ok(w)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watermarks_per_partition_with_idle_partitions_and_idle_subtasks() -> Result<()> {
    let env = TestEnv::get().await?;
    let bound = Duration::from_millis(100);

    // Two partitions, three subtasks: subtask 2 has no partition and says it is idle, so the
    // single downstream stage's watermark is the minimum over the partitions (minus the bound).
    let topic = unique("wm");
    create_topic(env, &topic, 2).await?;
    produce_at(
        env,
        &topic,
        &[(0, 10_000), (0, 30_000), (0, 20_000), (1, 12_000), (1, 15_000)],
    )?;
    let no_idle = exactly_kafka_source::WatermarkConfig {
        max_out_of_orderness: bound,
        idle_timeout: None,
    };
    let seen = watermarks_seen(env, &topic, 3, no_idle, 5, &[]).await?;
    assert_eq!(
        seen.last(),
        Some(&(15_000 - 101)),
        "min(30 000, 15 000) - bound - 1: {seen:?}"
    );
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "never backwards: {seen:?}");

    // Only partition 0 has records: without an idle timeout partition 1 holds the watermark back
    // for good; with one, it stops counting once silent, and partition 0's later records drive
    // the watermark alone.
    let topic = unique("wm-idle");
    create_topic(env, &topic, 2).await?;
    produce_at(env, &topic, &[(0, 50_000), (0, 51_000)])?;
    let seen = watermarks_seen(env, &topic, 1, no_idle, 2, &[(0, 52_000)]).await?;
    assert!(seen.is_empty(), "partition 1 never had a record: {seen:?}");
    let idle = exactly_kafka_source::WatermarkConfig {
        max_out_of_orderness: bound,
        idle_timeout: Some(Duration::from_millis(300)),
    };
    let topic = unique("wm-idle");
    create_topic(env, &topic, 2).await?;
    produce_at(env, &topic, &[(0, 50_000), (0, 51_000)])?;
    let seen = watermarks_seen(env, &topic, 1, idle, 2, &[(0, 52_000)]).await?;
    assert_eq!(seen.last(), Some(&(52_000 - 101)), "{seen:?}");
    Ok(())
}

/// Every field of a record survives the source's batch read: keys present, absent and empty;
/// values present, absent (tombstones) and empty; headers in order, repeated names, null values
/// and non-ASCII bytes; timestamps; records of several partitions, each in offset order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_arrive_with_every_field_as_written() -> Result<()> {
    use rdkafka::message::{Header, OwnedHeaders};
    let env = TestEnv::get().await?;
    let topic = unique("src-fields");
    create_topic_with(env, &topic, 3, OLD_TIMESTAMPS).await?;
    let p: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()?;
    type Expected = (
        i32,
        Option<Vec<u8>>,
        Option<Vec<u8>>,
        i64,
        Vec<(String, Option<Vec<u8>>)>,
    );
    let mut expected: Vec<Expected> = Vec::new();
    for i in 0..300i64 {
        let partition = (i % 3) as i32;
        let key = match i % 3 {
            0 => Some(format!("k{i}").into_bytes()),
            1 => None,
            _ => Some(Vec::new()),
        };
        let value = match i % 5 {
            0 => None,
            1 => Some(Vec::new()),
            _ => Some(vec![(i % 251) as u8; (i as usize * 7) % 3000]),
        };
        let headers: Vec<(String, Option<Vec<u8>>)> = match i % 4 {
            0 => vec![],
            1 => vec![("a".into(), Some(b"1".to_vec())), ("a".into(), Some(b"2".to_vec()))],
            2 => vec![("null".into(), None), ("bytes".into(), Some(vec![0, 255, 128]))],
            _ => vec![("ünïcode".into(), Some("wert".as_bytes().to_vec()))],
        };
        let ts = 1_700_000_000_000 + i;
        let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&topic).partition(partition).timestamp(ts);
        if let Some(k) = &key {
            rec = rec.key(k.as_slice());
        }
        if let Some(v) = &value {
            rec = rec.payload(v.as_slice());
        }
        if !headers.is_empty() {
            rec = rec.headers(headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
                h.insert(Header {
                    key: k,
                    value: v.as_deref(),
                })
            }));
        }
        p.send(rec).map_err(|(e, _)| e)?;
        expected.push((partition, key, value, ts, headers));
    }
    p.flush(T)?;

    let dir = tempfile::tempdir()?;
    let source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    let out: Committed<KafkaRecord> = Arc::default();
    let handle = start_job(
        job_config(dir.path(), Duration::from_millis(100)),
        source,
        1,
        out.clone(),
    );
    eventually("records", T, || count(&out) >= expected.len()).await?;
    handle.stop().await?;
    handle.join().await?;

    let got = out.lock().unwrap().clone();
    assert_eq!(got.len(), expected.len());
    for partition in 0..3 {
        let ours: Vec<&KafkaRecord> = got.iter().filter(|r| r.partition == partition).collect();
        let theirs: Vec<&Expected> = expected.iter().filter(|e| e.0 == partition).collect();
        assert_eq!(ours.len(), theirs.len(), "partition {partition}");
        for (offset, (r, e)) in ours.iter().zip(theirs).enumerate() {
            assert_eq!(&*r.topic, topic.as_str());
            assert_eq!(
                r.offset, offset as i64,
                "partition {partition}: records in offset order"
            );
            assert_eq!(r.key, e.1, "key at {partition}@{offset}");
            assert_eq!(r.value, e.2, "value at {partition}@{offset}");
            assert_eq!(r.timestamp, Some(e.3), "timestamp at {partition}@{offset}");
            assert_eq!(r.headers, e.4, "headers at {partition}@{offset}");
        }
    }
    Ok(())
}

/// Input in every compression codec Kafka ships (gzip, snappy, lz4, zstd) is read. Before, zstd
/// input stalled the source: librdkafka was built without zstd, and the fetch error was only
/// logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_compressed_with_every_kafka_codec_are_read() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-codecs");
    create_topic(env, &topic, 1).await?;
    let codecs = ["gzip", "snappy", "lz4", "zstd"];
    let mut expected = Vec::new();
    for codec in codecs {
        let p: rdkafka::producer::BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &env.kafka_bootstrap)
            .set("compression.codec", codec)
            .set("linger.ms", "20")
            .create()?;
        for i in 0..50 {
            // Repetitive values compress, so the batches really are compressed.
            let v = format!("{codec}-{i:03}-{}", "x".repeat(200));
            p.send(BaseRecord::<str, str>::to(&topic).partition(0).payload(&v))
                .map_err(|(e, _)| e)?;
            expected.push(v);
        }
        p.flush(T)?;
    }
    expected.sort();
    let got = run_until(env, &topic, StartPosition::Earliest, expected.len()).await?;
    assert_eq!(got, expected);
    Ok(())
}

/// A dead letter the broker refuses (larger than the dead-letter topic's `max.message.bytes`) fails
/// the checkpoint: the job stops with the error instead of completing a checkpoint past a record
/// that went nowhere. Before, the flush succeeded whatever the delivery reports said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_that_cannot_be_written_fails_the_checkpoint() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-dlq-refused-in");
    create_topic(env, &topic, 1).await?;
    let dlq = unique("src-dlq-refused");
    create_topic_with(env, &dlq, 1, &[("max.message.bytes", "2000")]).await?;
    produce(
        env,
        &topic,
        &[
            ("k".into(), "1".into()),
            ("k".into(), format!("not json {}", "x".repeat(10_000))),
        ],
    )?;

    let dir = tempfile::tempdir()?;
    let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    source.on_deserialization_error = PoisonPolicy::DeadLetter { topic: dlq.clone() };
    let out: Committed<serde_json::Value> = Arc::default();
    let mut job = JobBuilder::new(job_config(dir.path(), Duration::from_millis(100)));
    job.source("kafka", 1, move |_| KafkaSource::new(source.clone(), Json))
        .sink("collect", {
            let out = out.clone();
            move |_| CommittingCollector::new(out.clone())
        });
    let h = job.build()?.start();
    let ended = tokio::time::timeout(T, h.join()).await;
    let err = match ended {
        Ok(Err(e)) => format!("{e:?}"),
        Ok(Ok(outcome)) => anyhow::bail!("the job ended normally: {outcome:?}"),
        Err(_) => anyhow::bail!("the job kept running past a dead letter it could not write"),
    };
    assert!(err.contains("DeadLetter") && err.contains(&dlq), "{err}");
    Ok(())
}

/// Under steady traffic a source subtask rarely finds nothing for the whole of its brief wait, so
/// `Idle` alone seldom tells it has caught up (measured: `when_caught_up` barely fired with two
/// source subtasks). The source also says `CaughtUp` when it read all it had, waited, and the next
/// fetch brought less than a batch. A feeder writes a record every 2 ms, alternating between two
/// partitions (never 20 ms without one); while it runs the source must report `CaughtUp`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_under_steady_traffic_reports_caught_up() -> Result<()> {
    steady_traffic(false).await
}

/// The same, polled as the runtime polls: after `Idle` or `CaughtUp` it waits in
/// `Source::available` (and meanwhile serves checkpoints), every other wait cut short as a
/// barrier would cut it. The statuses are the same, and every record is read exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_waiting_in_available_reads_steady_traffic_exactly_once() -> Result<()> {
    steady_traffic(true).await
}

async fn steady_traffic(wait_in_available: bool) -> Result<()> {
    use exactly_core::runtime::{InitContext, Source, SourceStatus};
    use std::sync::atomic::{AtomicBool, Ordering};

    let env = TestEnv::get().await?;
    let topic = unique("steady");
    create_topic(env, &topic, 2).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (bootstrap, topic, stop) = (env.kafka_bootstrap.clone(), topic.clone(), stop.clone());
        std::thread::spawn(move || -> Result<u64> {
            let p: rdkafka::producer::BaseProducer = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("linger.ms", "0")
                .create()?;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let v = n.to_string();
                p.send(BaseRecord::<str, str>::to(&topic).partition((n % 2) as i32).payload(&v))
                    .map_err(|(e, _)| e)?;
                p.poll(Duration::ZERO);
                n += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            p.flush(T)?;
            Ok(n)
        })
    };
    let mut config = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    config.start = StartPosition::Earliest;
    let mut source = KafkaSource::new(config, RawBytes);
    let info = subtask_info("steady");
    source.initialize_state(&InitContext::new(&info, None)).await?;
    let mut out = Vec::new();
    let (mut caught_up, mut statuses) = (0usize, BTreeMap::<String, usize>::new());
    let mut seen = BTreeSet::new();
    let (mut waiting, mut waits) = (false, 0u64);
    let mut poll =
        async |source: &mut KafkaSource<KafkaRecord, RawBytes>, out: &mut Vec<KafkaRecord>| -> Result<SourceStatus> {
            if wait_in_available && waiting {
                waits += 1;
                if waits % 2 == 0 {
                    let _ = tokio::time::timeout(Duration::from_millis(1), source.available()).await;
                } else {
                    source.available().await;
                }
            }
            let status = source.poll_next(out).await?;
            waiting = matches!(status, SourceStatus::Idle | SourceStatus::CaughtUp);
            Ok(status)
        };
    let until = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < until {
        let status = poll(&mut source, &mut out).await?;
        seen.extend(out.drain(..).map(|r: KafkaRecord| (r.partition, r.offset)));
        caught_up += usize::from(status == SourceStatus::CaughtUp);
        *statuses.entry(format!("{status:?}")).or_default() += 1;
    }
    let read = seen.len();
    stop.store(true, Ordering::Relaxed);
    let written = feeder.join().expect("feeder")?;
    assert!(
        read > 500,
        "the source read only {read} of the {written} records written meanwhile"
    );
    assert!(
        caught_up > 0,
        "no CaughtUp in 4 s of steady traffic ({read} records read); statuses: {statuses:?}"
    );
    // Traffic it keeps up with is no backlog: no early checkpoint by default for it.
    assert!(
        !statuses.contains_key("Backlog"),
        "Backlog under steady traffic ({read} records read); statuses: {statuses:?}"
    );
    // The rest, then every record once (a set of offsets: a record read twice is counted too).
    let mut polled = read;
    let until = std::time::Instant::now() + T;
    while (seen.len() as u64) < written && std::time::Instant::now() < until {
        poll(&mut source, &mut out).await?;
        polled += out.len();
        seen.extend(out.drain(..).map(|r: KafkaRecord| (r.partition, r.offset)));
    }
    assert_eq!(seen.len() as u64, written, "records read of those written");
    assert_eq!(polled, seen.len(), "records read more than once");
    Ok(())
}

/// A topic filled before the source starts is a backlog: its polls take whole batches already
/// fetched and say `Backlog` (what `when_caught_up = "after-backlog"`, the default, checkpoints
/// after), until the source has read it all — then no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_reading_a_filled_topic_reports_backlog_until_it_has_read_it() -> Result<()> {
    use exactly_core::runtime::{InitContext, Source, SourceStatus};

    let env = TestEnv::get().await?;
    let topic = unique("backlog");
    create_topic(env, &topic, 2).await?;
    let n = 50_000usize;
    let records: Vec<(String, String)> = (0..n).map(|i| (i.to_string(), format!("value-{i:06}"))).collect();
    produce(env, &topic, &records)?;
    let mut config = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    config.start = StartPosition::Earliest;
    let batch = config.poll_batch;
    let mut source = KafkaSource::new(config, RawBytes);
    let info = subtask_info("backlog");
    source.initialize_state(&InitContext::new(&info, None)).await?;
    let mut out = Vec::new();
    let (mut read, mut backlog, mut after) = (0usize, 0usize, BTreeMap::<String, usize>::new());
    let until = std::time::Instant::now() + T;
    // Read the backlog, then 2 s more with nothing new.
    let mut done: Option<std::time::Instant> = None;
    while done.is_none_or(|d| d.elapsed() < Duration::from_secs(2)) && std::time::Instant::now() < until {
        let status = source.poll_next(&mut out).await?;
        if status == SourceStatus::Backlog {
            assert_eq!(out.len(), batch, "a Backlog poll brings a whole batch");
        }
        read += out.len();
        out.clear();
        if done.is_some() {
            *after.entry(format!("{status:?}")).or_default() += 1;
        } else {
            backlog += usize::from(status == SourceStatus::Backlog);
            if read >= n {
                done = Some(std::time::Instant::now());
            }
        }
    }
    assert_eq!(read, n, "the source read {read} of {n} records in {T:?}");
    assert!(
        backlog * batch >= n / 2,
        "only {backlog} Backlog polls of {batch} while reading {n} records that were waiting"
    );
    assert!(
        !after.contains_key("Backlog"),
        "Backlog after the topic was read to its end; statuses then: {after:?}"
    );
    Ok(())
}

/// Records that retention deleted while the job was down are lost, and the source says so: the
/// restored source reads on from the partition's first offset, counts the offsets lost
/// (`lost_to_retention`) and logs an error (before, librdkafka's `earliest` reset jumped there
/// without a word). A given start offset beyond the partition's end is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_deleted_by_retention_while_the_job_was_down_are_counted_as_lost() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-retention");
    create_topic(env, &topic, 1).await?;
    let batch =
        |prefix: &str| -> Vec<(String, String)> { (0..10).map(|i| ("k".into(), format!("{prefix}{i}"))).collect() };
    produce(env, &topic, &batch("a"))?;
    let dir = tempfile::tempdir()?;
    let source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    let out: Committed<KafkaRecord> = Arc::default();
    let metrics: Arc<std::sync::Mutex<Vec<Arc<exactly_kafka_source::KafkaSourceMetrics>>>> = Arc::default();
    let start = || {
        let (source, out, metrics) = (source.clone(), out.clone(), metrics.clone());
        let mut job = JobBuilder::new(job_config(dir.path(), Duration::from_millis(100)));
        job.source("kafka", 1, move |_| {
            let s = KafkaSource::new(source.clone(), RawBytes);
            metrics.lock().unwrap().push(s.metrics());
            s
        })
        .sink("collect", move |_| CommittingCollector::new(out.clone()));
        job.build().expect("valid job").start()
    };
    let h = start();
    // Committed output: a checkpoint holding offset 10 completed.
    eventually("the first records", T, || count(&out) == 10).await?;
    h.stop().await?;
    h.join().await?;

    // While the job is down: ten more (offsets 10..19), and retention deletes all but three.
    produce(env, &topic, &batch("b"))?;
    delete_records_before(env, &topic, 0, 17).await?;
    metrics.lock().unwrap().clear();
    let h = start();
    eventually("the records retention left", T, || count(&out) == 13).await?;
    h.stop().await?;
    h.join().await?;
    let mut expected: Vec<String> = (0..10).map(|i| format!("a{i}")).collect();
    expected.extend(["b7", "b8", "b9"].map(String::from));
    assert_eq!(values(&out), expected);
    let lost: u64 = metrics.lock().unwrap().iter().map(|m| m.lost_to_retention()).sum();
    assert_eq!(lost, 7, "offsets 10..16 reported lost");

    // A given start offset beyond the end is refused, not read from somewhere else.
    let mut config = source.clone();
    config.start = StartPosition::Specific {
        offsets: [(format!("{topic}:0"), 100)].into(),
        reset: ResetPosition::None,
    };
    let info = subtask_info("beyond");
    let error = started(config, &info, None)
        .await
        .err()
        .expect("a start offset beyond the end")
        .to_string();
    assert!(error.contains("beyond the partition's end 20"), "{error}");
    Ok(())
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

/// A start at the end of the log as it is now (`latest`, a `latest` reset) is read only once a
/// checkpoint has recorded it: the runtime checkpoints at once and holds the source until then, so
/// a restart before the job's first checkpoint — a new process too — restores that position
/// instead of looking `latest` up again (cli's `kafka_to_kafka_recovery` kills such a process;
/// core's `waiting_tests` check the hold). A place (`earliest`) or a restored position is not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_at_the_end_is_read_only_once_a_checkpoint_recorded_it() -> Result<()> {
    use exactly_core::runtime::Source;
    let env = TestEnv::get().await?;
    let (_, config, info, state) = ten_read_and_snapshotted(env, "src-held", "held").await?;
    let held = |start: StartPosition, restored| {
        let mut config = config.clone();
        config.start = start;
        let info = &info;
        async move { Ok::<_, anyhow::Error>(started(config, info, restored).await?.reads_after_first_checkpoint()) }
    };
    let latest_reset = StartPosition::GroupOffsets {
        reset: ResetPosition::Latest,
    };
    assert!(held(StartPosition::Latest, None).await?, "latest");
    assert!(
        held(latest_reset.clone(), None).await?,
        "group offsets, reset to latest"
    );
    assert!(held(StartPosition::Timestamp { ms: 0 }, None).await?, "a timestamp");
    assert!(!held(StartPosition::Earliest, None).await?, "earliest");
    let earliest_reset = StartPosition::GroupOffsets {
        reset: ResetPosition::Earliest,
    };
    assert!(!held(earliest_reset, None).await?, "group offsets, reset to earliest");
    assert!(!held(StartPosition::Latest, Some(&state)).await?, "latest, restored");
    assert!(!held(latest_reset, Some(&state)).await?, "reset to latest, restored");
    Ok(())
}

/// A topic deleted and recreated under the same name while the job was down is read from its
/// first offset: the checkpoint records the topic's ID with its offsets, and the new topic has
/// another. Before, a restored position inside the new log's range (10, in a new log of 15) was
/// read on from: the new topic's first ten records were skipped without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_deleted_and_recreated_while_the_job_was_down_is_read_from_its_first_offset() -> Result<()> {
    let env = TestEnv::get().await?;
    let (topic, config, info, state) = ten_read_and_snapshotted(env, "src-recreated", "recreated").await?;

    recreate_topic(env, &topic, 1).await?;
    produce(env, &topic, &labelled("c", 15))?;
    let mut source = started(config, &info, Some(&state)).await?;
    assert_eq!(read_values(&mut source, 15).await?, values_of("c", 15));
    Ok(())
}

/// A topic deleted and recreated while the job reads it. librdkafka reads the new topic on from
/// the old position (here: the new topic's first ten records skipped, without a word — seen
/// before this check). The source's snapshot finds the topic's new ID and fails, the attempt
/// restarts from the last checkpoint (recorded with the old ID), and the restore reads the new
/// topic from its first offset: every record of both topics, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_recreated_while_the_job_reads_it_is_read_from_its_first_offset() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-recreated-live");
    create_topic(env, &topic, 1).await?;
    produce(env, &topic, &labelled("a", 10))?;
    let dir = tempfile::tempdir()?;
    let mut config = job_config(dir.path(), Duration::from_millis(100));
    config.restart = RestartStrategy::FixedDelay {
        attempts: 5,
        delay: Duration::from_millis(200),
    };
    let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    // The client's fetches wait 3 s after an error (the deleted topic): the new topic has its
    // records before the client reads it, as with a busy producer. (Sooner, the client finds
    // the new log shorter than the old position: out of range, which restarts the attempt too.)
    source.client.insert("fetch.error.backoff.ms".into(), "3000".into());
    let out: Committed<KafkaRecord> = Arc::default();
    let h = start_job(config, source, 1, out.clone());
    eventually("the first topic's records", T, || count(&out) == 10).await?;

    recreate_topic(env, &topic, 1).await?;
    produce(env, &topic, &labelled("c", 15))?;
    let mut expected = values_of("a", 10);
    expected.extend(values_of("c", 15));
    expected.sort();
    let reached = eventually("both topics' records", T, || count(&out) >= expected.len()).await;
    // A few more checkpoints: a record committed twice would show.
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.stop().await?;
    h.join().await?;
    assert_eq!(values(&out), expected, "{reached:?}");
    Ok(())
}

/// Deletes and recreates `topic` (one partition) with fifteen records `c0`…`c14` while `source`
/// reads it, and asserts that the source fails the attempt (`Recreated`) within `T`.
async fn recreated_under(env: &TestEnv, topic: &str, mut source: KafkaSource<KafkaRecord, RawBytes>) -> Result<()> {
    use exactly_core::runtime::Source;
    recreate_topic(env, topic, 1).await?;
    produce(env, topic, &labelled("c", 15))?;
    let mut read = Vec::new();
    let until = std::time::Instant::now() + T;
    let failed = loop {
        match source.poll_next(&mut read).await {
            Err(e) => break Some(e.to_string()),
            Ok(_) if std::time::Instant::now() > until => break None,
            Ok(_) => {}
        }
    };
    assert!(
        failed
            .as_deref()
            .is_some_and(|e| e.contains("was deleted and recreated")),
        "{failed:?} ({} records read after the recreation)",
        read.len()
    );
    Ok(())
}

/// Without checkpointing no snapshot checks the topics' IDs: the source checks them every few
/// seconds itself. A topic recreated while such a job reads it fails the attempt (`Recreated`)
/// instead of being read on from the old position (without the check: the new topic's first ten
/// records skipped without a word); the next attempt starts where its start position says, here
/// at the new topic's first offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_checkpointing_a_topic_recreated_under_the_source_fails_the_attempt() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-recreated-unchecked");
    create_topic(env, &topic, 1).await?;
    produce(env, &topic, &labelled("a", 10))?;
    let mut config = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    // As in the test above: the new topic has its records before the client reads it.
    config.client.insert("fetch.error.backoff.ms".into(), "3000".into());
    // `subtask_info`: no checkpointing (no commit window).
    let mut info = subtask_info("recreated-unchecked");
    let mut source = started(config.clone(), &info, None).await?;
    assert_eq!(read_values(&mut source, 10).await?, values_of("a", 10));

    recreated_under(env, &topic, source).await?;

    info.attempt = 1;
    let mut source = started(config, &info, None).await?;
    assert_eq!(read_values(&mut source, 15).await?, values_of("c", 15));
    Ok(())
}

/// Without checkpointing, `offset_commit = periodic` commits the source's positions to the group
/// every interval; a successor starting from the group's offsets reads on from them. The topic's
/// ID is checked before each commit: once the topic is deleted and recreated under the job, the
/// attempt fails and the old topic's position never becomes the new topic's group offset (which
/// would make the successor skip the new topic's first records: here ten of fifteen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_offset_commits_advance_the_group_and_never_carry_over_to_a_recreated_topic() -> Result<()> {
    use exactly_core::runtime::Source;
    use exactly_kafka_source::OffsetCommitMode;
    let env = TestEnv::get().await?;
    let topic = unique("src-periodic");
    create_topic(env, &topic, 1).await?;
    produce(env, &topic, &labelled("a", 10))?;
    let group = unique("g");
    let mut config = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], &group);
    config.start = StartPosition::GroupOffsets {
        reset: ResetPosition::Earliest,
    };
    config.offset_commit = OffsetCommitMode::Periodic {
        interval: Duration::from_millis(500),
    };
    // As in the tests above: the new topic has its records before the client reads it.
    config.client.insert("fetch.error.backoff.ms".into(), "3000".into());
    // `subtask_info`: no checkpointing.
    let mut info = subtask_info("periodic");
    let mut source = started(config.clone(), &info, None).await?;
    assert_eq!(read_values(&mut source, 10).await?, values_of("a", 10));
    let until = std::time::Instant::now() + T;
    let mut more = Vec::new();
    while !matches!(group_offset(env, &group, &topic)?, Offset::Offset(10)) {
        assert!(
            std::time::Instant::now() < until,
            "no periodic commit of offset 10 within {T:?}"
        );
        source.poll_next(&mut more).await?;
    }
    assert!(more.is_empty(), "read more than was written: {}", more.len());

    recreated_under(env, &topic, source).await?;
    assert_eq!(
        group_offset(env, &group, &topic)?,
        Offset::Invalid,
        "the old topic's position was committed as the new topic's"
    );

    info.attempt = 1;
    let mut source = started(config, &info, None).await?;
    assert_eq!(read_values(&mut source, 15).await?, values_of("c", 15));
    Ok(())
}

/// A restored position beyond its partition's end. With the topic's ID in the checkpoint and the
/// same topic in the cluster, the log was truncated (an unclean leader election, which a
/// single broker cannot stage: the checkpoint's offset is raised instead): the source resumes at
/// the log's end, reading what is written there next, and nothing before. Without an ID (a
/// checkpoint of an earlier build) nothing tells truncation from recreation: the restore fails
/// by default, naming `position_beyond_end`, and follows that setting when it is given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_position_beyond_the_end_resumes_by_the_topic_id_or_is_refused_without_one() -> Result<()> {
    use exactly_kafka_source::BeyondEnd;

    let env = TestEnv::get().await?;
    let (topic, config, info, state) = ten_read_and_snapshotted(env, "src-beyond", "beyond").await?;
    // The snapshot's one entry, as JSON, with its position moved to `offset`, and its topic ID
    // kept or dropped.
    let (name, entries) = state.union_state.iter().next().expect("the source's offsets");
    assert_eq!(entries.len(), 1, "one partition");
    let entry: serde_json::Value = serde_json::from_slice(&entries[0])?;
    assert_eq!(entry["next_offset"], 10);
    assert!(entry["topic_id"].is_string(), "the topic's ID is recorded: {entry}");
    let moved = |offset: i64, keep_id: bool| {
        let mut e = entry.clone();
        e["next_offset"] = offset.into();
        if !keep_id {
            e.as_object_mut().expect("an object").remove("topic_id");
        }
        let mut restored = state.clone();
        restored
            .union_state
            .insert(name.clone(), vec![serde_json::to_vec(&e).expect("serializes")]);
        restored
    };

    // The same topic, its end (10) below the position (25): resume at the end.
    let truncated = moved(25, true);
    let mut source = started(config.clone(), &info, Some(&truncated)).await?;
    produce(env, &topic, &labelled("b", 3))?;
    assert_eq!(read_values(&mut source, 3).await?, values_of("b", 3));
    drop(source);

    // No ID: refused, by default.
    let unclear = moved(25, false);
    let error = started(config.clone(), &info, Some(&unclear))
        .await
        .err()
        .expect("a position beyond the end without a topic ID")
        .to_string();
    assert!(
        error.contains("beyond the partition's end 13") && error.contains("position_beyond_end"),
        "{error}"
    );
    // ... and as the operator says, once told.
    let mut told = config.clone();
    told.position_beyond_end = BeyondEnd::Recreated;
    let mut source = started(told.clone(), &info, Some(&unclear)).await?;
    let mut all = values_of("a", 10);
    all.extend(values_of("b", 3));
    assert_eq!(read_values(&mut source, 13).await?, all);
    drop(source);
    told.position_beyond_end = BeyondEnd::Truncated;
    let mut source = started(told, &info, Some(&unclear)).await?;
    produce(env, &topic, &labelled("c", 2))?;
    assert_eq!(read_values(&mut source, 2).await?, values_of("c", 2));
    Ok(())
}

/// Retention overtaking a running source: the partition's next fetch position falls below the
/// log's first offset while the source lags (its prefetch held to a record or two), the fetch
/// reports it out of range, and the attempt fails with an error that restarts it (the restart
/// checks the restored offset against the log's range, as above). Before: librdkafka's silent
/// reset to the first offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_overtaking_a_lagging_source_fails_the_attempt_instead_of_a_silent_jump() -> Result<()> {
    use exactly_core::runtime::{InitContext, Source};

    let env = TestEnv::get().await?;
    let topic = unique("src-overtaken");
    create_topic(env, &topic, 1).await?;
    // Twenty records of 10 KB, each in its own batch (the fetcher's unit).
    let p: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .set("linger.ms", "0")
        .create()?;
    let big = "x".repeat(10_000);
    for i in 0..20 {
        let v = format!("{i:02}{big}");
        p.send(BaseRecord::<str, str>::to(&topic).partition(0).payload(&v))
            .map_err(|(e, _)| e)?;
        p.flush(T)?;
    }
    let mut config = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    config.start = StartPosition::Earliest;
    config.poll_batch = 1;
    for (k, v) in [
        ("queued.min.messages", "1"),
        ("queued.max.messages.kbytes", "1"),
        ("max.partition.fetch.bytes", "1"),
    ] {
        config.client.insert(k.into(), v.into());
    }
    let mut source = KafkaSource::new(config, RawBytes);
    let metrics = source.metrics();
    let info = subtask_info("overtaken");
    source.initialize_state(&InitContext::new(&info, None)).await?;
    let mut out = Vec::new();
    // The first record read: the fetcher has started, and holds at most a few ahead.
    let until = std::time::Instant::now() + T;
    while out.is_empty() && std::time::Instant::now() < until {
        source.poll_next(&mut out).await?;
    }
    assert!(!out.is_empty(), "no record within {T:?}");
    delete_records_before(env, &topic, 0, 17).await?;
    let error = loop {
        if std::time::Instant::now() > until {
            anyhow::bail!("no error within {T:?}; read {} records", out.len());
        }
        match source.poll_next(&mut out).await {
            Ok(_) => {}
            Err(e) => break e.to_string(),
        }
    };
    assert!(error.contains("outside the partition's log"), "{error}");
    assert!(
        out.len() < 17,
        "read {} records: the deleted ones were not all prefetched",
        out.len()
    );
    let last = out
        .last()
        .and_then(|r| r.value.as_deref())
        .map(|v| String::from_utf8_lossy(&v[..2]).into_owned());
    assert!(
        last.as_ref().is_some_and(|l| l.parse::<i64>().is_ok_and(|n| n < 17)),
        "{last:?}"
    );
    assert_eq!(
        metrics.lost_to_retention(),
        0,
        "counted by the restart that checks the range"
    );
    Ok(())
}

/// A pattern-subscribed source restored while a topic it had read is not listed (its metadata
/// showed an error for a moment; here the topic is absent at restore and appears later, and the
/// checkpoint — an earlier build's — recorded no topic ID, so its position is taken as the same
/// topic's) carries that topic's restored offset into its checkpoints and takes it up when
/// discovery sees the topic. Before, the offset was dropped and the topic read again from its
/// earliest offset: a whole-topic replay into the exactly-once sinks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_topic_not_listed_at_restore_resumes_at_its_offset_when_seen_again() -> Result<()> {
    let env = TestEnv::get().await?;
    let prefix = unique("src-unseen");
    let (listed, later) = (format!("{prefix}-a"), format!("{prefix}-b"));
    create_topic(env, &listed, 1).await?;
    produce(env, &listed, &labelled("a", 3))?;
    let mut config = KafkaSourceConfig::new(&env.kafka_bootstrap, Vec::new(), unique("g"));
    config.topic_pattern = Some(format!("^{prefix}-.*"));
    config.discovery_interval = Some(Duration::from_millis(300));
    let info = subtask_info("unseen");
    // A checkpoint that had read the later topic's partition up to offset 5.
    let entry = serde_json::json!({"version": 1, "tp": {"topic": later, "partition": 0}, "next_offset": 5});
    let mut restored = exactly_core::state::RestoredState::default();
    restored
        .union_state
        .insert("kafka-source-offsets".into(), vec![serde_json::to_vec(&entry)?]);
    let mut source = started(config, &info, Some(&restored)).await?;
    assert_eq!(read_values(&mut source, 3).await?, values_of("a", 3));
    // Its checkpoints still hold the offset while the topic is not listed.
    let carried = snapshot_of(&mut source).await?;
    let offsets: Vec<serde_json::Value> = carried.union_state["kafka-source-offsets"]
        .iter()
        .map(|e| serde_json::from_slice(e).expect("JSON"))
        .collect();
    assert!(
        offsets
            .iter()
            .any(|e| e["tp"]["topic"] == later.as_str() && e["next_offset"] == 5),
        "{offsets:?}"
    );
    // The topic is listed again, with ten records: read from the restored offset on.
    create_topic(env, &later, 1).await?;
    produce(env, &later, &labelled("b", 10))?;
    let read = read_values(&mut source, 5).await?;
    assert_eq!(read, (5..10).map(|i| format!("b{i}")).collect::<Vec<_>>());
    Ok(())
}
