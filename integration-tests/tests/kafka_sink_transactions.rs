//! The exactly-once Kafka sink's transaction handling against the real broker, one step at a
//! time: commit after the producer is gone, a transaction aborted by its timeout reported as
//! lost, a stale committable that must not commit a newer transaction of the same id, pool
//! exhaustion declining, a commit in the background, lingering transactions of removed subtasks,
//! and the timeout guardrail.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_core::runtime::SubtaskInfo;
use exactly_integration_tests::{
    create_topic, create_topic_with, delete_records_before, read_committed, unique, TestEnv,
};
use exactly_kafka_sink::admin::describe_transaction;
use exactly_kafka_sink::admin::Cluster;
use exactly_kafka_sink::{
    DeliveryGuarantee, KafkaCommittable, KafkaSinkConfig, KafkaTransaction, KeyHashPartitioner, ProducerRecord,
    TransactionalKafkaSink,
};
use exactly_twophase::{CommitError, Committed, PreCommitted, RecoveryContext, TwoPhaseCommitSink};

const T: Duration = Duration::from_secs(30);

fn info(index: u32, parallelism: u32) -> SubtaskInfo {
    SubtaskInfo::new("sink", index, parallelism)
}

fn sink(env: &TestEnv, topic: &str, prefix: &str, pool_size: usize, timeout: Duration) -> TransactionalKafkaSink {
    eo_sink(env, topic, prefix, pool_size, 2 * pool_size, timeout, None)
}

/// An exactly-once sink of two producers that accepts unknown outcomes up to `up_to`.
fn accepting(env: &TestEnv, topic: &str, prefix: &str, up_to: Option<u64>) -> TransactionalKafkaSink {
    eo_sink(env, topic, prefix, 2, 4, Duration::from_secs(120), up_to)
}

fn eo_sink(
    env: &TestEnv,
    topic: &str,
    prefix: &str,
    pool_size: usize,
    max_pool_size: usize,
    timeout: Duration,
    accept_unknown_outcome_up_to: Option<u64>,
) -> TransactionalKafkaSink {
    let config = KafkaSinkConfig::new(
        &env.kafka_bootstrap,
        topic,
        DeliveryGuarantee::ExactlyOnce {
            transactional_id_prefix: prefix.to_owned(),
            pool_size,
            max_pool_size,
            transaction_timeout: timeout,
            accept_unknown_outcome_up_to,
        },
    );
    TransactionalKafkaSink::new(config, Box::new(KeyHashPartitioner::default())).unwrap()
}

async fn start(s: &mut TransactionalKafkaSink, info: &SubtaskInfo, restored: &[(u64, KafkaCommittable)]) -> Result<()> {
    s.open(info).await?;
    s.abort_lingering(&RecoveryContext {
        info,
        restored,
        all_restored: restored,
        is_restored: !restored.is_empty(),
        restored_checkpoint: None,
        unreadable_newer: None,
        owner: None,
    })
    .await?;
    Ok(())
}

/// What the driver does at a restore: clean up what could hold the commits up, commit the
/// restored committables, then abort what is left.
async fn restore(
    s: &mut TransactionalKafkaSink,
    info: &SubtaskInfo,
    restored: &[(u64, KafkaCommittable)],
) -> Result<()> {
    s.open(info).await?;
    let ctx = RecoveryContext {
        info,
        restored,
        all_restored: restored,
        is_restored: true,
        restored_checkpoint: None,
        unreadable_newer: None,
        owner: None,
    };
    s.abort_unneeded(&ctx).await?;
    for (_, c) in restored {
        s.commit(c).await?;
    }
    s.abort_lingering(&ctx).await?;
    Ok(())
}

async fn txn(s: &mut TransactionalKafkaSink, id: u64, values: &[&str]) -> Result<KafkaTransaction> {
    let mut t = s.begin(id).await?;
    let records = values
        .iter()
        .map(|v| ProducerRecord::keyed(v.as_bytes(), v.as_bytes()))
        .collect();
    s.write(&mut t, records).await?;
    Ok(t)
}

