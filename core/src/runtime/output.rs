//! What every chained operator implements and what travels with a checkpoint barrier through a
//! chain, and the deferred parts of snapshots: the bottom of the runtime, importing none of it.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::coordinator::TaskSnapshot;
use crate::error::Result;
use crate::message::{CheckpointBarrier, CheckpointId, Watermark};
use crate::storage::CheckpointStorage;

pub(crate) type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A checkpoint outcome delivered to every operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notification {
    Complete(CheckpointId),
    Aborted(CheckpointId),
}

/// What a checkpoint barrier carries through a chain.
pub(crate) struct BarrierCtx<'a> {
    pub(crate) barrier: CheckpointBarrier,
    pub(crate) snapshot: &'a mut TaskSnapshot,
    pub(crate) storage: Option<&'a Arc<dyn CheckpointStorage>>,
    /// False for a task that already ended: snapshot, but nothing downstream listens.
    pub(crate) forward: bool,
    /// Parts of operators' snapshots still running (see `SnapshotContext::defer`), with the
    /// index of their operator's entry in `snapshot`.
    pub(crate) deferred: &'a mut Vec<(usize, DeferredSnapshot)>,
}

/// One node of a chain, receiving records of type `T`.
pub(crate) trait Output<T>: Send {
    /// Initialises the node and the rest of the chain (restored state is applied here).
    fn open(&mut self) -> BoxFut<'_, Result<()>>;
    fn record(&mut self, record: T) -> Result<()>;
    fn watermark(&mut self, watermark: Watermark) -> Result<()>;
    /// This subtask is idle (no watermark from it until it sends records or watermarks again).
    fn idle(&mut self) -> Result<()>;
    /// Sends or writes what the chain buffered.
    fn flush(&mut self) -> BoxFut<'_, Result<()>>;
    fn barrier<'a>(&'a mut self, ctx: BarrierCtx<'a>) -> BoxFut<'a, Result<()>>;
    fn cancel(&mut self, id: CheckpointId) -> BoxFut<'_, Result<()>>;
    fn notify(&mut self, n: Notification) -> BoxFut<'_, Result<()>>;
    /// End of input.
    fn end(&mut self) -> BoxFut<'_, Result<()>>;
    /// Graceful shutdown: release what is open.
    fn close(&mut self) -> BoxFut<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// The part of an operator's snapshot that finishes after `snapshot_state` returned (see
/// [`SnapshotContext::defer`](super::SnapshotContext::defer)).
pub type DeferredSnapshot = Pin<Box<dyn Future<Output = Result<DeferredState>> + Send + 'static>>;

/// State a deferred part of a snapshot adds when it ends (entries of the same name replace what
/// `snapshot_state` put).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct DeferredState {
    pub(crate) list_state: BTreeMap<String, Vec<Vec<u8>>>,
    pub(crate) union_state: BTreeMap<String, Vec<Vec<u8>>>,
}

impl DeferredState {
    /// Stores list state `name` (as [`SnapshotContext::put_list_state`](super::SnapshotContext::put_list_state)).
    pub fn put_list_state(&mut self, name: impl Into<String>, entries: Vec<Vec<u8>>) {
        self.list_state.insert(name.into(), entries);
    }

    /// Stores union list state `name` (as [`SnapshotContext::put_union_state`](super::SnapshotContext::put_union_state)).
    pub fn put_union_state(&mut self, name: impl Into<String>, entries: Vec<Vec<u8>>) {
        self.union_state.insert(name.into(), entries);
    }

    pub(crate) fn add_to(
        self,
        list_state: &mut BTreeMap<String, Vec<Vec<u8>>>,
        union_state: &mut BTreeMap<String, Vec<Vec<u8>>>,
    ) {
        list_state.extend(self.list_state);
        union_state.extend(self.union_state);
    }
}
