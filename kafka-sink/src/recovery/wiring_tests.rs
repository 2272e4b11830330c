//! The commit after restart against the real broker (`EXACTLY_KAFKA_BOOTSTRAP`), with another
//! producer acting between its requests: the branches the decisions in [`super::steps`] take
//! only when the coordinator's state changes under the recovery, which no crash test reaches.
//!
//! The other producer plays the zombie of the crashed process: it holds the same transactional
//! id, producer id and epoch as the restored committable (it *is* the producer that opened the
//! restored transaction), so an EndTxn naming that producer ends whatever it has open.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;

use super::{commit_recovered, Coordinator};
use crate::committable::{KafkaCommittable, Probe, COMMITTABLE_VERSION};
use crate::error::{Result, SinkError};
use crate::protocol::{TxnDescription, Wire};
use exactly_kafka_client::Cluster;
use exactly_twophase::CommitError;

type Zombie = ThreadedProducer<DefaultProducerContext>;

fn bootstrap() -> String {
    std::env::var("EXACTLY_KAFKA_BOOTSTRAP").unwrap_or_else(|_| {
        panic!(
            "this test needs a Kafka broker: start one with `scripts/services up kafka` and export \
             what `scripts/services env` prints (EXACTLY_KAFKA_BOOTSTRAP)"
        )
    })
}

/// A new one-partition topic and a transactional producer with an open transaction that wrote
/// one record to it (at offset 0): the restored transaction, and its zombie.
async fn open_transaction(name: &str) -> (Wire, Zombie, KafkaCommittable) {
    open_transaction_timing_out(name, 60_000).await
}

