//! `exactly-twophase`: the two-phase-commit sink trait and the one generic driver that binds any
//! implementation to the checkpoints of `exactly-core`.
//!
//! The protocol (see `EXACTLY_ONCE_NOTES.md`): records of checkpoint N go into an open
//! transaction; at barrier N the driver pre-commits it and stores the committable in the
//! checkpoint; when N is durable every committable up to N is committed, in order. After a crash
//! the restored committables are committed *before* anything else touches the external system,
//! then transactions this sink owns that no checkpoint needs are aborted.
//!
//! Guarantees: a committable is committed only after the checkpoint holding it is durable; a
//! committable in a durable checkpoint is committed at the latest on the next start; a transaction
//! the external system aborted before its commit (e.g. on timeout) is reported as data loss
//! ([`CommitError::Lost`]), never as success.

mod driver;
mod error;
pub mod prepared;
#[cfg(test)]
mod prepared_sim;
mod sink;

pub use driver::{CommitRetry, TwoPhaseMetrics, TwoPhaseSink, RESTART_ALLOWANCE};
pub use error::{CommitError, Result, TwoPhaseError};
pub use sink::{Committed, Committing, PreCommitted, PreCommitting, RecoveryContext, TwoPhaseCommitSink};
