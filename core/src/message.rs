//! What flows between operators: records and in-band control messages.

use serde::{Deserialize, Serialize};

/// Identifies a checkpoint; increases by one per triggered checkpoint within a job's life,
/// across restarts.
pub type CheckpointId = u64;

/// Whether a snapshot is a periodic checkpoint or a user-requested savepoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotKind {
    /// Periodic, owned by the job, retained per configuration.
    Checkpoint,
    /// Requested by a user, self-contained, owned by the user.
    Savepoint,
}

/// Checkpoint barrier N: every record before it belongs to checkpoint N's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointBarrier {
    /// The checkpoint.
    pub id: CheckpointId,
    /// When the coordinator triggered it (milliseconds since the Unix epoch).
    pub timestamp_ms: u64,
    /// Checkpoint or savepoint.
    pub kind: SnapshotKind,
}

/// An event-time watermark: no record with a smaller timestamp follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Watermark(pub i64);

/// One element of a stream between subtasks.
#[derive(Debug, Clone, PartialEq)]
pub enum Message<T> {
    /// A data record.
    Record(T),
    /// A checkpoint barrier.
    Barrier(CheckpointBarrier),
    /// An event-time watermark.
    Watermark(Watermark),
    /// Checkpoint N was aborted upstream: stop aligning it and forward the marker.
    CancelCheckpoint(CheckpointId),
    /// The sending subtask is idle (e.g. a source with no partition, or whose partitions have had
    /// no record for its idle timeout): leave it out of the combined watermark until it sends a
    /// record or a watermark again.
    Idle,
    /// The sending subtask has no more data (an idle source sends this too when it is done).
    EndOfStream,
}
