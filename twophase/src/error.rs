//! Errors of two-phase commit, classified as Flink's `KafkaCommitter` classifies them.

use exactly_core::{BoxError, CheckpointId, CoreError, ErrorClass};

/// Why committing a pre-committed transaction failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// Transient (connection lost, coordinator moving): retry with backoff.
    #[error("retriable commit failure: {0}")]
    Retriable(#[source] BoxError),
    /// Fenced or in an invalid state: this attempt cannot go on; a restart recovers the
    /// committable from the checkpoint and commits it then.
    #[error("commit failed (fenced or invalid state): {0}")]
    Fenced(#[source] BoxError),
    /// The external system no longer has the prepared transaction and did not commit it (it
    /// aborted it, e.g. after its timeout): the records of that checkpoint are lost.
    #[error("DATA LOST: {what} was aborted by the external system before it could be committed: {source}")]
    Lost {
        /// The transaction, e.g. "transaction exactly-0-1 (producer 17, epoch 3) of checkpoint 42".
        what: String,
        /// What the system answered.
        #[source]
        source: BoxError,
    },
    /// Anything else that restarting cannot fix (configuration, permissions).
    #[error("commit failed: {0}")]
    Fatal(#[source] BoxError),
}

/// Errors of the driver.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TwoPhaseError {
    /// Committing the transactions of a checkpoint failed.
    #[error("committing checkpoint {checkpoint_id}: {source}")]
    Commit {
        /// The checkpoint whose committable failed.
        checkpoint_id: CheckpointId,
        /// Why.
        #[source]
        source: CommitError,
    },
    /// A committable in the restored state could not be decoded.
    #[error("restored committable undecodable: {0}")]
    Decode(String),
    /// The external system shows a newer checkpoint committed than the one the job restores:
    /// restoring would write that output again.
    #[error(
        "sink '{sink}' shows checkpoint {committed} committed, but the job {restoring}: the output \
         of the checkpoints after it would be written again. Restore checkpoint {committed} or a \
         later one (`exactly checkpoints list DIR`), or accept the replay explicitly (`exactly run \
         --from SNAPSHOT --accept-replay`{fresh})"
    )]
    BehindSink {
        /// The sink's operator uid.
        sink: String,
        /// The newest checkpoint the sink shows committed.
        committed: CheckpointId,
        /// What the job restores ("restores checkpoint 12", "starts afresh").
        restoring: String,
        /// For a fresh start: how to clear the sink's record.
        fresh: String,
    },
}

impl From<TwoPhaseError> for CoreError {
    fn from(e: TwoPhaseError) -> Self {
        let class = match &e {
            // Still failing after the driver's retries: an outage when its cause says the system
            // cannot be reached (an error the connector classed so), else a restart.
            TwoPhaseError::Commit {
                source: CommitError::Retriable(cause),
                ..
            } if cause
                .downcast_ref::<CoreError>()
                .is_some_and(|c| c.class() == ErrorClass::Retriable) =>
            {
                ErrorClass::Retriable
            }
            TwoPhaseError::Commit {
                source: CommitError::Retriable(_) | CommitError::Fenced(_),
                ..
            } => ErrorClass::Restart,
            TwoPhaseError::Commit { .. } | TwoPhaseError::Decode(_) | TwoPhaseError::BehindSink { .. } => {
                ErrorClass::Fatal
            }
        };
        CoreError::operator("two-phase sink", class, e)
    }
}

/// Result of the sink trait's operations (errors of the external system are `CoreError`s with a
/// class, so the runtime knows whether to restart).
pub type Result<T, E = CoreError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A commit still failing is an outage only when its cause was classed one by the connector.
    #[test]
    fn a_commit_still_failing_is_an_outage_only_when_its_cause_says_so() {
        let commit = |source: CommitError| -> CoreError {
            TwoPhaseError::Commit {
                checkpoint_id: 3,
                source,
            }
            .into()
        };
        let refused = CoreError::operator("db", ErrorClass::Retriable, "connection refused");
        assert_eq!(
            commit(CommitError::Retriable(refused.into())).class(),
            ErrorClass::Retriable
        );
        let other = "XA COMMIT keeps answering XAER_NOTA";
        assert_eq!(
            commit(CommitError::Retriable(other.into())).class(),
            ErrorClass::Restart
        );
        assert_eq!(
            commit(CommitError::Fenced("fenced".into())).class(),
            ErrorClass::Restart
        );
    }
}
