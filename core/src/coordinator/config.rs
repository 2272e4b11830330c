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

/// When a checkpoint comes before its interval because every live source has caught up with
/// its input (found nothing new, or less than a batch, after a brief wait) — never sooner than a
/// tenth of `interval` after the previous trigger. The output read so far then commits (becomes
/// visible to read_committed readers) at once instead of up to one interval later. In a job
/// file: `false` (never), `"after-backlog"` (the default) or `true` (always).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WhenCaughtUp {
    /// At the interval only, as Flink checkpoints.
    Never,
    /// Once a source has read a backlog for at least a tenth of the interval — from a poll that
    /// took a full batch (`SourceStatus::Backlog`) until it caught up — and every source has
    /// caught up since the last checkpoint: at the end of a backlog (after a restart, an outage
    /// upstream, a large burst) the output commits at once. Traffic the job keeps up with is
    /// caught up within moments of any full batch, so it checkpoints at the interval only.
    #[default]
    AfterBacklog,
    /// Whenever every source has caught up after reading records since the last checkpoint.
    /// Under traffic slower than the job, that is every tenth of the interval: lower latency to
    /// read_committed readers for ten times as many checkpoints (and transactions).
    Always,
}

impl<'de> Deserialize<'de> for WhenCaughtUp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = WhenCaughtUp;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(r#"false, "after-backlog" or true ("never" and "always" also name false and true)"#)
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> std::result::Result<WhenCaughtUp, E> {
                Ok(if v { WhenCaughtUp::Always } else { WhenCaughtUp::Never })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<WhenCaughtUp, E> {
                match v {
                    "never" => Ok(WhenCaughtUp::Never),
                    "after-backlog" => Ok(WhenCaughtUp::AfterBacklog),
                    "always" => Ok(WhenCaughtUp::Always),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(Visitor)
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
fn default_owner_lease() -> Duration {
    Duration::from_secs(30)
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
    /// Whether to checkpoint before the interval once every live source has caught up with its
    /// input (see [`WhenCaughtUp`]; by default after reading a backlog).
    #[serde(default)]
    pub when_caught_up: WhenCaughtUp,
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
    /// default; records weighed by `Stream::record_size`, else as their source weighs them —
    /// the Kafka source counts their bytes — else by their inline size).
    #[serde(default = "default_max_alignment_buffer_bytes")]
    pub max_alignment_buffer_bytes: usize,
    /// Completed checkpoints kept.
    #[serde(default = "default_retained")]
    pub retained: usize,
    /// What happens to checkpoints when the job is cancelled.
    #[serde(default)]
    pub retention: Retention,
    /// How long a start waits for the claim of a run on another machine to lapse before taking
    /// over the location ("30s"; a running owner renews its claim every third of it). A run
    /// on the same machine is known alive or gone at once.
    #[serde(default = "default_owner_lease", with = "humantime_serde")]
    pub owner_lease: Duration,
}

impl CheckpointConfig {
    /// Defaults with checkpoints in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CheckpointConfig {
            dir: dir.into(),
            interval: default_interval(),
            min_pause: default_min_pause(),
            when_caught_up: WhenCaughtUp::default(),
            timeout: default_timeout(),
            max_concurrent: default_max_concurrent(),
            tolerable_failures: default_tolerable_failures(),
            mode: CheckpointingMode::default(),
            max_alignment_buffer: default_max_alignment_buffer(),
            max_alignment_buffer_bytes: default_max_alignment_buffer_bytes(),
            retained: default_retained(),
            retention: Retention::default(),
            owner_lease: default_owner_lease(),
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
        if self.owner_lease < Duration::from_secs(3) {
            return Err(CoreError::Config(format!(
                "checkpoint.owner_lease ({}) must be at least 3s: a running job renews its claim every third of it",
                humantime::format_duration(self.owner_lease)
            )));
        }
        if self.retained == 0 {
            return Err(CoreError::Config(
                "checkpoint.retained must be at least 1 (the latest checkpoint is what a restart restores)".into(),
            ));
        }
        Ok(())
    }
}
