//! The Prometheus (OpenMetrics) text exposition of a status snapshot.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::{PartitionStatus, SinkStatus, Status};

/// Label pairs of one sample (the job's name first).
type Labels = Vec<(String, String)>;

/// Builds the exposition of one status snapshot with `prometheus-client`: every family is
/// registered afresh with the snapshot's values (the job's counters live in the operators; this
/// only reports them).
struct Exposition {
    registry: prometheus_client::registry::Registry,
    job: String,
}

impl Exposition {
    fn labels(&self, extra: &[(&str, String)]) -> Labels {
        let mut l = vec![("job".to_owned(), self.job.clone())];
        l.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        l
    }

    /// A gauge family `name` with one sample per label set.
    fn gauge(&mut self, name: &str, help: &str, samples: Vec<(Vec<(&str, String)>, f64)>) {
        let family = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        for (extra, v) in samples {
            family.get_or_create(&self.labels(&extra)).set(v);
        }
        // The encoder ends help texts with a period itself.
        self.registry.register(name, help.trim_end_matches('.'), family);
    }

    /// A counter family: `name` without `_total`, which the exposition adds to every sample.
    fn counter(&mut self, name: &str, help: &str, samples: Vec<(Vec<(&str, String)>, u64)>) {
        let family = Family::<Labels, Counter>::default();
        for (extra, v) in samples {
            family.get_or_create(&self.labels(&extra)).inc_by(v);
        }
        self.registry.register(name, help.trim_end_matches('.'), family);
    }
}

