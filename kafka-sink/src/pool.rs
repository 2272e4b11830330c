//! The producers of one subtask: one per transactional id of its pool, each with a delivery
//! tracker, and the state of the transaction it holds.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exactly_kafka_client::outage::{BrokerLog, ClientKind};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message};

use crate::error::{Result, SinkError};
use crate::partitioner::Partitioner;
use crate::ProducerRecord;

/// What the delivery callbacks of one producer saw since the last reset. The callback runs once
/// per record on the producer's polling thread: it takes no lock and allocates nothing unless a
/// delivery failed.
#[derive(Debug, Default)]
pub(crate) struct Deliveries {
    first_error: Mutex<Option<String>>,
    failed: AtomicBool,
    /// A delivered record of the current transaction (its first): the recovery probe.
    probe_set: AtomicBool,
    probe_partition: AtomicI32,
    probe_offset: AtomicI64,
}

impl Deliveries {
    /// Forgets what was seen (a new transaction starts; the previous one's records were all
    /// delivered before its pre-commit returned).
    pub(crate) fn reset(&self) {
        *self.first_error.lock().expect("not poisoned") = None;
        self.failed.store(false, Ordering::Release);
        self.probe_set.store(false, Ordering::Release);
    }

    /// (partition, offset) of a delivered record since the reset.
    pub(crate) fn probe(&self) -> Option<(i32, i64)> {
        self.probe_set.load(Ordering::Acquire).then(|| {
            (
                self.probe_partition.load(Ordering::Relaxed),
                self.probe_offset.load(Ordering::Relaxed),
            )
        })
    }

    /// The first delivery error since the reset.
    pub(crate) fn first_error(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.first_error.lock().expect("not poisoned").clone()
    }
}

/// Collects delivery reports (runs on the producer's polling thread).
pub(crate) struct SinkContext {
    pub(crate) deliveries: Arc<Deliveries>,
}

const BROKER_LOG: BrokerLog = BrokerLog::new(ClientKind::Sink);

impl ClientContext for SinkContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        BROKER_LOG.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        BROKER_LOG.error(&error, reason);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        BROKER_LOG.statistics(statistics);
    }
}

impl ProducerContext for SinkContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let d = &self.deliveries;
        match result {
            Ok(m) => {
                // One writer (this thread); the flag publishes the pair.
                if !d.probe_set.load(Ordering::Relaxed) {
                    d.probe_partition.store(m.partition(), Ordering::Relaxed);
                    d.probe_offset.store(m.offset(), Ordering::Relaxed);
                    d.probe_set.store(true, Ordering::Release);
                }
            }
            Err((e, m)) => {
                d.first_error
                    .lock()
                    .expect("not poisoned")
                    .get_or_insert_with(|| format!("{}/{}: {e}", m.topic(), m.partition()));
                d.failed.store(true, Ordering::Release);
            }
        }
    }
}

pub(crate) type Producer_ = ThreadedProducer<SinkContext>;

pub(crate) const QUEUE_CAP_KEY: &str = "queue.buffering.max.messages";
/// The default queue's floor: what a subtask writing up to 100 partitions gets.
const DEFAULT_QUEUE_CAP: usize = 20_000;
/// Records the default queue holds per partition of the output, for the job: each subtask's
/// producer queues this for its share of the partitions ([`queue_partitions`]), beyond the floor.
/// librdkafka batches per partition out of the records queued, and the broker's cost is per
/// batch: a queue of 20 000 spread over 600 partitions gave batches of about 30 records, and the
/// broker spent 12–16 µs of CPU per record against the plain loop's 5–6 (the job ran at
/// 0.36–0.5 × the loop); with 200 per partition (120 000) the broker spent 6–8 µs and the job ran
/// at 0.78 × (3 rounds; one-round probes: 100 000, 1.09 ×; 200 000, 0.95 ×) (`exactly bench
/// partitions`, 600 partitions, 3 M × 100 B, 2026-12-06). It is the job's: where every subtask
/// writes every partition, each subtask's producer queues its share ([`queue_partitions`]).
const QUEUE_PER_PARTITION: usize = 200;
/// The default queue's ceiling (reached at 2 500 partitions). Memory is bounded in bytes too:
/// [`QUEUE_KBYTES`].
const MAX_DEFAULT_QUEUE_CAP: usize = 500_000;
pub(crate) const QUEUE_KBYTES_KEY: &str = "queue.buffering.max.kbytes";
/// The payload bytes a producer queues at most, unless the job sets it (librdkafka's default is
/// 1 GiB): with large records the count alone would let a queue of hundreds of thousands of
/// records take that much. 128 MiB is 20 000 records of 6.5 KiB: the default count's queues of
/// smaller records are not cut by it. (A job's `message.max.bytes` beyond it is refused by
/// `KafkaSinkConfig::validate`: such a record would never fit.)
pub(crate) const QUEUE_KBYTES: usize = 128 * 1024;

