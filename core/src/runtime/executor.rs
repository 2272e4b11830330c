//! Running a job: one run (attempt) spawns every task and coordinates checkpoints; a failed run
//! is restarted from the latest completed checkpoint as the restart strategy allows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{error, info, warn};

use super::chain::BackendFactory;
use super::coordination::Run;
use super::job::{Command, Job, PrepareInputs, RunEnd, Spawner, Vertex};
use super::metrics::JobMetrics;
use super::restore::RestorePlan;
use super::{FailoverStrategy, JobConfig, StateBackendConfig};
use crate::coordinator::CheckpointCoordinator;
use crate::error::{CoreError, ErrorClass, Result};
use crate::message::CheckpointId;
use crate::restart::{FailedWhile, RestartDecision, RestartTracker};
#[cfg(feature = "rocksdb")]
use crate::state::RocksDbBackend;
use crate::state::{KeyGroupRange, KeyedStateBackend, MemoryBackend};
use crate::storage::{CheckpointStorage, Retention, Snapshot, Storage};

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOutcome {
    /// Checkpoints completed over all runs.
    pub checkpoints: u64,
    /// Restarts made.
    pub restarts: u32,
    /// The latest completed checkpoint.
    pub latest_checkpoint: Option<CheckpointId>,
    /// Whether it was cancelled (rather than finishing its input or stopping with a savepoint).
    pub cancelled: bool,
}

/// Controls a started job.
pub struct JobHandle {
    control: JobControl,
    join: tokio::task::JoinHandle<Result<JobOutcome>>,
}

/// A cloneable remote control of a running job (savepoints, stop, cancel, metrics), e.g. for an
/// admin endpoint or a signal handler.
#[derive(Clone)]
pub struct JobControl {
    commands: mpsc::UnboundedSender<Command>,
    metrics: Arc<JobMetrics>,
}

impl JobControl {
    async fn request(&self, dir: Option<PathBuf>, stop: bool) -> Result<PathBuf> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::Savepoint { dir, stop, reply })
            .map_err(|_| CoreError::Config("the job is no longer running".into()))?;
        rx.await
            .map_err(|_| CoreError::Config("the job ended before the savepoint completed".into()))?
    }

    /// Takes a savepoint into `dir` (self-contained) and keeps running.
    pub async fn savepoint(&self, dir: impl Into<PathBuf>) -> Result<PathBuf> {
        self.request(Some(dir.into()), false).await
    }

    /// Takes a savepoint into `dir`, then stops: sources produce nothing after its barrier and
    /// sinks commit before the job ends.
    pub async fn stop_with_savepoint(&self, dir: impl Into<PathBuf>) -> Result<PathBuf> {
        self.request(Some(dir.into()), true).await
    }

    /// Stops gracefully: a final checkpoint, its commits, then the end. Returns the checkpoint's
    /// directory.
    pub async fn stop(&self) -> Result<PathBuf> {
        self.request(None, true).await
    }

    /// Cancels at once (no final checkpoint; open transactions are left to the next start).
    pub fn cancel(&self) {
        let _ = self.commands.send(Command::Cancel);
    }

    /// Live metrics.
    pub fn metrics(&self) -> Arc<JobMetrics> {
        self.metrics.clone()
    }
}

impl std::ops::Deref for JobHandle {
    type Target = JobControl;
    fn deref(&self) -> &JobControl {
        &self.control
    }
}

impl JobHandle {
    /// A cloneable control of the job.
    pub fn control(&self) -> JobControl {
        self.control.clone()
    }

    /// Waits for the job to end.
    pub async fn join(self) -> Result<JobOutcome> {
        match self.join.await {
            Ok(r) => r,
            Err(e) => Err(CoreError::TaskLost {
                task: "job".into(),
                reason: e.to_string(),
            }),
        }
    }
}

