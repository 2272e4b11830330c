//! The loops of source tasks and input tasks, and what they exchange with the coordinator.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::api::{InitContext, SnapshotContext, Source, SourceStatus, SourceWatermark, SubtaskInfo};
use super::chain::{user_error, BackendFactory, Envelope};
use super::output::{BarrierCtx, DeferredState, Notification, Output};
use crate::checkpoint::{AlignerEvent, AlignmentMode, BarrierAligner, SubtaskSnapshot};
use crate::coordinator::{OperatorSubtaskState, TaskSnapshot};
use crate::error::{CoreError, Result};
use crate::message::{CheckpointBarrier, CheckpointId, Message, Watermark};
use crate::state::{redistribute, RestoredState};
use crate::storage::{CheckpointStorage, Snapshot};

mod input;
pub(crate) use input::input_task;

/// A task's whole life as one future.
pub(crate) type TaskBody = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// How many bytes a record occupies (heap included), for the alignment buffer's byte limit.
pub(crate) type RecordSize<T> = Arc<dyn Fn(&T) -> usize + Send + Sync>;

/// What the coordinator tells a task.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Control {
    /// (Sources) inject this barrier; with `stop`, produce nothing after it.
    Trigger {
        barrier: CheckpointBarrier,
        stop: bool,
    },
    /// (Ended tasks) snapshot without forwarding.
    SnapshotIfEnded(CheckpointBarrier),
    Notify(Notification),
    Shutdown,
}

/// What a task tells the coordinator.
#[derive(Debug)]
pub(crate) enum TaskEvent {
    Ack {
        task: usize,
        id: CheckpointId,
        snapshot: TaskSnapshot,
    },
    Decline {
        task: usize,
        id: CheckpointId,
        reason: String,
    },
    /// The task started: its chain is open and its source (if any) initialised with the restored
    /// state (sinks connected, restored transactions committed).
    Opened { task: usize },
    /// The task processed its end of input (it stays to snapshot and hear notifications).
    Ended { task: usize },
    /// (Sources) the source reads only after a checkpoint completed
    /// (`Source::reads_after_first_checkpoint`): checkpoint now rather than after the interval.
    Held { task: usize },
    /// (Sources) a poll found nothing new: caught up with the input, after the barrier of
    /// checkpoint `after` (`None`: before any in this run). Sent once per barrier and again
    /// when what it says about the time since changes.
    CaughtUp {
        task: usize,
        after: Option<CheckpointId>,
        caught: CaughtUp,
    },
}

/// What a source read before it caught up, since the latest barrier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CaughtUp {
    /// Records were read.
    pub(crate) read: bool,
    /// The longest backlog read that ended since the barrier: from a poll saying
    /// `SourceStatus::Backlog` (which may have come before the barrier) until the source next
    /// caught up (`Idle` or `CaughtUp`).
    pub(crate) backlog: Duration,
}

/// Everything a task needs from the run it belongs to.
pub(crate) struct TaskContext {
    pub(crate) task_id: usize,
    pub(crate) name: String,
    pub(crate) index: u32,
    pub(crate) parallelism: u32,
    pub(crate) max_parallelism: u32,
    pub(crate) attempt: u32,
    pub(crate) starting: bool,
    pub(crate) commit_window: Option<std::time::Duration>,
    pub(crate) accept_replay: bool,
    pub(crate) restore: Option<Arc<Snapshot>>,
    pub(crate) storage: Option<Arc<dyn CheckpointStorage>>,
    pub(crate) backend: BackendFactory,
    pub(crate) alignment: AlignmentMode,
    pub(crate) max_alignment_buffer: usize,
    pub(crate) max_alignment_bytes: usize,
    pub(crate) control: Option<mpsc::UnboundedReceiver<Control>>,
    pub(crate) events: mpsc::UnboundedSender<TaskEvent>,
    /// The run's restore past unreadable checkpoints, which its sinks must prove safe.
    pub(crate) proof: Option<Arc<crate::runtime::api::RestoreProof>>,
}

