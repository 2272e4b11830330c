//! The checkpoint layout, the same in a local directory and in an object store prefix:
//!
//! ```text
//! <root>/chk-<id>/_metadata     versioned, checksummed; written last, appears atomically, never replaced
//! <root>/chk-<id>/<file>        state files private to checkpoint <id>
//! <root>/shared/<file>          immutable state files referenced by several checkpoints
//! <root>/_has_checkpoints      marker: this location has held a completed checkpoint
//!
//! A savepoint or exported checkpoint is a directory (or prefix) with `_metadata` and every file
//! it references.
//! ```
//!
//! A checkpoint counts as completed once its `_metadata` exists. Restore never guesses: a newest
//! checkpoint that does not verify is an error (an older one could write again what the newer one's
//! transactions committed), and so is a location that held checkpoints and now holds none.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::blobs::{file_sum, Blobs, Dir, Put};
use super::format::{decode_metadata, encode_metadata, verify, verify_sum};
use super::object::{is_url, Bucket};
use super::owner::Claim;
use super::{CheckpointStorage, Snapshot, SnapshotReader, SnapshotWriter};
use crate::checkpoint::{CheckpointMetadata, FileHandle, FileScope};
use crate::error::{CoreError, Result};
use crate::message::CheckpointId;

mod checkpoints;

pub(crate) const METADATA_FILE: &str = "_metadata";
const MARKER_FILE: &str = "_has_checkpoints";
const RESTORE_FILE: &str = "_restore";

/// An explicit restore (`--from`) that a location's later checkpoints continue from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RestoreRecord {
    /// The snapshot's location, as given.
    pub(crate) path: String,
    /// The snapshot's checkpoint id.
    pub(crate) snapshot_id: CheckpointId,
    /// The newest completed checkpoint here when it was restored: newer ones continue from it.
    pub(crate) floor: CheckpointId,
}
const SHARED: &str = "shared";

/// What happens to completed checkpoints when a job is cancelled (Flink's externalized checkpoint
/// retention).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Retention {
    /// Keep them: the job can be restarted from the last one.
    #[default]
    RetainOnCancellation,
    /// Delete them: only savepoints survive a cancel.
    DeleteOnCancellation,
}

/// Checkpoint storage at a location: a local directory, or an object store URL (`s3://bucket/prefix`,
/// `gs://…`, `az://…`; see [`crate::storage`]).
#[derive(Clone)]
pub struct Storage {
    pub(super) blobs: Arc<dyn Blobs>,
    pub(super) root: PathBuf,
    /// This run's claim on the location, once made (see `owner.rs`): checked before each commit.
    pub(super) claim: Arc<std::sync::Mutex<Option<Claim>>>,
    /// The id of every claim this storage makes (one per run of a job, whatever its attempts):
    /// a claim write of an earlier attempt whose answer was lost may land after a later
    /// attempt's, and must not read as another run's.
    pub(super) claim_id: Arc<std::sync::OnceLock<String>>,
    /// Prefixes the names of the private files this storage writes, unique per instance (one per
    /// process run): a checkpoint id an earlier process began and left nothing of listed may be
    /// begun again, and a write of the earlier one that lands late must not replace a file of
    /// the new one.
    pub(super) tag: Arc<str>,
    /// The clock and process identity the owner rule uses (`owner.rs`).
    pub(super) machine: Arc<dyn super::owner::Machine>,
}

/// A new [`Storage::tag`].
pub(super) fn new_tag() -> Arc<str> {
    format!("{:016x}", rand::random::<u64>()).into()
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage").field("root", &self.root).finish()
    }
}

/// The place behind `location`: an object store prefix for a URL, else a local directory.
fn place(location: &Path) -> Result<Arc<dyn Blobs>> {
    if is_url(location) {
        let url = location
            .to_str()
            .ok_or_else(|| CoreError::Config(format!("{} is not valid UTF-8", location.display())))?;
        Ok(Arc::new(Bucket::open(url)?))
    } else {
        Ok(Arc::new(Dir {
            root: location.to_path_buf(),
        }))
    }
}

