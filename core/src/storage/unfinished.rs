//! Unfinished checkpoints a restart gives up, made void.
//!
//! A checkpoint whose metadata write did not plainly succeed keeps its files (its outcome is
//! unknown: an object store may apply a write whose answer was lost, or one the network held, later).
//! When the job then restarts from an older checkpoint, its sinks abort that checkpoint's
//! transactions. Were its metadata to land afterwards, it would be the newest completed
//! checkpoint, and the next restart would restore it: input marked done whose output was aborted.
//! So before a run goes on from a checkpoint, every unfinished one above it gets a `_metadata`
//! holding only [`VOID`], created only if absent: the late write can then never land (the store's
//! create-if-absent refuses it; on a store without conditional puts the metadata create is a
//! check-then-write, and so is this — that store is warned about), and the checkpoint is void —
//! listed neither as completed nor restorable. The real write landing first makes it completed:
//! the restart chooses again. A checkpoint without files of its own is listed before its
//! metadata is written (`layout.rs`, `commit`), so none escapes this.

use super::blobs::{Blobs, Put};
use super::layout::{chk, join, METADATA_FILE};
use super::Storage;
use crate::error::{CoreError, Result};
use crate::message::CheckpointId;

/// The whole `_metadata` of a void checkpoint. Never real metadata, which is longer (a header of
/// 20 bytes and more); an empty or truncated `_metadata` is damage, not a void.
pub(crate) const VOID: &[u8] = b"void\n";

/// Whether `key` (a `_metadata` of `size` bytes) marks a void checkpoint.
pub(crate) fn is_void(blobs: &dyn Blobs, key: &str, size: u64) -> crate::error::Result<bool> {
    Ok(size == VOID.len() as u64 && blobs.get(key)? == VOID)
}

/// The checkpoints of a location by state, each ascending.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// With their metadata.
    pub(crate) completed: Vec<CheckpointId>,
    /// Given up by a restart (an empty `_metadata`).
    pub(crate) void: Vec<CheckpointId>,
    /// Without metadata: in progress, failed, or left by a crash.
    pub(crate) unfinished: Vec<CheckpointId>,
}

impl Storage {
    /// Every checkpoint directory here, by state.
    pub(crate) fn scan(&self) -> Result<Scan> {
        let mut scan = Scan::default();
        for name in self.blobs.dirs()? {
            let Some(id) = name.strip_prefix("chk-").and_then(|n| n.parse().ok()) else {
                continue;
            };
            let key = join(&name, METADATA_FILE);
            match self.blobs.size(&key)? {
                Some(n) if is_void(self.blobs.as_ref(), &key, n)? => scan.void.push(id),
                Some(_) => scan.completed.push(id),
                None => scan.unfinished.push(id),
            }
        }
        for ids in [&mut scan.completed, &mut scan.void, &mut scan.unfinished] {
            ids.sort_unstable();
        }
        Ok(scan)
    }

    /// Before a run goes on from checkpoint `from` (0: from nothing), makes every unfinished
    /// checkpoint above it void (see the module's comment); returns them. `newer_expected`: the
    /// run knowingly restores an older checkpoint than completed ones here (past unreadable ones,
    /// or an explicit restore); otherwise a completed one above `from` means one landed since the
    /// choice was made, and the attempt fails (a restart error) to choose again.
    pub(crate) fn void_unfinished_above(&self, from: CheckpointId, newer_expected: bool) -> Result<Vec<CheckpointId>> {
        let scan = self.scan()?;
        let landed = |id: CheckpointId| CoreError::Io {
            action: "restoring",
            path: self.blobs.locate(&chk(id)),
            source: std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                format!("checkpoint {id} completed while the job chose checkpoint {from} to restore: choosing again"),
            ),
        };
        if let Some(&id) = scan.completed.iter().find(|&&id| id > from).filter(|_| !newer_expected) {
            return Err(landed(id));
        }
        let mut voided = Vec::new();
        // Only the owner makes anything void, and with a listing made before its check: a run
        // that stalled past its lease while it restored would otherwise list the new owner's
        // checkpoint in progress and make it void.
        #[cfg(test)]
        let unchecked = crate::sim::mutant() == crate::sim::Mutant::StaleVoidStopsOwner;
        #[cfg(not(test))]
        let unchecked = false;
        if !unchecked && scan.unfinished.iter().any(|&id| id > from) {
            self.check_claim()?;
        }
        for id in scan.unfinished.into_iter().filter(|&id| id > from) {
            #[cfg(test)]
            if crate::sim::mutant() == crate::sim::Mutant::NoVoid {
                break;
            }
            let key = join(&chk(id), METADATA_FILE);
            let created = self.blobs.put(&key, VOID, Put::Create);
            match created {
                Ok(true) => voided.push(id),
                // There now: ours (an earlier try whose answer was lost), or the late write.
                Ok(false) | Err(_) => match self.blobs.size(&key)? {
                    Some(n) if is_void(self.blobs.as_ref(), &key, n)? => voided.push(id),
                    Some(_) if newer_expected => {}
                    Some(_) => return Err(landed(id)),
                    None => {
                        created?;
                        return Err(landed(id)); // answered "there", then not: choose again
                    }
                },
            }
        }
        if !voided.is_empty() {
            tracing::info!(
                location = %self.root.display(),
                restored = from,
                void = ?voided,
                "Unfinished checkpoints newer than the one restored are void: their transactions are aborted, and a late write of their metadata can no longer make them restorable."
            );
        }
        Ok(voided)
    }
}
