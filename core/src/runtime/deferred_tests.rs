//! Deferred snapshot parts (`SnapshotContext::defer`): records flow while a part runs, a task
//! acknowledges checkpoints in order and only after their parts ended (so no sink hears of a
//! completion before its part ended), a failed part fails the task and the job recovers exactly,
//! and a source cannot defer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::coordinator::CheckpointConfig;
use crate::error::{CoreError, ErrorClass};
use crate::message::CheckpointId;
use crate::state::hash_key;

type Committed = Arc<Mutex<BTreeMap<(u32, CheckpointId), Vec<u64>>>>;

/// What the sinks of one job saw, across restarts.
#[derive(Default)]
struct Seen {
    /// Records written while a deferred part of the same subtask was still running.
    written_while_deferred: AtomicU64,
    /// Completions heard for a checkpoint whose part (or an earlier one's) had not ended.
    early_completions: AtomicU64,
    /// Parts that ended after a later checkpoint's part had (the runtime must still ack in order).
    ended_out_of_order: AtomicU64,
    /// Deferred parts still to fail on purpose.
    failures_left: AtomicU32,
    parts: AtomicU64,
}

/// Emits index, index + p, ... < total, 50 at a time, and at most `PER_CHECKPOINT` numbers more
/// than it was told checkpoints completed since it started: its numbers spread over at least
/// `total / p / PER_CHECKPOINT` checkpoints (fewer restarts) however fast or slow the machine
/// runs the checkpoints (a source paced by the clock alone saw 19 of them on a loaded machine).
struct Numbers {
    next: u64,
    step: u64,
    total: u64,
    emitted: u64,
    completed: u64,
}

const PER_CHECKPOINT: u64 = 500;

impl Source<u64> for Numbers {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> crate::Result<()> {
        if let Some(pos) = ctx.list_state("pos").first() {
            self.next = u64::from_be_bytes(pos.as_slice().try_into().expect("8 bytes"));
        }
        Ok(())
    }
    async fn poll_next(&mut self, out: &mut Vec<u64>) -> crate::Result<SourceStatus> {
        if self.next >= self.total {
            return Ok(SourceStatus::End);
        }
        if self.emitted >= (self.completed + 1) * PER_CHECKPOINT {
            tokio::time::sleep(Duration::from_millis(1)).await;
            return Ok(SourceStatus::Idle);
        }
        while out.len() < 50 && self.next < self.total {
            out.push(self.next);
            self.next += self.step;
            self.emitted += 1;
        }
        tokio::time::sleep(Duration::from_micros(300)).await;
        Ok(SourceStatus::More)
    }
    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> crate::Result<()> {
        ctx.put_list_state("pos", vec![self.next.to_be_bytes().to_vec()]);
        Ok(())
    }
    async fn notify_checkpoint_complete(&mut self, _id: CheckpointId) -> crate::Result<()> {
        self.completed += 1;
        Ok(())
    }
}

/// Stages each checkpoint's records at its barrier; the part written into the checkpoint is
/// finished in the background after a pause of 0-24 ms (so parts of overlapping checkpoints end
/// in any order); commits what is staged up to a completed checkpoint.
struct DeferringSink {
    subtask: u32,
    current: Vec<u64>,
    staged: Arc<Mutex<BTreeMap<CheckpointId, Vec<u64>>>>,
    /// Checkpoints whose part ended.
    ended: Arc<Mutex<BTreeSet<CheckpointId>>>,
    /// Checkpoints deferred and not yet known to have ended.
    running: Arc<AtomicU32>,
    deferred: BTreeSet<CheckpointId>,
    seen: Arc<Seen>,
    committed: Committed,
}

