//! What a running job reports: counters shared by the job's operators, a JSON status and the
//! Prometheus text exposition built from one snapshot.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use exactly_core::runtime::JobMetrics;
use exactly_kafka_source::KafkaSourceMetrics;
use exactly_twophase::TwoPhaseMetrics;
use serde::Serialize;

/// Counters of one job run by this process (kept across restarts of the job).
#[derive(Debug)]
pub struct Registry {
    /// Job name.
    pub job: String,
    /// Parallelism of the job.
    pub parallelism: u32,
    /// Subtasks this process runs ("0..2"), or all.
    pub subtasks: String,
    started: Instant,
    /// Records dropped by a filter.
    pub records_filtered: AtomicU64,
    /// What source subtasks replaced by a restart had read (all records, and those deserialized);
    /// the live ones' counts come from their own metrics.
    retired_read: AtomicU64,
    retired_deserialized: AtomicU64,
    sources: Mutex<BTreeMap<u32, Arc<KafkaSourceMetrics>>>,
    /// Transaction metrics per (sink name, subtask).
    sinks: Mutex<BTreeMap<(String, u32), Arc<TwoPhaseMetrics>>>,
    /// Records handed to each sink (after its own transforms), by sink name.
    sink_records: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
    job_metrics: Mutex<Option<Arc<JobMetrics>>>,
    stopping: std::sync::atomic::AtomicBool,
}

/// Per-partition figures in the status.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PartitionStatus {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Next offset to read.
    pub position: i64,
    /// Last offset committed to the consumer group.
    pub committed: Option<i64>,
    /// Consumer lag (librdkafka statistics, every 5 s).
    pub lag: Option<i64>,
}

/// Checkpoint figures in the status.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CheckpointStatus {
    /// Completed checkpoints.
    pub completed: u64,
    /// Failed (declined, timed out) checkpoints.
    pub failed: u64,
    /// Restores.
    pub restored: u64,
    /// Latest completed checkpoint.
    pub latest_id: Option<u64>,
    /// Duration of the latest (ms).
    pub last_duration_ms: Option<u64>,
    /// Median duration (ms).
    pub p50_ms: Option<u64>,
    /// 99th percentile duration (ms).
    pub p99_ms: Option<u64>,
    /// State size of the latest (bytes).
    pub last_size_bytes: u64,
    /// Longest alignment of the latest (ms).
    pub last_alignment_ms: u64,
}

/// The JSON status (`GET /status`), also the source of the Prometheus metrics.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Status {
    /// Job name.
    pub job: String,
    /// "running" or "stopping".
    pub state: String,
    /// Parallelism.
    pub parallelism: u32,
    /// Subtasks run by this process.
    pub subtasks: String,
    /// Seconds since start.
    pub uptime_s: f64,
    /// Records read.
    pub records_in: u64,
    /// Records handed to the sink.
    pub records_out: u64,
    /// Records dropped by filters.
    pub records_filtered: u64,
    /// Records skipped by the poison policy.
    pub records_skipped: u64,
    /// Records sent to the dead-letter topic.
    pub records_dead_lettered: u64,
    /// Restarts of the job.
    pub restarts: u64,
    /// Checkpoints.
    pub checkpoints: CheckpointStatus,
    /// Source partitions of the subtasks running here.
    pub partitions: Vec<PartitionStatus>,
    /// Sum of known partition lags.
    pub lag: Option<i64>,
    /// Event-time watermark (ms): the minimum over source subtasks that have one (when the source
    /// generates watermarks).
    pub watermark_ms: Option<i64>,
    /// Offset commits to the group that succeeded / failed.
    pub offset_commits_succeeded: u64,
    /// Offset commits that failed (a warning, never a failure).
    pub offset_commits_failed: u64,
    /// Pre-committed transactions waiting for their checkpoint.
    pub pending_transactions: u64,
    /// Age of the oldest pending transaction (ms).
    pub oldest_pending_transaction_ms: u64,
    /// Transactions committed.
    pub transactions_committed: u64,
    /// Commits that failed for good.
    pub transaction_commit_failures: u64,
    /// Each sink's figures (the totals above sum them).
    pub sinks: Vec<SinkStatus>,
}

/// One sink's figures in the status.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SinkStatus {
    /// The sink's name (its operator uid).
    pub name: String,
    /// Records handed to it (after its own transforms; re-sent records after a restore
    /// included).
    pub records: u64,
    /// Pre-committed transactions waiting for their checkpoint.
    pub pending_transactions: u64,
    /// Age of its oldest pending transaction (ms).
    pub oldest_pending_transaction_ms: u64,
    /// Transactions committed.
    pub transactions_committed: u64,
    /// Commits that failed for good.
    pub transaction_commit_failures: u64,
}

