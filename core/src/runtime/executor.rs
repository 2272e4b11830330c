//! Running a job: one run (attempt) spawns every task and coordinates checkpoints; a failed run
//! is restarted from the latest completed checkpoint as the restart strategy allows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

use super::chain::{BackendFactory, Notification};
use super::graph::{PrepareInputs, Vertex};
use super::metrics::JobMetrics;
use super::restore::RestorePlan;
use super::task::{Control, TaskContext, TaskEvent};
use super::{FailoverStrategy, JobConfig, StateBackendConfig};
use crate::coordinator::{Acknowledged, CheckpointConfig, CheckpointCoordinator, PendingCheckpoint};
use crate::error::{CoreError, ErrorClass, Result};
use crate::message::{CheckpointBarrier, CheckpointId, SnapshotKind};
use crate::restart::{RestartDecision, RestartTracker};
use crate::state::{KeyGroupRange, KeyedStateBackend, MemoryBackend, RocksDbBackend};
use crate::storage::{CheckpointStorage, Retention, Snapshot, Storage};

/// A built job, ready to run.
pub struct Job {
    config: JobConfig,
    vertices: Vec<Vertex>,
    inputs: Vec<Arc<dyn PrepareInputs>>,
    uids: BTreeSet<String>,
    metrics: Arc<JobMetrics>,
    /// Region failover applies: subtask i of every stage is region i.
    regions: bool,
}

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

enum Command {
    Savepoint {
        dir: Option<PathBuf>,
        stop: bool,
        reply: oneshot::Sender<Result<PathBuf>>,
    },
    Cancel,
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

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

enum RunEnd {
    Finished,
    Cancelled,
    Failed(CoreError),
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

