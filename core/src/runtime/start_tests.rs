//! Telling a dependency that is down from a job that cannot start: a job that ran before (it
//! restores a checkpoint of its own location) waits for what its start cannot reach, however many
//! attempts that takes; a job that never ran gives up after `startup_attempts`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::coordinator::CheckpointConfig;
use crate::error::CoreError;

/// Counts up; its initialisation fails while `down` is above zero: a broker it cannot reach
/// (`ErrorClass::Retriable`).
pub(super) struct Counter {
    pub(super) next: u64,
    pub(super) down: Arc<AtomicU32>,
}

impl Source<u64> for Counter {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> crate::Result<()> {
        if self
            .down
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(CoreError::operator(
                "counter",
                crate::ErrorClass::Retriable,
                "connecting to 127.0.0.1:1: connection refused",
            ));
        }
        if let Some(pos) = ctx.list_state("pos").first() {
            self.next = u64::from_be_bytes(pos.as_slice().try_into().expect("8 bytes"));
        }
        Ok(())
    }

    async fn poll_next(&mut self, out: &mut Vec<u64>) -> crate::Result<SourceStatus> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        out.push(self.next);
        self.next += 1;
        Ok(SourceStatus::More)
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> crate::Result<()> {
        ctx.put_list_state("pos", vec![self.next.to_be_bytes().to_vec()]);
        Ok(())
    }
}

struct Discard;

impl Sink<u64> for Discard {
    async fn write(&mut self, _records: Vec<u64>) -> crate::Result<()> {
        Ok(())
    }
}

/// A counter job on `dir` whose source fails to start `down` times, started.
fn start(dir: &std::path::Path, down: u32) -> JobHandle {
    let mut checkpoint = CheckpointConfig::new(dir.join("checkpoints"));
    checkpoint.interval = Duration::from_millis(50);
    let mut config = JobConfig::new("counter");
    config.checkpointing = Some(checkpoint);
    config.startup_attempts = Some(3);
    config.restart = crate::restart::RestartStrategy::FixedDelay {
        attempts: 1000,
        delay: Duration::from_millis(10),
    };
    let down = Arc::new(AtomicU32::new(down));
    let mut job = JobBuilder::new(config);
    job.source("counter", 1, move |_: &SubtaskInfo| Counter {
        next: 0,
        down: down.clone(),
    })
    .sink("discard", |_: &SubtaskInfo| Discard);
    job.build().unwrap().start()
}

/// Runs the job until it completed `checkpoints` checkpoints (or a minute passed), then cancels
/// it; how it ended, and its restarts.
async fn run_until(handle: JobHandle, checkpoints: u64) -> (crate::Result<JobOutcome>, u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while handle.metrics().checkpoints().completed < checkpoints && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let restarts = handle.metrics().restarts();
    handle.cancel();
    (handle.join().await, restarts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_ran_before_waits_for_what_it_needs_however_many_attempts_that_takes() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = run_until(start(dir.path(), 0), 3).await;
    assert!(first.unwrap().checkpoints >= 3);
    // The process starts again while its broker is down: six attempts fail to start, twice the
    // start-up bound, then it is back.
    let (again, restarts) = run_until(start(dir.path(), 6), 2).await;
    let again = again.expect("a job that ran before waits for what it needs to start");
    assert!(again.checkpoints >= 2, "{again:?}");
    assert_eq!(restarts, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_never_ran_gives_up_after_its_startup_attempts() {
    let dir = tempfile::tempdir().unwrap();
    match start(dir.path(), 6).join().await {
        Err(CoreError::StartupFailed { attempts: 3, last }) => {
            assert!(last.to_string().contains("connection refused"), "{last}");
        }
        other => panic!("a job that never started must give up: {other:?}"),
    }
}