/// Pre-commits, waiting for a pre-commit that completes in the background (as the driver's
/// deferred snapshot part does).
async fn pre_commit(
    s: &mut TransactionalKafkaSink,
    t: KafkaTransaction,
    id: u64,
) -> exactly_core::Result<PreCommitted<KafkaCommittable, KafkaTransaction>> {
    match s.pre_commit(t, id).await? {
        PreCommitted::InBackground(rest) => Ok(PreCommitted::Committable(rest.await?)),
        other => Ok(other),
    }
}

async fn prepared(s: &mut TransactionalKafkaSink, t: KafkaTransaction, id: u64) -> Result<KafkaCommittable> {
    match pre_commit(s, t, id).await? {
        PreCommitted::Committable(c) => Ok(c),
        other => bail!("expected a committable, got {other:?}"),
    }
}

fn values(env: &TestEnv, topic: &str) -> Result<Vec<String>> {
    let mut v: Vec<String> = read_committed(env, topic, T)?.iter().map(|r| r.value_str()).collect();
    v.sort();
    Ok(v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_sink_commits_what_the_crashed_one_pre_committed() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-recover");
    create_topic(env, &topic, 3).await?;
    let prefix = unique("recover");
    let me = info(0, 1);

    let mut crashed = sink(env, &topic, &prefix, 3, Duration::from_secs(120));
    start(&mut crashed, &me, &[]).await?;
    let t = txn(&mut crashed, 1, &["a", "b", "c"]).await?;
    let c = prepared(&mut crashed, t, 1).await?;
    assert!(c.producer_id >= 0 && c.probe.is_some(), "{c:?}");
    drop(crashed); // the process dies: no commit, no abort
    assert!(values(env, &topic)?.is_empty(), "nothing visible before the commit");

    let mut restarted = sink(env, &topic, &prefix, 3, Duration::from_secs(120));
    restarted.open(&me).await?;
    restarted.commit(&c).await?; // through the protocol: no producer holds it any more
    assert_eq!(values(env, &topic)?, ["a", "b", "c"]);
    restarted.commit(&c).await?; // idempotent: already committed is success
    start(&mut restarted, &me, std::slice::from_ref(&(1, c))).await?;
    assert_eq!(values(env, &topic)?, ["a", "b", "c"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_the_broker_aborted_on_timeout_is_reported_lost() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-lost");
    create_topic(env, &topic, 1).await?;
    let prefix = unique("lost");
    let me = info(0, 1);
    let mut crashed = sink(env, &topic, &prefix, 2, Duration::from_secs(2));
    start(&mut crashed, &me, &[]).await?;
    let t = txn(&mut crashed, 1, &["doomed"]).await?;
    let c = prepared(&mut crashed, t, 1).await?;
    drop(crashed);

    // Wait until the coordinator aborted it (timeout 2 s, checked every second by our broker).
    let deadline = Instant::now() + T;
    loop {
        let now = describe_transaction(&Cluster::plaintext(&env.kafka_bootstrap), &c.transactional_id).await?;
        if now.state != "Ongoing" {
            eprintln!("coordinator now reports {now:?}");
            break;
        }
        if Instant::now() > deadline {
            bail!("the broker did not abort the transaction within {T:?}: {now:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut restarted = sink(env, &topic, &prefix, 2, Duration::from_secs(2));
    restarted.open(&me).await?;
    match restarted.commit(&c).await {
        Err(CommitError::Lost { what, source }) => {
            assert!(what.contains(&c.transactional_id), "{what}");
            eprintln!("lost as expected: {what}: {source}");
        }
        Ok(()) => bail!("a transaction aborted by its timeout must not count as committed"),
        Err(e) => bail!("expected Lost, got {e}"),
    }
    assert!(values(env, &topic)?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_committable_never_commits_a_newer_transaction_of_its_id() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-stale");
    create_topic(env, &topic, 1).await?;
    let prefix = unique("stale");
    let me = info(0, 1);
    let mut crashed = sink(env, &topic, &prefix, 2, Duration::from_secs(120));
    start(&mut crashed, &me, &[]).await?;
    let t1 = txn(&mut crashed, 1, &["one"]).await?; // slot 0
    let c1 = prepared(&mut crashed, t1, 1).await?;
    crashed.commit(&c1).await?;
    let t2 = txn(&mut crashed, 2, &["two"]).await?; // slot 1
    let c2 = prepared(&mut crashed, t2, 2).await?;
    crashed.commit(&c2).await?;
    let t3 = txn(&mut crashed, 3, &["late"]).await?; // slot 0 again: same id, producer id and epoch as c1
    let _open = t3; // left open when the process dies
    drop(crashed);

    // A restore of checkpoint 1 (say) hands c1 back: it must be recognised as committed, and the
    // open transaction of the same id must not be committed in its place.
    let mut restarted = sink(env, &topic, &prefix, 2, Duration::from_secs(120));
    restarted.open(&me).await?;
    restarted.commit(&c1).await?;
    start(&mut restarted, &me, std::slice::from_ref(&(1, c1))).await?; // aborts "late"
    assert_eq!(values(env, &topic)?, ["one", "two"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_grows_to_its_maximum_then_declines_then_recovers_and_shrinks() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-pool");
    create_topic(env, &topic, 1).await?;
    let me = info(0, 1);
    let mut s = sink(env, &topic, &unique("pool"), 2, Duration::from_secs(120));
    start(&mut s, &me, &[]).await?;
    // Checkpoints 1..=3 pre-commit and none completes (say they were aborted): the pool of 2
    // grows to 4 rather than leave the job unable to ever complete a checkpoint.
    let mut pending = Vec::new();
    for id in 1..=3 {
        let t = txn(&mut s, id, &[&format!("x{id}")]).await?;
        pending.push(prepared(&mut s, t, id).await?);
    }
    let t4 = txn(&mut s, 4, &["x4"]).await?; // the fourth and last producer
    assert_eq!(s.producers(), 4, "grown to max_pool_size");
    let t4 = match pre_commit(&mut s, t4, 4).await? {
        PreCommitted::Declined { txn, reason } => {
            assert!(reason.contains("wait for their checkpoints"), "{reason}");
            txn
        }
        other => bail!("expected a decline, got {other:?}"),
    };
    for c in &pending {
        s.commit(c).await?; // a later checkpoint completes: everything up to it commits
    }
    let c4 = prepared(&mut s, t4, 5).await?;
    s.commit(&c4).await?;
    assert_eq!(values(env, &topic)?, ["x1", "x2", "x3", "x4"]);
    assert_eq!(s.producers(), 2, "the producers it grew by are closed once free");
    // Still usable after shrinking.
    let t = txn(&mut s, 6, &["x6"]).await?;
    let c6 = prepared(&mut s, t, 6).await?;
    s.commit(&c6).await?;
    assert_eq!(values(env, &topic)?, ["x1", "x2", "x3", "x4", "x6"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_in_the_background_frees_its_producer_and_a_full_pool_waits_for_it_rather_than_grow() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-bg-commit");
    create_topic(env, &topic, 1).await?;
    let me = info(0, 1);
    let mut s = sink(env, &topic, &unique("bgcommit"), 2, Duration::from_secs(120));
    start(&mut s, &me, &[]).await?;
    let t1 = txn(&mut s, 1, &["y1"]).await?;
    let c1 = prepared(&mut s, t1, 1).await?;
    let t2 = txn(&mut s, 2, &["y2"]).await?;
    // Checkpoint 1 completes: its commit goes on in the background.
    let Committed::InBackground(committing) = s.start_commit(&c1).await? else {
        bail!("a transaction of this run commits in the background");
    };
    let committing = tokio::spawn(committing);
    // Both producers are taken (one committing, one open): the barrier waits for the commit to
    // free its producer instead of growing the pool.
    let c2 = prepared(&mut s, t2, 2).await?;
    assert_eq!(s.producers(), 2, "no producer added while a commit was completing");
    committing.await??;
    assert_eq!(values(env, &topic)?, ["y1"]);
    let t3 = txn(&mut s, 3, &["y3"]).await?;
    match s.start_commit(&c2).await? {
        Committed::InBackground(rest) => rest.await?,
        Committed::Done => bail!("a transaction of this run commits in the background"),
    }
    let c3 = prepared(&mut s, t3, 3).await?;
    // Committing again after the background commit ended is idempotent (a restart does so).
    s.commit(&c2).await?;
    s.commit(&c3).await?;
    assert_eq!(values(env, &topic)?, ["y1", "y2", "y3"]);
    assert_eq!(s.producers(), 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lingering_transactions_of_removed_subtasks_are_aborted_and_readers_move_on() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-linger");
    create_topic(env, &topic, 1).await?;
    let prefix = unique("linger");
    // Subtask 3 of 4 dies with a transaction open, and the job comes back with 2 subtasks.
    let mut gone = sink(env, &topic, &prefix, 2, Duration::from_secs(600));
    start(&mut gone, &info(3, 4), &[]).await?;
    // Left open when the process dies; in the log first: dropping the producer purges what it has
    // not sent yet, and a transaction that never reached the partition pins nothing (failed so
    // once under load: "after" visible).
    let _open = txn(&mut gone, 1, &["never"]).await?;
    wait_in_log(env, &topic, "never")?;
    drop(gone);
    let mut other = sink(env, &topic, &unique("other"), 2, Duration::from_secs(120));
    start(&mut other, &info(0, 1), &[]).await?;
    let t = txn(&mut other, 1, &["after"]).await?;
    let c = prepared(&mut other, t, 1).await?;
    other.commit(&c).await?;
    assert!(
        values(env, &topic)?.is_empty(),
        "the open transaction pins the last stable offset"
    );

    let mut restarted = sink(env, &topic, &prefix, 2, Duration::from_secs(120));
    start(&mut restarted, &info(0, 2), &[]).await?;
    assert_eq!(
        values(env, &topic)?,
        ["after"],
        "the reader moves on once the lingering one is aborted"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_timeout_above_the_brokers_maximum_is_refused_at_start() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-guard");
    create_topic(env, &topic, 1).await?;
    let mut s = sink(env, &topic, &unique("guard"), 2, Duration::from_secs(20 * 60));
    let err = s.open(&info(0, 1)).await.unwrap_err().to_string();
    let chain = format!("{err} {:?}", err);
    assert!(
        chain.contains("transaction.max.timeout.ms") && chain.contains("15m"),
        "{chain}"
    );
    Ok(())
}

/// A record the broker refuses (larger than the topic's `max.message.bytes`) is a delivery error
/// that fails the flush at the barrier: the exactly-once pre-commit and the at-least-once
/// snapshot both fail, naming the topic, rather than let the checkpoint complete without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_broker_refuses_fails_the_barrier_flush() -> Result<()> {
    use exactly_core::runtime::{InitContext, Sink, SnapshotContext};
    use exactly_core::SnapshotKind;
    use exactly_kafka_sink::KafkaSink;
    let env = TestEnv::get().await?;
    let topic = unique("sink-refused");
    create_topic_with(env, &topic, 1, &[("max.message.bytes", "2000")]).await?;
    let big = vec![b'x'; 10_000];

    // Exactly-once: the pre-commit flushes and fails.
    let mut s = sink(env, &topic, &unique("refused"), 2, T);
    let i = info(0, 1);
    start(&mut s, &i, &[]).await?;
    let mut t = s.begin(1).await?;
    s.write(&mut t, vec![ProducerRecord::keyed(b"k".as_slice(), big.as_slice())])
        .await?;
    let err = match pre_commit(&mut s, t, 1).await {
        Ok(other) => bail!("pre-commit of a refused record succeeded: {other:?}"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&topic), "error names the topic: {err}");

    // At-least-once: the snapshot at the barrier flushes and fails.
    let mut w = KafkaSink::new(KafkaSinkConfig::new(
        &env.kafka_bootstrap,
        &topic,
        DeliveryGuarantee::AtLeastOnce,
    ))?;
    w.initialize_state(&InitContext::new(&i, None)).await?;
    w.write(vec![ProducerRecord::keyed(b"k".as_slice(), big.as_slice())])
        .await?;
    let err = match w
        .snapshot_state(&mut SnapshotContext::new(1, SnapshotKind::Checkpoint, 0))
        .await
    {
        Ok(()) => bail!("at-least-once snapshot with a refused record succeeded"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&topic), "error names the topic: {err}");
    assert!(values(env, &topic)?.is_empty());
    Ok(())
}

/// A committable whose transactional id the coordinator no longer knows (expired after
/// `transactional.id.expiration.ms`, as for a week-old savepoint) is settled by its record: seen
/// by read_committed readers → committed; in the log but skipped by them → aborted (lost).
/// Before: TRANSACTIONAL_ID_NOT_FOUND was a retriable error, retried forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committable_whose_id_expired_is_settled_by_its_record() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-expired");
    create_topic(env, &topic, 1).await?;
    let prefix = unique("expired");
    let me = info(0, 1);
    let mut s = sink(env, &topic, &prefix, 3, Duration::from_secs(120));
    start(&mut s, &me, &[]).await?;
    let t = txn(&mut s, 1, &["kept"]).await?;
    let committed = prepared(&mut s, t, 1).await?;
    s.commit(&committed).await?;
    let t = txn(&mut s, 2, &["dropped"]).await?;
    let aborted = prepared(&mut s, t, 2).await?;
    exactly_kafka_sink::admin::abort_transaction(
        &Cluster::plaintext(&env.kafka_bootstrap),
        &aborted.transactional_id,
        T,
    )
    .await?;
    drop(s);
    assert_eq!(values(env, &topic)?, ["kept"]);

    // The same committables under an id the coordinator has never heard of.
    let unknown = |c: &KafkaCommittable| KafkaCommittable {
        transactional_id: unique("never-seen"),
        ..c.clone()
    };
    let mut restarted = sink(env, &topic, &prefix, 3, Duration::from_secs(120));
    restarted.open(&me).await?;
    restarted.commit(&unknown(&committed)).await?;
    match restarted.commit(&unknown(&aborted)).await {
        Err(CommitError::Lost { source, .. }) => {
            assert!(source.to_string().contains("no longer knows"), "{source}")
        }
        other => bail!("an aborted transaction must be reported lost, got {other:?}"),
    }
    assert_eq!(values(env, &topic)?, ["kept"]);
    Ok(())
}

/// A committed transaction whose record retention removed cannot be checked any more: that is
/// "unknown", not "aborted → DATA LOST" (before, the probe consumer jumped to the end of the
/// partition, librdkafka's default offset reset, and read the record as absent), and unknown stops
/// the job, naming the checkpoint and the setting that accepts it, unless that setting covers the
/// checkpoint (before, it warned and went on: a guess).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_record_removed_by_retention_is_unknown_not_lost() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-retention");
    create_topic(env, &topic, 1).await?;
    let prefix = unique("retention");
    let me = info(0, 1);
    let mut s = sink(env, &topic, &prefix, 2, Duration::from_secs(120));
    start(&mut s, &me, &[]).await?;
    let t = txn(&mut s, 1, &["old"]).await?;
    let c = prepared(&mut s, t, 1).await?;
    s.commit(&c).await?;
    let t = txn(&mut s, 2, &["newer"]).await?;
    let c2 = prepared(&mut s, t, 2).await?;
    s.commit(&c2).await?;
    drop(s);
    // Retention (here DeleteRecords) removes everything up to the newer record.
    let newer = c2.probe.as_ref().expect("a probe").offset;
    delete_records_before(env, &topic, 0, newer).await?;

    // The restarted sink initialises its ids (new epoch): c is no longer the open transaction of
    // its id, so only its record could tell, and it is gone.
    for accepted in [None, Some(0)] {
        let mut restarted = accepting(env, &topic, &prefix, accepted);
        start(&mut restarted, &me, &[]).await?;
        match restarted.commit(&c).await {
            Err(CommitError::Fatal(e)) => {
                let e = e.to_string();
                for part in [
                    "cannot tell",
                    "checkpoint 1",
                    "accept_unknown_outcome_up_to = 1",
                    "retention",
                ] {
                    assert!(e.contains(part), "{part:?} missing from: {e}");
                }
            }
            other => bail!("unknown outcome (accepting up to {accepted:?}) must stop the job, got {other:?}"),
        }
    }
    let mut restarted = accepting(env, &topic, &prefix, Some(1));
    start(&mut restarted, &me, &[]).await?;
    restarted.commit(&c).await?;
    assert_eq!(values(env, &topic)?, ["newer"]);
    Ok(())
}

/// `exactly txn --prefix orders` must not touch `orders-eu-0-0`: ids are parsed, not prefix-matched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_by_prefix_parses_ids_instead_of_matching_their_start() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-prefix");
    create_topic(env, &topic, 1).await?;
    let prefix = unique("orders");
    let longer = format!("{prefix}-eu");
    let me = info(0, 1);
    let mut a = sink(env, &topic, &prefix, 2, T);
    start(&mut a, &me, &[]).await?;
    let _open_a = txn(&mut a, 1, &["a"]).await?;
    let mut b = sink(env, &topic, &longer, 2, T);
    start(&mut b, &me, &[]).await?;
    let _open_b = txn(&mut b, 1, &["b"]).await?;
    let listed =
        exactly_kafka_sink::admin::list_transactions(&Cluster::plaintext(&env.kafka_bootstrap), &prefix).await?;
    let ids: Vec<&str> = listed.iter().map(|t| t.transactional_id.as_str()).collect();
    assert_eq!(ids, [format!("{prefix}-0-0"), format!("{prefix}-0-1")], "{ids:?}");
    let listed =
        exactly_kafka_sink::admin::list_transactions(&Cluster::plaintext(&env.kafka_bootstrap), &longer).await?;
    let ids: Vec<&str> = listed.iter().map(|t| t.transactional_id.as_str()).collect();
    assert_eq!(ids, [format!("{longer}-0-0"), format!("{longer}-0-1")], "{ids:?}");
    Ok(())
}

/// Waits until a read_uncommitted reader sees `value` in `topic` (the record is in the log).
fn wait_in_log(env: &TestEnv, topic: &str, value: &str) -> Result<()> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .set("group.id", unique("uncommitted"))
        .set("isolation.level", "read_uncommitted")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let deadline = Instant::now() + T;
    while Instant::now() < deadline {
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            if m?.payload() == Some(value.as_bytes()) {
                return Ok(());
            }
        }
    }
    bail!("{value} did not reach {topic} within {T:?}")
}

/// An open transaction no checkpoint needs is aborted *before* the restored committables are
/// checked: otherwise it pins the partition's last stable offset, and the read_committed check of
/// a restored transaction waits on it until the broker's timeout (here 2 min) aborts it. Before,
/// the check gave up after 30 s and the commit was retried until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unneeded_open_transaction_is_aborted_before_restored_ones_are_checked() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-pin");
    create_topic(env, &topic, 1).await?;
    let prefix = unique("pin");
    let me = info(0, 1);
    let mut crashed = sink(env, &topic, &prefix, 3, Duration::from_secs(120));
    start(&mut crashed, &me, &[]).await?;
    let _linger = txn(&mut crashed, 1, &["linger"]).await?; // open when the process dies
    wait_in_log(env, &topic, "linger")?; // in the log first: it pins the last stable offset below what follows
    let t = txn(&mut crashed, 2, &["two"]).await?;
    let c = prepared(&mut crashed, t, 2).await?;
    crashed.commit(&c).await?;
    drop(crashed);
    assert!(
        values(env, &topic)?.is_empty(),
        "the open transaction pins the last stable offset"
    );

    // Restored under an id the coordinator does not know, so only its record can tell.
    let restored = KafkaCommittable {
        transactional_id: unique("forgotten"),
        ..c
    };
    let mut restarted = sink(env, &topic, &prefix, 3, Duration::from_secs(120));
    let started = Instant::now();
    restore(&mut restarted, &me, &[(2, restored)]).await?;
    eprintln!("restored in {:?}", started.elapsed());
    assert_eq!(values(env, &topic)?, ["two"]);
    Ok(())
}

/// The records after a barrier must land after the records before it in every partition, though
/// the previous transaction's flush still runs in the background on another pooled producer:
/// read_committed readers see a partition in log order, so a transaction whose records overtake
/// the previous one's tail reorders the output. The first transaction is made slow to flush (a
/// deep queue of tiny batches), the second writes at once (held until the first has delivered
/// everything, then sent by its pre-commit), then both commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_after_a_barrier_never_overtake_the_previous_transactions_flush() -> Result<()> {
    order_across_a_barrier(1_000_000, &[100]).await
}

/// As above, but the second transaction writes more than the sink holds (a producer queue's
/// worth, here 150 000 records): that write waits for the first transaction's flush, then sends
/// what was held before its own records, and a later write goes straight out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_beyond_the_hold_wait_for_the_previous_flush_and_keep_their_order() -> Result<()> {
    order_across_a_barrier(150_000, &[100, 200_000, 100]).await
}

/// Writes 100 000 records in a first transaction, then `second` (write by write) in the next
/// while the first flushes; commits both; checks that a read_committed reader sees every record
/// once and in the order written.
async fn order_across_a_barrier(queue_cap: usize, second: &[usize]) -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-order");
    create_topic(env, &topic, 1).await?;
    let mut s = {
        let mut config = KafkaSinkConfig::new(
            &env.kafka_bootstrap,
            &topic,
            DeliveryGuarantee::ExactlyOnce {
                transactional_id_prefix: unique("order"),
                pool_size: 2,
                max_pool_size: 4,
                transaction_timeout: T,
                accept_unknown_outcome_up_to: None,
            },
        );
        config
            .client
            .insert("queue.buffering.max.messages".into(), queue_cap.to_string());
        config.client.insert("batch.size".into(), "600".into());
        TransactionalKafkaSink::new(config, Box::new(KeyHashPartitioner::default()))?
    };
    let i = info(0, 1);
    start(&mut s, &i, &[]).await?;
    let record = |n: usize| ProducerRecord::keyed(b"k".as_slice(), format!("{n:07}").as_bytes());
    const FIRST: usize = 100_000;

    let mut t1 = s.begin(1).await?;
    s.write(&mut t1, (1..=FIRST).map(record).collect()).await?;
    let flushing = match s.pre_commit(t1, 1).await? {
        PreCommitted::InBackground(rest) => Some(rest),
        PreCommitted::Committable(c) => {
            s.commit(&c).await?;
            None
        }
        other => bail!("expected a pre-commit, got {other:?}"),
    };
    let mut t2 = s.begin(2).await?;
    let mut next = FIRST + 1;
    for n in second {
        s.write(&mut t2, (next..next + n).map(record).collect()).await?;
        next += n;
    }
    if let Some(rest) = flushing {
        let c1 = rest.await?;
        s.commit(&c1).await?;
    }
    let c2 = prepared(&mut s, t2, 2).await?;
    s.commit(&c2).await?;

    let seen: Vec<String> = read_committed(env, &topic, T)?.iter().map(|r| r.value_str()).collect();
    assert_eq!(seen.len(), next - 1, "every record once");
    let out_of_order = seen.windows(2).filter(|w| w[0] >= w[1]).count();
    let first = seen.windows(2).find(|w| w[0] >= w[1]);
    assert_eq!(
        out_of_order, 0,
        "log order broken {out_of_order} times, first: {first:?}"
    );
    Ok(())
}

/// A recovery that lost its checkpoint location (another run took it over while this one was
/// cut off from the checkpoint store) fences none of the ids: the open transaction of another
/// run of the job stays open, not aborted by this one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_without_its_location_fences_nothing() -> Result<()> {
    use exactly_core::storage::CheckpointStorage;
    use exactly_integration_tests::OwnerLostAfter;
    use std::sync::Arc;

    let env = TestEnv::get().await?;
    let (topic, prefix) = (unique("owner-lost"), unique("owner-lost-txn"));
    create_topic(env, &topic, 1).await?;
    let me = info(0, 1);
    // The run that owns the location: a transaction open on its first id.
    let mut owner = sink(env, &topic, &prefix, 2, T);
    start(&mut owner, &me, &[]).await?;
    let t = txn(&mut owner, 1, &["kept"]).await?;
    let c = prepared(&mut owner, t, 1).await?;

    // A run that lost the location recovers: refused before it fences the pool.
    let lost = Arc::new(OwnerLostAfter::new(0));
    let storage: Arc<dyn CheckpointStorage> = lost.clone();
    let mut stale = sink(env, &topic, &prefix, 2, T);
    stale.open(&me).await?;
    let err = stale
        .abort_lingering(&RecoveryContext {
            info: &me,
            restored: &[],
            all_restored: &[],
            is_restored: false,
            restored_checkpoint: None,
            unreadable_newer: None,
            owner: Some(&storage),
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("another run took it over"), "{err}");
    let now = describe_transaction(&Cluster::plaintext(&env.kafka_bootstrap), &c.transactional_id).await?;
    assert_eq!(now.state, "Ongoing", "the owner's transaction is still open: {now:?}");
    // And the owner commits it.
    owner.commit(&c).await.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    assert_eq!(values(env, &topic)?, vec!["kept".to_owned()]);
    Ok(())
}