/// `location` split into the location of its parent and its last name (`s3://b/p/chk-3` →
/// `s3://b/p`, `chk-3`).
fn split(location: &Path) -> (PathBuf, String) {
    if is_url(location) {
        let s = location.to_string_lossy();
        let s = s.trim_end_matches('/');
        let (scheme, rest) = s.split_once("://").unwrap_or(("", s));
        return match rest.split_once('/') {
            Some(_) => {
                let (parent, name) = rest.rsplit_once('/').expect("has a slash");
                (PathBuf::from(format!("{scheme}://{parent}")), name.to_owned())
            }
            None => (PathBuf::from(s), String::new()),
        };
    }
    let name = location
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let parent = match location.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    (parent, name)
}

pub(super) fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

/// The bug the owner check in `void_unfinished_above` and the void case of `settle_commit` guard
/// against, put back for the simulation to catch.
fn stale_void_stops_owner() -> bool {
    #[cfg(test)]
    return crate::sim::mutant() == crate::sim::Mutant::StaleVoidStopsOwner;
    #[cfg(not(test))]
    false
}

pub(super) fn chk(id: CheckpointId) -> String {
    format!("chk-{id}")
}

impl Storage {
    /// The newest completed checkpoint older than `newer` whose metadata and files read well
    /// (`None`: none). For a restore past checkpoints that cannot be read, which only proofs from
    /// every sink make safe (see `runtime/restore.rs`). I/O errors are returned (an outage is not
    /// a reason to go further back).
    pub fn newest_readable_below(&self, newer: CheckpointId) -> Result<Option<Snapshot>> {
        let ids = self.completed()?;
        for &id in ids.iter().rev().filter(|&&id| id < newer) {
            match self.open(id).and_then(|s| verify_files(&s).map(|()| s)) {
                Ok(s) => return Ok(Some(s)),
                Err(CoreError::Corrupt { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Sets aside the completed checkpoints newer than `kept` (ones that could not be read, past
    /// which the job restored `kept` once every sink proved none of their transactions
    /// committed): each `_metadata` is kept as `_metadata.unusable` for inspection, and the
    /// checkpoint is no longer listed, restored or read by retention.
    pub fn set_aside_newer_than(&self, kept: CheckpointId) -> Result<Vec<CheckpointId>> {
        let mut set_aside = Vec::new();
        for id in self.completed()?.into_iter().filter(|&id| id > kept) {
            let key = join(&chk(id), METADATA_FILE);
            match self.blobs.get(&key) {
                Ok(bytes) => {
                    self.blobs.put(&format!("{key}.unusable"), &bytes, Put::Replace)?;
                }
                Err(CoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
                // Not read (an outage): not deleted either; the next attempt tries again.
                Err(e) => return Err(e),
            }
            self.blobs.delete(&key)?;
            set_aside.push(id);
        }
        Ok(set_aside)
    }

    /// Storage at `location`: a local directory (created if missing) or an object store URL.
    pub fn new(location: impl Into<PathBuf>) -> Result<Self> {
        let root = location.into();
        if !is_url(&root) {
            let shared = root.join(SHARED);
            crate::private_fs::create_dir_all(&shared).map_err(|e| CoreError::io("creating", &shared, e))?;
            if let Some(w) = crate::private_fs::shared_access_warning(&root) {
                tracing::warn!("{w}");
            }
        }
        Ok(Storage {
            blobs: place(&root)?,
            root,
            claim: Arc::default(),
            claim_id: Arc::default(),
            tag: new_tag(),
            machine: super::owner::ThisMachine::shared(),
        })
    }

    /// Storage on `blobs`, which stand for `root`, on `machine` (the simulation's object store
    /// and machines).
    #[cfg(test)]
    pub(crate) fn on_blobs(
        blobs: Arc<dyn Blobs>,
        root: PathBuf,
        tag: &str,
        machine: Arc<dyn super::owner::Machine>,
    ) -> Self {
        Storage {
            blobs,
            root,
            claim: Arc::default(),
            claim_id: Arc::default(),
            tag: tag.into(),
            machine,
        }
    }

    /// The location: a directory or a URL.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where checkpoint `id` is (a directory or a URL).
    pub fn checkpoint_dir(&self, id: CheckpointId) -> PathBuf {
        self.blobs.locate(&chk(id))
    }

    /// Opens a checkpoint or savepoint by its location (a path or URL: `<root>/chk-N` or an exported
    /// one) and checks that every file it references is there with its recorded size (contents
    /// are verified as they are read).
    ///
    /// A location that holds no snapshot itself but one per range of a split job
    /// (`subtasks-<first>-<last>-of-<p>/…`) is opened as their merge (see `split.rs`).
    pub fn open_verified(location: &Path) -> Result<Snapshot> {
        if !Self::is_snapshot(location)? {
            if let Some(s) = super::split::open(location)? {
                return Ok(s);
            }
        }
        let s = Self::open_path(location)?;
        verify_files(&s)?;
        Ok(s)
    }

    /// Opens a checkpoint or savepoint by its location, reading its metadata only.
    pub fn open_path(location: &Path) -> Result<Snapshot> {
        let (parent, name) = split(location);
        open_in(place(&parent)?, name)
    }

    /// The names directly under `location` that hold files (subdirectories, or prefixes in an
    /// object store), sorted; none for a local directory that does not exist.
    pub fn list_dirs(location: &Path) -> Result<Vec<String>> {
        let mut names = match place(location)?.dirs() {
            Err(CoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            other => other?,
        };
        names.sort();
        Ok(names)
    }

    /// The small file `name` directly under `location` (a note such as a job's layout generation),
    /// `None` when there is none.
    pub fn read_note(location: &Path, name: &str) -> Result<Option<Vec<u8>>> {
        let blobs = place(location)?;
        if blobs.size(name)?.is_none() {
            return Ok(None);
        }
        blobs.get(name).map(Some)
    }

    /// Writes the small file `name` directly under `location` (atomically, replacing it).
    pub fn write_note(location: &Path, name: &str, bytes: &[u8]) -> Result<()> {
        place(location)?.put(name, bytes, Put::Replace).map(|_| ())
    }

    /// Whether `location` is an object store URL (`s3://`, `gs://`, `az://`, ...) rather than a path.
    pub fn is_url(location: &Path) -> bool {
        is_url(location)
    }

    /// Whether `location` holds a checkpoint or savepoint (its `_metadata`; not a void
    /// checkpoint's, given up by a restart).
    pub fn is_snapshot(location: &Path) -> Result<bool> {
        let blobs = place(location)?;
        match blobs.size(METADATA_FILE)? {
            Some(n) => Ok(!super::unfinished::is_void(blobs.as_ref(), METADATA_FILE, n)?),
            None => Ok(false),
        }
    }

    /// The explicit restore this location's checkpoints continue from, as recorded by
    /// [`Self::record_restore`]: `None` when there is none (or it does not parse).
    pub(crate) fn restored_from(&self) -> Result<Option<RestoreRecord>> {
        if self.blobs.size(RESTORE_FILE)?.is_none() {
            return Ok(None);
        }
        let bytes = self.blobs.get(RESTORE_FILE)?;
        Ok(serde_json::from_slice(&bytes).ok())
    }

    /// Whether this location's checkpoints continue from an explicit restore of `from` (recorded
    /// by the first start with it) and it has made a checkpoint since: a start with the same
    /// `--from` then restores the newest checkpoint, as a restart does.
    pub fn continues_from(&self, from: &Path) -> Result<bool> {
        let Some(record) = self.restored_from()? else {
            return Ok(false);
        };
        let newest = self.completed()?.last().copied().unwrap_or(0);
        if record.path != from.display().to_string() || newest <= record.floor {
            return Ok(false);
        }
        // Another snapshot under the same path (a reused savepoint name) is a new restore; one
        // that no longer opens is judged by its path.
        Ok(Self::open_path(from).map_or(true, |s| s.meta.id == record.snapshot_id))
    }

    /// Records that the checkpoints after `record.floor` continue from the explicit restore
    /// `record.path` (replacing an earlier record).
    pub(crate) fn record_restore(&self, record: &RestoreRecord) -> Result<()> {
        self.check_claim()?;
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| CoreError::Serialization {
            what: "the restore record".into(),
            reason: e.to_string(),
        })?;
        self.blobs.put(RESTORE_FILE, &bytes, Put::Replace).map(|_| ())
    }

    /// After a metadata create that did not plainly succeed (`written`: an error, or "already
    /// there"): `Ok` when the metadata there is ours, [`CoreError::LocationOwned`] when it is
    /// another's, the error as it was when it is plainly absent from a local directory, and
    /// [`CoreError::CommitOutcomeUnknown`] otherwise — an object store's write may still land
    /// after its answer was lost, so absence now proves nothing.
    fn settle_commit(&self, id: CheckpointId, key: &str, ours: &[u8], written: Result<bool>) -> Result<()> {
        let failure = written.err();
        let unknown = |reason: String| CoreError::CommitOutcomeUnknown { id, reason };
        match self.blobs.get(key) {
            Ok(there) if there == ours => {
                if let Some(e) = &failure {
                    tracing::warn!(checkpoint_id = id, error = %e, "Writing checkpoint metadata answered an error, but it was written.");
                }
                Ok(())
            }
            Ok(there) if there == super::unfinished::VOID && !stale_void_stops_owner() => {
                // Made void by another run's restart: one that took the location over (this run
                // then no longer owns it: the check says so), or one that stalled while it
                // restored and listed this checkpoint in progress (this run still owns it: the
                // checkpoint fails, the run goes on).
                self.check_claim()?;
                Err(CoreError::CheckpointAborted {
                    id,
                    reason: "another run made it void while it was written (a run that restored meanwhile)".into(),
                })
            }
            Ok(_) => Err(CoreError::LocationOwned {
                location: self.root.clone(),
                reason: format!("checkpoint {id} was written by another process while this one ran"),
            }),
            Err(CoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => match failure {
                Some(e) if !is_url(&self.root) => Err(e),
                Some(e) => Err(unknown(format!("{e}; it is not there now, but may still appear"))),
                None => Err(unknown(
                    "the store answered that it exists, then that it does not".into(),
                )),
            },
            Err(read) => Err(unknown(match failure {
                Some(e) => format!("{e}; reading it back failed: {read}"),
                None => format!("the store answered that it exists; reading it back failed: {read}"),
            })),
        }
    }

    /// The highest id of any checkpoint here, completed or not (a run's first id goes past it:
    /// never into the place of another run's checkpoint in progress).
    pub(crate) fn highest_id(&self) -> Result<CheckpointId> {
        let names = match self.blobs.dirs() {
            Err(CoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            other => other?,
        };
        Ok(names
            .iter()
            .filter_map(|n| n.strip_prefix("chk-")?.parse().ok())
            .max()
            .unwrap_or(0))
    }

    /// Records that this location holds a completed checkpoint (idempotent).
    fn mark_has_checkpoints(&self) -> Result<()> {
        if self.blobs.size(MARKER_FILE)?.is_some() {
            return Ok(());
        }
        self.blobs.put(
            MARKER_FILE,
            b"This location has held completed checkpoints; a restart finding none refuses to start over.\n",
            Put::Replace,
        )?;
        Ok(())
    }
}

/// The snapshot in `dir` of `blobs` (`""`: at its root).
fn open_in(blobs: Arc<dyn Blobs>, dir: String) -> Result<Snapshot> {
    let key = join(&dir, METADATA_FILE);
    let bytes = blobs.get(&key)?;
    if bytes == super::unfinished::VOID {
        return Err(CoreError::Corrupt {
            path: blobs.locate(&key),
            reason: "void: an unfinished checkpoint that a restart gave up (its transactions were aborted), never restorable".into(),
        });
    }
    let meta = decode_metadata(&blobs.locate(&key), &bytes)?;
    Ok(Snapshot {
        meta,
        reader: Arc::new(Reader { blobs, dir }),
    })
}

struct Reader {
    blobs: Arc<dyn Blobs>,
    dir: String,
}

impl Reader {
    fn key(&self, file: &FileHandle) -> String {
        match file.scope {
            FileScope::Private => join(&self.dir, &file.name),
            FileScope::Shared => join(SHARED, &file.name),
        }
    }
}

impl SnapshotReader for Reader {
    fn read(&self, file: &FileHandle) -> Result<Vec<u8>> {
        let key = self.key(file);
        let bytes = self.blobs.get(&key)?;
        verify(&self.blobs.locate(&key), file, &bytes)?;
        Ok(bytes)
    }

    fn download(&self, file: &FileHandle, dest: &Path) -> Result<()> {
        // Streamed: a restore's memory does not grow with its largest file.
        let key = self.key(file);
        let got = self.blobs.get_file(&key, dest);
        let checked = got.and_then(|sum| verify_sum(&self.blobs.locate(&key), file, sum));
        if checked.is_err() {
            let _ = fs::remove_file(dest);
        }
        checked
    }

    fn check(&self, file: &FileHandle) -> Result<()> {
        let key = self.key(file);
        match self.blobs.size(&key)? {
            // The metadata exists and names this file: its absence is damage, not a passing outage.
            None => Err(CoreError::Corrupt {
                path: self.blobs.locate(&key),
                reason: "a file the checkpoint references is missing".into(),
            }),
            Some(len) if len != file.size => Err(CoreError::Corrupt {
                path: self.blobs.locate(&key),
                reason: format!("expected {} bytes, found {len}", file.size),
            }),
            Some(_) => Ok(()),
        }
    }
}

struct Writer {
    blobs: Arc<dyn Blobs>,
    dir: String,
    tag: Arc<str>,
    written: AtomicU64,
}

impl SnapshotWriter for Writer {
    fn write_private(&self, local_name: &str, bytes: &[u8]) -> Result<FileHandle> {
        let name = format!("{}-{local_name}", self.tag);
        #[cfg(test)]
        let name = match crate::sim::mutant() {
            crate::sim::Mutant::UntaggedPrivateNames => local_name.to_owned(),
            _ => name,
        };
        self.blobs.put(&join(&self.dir, &name), bytes, Put::InProgress)?;
        self.written.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(FileHandle {
            scope: FileScope::Private,
            name,
            local_name: local_name.to_owned(),
            size: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        })
    }

    fn upload_shared(&self, name: &str, local_name: &str, src: &Path) -> Result<FileHandle> {
        // Shared files are immutable: one already there with this name and size is this one,
        // uploaded by an earlier checkpoint (of this location: a file restored from another
        // location is uploaded here on its first use). Streamed, read a piece at a time: a
        // checkpoint's memory does not grow with the state's largest file.
        let key = join(SHARED, name);
        let size = fs::metadata(src).map_err(|e| CoreError::io("reading", src, e))?.len();
        let sum = if self.blobs.size(&key)? == Some(size) {
            file_sum(src)?
        } else {
            let sent = self.blobs.put_file(&key, src)?;
            self.written.fetch_add(sent.size, Ordering::Relaxed);
            sent
        };
        Ok(FileHandle {
            scope: FileScope::Shared,
            name: name.to_owned(),
            local_name: local_name.to_owned(),
            size: sum.size,
            crc32: sum.crc32,
        })
    }

    fn bytes_written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
}

/// Checks that every file a snapshot references exists with the recorded size.
fn verify_files(s: &Snapshot) -> Result<()> {
    for f in s.meta.files() {
        s.reader.check(f)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
