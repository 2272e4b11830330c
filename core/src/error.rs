//! Errors of the engine, classified so the runtime knows whether to retry, restart or stop.

use std::path::PathBuf;

use crate::message::CheckpointId;

/// A boxed error from user code (operators, sources, sinks) or a connector.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result of the engine's operations.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;

/// How the runtime should react to an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Transient (a network stall, a broker restart): back off and retry the same operation.
    Retriable,
    /// The attempt cannot continue (fenced, invalid state, a failed task): restart from the latest
    /// completed checkpoint as the restart strategy allows.
    Restart,
    /// Restarting cannot help (bad configuration, corrupt state, data known lost): stop the job
    /// and say what is at risk.
    Fatal,
}

/// Errors of `exactly-core`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoreError {
    /// An I/O operation on checkpoint storage or local state failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("writing", "reading", "renaming", ...).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Stored data failed validation (checksum, magic, version, truncation).
    #[error("corrupt checkpoint data at {path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A value could not be encoded or decoded.
    #[error("serialization of {what} failed: {reason}")]
    Serialization {
        /// What was being (de)serialized.
        what: String,
        /// The codec's message.
        reason: String,
    },
    /// The RocksDB state backend failed.
    #[cfg(feature = "rocksdb")]
    #[error("rocksdb state backend: {0}")]
    RocksDb(#[from] rocksdb::Error),
    /// No checkpoint or savepoint to restore from was found where one was required.
    #[error("no completed checkpoint found in {0}")]
    NoCheckpoint(PathBuf),
    /// The newest completed checkpoint reads completely but does not verify (checksum, decoding,
    /// a referenced file missing). The job does not fall back to an older checkpoint on its own:
    /// the newer one's transactions may have committed output that an older one writes again.
    #[error(
        "the newest checkpoint, {id} in {dir}, cannot be restored ({reason}); the job does not fall back to an \
         older checkpoint by itself, because output the newer one committed would be written again. \
         Restore an older checkpoint explicitly (restore_from with accept_replay; `exactly run --from \
         {dir}/chk-<id> --accept-replay`) to accept possible duplicates{older}"
    )]
    NewestCheckpointUnusable {
        /// The checkpoint.
        id: CheckpointId,
        /// The checkpoint directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// Older checkpoints that exist, as a hint (", older ones: 40, 41" or empty).
        older: String,
    },
    /// The newest checkpoint cannot be read and a sink could not show that none of its
    /// transactions after the newest readable one committed: restoring that one could write
    /// output again.
    #[error(
        "{unusable}. The newest readable checkpoint, {restored}, would be restored only if every sink \
         showed that none of its transactions after it committed; {unproven} of {sinks} sink \
         subtask(s) cannot tell (a Kafka sink, or a sink that keeps no record of its commits)"
    )]
    FallbackNotProven {
        /// Why the newest checkpoint cannot be read, and what to do (the `NewestCheckpointUnusable`
        /// message).
        unusable: String,
        /// The newest readable checkpoint.
        restored: CheckpointId,
        /// Sink subtasks that did not prove it.
        unproven: usize,
        /// Sink subtasks of this run.
        sinks: usize,
    },
    /// The checkpoint directory has held completed checkpoints but holds none now. Starting from
    /// the source's start position would replay everything into exactly-once sinks.
    #[error(
        "{0} has held completed checkpoints of this job but none is left: refusing to start from the \
         source's start position, which would write everything again. Restore a savepoint or \
         checkpoint explicitly (restore_from; `exactly run --from DIR`), or remove {0} to start over"
    )]
    CheckpointsVanished(PathBuf),
    /// Writing checkpoint `id`'s metadata failed in a way that leaves open whether it was
    /// written (a lost answer, a timeout): the checkpoint may yet appear, so its files stay and
    /// its transactions stay pending (the next completed checkpoint commits them, or a restore
    /// of this one if it was written).
    #[error(
        "whether checkpoint {id} was written is unknown ({reason}): its files stay, and the next \
         completed checkpoint (or a restore) settles it"
    )]
    CommitOutcomeUnknown {
        /// The checkpoint.
        id: CheckpointId,
        /// What happened.
        reason: String,
    },
    /// This run could not renew its claim on the checkpoint location for most of a lease (an
    /// outage of the store): no checkpoint is made durable until it has, since a start on another
    /// machine may take the location over after a lease.
    #[error(
        "the claim on {location} was last renewed {seconds} s ago and cannot be renewed now: no \
         checkpoint is made durable until it is"
    )]
    ClaimNotRenewed {
        /// The checkpoint location.
        location: PathBuf,
        /// Seconds since the last renewal.
        seconds: u64,
    },
    /// Another run of the job owns the checkpoint location (see `storage/owner.rs`).
    #[error(
        "{location} is the checkpoint location of another run of this job ({reason}): two runs on one \
         location would write the same output twice. Stop the other run first; if it is gone and \
         this is wrong, remove {location}/_owner"
    )]
    LocationOwned {
        /// The checkpoint location.
        location: PathBuf,
        /// Who owns it, or what showed it.
        reason: String,
    },
    /// An explicit restore names a snapshot older than the newest completed checkpoint in the
    /// job's checkpoint directory, and replay was not accepted.
    #[error(
        "{path} is checkpoint/savepoint {restore_id}, older than checkpoint {newest} in {dir}: the newer \
         checkpoints' transactions may have committed output that restoring {restore_id} writes again. \
         Pass accept_replay (`--accept-replay`) to restore it anyway, or restore the newer one"
    )]
    RestoreOlderThanNewest {
        /// The snapshot asked for.
        path: PathBuf,
        /// Its id.
        restore_id: CheckpointId,
        /// The newest completed checkpoint in the directory.
        newest: CheckpointId,
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// A savepoint holds state for operators the job does not have.
    #[error(
        "the snapshot holds state for operator uid(s) {uids:?} that this job does not have; \
         set allow_non_restored_state to drop it"
    )]
    UnknownOperatorState {
        /// The uids with state but no operator.
        uids: Vec<String>,
    },
    /// A checkpoint was declined or aborted.
    #[error("checkpoint {id} aborted: {reason}")]
    CheckpointAborted {
        /// The checkpoint.
        id: u64,
        /// Why.
        reason: String,
    },
    /// Too many checkpoints failed in a row.
    #[error("{failures} consecutive checkpoint failures exceed the tolerated {tolerated}")]
    TooManyCheckpointFailures {
        /// How many failed in a row.
        failures: u32,
        /// The configured tolerance.
        tolerated: u32,
    },
    /// Invalid configuration; the message says what to change.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Invalid job graph (a wiring mistake of the program).
    #[error("invalid job: {0}")]
    InvalidJob(String),
    /// User code or a connector failed.
    #[error("{operator} failed: {source}")]
    Operator {
        /// The operator's uid or name.
        operator: String,
        /// Classification chosen by the operator.
        class: ErrorClass,
        /// The error.
        #[source]
        source: BoxError,
    },
    /// The restart strategy gave up; carries the last failure.
    #[error("job failed after {restarts} restart(s); last failure: {last}")]
    RestartsExhausted {
        /// Restarts made before giving up.
        restarts: u32,
        /// The failure that ended the job.
        last: Box<CoreError>,
    },
    /// The job failed every attempt to start (before its first completed checkpoint).
    #[error("the job did not start: {attempts} attempts failed before its first checkpoint (startup_attempts); last failure: {last}")]
    StartupFailed {
        /// Attempts made.
        attempts: u32,
        /// The failure that ended the job.
        last: Box<CoreError>,
    },
    /// A task ended unexpectedly (a panic in user code, a dropped channel).
    #[error("task {task} ended unexpectedly: {reason}")]
    TaskLost {
        /// The task.
        task: String,
        /// What happened.
        reason: String,
    },
}

