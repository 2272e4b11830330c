use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use crate::TestEnv;

/// One record as a `read_committed` consumer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedRecord {
    /// Partition it was read from.
    pub partition: i32,
    /// Its offset in that partition.
    pub offset: i64,
    /// Key bytes, if any.
    pub key: Option<Vec<u8>>,
    /// Value bytes, if any.
    pub value: Option<Vec<u8>>,
}

impl CommittedRecord {
    /// The value as UTF-8 (lossy), for assertions.
    pub fn value_str(&self) -> String {
        String::from_utf8_lossy(self.value.as_deref().unwrap_or_default()).into_owned()
    }
}

/// Creates `topic` with `partitions` partitions (replication 1) and waits until its metadata shows.
pub async fn create_topic(env: &TestEnv, topic: &str, partitions: i32) -> Result<()> {
    create_topic_with(env, topic, partitions, &[]).await
}

/// Deletes the records of `topic`/`partition` below `offset` (DeleteRecords), as retention would:
/// the partition's first offset becomes `offset`.
pub async fn delete_records_before(env: &TestEnv, topic: &str, partition: i32, offset: i64) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
    for e in admin.delete_records(&tpl, &AdminOptions::new()).await?.elements() {
        e.error()
            .with_context(|| format!("deleting the records of {topic}/{partition} below {offset}"))?;
    }
    Ok(())
}

/// Deletes `topic` and creates it again with `partitions` partitions: the same name, another
/// topic ID, an empty log. The creation is retried while the broker still deletes the old one.
pub async fn recreate_topic(env: &TestEnv, topic: &str, partitions: i32) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.delete_topics(&[topic], &options).await? {
        result.map_err(|(name, code)| anyhow!("deleting topic {name} failed: {code}"))?;
    }
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        match admin.create_topics(&[new], &options).await?.remove(0) {
            Ok(_) => return Ok(()),
            Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err((name, code)) => bail!("creating topic {name} again after deleting it failed: {code}"),
        }
    }
}

/// [`create_topic`] with topic configuration (e.g. `max.message.bytes`).
pub async fn create_topic_with(env: &TestEnv, topic: &str, partitions: i32, config: &[(&str, &str)]) -> Result<()> {
    use rdkafka::types::RDKafkaErrorCode as C;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()
        .context("creating an admin client")?;
    let new = config.iter().fold(
        // The broker's default.replication.factor: 1 on the single broker, 3 on the cluster.
        NewTopic::new(topic, partitions, TopicReplication::Fixed(-1)),
        |t, (k, v)| t.set(k, v),
    );
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    // A broker whose controller stalls (seen: 10 s, the broker fencing itself) times the request
    // out; it is asked again, and a topic the timed-out request created after all is the one asked
    // for (the names are unique to the test).
    let timed_out =
        |code: Option<C>| matches!(code, Some(C::OperationTimedOut | C::RequestTimedOut | C::NotController));
    let mut tries = 0;
    loop {
        tries += 1;
        let results = match admin.create_topics(std::slice::from_ref(&new), &options).await {
            Ok(results) => results,
            Err(e) if timed_out(e.rdkafka_error_code()) && tries < 3 => {
                eprintln!("CreateTopics {topic}: {e}; asking again");
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("CreateTopics {topic}")),
        };
        match results.into_iter().next().context("CreateTopics: no result")? {
            Ok(_) => return until_visible(&admin, topic, partitions),
            Err((_, C::TopicAlreadyExists)) if tries > 1 => return until_visible(&admin, topic, partitions),
            Err((_, code)) if timed_out(Some(code)) && tries < 3 => {
                eprintln!("CreateTopics {topic}: {code}; asking again");
            }
            Err((name, code)) => bail!("creating topic {name} failed: {code}"),
        }
    }
}

