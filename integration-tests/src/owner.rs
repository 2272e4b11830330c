//! Checkpoint storage for testing a sink's recovery against its owner check: the location is
//! lost after a number of checks (another run took it over).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use exactly_core::checkpoint::CheckpointMetadata;
use exactly_core::storage::{CheckpointStorage, Snapshot, SnapshotWriter};
use exactly_core::{CheckpointId, CoreError};

/// Checkpoint storage whose owner check passes `ok` times, then finds the location taken over.
/// Everything else is refused (a sink's recovery uses only the check).
#[derive(Debug)]
pub struct OwnerLostAfter {
    ok: u32,
    calls: AtomicU32,
}

impl OwnerLostAfter {
    /// Passes `ok` owner checks, then fails every one.
    pub fn new(ok: u32) -> Self {
        OwnerLostAfter {
            ok,
            calls: AtomicU32::new(0),
        }
    }

    /// Owner checks made so far.
    pub fn checks(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

fn unused<T>() -> exactly_core::Result<T> {
    Err(CoreError::Config("not used by this test".into()))
}

impl CheckpointStorage for OwnerLostAfter {
    fn writer(&self, _: CheckpointId) -> exactly_core::Result<Arc<dyn SnapshotWriter>> {
        unused()
    }
    fn commit(&self, _: &CheckpointMetadata) -> exactly_core::Result<()> {
        unused()
    }
    fn abort(&self, _: CheckpointId) -> exactly_core::Result<()> {
        unused()
    }
    fn completed(&self) -> exactly_core::Result<Vec<CheckpointId>> {
        unused()
    }
    fn open(&self, _: CheckpointId) -> exactly_core::Result<Snapshot> {
        unused()
    }
    fn latest(&self) -> exactly_core::Result<Option<Snapshot>> {
        unused()
    }
    fn retain(&self, _: usize) -> exactly_core::Result<Vec<CheckpointId>> {
        unused()
    }
    fn discard_all(&self) -> exactly_core::Result<()> {
        unused()
    }
    fn export(&self, _: CheckpointId, _: &std::path::Path) -> exactly_core::Result<()> {
        unused()
    }
    fn check_owner(&self) -> exactly_core::Result<()> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.ok {
            return Ok(());
        }
        Err(CoreError::LocationOwned {
            location: "test-location".into(),
            reason: "another run took it over".into(),
        })
    }
}
