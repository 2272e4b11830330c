//! The coordinator side of one run: the loop that drives tasks and checkpoints (trigger,
//! acknowledge, complete, abort), makes checkpoints durable, notifies completion and writes
//! savepoints. Region failover is in `region.rs`; the restart loop around runs in `executor.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use super::job::{now_ms, Command, Job, RunEnd, Spawner};
use super::output::Notification;
use super::restore::RestorePlan;
use super::task::{CaughtUp, Control, TaskEvent};
use crate::coordinator::{Acknowledged, CheckpointConfig, CheckpointCoordinator, PendingCheckpoint, WhenCaughtUp};
use crate::error::{CoreError, Result};
use crate::message::{CheckpointBarrier, CheckpointId, SnapshotKind};
use crate::restart::RestartTracker;
use crate::storage::{CheckpointStorage, FailedCommit, Storage};

pub(super) struct Waiter {
    pub(super) dir: Option<PathBuf>,
    pub(super) reply: oneshot::Sender<Result<PathBuf>>,
}

/// The coordinator side of one run.
pub(super) struct Run<'a> {
    pub(super) job: &'a Job,
    pub(super) spawner: Spawner<'a>,
    /// (vertex, subtask index) of every task.
    pub(super) places: Vec<(usize, u32)>,
    /// Our task id of every tokio task (to place a panic).
    pub(super) tokio_ids: BTreeMap<tokio::task::Id, usize>,
    pub(super) tracker: &'a mut RestartTracker,
    pub(super) started: Instant,
    pub(super) attempt: u32,
    pub(super) region_restarts: u32,
    pub(super) storage: Option<Arc<Storage>>,
    pub(super) plan: &'a RestorePlan,
    pub(super) coordinator: Option<CheckpointCoordinator>,
    pub(super) controls: Vec<mpsc::UnboundedSender<Control>>,
    pub(super) sources: Vec<bool>,
    /// Tasks that started (`TaskEvent::Opened`) in this run.
    pub(super) opened: BTreeSet<usize>,
    pub(super) ended: BTreeSet<usize>,
    pub(super) waiters: BTreeMap<CheckpointId, Waiter>,
    /// Shut down once this checkpoint is complete and notified (final checkpoint, stop).
    pub(super) shutdown_after: Option<CheckpointId>,
    pub(super) shutting_down: bool,
    pub(super) completed: &'a mut u64,
    pub(super) last_id: &'a mut CheckpointId,
    /// The latest checkpoint triggered in this run, and the sources that caught up with their
    /// input since its barrier (with what they read before): `when_caught_up`.
    pub(super) triggered: Option<CheckpointId>,
    pub(super) caught_up: BTreeMap<usize, CaughtUp>,
    /// Some source is held until a checkpoint completes (`TaskEvent::Held`; every completion
    /// releases them all), and when to try again after a checkpoint failed while one was: it
    /// reads nothing until one completes, so the next is not left to the interval.
    pub(super) held: bool,
    pub(super) retry_held: Option<Instant>,
    /// Checkpoints aborted since the last completed one, for the same reason in a row: the
    /// first is said at WARN, the rest at debug, and how many when one completes again (an
    /// outage of a sink's system would otherwise say it once per interval).
    pub(super) aborts: Option<Aborts>,
}

/// Checkpoints aborted in a row for one reason (`Run::aborts`).
pub(super) struct Aborts {
    first: CheckpointId,
    since: Instant,
    last_said: Instant,
    reason: String,
    more: u64,
}

/// While checkpoints keep aborting for one reason, it is said again this often.
const ABORTS_REMIND: Duration = Duration::from_secs(300);

/// How soon a checkpoint is tried again after one failed while sources were held (at most: the
/// interval, when it is shorter, comes first).
const HELD_RETRY: Duration = Duration::from_secs(1);