/// Whether an I/O error of this kind says that what was asked cannot be reached now (refused,
/// reset or timed out; a network down) rather than that it refuses or is misnamed: an outage.
/// For connectors too (a database connection's I/O error).
pub fn unreachable_kind(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        kind,
        K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::NotConnected
            | K::TimedOut
            | K::BrokenPipe
            | K::Interrupted
            | K::HostUnreachable
            | K::NetworkUnreachable
            | K::NetworkDown
            | K::ResourceBusy
            | K::StaleNetworkFileHandle
    )
}

impl CoreError {
    /// How the runtime should react.
    pub fn class(&self) -> ErrorClass {
        match self {
            CoreError::Io { .. }
            | CoreError::CheckpointAborted { .. }
            | CoreError::TaskLost { .. }
            | CoreError::CommitOutcomeUnknown { .. }
            | CoreError::ClaimNotRenewed { .. } => ErrorClass::Restart,
            CoreError::Operator { class, .. } => *class,
            CoreError::TooManyCheckpointFailures { .. } => ErrorClass::Restart,
            #[cfg(feature = "rocksdb")]
            CoreError::RocksDb(_) => ErrorClass::Restart,
            CoreError::Corrupt { .. }
            | CoreError::NewestCheckpointUnusable { .. }
            | CoreError::FallbackNotProven { .. }
            | CoreError::CheckpointsVanished(_)
            | CoreError::RestoreOlderThanNewest { .. }
            | CoreError::LocationOwned { .. }
            | CoreError::Serialization { .. }
            | CoreError::NoCheckpoint(_)
            | CoreError::UnknownOperatorState { .. }
            | CoreError::Config(_)
            | CoreError::InvalidJob(_)
            | CoreError::RestartsExhausted { .. }
            | CoreError::StartupFailed { .. } => ErrorClass::Fatal,
        }
    }

