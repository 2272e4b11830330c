//! The source itself: assigns its partitions, polls, snapshots offsets, commits them to the group
//! once a checkpoint completes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use exactly_core::runtime::{InitContext, SnapshotContext, Source, SourceStatus, SourceWatermark, SubtaskInfo};
use exactly_core::CheckpointId;
use exactly_kafka_client::outage::{BrokerLog, ClientKind};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::message::Message;

use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tracing::{debug, error, info, warn};

use crate::assignment::subtask_for;
use crate::config::{
    BeyondEnd, IsolationLevel, KafkaSourceConfig, OffsetCommitMode, PoisonPolicy, ResetPosition, StartPosition,
};
use crate::dead_letters::DeadLetters;
use crate::deser::{Deserializer, KafkaRecord};
use crate::error::{Result, SourceError};
use crate::fetch::{Batch, FetchQueue};
use crate::metrics::KafkaSourceMetrics;
use crate::offsets::{resume, OffsetEntry, PendingOffsets, Resume, TopicPartition};
use crate::watermarks::{combine, PartitionClock};

mod client;
mod group_commit;
mod operator;
mod start;
use client::consumer_config;
pub use client::SourceContext;
#[cfg(test)]
use client::CLIENT_DEFAULTS;
use start::{wire_error, Origin};

const STATE: &str = "kafka-source-offsets";
const TIMEOUT: Duration = Duration::from_secs(30);
const IDLE_WAIT: Duration = Duration::from_millis(20);

/// The next offset of one owned partition.
struct Position {
    tp: TopicPartition,
    topic: Arc<str>,
    next: i64,
    clock: PartitionClock,
}

/// A Kafka source subtask: reads the partitions the assignment rule gives it, from the offsets
/// of the restored checkpoint (or the configured start position), and hands on records turned
/// into `T` by `D`.
///
/// ```no_run
/// use exactly_core::runtime::{JobBuilder, JobConfig};
/// use exactly_kafka_source::{KafkaRecord, KafkaSource, KafkaSourceConfig, RawBytes, StartPosition};
///
/// let mut config = KafkaSourceConfig::new("127.0.0.1:19092", vec!["orders".into()], "orders-job");
/// config.start = StartPosition::Earliest; // where partitions without restored offsets begin
/// let mut job = JobBuilder::new(JobConfig::new("orders-job"));
/// // Two subtasks share the partitions; offsets go into every checkpoint and are committed to
/// // the group only after the checkpoint completes.
/// let orders = job.source("orders", 2, move |_| KafkaSource::new(config.clone(), RawBytes));
/// let values = orders.map(|r: KafkaRecord| r.value.unwrap_or_default());
/// # let _ = values;
/// ```
pub struct KafkaSource<T, D> {
    config: KafkaSourceConfig,
    deserializer: D,
    metrics: Arc<KafkaSourceMetrics>,
    info: Option<SubtaskInfo>,
    // Dropped in this order: the messages of the last batch, the queue they came from, then the
    // consumer that queue belongs to.
    batch: Batch,
    fetch: Option<FetchQueue>,
    consumer: Option<BaseConsumer<SourceContext>>,
    dead_letters: Option<DeadLetters>,
    pattern: Option<regex::Regex>,
    /// Next offset to read, per partition this subtask owns (a short list: searched per record
    /// without allocating).
    positions: Vec<Position>,
    /// Every partition seen (any owner), for discovery.
    known: BTreeSet<TopicPartition>,
    /// Restored offsets of partitions this subtask owns that the broker did not list at restore
    /// (a topic whose metadata showed an error for a moment, a partition deleted): carried into
    /// every checkpoint, and taken up when discovery sees the partition again — never replaced by
    /// its earliest offset, which would read the whole topic again into the sinks.
    unseen: BTreeMap<TopicPartition, OffsetEntry>,
    /// The IDs of the topics read (recorded with their offsets in checkpoints), and the kept
    /// connection that asks for them.
    topic_ids: BTreeMap<String, String>,
    ids: exactly_kafka_client::wire::TopicIds,
    cluster: exactly_kafka_client::Cluster,
    pending: PendingOffsets,
    /// Offsets of completed checkpoints (or periodic commits) waiting for the commit on its way.
    deferred_commit: BTreeMap<TopicPartition, i64>,
    next_discovery: Option<Instant>,
    next_periodic_commit: Option<Instant>,
    /// Without checkpointing, when the topics' IDs are checked next (`ID_CHECK_EVERY`).
    next_id_check: Option<Instant>,
    /// `available` waited (for records, or its bound) since the last poll: the poll takes what
    /// there is without waiting again.
    waited: bool,
    /// Nothing was restored and the start position may be the end of a log as it is now: read
    /// only once a checkpoint has recorded it (`reads_after_first_checkpoint`).
    start_is_a_moment: bool,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T: Send + 'static, D: Deserializer<T>> KafkaSource<T, D> {
    /// A source subtask with `config`, turning records into `T` with `deserializer`.
    pub fn new(config: KafkaSourceConfig, deserializer: D) -> Self {
        let cluster = exactly_kafka_client::Cluster::new(config.bootstrap_servers.clone(), config.security.clone());
        KafkaSource {
            config,
            deserializer,
            metrics: Arc::default(),
            info: None,
            batch: Batch::default(),
            fetch: None,
            consumer: None,
            dead_letters: None,
            pattern: None,
            positions: Vec::new(),
            known: BTreeSet::new(),
            unseen: BTreeMap::new(),
            topic_ids: BTreeMap::new(),
            ids: Default::default(),
            cluster,
            pending: PendingOffsets::default(),
            deferred_commit: BTreeMap::new(),
            next_discovery: None,
            next_periodic_commit: None,
            next_id_check: None,
            waited: false,
            start_is_a_moment: false,
            _t: std::marker::PhantomData,
        }
    }

