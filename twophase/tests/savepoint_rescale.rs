//! The product's own savepoint-and-rescale path through the two-phase driver: a job is stopped
//! with a savepoint mid-stream, then resumed from it with more sink subtasks (and, in a second
//! test, fewer). The union-state committables must each be committed by exactly one subtask, and
//! every record must reach the external system exactly once.
//!
//! The external system is strict where real ones are strict: committing an already committed
//! transaction succeeds (Kafka and XA both answer so, via the probe or the progress row), but a
//! transaction nobody commits stays prepared (its records missing), and a record committed twice
//! is counted twice. Written only against the public API of `exactly-core` and `exactly-twophase`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exactly_core::coordinator::CheckpointConfig;
use exactly_core::runtime::{InitContext, JobBuilder, JobConfig, SnapshotContext, Source, SourceStatus, SubtaskInfo};
use exactly_core::CheckpointId;
use exactly_twophase::{CommitError, PreCommitted, RecoveryContext, TwoPhaseCommitSink, TwoPhaseSink};

/// Emits index, index + p, ... < total, a batch at a time; its position is operator list state.
struct Numbers {
    next: u64,
    step: u64,
    total: u64,
    pause: Duration,
}

impl Source<u64> for Numbers {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        if let Some(pos) = ctx.list_state("pos").first() {
            self.next = u64::from_be_bytes(pos.as_slice().try_into().expect("8 bytes"));
        }
        Ok(())
    }

    async fn poll_next(&mut self, out: &mut Vec<u64>) -> exactly_core::Result<SourceStatus> {
        if self.next >= self.total {
            return Ok(SourceStatus::End);
        }
        while out.len() < 20 && self.next < self.total {
            out.push(self.next);
            self.next += self.step;
        }
        tokio::time::sleep(self.pause).await;
        Ok(SourceStatus::More)
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        ctx.put_list_state("pos", vec![self.next.to_be_bytes().to_vec()]);
        Ok(())
    }
}

#[derive(Default)]
struct External {
    next_txn: u64,
    prepared: BTreeMap<u64, Vec<u64>>,
    committed: BTreeMap<u64, Vec<u64>>,
    /// Commits of a transaction that was already committed (legitimate after a restore).
    recommits: u32,
}

#[derive(Clone, Default)]
struct Ext(Arc<Mutex<External>>);

impl TwoPhaseCommitSink<u64> for Ext {
    type Transaction = Vec<u64>;
    type Committable = u64;

    async fn begin(&mut self, _id: CheckpointId) -> exactly_core::Result<Vec<u64>> {
        Ok(Vec::new())
    }

    async fn write(&mut self, txn: &mut Vec<u64>, records: Vec<u64>) -> exactly_core::Result<()> {
        txn.extend(records);
        Ok(())
    }

    async fn pre_commit(
        &mut self,
        txn: Vec<u64>,
        _id: CheckpointId,
    ) -> exactly_core::Result<PreCommitted<u64, Vec<u64>>> {
        if txn.is_empty() {
            return Ok(PreCommitted::Empty);
        }
        let mut e = self.0.lock().unwrap();
        e.next_txn += 1;
        let t = e.next_txn;
        e.prepared.insert(t, txn);
        Ok(PreCommitted::Committable(t))
    }

    async fn commit(&mut self, t: &u64) -> Result<(), CommitError> {
        let mut e = self.0.lock().unwrap();
        if let Some(rows) = e.prepared.remove(t) {
            e.committed.insert(*t, rows);
            Ok(())
        } else if e.committed.contains_key(t) {
            e.recommits += 1;
            Ok(())
        } else {
            Err(CommitError::Lost {
                what: format!("transaction {t}"),
                source: "neither prepared nor committed".into(),
            })
        }
    }

    async fn abort(&mut self, _txn: Vec<u64>) -> exactly_core::Result<()> {
        Ok(())
    }

    async fn abort_lingering(&mut self, _ctx: &RecoveryContext<'_, u64>) -> exactly_core::Result<()> {
        Ok(())
    }
}

fn config(dir: &Path) -> JobConfig {
    let mut checkpoint = CheckpointConfig::new(dir.join("checkpoints"));
    checkpoint.interval = Duration::from_millis(20);
    let mut c = JobConfig::new("rescale");
    c.checkpointing = Some(checkpoint);
    c
}

fn job(config: JobConfig, total: u64, sinks: u32, ext: &Ext, pause: Duration) -> exactly_core::runtime::Job {
    let mut job = JobBuilder::new(config);
    let ext = ext.clone();
    job.source("numbers", 2, move |info: &SubtaskInfo| Numbers {
        next: u64::from(info.index),
        step: u64::from(info.parallelism),
        total,
        pause,
    })
    .rebalance(sinks)
    .sink("out", move |_| TwoPhaseSink::new(ext.clone()));
    job.build().unwrap()
}

/// Every record 0..total committed exactly once, and no transaction left prepared.
fn assert_exactly_once(ext: &Ext, total: u64) {
    let e = ext.0.lock().unwrap();
    assert!(
        e.prepared.is_empty(),
        "transactions never committed: {:?}",
        e.prepared.keys()
    );
    let mut seen = vec![0u32; total as usize];
    for rows in e.committed.values() {
        for &r in rows {
            seen[r as usize] += 1;
        }
    }
    let missing: Vec<_> = (0..total).filter(|&r| seen[r as usize] == 0).take(10).collect();
    let duplicated: Vec<_> = (0..total).filter(|&r| seen[r as usize] > 1).take(10).collect();
    assert!(
        missing.is_empty() && duplicated.is_empty(),
        "missing (first 10): {missing:?}; duplicated (first 10): {duplicated:?}"
    );
}

async fn stop_then_resume_with(first: u32, second: u32) {
    let dir = tempfile::tempdir().unwrap();
    let ext = Ext::default();
    let total = 6_000;
    let handle = job(config(dir.path()), total, first, &ext, Duration::from_millis(2)).start();
    // Mid-stream: some transactions committed, the savepoint's own pending.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while ext.0.lock().unwrap().committed.len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "no commit within 60 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let savepoint = handle.stop_with_savepoint(dir.path().join("savepoints")).await.unwrap();
    handle.join().await.unwrap();
    let partial: usize = ext.0.lock().unwrap().committed.values().map(Vec::len).sum();
    assert!(partial < total as usize, "stopped mid-stream ({partial} of {total})");

    let mut cfg = config(&dir.path().join("second"));
    cfg.restore_from = Some(savepoint);
    job(cfg, total, second, &ext, Duration::ZERO).run().await.unwrap();
    assert_exactly_once(&ext, total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn savepoint_then_scale_out_commits_each_record_once() {
    stop_then_resume_with(2, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn savepoint_then_scale_in_commits_each_record_once() {
    stop_then_resume_with(3, 1).await;
}