    async fn run_with(self, mut commands: mpsc::UnboundedReceiver<Command>) -> Result<JobOutcome> {
        let storage: Option<Arc<Storage>> = self
            .config
            .checkpointing
            .as_ref()
            .map(|c| Storage::new(&c.dir).map(Arc::new))
            .transpose()?;
        let mut tracker =
            RestartTracker::new(self.config.restart.clone()).with_startup_attempts(self.config.startup_attempts);
        let started = Instant::now();
        let mut attempt = 0u32;
        let mut last_id: CheckpointId = 0;
        let mut completed = 0u64;
        // Fixed by the first attempt that picks a snapshot; later attempts follow it.
        let mut plan: Option<RestorePlan> = None;
        loop {
            // A failure to read storage (an outage) fails this attempt like any other: the restart
            // strategy decides. A snapshot that cannot be trusted is fatal (see `restore.rs`).
            let end = match self.pick_restore(storage.as_deref(), &mut plan, &mut last_id) {
                Err(e) => RunEnd::Failed(e),
                Ok(restore) => {
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
                    match tracker.on_failure(started.elapsed()) {
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
                            warn!(
                                job = %self.config.name,
                                restart = tracker.restarts(),
                                cause = %error,
                                delay_ms = delay.as_millis() as u64,
                                "Job failed; restarting from the latest completed checkpoint."
                            );
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
            Some(p) => p.later(storage)?,
            None => {
                let (chosen, p) =
                    RestorePlan::first(storage, self.config.restore_from.as_deref(), self.config.accept_replay)?;
                *plan = Some(p);
                chosen
            }
        };
        if let Some(s) = storage {
            *last_id = (*last_id).max(s.completed()?.last().copied().unwrap_or(0));
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

    fn backend_factory(&self, restore: Option<Arc<Snapshot>>) -> BackendFactory {
        let config = self.config.state_backend.clone();
        let job = self.config.name.clone();
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
                StateBackendConfig::RocksDb { local_dir } => {
                    let root = local_dir
                        .clone()
                        .unwrap_or_else(|| std::env::temp_dir().join("exactly-state").join(&job));
                    Box::new(RocksDbBackend::restore(range, &handles, &root)?)
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
    ) -> RunEnd {
        for p in &self.inputs {
            p.prepare(self.config.channel_capacity);
        }
        let (events_tx, events) = mpsc::unbounded_channel();
        let mut controls = Vec::new();
        let mut sources = Vec::new();
        let mut places = Vec::new();
        let mut set = JoinSet::new();
        let mut tokio_ids = BTreeMap::new();
        let spawner = Spawner {
            job: self,
            storage: storage.clone(),
            events: events_tx.clone(),
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
                    Err(e) => return RunEnd::Failed(e),
                };
                controls.push(ctl_tx);
                sources.push(v.is_source);
                places.push((vi, index));
            }
        }
        drop(events_tx);
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
            ended: BTreeSet::new(),
            waiters: BTreeMap::new(),
            shutdown_after: None,
            shutting_down: false,
            completed,
            last_id,
        };
        let end = run.drive(&mut set, events, commands).await;
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
        end
    }
}

/// How long tasks aborted at a stop may take to end before they are left behind.
const STUCK_TASK_GRACE: Duration = Duration::from_secs(10);

/// Creates tasks: all of them at the start of a run, a region's again after its failure.
struct Spawner<'a> {
    job: &'a Job,
    storage: Option<Arc<Storage>>,
    events: mpsc::UnboundedSender<TaskEvent>,
}

impl Spawner<'_> {
    /// Spawns subtask `index` of vertex `vi` as task `id`; returns its control sender.
    fn spawn(
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
            backend: job.backend_factory(restore.clone()),
            restore,
            storage: self.storage.clone().map(|s| s as Arc<dyn CheckpointStorage>),
            alignment,
            max_alignment_buffer,
            max_alignment_bytes,
            control: Some(ctl_rx),
            events: self.events.clone(),
        };
        let body = (v.make)(&mut ctx)?;
        let handle = set.spawn(async move { (id, body.await) });
        Ok((ctl_tx, handle.id()))
    }
}

struct Waiter {
    dir: Option<PathBuf>,
    reply: oneshot::Sender<Result<PathBuf>>,
}

/// The coordinator side of one run.
struct Run<'a> {
    job: &'a Job,
    spawner: Spawner<'a>,
    /// (vertex, subtask index) of every task.
    places: Vec<(usize, u32)>,
    /// Our task id of every tokio task (to place a panic).
    tokio_ids: BTreeMap<tokio::task::Id, usize>,
    tracker: &'a mut RestartTracker,
    started: Instant,
    attempt: u32,
    region_restarts: u32,
    storage: Option<Arc<Storage>>,
    plan: &'a RestorePlan,
    coordinator: Option<CheckpointCoordinator>,
    controls: Vec<mpsc::UnboundedSender<Control>>,
    sources: Vec<bool>,
    ended: BTreeSet<usize>,
    waiters: BTreeMap<CheckpointId, Waiter>,
    /// Shut down once this checkpoint is complete and notified (final checkpoint, stop).
    shutdown_after: Option<CheckpointId>,
    shutting_down: bool,
    completed: &'a mut u64,
    last_id: &'a mut CheckpointId,
}