/// Waits until the broker's metadata shows `topic` with its `partitions`, each with a leader:
/// CreateTopics answers once the controller has the topic, and a broker serves it in its metadata
/// a moment later — a client asking in between (a job started at once) is told it does not exist.
/// Seen: a job started right after its topics' creation on a busy broker stopped with "topic …
/// does not exist or has no partitions".
fn until_visible(admin: &AdminClient<DefaultClientContext>, topic: &str, partitions: i32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = admin
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .ok()
            .and_then(|m| {
                m.topics()
                    .iter()
                    .find(|t| t.name() == topic && t.error().is_none())
                    .map(|t| t.partitions().iter().filter(|p| p.leader() >= 0).count())
            })
            .unwrap_or(0);
        if seen >= partitions as usize {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("topic {topic} was created, but the broker's metadata showed {seen} of its {partitions} partitions with a leader after 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether a consumer's error is the connection's, which librdkafka recovers from by itself
/// (reconnecting): a reader waiting for records goes on until its deadline. Seen: a busy broker
/// (long collection pauses) made a verifying consumer report all brokers down for a moment.
fn transient(err: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        err,
        KafkaError::MessageConsumption(C::AllBrokersDown | C::BrokerTransportFailure)
    )
}

/// A producer with `transactional.id = id`, transactions initialised.
pub fn transactional_producer(env: &TestEnv, id: &str) -> Result<BaseProducer> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .set("transactional.id", id)
        .set("transaction.timeout.ms", "60000")
        .set("linger.ms", "5")
        .create()
        .context("creating a transactional producer")?;
    producer
        .init_transactions(Duration::from_secs(30))
        .with_context(|| format!("init_transactions for {id}"))?;
    Ok(producer)
}

/// A consumer of every partition of `topic` from the beginning, with `isolation`, reporting
/// each partition's end.
fn verifying_consumer(
    env: &TestEnv,
    topic: &str,
    timeout: Duration,
    isolation: &str,
) -> Result<(BaseConsumer, Vec<i32>)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .set("group.id", crate::unique("verifier"))
        .set("isolation.level", isolation)
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .create()
        .context("creating the verifying consumer")?;
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .with_context(|| format!("metadata of {topic}"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if partitions.is_empty() {
        bail!("topic {topic} has no partitions (does it exist?)");
    }
    let mut tpl = TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    Ok((consumer, partitions))
}

/// Everything a fresh `read_committed` consumer sees in `topic` now: it reads every partition from
/// the beginning up to its last stable offset (where librdkafka reports end of partition for
/// read_committed), or past the high watermark it had when the read began (a job committing
/// without pause moves the end on at every fetch, and the end of partition never comes). Records
/// of open transactions are therefore not returned. Fails if the end is not
/// reached within `timeout`.
pub fn read_committed(env: &TestEnv, topic: &str, timeout: Duration) -> Result<Vec<CommittedRecord>> {
    read_to_end(env, topic, timeout, "read_committed")
}

/// Everything in `topic` now, up to each partition's high watermark, records of open and aborted
/// transactions included (what a job wrote before it committed, or before it was killed).
pub fn read_uncommitted(env: &TestEnv, topic: &str, timeout: Duration) -> Result<Vec<CommittedRecord>> {
    read_to_end(env, topic, timeout, "read_uncommitted")
}

/// Whether `e` says a partition's leader is not known or moving: gone once the cluster settles.
fn leader_moving(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode::*;
    matches!(
        e.rdkafka_error_code(),
        Some(
            NotLeaderForPartition
                | LeaderNotAvailable
                | UnknownTopicOrPartition
                | BrokerTransportFailure
                | AllBrokersDown
        )
    )
}

/// The high watermark of `topic`/`partition` now, asked again while its leader is not known or
/// moving (right after a broker restart, seen under load in kafka_broker_restart; or while a
/// single broker that fenced itself comes back: ≈150 ms without a leader), as a consumer would,
/// for up to `timeout`.
pub fn high_watermark(env: &TestEnv, topic: &str, partition: i32, timeout: Duration) -> Result<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()
        .context("creating a consumer for watermarks")?;
    high_watermark_by(&consumer, topic, partition, Instant::now() + timeout)
}

fn high_watermark_by(consumer: &BaseConsumer, topic: &str, partition: i32, deadline: Instant) -> Result<i64> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match consumer.fetch_watermarks(topic, partition, left) {
            Ok((_, high)) => return Ok(high),
            Err(e) if leader_moving(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(e).with_context(|| format!("the high watermark of {topic}/{partition}")),
        }
    }
}

