//! Sorting more entries than memory should hold: runs of a bounded size are sorted and spilled
//! to temporary files, then merged (k-way, one buffered reader per run). Entries are the ids'
//! hashes and places ([`Entry`]), or anything else that writes and reads itself ([`Spilled`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// An id's hash and where its record was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Entry {
    /// 128-bit hash of the id.
    pub(super) hash: u128,
    /// Where: partition << 48 | offset (topics), or the row's number (tables).
    pub(super) loc: u64,
}

/// What a sorted run holds: written one after another, read back in the same order.
pub(super) trait Spilled: Ord + Sized {
    /// Writes the entry.
    fn write(&self, w: &mut impl Write) -> std::io::Result<()>;
    /// Reads an entry; `None` at the end of the run.
    fn read(r: &mut impl Read) -> std::io::Result<Option<Self>>;
}

const SIZE: usize = 24;

impl Spilled for Entry {
    fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.to_bytes())
    }

    fn read(r: &mut impl Read) -> std::io::Result<Option<Entry>> {
        let mut b = [0u8; SIZE];
        match r.read_exact(&mut b) {
            Ok(()) => Ok(Some(Entry::from_bytes(&b))),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl Entry {
    fn to_bytes(self) -> [u8; SIZE] {
        let mut b = [0u8; SIZE];
        b[..16].copy_from_slice(&self.hash.to_le_bytes());
        b[16..].copy_from_slice(&self.loc.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8; SIZE]) -> Entry {
        Entry {
            hash: u128::from_le_bytes(b[..16].try_into().expect("16 bytes")),
            loc: u64::from_le_bytes(b[16..].try_into().expect("8 bytes")),
        }
    }
}

/// Collects entries; sorted runs beyond `limit` go to temporary files.
pub(super) struct Sorter<T = Entry> {
    dir: PathBuf,
    limit: usize,
    buf: Vec<T>,
    runs: Vec<tempfile::NamedTempFile>,
}

impl<T: Spilled> Sorter<T> {
    /// A sorter spilling into `dir`.
    pub(super) fn new(dir: &Path, limit: usize) -> Result<Sorter<T>> {
        if !dir.is_dir() {
            anyhow::bail!("{}: not a directory (where sorted runs are spilled)", dir.display());
        }
        Ok(Sorter {
            dir: dir.to_owned(),
            limit: limit.max(1),
            buf: Vec::new(),
            runs: Vec::new(),
        })
    }

    /// Adds an entry (spilling a sorted run when the buffer is full).
    pub(super) fn push(&mut self, e: T) -> Result<()> {
        self.buf.push(e);
        if self.buf.len() >= self.limit {
            self.spill()?;
        }
        Ok(())
    }

    /// Runs spilled so far.
    pub(super) fn spilled(&self) -> usize {
        self.runs.len()
    }

    fn spill(&mut self) -> Result<()> {
        self.buf.sort_unstable();
        let file = tempfile::Builder::new()
            .prefix("exactly-verify-")
            .tempfile_in(&self.dir)
            .with_context(|| format!("creating a temporary file in {}", self.dir.display()))?;
        let mut w = BufWriter::with_capacity(1 << 16, file.as_file());
        for e in self.buf.drain(..) {
            e.write(&mut w)
                .with_context(|| format!("writing a sorted run to {}", file.path().display()))?;
        }
        w.flush()
            .with_context(|| format!("writing a sorted run to {}", file.path().display()))?;
        drop(w);
        self.runs.push(file);
        Ok(())
    }

    /// Every entry, in order.
    pub(super) fn finish(mut self) -> Result<Merged<T>> {
        if self.runs.is_empty() {
            self.buf.sort_unstable();
            return Ok(Merged {
                memory: self.buf.into_iter(),
                readers: Vec::new(),
                heap: BinaryHeap::new(),
                _runs: Vec::new(),
            });
        }
        if !self.buf.is_empty() {
            self.spill()?;
        }
        let mut readers = Vec::new();
        let mut heap = BinaryHeap::new();
        for (i, run) in self.runs.iter().enumerate() {
            let f = File::open(run.path()).with_context(|| format!("opening {}", run.path().display()))?;
            let mut r = BufReader::with_capacity(1 << 16, f);
            if let Some(e) = read_entry(&mut r)? {
                heap.push(Reverse((e, i)));
            }
            readers.push(r);
        }
        Ok(Merged {
            memory: Vec::new().into_iter(),
            readers,
            heap,
            _runs: self.runs,
        })
    }
}

fn read_entry<T: Spilled>(r: &mut impl Read) -> Result<Option<T>> {
    T::read(r).context("reading a sorted run")
}

/// The merged, sorted entries (the temporary files go with it).
pub(super) struct Merged<T = Entry> {
    memory: std::vec::IntoIter<T>,
    readers: Vec<BufReader<File>>,
    heap: BinaryHeap<Reverse<(T, usize)>>,
    _runs: Vec<tempfile::NamedTempFile>,
}

impl<T: Spilled> Iterator for Merged<T> {
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        if self.readers.is_empty() {
            return self.memory.next().map(Ok);
        }
        let Reverse((e, i)) = self.heap.pop()?;
        match read_entry(&mut self.readers[i]) {
            Ok(Some(n)) => self.heap.push(Reverse((n, i))),
            Ok(None) => {}
            Err(err) => return Some(Err(err)),
        }
        Some(Ok(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spilled_runs_merge_into_one_sorted_sequence() {
        let dir = tempfile::tempdir().unwrap();
        let mut s: Sorter = Sorter::new(dir.path(), 7).unwrap();
        let mut all = Vec::new();
        for i in 0..100u64 {
            let e = Entry {
                hash: u128::from((i * 7919) % 101),
                loc: i,
            };
            all.push(e);
            s.push(e).unwrap();
        }
        assert_eq!(s.spilled(), 14);
        let merged: Vec<Entry> = s.finish().unwrap().map(Result::unwrap).collect();
        all.sort_unstable();
        assert_eq!(merged, all);
        // Under the limit: no file at all.
        let mut s: Sorter = Sorter::new(dir.path(), 1000).unwrap();
        s.push(Entry { hash: 2, loc: 0 }).unwrap();
        s.push(Entry { hash: 1, loc: 1 }).unwrap();
        assert_eq!(s.spilled(), 0);
        let merged: Vec<u128> = s.finish().unwrap().map(|e| e.unwrap().hash).collect();
        assert_eq!(merged, [1, 2]);
    }
}