impl Job {
    pub(crate) fn new(
        config: JobConfig,
        vertices: Vec<Vertex>,
        inputs: Vec<Arc<dyn PrepareInputs>>,
        uids: BTreeSet<String>,
        shuffles: bool,
    ) -> Result<Self> {
        config.validate()?;
        let one_parallelism = vertices.windows(2).all(|w| w[0].parallelism == w[1].parallelism);
        let regions = config.failover == FailoverStrategy::Region
            && !shuffles
            && one_parallelism
            && vertices.first().is_some_and(|v| v.parallelism > 1);
        Ok(Job {
            config,
            vertices,
            inputs,
            uids,
            metrics: Arc::new(JobMetrics::default()),
            regions,
            #[cfg(feature = "rocksdb")]
            rocksdb_memory: std::sync::OnceLock::new(),
        })
    }

    /// Starts the job on the current tokio runtime (which must be multi-threaded).
    pub fn start(self) -> JobHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        let metrics = self.metrics.clone();
        let join = tokio::spawn(self.run_with(rx));
        JobHandle {
            control: JobControl { commands: tx, metrics },
            join,
        }
    }

    /// Runs the job to its end.
    pub async fn run(self) -> Result<JobOutcome> {
        self.start().join().await
    }

    async fn run_with(self, commands: mpsc::UnboundedReceiver<Command>) -> Result<JobOutcome> {
        let storage: Option<Arc<Storage>> = self
            .config
            .checkpointing
            .as_ref()
            .map(|c| Storage::new(&c.dir).map(Arc::new))
            .transpose()?;
        let mut renewal = None;
        let result = self.run_attempts(storage.clone(), &mut renewal, commands).await;
        if let Some(r) = renewal {
            r.abort();
        }
        if let Some(s) = storage {
            // The next start, on any machine, then claims the location at once.
            match tokio::task::spawn_blocking(move || s.release_claim()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(error = %e, "Giving up the checkpoint location's claim failed."),
                Err(e) => warn!(error = %e, "Giving up the checkpoint location's claim failed."),
            }
        }
        result
    }

    /// Claims the checkpoint location once (see `storage/owner.rs`), then renews the claim in the
    /// background while the job runs.
    async fn claim(&self, storage: Option<&Arc<Storage>>, renewal: &mut Option<JoinHandle<()>>) -> Result<()> {
        let (Some(storage), Some(c), None) = (storage, &self.config.checkpointing, renewal.as_ref()) else {
            return Ok(());
        };
        let lease = c.owner_lease;
        let (s, job) = (storage.clone(), self.config.name.clone());
        tokio::task::spawn_blocking(move || s.claim(&job, lease))
            .await
            .map_err(|e| CoreError::TaskLost {
                task: "checkpoint storage".into(),
                reason: e.to_string(),
            })??;
        let s = storage.clone();
        *renewal = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(lease / 3).await;
                let s = s.clone();
                match tokio::task::spawn_blocking(move || s.renew_claim()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e @ CoreError::LocationOwned { .. })) => {
                        // The next checkpoint's commit fails on it too, and stops the job.
                        warn!(error = %e, "This run no longer owns its checkpoint location.");
                        return;
                    }
                    Ok(Err(e)) => warn!(error = %e, "Renewing the checkpoint location's claim failed; retrying."),
                    Err(e) => warn!(error = %e, "Renewing the checkpoint location's claim failed; retrying."),
                }
            }
        }));
        Ok(())
    }

    async fn run_attempts(
        &self,
        storage: Option<Arc<Storage>>,
        renewal: &mut Option<JoinHandle<()>>,
        mut commands: mpsc::UnboundedReceiver<Command>,
    ) -> Result<JobOutcome> {
        let mut tracker =
            RestartTracker::new(self.config.restart.clone()).with_startup_attempts(self.config.startup_attempts);
        let started = Instant::now();
        let mut attempt = 0u32;
        let mut last_id: CheckpointId = 0;
        let mut completed = 0u64;
        // Fixed by the first attempt that picks a snapshot; later attempts follow it.
        let mut plan: Option<RestorePlan> = None;
        // Since when attempts fail while starting (for the log).
        let mut waiting_since: Option<Instant> = None;
        loop {
            // A failure to read storage (an outage) fails this attempt like any other: the restart
            // strategy decides. A snapshot that cannot be trusted is fatal (see `restore.rs`).
            let picked = match self.claim(storage.as_ref(), renewal).await {
                Ok(()) => self.pick_restore(storage.as_deref(), &mut plan, &mut last_id),
                Err(e) => Err(e),
            };
            let (end, failed_while) = match picked {
                Err(e) => {
                    let while_ = if e.is_unavailable() {
                        FailedWhile::LocationUnreachable
                    } else {
                        FailedWhile::Starting
                    };
                    (RunEnd::Failed(e), while_)
                }
                Ok(restore) => {
                    // Restoring a checkpoint of its own location: the job ran here before, and
                    // what fails its start now is what it depends on being down.
                    if restore.is_some() && plan.as_ref().is_some_and(RestorePlan::restores_own) {
                        tracker.mark_ran_before();
                    }
                    self.run_once(
                        attempt,
                        restore,
                        storage.clone(),
                        last_id + 1,
                        plan.as_ref().expect("set by pick_restore"),
                        &mut commands,
                        &mut last_id,
                        &mut completed,
                        (&mut tracker, started),
                    )
                    .await
                }
            };
            let outcome = |cancelled, restarts| JobOutcome {
                checkpoints: completed,
                restarts,
                latest_checkpoint: self.metrics.checkpoints().latest_id,
                cancelled,
            };
            match end {
                RunEnd::Finished => return Ok(outcome(false, tracker.restarts())),
                RunEnd::Cancelled => {
                    if let (Some(s), Some(c)) = (&storage, &self.config.checkpointing) {
                        if c.retention == Retention::DeleteOnCancellation {
                            s.discard_all()?;
                        }
                    }
                    return Ok(outcome(true, tracker.restarts()));
                }
                RunEnd::Failed(error) => {
                    if error.class() == ErrorClass::Fatal {
                        return Err(error);
                    }
                    // A start that could not reach what it needs (refused, timed out, a server
                    // error; the checkpoint store not answering): an outage, for a job that ran.
                    let failed_while = match failed_while {
                        FailedWhile::Starting if error.class() == ErrorClass::Retriable || error.is_unavailable() => {
                            FailedWhile::Unreachable
                        }
                        other => other,
                    };
                    match tracker.on_failure_while(started.elapsed(), failed_while) {
                        RestartDecision::GiveUp => {
                            return Err(CoreError::RestartsExhausted {
                                restarts: tracker.restarts(),
                                last: Box::new(error),
                            })
                        }
                        RestartDecision::StartupFailed(attempts) => {
                            return Err(CoreError::StartupFailed {
                                attempts,
                                last: Box::new(error),
                            })
                        }
                        RestartDecision::Restart(delay) => {
                            self.metrics.restarts.fetch_add(1, Ordering::Relaxed);
                            if !matches!(
                                failed_while,
                                FailedWhile::Unreachable | FailedWhile::LocationUnreachable
                            ) {
                                waiting_since = None;
                                warn!(
                                    job = %self.config.name,
                                    restart = tracker.restarts(),
                                    cause = %error,
                                    delay_ms = delay.as_millis() as u64,
                                    "Job failed; restarting from the latest completed checkpoint."
                                );
                            } else {
                                let since = *waiting_since.get_or_insert_with(Instant::now);
                                warn!(
                                    job = %self.config.name,
                                    attempt = tracker.waits(),
                                    cause = %error,
                                    delay_ms = delay.as_millis() as u64,
                                    waiting_s = since.elapsed().as_secs(),
                                    "The job cannot reach what it needs to start (down?); trying again, from the latest completed checkpoint."
                                );
                            }
                            tokio::select! {
                                _ = tokio::time::sleep(delay) => {}
                                Some(Command::Cancel) = commands.recv() => return Ok(outcome(true, tracker.restarts())),
                            }
                            attempt += 1;
                        }
                    }
                }
            }
        }
    }

    /// What this attempt restores (see `restore.rs`); raises `last_id` past every stored id.
    fn pick_restore(
        &self,
        storage: Option<&Storage>,
        plan: &mut Option<RestorePlan>,
        last_id: &mut CheckpointId,
    ) -> Result<Option<Arc<Snapshot>>> {
        let chosen = match plan {
            Some(p) => p.later_job(storage)?,
            None => {
                // A first attempt tried again (an outage while it restored): the claim may have
                // lapsed meanwhile, and been taken over.
                if let Some(s) = storage {
                    s.renew_claim()?;
                }
                let (chosen, p) =
                    RestorePlan::first(storage, self.config.restore_from.as_deref(), self.config.accept_replay)?;
                *plan = Some(p);
                chosen
            }
        };
        if let Some(s) = storage {
            *last_id = (*last_id).max(s.highest_id()?);
        }
        if let Some(r) = &chosen {
            info!(job = %self.config.name, checkpoint_id = r.meta.id, kind = ?r.meta.kind, "Restoring.");
            self.metrics.update(|s| s.restored += 1);
            *last_id = (*last_id).max(r.meta.id);
        }
        if let Some(s) = &chosen {
            let unknown: Vec<String> = s
                .meta
                .operators
                .keys()
                .filter(|u| !self.uids.contains(*u))
                .cloned()
                .collect();
            if !unknown.is_empty() {
                if !self.config.allow_non_restored_state {
                    return Err(CoreError::UnknownOperatorState { uids: unknown });
                }
                warn!(uids = ?unknown, "Dropping state of operators this job does not have.");
            }
        }
        Ok(chosen.map(Arc::new))
    }

    pub(super) fn backend_factory(&self, restore: Option<Arc<Snapshot>>) -> BackendFactory {
        let config = self.config.state_backend.clone();
        #[cfg(feature = "rocksdb")]
        let job = self.config.name.clone();
        // One budget for every RocksDB instance of the job in this process (this factory is
        // made per task).
        #[cfg(feature = "rocksdb")]
        let memory = match &config {
            StateBackendConfig::RocksDb { memory_mb, .. } => Some(
                self.rocksdb_memory
                    .get_or_init(|| {
                        crate::state::RocksDbMemory::new(
                            memory_mb.unwrap_or(crate::state::DEFAULT_ROCKSDB_MEMORY_MB) << 20,
                        )
                    })
                    .clone(),
            ),
            StateBackendConfig::Memory => None,
        };
        Arc::new(move |info, restored| {
            let range = KeyGroupRange::for_subtask(info.max_parallelism, info.parallelism, info.index);
            let handles: Vec<_> = match (restored, &restore) {
                (Some(r), Some(s)) => r.keyed.iter().map(|h| (h, s.reader.as_ref())).collect(),
                _ => Vec::new(),
            };
            Ok(match &config {
                StateBackendConfig::Memory => {
                    Box::new(MemoryBackend::restore(range, &handles)?) as Box<dyn KeyedStateBackend>
                }
                #[cfg(not(feature = "rocksdb"))]
                StateBackendConfig::RocksDb { .. } => return Err(super::rocksdb_missing()),
                #[cfg(feature = "rocksdb")]
                StateBackendConfig::RocksDb { local_dir, .. } => {
                    let root = match local_dir {
                        Some(dir) => dir.clone(),
                        None => crate::private_fs::default_state_root()?.join(&job),
                    };
                    let memory = memory.as_ref().expect("made for RocksDB");
                    Box::new(RocksDbBackend::restore_in(range, &handles, &root, memory)?)
                }
            })
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_once(
        &self,
        attempt: u32,
        restore: Option<Arc<Snapshot>>,
        storage: Option<Arc<Storage>>,
        first_id: CheckpointId,
        plan: &RestorePlan,
        commands: &mut mpsc::UnboundedReceiver<Command>,
        last_id: &mut CheckpointId,
        completed: &mut u64,
        (tracker, started): (&mut RestartTracker, Instant),
    ) -> (RunEnd, FailedWhile) {
        for p in &self.inputs {
            p.prepare(self.config.channel_capacity);
        }
        let (events_tx, events) = mpsc::unbounded_channel();
        let mut controls = Vec::new();
        let mut sources = Vec::new();
        let mut places = Vec::new();
        let mut set = JoinSet::new();
        let mut tokio_ids = BTreeMap::new();
        let proof = plan
            .fallback
            .as_ref()
            .map(|f| Arc::new(super::api::RestoreProof::new(f.unusable, f.error.clone())));
        let spawner = Spawner {
            job: self,
            storage: storage.clone(),
            events: events_tx.clone(),
            proof,
        };
        for (vi, v) in self.vertices.iter().enumerate() {
            for index in 0..v.parallelism {
                if self.config.subtasks.is_some_and(|r| !r.contains(index)) {
                    continue;
                }
                let id = controls.len();
                let ctl_tx = match spawner.spawn(
                    &mut set,
                    vi,
                    index,
                    id,
                    (attempt, !tracker.has_started()),
                    restore.clone(),
                ) {
                    Ok((tx, tokio_id)) => {
                        tokio_ids.insert(tokio_id, id);
                        tx
                    }
                    Err(e) => return (RunEnd::Failed(e), FailedWhile::Starting),
                };
                controls.push(ctl_tx);
                sources.push(v.is_source);
                places.push((vi, index));
            }
        }
        drop(events_tx);
        if let Some(p) = &spawner.proof {
            p.all_made();
        }
        let mut run = Run {
            job: self,
            spawner,
            places,
            tokio_ids,
            tracker,
            started,
            attempt,
            region_restarts: 0,
            storage,
            plan,
            coordinator: self
                .config
                .checkpointing
                .as_ref()
                .map(|c| CheckpointCoordinator::new(c, controls.len(), first_id, Instant::now())),
            controls,
            sources,
            opened: BTreeSet::new(),
            ended: BTreeSet::new(),
            waiters: BTreeMap::new(),
            shutdown_after: None,
            shutting_down: false,
            completed,
            last_id,
            triggered: None,
            caught_up: BTreeMap::new(),
            held: false,
            retry_held: None,
            aborts: None,
        };
        let end = run.drive(&mut set, events, commands).await;
        let failed_while = if run.opened.len() == run.controls.len() {
            FailedWhile::Running
        } else {
            FailedWhile::Starting
        };
        if !matches!(end, RunEnd::Finished) {
            run.shutdown();
            // Tasks get `shutdown_timeout` to close; then they are aborted, which ends them at
            // their next await. One stuck in a blocking client call (a librdkafka call or
            // destructor waiting on a broker) cannot be aborted: after a further
            // STUCK_TASK_GRACE it is left behind (detached) so the job restarts instead of
            // hanging. It can do no harm: its channels are closed, it receives no further
            // barrier or completion, and the restart fences its transactional producers.
            let deadline = tokio::time::sleep(self.config.shutdown_timeout);
            tokio::pin!(deadline);
            let mut aborted = false;
            let give_up = tokio::time::sleep(self.config.shutdown_timeout + STUCK_TASK_GRACE);
            tokio::pin!(give_up);
            loop {
                tokio::select! {
                    r = set.join_next() => if r.is_none() { break },
                    _ = &mut deadline, if !aborted => {
                        aborted = true;
                        warn!(tasks = set.len(), timeout_ms = self.config.shutdown_timeout.as_millis() as u64, "Tasks did not stop in time; aborting them.");
                        set.abort_all();
                    }
                    _ = &mut give_up => {
                        error!(tasks = set.len(), "Tasks are stuck in blocking calls; leaving them behind and going on.");
                        set.detach_all();
                        break;
                    }
                }
            }
        }
        for (_, w) in std::mem::take(&mut run.waiters) {
            let _ = w.reply.send(Err(CoreError::Config(
                "the job run ended before the savepoint completed".into(),
            )));
        }
        (end, failed_while)
    }
}

/// How long tasks aborted at a stop may take to end before they are left behind.
pub(super) const STUCK_TASK_GRACE: Duration = Duration::from_secs(10);
