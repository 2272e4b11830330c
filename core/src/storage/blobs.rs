//! What checkpoint storage needs of a place to keep files: a local directory ([`Dir`]) or an
//! object store ([`super::object::Bucket`]). Keys are `/`-separated and relative to the place's
//! root; the checkpoint layout on top of them is in [`super::layout`], the same for both.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{CoreError, Result};

/// How a file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Put {
    /// A file of a checkpoint in progress: durable once written, nobody reads it before the
    /// checkpoint's metadata exists, so it need not appear atomically.
    InProgress,
    /// Appears atomically, replacing what was there.
    Replace,
    /// Appears atomically, only if nothing is there (the checkpoint metadata: never overwritten).
    Create,
}

/// The size and CRC32 of what a copy passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sum {
    pub(crate) size: u64,
    pub(crate) crc32: u32,
}

impl Sum {
    pub(crate) fn of(bytes: &[u8]) -> Sum {
        Sum {
            size: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        }
    }
}

/// A [`Sum`] taken as the bytes pass, piece by piece.
#[derive(Default)]
pub(crate) struct Summing {
    crc: crc32fast::Hasher,
    size: u64,
}

impl Summing {
    pub(crate) fn update(&mut self, piece: &[u8]) {
        self.crc.update(piece);
        self.size += piece.len() as u64;
    }

    pub(crate) fn sum(self) -> Sum {
        Sum {
            size: self.size,
            crc32: self.crc.finalize(),
        }
    }
}

/// How much of a file a copy holds at once.
pub(crate) const PIECE: usize = 1 << 20;

/// Copies `from` into `to` a piece at a time ([`PIECE`]), summing what passed: memory does not
/// grow with the file (a RocksDB file of a large state is tens to hundreds of megabytes).
pub(crate) fn copy_summed(from: &mut impl Read, to: &mut impl Write) -> std::io::Result<Sum> {
    let mut buf = vec![0u8; PIECE];
    let mut summing = Summing::default();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        summing.update(&buf[..n]);
        to.write_all(&buf[..n])?;
    }
    Ok(summing.sum())
}

/// A name beside `path` for a file written before it is moved into place: unique, so two
/// writers of one name (a renewal and a release) never share a file.
fn beside(path: &Path) -> PathBuf {
    path.with_extension(format!("tmp-{}-{:x}", std::process::id(), rand::random::<u64>()))
}

/// The size and CRC32 of the file at `path`, read a piece at a time.
pub(crate) fn file_sum(path: &Path) -> Result<Sum> {
    let mut f = File::open(path).map_err(|e| CoreError::io("reading", path, e))?;
    copy_summed(&mut f, &mut std::io::sink()).map_err(|e| CoreError::io("reading", path, e))
}

/// A place to keep checkpoint files.
pub(crate) trait Blobs: Send + Sync {
    /// Where `key` is, for messages and for locations handed to users (a path or a URL).
    fn locate(&self, key: &str) -> PathBuf;
    /// The content of `key`; a missing key is an I/O error of kind `NotFound`.
    fn get(&self, key: &str) -> Result<Vec<u8>>;
    /// The size of `key`, `None` when it does not exist.
    fn size(&self, key: &str) -> Result<Option<u64>>;
    /// Writes `key`. For [`Put::Create`], `Ok(false)` when it existed (and is left as it was).
    fn put(&self, key: &str, bytes: &[u8], how: Put) -> Result<bool>;
    /// Writes `key` from the file `src`, replacing what was there (as [`Put::Replace`]); what
    /// was sent. The places stream it, a piece at a time (this default reads it whole).
    fn put_file(&self, key: &str, src: &Path) -> Result<Sum> {
        let bytes = fs::read(src).map_err(|e| CoreError::io("reading", src, e))?;
        self.put(key, &bytes, Put::Replace)?;
        Ok(Sum::of(&bytes))
    }
    /// Writes the content of `key` into the file `dest` (created or truncated); what was
    /// received. The places stream it, a piece at a time (this default reads it whole).
    fn get_file(&self, key: &str, dest: &Path) -> Result<Sum> {
        let bytes = self.get(key)?;
        crate::private_fs::write(dest, &bytes).map_err(|e| CoreError::io("writing", dest, e))?;
        Ok(Sum::of(&bytes))
    }
    /// The names directly under the root that hold files (`chk-1`, `shared`, ...).
    fn dirs(&self) -> Result<Vec<String>>;
    /// Deletes `key`; a missing one is fine.
    fn delete(&self, key: &str) -> Result<()>;
    /// Deletes everything under `dir`; a missing one is fine.
    fn delete_dir(&self, dir: &str) -> Result<()>;
    /// Deletes the files directly under `dir` whose names begin with `prefix` (and `dir` itself
    /// where directories exist and it is left empty); a missing one is fine.
    fn delete_named(&self, dir: &str, prefix: &str) -> Result<()>;
}

/// Files in a local directory: written, fsynced, and (for [`Put::Replace`] and [`Put::Create`])
/// moved into place atomically, with the directory fsynced.
#[derive(Debug, Clone)]
pub(crate) struct Dir {
    pub(crate) root: PathBuf,
}

