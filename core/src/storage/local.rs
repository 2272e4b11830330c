//! Checkpoints in a local directory:
//!
//! ```text
//! <root>/chk-<id>/_metadata     versioned, checksummed; written to a temporary name, fsynced, renamed
//! <root>/chk-<id>/<file>        state files private to checkpoint <id>
//! <root>/shared/<file>          immutable state files referenced by several checkpoints
//!
//! A savepoint or exported checkpoint is a directory with `_metadata` and every file it references.
//! <root>/_has_checkpoints      marker: this directory has held a completed checkpoint
//! ```
//!
//! A checkpoint counts as completed once its `_metadata` exists. Restore never guesses: a newest
//! checkpoint that does not verify is an error (an older one could write again what the newer one's
//! transactions committed), and so is a directory that held checkpoints and now holds none.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{CheckpointStorage, Snapshot, SnapshotReader, SnapshotWriter};
use crate::checkpoint::{CheckpointMetadata, FileHandle, FileScope, METADATA_VERSION};
use crate::error::{CoreError, Result};
use crate::message::CheckpointId;

const METADATA_FILE: &str = "_metadata";
const MARKER_FILE: &str = "_has_checkpoints";
const MAGIC: &[u8; 4] = b"EXCK";
const HEADER_LEN: usize = 4 + 4 + 4 + 8;

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

/// Checkpoint storage in a local directory.
#[derive(Debug, Clone)]
pub struct LocalStorage {
    root: PathBuf,
}

impl LocalStorage {
    /// Storage rooted at `root` (created if missing).
    pub fn new(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        fs::create_dir_all(root.join("shared")).map_err(|e| CoreError::io("creating", &root, e))?;
        Ok(LocalStorage { root })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of checkpoint `id`.
    pub fn checkpoint_dir(&self, id: CheckpointId) -> PathBuf {
        self.root.join(format!("chk-{id}"))
    }

    /// Opens a checkpoint or savepoint directory given by path and checks that every file it
    /// references is there with its recorded size (contents are verified as they are read).
    pub fn open_verified(dir: &Path) -> Result<Snapshot> {
        let s = Self::open_path(dir)?;
        verify_files(&s)?;
        Ok(s)
    }

    /// Records that this directory holds a completed checkpoint (idempotent).
    fn mark_has_checkpoints(&self) -> Result<()> {
        let marker = self.root.join(MARKER_FILE);
        if marker.exists() {
            return Ok(());
        }
        write_durably(
            &marker,
            b"This directory has held completed checkpoints; a restart finding none refuses to start over.\n",
        )
    }

    /// Opens a checkpoint or savepoint directory given by path (`<root>/chk-N` or an exported one).
    pub fn open_path(dir: &Path) -> Result<Snapshot> {
        let meta = read_metadata(&dir.join(METADATA_FILE))?;
        Ok(Snapshot {
            meta,
            reader: Arc::new(DirReader { dir: dir.to_path_buf() }),
        })
    }
}

fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(|e| CoreError::io("creating", &tmp, e))?;
    f.write_all(bytes).map_err(|e| CoreError::io("writing", &tmp, e))?;
    f.sync_all().map_err(|e| CoreError::io("fsyncing", &tmp, e))?;
    drop(f);
    fs::rename(&tmp, path).map_err(|e| CoreError::io("renaming into place", path, e))?;
    if let Some(parent) = path.parent() {
        File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(|e| CoreError::io("fsyncing directory", parent, e))?;
    }
    Ok(())
}