impl Sink<u64> for DeferringSink {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> crate::Result<()> {
        for entry in ctx.list_state("staged") {
            let (origin, chk, rows): (u32, CheckpointId, Vec<u64>) = serde_json::from_slice(&entry).unwrap();
            self.committed.lock().unwrap().insert((origin, chk), rows);
        }
        Ok(())
    }
    async fn write(&mut self, records: Vec<u64>) -> crate::Result<()> {
        if self.running.load(Ordering::SeqCst) > 0 {
            self.seen
                .written_while_deferred
                .fetch_add(records.len() as u64, Ordering::Relaxed);
        }
        self.current.extend(records);
        Ok(())
    }
    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> crate::Result<()> {
        let id = ctx.checkpoint_id;
        self.staged
            .lock()
            .unwrap()
            .insert(id, std::mem::take(&mut self.current));
        self.deferred.insert(id);
        self.running.fetch_add(1, Ordering::SeqCst);
        let pause =
            Duration::from_millis(hash_key(&[id.to_be_bytes(), u64::from(self.subtask).to_be_bytes()].concat()) % 25);
        let fail = self
            .seen
            .failures_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n > 0 && self.seen.parts.fetch_add(1, Ordering::SeqCst) % 7 == 6).then(|| n - 1)
            })
            .is_ok();
        let (staged, ended, running, seen, subtask) = (
            self.staged.clone(),
            self.ended.clone(),
            self.running.clone(),
            self.seen.clone(),
            self.subtask,
        );
        ctx.defer(async move {
            tokio::time::sleep(pause).await;
            if fail {
                return Err(CoreError::operator(
                    "out",
                    ErrorClass::Restart,
                    "injected failure of a deferred part",
                ));
            }
            let entries = staged
                .lock()
                .unwrap()
                .range(..=id)
                .map(|(chk, rows)| serde_json::to_vec(&(subtask, chk, rows)).unwrap())
                .collect();
            let mut ended = ended.lock().unwrap();
            if ended.range(id + 1..).next().is_some() {
                seen.ended_out_of_order.fetch_add(1, Ordering::Relaxed);
            }
            ended.insert(id);
            running.fetch_sub(1, Ordering::SeqCst);
            let mut state = DeferredState::default();
            state.put_list_state("staged", entries);
            Ok(state)
        });
        Ok(())
    }
    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> crate::Result<()> {
        let ended = self.ended.lock().unwrap().clone();
        if self.deferred.range(..=id).any(|d| !ended.contains(d)) {
            self.seen.early_completions.fetch_add(1, Ordering::Relaxed);
        }
        let mut staged = self.staged.lock().unwrap();
        let later = staged.split_off(&(id + 1));
        let mut committed = self.committed.lock().unwrap();
        for (chk, rows) in std::mem::replace(&mut *staged, later) {
            committed.insert((self.subtask, chk), rows);
        }
        Ok(())
    }
}

fn job(dir: &std::path::Path, total: u64, seen: Arc<Seen>, committed: Committed, chained: bool) -> Job {
    let mut checkpoint = CheckpointConfig::new(dir.join("checkpoints"));
    checkpoint.interval = Duration::from_millis(10);
    checkpoint.min_pause = Duration::ZERO;
    checkpoint.max_concurrent = 3;
    checkpoint.retained = 2;
    let mut config = JobConfig::new("deferred");
    config.checkpointing = Some(checkpoint);
    config.restart = crate::restart::RestartStrategy::FixedDelay {
        attempts: 20,
        delay: Duration::from_millis(5),
    };
    let mut builder = JobBuilder::new(config);
    let stream = builder.source("numbers", 2, move |info: &SubtaskInfo| Numbers {
        next: u64::from(info.index),
        step: u64::from(info.parallelism),
        total,
        emitted: 0,
        completed: 0,
    });
    // Chained: the sink runs in the source's task; otherwise behind a channel (an input task).
    let stream = if chained {
        stream.map(|n| n)
    } else {
        stream.rebalance(2).map(|n| n)
    };
    stream.sink("out", move |info| DeferringSink {
        subtask: info.index,
        current: Vec::new(),
        staged: Arc::default(),
        ended: Arc::default(),
        running: Arc::default(),
        deferred: BTreeSet::new(),
        seen: seen.clone(),
        committed: committed.clone(),
    });
    builder.build().unwrap()
}

