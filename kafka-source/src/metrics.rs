//! What the source counts, readable while it runs.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::offsets::TopicPartition;

/// Per-partition figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionMetrics {
    /// Next offset to read.
    pub position: i64,
    /// Last offset committed to the group, if any.
    pub committed: Option<i64>,
    /// Consumer lag as librdkafka last reported it (statistics), if known.
    pub lag: Option<i64>,
}

/// Counters of one source subtask.
#[derive(Debug)]
pub struct KafkaSourceMetrics {
    pub(crate) records: AtomicU64,
    /// Latest watermark (ms); `i64::MIN` when none.
    pub(crate) watermark: AtomicI64,
    pub(crate) skipped: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) lost_to_retention: AtomicU64,
    pub(crate) commits_succeeded: AtomicU64,
    pub(crate) commits_failed: AtomicU64,
    pub(crate) partitions: Mutex<BTreeMap<TopicPartition, PartitionMetrics>>,
}

impl Default for KafkaSourceMetrics {
    fn default() -> Self {
        KafkaSourceMetrics {
            records: AtomicU64::new(0),
            watermark: AtomicI64::new(i64::MIN),
            skipped: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            lost_to_retention: AtomicU64::new(0),
            commits_succeeded: AtomicU64::new(0),
            commits_failed: AtomicU64::new(0),
            partitions: Mutex::default(),
        }
    }
}

impl KafkaSourceMetrics {
    /// The latest watermark this subtask emitted (ms), if watermarks are on.
    pub fn watermark(&self) -> Option<i64> {
        let w = self.watermark.load(Ordering::Relaxed);
        (w != i64::MIN).then_some(w)
    }
    /// Records handed on.
    pub fn records(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }
    /// Records skipped by the poison policy.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
    /// Records sent to the dead-letter topic.
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered.load(Ordering::Relaxed)
    }
    /// Offsets deleted by retention before this subtask read them (their records are lost; at
    /// most this many records, since transaction markers take offsets too).
    pub fn lost_to_retention(&self) -> u64 {
        self.lost_to_retention.load(Ordering::Relaxed)
    }
    /// Offset commits to the group that succeeded.
    pub fn commits_succeeded(&self) -> u64 {
        self.commits_succeeded.load(Ordering::Relaxed)
    }
    /// Offset commits to the group that failed (a warning, never a job failure).
    pub fn commits_failed(&self) -> u64 {
        self.commits_failed.load(Ordering::Relaxed)
    }
    /// Per-partition figures.
    pub fn partitions(&self) -> BTreeMap<TopicPartition, PartitionMetrics> {
        self.partitions.lock().expect("not poisoned").clone()
    }

    pub(crate) fn with_partitions(&self, f: impl FnOnce(&mut BTreeMap<TopicPartition, PartitionMetrics>)) {
        f(&mut self.partitions.lock().expect("not poisoned"));
    }
}