const SOCKET_TIMEOUT_KEY: &str = "socket.timeout.ms";

/// How long a transactional producer waits for the answer to one request (librdkafka's
/// `socket.timeout.ms`, ours unless the job sets it), and the sink's own protocol client too
/// (DescribeTransactions at pre-commit, EndTxn after a restart): a quarter of the transaction
/// timeout, at most 10 s — past the cluster's broker session (`broker.session.timeout.ms`, 9 s by
/// default), after which a node that does not answer has been fenced and its partitions and
/// coordinators have moved, so waiting longer only waits for a node that no longer leads.
///
/// librdkafka's own default for a transactional producer is the transaction timeout less 100 ms,
/// which loses data when the coordinator's node stalls (its connection open and silent: a
/// network partition, a long pause): the cluster fences the node and another takes over the
/// transaction log within seconds, but the EndTxn sent to the silent node is given up only after
/// about the transaction timeout — and by then the new coordinator has aborted the transaction
/// for having timed out, a transaction whose checkpoint had completed (seen on the three-node
/// cluster with the coordinator's node SIGSTOPped, in one run of three: "DATA LOST … aborted by
/// the external system").
///
/// The Java client's 30 s was tried first and kept the loss away, but not the stall: each pooled
/// producer learns of the move only from a request of its own timing out, and librdkafka then
/// asks for the new coordinator at any connected node — the silent one too, whose connection is
/// still open — so a producer paid two or three timeouts in a row (AddPartitionsToTxn, then
/// FindCoordinator; seen with `debug=eos,broker`), 60–90 s in which no checkpoint completed and
/// the attempt restarted (kafka_cluster_failover's stalled-coordinator test). With 10 s the job
/// went on within 10–20 s. Produce requests are given up the same way and sent again
/// (idempotent): a request a healthy cluster leaves unanswered for 10 s is rare, and costs a
/// reconnect.
pub(crate) fn request_timeout(transaction_timeout: Duration) -> Duration {
    (transaction_timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(10))
}

/// How many records a producer of this `client` setting queues at most (librdkafka's
/// `queue.buffering.max.messages`), writing to `partitions` partitions: the job's setting
/// (checked by `KafkaSinkConfig::validate` to be a plain count librdkafka reads the same), else
/// [`QUEUE_PER_PARTITION`] per partition within [`DEFAULT_QUEUE_CAP`] and
/// [`MAX_DEFAULT_QUEUE_CAP`].
pub(crate) fn queue_cap(client: &std::collections::BTreeMap<String, String>, partitions: usize) -> usize {
    client
        .get(QUEUE_CAP_KEY)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| (QUEUE_PER_PARTITION * partitions).clamp(DEFAULT_QUEUE_CAP, MAX_DEFAULT_QUEUE_CAP))
}

/// How many partitions' worth of queue ([`queue_cap`]) one subtask's producer gets: those it
/// writes (`written`, its partitioner's answer), but at most its share of the output's
/// `partitions` among the job's `parallelism` subtasks — where every subtask writes every
/// partition, the job's producers together queue [`QUEUE_PER_PARTITION`] per partition (more where
/// the floor of [`DEFAULT_QUEUE_CAP`] applies; and each producer of the exactly-once pool has such a
/// queue, with as many records held while one flushes). It assumes the records spread over the
/// subtasks: a job whose records reach few of its subtasks (skewed keys) sets
/// `queue.buffering.max.messages` itself. Measured with `exactly bench partitions` (600
/// partitions, parallelism 2, 3 M × 100 B, 1 s checkpoints, 3 rounds each, 2026-12-07): each
/// producer queueing 120 000 (all 600 partitions' worth) peaked at 696–749 MB (median 1.26 × the
/// plain loop) with checkpoints of p50 835 ms; queueing its share (60 000) at 619–719 MB (median
/// 1.16 ×), p50 456 ms, at the same rate (0.87 × the loop, medians, both).
pub(crate) fn queue_partitions(written: usize, partitions: usize, parallelism: u32) -> usize {
    written.min(partitions.div_ceil(parallelism.max(1) as usize))
}