impl TaskContext {
    pub(crate) fn info(&self, uid: &str) -> SubtaskInfo {
        SubtaskInfo {
            uid: uid.to_owned(),
            index: self.index,
            parallelism: self.parallelism,
            max_parallelism: self.max_parallelism,
            attempt: self.attempt,
            starting: self.starting,
            commit_window: self.commit_window,
            restored_checkpoint: self.restore.as_ref().map(|s| s.meta.id),
            accept_replay: self.accept_replay,
        }
    }

    pub(crate) fn restored(&self, uid: &str) -> Option<RestoredState> {
        let snapshot = self.restore.as_ref()?;
        let op = snapshot.meta.operators.get(uid)?;
        Some(redistribute(op, self.parallelism, self.index))
    }

    fn parts(&mut self) -> TaskParts {
        TaskParts {
            task_id: self.task_id,
            name: format!("{}[{}]", self.name, self.index),
            control: self.control.take().expect("one task per context"),
            events: self.events.clone(),
            storage: self.storage.clone(),
        }
    }
}

struct TaskParts {
    task_id: usize,
    name: String,
    control: mpsc::UnboundedReceiver<Control>,
    events: mpsc::UnboundedSender<TaskEvent>,
    storage: Option<Arc<dyn CheckpointStorage>>,
}

impl TaskParts {
    fn send(&self, e: TaskEvent) {
        // The coordinator is gone only when the run is being torn down.
        let _ = self.events.send(e);
    }

    /// Runs the barrier through the chain and acknowledges it, at once or, when operators
    /// deferred parts of their snapshots, once those have ended (in checkpoint order).
    async fn checkpoint<T>(
        &self,
        acks: &mut WaitingAcks,
        chain: &mut Box<dyn Output<T>>,
        barrier: CheckpointBarrier,
        mut snapshot: TaskSnapshot,
        forward: bool,
    ) -> Result<()> {
        chain.flush().await?;
        let mut deferred = Vec::new();
        chain
            .barrier(BarrierCtx {
                barrier,
                snapshot: &mut snapshot,
                storage: self.storage.as_ref(),
                forward,
                deferred: &mut deferred,
            })
            .await?;
        if deferred.is_empty() && acks.is_empty() {
            self.send(TaskEvent::Ack {
                task: self.task_id,
                id: barrier.id,
                snapshot,
            });
            return Ok(());
        }
        let parts = deferred
            .into_iter()
            .map(|(at, part)| (at, Part::Running(tokio::spawn(part))))
            .collect();
        acks.queue.push_back(WaitingAck {
            id: barrier.id,
            snapshot,
            parts,
        });
        self.send_ready(acks).await
    }

    /// Waits for every deferred part and sends every waiting acknowledgement: before the task
    /// reports its end, since the coordinator takes an ended task's missing acknowledgements
    /// for barriers that never reached it (and would ask it to snapshot them again).
    async fn send_all(&self, acks: &mut WaitingAcks) -> Result<()> {
        while !acks.is_empty() {
            acks.oldest_ended().await;
            self.send_ready(acks).await?;
        }
        Ok(())
    }

    /// Sends, oldest first, every waiting acknowledgement whose deferred parts have all ended
    /// (returns at once when the oldest has not); a failed part fails the task.
    async fn send_ready(&self, acks: &mut WaitingAcks) -> Result<()> {
        while acks.oldest_has_ended() {
            acks.oldest_ended().await;
            let Some(w) = acks.queue.pop_front() else { break };
            let mut snapshot = w.snapshot;
            for (at, part) in w.parts {
                let Part::Done(result) = part else {
                    unreachable!("oldest_ended waited for every part")
                };
                let op = &mut snapshot.operators[at];
                let state = result.map_err(|e| user_error(&op.uid, e))?;
                state.add_to(&mut op.state.list_state, &mut op.state.union_state);
            }
            self.send(TaskEvent::Ack {
                task: self.task_id,
                id: w.id,
                snapshot,
            });
        }
        Ok(())
    }
}

