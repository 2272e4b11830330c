//! The checkpoint coordinator's decisions: when to trigger, which acknowledgements complete a
//! checkpoint, what times out, how many failures are tolerated. It is a plain state machine driven
//! with the current time; the runtime does the I/O (injecting barriers, writing metadata,
//! notifying) in the order this module dictates: durable first, then notify.

mod config;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub use config::{CheckpointConfig, CheckpointingMode, WhenCaughtUp};

use crate::checkpoint::{CheckpointMetadata, OperatorSnapshot, SubtaskSnapshot, METADATA_VERSION};
use crate::error::{CoreError, Result};
use crate::message::{CheckpointBarrier, CheckpointId, SnapshotKind};

/// The state one operator subtask contributed to a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorSubtaskState {
    /// Operator uid.
    pub uid: String,
    /// Subtask index.
    pub subtask: u32,
    /// Operator parallelism.
    pub parallelism: u32,
    /// Operator max parallelism.
    pub max_parallelism: u32,
    /// The state.
    pub state: SubtaskSnapshot,
}

/// Everything one task (a chain of operators in one subtask) acknowledged.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskSnapshot {
    /// One entry per chained operator.
    pub operators: Vec<OperatorSubtaskState>,
    /// Time the task spent aligning the barrier.
    pub alignment: Duration,
    /// Bytes its operators wrote to checkpoint storage for this checkpoint (state files: for
    /// RocksDB the SST files new since its last snapshot and the small private files).
    pub written: u64,
}

/// A checkpoint waiting for acknowledgements.
#[derive(Debug)]
pub struct PendingCheckpoint {
    /// The barrier that was injected.
    pub barrier: CheckpointBarrier,
    /// When it was triggered.
    pub started: Instant,
    acks: BTreeMap<usize, TaskSnapshot>,
}

impl PendingCheckpoint {
    /// Whether `task` has acknowledged.
    pub fn acknowledged_by(&self, task: usize) -> bool {
        self.acks.contains_key(&task)
    }

    /// Longest alignment among the tasks.
    pub fn max_alignment(&self) -> Duration {
        self.acks.values().map(|a| a.alignment).max().unwrap_or_default()
    }

    /// Bytes the tasks wrote to checkpoint storage for this checkpoint.
    pub fn written(&self) -> u64 {
        self.acks.values().map(|a| a.written).sum()
    }

    /// The metadata to persist once every task acknowledged.
    pub fn into_metadata(self, job: &str, completed_ms: u64) -> Result<CheckpointMetadata> {
        let mut operators: BTreeMap<String, OperatorSnapshot> = BTreeMap::new();
        let mut states: Vec<OperatorSubtaskState> = self.acks.into_values().flat_map(|t| t.operators).collect();
        states.sort_by(|a, b| (&a.uid, a.subtask).cmp(&(&b.uid, b.subtask)));
        for s in states {
            let op = operators.entry(s.uid.clone()).or_insert_with(|| OperatorSnapshot {
                parallelism: s.parallelism,
                max_parallelism: s.max_parallelism,
                subtasks: Vec::new(),
            });
            if op.subtasks.len() as u32 > s.subtask || op.parallelism != s.parallelism {
                return Err(CoreError::InvalidJob(format!(
                    "operator uid {:?} is used by more than one operator, or a subtask acknowledged twice",
                    s.uid
                )));
            }
            // A process running a range of subtasks (scale-out) stores empty state for the others.
            op.subtasks.resize_with(s.subtask as usize, SubtaskSnapshot::default);
            op.subtasks.push(s.state);
        }
        for op in operators.values_mut() {
            op.subtasks
                .resize_with(op.parallelism as usize, SubtaskSnapshot::default);
        }
        Ok(CheckpointMetadata {
            version: METADATA_VERSION,
            job: job.to_owned(),
            id: self.barrier.id,
            kind: self.barrier.kind,
            timestamp_ms: self.barrier.timestamp_ms,
            completed_ms,
            operators,
        })
    }
}

/// What an acknowledgement led to.
#[derive(Debug)]
pub enum Acknowledged {
    /// Unknown checkpoint (aborted, timed out, or late): ignore.
    Unknown,
    /// Still waiting for other tasks.
    Pending,
    /// Every task acknowledged: persist it, then call [`CheckpointCoordinator::completed`].
    AllAcknowledged(PendingCheckpoint),
}

/// The coordinator's state for one run of a job.
#[derive(Debug)]
pub struct CheckpointCoordinator {
    interval: Duration,
    min_pause: Duration,
    timeout: Duration,
    max_concurrent: usize,
    tolerable_failures: u32,
    tasks: usize,
    next_id: CheckpointId,
    pending: BTreeMap<CheckpointId, PendingCheckpoint>,
    last_trigger: Instant,
    last_completion: Option<Instant>,
    consecutive_failures: u32,
    latest_completed: Option<CheckpointId>,
}

impl CheckpointCoordinator {
    /// A coordinator for `tasks` tasks; the first checkpoint gets id `first_id`.
    pub fn new(config: &CheckpointConfig, tasks: usize, first_id: CheckpointId, now: Instant) -> Self {
        CheckpointCoordinator {
            interval: config.interval,
            min_pause: config.min_pause,
            timeout: config.timeout,
            max_concurrent: config.max_concurrent,
            tolerable_failures: config.tolerable_failures,
            tasks,
            next_id: first_id,
            pending: BTreeMap::new(),
            last_trigger: now,
            last_completion: None,
            consecutive_failures: 0,
            latest_completed: None,
        }
    }

