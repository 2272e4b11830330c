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

mod start;
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

/// Receives librdkafka's statistics and commit results.
pub struct SourceContext {
    pub(super) metrics: Arc<KafkaSourceMetrics>,
    /// An offset commit is on its way (its result not served yet). One at a time: a later
    /// commit never overtakes an earlier one, so the group's offsets never go back.
    pub(super) committing: AtomicBool,
}

const BROKER_LOG: BrokerLog = BrokerLog::new(ClientKind::Source);

impl ClientContext for SourceContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        BROKER_LOG.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        BROKER_LOG.error(&error, reason);
    }

    fn stats(&self, stats: Statistics) {
        BROKER_LOG.brokers(
            stats.time,
            stats
                .brokers
                .values()
                .map(|b| (b.nodename.as_str(), b.state.as_str(), b.stateage)),
        );
        self.metrics.with_partitions(|parts| {
            for (topic, t) in &stats.topics {
                for (p, ps) in &t.partitions {
                    let tp = TopicPartition {
                        topic: topic.clone(),
                        partition: *p,
                    };
                    if let Some(m) = parts.get_mut(&tp) {
                        m.lag = (ps.consumer_lag >= 0).then_some(ps.consumer_lag);
                    }
                }
            }
        });
    }
}

impl ConsumerContext for SourceContext {
    /// The result of `commit_to_group`'s commit, served on the source's task by
    /// `serve_consumer_queue`: counted, and the offsets the group now holds recorded.
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            Ok(()) => {
                self.metrics.commits_succeeded.fetch_add(1, Ordering::Relaxed);
                self.metrics.with_partitions(|parts| {
                    for e in offsets.elements() {
                        let (Ok(()), Offset::Offset(o)) = (e.error(), e.offset()) else {
                            continue;
                        };
                        let tp = TopicPartition {
                            topic: e.topic().to_owned(),
                            partition: e.partition(),
                        };
                        if let Some(m) = parts.get_mut(&tp) {
                            m.committed = Some(o);
                        }
                    }
                });
            }
            Err(error) => {
                self.metrics.commits_failed.fetch_add(1, Ordering::Relaxed);
                warn!(%error, "Committing offsets to the consumer group failed (monitoring only; the checkpoint holds the offsets).");
            }
        }
        self.committing.store(false, Ordering::Release);
    }
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

