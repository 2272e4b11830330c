//! `exactly-core`: the checkpointed dataflow engine.
//!
//! Records and checkpoint barriers flow through chains of operators; a coordinator injects
//! barriers at the sources, multi-input operators align them, every operator snapshots its state,
//! the checkpoint is made durable and only then is completion notified. This crate knows nothing
//! of Kafka or MySQL: connectors build on it.
//!
//! Guarantees (with checkpointing in exactly-once mode):
//! - a completed checkpoint is a consistent cut: every operator's state reflects exactly the
//!   records before barrier N on each of its inputs;
//! - `notify_checkpoint_complete(N)` is sent only after checkpoint N's metadata is durable, and
//!   implies every checkpoint before N is complete too;
//! - a restart restores every operator from the same completed checkpoint (or the savepoint the job
//!   started from, whichever is newer).
//!
//! Entry points: [`runtime::JobBuilder`] to build a job, [`runtime::Job::start`] to run it.

pub mod checkpoint;
pub mod coordinator;
pub mod error;
pub mod failpoint;
pub mod message;
pub mod net;
mod private_fs;
pub mod restart;
pub mod runtime;
pub mod secret;
#[cfg(test)]
mod sim;
pub mod state;
pub mod storage;
pub use private_fs::default_state_root;

pub use error::{BoxError, CoreError, ErrorClass, Result};
pub use message::{CheckpointBarrier, CheckpointId, Message, SnapshotKind, Watermark};
