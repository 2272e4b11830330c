//! Checkpointing configuration.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checkpoint::AlignmentMode;
use crate::error::{CoreError, Result};
use crate::storage::Retention;

/// Consistency of snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointingMode {
    /// Aligned barriers: state reflects each record exactly once.
    #[default]
    ExactlyOnce,
    /// Unaligned: a restore may replay records already in the state.
    AtLeastOnce,
}

impl CheckpointingMode {
    pub(crate) fn alignment(self) -> AlignmentMode {
        match self {
            CheckpointingMode::ExactlyOnce => AlignmentMode::ExactlyOnce,
            CheckpointingMode::AtLeastOnce => AlignmentMode::AtLeastOnce,
        }
    }
}

fn default_interval() -> Duration {
    Duration::from_secs(10)
}
fn default_min_pause() -> Duration {
    Duration::ZERO
}
/// Two minutes: long enough for large RocksDB snapshots, and short enough that a pre-committed
/// Kafka transaction (5 min by default) outlives a checkpoint that times out plus the longest
/// default restart delay. (Flink's 10 min would make every default job file fail the Kafka
/// sink's transaction-timeout check.)
fn default_timeout() -> Duration {
    Duration::from_secs(120)
}
fn default_max_concurrent() -> usize {
    1
}
/// One: a single failed checkpoint (a timeout, a declined snapshot) does not restart the job;
/// the next completed one covers its records. (A two-phase sink restarts anyway when carrying
/// the failed checkpoint's transaction forward could outlive its transaction timeout.)
fn default_tolerable_failures() -> u32 {
    1
}
fn default_retained() -> usize {
    1
}
fn default_max_alignment_buffer() -> usize {
    1 << 20
}
fn default_max_alignment_buffer_bytes() -> usize {
    64 << 20
}

/// How and where checkpoints are taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Directory of checkpoint storage (shared storage when the job spans processes).
    pub dir: PathBuf,
    /// Time between checkpoint triggers ("10s").
    #[serde(default = "default_interval", with = "humantime_serde")]
    pub interval: Duration,
    /// Least time between the end of one checkpoint and the start of the next.
    #[serde(default = "default_min_pause", with = "humantime_serde")]
    pub min_pause: Duration,
    /// Also checkpoint as soon as every live source has caught up with its input (a poll found
    /// nothing new) after reading records since the last checkpoint — at the end of a burst or
    /// of a backlog the output commits without waiting for the rest of the interval — but no
    /// sooner than a tenth of `interval` after the previous trigger. Off by default: checkpoints
    /// at the interval only, as Flink takes them.
    #[serde(default)]
    pub when_caught_up: bool,
    /// A checkpoint not complete after this long is aborted.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Checkpoints in flight at once.
    #[serde(default = "default_max_concurrent")]
    pub max_concurrent: usize,
    /// Consecutive checkpoint failures tolerated before the job fails (and restarts).
    #[serde(default = "default_tolerable_failures")]
    pub tolerable_failures: u32,
    /// Exactly-once (aligned) or at-least-once.
    #[serde(default)]
    pub mode: CheckpointingMode,
    /// Records alignment may hold back per subtask before the checkpoint is aborted.
    #[serde(default = "default_max_alignment_buffer")]
    pub max_alignment_buffer: usize,
    /// Bytes alignment may hold back per subtask before the checkpoint is aborted (64 MiB by
    /// default; records weighed by `Stream::record_size`, else by their inline size).
    #[serde(default = "default_max_alignment_buffer_bytes")]
    pub max_alignment_buffer_bytes: usize,
    /// Completed checkpoints kept.
    #[serde(default = "default_retained")]
    pub retained: usize,
    /// What happens to checkpoints when the job is cancelled.
    #[serde(default)]
    pub retention: Retention,
}

impl CheckpointConfig {
    /// Defaults with checkpoints in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CheckpointConfig {
            dir: dir.into(),
            interval: default_interval(),
            min_pause: default_min_pause(),
            when_caught_up: false,
            timeout: default_timeout(),
            max_concurrent: default_max_concurrent(),
            tolerable_failures: default_tolerable_failures(),
            mode: CheckpointingMode::default(),
            max_alignment_buffer: default_max_alignment_buffer(),
            max_alignment_buffer_bytes: default_max_alignment_buffer_bytes(),
            retained: default_retained(),
            retention: Retention::default(),
        }
    }

    /// Checks the values; the error says what to change.
    pub fn validate(&self) -> Result<()> {
        if self.interval.is_zero() {
            return Err(CoreError::Config("checkpoint.interval must be greater than 0".into()));
        }
        if self.timeout.is_zero() {
            return Err(CoreError::Config("checkpoint.timeout must be greater than 0".into()));
        }
        if self.max_concurrent == 0 {
            return Err(CoreError::Config("checkpoint.max_concurrent must be at least 1".into()));
        }
        if self.retained == 0 {
            return Err(CoreError::Config(
                "checkpoint.retained must be at least 1 (the latest checkpoint is what a restart restores)".into(),
            ));
        }
        Ok(())
    }
}
