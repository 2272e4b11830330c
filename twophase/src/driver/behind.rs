//! A restore checked against what the sink's external system shows committed: never behind it.
//!
//! The checkpoint listing is one witness of how far a job got; a sink that records what it
//! committed (the database sinks' progress rows) is another. A restore of checkpoint K, or a
//! fresh start, while the sink shows a checkpoint newer than K committed would read the input
//! after K again and write it again over output the sink holds: a stale listing, a checkpoint
//! directory that lost its newest checkpoints or was pointed somewhere new, a directory removed
//! and started afresh. Refused, naming the sink and both ids, unless the operator accepted the
//! replay; then the sink forgets its record of the newer commits, so the checkpoint ids that
//! follow (which may repeat the forgotten ones) are not taken for committed.

use exactly_core::{CheckpointId, CoreError, ErrorClass};
use tracing::warn;

use super::TwoPhaseSink;
use crate::error::TwoPhaseError;
use crate::sink::{RecoveryContext, TwoPhaseCommitSink};

/// What a start does about a sink's record of commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The restore is not behind the sink (or the sink keeps no record).
    Proceed,
    /// Behind, and replay accepted: forget the sink's commits after this checkpoint.
    Forget(CheckpointId),
    /// Behind: refuse, the sink having committed this checkpoint.
    Refuse(CheckpointId),
}

/// The decision, from the sink's newest committed checkpoint and what the job restores.
pub(crate) fn judge(committed: Option<CheckpointId>, restoring: Option<CheckpointId>, accept_replay: bool) -> Verdict {
    let base = restoring.unwrap_or(0);
    match committed {
        Some(c) if c > base && accept_replay => Verdict::Forget(base),
        Some(c) if c > base => Verdict::Refuse(c),
        _ => Verdict::Proceed,
    }
}

impl<T, S: TwoPhaseCommitSink<T>> TwoPhaseSink<T, S> {
    /// Refuses a restore behind what the sink shows committed (see the module's doc); with
    /// replay accepted, the checkpoint after which the sink must forget its commits, once its
    /// lingering transactions are gone ([`TwoPhaseCommitSink::forget_commits_after`]).
    pub(super) async fn check_not_behind(
        &mut self,
        ctx: &RecoveryContext<'_, S::Committable>,
    ) -> exactly_core::Result<Option<CheckpointId>> {
        let committed = self.sink.committed_through(ctx).await?;
        let restoring = ctx.restored_checkpoint;
        match judge(committed, restoring, ctx.info.accept_replay) {
            Verdict::Proceed => Ok(None),
            Verdict::Forget(base) => {
                warn!(
                    sink = %self.uid,
                    subtask = ctx.info.index,
                    committed = committed.unwrap_or(0),
                    restoring = base,
                    "The sink shows newer checkpoints committed than the one restored; replay accepted: forgetting them (their output may be written again)."
                );
                Ok(Some(base))
            }
            Verdict::Refuse(committed) => {
                let (restoring, fresh) = match restoring {
                    Some(id) => (format!("restores checkpoint {id}"), String::new()),
                    None => (
                        "starts afresh (no checkpoint to restore)".to_owned(),
                        "; or, to start this sink over on purpose, clear its record of commits (a database sink's progress rows, the Kafka sink's consumer groups <transactional_id_prefix>-progress-*) or give it a new identity (a database sink's job_id, the Kafka sink's transactional_id_prefix)"
                            .to_owned(),
                    ),
                };
                Err(CoreError::operator(
                    &self.uid,
                    ErrorClass::Fatal,
                    TwoPhaseError::BehindSink {
                        sink: self.uid.clone(),
                        committed,
                        restoring,
                        fresh,
                    },
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_behind_the_sink_is_refused_unless_replay_is_accepted() {
        assert_eq!(judge(None, Some(5), false), Verdict::Proceed);
        assert_eq!(judge(None, None, false), Verdict::Proceed);
        assert_eq!(
            judge(Some(5), Some(5), false),
            Verdict::Proceed,
            "the restored one itself"
        );
        assert_eq!(judge(Some(4), Some(5), false), Verdict::Proceed);
        assert_eq!(judge(Some(6), Some(5), false), Verdict::Refuse(6));
        assert_eq!(judge(Some(6), Some(5), true), Verdict::Forget(5));
        // A fresh start where the sink holds commits: ids would start again at 1.
        assert_eq!(judge(Some(1), None, false), Verdict::Refuse(1));
        assert_eq!(judge(Some(9), None, true), Verdict::Forget(0));
    }
}