fn read_to_end(env: &TestEnv, topic: &str, timeout: Duration, isolation: &str) -> Result<Vec<CommittedRecord>> {
    let deadline = Instant::now() + timeout;
    let (consumer, partitions) = verifying_consumer(env, topic, timeout, isolation)?;
    let mut ends = HashMap::new();
    for p in &partitions {
        ends.insert(*p, high_watermark_by(&consumer, topic, *p, deadline)?);
    }
    let partitions = partitions.len();
    let mut at_end = HashSet::new();
    let mut records = Vec::new();
    while at_end.len() < partitions {
        if Instant::now() > deadline {
            bail!(
                "{isolation} of {topic}: only {} of {partitions} partitions reached their end within {timeout:?} ({} records so far)",
                at_end.len(),
                records.len()
            );
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(msg)) => {
                let p = msg.partition();
                if ends.get(&p).is_some_and(|end| msg.offset() + 1 >= *end) {
                    at_end.insert(p);
                } else {
                    at_end.remove(&p);
                }
                records.push(to_record(&msg));
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(err)) if transient(&err) => {}
            Some(Err(err)) => return Err(err).context("polling the verifying consumer"),
        }
    }
    Ok(records)
}

/// Polls `topic` with a fresh `read_committed` consumer until at least `count` records have been
/// seen or `timeout` passes; returns what was seen (callers assert on it).
pub fn wait_for_committed(env: &TestEnv, topic: &str, count: usize, timeout: Duration) -> Result<Vec<CommittedRecord>> {
    wait_for(env, topic, count, timeout, "read_committed")
}

/// As `wait_for_committed`, records of open and aborted transactions included.
pub fn wait_for_uncommitted(
    env: &TestEnv,
    topic: &str,
    count: usize,
    timeout: Duration,
) -> Result<Vec<CommittedRecord>> {
    wait_for(env, topic, count, timeout, "read_uncommitted")
}

fn wait_for(
    env: &TestEnv,
    topic: &str,
    count: usize,
    timeout: Duration,
    isolation: &str,
) -> Result<Vec<CommittedRecord>> {
    let deadline = Instant::now() + timeout;
    let (consumer, _) = verifying_consumer(env, topic, timeout, isolation)?;
    let mut records = Vec::new();
    while records.len() < count && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            None | Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Ok(msg)) => records.push(to_record(&msg)),
            Some(Err(err)) if transient(&err) => {}
            Some(Err(err)) => return Err(err).context("polling the verifying consumer"),
        }
    }
    Ok(records)
}

fn to_record<M: Message>(msg: &M) -> CommittedRecord {
    CommittedRecord {
        partition: msg.partition(),
        offset: msg.offset(),
        key: msg.key().map(<[u8]>::to_vec),
        value: msg.payload().map(<[u8]>::to_vec),
    }
}

/// Produces keyed records (non-transactionally, idempotent) and waits until all are acknowledged.
pub fn produce(env: &TestEnv, topic: &str, records: &[(String, String)]) -> Result<()> {
    Feed::new(env)?.send(topic, records)
}

/// An idempotent producer kept across batches (a feeder of a long scenario): its retries across a
/// broker restart add no duplicate input.
pub struct Feed {
    producer: BaseProducer,
}

impl Feed {
    /// A producer to `env`'s broker.
    pub fn new(env: &TestEnv) -> Result<Feed> {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &env.kafka_bootstrap)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            // A request to a node that stopped answering (kafka_cluster_failover stops one) is
            // given up after 10 s and sent again to the partition's new leader, well within
            // `send`'s 60 s (librdkafka's default: after 60 s).
            .set("socket.timeout.ms", "10000")
            .create()
            .context("creating a producer")?;
        Ok(Feed { producer })
    }

    /// Produces keyed records and waits (up to 60 s) until all are acknowledged.
    pub fn send(&self, topic: &str, records: &[(String, String)]) -> Result<()> {
        for (k, v) in records {
            loop {
                match self
                    .producer
                    .send(BaseRecord::to(topic).key(k.as_str()).payload(v.as_str()))
                {
                    Ok(()) => break,
                    Err((
                        rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                        _,
                    )) => {
                        self.producer.poll(Duration::from_millis(10));
                    }
                    Err((e, _)) => return Err(e).context("producing"),
                }
            }
        }
        if let Err(e) = self.producer.flush(Duration::from_secs(60)) {
            let fatal = self.producer.client().fatal_error();
            return Err(e).with_context(|| format!("flushing the producer (fatal error: {fatal:?})"));
        }
        Ok(())
    }
}