/// Like [`write_durably`], but never replaces an existing file: a second writer of the same
/// checkpoint id (another process on the same directory) fails instead of overwriting it.
fn write_new_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f = File::create(&tmp).map_err(|e| CoreError::io("creating", &tmp, e))?;
    f.write_all(bytes).map_err(|e| CoreError::io("writing", &tmp, e))?;
    f.sync_all().map_err(|e| CoreError::io("fsyncing", &tmp, e))?;
    drop(f);
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(CoreError::Corrupt {
                path: path.to_path_buf(),
                reason: "this checkpoint already exists: is another job writing to the same checkpoint directory?"
                    .into(),
            })
        }
        Err(e) => return Err(CoreError::io("linking into place", path, e)),
    }
    if let Some(parent) = path.parent() {
        File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(|e| CoreError::io("fsyncing directory", parent, e))?;
    }
    Ok(())
}

fn encode_metadata(meta: &CheckpointMetadata) -> Result<Vec<u8>> {
    let payload = bincode::serde::encode_to_vec(meta, bincode::config::standard())
        .map_err(|e| CoreError::ser("checkpoint metadata", e))?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&METADATA_VERSION.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

fn read_metadata(path: &Path) -> Result<CheckpointMetadata> {
    let bytes = fs::read(path).map_err(|e| CoreError::io("reading", path, e))?;
    let corrupt = |reason: String| CoreError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() < HEADER_LEN || &bytes[..4] != MAGIC {
        return Err(corrupt(
            "not a checkpoint metadata file (bad magic or truncated header)".into(),
        ));
    }
    let version = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if version > METADATA_VERSION {
        return Err(corrupt(format!(
            "metadata version {version} is newer than this build understands ({METADATA_VERSION})"
        )));
    }
    let crc = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    let len = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes")) as usize;
    let payload = &bytes[HEADER_LEN..];
    if payload.len() != len {
        return Err(corrupt(format!(
            "expected {len} bytes of metadata, found {}",
            payload.len()
        )));
    }
    if crc32fast::hash(payload) != crc {
        return Err(corrupt("metadata checksum mismatch".into()));
    }
    let (meta, _): (CheckpointMetadata, _) = bincode::serde::decode_from_slice(payload, bincode::config::standard())
        .map_err(|e| corrupt(format!("undecodable metadata: {e}")))?;
    Ok(meta)
}

fn file_path(dir: &Path, file: &FileHandle) -> PathBuf {
    match file.scope {
        FileScope::Private => dir.join(&file.name),
        FileScope::Shared => dir.parent().unwrap_or(dir).join("shared").join(&file.name),
    }
}

fn verify(path: &Path, file: &FileHandle, bytes: &[u8]) -> Result<()> {
    if bytes.len() as u64 != file.size || crc32fast::hash(bytes) != file.crc32 {
        return Err(CoreError::Corrupt {
            path: path.to_path_buf(),
            reason: format!(
                "expected {} bytes with crc32 {:08x}, found {} bytes with crc32 {:08x}",
                file.size,
                file.crc32,
                bytes.len(),
                crc32fast::hash(bytes)
            ),
        });
    }
    Ok(())
}

struct DirReader {
    dir: PathBuf,
}

impl SnapshotReader for DirReader {
    fn read(&self, file: &FileHandle) -> Result<Vec<u8>> {
        let path = file_path(&self.dir, file);
        let bytes = fs::read(&path).map_err(|e| CoreError::io("reading", &path, e))?;
        verify(&path, file, &bytes)?;
        Ok(bytes)
    }

    fn download(&self, file: &FileHandle, dest: &Path) -> Result<()> {
        let bytes = self.read(file)?;
        fs::write(dest, bytes).map_err(|e| CoreError::io("writing", dest, e))
    }

    fn check(&self, file: &FileHandle) -> Result<()> {
        let path = file_path(&self.dir, file);
        let len = match fs::metadata(&path) {
            Ok(m) => m.len(),
            // The metadata exists and names this file: its absence is damage, not a passing outage.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CoreError::Corrupt {
                    path,
                    reason: "a file the checkpoint references is missing".into(),
                })
            }
            Err(e) => return Err(CoreError::io("reading", &path, e)),
        };
        if len != file.size {
            return Err(CoreError::Corrupt {
                path,
                reason: format!("expected {} bytes, found {len}", file.size),
            });
        }
        Ok(())
    }
}

