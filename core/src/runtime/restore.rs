//! Which snapshot a run restores. Never a guess: every choice here either follows from what the
//! user asked for or is an error that says what to do.
//!
//! - First attempt with an explicit `restore_from`: that snapshot, even if the checkpoint
//!   directory holds others. If the directory holds a *newer* completed checkpoint, restoring an
//!   older snapshot writes again what the newer one's transactions may have committed, so it needs
//!   `accept_replay`.
//! - Every other attempt (and a first one without `restore_from`): the newest checkpoint in the
//!   job's directory, strictly (`CheckpointStorage::latest`: corrupt → fatal, I/O → retried,
//!   vanished → fatal). After an explicit restore, the checkpoints that predate it are never
//!   restored: until the job completes one of its own, restarts restore the explicit snapshot again.
//! - A first attempt with the same explicit `restore_from` as the one the directory's checkpoints
//!   continue from (a process restarted with its command line unchanged: a Kubernetes pod whose
//!   `FROM` is still set) restores the newest checkpoint of that continuation, as later attempts
//!   do, once there is one (Flink's rule for a job resubmitted with the same savepoint). The
//!   directory records each explicit restore (`_restore`) for this.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{CoreError, ErrorClass, Result};
use crate::message::CheckpointId;
use crate::storage::{CheckpointStorage, RestoreRecord, Snapshot, Storage};

/// The part of the restore decision that is fixed by the job's first successful pick.
#[derive(Debug, Clone)]
pub(crate) struct RestorePlan {
    /// The explicit snapshot and the newest checkpoint id its directory held when it was chosen
    /// (those and older ones are never restored by this job).
    explicit: Option<(PathBuf, CheckpointId)>,
    /// The last pick went back past checkpoints it could not read: the run must have every sink
    /// prove that none of its transactions after the restored checkpoint committed.
    pub(crate) fallback: Option<Fallback>,
}

/// A restore of an older checkpoint than the newest, which cannot be read (see `latest_or_back`).
#[derive(Debug, Clone)]
pub(crate) struct Fallback {
    /// The checkpoint restored instead.
    pub(crate) restored: CheckpointId,
    /// The newest one, which cannot be read.
    pub(crate) unusable: CheckpointId,
    /// Why it cannot (the error a restore without proofs reports).
    pub(crate) error: String,
}

/// The newest checkpoint of `storage`; when it cannot be read (`NewestCheckpointUnusable`), the
/// newest older one that can, with the [`Fallback`] the run must then prove safe: restoring it is
/// safe exactly when no sink committed a transaction of a later checkpoint, which only the sinks
/// can tell. Without an older readable checkpoint, the error stands.
fn latest_or_back(storage: &Storage) -> Result<(Option<Snapshot>, Option<Fallback>)> {
    let (chosen, fallback) = owner_first(storage, newest_or_back(storage))?;
    go_on_from(storage, chosen.as_ref(), fallback.is_some())?;
    Ok((chosen, fallback))
}

/// The newest checkpoint of `storage`, verified, once the unfinished ones above it are void.
fn latest_settled(storage: &Storage) -> Result<Option<Snapshot>> {
    let chosen = owner_first(storage, storage.latest())?;
    go_on_from(storage, chosen.as_ref(), false)?;
    Ok(chosen)
}

/// A choice that failed for good — no checkpoint left, the newest unreadable — may be that of a
/// run that stalled past its lease while another took the location over and went on (its
/// retention deleting what the stalled run had listed): that run is told it lost the location
/// ([`CoreError::LocationOwned`]) rather than that its checkpoints are gone.
fn owner_first<T>(storage: &Storage, chosen: Result<T>) -> Result<T> {
    match chosen {
        Err(e) if e.class() == ErrorClass::Fatal => {
            storage.check_owner()?;
            Err(e)
        }
        other => other,
    }
}

/// Makes the unfinished checkpoints above `chosen` (a checkpoint of `storage`; `None`: nothing)
/// void before the run goes on from it: their transactions are aborted by this run's sinks, so a
/// late write of their metadata must never make them restorable (`storage/unfinished.rs`).
fn go_on_from(storage: &Storage, chosen: Option<&Snapshot>, newer_expected: bool) -> Result<()> {
    storage
        .void_unfinished_above(chosen.map_or(0, |s| s.meta.id), newer_expected)
        .map(|_| ())
}

fn newest_or_back(storage: &Storage) -> Result<(Option<Snapshot>, Option<Fallback>)> {
    match storage.latest() {
        Err(e @ CoreError::NewestCheckpointUnusable { id, .. }) => match storage.newest_readable_below(id)? {
            Some(older) => {
                tracing::warn!(
                    unusable = id,
                    restoring = older.meta.id,
                    error = %e,
                    "The newest checkpoint cannot be read: restoring the newest older one, if every sink proves that none of its transactions after it committed (else the job stops)."
                );
                let fallback = Fallback {
                    restored: older.meta.id,
                    unusable: id,
                    error: e.to_string(),
                };
                Ok((Some(older), Some(fallback)))
            }
            None => Err(e),
        },
        other => other.map(|s| (s, None)),
    }
}