impl<T: Send + 'static, D: Deserializer<T>> Source<T> for KafkaSource<T, D> {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        Ok(self.init(ctx).await?)
    }

    /// A start at the end as it is now (`latest`, a `latest` reset, a timestamp past the last
    /// record) is checkpointed before the first record is read: a restart before the job's first
    /// checkpoint — a new process included — then restores it instead of resolving `latest`
    /// again, later, which would skip the records the failed run read and never committed.
    fn reads_after_first_checkpoint(&self) -> bool {
        self.start_is_a_moment
    }

    /// As the deserializer weighs its records (the payload bytes, for [`crate::RawBytes`]).
    fn record_size(record: &T) -> usize {
        D::record_size(record)
    }

    async fn poll_next(&mut self, out: &mut Vec<T>) -> exactly_core::Result<SourceStatus> {
        let now = Instant::now();
        if let (Some(at), Some(interval)) = (self.next_discovery, self.config.discovery_interval) {
            if now >= at {
                self.discover().await?;
                self.next_discovery = Some(now + interval);
            }
        }
        let commit_every = match self.config.offset_commit {
            OffsetCommitMode::Periodic { interval } => {
                self.next_periodic_commit.filter(|at| now >= *at).map(|_| interval)
            }
            _ => None,
        };
        // Without checkpoints no snapshot asks: a topic recreated under the job would be read on
        // from the old position (`check_topic_ids`). The attempt fails instead, and the next
        // starts where the start position says (the group's offsets went with the old topic).
        // Before a periodic commit too: positions of a recreated topic must not go to the group
        // as the old one's, so a commit whose check got no answer waits for the next turn's. One
        // check when both are due.
        let mut checked = false;
        if commit_every.is_some() || self.next_id_check.is_some_and(|at| now >= at) {
            checked = self.check_topic_ids(false).await?;
            if self.next_id_check.is_some() {
                self.next_id_check = Some(Instant::now() + start::ID_CHECK_EVERY);
            }
        }
        if let Some(interval) = commit_every {
            // Sent only right after the check it follows (a topic recreated since would be
            // committed as the old one's): while the last commit is on its way, the next turn
            // checks again.
            if checked && !self.commit_on_its_way() {
                let offsets = self.position_map();
                self.commit_to_group(&offsets);
                self.next_periodic_commit = Some(now + interval);
            } else {
                self.next_periodic_commit = Some(now + start::ID_CHECK_EVERY.min(interval));
            }
        }
        if self.positions.is_empty() {
            self.serve_consumer_queue()?;
            if !std::mem::take(&mut self.waited) {
                tokio::time::sleep(IDLE_WAIT).await;
            }
            return Ok(SourceStatus::Idle);
        }
        let status = self.poll_batch(out).await?;
        Ok(if out.is_empty() { SourceStatus::Idle } else { status })
    }

    /// Waits until librdkafka has queued fetched records, at most `IDLE_WAIT` (cancel-safe: a
    /// notification that came while nobody waited is kept for the next wait).
    async fn available(&mut self) {
        match &self.fetch {
            Some(fetch) if !self.positions.is_empty() => {
                let _ = tokio::time::timeout(IDLE_WAIT, fetch.readable()).await;
            }
            _ => tokio::time::sleep(IDLE_WAIT).await,
        }
        self.waited = true;
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        self.check_topic_ids(true).await?;
        ctx.put_union_state(
            STATE,
            self.positions
                .iter()
                .map(|p| OffsetEntry::encode(&p.tp, p.next, self.topic_ids.get(&p.tp.topic).map(String::as_str)))
                .chain(
                    self.unseen
                        .values()
                        .map(|e| OffsetEntry::encode(&e.tp, e.next_offset, e.topic_id.as_deref())),
                )
                .collect(),
        );
        let positions = self.position_map();
        self.pending.insert(ctx.checkpoint_id, positions.clone());
        self.metrics.with_partitions(|parts| {
            for (tp, o) in positions {
                parts.entry(tp).or_default().position = o;
            }
        });
        if let (Some(d), PoisonPolicy::DeadLetter { topic }) =
            (&self.dead_letters, &self.config.on_deserialization_error)
        {
            // Dead letters before this barrier must be durable before the checkpoint is.
            d.flush(topic, TIMEOUT)?;
        }
        Ok(())
    }

    fn watermark(&mut self) -> Option<SourceWatermark> {
        if self.positions.is_empty() {
            // No partition: idle (downstream does not wait for this subtask's watermark).
            return Some(SourceWatermark::Idle);
        }
        let config = self.config.watermarks.as_ref()?;
        let w = combine(config, Instant::now(), self.positions.iter().map(|p| &p.clock));
        if let Some(SourceWatermark::At(w)) = w {
            self.metrics.watermark.store(w.0, Ordering::Relaxed);
        }
        w
    }

    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> exactly_core::Result<()> {
        if let Some(offsets) = self.pending.complete(id) {
            if self.config.offset_commit == OffsetCommitMode::OnCheckpoints {
                self.commit_to_group(&offsets);
            }
        }
        Ok(())
    }
}

/// The group commit: needs nothing of the records' type (the source's `Drop` sends too).
impl<T, D> KafkaSource<T, D> {
    /// Commits `offsets` to the group, in the background: the commit's round trip to the group
    /// coordinator never holds the records and barriers behind it (a coordinator that stops
    /// answering would hold them for the whole request timeout, a minute: every checkpoint of
    /// the job timed out meanwhile). A commit still on its way defers this one, merged with any
    /// deferred before it, until its result is served (`send_deferred_commit`).
    pub(super) fn commit_to_group(&mut self, offsets: &BTreeMap<TopicPartition, i64>) {
        self.deferred_commit
            .extend(offsets.iter().map(|(tp, o)| (tp.clone(), *o)));
        self.send_deferred_commit();
    }

