//! What a running job reports: counters shared by the job's operators, a JSON status and the
//! Prometheus text exposition built from one snapshot.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use exactly_core::runtime::JobMetrics;
use exactly_kafka_source::KafkaSourceMetrics;
use exactly_twophase::TwoPhaseMetrics;
use serde::Serialize;

mod exposition;
pub use exposition::prometheus;

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
    /// Records replaced source subtasks skipped and dead-lettered, and offsets retention deleted
    /// before they read them: counters stay monotonic across restarts.
    retired_skipped: AtomicU64,
    retired_dead_lettered: AtomicU64,
    retired_lost_to_retention: AtomicU64,
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
    /// Bytes of keyed-state files the latest wrote to checkpoint storage (with RocksDB state:
    /// what changed since the one before; operator state, inside the metadata, not counted).
    pub last_written_bytes: u64,
    /// Longest alignment of the latest (ms).
    pub last_alignment_ms: u64,
    /// Retention passes that deleted nothing because a checkpoint could not be read.
    pub retention_failures: u64,
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
    /// Source offsets retention deleted before the job read them (records lost before the job
    /// saw them; markers of transactions take offsets too).
    pub offsets_lost_to_retention: u64,
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
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
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
            retired_skipped: AtomicU64::new(0),
            retired_dead_lettered: AtomicU64::new(0),
            retired_lost_to_retention: AtomicU64::new(0),
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
            self.retired_skipped.fetch_add(old.skipped(), Ordering::Relaxed);
            self.retired_dead_lettered
                .fetch_add(old.dead_lettered(), Ordering::Relaxed);
            self.retired_lost_to_retention
                .fetch_add(old.lost_to_retention(), Ordering::Relaxed);
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
                    ..SinkStatus::default()
                };
                (name.clone(), status)
            })
            .collect();
        for ((name, _), m) in &by_sink {
            let s = per_sink.entry(name.clone()).or_insert_with(|| SinkStatus {
                name: name.clone(),
                ..SinkStatus::default()
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
        // Read = deserialized (kept or filtered) + skipped + dead-lettered; out = kept. The live
        // subtasks' counts here; replaced ones' are in the retired counters.
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
            records_skipped: self.retired_skipped.load(Ordering::Relaxed) + skipped,
            records_dead_lettered: self.retired_dead_lettered.load(Ordering::Relaxed) + dead_lettered,
            offsets_lost_to_retention: self.retired_lost_to_retention.load(Ordering::Relaxed)
                + sources.iter().map(|s| s.lost_to_retention()).sum::<u64>(),
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
                last_written_bytes: stats.last_written,
                last_alignment_ms: ms(stats.last_alignment),
                retention_failures: stats.retention_failures,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sample name of the exposition: dashboards and alerts query these, so they stay.
    const METRICS: &[&str] = &[
        "exactly_checkpoint_duration_seconds",
        "exactly_checkpoint_last_alignment_seconds",
        "exactly_checkpoint_last_duration_seconds",
        "exactly_checkpoint_last_size_bytes",
        "exactly_checkpoint_last_written_bytes",
        "exactly_checkpoint_latest_id",
        "exactly_checkpoint_restores_total",
        "exactly_checkpoint_retention_failures_total",
        "exactly_checkpoints_total",
        "exactly_records_dead_lettered_total",
        "exactly_records_filtered_total",
        "exactly_records_in_total",
        "exactly_records_out_total",
        "exactly_records_skipped_total",
        "exactly_restarts_total",
        "exactly_sink_commit_failures_total",
        "exactly_sink_commits_total",
        "exactly_sink_oldest_pending_transaction_seconds",
        "exactly_sink_pending_transactions",
        "exactly_sink_records_total",
        "exactly_source_offset_commits_total",
        "exactly_source_offsets_lost_to_retention_total",
        "exactly_source_partition_committed_offset",
        "exactly_source_partition_lag",
        "exactly_source_partition_position",
        "exactly_source_watermark_milliseconds",
        "exactly_up",
        "exactly_uptime_seconds",
    ];

    #[test]
    fn the_grafana_dashboard_queries_only_metrics_that_exist() {
        let dashboard = include_str!("../../docs/grafana/exactly-dashboard.json");
        let _: serde_json::Value = serde_json::from_str(dashboard).expect("valid JSON");
        let mut queried = std::collections::BTreeSet::new();
        let mut rest = dashboard;
        while let Some(at) = rest.find("exactly_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            queried.insert(name);
        }
        assert!(queried.len() >= 10, "{queried:?}");
        for name in &queried {
            assert!(
                METRICS.contains(&name.as_str()),
                "the dashboard queries {name}, which /metrics lacks"
            );
        }
    }

    /// A restart replaces the source subtasks' metrics: what the replaced ones counted stays in
    /// the totals (counters never go back), and is not counted twice in the records read.
    #[test]
    fn counts_of_replaced_source_subtasks_stay_in_the_totals() {
        let r = Registry::new("j", 1, "all".into());
        r.source(0, Arc::default());
        // What `source` keeps when it replaces subtask 0's metrics (read includes the others).
        r.retired_read.store(10, Ordering::Relaxed);
        r.retired_skipped.store(2, Ordering::Relaxed);
        r.retired_dead_lettered.store(1, Ordering::Relaxed);
        r.retired_lost_to_retention.store(7, Ordering::Relaxed);
        r.source(0, Arc::default());
        let s = r.status();
        assert_eq!(
            (
                s.records_in,
                s.records_skipped,
                s.records_dead_lettered,
                s.offsets_lost_to_retention
            ),
            (10, 2, 1, 7)
        );
    }

    #[test]
    fn prometheus_text_has_help_type_and_labelled_samples() {
        let r = Registry::new("orders \"eu\"", 2, "all".into());
        r.retired_read.store(5, Ordering::Relaxed);
        r.sink_records("paid-orders").fetch_add(3, Ordering::Relaxed);
        r.sink("orders-table", 1, Arc::default());
        let mut status = r.status();
        status.partitions.push(PartitionStatus {
            topic: "orders".into(),
            partition: 1,
            position: 10,
            committed: Some(9),
            lag: Some(2),
        });
        status.watermark_ms = Some(1);
        status.checkpoints.p50_ms = Some(150);
        status.checkpoints.p99_ms = Some(300);
        let text = prometheus(&status);
        assert!(text.contains("# TYPE exactly_records_in counter\n"), "{text}");
        assert!(
            text.contains("# HELP exactly_up 1 while the job runs, 0 while it stops.\n"),
            "{text}"
        );
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
        assert!(
            text.contains(
                "exactly_source_partition_lag{job=\"orders \\\"eu\\\"\",topic=\"orders\",partition=\"1\"} 2.0\n"
            ),
            "{text}"
        );
        let names: Vec<_> = r.status().sinks.iter().map(|s| s.name.clone()).collect();
        assert_eq!(names, ["orders-table", "paid-orders"]);
        // The names are stable, and every sample's value is a number.
        let mut seen = std::collections::BTreeSet::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (sample, value) = line.rsplit_once(' ').unwrap();
            value.parse::<f64>().unwrap();
            seen.insert(sample.split('{').next().unwrap().to_owned());
        }
        assert_eq!(seen.iter().map(String::as_str).collect::<Vec<_>>(), METRICS);
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