    /// The id the next checkpoint will get.
    pub fn next_id(&self) -> CheckpointId {
        self.next_id
    }

    /// Checkpoints in flight.
    pub fn pending(&self) -> impl Iterator<Item = &PendingCheckpoint> {
        self.pending.values()
    }

    /// Whether a periodic checkpoint is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.next_due().is_some_and(|t| now >= t)
    }

    /// When [`due`](Self::due) may next become true (for sleeping until then); `None` while
    /// `max_concurrent` checkpoints are in flight (only an acknowledgement, a decline or a
    /// timeout changes that: a time in the past here would wake the caller in a busy loop).
    pub fn next_due(&self) -> Option<Instant> {
        self.next_after(self.interval)
    }

    /// Whether a checkpoint may start before the interval is over (the sources caught up): as
    /// [`due`](Self::due), but a tenth of the interval after the previous trigger suffices.
    pub fn due_early(&self, now: Instant) -> bool {
        self.next_due_early().is_some_and(|t| now >= t)
    }

    /// When [`due_early`](Self::due_early) may next become true (`None` as for
    /// [`next_due`](Self::next_due)).
    pub fn next_due_early(&self) -> Option<Instant> {
        self.next_after(self.interval / 10)
    }

    /// `wait` after the previous trigger and the minimum pause after the last completion, if
    /// another checkpoint may be in flight.
    fn next_after(&self, wait: Duration) -> Option<Instant> {
        let by_trigger = self.last_trigger + wait;
        let by_pause = self.last_completion.map_or(by_trigger, |t| t + self.min_pause);
        (self.pending.len() < self.max_concurrent).then(|| by_trigger.max(by_pause))
    }

    /// Starts checkpoint `next_id` (periodic or savepoint) and returns its barrier.
    pub fn trigger(&mut self, now: Instant, kind: SnapshotKind, timestamp_ms: u64) -> CheckpointBarrier {
        let barrier = CheckpointBarrier {
            id: self.next_id,
            timestamp_ms,
            kind,
        };
        self.next_id += 1;
        self.last_trigger = now;
        self.pending.insert(
            barrier.id,
            PendingCheckpoint {
                barrier,
                started: now,
                acks: BTreeMap::new(),
            },
        );
        barrier
    }

    /// Task `task` acknowledged checkpoint `id` with its state.
    pub fn acknowledge(&mut self, id: CheckpointId, task: usize, snapshot: TaskSnapshot) -> Acknowledged {
        let Some(p) = self.pending.get_mut(&id) else {
            return Acknowledged::Unknown;
        };
        p.acks.insert(task, snapshot);
        #[cfg(test)]
        let tasks = self.tasks - usize::from(crate::sim::mutant() == crate::sim::Mutant::AckOneShort);
        #[cfg(not(test))]
        let tasks = self.tasks;
        if p.acks.len() < tasks {
            return Acknowledged::Pending;
        }
        Acknowledged::AllAcknowledged(self.pending.remove(&id).expect("present"))
    }

    /// A task declined checkpoint `id`; returns the barrier if it was still pending (now aborted).
    pub fn decline(&mut self, id: CheckpointId) -> Option<CheckpointBarrier> {
        self.pending.remove(&id).map(|p| p.barrier)
    }

    /// Removes and returns the checkpoints pending for longer than the timeout.
    pub fn expired(&mut self, now: Instant) -> Vec<CheckpointBarrier> {
        let timeout = self.timeout;
        let ids: Vec<_> = self
            .pending
            .iter()
            .filter(|(_, p)| now.duration_since(p.started) >= timeout)
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter_map(|id| self.pending.remove(&id).map(|p| p.barrier))
            .collect()
    }

    /// Checkpoint `id` is durable. Older pending checkpoints are subsumed and returned (abort them).
    pub fn completed(&mut self, id: CheckpointId, now: Instant) -> Vec<CheckpointBarrier> {
        self.last_completion = Some(now);
        self.consecutive_failures = 0;
        self.latest_completed = Some(self.latest_completed.map_or(id, |l| l.max(id)));
        let older: Vec<_> = self.pending.range(..id).map(|(id, _)| *id).collect();
        older
            .into_iter()
            .filter_map(|id| self.pending.remove(&id).map(|p| p.barrier))
            .collect()
    }

    /// The latest checkpoint completed in this run.
    pub fn latest_completed(&self) -> Option<CheckpointId> {
        self.latest_completed
    }

    /// A checkpoint failed (declined, expired, or not persisted). Errors when the tolerance is
    /// exceeded: the job must fail and restart.
    pub fn failed(&mut self, now: Instant) -> Result<()> {
        self.last_completion = Some(now);
        self.consecutive_failures += 1;
        if self.consecutive_failures > self.tolerable_failures {
            return Err(CoreError::TooManyCheckpointFailures {
                failures: self.consecutive_failures,
                tolerated: self.tolerable_failures,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
