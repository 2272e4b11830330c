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

#[path = "kafka_sink_transactions/pool_and_order.rs"]
mod pool_and_order;
#[path = "kafka_sink_transactions/recovery.rs"]
mod recovery;

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

/// A script that creates the job's topics and starts it at once can start the sink before the
/// topic is in the broker's metadata: the sink waits for it (and then writes to it) rather than
/// call it missing. Failed before the wait: "topic … does not exist or has no partitions" at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_topic_created_while_the_sink_starts_is_waited_for() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-late");
    let mut s = sink(env, &topic, &unique("late"), 2, Duration::from_secs(60));
    let later = topic.clone();
    let creating = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        create_topic(env, &later, 3).await
    });
    let opened = start(&mut s, &info(0, 1), &[]).await;
    creating.await??;
    opened?;
    let t = txn(&mut s, 1, &["late"]).await?;
    let c = prepared(&mut s, t, 1).await?;
    s.commit(&c).await?;
    assert_eq!(values(env, &topic)?, ["late"]);
    Ok(())
}

/// A topic that never appears is still called missing, by name, once the wait is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_topic_never_created_is_called_missing_by_name() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("sink-never");
    let mut s = sink(env, &topic, &unique("never"), 2, Duration::from_secs(60));
    let err = s.open(&info(0, 1)).await.unwrap_err().to_string();
    assert!(err.contains(&topic) && err.contains("does not exist"), "{err}");
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