    /// This subtask's counters.
    pub fn metrics(&self) -> Arc<KafkaSourceMetrics> {
        self.metrics.clone()
    }

    fn consumer(&self) -> &BaseConsumer<SourceContext> {
        self.consumer.as_ref().expect("initialized")
    }

    fn create_consumer(&self) -> Result<BaseConsumer<SourceContext>> {
        consumer_config(&self.config)?
            .create_with_context(SourceContext {
                metrics: self.metrics.clone(),
                committing: AtomicBool::new(false),
            })
            .map_err(|e| SourceError::kafka("creating the consumer", e))
    }

    fn owns(&self, tp: &TopicPartition) -> bool {
        let info = self.info.as_ref().expect("initialized");
        subtask_for(&tp.topic, tp.partition, info.parallelism) == info.index
    }

    /// Takes ownership of `new` partitions at the given offsets: routes their records to the
    /// source's fetch queue, then adds them to the consumer's assignment (incrementally: the
    /// partitions already read keep fetching, and keep their routing).
    fn assign(&mut self, new: BTreeMap<TopicPartition, i64>) -> Result<()> {
        if new.is_empty() {
            return Ok(());
        }
        let fetch = self.fetch.as_ref().expect("initialized");
        let mut tpl = TopicPartitionList::new();
        for (tp, offset) in &new {
            info!(topic = %tp.topic, partition = tp.partition, offset, "Reading partition.");
            fetch.route(&tp.topic, tp.partition).map_err(SourceError::Routing)?;
            tpl.add_partition_offset(&tp.topic, tp.partition, Offset::Offset(*offset))
                .map_err(|e| SourceError::kafka("building the assignment", e))?;
        }
        self.consumer()
            .incremental_assign(&tpl)
            .map_err(|e| SourceError::kafka("assigning partitions", e))?;
        for (tp, next) in new {
            let topic: Arc<str> = Arc::from(tp.topic.as_str());
            self.positions.push(Position {
                tp,
                topic,
                next,
                clock: PartitionClock::new(Instant::now()),
            });
        }
        let positions = self.position_map();
        self.metrics.with_partitions(|parts| {
            for (tp, o) in positions {
                parts.entry(tp).or_default().position = o;
            }
        });
        Ok(())
    }

    fn position_map(&self) -> BTreeMap<TopicPartition, i64> {
        self.positions.iter().map(|p| (p.tp.clone(), p.next)).collect()
    }