/// The OpenMetrics text exposition of `s` (served as `application/openmetrics-text`).
pub fn prometheus(s: &Status) -> String {
    let mut e = Exposition {
        registry: prometheus_client::registry::Registry::default(),
        job: s.job.clone(),
    };
    let one = |v: f64| vec![(Vec::new(), v)];
    let one_u = |v: u64| vec![(Vec::new(), v)];
    e.gauge(
        "exactly_up",
        "1 while the job runs, 0 while it stops.",
        one(if s.state == "running" { 1.0 } else { 0.0 }),
    );
    e.gauge(
        "exactly_uptime_seconds",
        "Seconds since the process started the job.",
        one(s.uptime_s),
    );
    e.counter(
        "exactly_records_in",
        "Records read from Kafka (re-reads after a restore included).",
        one_u(s.records_in),
    );
    e.counter(
        "exactly_records_out",
        "Records handed to the sinks.",
        one_u(s.records_out),
    );
    e.counter(
        "exactly_records_filtered",
        "Records dropped by the job's filter transforms.",
        one_u(s.records_filtered),
    );
    e.counter(
        "exactly_records_skipped",
        "Records skipped by the poison-record policy.",
        one_u(s.records_skipped),
    );
    e.counter(
        "exactly_records_dead_lettered",
        "Records sent to the dead-letter topic.",
        one_u(s.records_dead_lettered),
    );
    e.counter(
        "exactly_source_offsets_lost_to_retention",
        "Source offsets deleted by retention before the job read them (their records are lost).",
        one_u(s.offsets_lost_to_retention),
    );
    e.counter(
        "exactly_restarts",
        "Restarts of the job after failures.",
        one_u(s.restarts),
    );
    let c = &s.checkpoints;
    e.counter(
        "exactly_checkpoints",
        "Checkpoints by result.",
        vec![
            (vec![("result", "completed".into())], c.completed),
            (vec![("result", "failed".into())], c.failed),
        ],
    );
    e.counter(
        "exactly_checkpoint_restores",
        "Restores from a checkpoint or savepoint.",
        one_u(c.restored),
    );
    e.counter(
        "exactly_checkpoint_retention_failures",
        "Retention passes that deleted nothing because a checkpoint could not be read.",
        one_u(c.retention_failures),
    );
    e.gauge(
        "exactly_checkpoint_latest_id",
        "Latest completed checkpoint id.",
        one(c.latest_id.unwrap_or(0) as f64),
    );
    let mut quantiles = Vec::new();
    if let Some(p) = c.p50_ms {
        quantiles.push((vec![("quantile", "0.5".into())], p as f64 / 1000.0));
    }
    if let Some(p) = c.p99_ms {
        quantiles.push((vec![("quantile", "0.99".into())], p as f64 / 1000.0));
    }
    e.gauge(
        "exactly_checkpoint_duration_seconds",
        "Trigger-to-durable checkpoint duration quantiles.",
        quantiles,
    );
    e.gauge(
        "exactly_checkpoint_last_duration_seconds",
        "Duration of the latest completed checkpoint.",
        one(c.last_duration_ms.unwrap_or(0) as f64 / 1000.0),
    );
    e.gauge(
        "exactly_checkpoint_last_size_bytes",
        "State size of the latest completed checkpoint.",
        one(c.last_size_bytes as f64),
    );
    e.gauge(
        "exactly_checkpoint_last_written_bytes",
        "Bytes of keyed-state files the latest completed checkpoint wrote to checkpoint storage (RocksDB: what changed since the one before; operator state, kept in the checkpoint's metadata, not included).",
        one(c.last_written_bytes as f64),
    );
    e.gauge(
        "exactly_checkpoint_last_alignment_seconds",
        "Longest barrier alignment of the latest completed checkpoint.",
        one(c.last_alignment_ms as f64 / 1000.0),
    );
    let tp = |p: &PartitionStatus| vec![("topic", p.topic.clone()), ("partition", p.partition.to_string())];
    e.gauge(
        "exactly_source_partition_position",
        "Next offset to read, per partition.",
        s.partitions.iter().map(|p| (tp(p), p.position as f64)).collect(),
    );
    e.gauge(
        "exactly_source_partition_committed_offset",
        "Offset committed to the consumer group, per partition.",
        s.partitions
            .iter()
            .filter_map(|p| Some((tp(p), p.committed? as f64)))
            .collect(),
    );
    e.gauge(
        "exactly_source_partition_lag",
        "Consumer lag per partition (librdkafka statistics).",
        s.partitions
            .iter()
            .filter_map(|p| Some((tp(p), p.lag? as f64)))
            .collect(),
    );
    e.gauge(
        "exactly_source_watermark_milliseconds",
        "Event-time watermark of the source (minimum over subtasks), when watermarks are on.",
        s.watermark_ms.map(|w| one(w as f64)).unwrap_or_default(),
    );
    e.counter(
        "exactly_source_offset_commits",
        "Offset commits to the consumer group by result.",
        vec![
            (vec![("result", "succeeded".into())], s.offset_commits_succeeded),
            (vec![("result", "failed".into())], s.offset_commits_failed),
        ],
    );
    let per_sink = |v: &dyn Fn(&SinkStatus) -> f64| -> Vec<(Vec<(&str, String)>, f64)> {
        s.sinks.iter().map(|k| (vec![("sink", k.name.clone())], v(k))).collect()
    };
    let per_sink_u = |v: &dyn Fn(&SinkStatus) -> u64| -> Vec<(Vec<(&str, String)>, u64)> {
        s.sinks.iter().map(|k| (vec![("sink", k.name.clone())], v(k))).collect()
    };
    e.counter(
        "exactly_sink_records",
        "Records handed to each sink (after its own transforms).",
        per_sink_u(&|k| k.records),
    );
    e.gauge(
        "exactly_sink_pending_transactions",
        "Pre-committed transactions waiting for their checkpoint, per sink.",
        per_sink(&|k| k.pending_transactions as f64),
    );
    e.gauge(
        "exactly_sink_oldest_pending_transaction_seconds",
        "Age of the oldest pending transaction, per sink.",
        per_sink(&|k| k.oldest_pending_transaction_ms as f64 / 1000.0),
    );
    e.counter(
        "exactly_sink_commits",
        "Transactions committed, per sink.",
        per_sink_u(&|k| k.transactions_committed),
    );
    e.counter(
        "exactly_sink_commit_failures",
        "Commits that failed for good, per sink.",
        per_sink_u(&|k| k.transaction_commit_failures),
    );
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &e.registry).expect("writing to a String does not fail");
    out
}