impl Run<'_> {
    pub(super) fn config(&self) -> Option<&CheckpointConfig> {
        self.job.config.checkpointing.as_ref()
    }

    pub(super) fn broadcast(&self, c: Control) {
        for tx in &self.controls {
            let _ = tx.send(c);
        }
    }

    pub(super) fn shutdown(&mut self) {
        self.shutting_down = true;
        self.broadcast(Control::Shutdown);
    }

    pub(super) async fn drive(
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

    pub(super) fn next_wake(&self) -> Instant {
        let soon = Instant::now() + Duration::from_millis(100);
        let Some(c) = &self.coordinator else {
            return soon;
        };
        let early = self.caught_up().then(|| c.next_due_early()).flatten();
        [c.next_due(), early, self.retry_held]
            .into_iter()
            .flatten()
            .fold(soon, Instant::min)
    }

    /// Whether every live source caught up with its input since the latest barrier, some after
    /// reading records (so a checkpoint now commits them) — and, by default, some after reading
    /// a backlog for a tenth of the interval: `when_caught_up`.
    fn caught_up(&self) -> bool {
        let Some(c) = self.config() else {
            return false;
        };
        let worth_it = match c.when_caught_up {
            WhenCaughtUp::Never => return false,
            WhenCaughtUp::AfterBacklog => {
                let long = c.interval / 10;
                self.caught_up.values().any(|u| u.read && u.backlog >= long)
            }
            WhenCaughtUp::Always => self.caught_up.values().any(|u| u.read),
        };
        worth_it
            && (0..self.controls.len())
                .filter(|t| self.sources[*t] && !self.ended.contains(t))
                .all(|t| self.caught_up.contains_key(&t))
    }

    /// Starts a checkpoint: barriers at live sources, direct snapshots at ended tasks.
    pub(super) fn trigger(&mut self, kind: SnapshotKind, stop: bool) -> CheckpointId {
        let coordinator = self.coordinator.as_mut().expect("checkpointing on");
        let barrier = coordinator.trigger(Instant::now(), kind, now_ms());
        *self.last_id = barrier.id;
        self.triggered = Some(barrier.id);
        self.caught_up.clear();
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

    pub(super) async fn on_timer(&mut self) -> Result<()> {
        let Some(c) = self.coordinator.as_mut() else {
            return Ok(());
        };
        let now = Instant::now();
        for b in c.expired(now) {
            self.abort(b, "timed out").await?;
        }
        let c = self.coordinator.as_ref().expect("checked");
        if self.shutting_down || self.shutdown_after.is_some() || self.ended.len() == self.controls.len() {
            return Ok(());
        }
        if c.due(now) {
            self.trigger(SnapshotKind::Checkpoint, false);
        } else if self.retry_held.is_some_and(|t| now >= t) && c.pending().next().is_none() {
            debug!(
                checkpoint_id = c.next_id(),
                "Sources still wait for a first completed checkpoint: checkpointing again."
            );
            self.retry_held = None;
            self.trigger(SnapshotKind::Checkpoint, false);
        } else if self.caught_up() && c.due_early(now) {
            debug!(
                checkpoint_id = c.next_id(),
                "Every source caught up: checkpointing before the interval."
            );
            self.trigger(SnapshotKind::Checkpoint, false);
        }
        Ok(())
    }

    pub(super) async fn on_event(&mut self, event: TaskEvent) -> Result<()> {
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
            TaskEvent::CaughtUp { task, after, caught } => {
                if after == self.triggered {
                    self.caught_up.insert(task, caught);
                    if self.caught_up() {
                        self.on_timer().await?;
                    }
                }
            }
            TaskEvent::Held { task } => {
                self.held = true;
                // Its first checkpoint now, not after the interval; one in flight serves too (a
                // failed one is tried again within `HELD_RETRY` while sources are held).
                let idle = self.coordinator.as_ref().is_some_and(|c| c.pending().next().is_none());
                if idle && !self.shutting_down && self.shutdown_after.is_none() {
                    debug!(
                        task,
                        "A source reads once a checkpoint has recorded where it starts: checkpointing now."
                    );
                    self.trigger(SnapshotKind::Checkpoint, false);
                }
            }
            TaskEvent::Opened { task } => {
                self.opened.insert(task);
                if self.opened.len() == self.controls.len() {
                    self.settle_fallback().await?;
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

    /// Once every task started in a run that restored past checkpoints it cannot read: every
    /// sink subtask must have proved that none of its transactions after the restored checkpoint
    /// committed, or the job stops; then those checkpoints are set aside (before any new one
    /// completes: every task starts before it acknowledges one).
    async fn settle_fallback(&mut self) -> Result<()> {
        let (Some(proof), Some(fallback)) = (self.spawner.proof.take(), self.plan.fallback.as_ref()) else {
            return Ok(());
        };
        let expected = proof.expected.load(std::sync::atomic::Ordering::SeqCst);
        let proved = proof.proved.load(std::sync::atomic::Ordering::SeqCst);
        if expected > 0 && !proof.all_proved() {
            return Err(CoreError::FallbackNotProven {
                unusable: fallback.error.clone(),
                restored: fallback.restored,
                unproven: expected - proved,
                sinks: expected,
            });
        }
        let storage = self.storage.clone().expect("a fallback restores from storage");
        let kept = fallback.restored;
        let set_aside = tokio::task::spawn_blocking(move || storage.set_aside_newer_than(kept))
            .await
            .map_err(|e| CoreError::TaskLost {
                task: "checkpoint storage".into(),
                reason: e.to_string(),
            })??;
        warn!(
            restored = fallback.restored,
            set_aside = ?set_aside,
            sink_subtasks = expected,
            "Restored the newest readable checkpoint: every sink showed that none of its transactions after it committed. The unreadable newer ones are set aside (their metadata kept as _metadata.unusable)."
        );
        Ok(())
    }

    pub(super) async fn complete(&mut self, p: PendingCheckpoint) -> Result<()> {
        let barrier = p.barrier;
        let duration = p.started.elapsed();
        let alignment = p.max_alignment();
        let written = p.written();
        let storage = self.storage.clone().expect("checkpointing on");
        let meta = p.into_metadata(&self.job.config.name, now_ms())?;
        let size = meta.state_size();
        let persist_started = Instant::now();
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
            return match crate::storage::after_failed_commit(&e) {
                // Its transactions stay pending as for any failed checkpoint: the next completed
                // checkpoint commits them, or a restore of this one if it landed. The run goes on:
                // a restart could not settle more while the store is down.
                FailedCommit::KeepFiles => self.abort_keeping_files(barrier, &format!("not persisted: {e}")).await,
                FailedCommit::Discard => self.abort(barrier, &format!("not persisted: {e}")).await,
                FailedCommit::RunEnds => {
                    warn!(
                        checkpoint_id = barrier.id,
                        "The checkpoint location was taken over; the run ends."
                    );
                    self.broadcast(Control::Notify(Notification::Aborted(barrier.id)));
                    self.job.metrics.update(|s| s.failed += 1);
                    if let Some(w) = self.waiters.remove(&barrier.id) {
                        let _ = w.reply.send(Err(CoreError::CheckpointAborted {
                            id: barrier.id,
                            reason: e.to_string(),
                        }));
                    }
                    Err(e)
                }
            };
        }
        let coordinator = self.coordinator.as_mut().expect("checkpointing on");
        let subsumed = coordinator.completed(barrier.id, Instant::now());
        // The completion below releases every held source.
        self.held = false;
        self.retry_held = None;
        *self.completed += 1;
        self.tracker.mark_started();
        info!(
            checkpoint_id = barrier.id,
            duration_ms = duration.as_millis() as u64,
            alignment_ms = alignment.as_millis() as u64,
            persist_ms = persist_started.elapsed().as_millis() as u64,
            state_bytes = size,
            written_bytes = written,
            "Checkpoint complete."
        );
        if let Some(a) = self.aborts.take().filter(|a| a.more > 0) {
            info!(
                first_aborted = a.first,
                aborted = a.more + 1,
                reason = %a.reason,
                "Checkpoints complete again after {} aborted in a row.",
                a.more + 1
            );
        }
        self.job.metrics.update(|s| {
            s.completed += 1;
            s.latest_id = Some(barrier.id);
            if s.durations.len() >= 10_000 {
                s.durations.remove(0);
                s.written.remove(0);
            }
            s.durations.push(duration);
            s.written.push(written);
            s.last_alignment = alignment;
            s.last_state_size = size;
            s.last_written = written;
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
            let failed = match tokio::task::spawn_blocking(move || s.retain(keep)).await {
                Ok(Err(e)) => Some(e.to_string()),
                Err(e) => Some(e.to_string()),
                Ok(Ok(_)) => None,
            };
            if let Some(error) = failed {
                // Nothing of what a kept checkpoint may use was deleted; the next pass tries again.
                warn!(
                    checkpoint_id = barrier.id,
                    %error,
                    "Deleting old checkpoints stopped: a checkpoint could not be read, so nothing it may use was deleted."
                );
                self.job.metrics.update(|s| s.retention_failures += 1);
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
    pub(super) fn discard_files(&self, id: CheckpointId) {
        if let Some(s) = self.storage.clone() {
            tokio::task::spawn_blocking(move || {
                if let Err(e) = s.abort(id) {
                    debug!(checkpoint_id = id, error = %e, "Deleting an aborted checkpoint's files failed.");
                }
            });
        }
    }

    pub(super) async fn abort(&mut self, barrier: CheckpointBarrier, reason: &str) -> Result<()> {
        self.abort_then(barrier, reason, true).await
    }

    /// Aborts checkpoint `barrier` as [`Self::abort`] does, leaving whatever it wrote in place.
    pub(super) async fn abort_keeping_files(&mut self, barrier: CheckpointBarrier, reason: &str) -> Result<()> {
        self.abort_then(barrier, reason, false).await
    }

    async fn abort_then(&mut self, barrier: CheckpointBarrier, reason: &str, discard: bool) -> Result<()> {
        let savepoint = barrier.kind == SnapshotKind::Savepoint;
        match &mut self.aborts {
            Some(a) if a.reason == reason && !savepoint => {
                a.more += 1;
                if a.last_said.elapsed() >= ABORTS_REMIND {
                    a.last_said = Instant::now();
                    warn!(
                        checkpoint_id = barrier.id,
                        %reason,
                        aborted = a.more + 1,
                        first_aborted = a.first,
                        "Checkpoints still abort: {} in a row over {} s, since checkpoint {}.",
                        a.more + 1,
                        a.since.elapsed().as_secs(),
                        a.first
                    );
                } else {
                    debug!(checkpoint_id = barrier.id, %reason, "Checkpoint aborted.");
                }
            }
            _ if savepoint => warn!(checkpoint_id = barrier.id, %reason, "Savepoint aborted."),
            aborts => {
                warn!(
                    checkpoint_id = barrier.id,
                    %reason,
                    "Checkpoint aborted. Until one completes, further aborts for the same reason are logged at debug."
                );
                *aborts = Some(Aborts {
                    first: barrier.id,
                    since: Instant::now(),
                    last_said: Instant::now(),
                    reason: reason.to_owned(),
                    more: 0,
                });
            }
        }
        self.broadcast(Control::Notify(Notification::Aborted(barrier.id)));
        if discard {
            self.discard_files(barrier.id);
        }
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
        let now = Instant::now();
        if self.held {
            self.retry_held = Some(now + HELD_RETRY);
        }
        let c = self.coordinator.as_mut().expect("checkpointing on");
        c.failed(now)
    }
}