impl Registry {
    /// A registry for `job`.
    pub fn new(job: &str, parallelism: u32, subtasks: String) -> Arc<Self> {
        Arc::new(Registry {
            job: job.to_owned(),
            parallelism,
            subtasks,
            started: Instant::now(),
            records_filtered: AtomicU64::new(0),
            retired_read: AtomicU64::new(0),
            retired_deserialized: AtomicU64::new(0),
            sources: Mutex::default(),
            sinks: Mutex::default(),
            sink_records: Mutex::default(),
            job_metrics: Mutex::default(),
            stopping: Default::default(),
        })
    }

    /// Registers (or, after a restart, replaces) the metrics of source subtask `index`.
    pub fn source(&self, index: u32, m: Arc<KafkaSourceMetrics>) {
        if let Some(old) = self.sources.lock().expect("not poisoned").insert(index, m) {
            self.retired_deserialized.fetch_add(old.records(), Ordering::Relaxed);
            self.retired_read
                .fetch_add(old.records() + old.skipped() + old.dead_lettered(), Ordering::Relaxed);
        }
    }

    /// Registers (or replaces) the transaction metrics of subtask `index` of sink `name`.
    pub fn sink(&self, name: &str, index: u32, m: Arc<TwoPhaseMetrics>) {
        self.sinks
            .lock()
            .expect("not poisoned")
            .insert((name.to_owned(), index), m);
    }