/// Creates a producer (transactional when `transactional_id` is given) whose queue takes
/// `queue` records ([`queue_cap`]).
pub(crate) fn create_producer(
    cluster: &exactly_kafka_client::Cluster,
    client: &std::collections::BTreeMap<String, String>,
    queue: usize,
    transactional: Option<(&str, Duration)>,
) -> Result<(Producer_, Arc<Deliveries>)> {
    let mut c = cluster.client_config().map_err(SinkError::Config)?;
    c.set("linger.ms", "5");
    // Every checkpoint flushes the producer (pre-commit, or at-least-once's barrier flush) and the
    // records after the barrier wait meanwhile (at-least-once on the task; exactly-once held in
    // memory, up to this many): on few partitions a shorter queue than librdkafka's 100 000
    // messages keeps that wait short (measured with `exactly bench k2k`, 6 partitions, 4 M × 100 B,
    // exactly-once against the plain loop,
    // when exactly-once flushed on the task: 0.45 × with 100 000, 0.93 × with 20 000; 10 000 and
    // 5 000 stalled on a full queue instead). With the hold, 60 000 and 100 000 measured no
    // differently from 20 000 at 100 ms (docs/benchmarks.md, 2026-12-03).
    // The cap trades the flush against waits for room (measured before the hold): at 1 s
    // checkpoints, where flushes are rare, 40 000 wrote faster in four alternating pairs of five
    // (8 M: 891 / 780 / 633 k records/s against 568 / 567 / 797 k), at 100 ms slower in three of
    // three (597 / 713 / 587 k against 703 / 801 / 697 k; docs/benchmarks.md, 2026-12-03):
    // `client` sets it per job. Per partition of the output it is [`QUEUE_PER_PARTITION`].
    c.set(QUEUE_CAP_KEY, queue.to_string());
    c.set(QUEUE_KBYTES_KEY, QUEUE_KBYTES.to_string());
    // The end of a broker outage for the log (statistics are parsed only during one).
    c.set(
        "statistics.interval.ms",
        exactly_kafka_client::outage::STATISTICS_INTERVAL_MS,
    );
    for (k, v) in client {
        c.set(k, v);
    }
    match transactional {
        Some((id, timeout)) => {
            c.set("transactional.id", id)
                .set("transaction.timeout.ms", timeout.as_millis().to_string());
            if !client.contains_key(SOCKET_TIMEOUT_KEY) {
                c.set(SOCKET_TIMEOUT_KEY, request_timeout(timeout).as_millis().to_string());
            }
        }
        None => {
            c.set("enable.idempotence", "true");
        }
    }
    let deliveries = Arc::new(Deliveries::default());
    let producer = c
        .create_with_context(SinkContext {
            deliveries: deliveries.clone(),
        })
        .map_err(|e| SinkError::kafka("creating a producer", e))?;
    Ok((producer, deliveries))
}

/// Sends `records` to `topic`, waiting (not failing) while librdkafka's queue is full; returns the
/// time spent waiting for room.
pub(crate) async fn send_all(
    producer: &Producer_,
    topic: &str,
    partitions: &[i32],
    partitioner: &dyn Partitioner,
    records: Vec<ProducerRecord>,
) -> Result<Duration> {
    let mut waited = Duration::ZERO;
    for r in records {
        let partition = partitioner.partition(r.key.as_deref(), r.value.as_deref(), topic, partitions);
        let headers = (!r.headers.is_empty()).then(|| {
            r.headers
                .iter()
                .fold(OwnedHeaders::new_with_capacity(r.headers.len()), |h, (k, v)| {
                    h.insert(Header {
                        key: k,
                        value: v.as_deref(),
                    })
                })
        });
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).partition(partition);
        if let Some(k) = &r.key {
            record = record.key(k.as_slice());
        }
        if let Some(v) = &r.value {
            record = record.payload(v.as_slice());
        }
        if let Some(ts) = r.timestamp {
            record = record.timestamp(ts);
        }
        if let Some(h) = headers {
            record = record.headers(h);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // Space frees as batches are acknowledged, within a fraction of a millisecond
                    // at high rates: a timer (1 ms resolution) would idle the pipeline longer.
                    record = back;
                    let started = std::time::Instant::now();
                    tokio::task::block_in_place(|| std::thread::sleep(Duration::from_micros(200)));
                    waited += started.elapsed();
                }
                Err((e, _)) => return Err(SinkError::kafka(format!("producing to {topic}"), e)),
            }
        }
    }
    Ok(waited)
}