impl RestorePlan {
    /// The first attempt's choice, and the plan for later attempts.
    pub(crate) fn first(
        storage: Option<&Storage>,
        restore_from: Option<&Path>,
        accept_replay: bool,
    ) -> Result<(Option<Snapshot>, RestorePlan)> {
        let Some(path) = restore_from else {
            let (latest, fallback) = match storage {
                Some(s) => latest_or_back(s)?,
                None => (None, None),
            };
            return Ok((
                latest,
                RestorePlan {
                    explicit: None,
                    fallback,
                },
            ));
        };
        let newest = match storage {
            Some(s) => s.completed()?.last().copied().unwrap_or(0),
            None => 0,
        };
        let given = path.display().to_string();
        // Looked at before the snapshot is opened: it may be gone since (a checkpoint retention
        // deleted, a savepoint cleaned up) while the command line still names it.
        if let Some(s) = storage {
            if s.continues_from(path)? {
                tracing::warn!(
                    restore = %given,
                    checkpoint_id = newest,
                    location = %s.root().display(),
                    "Already restored from this snapshot: restoring the newest checkpoint made since, as a restart does (to restore the snapshot itself again, remove the location's _restore first)."
                );
                return Ok((
                    latest_settled(s)?,
                    RestorePlan {
                        explicit: None,
                        fallback: None,
                    },
                ));
            }
        }
        let snapshot = Storage::open_verified(path)?;
        if newest > snapshot.meta.id && !accept_replay {
            return Err(CoreError::RestoreOlderThanNewest {
                path: path.to_path_buf(),
                restore_id: snapshot.meta.id,
                newest,
                dir: storage.map(|s| s.root().to_path_buf()).unwrap_or_default(),
            });
        }
        if newest > snapshot.meta.id {
            tracing::warn!(
                restore = %path.display(),
                restore_id = snapshot.meta.id,
                newest,
                "Restoring an older snapshot than the newest checkpoint, as accepted: output after it may be written again."
            );
        }
        if let Some(s) = storage {
            // The snapshot is from elsewhere: this location's own unfinished checkpoints above
            // its newest are given up (and one completed since `newest` was read makes the
            // attempt choose again) — before the restore is recorded, which would make the next
            // attempt take that one for the continuation of this restore.
            s.void_unfinished_above(newest, false)?;
            s.record_restore(&RestoreRecord {
                path: given,
                snapshot_id: snapshot.meta.id,
                floor: newest,
            })?;
        }
        let plan = RestorePlan {
            explicit: Some((path.to_path_buf(), newest)),
            fallback: None,
        };
        Ok((Some(snapshot), plan))
    }

    /// Whether the job restores checkpoints of its own location (not an explicit snapshot).
    pub(super) fn restores_own(&self) -> bool {
        self.explicit.is_none()
    }

    /// The choice of a later attempt of the whole job, which may go back past checkpoints it
    /// cannot read as the first may ([`RestorePlan::fallback`] says whether it did).
    pub(crate) fn later_job(&mut self, storage: Option<&Storage>) -> Result<Option<Snapshot>> {
        if let (None, Some(s)) = (&self.explicit, storage) {
            s.renew_claim()?;
            let (latest, fallback) = latest_or_back(s)?;
            self.fallback = fallback;
            return Ok(latest);
        }
        self.fallback = None;
        self.later(storage)
    }

    /// The choice of every later attempt (job or region restart); a region restart never goes
    /// back past a checkpoint it cannot read.
    pub(super) fn later(&self, storage: Option<&Storage>) -> Result<Option<Snapshot>> {
        // A run that lost its location (taken over while it failed) stops here, before its
        // sinks' recovery could fence or abort anything of the new owner's; one whose claim
        // lapsed in an outage renews it.
        if let Some(s) = storage {
            s.renew_claim()?;
        }
        match (&self.explicit, storage) {
            (None, Some(s)) => latest_settled(s),
            (None, None) => Ok(None),
            (Some((path, floor)), storage) => {
                let own = match storage {
                    Some(s) => s.completed()?.last().is_some_and(|id| id > floor),
                    None => false,
                };
                match storage {
                    Some(s) if own => latest_settled(s),
                    Some(s) => {
                        // One of its own completed since `own` was decided: choose again.
                        s.void_unfinished_above(*floor, false)?;
                        Storage::open_verified(path).map(Some)
                    }
                    None => Storage::open_verified(path).map(Some),
                }
            }
        }
    }

    /// [`Self::later`] off the async runtime (storage calls block).
    pub(super) async fn later_blocking(&self, storage: Option<Arc<Storage>>) -> Result<Option<Snapshot>> {
        let plan = self.clone();
        tokio::task::spawn_blocking(move || plan.later(storage.as_deref()))
            .await
            .map_err(|e| CoreError::TaskLost {
                task: "checkpoint storage".into(),
                reason: e.to_string(),
            })?
    }
}
