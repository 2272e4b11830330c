//! Proves the broker under test is a real Kafka with real transactions: what read_committed
//! consumers see of committed, aborted and open transactions, fencing by transactional.id, and
//! consumer-group offsets that become visible only when their transaction commits.
//! (librdkafka's mock cluster and in-memory brokers fail parts of this.)

use std::time::Duration;

use anyhow::{Context, Result};
use exactly_integration_tests::{create_topic, read_committed, transactional_producer, unique, TestEnv};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const T: Duration = Duration::from_secs(30);

fn send(producer: &rdkafka::producer::BaseProducer, topic: &str, value: &str) -> Result<()> {
    producer
        .send(BaseRecord::<str, str>::to(topic).partition(0).key(value).payload(value))
        .map_err(|(err, _)| err)
        .with_context(|| format!("producing {value}"))?;
    producer.flush(T)?;
    Ok(())
}

fn values(records: &[exactly_integration_tests::CommittedRecord]) -> Vec<String> {
    records.iter().map(|r| r.value_str()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn read_committed_sees_committed_not_aborted_nor_open() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("txn-visibility");
    create_topic(env, &topic, 1).await?;

    let committer = transactional_producer(env, &unique("tx-commit"))?;
    committer.begin_transaction()?;
    send(&committer, &topic, "c1")?;
    send(&committer, &topic, "c2")?;
    committer.commit_transaction(T)?;

    let aborter = transactional_producer(env, &unique("tx-abort"))?;
    aborter.begin_transaction()?;
    send(&aborter, &topic, "a1")?;
    aborter.abort_transaction(T)?;

    let open = transactional_producer(env, &unique("tx-open"))?;
    open.begin_transaction()?;
    send(&open, &topic, "o1")?;

    // A committed record written after the open transaction began stays invisible too: the last
    // stable offset is pinned by the open transaction.
    committer.begin_transaction()?;
    send(&committer, &topic, "c3")?;
    committer.commit_transaction(T)?;

    let seen = read_committed(env, &topic, T)?;
    assert_eq!(values(&seen), ["c1", "c2"], "while o1's transaction is open");

    open.commit_transaction(T)?;
    let seen = read_committed(env, &topic, T)?;
    assert_eq!(
        values(&seen),
        ["c1", "c2", "o1", "c3"],
        "after o1's transaction committed"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_producer_with_the_same_id_fences_the_first() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("txn-fencing");
    create_topic(env, &topic, 1).await?;
    let id = unique("tx-fenced");

    let old = transactional_producer(env, &id)?;
    old.begin_transaction()?;
    send(&old, &topic, "from-old")?;

    // init_transactions of the new producer bumps the epoch and aborts the old open transaction.
    let new = transactional_producer(env, &id)?;
    let old_commit = old.commit_transaction(T);
    let err = old_commit.expect_err("the fenced producer must not commit");
    let fenced = match &err {
        KafkaError::Transaction(e) => e.is_fatal() || e.txn_requires_abort(),
        _ => false,
    };
    assert!(fenced, "expected a fatal or abortable transaction error, got {err:?}");

    new.begin_transaction()?;
    send(&new, &topic, "from-new")?;
    new.commit_transaction(T)?;
    assert_eq!(values(&read_committed(env, &topic, T)?), ["from-new"]);
    Ok(())
}

/// The group's committed offset for partition 0 of `topic`. A read_committed client asks the
/// broker for stable offsets only (it waits while a transaction holds pending offsets); a
/// read_uncommitted one gets the last materialised offset at once.
fn group_offset(env: &TestEnv, group: &str, topic: &str, isolation: &str) -> Result<Offset> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let committed = consumer.committed_offsets(tpl, T)?;
    Ok(committed
        .find_partition(topic, 0)
        .map(|p| p.offset())
        .unwrap_or(Offset::Invalid))
}

#[tokio::test(flavor = "multi_thread")]
async fn offsets_sent_to_a_transaction_are_visible_only_after_commit() -> Result<()> {
    let env = TestEnv::get().await?;
    let input = unique("txn-offsets-in");
    let output = unique("txn-offsets-out");
    create_topic(env, &input, 1).await?;
    create_topic(env, &output, 1).await?;
    let group = unique("txn-offsets-group");
    let member: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = member.group_metadata().context("group metadata")?;

    let producer = transactional_producer(env, &unique("tx-offsets"))?;
    let mut offsets = TopicPartitionList::new();

    // Aborted: the offsets never appear.
    producer.begin_transaction()?;
    send(&producer, &output, "aborted")?;
    offsets.add_partition_offset(&input, 0, Offset::Offset(3))?;
    producer.send_offsets_to_transaction(&offsets, &metadata, T)?;
    producer.abort_transaction(T)?;
    assert_eq!(
        group_offset(env, &group, &input, "read_committed")?,
        Offset::Invalid,
        "after abort"
    );

    // Committed: pending while open, visible after commit.
    producer.begin_transaction()?;
    send(&producer, &output, "committed")?;
    let mut offsets = TopicPartitionList::new();
    offsets.add_partition_offset(&input, 0, Offset::Offset(5))?;
    producer.send_offsets_to_transaction(&offsets, &metadata, T)?;
    assert_eq!(
        group_offset(env, &group, &input, "read_uncommitted")?,
        Offset::Invalid,
        "while the transaction is open"
    );
    producer.commit_transaction(T)?;
    assert_eq!(
        group_offset(env, &group, &input, "read_committed")?,
        Offset::Offset(5),
        "after commit"
    );
    assert_eq!(values(&read_committed(env, &output, T)?), ["committed"]);
    Ok(())
}

/// Keeps librdkafka's log lines.
#[derive(Default)]
struct Logs(std::sync::Mutex<Vec<String>>);

impl rdkafka::ClientContext for Logs {
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        self.0.lock().unwrap().push(format!("{fac}: {message}"));
    }
}