impl Run<'_> {
    fn config(&self) -> Option<&CheckpointConfig> {
        self.job.config.checkpointing.as_ref()
    }

    fn broadcast(&self, c: Control) {
        for tx in &self.controls {
            let _ = tx.send(c);
        }
    }

    fn shutdown(&mut self) {
        self.shutting_down = true;
        self.broadcast(Control::Shutdown);
    }

    async fn drive(
        &mut self,
        set: &mut JoinSet<(usize, Result<()>)>,
        mut events: mpsc::UnboundedReceiver<TaskEvent>,
        commands: &mut mpsc::UnboundedReceiver<Command>,
    ) -> RunEnd {
        let tasks = self.controls.len();
        let mut finished = 0usize;
        loop {
            let wake = self.next_wake();
            tokio::select! {
                joined = set.join_next() => match joined {
                    None => return RunEnd::Finished,
                    Some(Ok((_, Ok(())))) => {
                        finished += 1;
                        if !self.shutting_down {
                            return RunEnd::Failed(CoreError::TaskLost { task: "a task".into(), reason: "ended before the job did".into() });
                        }
                        if finished == tasks {
                            return RunEnd::Finished;
                        }
                    }
                    Some(Ok((task, Err(e)))) => {
                        warn!(task, error = %e, "Task failed.");
                        if let Err(end) = self.restart_region(set, task, e).await {
                            return end;
                        }
                    }
                    Some(Err(e)) => {
                        let task = self.tokio_ids.get(&e.id()).copied();
                        let error = CoreError::TaskLost { task: "a task".into(), reason: e.to_string() };
                        match task {
                            Some(task) => {
                                if let Err(end) = self.restart_region(set, task, error).await {
                                    return end;
                                }
                            }
                            None => return RunEnd::Failed(error),
                        }
                    }
                },
                Some(event) = events.recv() => {
                    if let Err(e) = self.on_event(event).await {
                        return RunEnd::Failed(e);
                    }
                }
                Some(cmd) = commands.recv(), if !self.shutting_down => match cmd {
                    Command::Cancel => {
                        info!(job = %self.job.config.name, "Cancelling.");
                        self.shutdown();
                        while set.join_next().await.is_some() {}
                        return RunEnd::Cancelled;
                    }
                    Command::Savepoint { dir, stop, reply } => {
                        if self.coordinator.is_none() {
                            let _ = reply.send(Err(CoreError::Config(
                                "checkpointing is disabled for this job: savepoints need it".into(),
                            )));
                            continue;
                        }
                        let kind = if dir.is_some() { SnapshotKind::Savepoint } else { SnapshotKind::Checkpoint };
                        let id = self.trigger(kind, stop);
                        self.waiters.insert(id, Waiter { dir, reply });
                        if stop {
                            self.shutdown_after = Some(id);
                        }
                    }
                },
                _ = tokio::time::sleep_until(wake.into()) => {
                    if let Err(e) = self.on_timer().await {
                        return RunEnd::Failed(e);
                    }
                }
            }
        }
    }

    /// After task `task` failed with `error`: restarts its region (region failover), or returns
    /// how the run ends (full restart, or giving up). Regions whose tasks fail while this one
    /// stops or waits for its restart delay (an outage of a shared service fails them all) join
    /// it: they restart together, as one restart of the restart strategy, from one restore.
    async fn restart_region(
        &mut self,
        set: &mut JoinSet<(usize, Result<()>)>,
        task: usize,
        error: CoreError,
    ) -> std::result::Result<(), RunEnd> {
        if !self.job.regions
            || error.class() == ErrorClass::Fatal
            || self.shutting_down
            || self.shutdown_after.is_some()
            || !self.waiters.is_empty()
        {
            return Err(RunEnd::Failed(error));
        }
        let region = self.places[task].1;
        let delay = match self.tracker.on_failure(self.started.elapsed()) {
            RestartDecision::GiveUp => {
                return Err(RunEnd::Failed(CoreError::RestartsExhausted {
                    restarts: self.tracker.restarts(),
                    last: Box::new(error),
                }))
            }
            RestartDecision::StartupFailed(attempts) => {
                return Err(RunEnd::Failed(CoreError::StartupFailed {
                    attempts,
                    last: Box::new(error),
                }))
            }
            RestartDecision::Restart(delay) => delay,
        };
        self.job.metrics.restarts.fetch_add(1, Ordering::Relaxed);
        self.region_restarts += 1;
        warn!(
            job = %self.job.config.name,
            region,
            restart = self.tracker.restarts(),
            cause = %error,
            delay_ms = delay.as_millis() as u64,
            "Task failed; restarting its region (subtask {region} of every stage) from the latest completed checkpoint."
        );
        // Checkpoints in flight cannot complete without the region: abort them (not counted as
        // checkpoint failures).
        let declined: Vec<CheckpointId> = match self.coordinator.as_mut() {
            Some(c) => {
                let ids: Vec<CheckpointId> = c.pending().map(|p| p.barrier.id).collect();
                ids.into_iter().filter(|id| c.decline(*id).is_some()).collect()
            }
            None => Vec::new(),
        };
        for id in declined {
            self.broadcast(Control::Notify(Notification::Aborted(id)));
            if let Some(s) = self.storage.clone() {
                let _ = tokio::task::spawn_blocking(move || s.abort(id)).await;
            }
        }
        // Stop the failed regions' other tasks, wait for every one of them to be gone and for the
        // restart delay; a failure elsewhere meanwhile adds its region.
        let mut regions: BTreeSet<u32> = BTreeSet::new();
        let mut members: BTreeSet<usize> = BTreeSet::new();
        let mut gone: BTreeSet<usize> = BTreeSet::from([task]);
        self.add_region(region, &mut regions, &mut members);
        let deadline = tokio::time::sleep(self.job.config.shutdown_timeout);
        tokio::pin!(deadline);
        let waited = tokio::time::sleep(delay);
        tokio::pin!(waited);
        let mut delay_over = false;
        while gone.len() < members.len() || !delay_over {
            let failed: Option<(usize, CoreError)> = tokio::select! {
                joined = set.join_next(), if gone.len() < members.len() || !set.is_empty() => match joined {
                    None => { gone.extend(members.iter().copied()); None }
                    Some(Ok((t, _))) if members.contains(&t) => { gone.insert(t); None }
                    Some(Err(e)) if self.tokio_ids.get(&e.id()).is_some_and(|t| members.contains(t)) => {
                        gone.insert(self.tokio_ids[&e.id()]);
                        None
                    }
                    Some(Ok((t, Err(e)))) => Some((t, e)),
                    Some(Ok((_, Ok(())))) => {
                        return Err(RunEnd::Failed(CoreError::TaskLost { task: "a task".into(), reason: "ended during a region restart".into() }));
                    }
                    Some(Err(e)) => match self.tokio_ids.get(&e.id()).copied() {
                        Some(t) => Some((t, CoreError::TaskLost { task: "a task".into(), reason: e.to_string() })),
                        None => return Err(RunEnd::Failed(CoreError::TaskLost { task: "a task".into(), reason: e.to_string() })),
                    },
                },
                _ = &mut deadline, if gone.len() < members.len() => {
                    return Err(RunEnd::Failed(CoreError::TaskLost { task: format!("regions {regions:?}"), reason: "did not stop in time for their restart".into() }));
                }
                _ = &mut waited, if !delay_over => { delay_over = true; None }
            };
            if let Some((t, e)) = failed {
                if e.class() == ErrorClass::Fatal {
                    return Err(RunEnd::Failed(e));
                }
                let other = self.places[t].1;
                warn!(job = %self.job.config.name, region = other, cause = %e, "Task failed; its region restarts together with the others failing now.");
                self.add_region(other, &mut regions, &mut members);
                gone.insert(t);
            }
        }
        let restore = match self.plan.later_blocking(self.storage.clone()).await {
            Ok(r) => r.map(Arc::new),
            Err(e) => return Err(RunEnd::Failed(e)),
        };
        if let Some(r) = &restore {
            info!(regions = ?regions, checkpoint_id = r.meta.id, "Restoring the regions.");
            self.job.metrics.update(|s| s.restored += 1);
        }
        for region in &regions {
            for p in &self.job.inputs {
                p.prepare_one(self.job.config.channel_capacity, *region);
            }
        }
        // Upstream tasks before downstream ones, as at the start of a run (task ids follow the
        // stages' order).
        for t in members {
            let (vi, index) = self.places[t];
            match self.spawner.spawn(
                set,
                vi,
                index,
                t,
                (self.attempt + self.region_restarts, !self.tracker.has_started()),
                restore.clone(),
            ) {
                Ok((tx, tokio_id)) => {
                    self.controls[t] = tx;
                    self.tokio_ids.insert(tokio_id, t);
                    self.ended.remove(&t);
                }
                Err(e) => return Err(RunEnd::Failed(e)),
            }
        }
        Ok(())
    }

    /// Adds `region` to a restart: its tasks become members and are told to stop.
    fn add_region(&self, region: u32, regions: &mut BTreeSet<u32>, members: &mut BTreeSet<usize>) {
        if !regions.insert(region) {
            return;
        }
        for t in (0..self.places.len()).filter(|t| self.places[*t].1 == region) {
            members.insert(t);
            let _ = self.controls[t].send(Control::Shutdown);
        }
    }

    fn next_wake(&self) -> Instant {
        let soon = Instant::now() + Duration::from_millis(100);
        match &self.coordinator {
            Some(c) => c.next_due().min(soon),
            None => soon,
        }
    }

    /// Starts a checkpoint: barriers at live sources, direct snapshots at ended tasks.
    fn trigger(&mut self, kind: SnapshotKind, stop: bool) -> CheckpointId {
        let coordinator = self.coordinator.as_mut().expect("checkpointing on");
        let barrier = coordinator.trigger(Instant::now(), kind, now_ms());
        *self.last_id = barrier.id;
        for (task, tx) in self.controls.iter().enumerate() {
            let c = if self.ended.contains(&task) {
                Control::SnapshotIfEnded(barrier)
            } else if self.sources[task] {
                Control::Trigger { barrier, stop }
            } else {
                continue;
            };
            let _ = tx.send(c);
        }
        barrier.id
    }

    async fn on_timer(&mut self) -> Result<()> {
        let Some(c) = self.coordinator.as_mut() else {
            return Ok(());
        };
        let now = Instant::now();
        for b in c.expired(now) {
            self.abort(b, "timed out").await?;
        }
        let c = self.coordinator.as_ref().expect("checked");
        if !self.shutting_down && self.shutdown_after.is_none() && self.ended.len() < self.controls.len() && c.due(now)
        {
            self.trigger(SnapshotKind::Checkpoint, false);
        }
        Ok(())
    }

    async fn on_event(&mut self, event: TaskEvent) -> Result<()> {
        match event {
            TaskEvent::Ack { task, id, snapshot } => {
                let Some(c) = self.coordinator.as_mut() else {
                    return Ok(());
                };
                if let Acknowledged::AllAcknowledged(p) = c.acknowledge(id, task, snapshot) {
                    self.complete(p).await?;
                }
            }
            TaskEvent::Decline { id, reason, task } => {
                let Some(c) = self.coordinator.as_mut() else {
                    return Ok(());
                };
                if let Some(b) = c.decline(id) {
                    warn!(checkpoint_id = id, task, %reason, "Checkpoint declined.");
                    self.abort(b, &reason).await?;
                }
            }
            TaskEvent::Ended { task } => {
                self.ended.insert(task);
                // A source was sent every pending checkpoint's trigger while it was live and
                // snapshots it from its queue, ended or not; asking again would snapshot twice
                // (and a sink chained to it would restage the checkpoint empty). Other tasks
                // acknowledge each barrier before their end: what they lack never reached them.
                if let (Some(c), false) = (&self.coordinator, self.sources[task]) {
                    for p in c.pending() {
                        if !p.acknowledged_by(task) {
                            let _ = self.controls[task].send(Control::SnapshotIfEnded(p.barrier));
                        }
                    }
                }
                if self.ended.len() == self.controls.len() && self.shutdown_after.is_none() {
                    if self.coordinator.is_some() {
                        // Final checkpoint: every task snapshots its end state; sinks commit on completion.
                        let id = self.trigger(SnapshotKind::Checkpoint, false);
                        self.shutdown_after = Some(id);
                    } else {
                        self.shutdown();
                    }
                }
            }
        }
        Ok(())
    }

    async fn complete(&mut self, p: PendingCheckpoint) -> Result<()> {
        let barrier = p.barrier;
        let duration = p.started.elapsed();
        let alignment = p.max_alignment();
        let storage = self.storage.clone().expect("checkpointing on");
        let meta = p.into_metadata(&self.job.config.name, now_ms())?;
        let size = meta.state_size();
        let persisted = {
            let storage = storage.clone();
            let meta = meta.clone();
            tokio::task::spawn_blocking(move || storage.commit(&meta))
                .await
                .unwrap_or_else(|e| {
                    Err(CoreError::TaskLost {
                        task: "storage".into(),
                        reason: e.to_string(),
                    })
                })
        };
        if let Err(e) = persisted {
            warn!(checkpoint_id = barrier.id, error = %e, "Writing checkpoint metadata failed.");
            return self.abort(barrier, &format!("not persisted: {e}")).await;
        }
        let coordinator = self.coordinator.as_mut().expect("checkpointing on");
        let subsumed = coordinator.completed(barrier.id, Instant::now());
        *self.completed += 1;
        self.tracker.mark_started();
        info!(
            checkpoint_id = barrier.id,
            duration_ms = duration.as_millis() as u64,
            alignment_ms = alignment.as_millis() as u64,
            state_bytes = size,
            "Checkpoint complete."
        );
        self.job.metrics.update(|s| {
            s.completed += 1;
            s.latest_id = Some(barrier.id);
            if s.durations.len() >= 10_000 {
                s.durations.remove(0);
            }
            s.durations.push(duration);
            s.last_alignment = alignment;
            s.last_state_size = size;
        });
        for b in subsumed {
            self.broadcast(Control::Notify(Notification::Aborted(b.id)));
            self.discard_files(b.id);
        }
        crate::failpoint::hit("checkpoint.after_durable");
        // Durable first, then notify: sinks commit on this.
        self.broadcast(Control::Notify(Notification::Complete(barrier.id)));
        if let Some(keep) = self.config().map(|c| c.retained) {
            let s = storage.clone();
            match tokio::task::spawn_blocking(move || s.retain(keep)).await {
                Ok(Err(e)) => warn!(error = %e, "Deleting old checkpoints failed."),
                Err(e) => warn!(error = %e, "Deleting old checkpoints failed."),
                Ok(Ok(_)) => {}
            }
        }
        if let Some(w) = self.waiters.remove(&barrier.id) {
            let is_savepoint = w.dir.is_some();
            let result = match w.dir {
                Some(dir) => {
                    let s = storage.clone();
                    let out = dir.join(format!("savepoint-{}", barrier.id));
                    let out2 = out.clone();
                    tokio::task::spawn_blocking(move || s.export(barrier.id, &out2))
                        .await
                        .unwrap_or_else(|e| {
                            Err(CoreError::TaskLost {
                                task: "storage".into(),
                                reason: e.to_string(),
                            })
                        })
                        .map(|()| out)
                }
                None => Ok(storage.checkpoint_dir(barrier.id)),
            };
            if let Ok(path) = &result {
                let what = if is_savepoint {
                    "Savepoint written."
                } else {
                    "Requested checkpoint complete."
                };
                info!(checkpoint_id = barrier.id, path = %path.display(), "{what}");
            }
            let _ = w.reply.send(result);
        }
        if self.shutdown_after == Some(barrier.id) {
            self.shutdown();
        }
        Ok(())
    }

    /// Deletes what aborted checkpoint `id` wrote, in the background: the coordinator goes on
    /// triggering checkpoints while a slow or failing store (an object store coming back from an
    /// outage) takes its time. Best effort: what stays behind is never listed (it has no metadata).
    fn discard_files(&self, id: CheckpointId) {
        if let Some(s) = self.storage.clone() {
            tokio::task::spawn_blocking(move || {
                if let Err(e) = s.abort(id) {
                    debug!(checkpoint_id = id, error = %e, "Deleting an aborted checkpoint's files failed.");
                }
            });
        }
    }

    async fn abort(&mut self, barrier: CheckpointBarrier, reason: &str) -> Result<()> {
        warn!(checkpoint_id = barrier.id, %reason, "Checkpoint aborted.");
        self.broadcast(Control::Notify(Notification::Aborted(barrier.id)));
        self.discard_files(barrier.id);
        self.job.metrics.update(|s| s.failed += 1);
        if let Some(w) = self.waiters.remove(&barrier.id) {
            let _ = w.reply.send(Err(CoreError::CheckpointAborted {
                id: barrier.id,
                reason: reason.to_owned(),
            }));
        }
        if self.shutdown_after == Some(barrier.id) {
            // Sources stopped after this barrier: only a restart resumes them.
            return Err(CoreError::CheckpointAborted {
                id: barrier.id,
                reason: reason.to_owned(),
            });
        }
        let c = self.coordinator.as_mut().expect("checkpointing on");
        c.failed(Instant::now())
    }
}