/// Fails if a record was reported undelivered since the last reset.
pub(crate) fn check_deliveries(deliveries: &Deliveries, topic: &str) -> Result<()> {
    match deliveries.first_error() {
        Some(reason) => Err(SinkError::Delivery {
            topic: topic.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Waits for every outstanding record; fails if any was not delivered.
pub(crate) fn flush(producer: &Producer_, deliveries: &Deliveries, topic: &str, timeout: Duration) -> Result<()> {
    tokio::task::block_in_place(|| flush_blocking(producer, deliveries, topic, timeout))
}

/// [`flush`] on a thread that may block (no async worker).
pub(crate) fn flush_blocking(
    producer: &Producer_,
    deliveries: &Deliveries,
    topic: &str,
    timeout: Duration,
) -> Result<()> {
    wait_delivered(producer, timeout)?;
    check_deliveries(deliveries, topic)
}

/// Whether every record sent through `producer` has its delivery report handled.
pub(crate) fn all_delivered(producer: &Producer_) -> bool {
    producer.in_flight_count() == 0
}

/// Waits until every record sent through `producer` has its delivery report handled (whether
/// delivered or not: the caller that owns those records checks that).
pub(crate) fn wait_all_delivered(producer: &Producer_, timeout: Duration) -> Result<()> {
    tokio::task::block_in_place(|| wait_delivered(producer, timeout))
}

/// Sends what is queued at once (linger ignored) and waits until the delivery report of every
/// record has been handled.
///
/// Not rdkafka's `flush`: on a `ThreadedProducer` it alternates a non-blocking librdkafka flush
/// with its own 100 ms poll of the event queue, whose reports the producer's polling thread takes
/// first, so every flush lasted at least 100 ms however fast the broker acknowledged (measured:
/// 100 ms at every checkpoint of `exactly bench k2k`, against 1-5 ms for what follows). In
/// rdkafka's event mode, librdkafka's flush waits on a condition that the polling thread signals
/// when it has handled the last report, so it returns as soon as the records are acknowledged.
#[allow(unsafe_code)]
fn wait_delivered(producer: &Producer_, timeout: Duration) -> Result<()> {
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: a live producer handle (borrowed for the call); rd_kafka_flush only wakes the
    // client's broker threads and waits on the client's message counter.
    let err = unsafe { rdkafka::bindings::rd_kafka_flush(producer.client().native_ptr(), ms) };
    match RDKafkaErrorCode::from(err) {
        RDKafkaErrorCode::NoError => Ok(()),
        code => Err(SinkError::kafka(
            format!("flushing ({} records still undelivered)", producer.in_flight_count()),
            KafkaError::Flush(code),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_queue_grows_with_the_outputs_partitions_between_its_floor_and_ceiling() {
        let none = std::collections::BTreeMap::new();
        assert_eq!(queue_cap(&none, 0), DEFAULT_QUEUE_CAP);
        assert_eq!(queue_cap(&none, 6), DEFAULT_QUEUE_CAP);
        assert_eq!(queue_cap(&none, 100), DEFAULT_QUEUE_CAP);
        assert_eq!(queue_cap(&none, 600), 600 * QUEUE_PER_PARTITION);
        assert_eq!(queue_cap(&none, 100_000), MAX_DEFAULT_QUEUE_CAP);
        // The job's own setting wins, whatever the partitions.
        let set = std::collections::BTreeMap::from([(QUEUE_CAP_KEY.to_owned(), " 7000 ".to_owned())]);
        assert_eq!(queue_cap(&set, 600), 7_000);
        assert_eq!(queue_cap(&set, 1), 7_000);
    }

    #[test]
    fn every_subtask_writing_every_partition_queues_its_share_and_one_writing_few_what_it_writes() {
        // Key hash or round robin: every subtask writes all 600.
        assert_eq!(queue_partitions(600, 600, 1), 600);
        assert_eq!(queue_partitions(600, 600, 2), 300);
        assert_eq!(queue_partitions(600, 600, 7), 86);
        assert_eq!(
            queue_cap(&std::collections::BTreeMap::new(), queue_partitions(600, 600, 2)),
            60_000
        );
        // Fixed: one partition per subtask.
        assert_eq!(queue_partitions(1, 600, 2), 1);
        // More subtasks than partitions, and no partitions yet.
        assert_eq!(queue_partitions(6, 6, 12), 1);
        assert_eq!(queue_partitions(0, 0, 2), 0);
        assert_eq!(queue_partitions(6, 6, 0), 6);
    }
}
