use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_core::runtime::{Sink, SnapshotContext, SubtaskInfo};
use exactly_core::CheckpointId;

/// Subtask 0 of 1 of operator `uid`, starting: for a source or sink driven by hand.
pub fn subtask_info(uid: &str) -> SubtaskInfo {
    SubtaskInfo::new(uid, 0, 1)
}

/// Records a sink committed, shared with the test.
pub type Committed<T> = Arc<Mutex<Vec<T>>>;

/// A test sink with the visibility rule of a transactional one: records reach `committed` only
/// when the checkpoint after them completes. What a cancelled or crashed run had not committed
/// is gone, so `committed` over several runs shows exactly what an exactly-once sink would.
pub struct CommittingCollector<T> {
    current: Vec<T>,
    staged: BTreeMap<CheckpointId, Vec<T>>,
    committed: Committed<T>,
}

impl<T> CommittingCollector<T> {
    /// A collector committing into `committed`.
    pub fn new(committed: Committed<T>) -> Self {
        CommittingCollector {
            current: Vec::new(),
            staged: BTreeMap::new(),
            committed,
        }
    }
}

impl<T: Send + 'static> Sink<T> for CommittingCollector<T> {
    async fn write(&mut self, records: Vec<T>) -> exactly_core::Result<()> {
        self.current.extend(records);
        Ok(())
    }
    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        self.staged.insert(ctx.checkpoint_id, std::mem::take(&mut self.current));
        Ok(())
    }
    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> exactly_core::Result<()> {
        let later = self.staged.split_off(&(id + 1));
        let done = std::mem::replace(&mut self.staged, later);
        let mut committed = self.committed.lock().expect("not poisoned");
        for (_, records) in done {
            committed.extend(records);
        }
        Ok(())
    }
}

/// Bounds a step that, broken, would wait for a lock no one releases (PostgreSQL waits forever,
/// MariaDB until its lock wait timeout): the test fails saying so instead of hanging. Not a
/// timing claim.
pub async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> Result<T> {
    match tokio::time::timeout(Duration::from_secs(120), f).await {
        Ok(v) => Ok(v),
        Err(_) => {
            anyhow::bail!("{what} still waiting after 120 s: it waits for a lock only its own commit would release")
        }
    }
}

/// Polls `f` until it returns true or `timeout` passes.
pub async fn eventually(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Damages the metadata of the newest completed checkpoint in the local checkpoint directory
/// `checkpoints` (one flipped byte, so its checksum fails); returns its id.
pub fn damage_newest_checkpoint(checkpoints: &std::path::Path) -> Result<CheckpointId> {
    use anyhow::Context;
    let newest = std::fs::read_dir(checkpoints)?
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("chk-")?.parse::<u64>().ok())
        // Completed: a `_metadata` of `void\n` marks a void checkpoint (given up by a restart).
        .filter(|id| std::fs::read(checkpoints.join(format!("chk-{id}/_metadata"))).is_ok_and(|m| m != b"void\n"))
        .max()
        .context("a completed checkpoint")?;
    let md = checkpoints.join(format!("chk-{newest}/_metadata"));
    let mut bytes = std::fs::read(&md)?;
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&md, bytes)?;
    Ok(newest)
}
