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
}

impl Sink<u64> for Staging {
    async fn write(&mut self, records: Vec<u64>) -> crate::Result<()> {
        self.current.extend(records);
        Ok(())
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> crate::Result<()> {
        self.staged.push((ctx.checkpoint_id, std::mem::take(&mut self.current)));
        ctx.defer(async {
            tokio::time::sleep(Duration::from_millis(5)).await;
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
