//! Counters and checkpoint statistics of a running job, readable while it runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Checkpoint statistics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckpointStats {
    /// Completed checkpoints.
    pub completed: u64,
    /// Failed (declined, timed out, or not persisted) checkpoints.
    pub failed: u64,
    /// Restores from a checkpoint or savepoint.
    pub restored: u64,
    /// Latest completed checkpoint id.
    pub latest_id: Option<u64>,
    /// Trigger-to-durable durations of completed checkpoints (the most recent 10 000).
    pub durations: Vec<Duration>,
    /// Longest alignment of the latest completed checkpoint.
    pub last_alignment: Duration,
    /// State size of the latest completed checkpoint (bytes).
    pub last_state_size: u64,
    /// Bytes of keyed-state files the latest completed checkpoint wrote to checkpoint storage:
    /// with RocksDB state, what changed since the checkpoint before (new SST files), not the
    /// whole state. Operator state (sources' positions), kept inside the metadata, is not counted.
    pub last_written: u64,
    /// Bytes written by each completed checkpoint, as `durations` (the most recent 10 000).
    pub written: Vec<u64>,
    /// Retention passes that deleted nothing because a checkpoint's metadata could not be read
    /// (old checkpoints stay until a later pass reads them).
    pub retention_failures: u64,
}

impl CheckpointStats {
    /// The `q` quantile (0..=1) of checkpoint durations.
    pub fn duration_quantile(&self, q: f64) -> Option<Duration> {
        if self.durations.is_empty() {
            return None;
        }
        let mut d = self.durations.clone();
        d.sort_unstable();
        let i = ((d.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        Some(d[i])
    }
}

/// Live metrics of a job.
#[derive(Debug, Default)]
pub struct JobMetrics {
    pub(crate) restarts: AtomicU64,
    pub(crate) checkpoints: Mutex<CheckpointStats>,
}

impl JobMetrics {
    /// Restarts so far.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// A copy of the checkpoint statistics.
    pub fn checkpoints(&self) -> CheckpointStats {
        self.checkpoints.lock().expect("not poisoned").clone()
    }

    pub(crate) fn update(&self, f: impl FnOnce(&mut CheckpointStats)) {
        f(&mut self.checkpoints.lock().expect("not poisoned"));
    }
}