async fn run(chained: bool, failures: u32) {
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Seen {
        failures_left: AtomicU32::new(failures),
        ..Seen::default()
    });
    let committed: Committed = Arc::default();
    let total = 40_000;
    let outcome = job(dir.path(), total, seen.clone(), committed.clone(), chained)
        .run()
        .await
        .unwrap();
    let case = if chained { "chained" } else { "behind a channel" };
    assert_eq!(
        seen.failures_left.load(Ordering::SeqCst),
        0,
        "{case}: every injected failure happened"
    );
    assert!(
        outcome.restarts >= failures.min(1) && outcome.restarts <= failures,
        "{case}: {} restarts for {failures} failed parts",
        outcome.restarts
    );
    // Each source instance emits at most PER_CHECKPOINT numbers more than the completions it
    // heard; its subtask's total / 2 numbers came from at most failures + 1 instances.
    let floor = total / 2 / PER_CHECKPOINT - u64::from(failures) - 1;
    assert!(
        outcome.checkpoints >= floor,
        "{case}: {} checkpoints, fewer than the {floor} the paced source needs",
        outcome.checkpoints
    );
    assert_eq!(
        seen.early_completions.load(Ordering::Relaxed),
        0,
        "{case}: completion heard before its part ended"
    );
    assert!(
        seen.written_while_deferred.load(Ordering::Relaxed) > 0,
        "{case}: no record was written while a part ran (nothing was deferred?)"
    );
    assert!(
        seen.ended_out_of_order.load(Ordering::Relaxed) > 0,
        "{case}: parts never ended out of order, so the ordering of acknowledgements went untested"
    );
    let mut numbers: Vec<u64> = committed.lock().unwrap().values().flatten().copied().collect();
    numbers.sort_unstable();
    let dups = numbers.windows(2).filter(|w| w[0] == w[1]).count();
    numbers.dedup();
    assert_eq!(dups, 0, "{case}: duplicated numbers");
    let missing: Vec<u64> = (0..total).filter(|n| numbers.binary_search(n).is_err()).collect();
    assert!(
        missing.is_empty() && numbers.len() as u64 == total,
        "{case}: {} of {total} numbers missing (first: {:?}), {} committed",
        missing.len(),
        missing.iter().take(5).collect::<Vec<_>>(),
        numbers.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_parts_in_a_source_task_ack_in_order_and_stay_exact() {
    run(true, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_parts_in_an_input_task_ack_in_order_and_stay_exact() {
    run(false, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_deferred_part_restarts_the_job_which_stays_exact() {
    run(true, 2).await;
    run(false, 2).await;
}

/// A source that defers part of its snapshot is refused (its position must be complete).
struct DeferringSource;

impl Source<u64> for DeferringSource {
    async fn poll_next(&mut self, _out: &mut Vec<u64>) -> crate::Result<SourceStatus> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        Ok(SourceStatus::Idle)
    }
    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> crate::Result<()> {
        ctx.defer(async { Ok(DeferredState::default()) });
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_cannot_defer() {
    let dir = tempfile::tempdir().unwrap();
    let mut checkpoint = CheckpointConfig::new(dir.path().join("checkpoints"));
    checkpoint.interval = Duration::from_millis(10);
    let mut config = JobConfig::new("deferring-source");
    config.checkpointing = Some(checkpoint);
    config.restart = crate::restart::RestartStrategy::None;
    let mut builder = JobBuilder::new(config);
    builder
        .source("numbers", 1, |_: &SubtaskInfo| DeferringSource)
        .sink("out", |_| DeferringSinkless);
    let err = builder.build().unwrap().run().await.expect_err("refused").to_string();
    assert!(err.contains("a source deferred part of its snapshot"), "{err}");
}

struct DeferringSinkless;

impl Sink<u64> for DeferringSinkless {
    async fn write(&mut self, _records: Vec<u64>) -> crate::Result<()> {
        Ok(())
    }
}

/// Emits 0, 1, 2, … < total, 50 at a time, never waiting: each poll only works (a source reading
/// a backlog), so its task gives its worker back only at its own yield points.
struct Busy {
    next: u64,
    total: u64,
}

impl Source<u64> for Busy {
    async fn poll_next(&mut self, out: &mut Vec<u64>) -> crate::Result<SourceStatus> {
        if self.next >= self.total {
            return Ok(SourceStatus::End);
        }
        while out.len() < 50 && self.next < self.total {
            out.push(self.next);
            self.next += 1;
        }
        // Work, not a wait: the task keeps its worker meanwhile.
        std::thread::sleep(Duration::from_micros(50));
        Ok(SourceStatus::Backlog)
    }
}

/// Per deferred part: records written at its barrier, and (once it ran) when it first ran.
type Starts = Arc<Mutex<Vec<(u64, Arc<AtomicU64>)>>>;

/// Counts the records it was given; at each barrier defers a part that notes how many it had
/// been given by the time the part was first polled.
struct CountingSink {
    written: u64,
    starts: Starts,
    shared_written: Arc<AtomicU64>,
}

impl Sink<u64> for CountingSink {
    async fn write(&mut self, records: Vec<u64>) -> crate::Result<()> {
        self.written += records.len() as u64;
        self.shared_written.store(self.written, Ordering::SeqCst);
        Ok(())
    }
    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> crate::Result<()> {
        let first_run = Arc::new(AtomicU64::new(u64::MAX));
        self.starts.lock().unwrap().push((self.written, first_run.clone()));
        let written = self.shared_written.clone();
        ctx.defer(async move {
            first_run.store(written.load(Ordering::SeqCst), Ordering::SeqCst);
            Ok(DeferredState::default())
        });
        Ok(())
    }
}

/// A part deferred at a barrier starts before its task takes more records, however busy the
/// task's source: spawned from a busy worker, a task waits in that worker's LIFO slot, which no
/// other worker takes from, until the spawning task yields — which a source task reading a
/// backlog did only when tokio's budget of 128 operations was spent (1 024 records a poll: a
/// Kafka sink's pre-commit was acknowledged 100 ms–1 s late, `exactly bench k2k`).
async fn parts_start_at_once(chained: bool) {
    let dir = tempfile::tempdir().unwrap();
    let starts: Starts = Arc::default();
    let mut checkpoint = CheckpointConfig::new(dir.path().join("checkpoints"));
    checkpoint.interval = Duration::from_millis(10);
    checkpoint.min_pause = Duration::ZERO;
    let mut config = JobConfig::new("busy");
    config.checkpointing = Some(checkpoint);
    config.restart = crate::restart::RestartStrategy::None;
    let mut builder = JobBuilder::new(config);
    let stream = builder.source("numbers", 1, |_: &SubtaskInfo| Busy {
        next: 0,
        total: 200_000,
    });
    let stream = if chained {
        stream.map(|n| n)
    } else {
        stream.rebalance(1).map(|n| n)
    };
    let sink_starts = starts.clone();
    stream.sink("out", move |_| CountingSink {
        written: 0,
        starts: sink_starts.clone(),
        shared_written: Arc::default(),
    });
    let outcome = builder.build().unwrap().run().await.unwrap();
    let case = if chained { "chained" } else { "behind a channel" };
    let starts: Vec<(u64, u64)> = starts
        .lock()
        .unwrap()
        .iter()
        .map(|(at, first)| (*at, first.load(Ordering::SeqCst)))
        .collect();
    assert!(
        outcome.checkpoints >= 5 && starts.len() >= 5,
        "{case}: {} checkpoints, {} parts",
        outcome.checkpoints,
        starts.len()
    );
    let late: Vec<&(u64, u64)> = starts.iter().filter(|(at, first)| first != at).collect();
    assert!(
        late.is_empty(),
        "{case}: {} of {} parts first ran after their task took more records (records at the barrier, when the part ran): {:?}",
        late.len(),
        starts.len(),
        late.iter().take(5).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_part_starts_before_a_busy_source_task_goes_on() {
    parts_start_at_once(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_part_starts_before_a_busy_input_task_goes_on() {
    parts_start_at_once(false).await;
}
