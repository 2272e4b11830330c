//! A source waiting for records in `Source::available`: the runtime serves the coordinator while
//! it waits — barriers injected, acknowledgements sent once deferred parts end, completions
//! delivered to the chained sink (which commits) — and does not poll again until it completes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::coordinator::CheckpointConfig;
use crate::message::CheckpointId;

/// Emits its numbers in its first poll (`CaughtUp`), then nothing: `poll_next` says `Idle` at
/// once and `available` never completes (no record will come). Counts the polls.
struct Quiet {
    left: Vec<u64>,
    polls: Arc<AtomicU64>,
}

impl Source<u64> for Quiet {
    async fn poll_next(&mut self, out: &mut Vec<u64>) -> crate::Result<SourceStatus> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        if self.left.is_empty() {
            return Ok(SourceStatus::Idle);
        }
        out.append(&mut self.left);
        Ok(SourceStatus::CaughtUp)
    }

    async fn available(&mut self) {
        std::future::pending::<()>().await
    }
}

/// Stages each checkpoint's records at its barrier and defers a part of its snapshot (as the
/// two-phase driver's background pre-commit does): the checkpoint is acknowledged only once that
/// part ended. Commits what is staged when a checkpoint completes.
struct Staging {
    current: Vec<u64>,
    staged: Vec<(CheckpointId, Vec<u64>)>,
    committed: Arc<Mutex<Vec<u64>>>,
    /// How long the first checkpoint's deferred part takes (the others: 5 ms).
    first: Duration,
}

impl Sink<u64> for Staging {
    async fn write(&mut self, records: Vec<u64>) -> crate::Result<()> {
        self.current.extend(records);
        Ok(())
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> crate::Result<()> {
        let wait = if self.staged.is_empty() {
            self.first
        } else {
            Duration::from_millis(5)
        };
        self.staged.push((ctx.checkpoint_id, std::mem::take(&mut self.current)));
        ctx.defer(async move {
            tokio::time::sleep(wait).await;
            Ok(DeferredState::default())
        });
        Ok(())
    }

    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> crate::Result<()> {
        let mut committed = self.committed.lock().unwrap();
        for (_, rows) in self.staged.extract_if(.., |(chk, _)| *chk <= id) {
            committed.extend(rows);
        }
        Ok(())
    }
}

/// Runs a job of `parallelism` subtasks of `source` chained to a `Staging` sink, checkpointed
/// every 50 ms, until `expected` records are committed (or a 30 s guard against waiting forever
/// passes: not a timing claim), then cancels it; panics with `stuck` if the cancel does not end
/// the job. Returns the committed records and the checkpoints completed.
async fn committed_then_cancelled<S, F>(
    name: &str,
    parallelism: u32,
    source: F,
    expected: usize,
    stuck: &str,
) -> (Vec<u64>, u64)
where
    S: Source<u64>,
    F: Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let mut checkpoint = CheckpointConfig::new(dir.path().join("checkpoints"));
    checkpoint.interval = Duration::from_millis(50);
    let mut config = JobConfig::new(name);
    config.checkpointing = Some(checkpoint);
    let committed: Arc<Mutex<Vec<u64>>> = Arc::default();
    let mut job = JobBuilder::new(config);
    let c = committed.clone();
    job.source("numbers", parallelism, source)
        .sink("out", move |_| Staging {
            current: Vec::new(),
            staged: Vec::new(),
            committed: c.clone(),
            first: Duration::from_millis(5),
        });
    let handle = job.build().unwrap().start();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while committed.lock().unwrap().len() < expected && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let done = handle.metrics().checkpoints().completed;
    handle.cancel();
    tokio::time::timeout(Duration::from_secs(30), handle.join())
        .await
        .expect(stuck)
        .unwrap();
    let got = committed.lock().unwrap().clone();
    (got, done)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_waiting_for_records_is_checkpointed_and_its_chained_sink_commits() {
    let polls = Arc::new(AtomicU64::new(0));
    let p = polls.clone();
    let (committed, done) = committed_then_cancelled(
        "waiting",
        1,
        move |_: &SubtaskInfo| Quiet {
            left: (0..100).collect(),
            polls: p.clone(),
        },
        100,
        "a job whose source waits for records cancels",
    )
    .await;
    assert_eq!(
        committed,
        (0..100).collect::<Vec<_>>(),
        "the records read before the wait were committed ({done} checkpoints completed)"
    );
    assert!(done >= 1, "{done} checkpoints");
    assert_eq!(
        polls.load(Ordering::SeqCst),
        1,
        "polled again although the source said nothing was available"
    );
}

/// Emits its numbers in its first poll, then says `Idle` at once from every poll without ever
/// waiting (against `poll_next`'s contract) and keeps the default `available`, which completes
/// at once: its task never has to yield on its own.
struct Spinning {
    left: Vec<u64>,
}

impl Source<u64> for Spinning {
    async fn poll_next(&mut self, out: &mut Vec<u64>) -> crate::Result<SourceStatus> {
        if self.left.is_empty() {
            return Ok(SourceStatus::Idle);
        }
        out.append(&mut self.left);
        Ok(SourceStatus::CaughtUp)
    }
}

/// A source that never waits spins its task, but the task still yields to the rest of the job:
/// checkpoints complete, the chained sink commits and the job cancels (it used to hang).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_never_waits_is_checkpointed_and_cancels() {
    // Two subtasks: two spinning tasks on a runtime of two worker threads.
    let (mut got, done) = committed_then_cancelled(
        "spinning",
        2,
        |info: &SubtaskInfo| Spinning {
            left: (0..100).map(|n| n * 2 + info.index as u64).collect(),
        },
        200,
        "a job whose sources never wait cancels",
    )
    .await;
    got.sort_unstable();
    assert_eq!(got, (0..200).collect::<Vec<_>>(), "{done} checkpoints completed");
    assert!(done >= 1, "{done} checkpoints");
}