    /// Whether this is storage that cannot be reached — a refused or reset connection, a timeout,
    /// a server error — rather than one that refuses or is misnamed (nothing there, no
    /// permission, a name that does not resolve, a certificate not trusted): an outage to wait
    /// for, not a configuration to fix. (A claim not renewed in time is one too.) The object
    /// store's errors are sorted into these kinds where they are made (`storage/object.rs`).
    pub fn is_unavailable(&self) -> bool {
        match self {
            CoreError::Io { source, .. } => unreachable_kind(source.kind()),
            CoreError::ClaimNotRenewed { .. } => true,
            // A sink's owner check before a step of its recovery, with the checkpoint store down,
            // wrapped as the sink's error (only that: a connector's own I/O error, wrapped the
            // same way, is the restart strategy's to judge).
            CoreError::Operator { source, .. } => source.downcast_ref::<CoreError>().is_some_and(|e| match e {
                CoreError::ClaimNotRenewed { .. } => true,
                CoreError::Io { path, source, .. } => {
                    unreachable_kind(source.kind())
                        && path
                            .file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("_owner"))
                }
                _ => false,
            }),
            _ => false,
        }
    }

    /// Wraps an error of user code or a connector, with its classification.
    pub fn operator(operator: impl Into<String>, class: ErrorClass, source: impl Into<BoxError>) -> Self {
        CoreError::Operator {
            operator: operator.into(),
            class,
            source: source.into(),
        }
    }

    /// An I/O error on `path` while `action` ("reading", "writing", ...): for sources and sinks
    /// on local files as much as for the engine's own storage (retried by the restart strategy).
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CoreError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn ser(what: impl Into<String>, err: impl std::fmt::Display) -> Self {
        CoreError::Serialization {
            what: what.into(),
            reason: err.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink's recovery that checks its owner with the checkpoint store down fails with the
    /// engine's error wrapped as the sink's: still an outage to wait for, not a failed start.
    #[test]
    fn an_outage_wrapped_by_a_connector_is_still_an_outage() {
        let outage = CoreError::ClaimNotRenewed {
            location: "s3://b/p".into(),
            seconds: 25,
        };
        assert!(CoreError::operator("sink", ErrorClass::Restart, outage).is_unavailable());
        let owner_read = CoreError::io(
            "reading",
            "s3://b/p/_owner",
            std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"),
        );
        assert!(CoreError::operator("sink", ErrorClass::Restart, owner_read).is_unavailable());
        // A connector's own I/O error stays the restart strategy's to judge.
        let pipe = CoreError::io(
            "writing",
            "/tmp/out.pipe",
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "reader gone"),
        );
        assert!(pipe.is_unavailable());
        assert!(!CoreError::operator("sink", ErrorClass::Restart, pipe).is_unavailable());
        let refused = CoreError::Config("bad".into());
        assert!(!CoreError::operator("sink", ErrorClass::Fatal, refused).is_unavailable());
        assert!(!CoreError::operator("sink", ErrorClass::Restart, "a connector's own error").is_unavailable());
    }
}
