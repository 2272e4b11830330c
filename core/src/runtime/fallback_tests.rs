//! A newest checkpoint that cannot be read: the job restores the newest older one only when every
//! sink proves that none of its transactions after it committed (then the unreadable one is set
//! aside and the job goes on); a sink that committed past it, or one that cannot tell, stops it
//! with nothing restored.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::start_tests::Counter;
use super::*;
use crate::coordinator::CheckpointConfig;
use crate::error::{CoreError, ErrorClass};
use crate::message::CheckpointId;
use crate::storage::{CheckpointStorage, Storage};

/// A sink whose external system records the newest checkpoint it committed (`committed`); with
/// `knows` false it keeps no such record and cannot prove anything.
struct Recording {
    committed: Arc<AtomicU64>,
    knows: bool,
}

impl Sink<u64> for Recording {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> crate::Result<()> {
        if ctx.unreadable_newer().is_some() && self.knows {
            let restored = ctx.info.restored_checkpoint.unwrap_or(0);
            let committed = self.committed.load(Ordering::SeqCst);
            if committed > restored {
                return Err(CoreError::operator(
                    "recording",
                    ErrorClass::Fatal,
                    format!("committed checkpoint {committed}, after the restored {restored}"),
                ));
            }
            ctx.prove_nothing_newer_committed();
            ctx.proofs_settled().await?;
        }
        Ok(())
    }

    async fn write(&mut self, _records: Vec<u64>) -> crate::Result<()> {
        Ok(())
    }

    fn can_prove_restores(&self) -> bool {
        self.knows
    }

    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> crate::Result<()> {
        self.committed.fetch_max(id, Ordering::SeqCst);
        Ok(())
    }
}

fn job(dir: &std::path::Path, committed: &Arc<AtomicU64>, knowing: [bool; 2]) -> Job {
    let mut checkpoint = CheckpointConfig::new(dir.join("checkpoints"));
    checkpoint.interval = Duration::from_millis(50);
    checkpoint.retained = 5;
    let mut config = JobConfig::new("fallback");
    config.checkpointing = Some(checkpoint);
    config.restart = crate::restart::RestartStrategy::None;
    let mut job = JobBuilder::new(config);
    let counts = job.source("counter", 1, |_: &SubtaskInfo| Counter {
        next: 0,
        down: Arc::new(AtomicU32::new(0)),
    });
    let branches = counts.fan_out(&["a", "b"]);
    for (branch, (name, knows)) in branches
        .into_iter()
        .zip([("a-sink", knowing[0]), ("b-sink", knowing[1])])
    {
        let committed = committed.clone();
        branch.sink(name, move |_: &SubtaskInfo| Recording {
            committed: committed.clone(),
            knows,
        });
    }
    job.build().unwrap()
}

/// Runs the job until it completed a few checkpoints and stops it; corrupts the newest one's
/// metadata; sets what the sinks' system shows committed to `committed_then` (the newest id
/// minus `behind`). Returns the newest id.
async fn first_run_then_corrupt(dir: &std::path::Path, committed: &Arc<AtomicU64>, behind: u64) -> CheckpointId {
    let handle = job(dir, committed, [true, true]).start();
    while handle.metrics().checkpoints().completed < 4 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let newest = handle.stop().await.unwrap();
    handle.join().await.unwrap();
    let storage = Storage::new(dir.join("checkpoints")).unwrap();
    let newest_id = *storage.completed().unwrap().last().unwrap();
    let md = newest.join("_metadata");
    let mut bytes = std::fs::read(&md).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&md, bytes).unwrap();
    // As if the process had died after the checkpoint was durable and before (behind = 1) or
    // after (behind = 0) the sinks committed it.
    committed.store(newest_id - behind, Ordering::SeqCst);
    newest_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_newest_checkpoint_falls_back_when_every_sink_proves_it_safe() {
    let dir = tempfile::tempdir().unwrap();
    let committed = Arc::new(AtomicU64::new(0));
    let newest = first_run_then_corrupt(dir.path(), &committed, 1).await;

    let handle = job(dir.path(), &committed, [true, true]).start();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while handle.metrics().checkpoints().completed < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = handle.metrics().checkpoints();
    handle.cancel();
    handle
        .join()
        .await
        .expect("restored the previous checkpoint and went on");
    assert!(stats.completed >= 2, "{stats:?}");
    let storage = Storage::new(dir.path().join("checkpoints")).unwrap();
    let ids = storage.completed().unwrap();
    assert!(
        !ids.contains(&newest),
        "the unreadable checkpoint is set aside: {ids:?}"
    );
    assert!(ids.iter().any(|&id| id > newest), "new checkpoints go past it: {ids:?}");
    let kept = dir.path().join(format!("checkpoints/chk-{newest}/_metadata.unusable"));
    assert!(kept.exists(), "its metadata is kept for inspection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_newest_checkpoint_stops_the_job_when_a_sink_committed_it_or_cannot_tell() {
    // The sinks committed the unreadable checkpoint: restoring the one before would write again.
    let dir = tempfile::tempdir().unwrap();
    let committed = Arc::new(AtomicU64::new(0));
    let newest = first_run_then_corrupt(dir.path(), &committed, 0).await;
    let err = job(dir.path(), &committed, [true, true]).run().await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Fatal, "{err}");
    assert!(
        err.to_string().contains(&format!("committed checkpoint {newest}")),
        "{err}"
    );
    let storage = Storage::new(dir.path().join("checkpoints")).unwrap();
    assert_eq!(storage.completed().unwrap().last(), Some(&newest), "nothing set aside");

    // One sink keeps no record of its commits: it cannot prove it, whatever the other shows.
    let dir = tempfile::tempdir().unwrap();
    let committed = Arc::new(AtomicU64::new(0));
    let newest = first_run_then_corrupt(dir.path(), &committed, 1).await;
    let err = job(dir.path(), &committed, [true, false]).run().await.unwrap_err();
    assert_eq!(err.class(), ErrorClass::Fatal, "{err}");
    assert!(
        matches!(
            err,
            CoreError::FallbackNotProven {
                unproven: 1,
                sinks: 2,
                ..
            }
        ) || err.to_string().contains("cannot show"),
        "{err}"
    );
    let storage = Storage::new(dir.path().join("checkpoints")).unwrap();
    assert_eq!(storage.completed().unwrap().last(), Some(&newest), "nothing set aside");
}