    async fn discover(&mut self) -> Result<()> {
        let all = tokio::task::block_in_place(|| self.list_partitions())?;
        let fresh: Vec<_> = all.difference(&self.known).cloned().collect();
        self.learn_topic_ids(fresh.iter().map(|tp| tp.topic.as_str()).collect())
            .await?;
        self.known.extend(fresh.iter().cloned());
        let mut new = BTreeMap::new();
        let owned: Vec<_> = fresh.into_iter().filter(|tp| self.owns(tp)).collect();
        for tp in owned {
            let offset = match self.unseen.get(&tp) {
                // Back after an error at restore: where the checkpoint left it.
                Some(e) => tokio::task::block_in_place(|| {
                    self.position(&tp, e.next_offset, Origin::Restored(e.topic_id.as_deref()))
                })?,
                // Partitions that appear while the job runs are read from their beginning.
                None => tokio::task::block_in_place(|| self.watermarks(&tp))?.0,
            };
            self.unseen.remove(&tp);
            new.insert(tp, offset);
        }
        if !new.is_empty() {
            info!(partitions = new.len(), "Discovered new partitions.");
        }
        self.assign(new)
    }

    fn poison(&mut self, record: KafkaRecord, reason: String) -> Result<()> {
        match &self.config.on_deserialization_error {
            PoisonPolicy::Fail => Err(SourceError::Poison {
                topic: record.topic.to_string(),
                partition: record.partition,
                offset: record.offset,
                reason,
            }),
            PoisonPolicy::Skip => {
                self.metrics.skipped.fetch_add(1, Ordering::Relaxed);
                warn!(topic = %record.topic, partition = record.partition, offset = record.offset, %reason, "Skipping a record that does not deserialize.");
                Ok(())
            }
            PoisonPolicy::DeadLetter { topic } => {
                let dead_letters = self.dead_letters.as_ref().expect("created with the policy");
                dead_letters.send(topic, &record, &reason)?;
                self.metrics.dead_lettered.fetch_add(1, Ordering::Relaxed);
                warn!(topic = %record.topic, partition = record.partition, offset = record.offset, %reason, "Sent a record that does not deserialize to the dead-letter topic.");
                Ok(())
            }
        }
    }

    async fn init(&mut self, ctx: &InitContext<'_>) -> Result<()> {
        self.config.validate()?;
        self.info = Some(ctx.info.clone());
        self.pattern = self
            .config
            .topic_pattern
            .as_deref()
            .map(regex::Regex::new)
            .transpose()
            .map_err(|e| SourceError::Config(e.to_string()))?;
        let consumer = self.create_consumer()?;
        self.fetch = Some(FetchQueue::new(&consumer));
        self.consumer = Some(consumer);
        if let PoisonPolicy::DeadLetter { .. } = self.config.on_deserialization_error {
            self.dead_letters = Some(DeadLetters::new(&self.config.bootstrap_servers, &self.config.security)?);
        }
        let mut restored = BTreeMap::new();
        for entry in ctx.union_state(STATE) {
            let e = OffsetEntry::decode(&entry)?;
            restored.insert(e.tp.clone(), e);
        }
        if ctx.info.starting {
            // While the job starts, a bootstrap list of which no address answers fails in
            // seconds, naming each address, and wrong credentials or an untrusted certificate
            // fail with what the broker or TLS said (librdkafka would wait out its metadata
            // timeout and report a "transport failure"); a running job's restart waits for the
            // broker as librdkafka does.
            let bootstrap = self.config.bootstrap_servers.clone();
            tokio::task::block_in_place(|| exactly_core::net::reachable(&bootstrap))
                .map_err(SourceError::Unreachable)?;
            let cluster = &self.cluster;
            exactly_kafka_client::wire::check(cluster, Duration::from_secs(30))
                .await
                .map_err(wire_error)?;
            for topic in &self.config.topics {
                let access = exactly_kafka_client::wire::topic_access(cluster, topic)
                    .await
                    .map_err(wire_error)?;
                if !access.allows(3) {
                    return Err(SourceError::Config(format!(
                        "the job's principal may not Read topic {topic:?} at {}: grant it Read and Describe on the topic and Read on the group {:?}",
                        cluster.bootstrap, self.config.group_id
                    )));
                }
            }
        }
        let all = tokio::task::block_in_place(|| self.list_partitions())?;
        self.learn_topic_ids(all.iter().map(|tp| tp.topic.as_str()).collect())
            .await?;
        let mut mine = BTreeMap::new();
        for tp in &all {
            if !self.owns(tp) {
                continue;
            }
            let offset = match restored.get(tp) {
                Some(e) => tokio::task::block_in_place(|| {
                    self.position(tp, e.next_offset, Origin::Restored(e.topic_id.as_deref()))
                })?,
                // Restored, but this partition is not in the checkpoint: it appeared later.
                None if ctx.is_restored() => tokio::task::block_in_place(|| self.watermarks(tp))?.0,
                None => tokio::task::block_in_place(|| self.start_offset(tp))?,
            };
            mine.insert(tp.clone(), offset);
        }
        self.unseen.clear();
        for (tp, e) in restored.into_iter().filter(|(tp, _)| !all.contains(tp)) {
            if self.owns(&tp) {
                warn!(topic = %tp.topic, partition = tp.partition, offset = e.next_offset, "A partition in the restored state is not listed now; keeping its offset until it is seen again.");
                self.unseen.insert(tp, e);
            }
        }
        self.known = all;
        self.start_is_a_moment = !ctx.is_restored() && self.config.start.may_resolve_to_the_end();
        if mine.is_empty() {
            info!(
                subtask = ctx.info.index,
                "No partition to read (idle until discovery finds one)."
            );
        }
        self.assign(mine)?;
        let now = Instant::now();
        self.next_discovery = self.config.discovery_interval.map(|d| now + d);
        if let OffsetCommitMode::Periodic { interval } = self.config.offset_commit {
            self.next_periodic_commit = Some(now + interval);
        }
        if ctx.info.commit_window.is_none() {
            self.next_id_check = Some(now + start::ID_CHECK_EVERY);
        }
        Ok(())
    }