/// How long a task runs before it lets its worker thread serve the runtime's other tasks.
const TURN: Duration = Duration::from_millis(2);

/// When a task gives its worker thread back.
///
/// Tokio's cooperative budget counts operations (128 per turn), and one poll of a source brings
/// up to a batch of records (the Kafka source's `poll_batch`, 1 024): a source task reading a
/// backlog kept its worker for ≈150 ms at a time. What it spawned meanwhile waited that long — a
/// task spawned from a busy worker goes to that worker's LIFO slot, which no other worker takes
/// from — and so did what other threads woke while every worker was busy: the deferred parts of
/// its snapshots (the Kafka sink's background pre-commit: its checkpoint was acknowledged 100 ms–1 s
/// after the flush had ended, measured with `exactly bench k2k` at 100 ms checkpoints and two
/// subtasks), the sinks' background commits, the coordinator and the admin endpoint.
struct Turn(Instant);

impl Turn {
    fn new() -> Self {
        Turn(Instant::now())
    }

    /// Ends the turn if the task has run for [`TURN`] since the last one ended.
    async fn end_if_due(&mut self) {
        if self.0.elapsed() >= TURN {
            self.end().await;
        }
    }

    /// Ends the turn now: what the task just spawned (a checkpoint's deferred parts, a commit in
    /// the background) gets its first poll at once.
    async fn end(&mut self) {
        tokio::task::yield_now().await;
        self.restart();
    }

    /// The task was suspended (it waited): a new turn starts.
    fn restart(&mut self) {
        self.0 = Instant::now();
    }
}

/// A deferred part of an operator's snapshot (see `SnapshotContext::defer`).
enum Part {
    Running(tokio::task::JoinHandle<Result<DeferredState>>),
    Done(Result<DeferredState>),
}

/// A barrier that went through the chain, waiting for deferred parts of its snapshot.
struct WaitingAck {
    id: CheckpointId,
    snapshot: TaskSnapshot,
    /// (index of the operator's entry in `snapshot`, part)
    parts: Vec<(usize, Part)>,
}

/// A task's acknowledgements that wait for deferred snapshot parts, oldest first: sent in this
/// order, so an acknowledgement never overtakes an earlier checkpoint's. Dropped with the task
/// (failover, shutdown): the parts still running are cancelled.
#[derive(Default)]
struct WaitingAcks {
    queue: VecDeque<WaitingAck>,
}

impl WaitingAcks {
    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn oldest_has_ended(&self) -> bool {
        self.queue.front().is_some_and(|w| {
            w.parts.iter().all(|(_, p)| match p {
                Part::Running(h) => h.is_finished(),
                Part::Done(_) => true,
            })
        })
    }

    /// Waits until every part of the oldest has ended (forever when none waits). Cancel-safe: a
    /// part that ended keeps its result.
    async fn oldest_ended(&mut self) {
        let Some(w) = self.queue.front_mut() else {
            return std::future::pending().await;
        };
        for (_, part) in &mut w.parts {
            if let Part::Running(h) = part {
                let result = h.await.unwrap_or_else(|e| {
                    Err(CoreError::TaskLost {
                        task: "a deferred snapshot part".into(),
                        reason: e.to_string(),
                    })
                });
                *part = Part::Done(result);
            }
        }
    }
}

impl Drop for WaitingAcks {
    fn drop(&mut self) {
        for w in &self.queue {
            for (_, p) in &w.parts {
                if let Part::Running(h) = p {
                    h.abort();
                }
            }
        }
    }
}

