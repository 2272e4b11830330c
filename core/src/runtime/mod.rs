//! The runtime: build a job with [`JobBuilder`], run it with [`Job::start`] or [`Job::run`].
//!
//! Each stage runs `parallelism` tasks on tokio; operators within a stage are chained (no channel
//! between them); stages are connected by bounded channels, so a slow sink slows the sources
//! (backpressure). Barriers flow in-band from the sources; a task whose upstreams have all ended
//! snapshots on request. A failed task fails the run; the restart strategy decides whether the job
//! restarts from the latest completed checkpoint.

mod api;
mod chain;
mod coordination;
mod executor;
mod graph;
mod job;
mod metrics;
mod output;
mod region;
mod restore;
#[cfg(test)]
pub(crate) use restore::RestorePlan;
mod task;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use api::{
    CheckpointListener, CheckpointedFunction, Collector, InitContext, KeyedProcessFunction, ProcessFunction, Sink,
    SnapshotContext, Source, SourceStatus, SourceWatermark, SubtaskInfo,
};
pub use executor::{JobControl, JobHandle, JobOutcome};
pub use graph::{JobBuilder, KeyedStream, Stream};
pub use job::Job;
pub use metrics::{CheckpointStats, JobMetrics};
pub use output::{DeferredSnapshot, DeferredState};

use crate::coordinator::CheckpointConfig;
use crate::error::{CoreError, Result};
use crate::restart::RestartStrategy;
use crate::state::DEFAULT_MAX_PARALLELISM;

/// Which keyed state backend operators use.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum StateBackendConfig {
    /// In memory, full snapshots.
    #[default]
    Memory,
    /// RocksDB with incremental snapshots; working copies under `local_dir`.
    RocksDb {
        /// Local working directory (default: a directory of the process's own, mode 0700 and
        /// a random name, under the system's temporary directory: [`crate::default_state_root`]).
        #[serde(default)]
        local_dir: Option<PathBuf>,
        /// Memory in MiB that all RocksDB instances of the job in this process share: block
        /// cache, index and filter blocks and write buffers (default 64, at least 16).
        #[serde(default)]
        memory_mb: Option<u64>,
    },
}

impl StateBackendConfig {
    /// Checks the settings: RocksDB's memory between 16 MiB (below it the write buffers alone
    /// overrun it) and 1 TiB.
    pub fn validate(&self) -> crate::Result<()> {
        if let StateBackendConfig::RocksDb {
            memory_mb: Some(mb), ..
        } = self
        {
            if !(16..=1 << 20).contains(mb) {
                return Err(crate::CoreError::Config(format!(
                    "memory_mb = {mb}: RocksDB's memory must be between 16 and 1048576 MiB"
                )));
            }
        }
        Ok(())
    }
}

/// The error of a RocksDB state backend asked of a build without it.
#[cfg(not(feature = "rocksdb"))]
pub(crate) fn rocksdb_missing() -> crate::CoreError {
    crate::CoreError::Config(
        "the RocksDB state backend is not in this build (exactly-core's feature `rocksdb`; the `exactly` \
         command has it unless built with --no-default-features): build with it, or use the memory backend"
            .into(),
    )
}

fn default_channel_capacity() -> usize {
    64
}