    /// Serves the consumer's own queue (statistics, errors, logs, commit results) without
    /// waiting, then sends a deferred commit whose predecessor's result came. Records never
    /// arrive there: every owned partition is routed to the fetch queue before it is assigned.
    fn serve_consumer_queue(&mut self) -> Result<()> {
        let polled = self
            .consumer()
            .poll(Duration::ZERO)
            .map(|r| r.map(|m| (m.topic().to_owned(), m.partition())));
        self.send_deferred_commit();
        match polled {
            None => Ok(()),
            Some(Err(error)) => {
                if let Some(e) = error
                    .rdkafka_error_code()
                    .and_then(|c| crate::error::unretried(c, "the cluster".into()))
                {
                    return Err(e);
                }
                let connection = matches!(
                    error.rdkafka_error_code(),
                    Some(RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown)
                );
                if connection {
                    // A lost or failed connection: the outage log says it, with the broker's
                    // address, from librdkafka's own report of it (`BROKER_LOG`).
                    debug!(%error, "Consumer error (retried by the client).");
                } else {
                    warn!(%error, "Consumer error (retried by the client).");
                }
                Ok(())
            }
            // Its order relative to the fetch queue is unknown: restart from the checkpoint
            // rather than hand on records out of order.
            Some(Ok((topic, partition))) => Err(SourceError::Routing(format!(
                "a record of {topic}/{partition} arrived outside the source's fetch queue"
            ))),
        }
    }