impl rdkafka::producer::ProducerContext for Logs {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::producer::DeliveryResult<'_>, _: ()) {}
}

/// The recovery EndTxn must be of the transaction version the producer's transactions are (the
/// broker infers it from the request version): pins that the EndTxn version librdkafka sends and
/// the one `exactly`'s recovery client sends are both below EndTxn v5 (transaction version 2), so
/// a librdkafka upgrade that brings KIP-890 fails here instead of in a recovery.
#[tokio::test(flavor = "multi_thread")]
async fn the_recovery_end_txn_speaks_the_producers_transaction_version() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("txn-version");
    create_topic(env, &topic, 1).await?;
    let producer: rdkafka::producer::BaseProducer<Logs> = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .set("transactional.id", unique("tx-version"))
        .set("debug", "protocol")
        .set_log_level(rdkafka::config::RDKafkaLogLevel::Debug)
        .create_with_context(Logs::default())?;
    producer.init_transactions(T)?;
    producer.begin_transaction()?;
    producer
        .send(BaseRecord::<str, str>::to(&topic).partition(0).payload("v"))
        .map_err(|(e, _)| e)?;
    producer.flush(T)?;
    producer.commit_transaction(T)?;
    // Log lines travel through the client's queue: serve it until the EndTxn line is there.
    let deadline = std::time::Instant::now() + T;
    while std::time::Instant::now() < deadline
        && !producer
            .context()
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("EndTxnRequest"))
    {
        producer.poll(Duration::from_millis(100));
    }
    let logs = producer.context().0.lock().unwrap().clone();
    let sent: Vec<i16> = logs
        .iter()
        .filter_map(|l| {
            let rest = l.split("Sent EndTxnRequest (v").nth(1)?;
            rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
        })
        .collect();
    let endtxn: Vec<&String> = logs.iter().filter(|l| l.contains("EndTxn")).collect();
    eprintln!("{endtxn:?}");
    assert!(
        !sent.is_empty(),
        "no EndTxn request in librdkafka's protocol log: {endtxn:?} of {} lines",
        logs.len()
    );
    for v in sent {
        assert!(
            v < exactly_kafka_sink::END_TXN_TV2_VERSION,
            "librdkafka sent EndTxn v{v}: transaction version 2, which the recovery client (EndTxn v{}) does not speak",
            exactly_kafka_sink::END_TXN_VERSION
        );
    }
    Ok(())
}