    /// The counter of records handed to sink `name` (created on first use; listed in the status
    /// from then on).
    pub fn sink_records(&self, name: &str) -> Arc<AtomicU64> {
        self.sink_records
            .lock()
            .expect("not poisoned")
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    /// Sets the job's own metrics.
    pub fn job_metrics(&self, m: Arc<JobMetrics>) {
        *self.job_metrics.lock().expect("not poisoned") = Some(m);
    }

    /// Marks the job as stopping.
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// A consistent-enough snapshot of everything.
    pub fn status(&self) -> Status {
        let sources: Vec<_> = self.sources.lock().expect("not poisoned").values().cloned().collect();
        let by_sink: Vec<((String, u32), Arc<TwoPhaseMetrics>)> = self
            .sinks
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let sinks: Vec<_> = by_sink.iter().map(|(_, m)| m.clone()).collect();
        let mut per_sink: BTreeMap<String, SinkStatus> = self
            .sink_records
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|(name, n)| {
                let status = SinkStatus {
                    name: name.clone(),
                    records: n.load(Ordering::Relaxed),
                    pending_transactions: 0,
                    oldest_pending_transaction_ms: 0,
                    transactions_committed: 0,
                    transaction_commit_failures: 0,
                };
                (name.clone(), status)
            })
            .collect();
        for ((name, _), m) in &by_sink {
            let s = per_sink.entry(name.clone()).or_insert_with(|| SinkStatus {
                name: name.clone(),
                records: 0,
                pending_transactions: 0,
                oldest_pending_transaction_ms: 0,
                transactions_committed: 0,
                transaction_commit_failures: 0,
            });
            s.pending_transactions += m.pending();
            s.oldest_pending_transaction_ms = s.oldest_pending_transaction_ms.max(m.oldest_pending_ms());
            s.transactions_committed += m.committed();
            s.transaction_commit_failures += m.commit_failures();
        }
        let job = self.job_metrics.lock().expect("not poisoned").clone();
        let mut partitions = Vec::new();
        for s in &sources {
            for (tp, p) in s.partitions() {
                partitions.push(PartitionStatus {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    position: p.position,
                    committed: p.committed,
                    lag: p.lag,
                });
            }
        }
        partitions.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        let lags: Vec<i64> = partitions.iter().filter_map(|p| p.lag).collect();
        let stats = job.as_ref().map(|j| j.checkpoints()).unwrap_or_default();
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        // Read = deserialized (kept or filtered) + skipped + dead-lettered; out = kept.
        let live: u64 = sources.iter().map(|s| s.records()).sum();
        let skipped: u64 = sources.iter().map(|s| s.skipped()).sum();
        let dead_lettered: u64 = sources.iter().map(|s| s.dead_lettered()).sum();
        let deserialized = self.retired_deserialized.load(Ordering::Relaxed) + live;
        let filtered = self.records_filtered.load(Ordering::Relaxed);
        Status {
            job: self.job.clone(),
            state: if self.stopping.load(Ordering::Relaxed) {
                "stopping".into()
            } else {
                "running".into()
            },
            parallelism: self.parallelism,
            subtasks: self.subtasks.clone(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            records_in: self.retired_read.load(Ordering::Relaxed) + live + skipped + dead_lettered,
            records_out: deserialized.saturating_sub(filtered),
            records_filtered: filtered,
            records_skipped: skipped,
            records_dead_lettered: dead_lettered,
            restarts: job.as_ref().map_or(0, |j| j.restarts()),
            checkpoints: CheckpointStatus {
                completed: stats.completed,
                failed: stats.failed,
                restored: stats.restored,
                latest_id: stats.latest_id,
                last_duration_ms: stats.durations.last().copied().map(ms),
                p50_ms: stats.duration_quantile(0.5).map(ms),
                p99_ms: stats.duration_quantile(0.99).map(ms),
                last_size_bytes: stats.last_state_size,
                last_alignment_ms: ms(stats.last_alignment),
            },
            lag: (!lags.is_empty()).then(|| lags.iter().sum()),
            watermark_ms: sources.iter().filter_map(|s| s.watermark()).min(),
            partitions,
            offset_commits_succeeded: sources.iter().map(|s| s.commits_succeeded()).sum(),
            offset_commits_failed: sources.iter().map(|s| s.commits_failed()).sum(),
            pending_transactions: sinks.iter().map(|s| s.pending()).sum(),
            oldest_pending_transaction_ms: sinks.iter().map(|s| s.oldest_pending_ms()).max().unwrap_or(0),
            transactions_committed: sinks.iter().map(|s| s.committed()).sum(),
            transaction_commit_failures: sinks.iter().map(|s| s.commit_failures()).sum(),
            sinks: per_sink.into_values().collect(),
        }
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The Prometheus text exposition of `s`.
pub fn prometheus(s: &Status) -> String {
    let mut out = String::new();
    let job = format!("job=\"{}\"", escape(&s.job));
    let mut metric = |name: &str, kind: &str, help: &str, samples: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, v) in samples {
            let sep = if labels.is_empty() { "" } else { "," };
            let _ = writeln!(out, "{name}{{{job}{sep}{labels}}} {v}");
        }
    };
    let one = |v: f64| vec![(String::new(), v)];
    metric(
        "exactly_up",
        "gauge",
        "1 while the job runs, 0 while it stops.",
        one(if s.state == "running" { 1.0 } else { 0.0 }),
    );
    metric(
        "exactly_uptime_seconds",
        "gauge",
        "Seconds since the process started the job.",
        one(s.uptime_s),
    );
    metric(
        "exactly_records_in_total",
        "counter",
        "Records read from Kafka (re-reads after a restore included).",
        one(s.records_in as f64),
    );
    metric(
        "exactly_records_out_total",
        "counter",
        "Records handed to the sink.",
        one(s.records_out as f64),
    );
    metric(
        "exactly_records_filtered_total",
        "counter",
        "Records dropped by filter transforms.",
        one(s.records_filtered as f64),
    );
    metric(
        "exactly_records_skipped_total",
        "counter",
        "Records skipped by the poison-record policy.",
        one(s.records_skipped as f64),
    );
    metric(
        "exactly_records_dead_lettered_total",
        "counter",
        "Records sent to the dead-letter topic.",
        one(s.records_dead_lettered as f64),
    );
    metric(
        "exactly_restarts_total",
        "counter",
        "Restarts of the job after failures.",
        one(s.restarts as f64),
    );
    let c = &s.checkpoints;
    metric(
        "exactly_checkpoints_total",
        "counter",
        "Checkpoints by result.",
        vec![
            ("result=\"completed\"".into(), c.completed as f64),
            ("result=\"failed\"".into(), c.failed as f64),
        ],
    );
    metric(
        "exactly_checkpoint_restores_total",
        "counter",
        "Restores from a checkpoint or savepoint.",
        one(c.restored as f64),
    );
    metric(
        "exactly_checkpoint_latest_id",
        "gauge",
        "Latest completed checkpoint id.",
        one(c.latest_id.unwrap_or(0) as f64),
    );
    let mut quantiles = Vec::new();
    if let Some(p) = c.p50_ms {
        quantiles.push(("quantile=\"0.5\"".into(), p as f64 / 1000.0));
    }
    if let Some(p) = c.p99_ms {
        quantiles.push(("quantile=\"0.99\"".into(), p as f64 / 1000.0));
    }
    metric(
        "exactly_checkpoint_duration_seconds",
        "gauge",
        "Trigger-to-durable checkpoint duration quantiles.",
        quantiles,
    );
    metric(
        "exactly_checkpoint_last_duration_seconds",
        "gauge",
        "Duration of the latest completed checkpoint.",
        one(c.last_duration_ms.unwrap_or(0) as f64 / 1000.0),
    );
    metric(
        "exactly_checkpoint_last_size_bytes",
        "gauge",
        "State size of the latest completed checkpoint.",
        one(c.last_size_bytes as f64),
    );
    metric(
        "exactly_checkpoint_last_alignment_seconds",
        "gauge",
        "Longest barrier alignment of the latest completed checkpoint.",
        one(c.last_alignment_ms as f64 / 1000.0),
    );
    let tp = |p: &PartitionStatus| format!("topic=\"{}\",partition=\"{}\"", escape(&p.topic), p.partition);
    metric(
        "exactly_source_partition_position",
        "gauge",
        "Next offset to read, per partition.",
        s.partitions.iter().map(|p| (tp(p), p.position as f64)).collect(),
    );
    metric(
        "exactly_source_partition_committed_offset",
        "gauge",
        "Offset committed to the consumer group, per partition.",
        s.partitions
            .iter()
            .filter_map(|p| Some((tp(p), p.committed? as f64)))
            .collect(),
    );
    metric(
        "exactly_source_partition_lag",
        "gauge",
        "Consumer lag per partition (librdkafka statistics).",
        s.partitions
            .iter()
            .filter_map(|p| Some((tp(p), p.lag? as f64)))
            .collect(),
    );
    metric(
        "exactly_source_watermark_milliseconds",
        "gauge",
        "Event-time watermark of the source (minimum over subtasks), when watermarks are on.",
        s.watermark_ms
            .map(|w| vec![(String::new(), w as f64)])
            .unwrap_or_default(),
    );
    metric(
        "exactly_source_offset_commits_total",
        "counter",
        "Offset commits to the consumer group by result.",
        vec![
            ("result=\"succeeded\"".into(), s.offset_commits_succeeded as f64),
            ("result=\"failed\"".into(), s.offset_commits_failed as f64),
        ],
    );
    let per_sink = |v: &dyn Fn(&SinkStatus) -> f64| -> Vec<(String, f64)> {
        s.sinks
            .iter()
            .map(|k| (format!("sink=\"{}\"", escape(&k.name)), v(k)))
            .collect()
    };
    metric(
        "exactly_sink_records_total",
        "counter",
        "Records handed to each sink (after its own transforms).",
        per_sink(&|k| k.records as f64),
    );
    metric(
        "exactly_sink_pending_transactions",
        "gauge",
        "Pre-committed transactions waiting for their checkpoint, per sink.",
        per_sink(&|k| k.pending_transactions as f64),
    );
    metric(
        "exactly_sink_oldest_pending_transaction_seconds",
        "gauge",
        "Age of the oldest pending transaction, per sink.",
        per_sink(&|k| k.oldest_pending_transaction_ms as f64 / 1000.0),
    );
    metric(
        "exactly_sink_commits_total",
        "counter",
        "Transactions committed, per sink.",
        per_sink(&|k| k.transactions_committed as f64),
    );
    metric(
        "exactly_sink_commit_failures_total",
        "counter",
        "Commits that failed for good, per sink.",
        per_sink(&|k| k.transaction_commit_failures as f64),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_has_help_type_and_labelled_samples() {
        let r = Registry::new("orders \"eu\"", 2, "all".into());
        r.retired_read.store(5, Ordering::Relaxed);
        r.sink_records("paid-orders").fetch_add(3, Ordering::Relaxed);
        r.sink("orders-table", 1, Arc::default());
        let text = prometheus(&r.status());
        assert!(text.contains("# TYPE exactly_records_in_total counter"), "{text}");
        assert!(
            text.contains("exactly_records_in_total{job=\"orders \\\"eu\\\"\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("exactly_checkpoints_total{job=\"orders \\\"eu\\\"\",result=\"completed\"} 0\n"),
            "{text}"
        );
        // Each sink's figures carry its name.
        assert!(
            text.contains("exactly_sink_records_total{job=\"orders \\\"eu\\\"\",sink=\"paid-orders\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("exactly_sink_commits_total{job=\"orders \\\"eu\\\"\",sink=\"orders-table\"} 0\n"),
            "{text}"
        );
        let names: Vec<_> = r.status().sinks.iter().map(|s| s.name.clone()).collect();
        assert_eq!(names, ["orders-table", "paid-orders"]);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, value) = line.rsplit_once(' ').unwrap();
            value.parse::<f64>().unwrap();
        }
    }
}