struct DirWriter {
    dir: PathBuf,
    shared: PathBuf,
    written: AtomicU64,
}

impl SnapshotWriter for DirWriter {
    fn write_private(&self, name: &str, bytes: &[u8]) -> Result<FileHandle> {
        let path = self.dir.join(name);
        let mut f = File::create(&path).map_err(|e| CoreError::io("creating", &path, e))?;
        f.write_all(bytes).map_err(|e| CoreError::io("writing", &path, e))?;
        f.sync_all().map_err(|e| CoreError::io("fsyncing", &path, e))?;
        self.written.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(FileHandle {
            scope: FileScope::Private,
            name: name.to_owned(),
            local_name: name.to_owned(),
            size: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        })
    }

    fn upload_shared(&self, name: &str, local_name: &str, src: &Path) -> Result<FileHandle> {
        let bytes = fs::read(src).map_err(|e| CoreError::io("reading", src, e))?;
        let handle = FileHandle {
            scope: FileScope::Shared,
            name: name.to_owned(),
            local_name: local_name.to_owned(),
            size: bytes.len() as u64,
            crc32: crc32fast::hash(&bytes),
        };
        let dest = self.shared.join(name);
        if let Ok(existing) = fs::metadata(&dest) {
            if existing.len() == handle.size {
                return Ok(handle);
            }
        }
        write_durably(&dest, &bytes)?;
        self.written.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(handle)
    }

    fn bytes_written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
}

fn shared_names(meta: &CheckpointMetadata) -> impl Iterator<Item = &str> {
    meta.files()
        .filter(|f| f.scope == FileScope::Shared)
        .map(|f| f.name.as_str())
}

impl CheckpointStorage for LocalStorage {
    fn writer(&self, id: CheckpointId) -> Result<Arc<dyn SnapshotWriter>> {
        let dir = self.checkpoint_dir(id);
        fs::create_dir_all(&dir).map_err(|e| CoreError::io("creating", &dir, e))?;
        Ok(Arc::new(DirWriter {
            dir,
            shared: self.root.join("shared"),
            written: AtomicU64::new(0),
        }))
    }

    fn commit(&self, meta: &CheckpointMetadata) -> Result<()> {
        let dir = self.checkpoint_dir(meta.id);
        fs::create_dir_all(&dir).map_err(|e| CoreError::io("creating", &dir, e))?;
        write_new_durably(&dir.join(METADATA_FILE), &encode_metadata(meta)?)?;
        self.mark_has_checkpoints()
    }