    /// Whether a commit is on its way (its result not served yet).
    pub(super) fn commit_on_its_way(&self) -> bool {
        self.consumer
            .as_ref()
            .is_some_and(|c| c.context().committing.load(Ordering::Acquire))
    }

    /// Sends the deferred commit, unless one is on its way.
    pub(super) fn send_deferred_commit(&mut self) {
        if !self.commit_on_its_way() {
            self.send_commit();
        }
    }

    /// Sends the deferred commit, if any.
    pub(super) fn send_commit(&mut self) {
        let Some(consumer) = self.consumer.as_ref() else {
            return;
        };
        if self.deferred_commit.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (tp, o) in std::mem::take(&mut self.deferred_commit) {
            if tpl
                .add_partition_offset(&tp.topic, tp.partition, Offset::Offset(o))
                .is_err()
            {
                return;
            }
        }
        consumer.context().committing.store(true, Ordering::Release);
        if let Err(code) = crate::fetch::commit_without_waiting(consumer, &tpl) {
            consumer.context().committing.store(false, Ordering::Release);
            let error = rdkafka::error::KafkaError::ConsumerCommit(code);
            self.metrics.commits_failed.fetch_add(1, Ordering::Relaxed);
            warn!(%error, "Committing offsets to the consumer group failed (monitoring only; the checkpoint holds the offsets).");
        }
    }
}

impl<T, D> Drop for KafkaSource<T, D> {
    fn drop(&mut self) {
        // Offsets of a completed checkpoint still waiting for the commit on its way (the job
        // stopping right after its final checkpoint): sent now, after it. The consumer, closed
        // next, waits for both, so a stopped job's group holds its last checkpoint's offsets.
        self.send_commit();
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

/// librdkafka properties the source sets unless `client` sets them, each for a measured reason.
pub(super) const CLIENT_DEFAULTS: &[(&str, &str)] = &[
    // Consumer lag and fetch figures for the metrics; the end of a broker outage for the log.
    (
        "statistics.interval.ms",
        exactly_kafka_client::outage::STATISTICS_INTERVAL_MS,
    ),
    // librdkafka's default (1 s) stalls a partition for a second whenever its prefetch queue is
    // over the threshold, which a batch-consuming reader hits all the time: measured: 185 k
    // instead of 1.3 M records/s.
    ("fetch.queue.backoff.ms", "10"),
    // librdkafka prefetches until each partition holds 100 000 records (or 64 MiB): at 100 B,
    // ≈ 30 MB more peak memory for a subtask of three partitions than 50 000, which measured no
    // slower in `bench source`; 20 000 saves ≈ 15 MB more and did not slow the pipeline, but
    // slowed the source alone by a fifth (measured: see ARCHITECTURE.md).
    ("queued.min.messages", "50000"),
];

/// The consumer's configuration: TLS/SASL, [`CLIENT_DEFAULTS`], the job's `client` properties
/// (which win over the defaults), then the keys the source owns.
pub(super) fn consumer_config(config: &KafkaSourceConfig) -> Result<ClientConfig> {
    let mut c = exactly_kafka_client::client_config(&config.bootstrap_servers, &config.security)
        .map_err(SourceError::Config)?;
    for (k, v) in CLIENT_DEFAULTS {
        c.set(*k, *v);
    }
    for (k, v) in &config.client {
        c.set(k, v);
    }
    c.set("bootstrap.servers", &config.bootstrap_servers)
        .set("group.id", &config.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        // Offsets are always concrete and checked against the log's range when assigned
        // (`position`); one that leaves it later (retention overtaking a lagging job) comes back
        // as an error that restarts the attempt, never as a silent jump.
        .set("auto.offset.reset", "error")
        .set(
            "isolation.level",
            match config.isolation_level {
                IsolationLevel::ReadCommitted => "read_committed",
                IsolationLevel::ReadUncommitted => "read_uncommitted",
            },
        );
    Ok(c)
}

#[cfg(test)]
mod tests;