/// Settings of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// The job's name (written into checkpoint metadata).
    pub name: String,
    /// Checkpointing; `None` runs without checkpoints (no exactly-once, no restore).
    #[serde(default)]
    pub checkpointing: Option<CheckpointConfig>,
    /// Restarts after failures.
    #[serde(default)]
    pub restart: RestartStrategy,
    /// Keyed state backend.
    #[serde(default)]
    pub state_backend: StateBackendConfig,
    /// Number of key groups; fixed for the life of the job's state.
    #[serde(default = "default_max_parallelism")]
    pub max_parallelism: u32,
    /// Batches buffered per channel between stages.
    #[serde(default = "default_channel_capacity")]
    pub channel_capacity: usize,
    /// Start from this checkpoint or savepoint directory. On the job's first attempt it is
    /// authoritative (restored even if the checkpoint directory holds other checkpoints, see
    /// `accept_replay`); later attempts restore the checkpoints this job completed since.
    #[serde(default)]
    pub restore_from: Option<PathBuf>,
    /// Restore `restore_from` even when it is older than the newest completed checkpoint in the
    /// checkpoint directory. The newer checkpoints' transactions may have committed output that the
    /// restored job writes again: setting this acknowledges possible duplicates.
    #[serde(default)]
    pub accept_replay: bool,
    /// Allow the snapshot to hold state of operators this job does not have (it is dropped).
    #[serde(default)]
    pub allow_non_restored_state: bool,
    /// How long a graceful stop waits for tasks.
    #[serde(default = "default_shutdown_timeout", with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// Run only these subtasks (scale-out over processes: each process runs a range of the same
    /// job and keeps its own checkpoints). Every stage must have the same parallelism and only
    /// forward edges, so no record crosses to a subtask of another process.
    #[serde(default)]
    pub subtasks: Option<SubtaskRange>,
    /// What a task failure restarts.
    #[serde(default)]
    pub failover: FailoverStrategy,
    /// Attempts to start before the job gives up, whatever the restart strategy allows: until its
    /// first completed checkpoint (or a run of a minute), the job is starting, and a failure then
    /// is most likely permanent (an address that does not resolve, a refused login, a missing
    /// topic or table). `None`: only the restart strategy decides. A job that restores a
    /// checkpoint of its own location ran before: what fails its start is waited for (tried
    /// again every `restart::WAIT_CADENCE` at most), and so is a checkpoint location that does
    /// not answer.
    #[serde(default = "default_startup_attempts")]
    pub startup_attempts: Option<u32>,
}

fn default_startup_attempts() -> Option<u32> {
    Some(DEFAULT_STARTUP_ATTEMPTS)
}

/// Attempts to start by default: with the default exponential restart delays (1, 2, 4, 8 s) a
/// broker or database that comes up within about 15 s plus the connectors' own timeouts is
/// waited for.
pub const DEFAULT_STARTUP_ATTEMPTS: u32 = 5;

/// What a task failure restarts (Flink's `jobmanager.execution.failover-strategy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailoverStrategy {
    /// Every task restarts from the latest completed checkpoint.
    Full,
    /// Only the failed pipelined region restarts: in a job whose stages have one parallelism and
    /// forward edges only, subtask i of every stage forms region i, and a failure restarts that
    /// region alone from the latest completed checkpoint while the others keep running. A job with
    /// key_by, rebalance or unions of different parallelism is one region (every failure restarts
    /// everything). Region restarts count against the restart strategy.
    #[default]
    Region,
}

/// Subtasks `first..=last` of every stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubtaskRange {
    /// First subtask index.
    pub first: u32,
    /// Last subtask index (inclusive).
    pub last: u32,
}

impl SubtaskRange {
    /// Whether subtask `index` runs here.
    pub fn contains(&self, index: u32) -> bool {
        (self.first..=self.last).contains(&index)
    }
}

impl std::fmt::Display for SubtaskRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..{}", self.first, self.last)
    }
}

fn default_max_parallelism() -> u32 {
    DEFAULT_MAX_PARALLELISM
}

fn default_shutdown_timeout() -> Duration {
    Duration::from_secs(30)
}

impl JobConfig {
    /// Defaults for a job called `name` (no checkpointing).
    pub fn new(name: impl Into<String>) -> Self {
        JobConfig {
            name: name.into(),
            checkpointing: None,
            restart: RestartStrategy::default(),
            state_backend: StateBackendConfig::default(),
            max_parallelism: DEFAULT_MAX_PARALLELISM,
            channel_capacity: default_channel_capacity(),
            restore_from: None,
            accept_replay: false,
            allow_non_restored_state: false,
            shutdown_timeout: default_shutdown_timeout(),
            subtasks: None,
            failover: FailoverStrategy::default(),
            startup_attempts: default_startup_attempts(),
        }
    }

    /// Checks the settings; the error names what to change.
    pub fn validate(&self) -> Result<()> {
        if let Some(c) = &self.checkpointing {
            c.validate()?;
        }
        self.restart.validate()?;
        if self.max_parallelism == 0 || self.max_parallelism > u32::from(u16::MAX) {
            return Err(CoreError::Config(format!(
                "max_parallelism ({}) must be between 1 and 65535",
                self.max_parallelism
            )));
        }
        if let Some(r) = self.subtasks {
            if r.first > r.last {
                return Err(CoreError::Config(format!(
                    "subtasks {r}: the first index must not exceed the last"
                )));
            }
        }
        if self.channel_capacity == 0 {
            return Err(CoreError::Config("channel_capacity must be at least 1".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod deferred_tests;
#[cfg(test)]
mod fallback_tests;
#[cfg(test)]
mod start_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod waiting_tests;
#[cfg(test)]
mod weight_tests;