    /// Appends up to `poll_batch` records: takes what the client has already fetched, in one
    /// call; if nothing is there, waits (asynchronously, briefly) for the fetch queue to fill.
    /// Returns `Backlog` if it took a whole batch (reading a backlog, whose fetches bring a batch
    /// or more at a time), else `CaughtUp` if it had to wait first (everything fetched was read
    /// and the next fetch brought only a little: caught up with the input), else `More`.
    async fn poll_batch(&mut self, out: &mut Vec<T>) -> Result<SourceStatus> {
        self.serve_consumer_queue()?;
        let limit = self.config.poll_batch;
        let dead_letters = matches!(self.config.on_deserialization_error, PoisonPolicy::DeadLetter { .. });
        let fail_fast = matches!(self.config.on_deserialization_error, PoisonPolicy::Fail);
        let clocks = self.config.watermarks.is_some().then(Instant::now);
        let mut rejected: Vec<(KafkaRecord, String)> = Vec::new();
        // An error librdkafka will not retry past: the attempt fails (never a silent stall).
        let mut failed = None;
        let mut batch = std::mem::take(&mut self.batch);
        let mut status = SourceStatus::More;
        {
            let fetch = self.fetch.as_ref().expect("initialized");
            let mut got = batch.fill(fetch, limit);
            if std::mem::take(&mut self.waited) {
                // `available` waited: what there is now is all there was (`Idle` when nothing).
                status = SourceStatus::CaughtUp;
            } else if got == 0 && tokio::time::timeout(IDLE_WAIT, fetch.readable()).await.is_ok() {
                got = batch.fill(fetch, limit);
                status = SourceStatus::CaughtUp;
            }
            if got == limit {
                status = SourceStatus::Backlog;
            }
            let positions = &mut self.positions;
            let mut hint = 0;
            let deserializer = &self.deserializer;
            for m in batch.iter() {
                if let Some(error) = m.error() {
                    if error == rdkafka::types::RDKafkaErrorCode::AutoOffsetReset
                        && position_of(positions, &m, &mut hint).is_some()
                    {
                        // librdkafka stopped fetching the partition (a seek would answer
                        // "erroneous state", and assigning it again races with the stop): the
                        // restart checks the restored offset against the log's range.
                        failed = Some(SourceError::OutOfRange {
                            what: format!("{}/{}", String::from_utf8_lossy(m.topic_bytes()), m.partition()),
                            offset: m.offset(),
                        });
                        break;
                    }
                    let what = format!("{}/{}", String::from_utf8_lossy(m.topic_bytes()), m.partition());
                    if let Some(e) = crate::error::unretried(error, what) {
                        failed = Some(e);
                        break;
                    }
                    warn!(
                        topic = %String::from_utf8_lossy(m.topic_bytes()),
                        partition = m.partition(),
                        %error,
                        "Fetch error (retried by the client)."
                    );
                    continue;
                }
                let Some(at) = position_of(positions, &m, &mut hint) else {
                    debug!(
                        topic = %String::from_utf8_lossy(m.topic_bytes()),
                        partition = m.partition(),
                        "Record of an unassigned partition ignored."
                    );
                    continue;
                };
                let pos = &mut positions[at];
                pos.next = m.offset() + 1;
                let timestamp = m.timestamp();
                if let Some(now) = clocks {
                    pos.clock.saw(timestamp, now);
                }
                let record = KafkaRecord {
                    topic: pos.topic.clone(),
                    partition: m.partition(),
                    offset: m.offset(),
                    timestamp,
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                    headers: m.headers(),
                };
                // Only the dead-letter policy needs the raw record after a failure: copy it only then.
                let keep = dead_letters.then(|| record.clone());
                let (partition, offset) = (record.partition, record.offset);
                match deserializer.deserialize(record) {
                    Ok(t) => out.push(t),
                    Err(e) => {
                        let raw = keep.unwrap_or_else(|| KafkaRecord {
                            topic: pos.topic.clone(),
                            partition,
                            offset,
                            timestamp: None,
                            key: None,
                            value: None,
                            headers: Vec::new(),
                        });
                        rejected.push((raw, e.to_string()));
                        if fail_fast {
                            break;
                        }
                    }
                }
            }
        }
        batch.clear();
        self.batch = batch;
        if let Some(e) = failed {
            return Err(e);
        }
        for (raw, reason) in rejected {
            self.poison(raw, reason)?;
        }
        self.metrics.records.fetch_add(out.len() as u64, Ordering::Relaxed);
        Ok(status)
    }
}

/// Where `m`'s partition is in `positions`, if it is owned. The fetch queue hands on a
/// partition's records in runs (a fetched batch at a time): `hint`, where the previous record's
/// partition was, is tried first, and a scan (without allocating) finds the others; a run's
/// first record pays for the scan, so hundreds of partitions cost about as little as a few.
fn position_of(positions: &[Position], m: &crate::fetch::RawMessage<'_>, hint: &mut usize) -> Option<usize> {
    find_position(positions, m.topic_bytes(), m.partition(), hint)
}

fn find_position(positions: &[Position], topic: &[u8], partition: i32, hint: &mut usize) -> Option<usize> {
    let is = |p: &Position| p.tp.partition == partition && p.topic.as_bytes() == topic;
    if positions.get(*hint).is_some_and(is) {
        return Some(*hint);
    }
    let at = positions.iter().position(is)?;
    *hint = at;
    Some(at)
}

#[cfg(test)]
mod tests;