/// [`open_transaction`], the zombie's transactions timing out after `timeout_ms`.
async fn open_transaction_timing_out(name: &str, timeout_ms: u32) -> (Wire, Zombie, KafkaCommittable) {
    let bootstrap = bootstrap();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .expect("admin client");
    let created = admin
        .create_topics(
            &[NewTopic::new(name, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .expect("create topic");
    for r in created {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
    let zombie: Zombie = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("transactional.id", name)
        .set("transaction.timeout.ms", timeout_ms.to_string())
        .set("message.timeout.ms", timeout_ms.to_string())
        .create()
        .expect("producer");
    let z = zombie.clone();
    let topic = name.to_owned();
    let wire = Wire::new(Cluster::plaintext(&bootstrap), Duration::from_secs(10));
    tokio::task::spawn_blocking(move || {
        z.init_transactions(Duration::from_secs(30)).expect("init_transactions");
        write_one(&z, topic);
    })
    .await
    .unwrap();
    let ours = ongoing(&wire, name, None).await;
    let c = KafkaCommittable {
        version: COMMITTABLE_VERSION,
        transactional_id: name.to_owned(),
        producer_id: ours.producer_id,
        producer_epoch: ours.producer_epoch,
        txn_start_ms: ours.start_time_ms,
        checkpoint_id: 7,
        probe: Some(Probe {
            topic: name.to_owned(),
            partition: 0,
            offset: 0,
        }),
    };
    (wire, zombie, c)
}

/// Begins a transaction and writes one record to `topic` (blocking).
fn write_one(p: &Zombie, topic: String) {
    p.begin_transaction().expect("begin");
    p.send(BaseRecord::<(), str>::to(&topic).payload("x"))
        .map_err(|(e, _)| e)
        .expect("send");
    p.flush(Duration::from_secs(30)).expect("flush");
}

/// The zombie commits what it has open and begins its next transaction, writing one record
/// (blocking).
fn commit_and_begin_next(z: &Zombie, topic: String) {
    z.commit_transaction(Duration::from_secs(30)).expect("zombie commit");
    // A later start time (the coordinator's clock, in ms) tells the next one apart.
    std::thread::sleep(Duration::from_millis(20));
    write_one(z, topic);
}

/// Waits until the id shows an Ongoing transaction (other than one started at `not`).
async fn ongoing(wire: &Wire, id: &str, not: Option<i64>) -> TxnDescription {
    for _ in 0..200 {
        if let Some(d) = wire.describe_known(id).await.expect("describe") {
            if d.state == "Ongoing" && Some(d.start_time_ms) != not {
                return d;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} shows no new Ongoing transaction");
}

fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("wiring-{what}-{nanos}")
}

/// The wire client, with something done before each EndTxn or its answer replaced.
struct Between<'a> {
    wire: &'a Wire,
    end_txns: AtomicU32,
    /// Run (blocking) before the first EndTxn goes out.
    before_end_txn: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// The first EndTxn is sent, but its answer is lost.
    lose_first_answer: bool,
    /// Run after the first EndTxn was applied, before its answer comes back.
    after_first_end_txn: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Coordinator for Between<'_> {
    async fn describe_known(&self, id: &str) -> Result<Option<TxnDescription>> {
        self.wire.describe_known(id).await
    }

    async fn end_txn_commit(&self, id: &str, producer_id: i64, epoch: i16) -> Result<i16> {
        let first = self.end_txns.fetch_add(1, Ordering::SeqCst) == 0;
        let before = self.before_end_txn.lock().unwrap().take();
        if let Some(before) = before {
            tokio::task::spawn_blocking(before).await.unwrap();
        }
        let answer = self.wire.end_txn(id, producer_id, epoch, true).await?;
        let after = self.after_first_end_txn.lock().unwrap().take();
        if let Some(after) = after {
            tokio::task::spawn_blocking(after).await.unwrap();
        }
        if first && self.lose_first_answer {
            return Err(SinkError::Protocol(format!(
                "the answer (error code {answer}) was lost"
            )));
        }
        Ok(answer)
    }

    fn cluster(&self) -> &Cluster {
        self.wire.cluster()
    }
}

/// The commit sends one EndTxn, never a second, and stops naming the zombie and the checkpoint
/// (`what` says why it must).
async fn stops_after_one_end_txn(between: &Between<'_>, c: &KafkaCommittable, what: &str) {
    let outcome = commit_recovered(between, c, None, &mut Default::default()).await;
    assert_eq!(between.end_txns.load(Ordering::SeqCst), 1, "one EndTxn, never a second");
    match outcome {
        Err(CommitError::Fatal(why)) => {
            let why = why.to_string();
            assert!(why.contains("zombie") && why.contains("checkpoint 7"), "{why}");
        }
        other => panic!("{what}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_txn_that_committed_the_zombies_next_transaction_is_fatal() {
    let name = unique("zombie");
    let (wire, zombie, c) = open_transaction(&name).await;
    // Between the description that shows ours Ongoing and our EndTxn, the zombie commits ours
    // itself and opens its next transaction under the same producer id and epoch: our EndTxn
    // then commits *that* one, and answers success.
    let z = zombie.clone();
    let topic = name.clone();
    let between = Between {
        wire: &wire,
        end_txns: AtomicU32::new(0),
        before_end_txn: Mutex::new(Some(Box::new(move || commit_and_begin_next(&z, topic)))),
        lose_first_answer: false,
        after_first_end_txn: Mutex::new(None),
    };
    stops_after_one_end_txn(
        &between,
        &c,
        "an EndTxn that ended another transaction must stop the job",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_txn_whose_answer_was_lost_is_described_not_sent_again() {
    let name = unique("lost");
    let (wire, _zombie, c) = open_transaction(&name).await;
    let between = Between {
        wire: &wire,
        end_txns: AtomicU32::new(0),
        before_end_txn: Mutex::new(None),
        lose_first_answer: true,
        after_first_end_txn: Mutex::new(None),
    };
    commit_recovered(&between, &c, None, &mut Default::default())
        .await
        .expect("the description shows ours committed");
    assert_eq!(
        between.end_txns.load(Ordering::SeqCst),
        1,
        "an EndTxn whose answer was lost was applied: the description says so, no second one goes out"
    );
    let now = wire.describe_known(&name).await.unwrap().expect("known");
    assert!(
        c.is_same_transaction(now.producer_id, now.producer_epoch, now.start_time_ms)
            && matches!(now.state.as_str(), "PrepareCommit" | "CompleteCommit"),
        "{now:?}"
    );
}

/// The simulation's seed 829 583 on the real broker: our EndTxn commits the zombie's next
/// transaction and its answer is lost; the zombie then begins another, which the coordinator
/// aborts on timeout, bumping the epoch. The description after the EndTxn in doubt shows a later
/// transaction of our producer id under another epoch: that EndTxn may have committed a
/// zombie's transaction, so the recovery stops — it must not ask the probe, which finds ours
/// committed (by the zombie) and would report success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_txn_in_doubt_then_a_zombie_transaction_timed_out_is_fatal() {
    let name = unique("zombie-timeout");
    let (wire, zombie, c) = open_transaction_timing_out(&name, 1_000).await;
    let (z, topic) = (zombie.clone(), name.clone());
    let (z2, topic2, id, epoch) = (zombie.clone(), name.clone(), name.clone(), c.producer_epoch);
    let describer = Wire::new(wire.cluster().clone(), Duration::from_secs(10));
    let handle = tokio::runtime::Handle::current();
    let between = Between {
        wire: &wire,
        end_txns: AtomicU32::new(0),
        before_end_txn: Mutex::new(Some(Box::new(move || commit_and_begin_next(&z, topic)))),
        lose_first_answer: true,
        after_first_end_txn: Mutex::new(Some(Box::new(move || {
            // Our EndTxn committed the zombie's second transaction; the zombie (which believes it
            // still open) commits it too, begins a third, and lets it time out.
            commit_and_begin_next(&z2, topic2);
            for _ in 0..300 {
                let d = handle.block_on(describer.describe_known(&id)).expect("describe");
                if d.is_some_and(|d| d.producer_epoch != epoch && d.state.contains("Abort")) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            panic!("the zombie's third transaction did not time out within 30 s");
        }))),
    };
    stops_after_one_end_txn(
        &between,
        &c,
        "an EndTxn in doubt followed by a zombie's later transaction must stop the job",
    )
    .await;
}
