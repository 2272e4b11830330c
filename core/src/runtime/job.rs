//! A built job and what its runs share: its stages (vertices) and their input channels, the
//! commands a running job takes, how a run ended, and the spawner of its tasks.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::metrics::JobMetrics;
use super::task::{Control, TaskBody, TaskContext, TaskEvent};
use super::JobConfig;
use crate::error::{CoreError, Result};
use crate::storage::{CheckpointStorage, Snapshot, Storage};

/// Creates one subtask's task (the whole chain, head to terminal).
pub(crate) type MakeTask = Box<dyn Fn(&mut TaskContext) -> Result<TaskBody> + Send + Sync>;

/// A stage: `parallelism` subtasks running the same chain.
pub(crate) struct Vertex {
    pub(crate) name: String,
    pub(crate) parallelism: u32,
    pub(crate) is_source: bool,
    pub(crate) make: MakeTask,
}

/// Fresh channels for a run of the job.
pub(crate) trait PrepareInputs: Send + Sync {
    fn prepare(&self, capacity: usize);
    /// Fresh channel of subtask `index` only (its region restarts; forward edges only).
    fn prepare_one(&self, capacity: usize, index: u32);
}

/// A built job, ready to run.
pub struct Job {
    pub(super) config: JobConfig,
    pub(super) vertices: Vec<Vertex>,
    pub(super) inputs: Vec<Arc<dyn PrepareInputs>>,
    pub(super) uids: BTreeSet<String>,
    pub(super) metrics: Arc<JobMetrics>,
    /// Region failover applies: subtask i of every stage is region i.
    pub(super) regions: bool,
    /// The memory every RocksDB instance of the job in this process shares (all subtasks, all
    /// runs), made on first use.
    #[cfg(feature = "rocksdb")]
    pub(super) rocksdb_memory: std::sync::OnceLock<crate::state::RocksDbMemory>,
}

pub(super) enum Command {
    Savepoint {
        dir: Option<PathBuf>,
        stop: bool,
        reply: oneshot::Sender<Result<PathBuf>>,
    },
    Cancel,
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(super) enum RunEnd {
    Finished,
    Cancelled,
    Failed(CoreError),
}

/// Creates tasks: all of them at the start of a run, a region's again after its failure.
pub(super) struct Spawner<'a> {
    pub(super) job: &'a Job,
    pub(super) storage: Option<Arc<Storage>>,
    pub(super) events: mpsc::UnboundedSender<TaskEvent>,
    /// The run's restore past unreadable checkpoints, which its sinks must prove safe.
    pub(super) proof: Option<Arc<super::api::RestoreProof>>,
}

impl Spawner<'_> {
    /// Spawns subtask `index` of vertex `vi` as task `id`; returns its control sender.
    pub(super) fn spawn(
        &self,
        set: &mut JoinSet<(usize, Result<()>)>,
        vi: usize,
        index: u32,
        id: usize,
        (attempt, starting): (u32, bool),
        restore: Option<Arc<Snapshot>>,
    ) -> Result<(mpsc::UnboundedSender<Control>, tokio::task::Id)> {
        let job = self.job;
        let v = &job.vertices[vi];
        let (alignment, max_alignment_buffer, max_alignment_bytes) = job.config.checkpointing.as_ref().map_or(
            (crate::checkpoint::AlignmentMode::ExactlyOnce, usize::MAX, usize::MAX),
            |c| (c.mode.alignment(), c.max_alignment_buffer, c.max_alignment_buffer_bytes),
        );
        let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
        let mut ctx = TaskContext {
            task_id: id,
            name: v.name.clone(),
            index,
            parallelism: v.parallelism,
            max_parallelism: job.config.max_parallelism,
            attempt,
            starting,
            commit_window: job
                .config
                .checkpointing
                .as_ref()
                .map(|c| c.timeout + job.config.restart.longest_delay()),
            accept_replay: job.config.accept_replay,
            backend: job.backend_factory(restore.clone()),
            restore,
            storage: self.storage.clone().map(|s| s as Arc<dyn CheckpointStorage>),
            alignment,
            max_alignment_buffer,
            max_alignment_bytes,
            control: Some(ctl_rx),
            events: self.events.clone(),
            proof: self.proof.clone(),
        };
        let body = (v.make)(&mut ctx)?;
        let handle = set.spawn(async move { (id, body.await) });
        Ok((ctl_tx, handle.id()))
    }
}