/// The loop of a source subtask: poll, push through the chain, inject barriers between polls.
pub(crate) fn source_task<T: Send + 'static, S: Source<T>>(
    ctx: &mut TaskContext,
    info: SubtaskInfo,
    restored: Option<RestoredState>,
    mut source: S,
    mut chain: Box<dyn Output<T>>,
) -> TaskBody {
    let mut parts = ctx.parts();
    Box::pin(async move {
        chain.open().await?;
        source
            .initialize_state(&InitContext::new(&info, restored.as_ref()))
            .await
            .map_err(|e| user_error(&info.uid, e))?;
        drop(restored);
        parts.send(TaskEvent::Opened { task: parts.task_id });
        // Until a checkpoint has recorded where the source starts, it is not polled
        // (`Source::reads_after_first_checkpoint`); the coordinator checkpoints at once.
        let mut held = info.commit_window.is_some() && source.reads_after_first_checkpoint();
        if held {
            tracing::info!(
                subtask = info.index,
                uid = %info.uid,
                "The source starts at a moment (the end of its input now): it reads once a checkpoint has recorded where, taken at once."
            );
            parts.send(TaskEvent::Held { task: parts.task_id });
        }
        let mut ended = false;
        let mut stopped = false;
        let mut buf = Vec::with_capacity(1024);
        let mut last_watermark: Option<Watermark> = None;
        let mut idle = false;
        let mut acks = WaitingAcks::default();
        // For the coordinator's checkpoints when the sources caught up (`when_caught_up`): what
        // was read since the barrier of `after`, whether the coordinator was told so, and since
        // when the source has been reading a backlog (a poll said `Backlog`, none caught up since).
        let mut after: Option<CheckpointId> = None;
        let mut caught = CaughtUp::default();
        let mut told = false;
        let mut backlog_since: Option<Instant> = None;
        // The last poll found nothing more to read (`Idle` or `CaughtUp`): wait for records in
        // `Source::available` before polling again, and meanwhile serve the coordinator.
        let mut waiting = false;
        let mut turn = Turn::new();
        loop {
            // Yield points: a source that never waits (a `poll_next` returning at once with
            // nothing, the default `available`) or one reading a backlog would otherwise keep its
            // worker thread, and the coordinator, other tasks and a cancellation could not run
            // there.
            tokio::task::coop::consume_budget().await;
            turn.end_if_due().await;
            parts.send_ready(&mut acks).await?;
            // Ended, stopped or held, it only serves the coordinator; waiting, it also waits for
            // records.
            let control = if ended || stopped || held || waiting {
                let woken = tokio::select! {
                    biased;
                    c = parts.control.recv() => Woken::Control(c),
                    () = acks.oldest_ended(), if !acks.is_empty() => Woken::Acknowledgement,
                    () = source.available(), if !(ended || stopped || held) => Woken::Records,
                };
                turn.restart();
                match woken {
                    Woken::Control(Some(c)) => Some(c),
                    Woken::Control(None) => return Ok(()),
                    Woken::Acknowledgement => continue,
                    Woken::Records => {
                        waiting = false;
                        None
                    }
                }
            } else {
                match parts.control.try_recv() {
                    Ok(c) => Some(c),
                    Err(mpsc::error::TryRecvError::Empty) => None,
                    Err(mpsc::error::TryRecvError::Disconnected) => return Ok(()),
                }
            };
            if let Some(c) = control {
                match c {
                    Control::Trigger { barrier, stop } => {
                        (after, caught, told) = (Some(barrier.id), CaughtUp::default(), false);
                        let snapshot = source_snapshot(&info, &mut source, barrier).await?;
                        parts
                            .checkpoint(&mut acks, &mut chain, barrier, snapshot, !ended)
                            .await?;
                        stopped |= stop;
                    }
                    Control::SnapshotIfEnded(barrier) if ended => {
                        let snapshot = source_snapshot(&info, &mut source, barrier).await?;
                        parts
                            .checkpoint(&mut acks, &mut chain, barrier, snapshot, false)
                            .await?;
                    }
                    Control::SnapshotIfEnded(_) => {}
                    Control::Notify(n) => {
                        held &= !matches!(n, Notification::Complete(_));
                        match n {
                            Notification::Complete(id) => source.notify_checkpoint_complete(id).await,
                            Notification::Aborted(id) => source.notify_checkpoint_aborted(id).await,
                        }
                        .map_err(|e| user_error(&info.uid, e))?;
                        chain.notify(n).await?;
                    }
                    Control::Shutdown => return chain.close().await,
                }
                // A barrier or a completion may have spawned work (deferred snapshot parts,
                // background commits): let it start.
                turn.end().await;
                continue;
            }
            let status = source.poll_next(&mut buf).await.map_err(|e| user_error(&info.uid, e))?;
            if !buf.is_empty() {
                idle = false;
                // The coordinator needs one event since the barrier saying records were read;
                // telling it again after every poll would only repeat that.
                if !caught.read {
                    (caught.read, told) = (true, false);
                }
            }
            match status {
                SourceStatus::Backlog => {
                    backlog_since.get_or_insert_with(Instant::now);
                }
                SourceStatus::Idle | SourceStatus::CaughtUp => {
                    waiting = true;
                    if let Some(since) = backlog_since.take() {
                        let run = since.elapsed();
                        tracing::debug!(
                            subtask = info.index,
                            backlog_ms = run.as_millis() as u64,
                            "Source caught up after reading a backlog."
                        );
                        if run > caught.backlog {
                            (caught.backlog, told) = (run, false);
                        }
                    }
                    if !told {
                        told = true;
                        parts.send(TaskEvent::CaughtUp {
                            task: parts.task_id,
                            after,
                            caught,
                        });
                    }
                }
                SourceStatus::More | SourceStatus::End => {}
            }
            for r in buf.drain(..) {
                chain.record(r)?;
            }
            match source.watermark() {
                Some(SourceWatermark::At(w)) if idle || last_watermark.is_none_or(|l| w > l) => {
                    let w = last_watermark.map_or(w, |l| l.max(w));
                    chain.watermark(w)?;
                    last_watermark = Some(w);
                    idle = false;
                }
                Some(SourceWatermark::Idle) if !idle => {
                    chain.idle()?;
                    idle = true;
                }
                _ => {}
            }
            chain.flush().await?;
            if status == SourceStatus::End {
                chain.end().await?;
                ended = true;
                parts.send_all(&mut acks).await?;
                parts.send(TaskEvent::Ended { task: parts.task_id });
            }
        }
    })
}