    fn abort(&self, id: CheckpointId) -> Result<()> {
        let dir = self.checkpoint_dir(id);
        if dir.join(METADATA_FILE).exists() {
            return Ok(()); // completed meanwhile: never delete a durable checkpoint here
        }
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CoreError::io("removing", &dir, e)),
            _ => Ok(()),
        }
    }

    fn completed(&self) -> Result<Vec<CheckpointId>> {
        let entries = fs::read_dir(&self.root).map_err(|e| CoreError::io("listing", &self.root, e))?;
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| CoreError::io("listing", &self.root, e))?;
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_prefix("chk-"))
                .and_then(|n| n.parse().ok())
            else {
                continue;
            };
            if entry.path().join(METADATA_FILE).exists() {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    fn open(&self, id: CheckpointId) -> Result<Snapshot> {
        Self::open_path(&self.checkpoint_dir(id))
    }

    fn latest(&self) -> Result<Option<Snapshot>> {
        let ids = self.completed()?;
        let Some(&newest) = ids.last() else {
            if self.root.join(MARKER_FILE).exists() {
                return Err(CoreError::CheckpointsVanished(self.root.clone()));
            }
            return Ok(None);
        };
        match self.open(newest).and_then(|s| verify_files(&s).map(|()| s)) {
            Ok(s) => {
                // Directories written before the marker existed get it on their first restore.
                self.mark_has_checkpoints()?;
                Ok(Some(s))
            }
            Err(CoreError::Corrupt { path, reason }) => {
                let older: Vec<String> = ids[..ids.len() - 1].iter().rev().take(5).map(u64::to_string).collect();
                Err(CoreError::NewestCheckpointUnusable {
                    id: newest,
                    dir: self.root.clone(),
                    reason: format!("{}: {reason}", path.display()),
                    older: if older.is_empty() {
                        String::new()
                    } else {
                        format!(" (older checkpoints here: {})", older.join(", "))
                    },
                })
            }
            // I/O (EIO, ESTALE, permissions, an outage): the attempt fails and is retried.
            Err(e) => Err(e),
        }
    }

    fn retain(&self, keep: usize) -> Result<Vec<CheckpointId>> {
        let ids = self.completed()?;
        if ids.len() <= keep {
            return Ok(Vec::new());
        }
        let (drop_ids, keep_ids) = ids.split_at(ids.len() - keep);
        let mut still_used = BTreeSet::new();
        for id in keep_ids {
            // A retained checkpoint that no longer reads keeps nothing alive; it is skipped on restore.
            if let Ok(s) = self.open(*id) {
                still_used.extend(shared_names(&s.meta).map(str::to_owned));
            }
        }
        for id in drop_ids {
            let dir = self.checkpoint_dir(*id);
            if let Ok(s) = self.open(*id) {
                for name in shared_names(&s.meta) {
                    if !still_used.contains(name) {
                        let path = self.root.join("shared").join(name);
                        if let Err(e) = fs::remove_file(&path) {
                            if e.kind() != std::io::ErrorKind::NotFound {
                                return Err(CoreError::io("removing", &path, e));
                            }
                        }
                    }
                }
            }
            // Metadata first: a crash midway leaves an incomplete directory, never a listed
            // checkpoint with missing files.
            let _ = fs::remove_file(dir.join(METADATA_FILE));
            fs::remove_dir_all(&dir).map_err(|e| CoreError::io("removing", &dir, e))?;
        }
        Ok(drop_ids.to_vec())
    }

    fn discard_all(&self) -> Result<()> {
        for id in self.completed()? {
            let dir = self.checkpoint_dir(id);
            let _ = fs::remove_file(dir.join(METADATA_FILE));
            fs::remove_dir_all(&dir).map_err(|e| CoreError::io("removing", &dir, e))?;
        }
        // Deleted on purpose (retention on cancel): the next start begins anew.
        let marker = self.root.join(MARKER_FILE);
        if let Err(e) = fs::remove_file(&marker) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(CoreError::io("removing", &marker, e));
            }
        }
        let shared = self.root.join("shared");
        fs::remove_dir_all(&shared).map_err(|e| CoreError::io("removing", &shared, e))?;
        fs::create_dir_all(&shared).map_err(|e| CoreError::io("creating", &shared, e))
    }

    fn export(&self, id: CheckpointId, dir: &Path) -> Result<()> {
        let source = self.open(id)?;
        fs::create_dir_all(dir).map_err(|e| CoreError::io("creating", dir, e))?;
        let mut meta = source.meta.clone();
        for op in meta.operators.values_mut() {
            for sub in &mut op.subtasks {
                if let Some(keyed) = &mut sub.keyed {
                    for file in &mut keyed.files {
                        let bytes = source.reader.read(file)?;
                        if file.scope == FileScope::Shared {
                            file.name = format!("shared-{}", file.name);
                            file.scope = FileScope::Private;
                        }
                        let dest = dir.join(&file.name);
                        write_durably(&dest, &bytes)?;
                    }
                }
            }
        }
        write_durably(&dir.join(METADATA_FILE), &encode_metadata(&meta)?)
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
#[path = "local_tests.rs"]
mod tests;