/// Reads only once a checkpoint has recorded where it starts (`reads_after_first_checkpoint`),
/// and emits nothing: counts its polls, the checkpoints completed when it was first polled, and
/// the polls before its first snapshot.
struct HeldAtStart {
    seen: Arc<Mutex<HeldSeen>>,
}

#[derive(Default, Debug)]
struct HeldSeen {
    polls: u64,
    completed: u64,
    completed_at_first_poll: Option<u64>,
    polls_at_first_snapshot: Option<u64>,
}

impl Source<u64> for HeldAtStart {
    fn reads_after_first_checkpoint(&self) -> bool {
        true
    }

    async fn poll_next(&mut self, _out: &mut Vec<u64>) -> crate::Result<SourceStatus> {
        let mut seen = self.seen.lock().unwrap();
        seen.polls += 1;
        let completed = seen.completed;
        seen.completed_at_first_poll.get_or_insert(completed);
        Ok(SourceStatus::Idle)
    }

    async fn available(&mut self) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    async fn snapshot_state(&mut self, _ctx: &mut SnapshotContext) -> crate::Result<()> {
        let mut seen = self.seen.lock().unwrap();
        let polls = seen.polls;
        seen.polls_at_first_snapshot.get_or_insert(polls);
        Ok(())
    }

    async fn notify_checkpoint_complete(&mut self, _id: CheckpointId) -> crate::Result<()> {
        self.seen.lock().unwrap().completed += 1;
        Ok(())
    }
}

/// Runs one `HeldAtStart` subtask chained to a `Staging` sink (checkpointed every hour, or not at
/// all; the sink's first checkpoint taking `first`, against a checkpoint timeout of 1 s) until it
/// has been polled (a 30 s guard against waiting forever: not a timing claim), then cancels the
/// job; returns what the source saw.
async fn held_at_start(checkpointing: bool, first: Duration) -> HeldSeen {
    let dir = tempfile::tempdir().unwrap();
    let mut config = JobConfig::new("held");
    if checkpointing {
        let mut checkpoint = CheckpointConfig::new(dir.path().join("checkpoints"));
        checkpoint.interval = Duration::from_secs(3600);
        checkpoint.timeout = Duration::from_secs(1);
        config.checkpointing = Some(checkpoint);
    }
    let seen: Arc<Mutex<HeldSeen>> = Arc::default();
    let mut job = JobBuilder::new(config);
    let s = seen.clone();
    job.source("held", 1, move |_| HeldAtStart { seen: s.clone() })
        .sink("out", move |_| Staging {
            current: Vec::new(),
            staged: Vec::new(),
            committed: Arc::default(),
            first,
        });
    let handle = job.build().unwrap().start();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seen.lock().unwrap().polls == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle.cancel();
    tokio::time::timeout(Duration::from_secs(30), handle.join())
        .await
        .expect("the job cancels")
        .unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    seen
}

/// A source that reads only once a checkpoint recorded its start is snapshotted before its first
/// poll and polled only after that checkpoint completed — taken at once, not after the hour's
/// interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_held_until_its_start_is_checkpointed_is_polled_after_the_first_checkpoint() {
    let seen = held_at_start(true, Duration::from_millis(5)).await;
    assert!(
        seen.polls > 0,
        "never polled (the first checkpoint was not taken at once?): {seen:?}"
    );
    assert_eq!(seen.polls_at_first_snapshot, Some(0), "{seen:?}");
    assert!(
        seen.completed_at_first_poll.is_some_and(|n| n >= 1),
        "polled before a checkpoint completed: {seen:?}"
    );
}

/// Without checkpointing nothing would ever complete: the source is not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_asking_to_be_held_is_polled_at_once_without_checkpointing() {
    let seen = held_at_start(false, Duration::from_millis(5)).await;
    assert!(seen.polls > 0, "never polled: {seen:?}");
    assert_eq!(seen.completed_at_first_poll, Some(0), "{seen:?}");
}

/// The first checkpoint of a held source fails (it times out: the sink's first snapshot takes 3 s
/// against a 1 s timeout): the next is taken within a second, not after the interval (an hour),
/// and the source is polled once it completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_source_whose_first_checkpoint_fails_is_checkpointed_again_at_once() {
    let seen = held_at_start(true, Duration::from_secs(3)).await;
    assert!(
        seen.polls > 0,
        "never polled: after the failed first checkpoint the next waits for the interval: {seen:?}"
    );
    assert!(
        seen.completed_at_first_poll.is_some_and(|n| n >= 1),
        "polled before a checkpoint completed: {seen:?}"
    );
}