fn fsync_parent(path: &Path) -> Result<()> {
    if let Some(parent) = path.parent() {
        File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(|e| CoreError::io("fsyncing directory", parent, e))?;
    }
    Ok(())
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = crate::private_fs::create_file(path).map_err(|e| CoreError::io("creating", path, e))?;
    f.write_all(bytes).map_err(|e| CoreError::io("writing", path, e))?;
    f.sync_all().map_err(|e| CoreError::io("fsyncing", path, e))
}

/// [`write_synced`] into a file that must not exist yet (a temporary name: never a link or a
/// file someone else placed there).
fn write_synced_new(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = crate::private_fs::create_new_file(path).map_err(|e| CoreError::io("creating", path, e))?;
    f.write_all(bytes).map_err(|e| CoreError::io("writing", path, e))?;
    f.sync_all().map_err(|e| CoreError::io("fsyncing", path, e))
}

impl Blobs for Dir {
    fn locate(&self, key: &str) -> PathBuf {
        if key.is_empty() {
            self.root.clone()
        } else {
            self.root.join(key)
        }
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        let path = self.locate(key);
        fs::read(&path).map_err(|e| CoreError::io("reading", &path, e))
    }

    fn size(&self, key: &str) -> Result<Option<u64>> {
        let path = self.locate(key);
        match fs::metadata(&path) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(CoreError::io("reading", &path, e)),
        }
    }

    fn put(&self, key: &str, bytes: &[u8], how: Put) -> Result<bool> {
        let path = self.locate(key);
        if let Some(parent) = path.parent() {
            crate::private_fs::create_dir_all(parent).map_err(|e| CoreError::io("creating", parent, e))?;
        }
        match how {
            Put::InProgress => write_synced(&path, bytes)?,
            Put::Replace => {
                let tmp = beside(&path);
                write_synced_new(&tmp, bytes)?;
                fs::rename(&tmp, &path).map_err(|e| CoreError::io("renaming into place", &path, e))?;
                fsync_parent(&path)?;
            }
            Put::Create => {
                // A hard link never replaces an existing file: a second writer of the same name
                // (another process on the same directory) finds it there.
                let tmp = beside(&path);
                write_synced_new(&tmp, bytes)?;
                let linked = fs::hard_link(&tmp, &path);
                let _ = fs::remove_file(&tmp);
                match linked {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
                    Err(e) => return Err(CoreError::io("linking into place", &path, e)),
                }
                fsync_parent(&path)?;
            }
        }
        Ok(true)
    }

    fn put_file(&self, key: &str, src: &Path) -> Result<Sum> {
        let path = self.locate(key);
        if let Some(parent) = path.parent() {
            crate::private_fs::create_dir_all(parent).map_err(|e| CoreError::io("creating", parent, e))?;
        }
        let mut from = File::open(src).map_err(|e| CoreError::io("reading", src, e))?;
        let tmp = beside(&path);
        let copied = (|| {
            let mut to = crate::private_fs::create_new_file(&tmp).map_err(|e| CoreError::io("creating", &tmp, e))?;
            let sum = copy_summed(&mut from, &mut to).map_err(|e| CoreError::io("copying into", &tmp, e))?;
            to.sync_all().map_err(|e| CoreError::io("fsyncing", &tmp, e))?;
            Ok(sum)
        })();
        let sum = match copied {
            Ok(sum) => sum,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        fs::rename(&tmp, &path).map_err(|e| CoreError::io("renaming into place", &path, e))?;
        fsync_parent(&path)?;
        Ok(sum)
    }

    fn get_file(&self, key: &str, dest: &Path) -> Result<Sum> {
        let path = self.locate(key);
        let mut from = File::open(&path).map_err(|e| CoreError::io("reading", &path, e))?;
        let mut to = crate::private_fs::create_file(dest).map_err(|e| CoreError::io("creating", dest, e))?;
        copy_summed(&mut from, &mut to).map_err(|e| CoreError::io("copying into", dest, e))
    }

    fn dirs(&self) -> Result<Vec<String>> {
        let entries = fs::read_dir(&self.root).map_err(|e| CoreError::io("listing", &self.root, e))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| CoreError::io("listing", &self.root, e))?;
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                if let Some(name) = entry.file_name().to_str() {
                    names.push(name.to_owned());
                }
            }
        }
        Ok(names)
    }

    fn delete(&self, key: &str) -> Result<()> {
        let path = self.locate(key);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CoreError::io("removing", &path, e)),
            _ => Ok(()),
        }
    }

    fn delete_dir(&self, dir: &str) -> Result<()> {
        let path = self.locate(dir);
        match fs::remove_dir_all(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CoreError::io("removing", &path, e)),
            _ => Ok(()),
        }
    }

    fn delete_named(&self, dir: &str, prefix: &str) -> Result<()> {
        let path = self.locate(dir);
        let entries = match fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(CoreError::io("listing", &path, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| CoreError::io("listing", &path, e))?;
            if entry.file_name().to_str().is_some_and(|n| n.starts_with(prefix)) {
                let file = entry.path();
                match fs::remove_file(&file) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(CoreError::io("removing", &file, e))
                    }
                    _ => {}
                }
            }
        }
        // Only when empty: another process's files (or a void marker) keep it.
        let _ = fs::remove_dir(&path);
        Ok(())
    }
}