/// What ended a source task's wait for records.
enum Woken {
    /// A message from the coordinator (`None`: the run is being torn down).
    Control(Option<Control>),
    /// The oldest acknowledgement's deferred parts ended: it can be sent.
    Acknowledgement,
    /// `Source::available` completed: poll.
    Records,
}

async fn source_snapshot<T, S: Source<T>>(
    info: &SubtaskInfo,
    source: &mut S,
    barrier: CheckpointBarrier,
) -> Result<TaskSnapshot> {
    let mut sctx = SnapshotContext::new(barrier.id, barrier.kind, barrier.timestamp_ms);
    source
        .snapshot_state(&mut sctx)
        .await
        .map_err(|e| user_error(&info.uid, e))?;
    if !sctx.deferred.is_empty() {
        return Err(CoreError::operator(
            &info.uid,
            crate::error::ErrorClass::Fatal,
            "a source deferred part of its snapshot (SnapshotContext::defer): a source's position must be complete at its barrier",
        ));
    }
    Ok(TaskSnapshot {
        operators: vec![OperatorSubtaskState {
            uid: info.uid.clone(),
            subtask: info.index,
            parallelism: info.parallelism,
            max_parallelism: info.max_parallelism,
            state: SubtaskSnapshot {
                list_state: sctx.list_state,
                union_state: sctx.union_state,
                keyed: None,
            },
        }],
        alignment: Duration::ZERO,
        written: 0,
    })
}
