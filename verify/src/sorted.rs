//! Sorting more entries than memory should hold: runs of a bounded size are sorted and spilled
//! to temporary files, then merged (k-way, one buffered reader per run). Entries are the ids'
//! hashes and places ([`Entry`]), or anything else that writes and reads itself ([`Spilled`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, Write};
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
    /// Reads an entry; `None` at the end of the run (between entries: [`read_start`]).
    fn read(r: &mut impl Read) -> std::io::Result<Option<Self>>;
    /// The memory the entry holds while its run fills.
    fn bytes(&self) -> usize {
        std::mem::size_of::<Self>()
    }
}

/// Fills `b` from `r`: `false` when `r` ends before its first byte (the end of a run), an error
/// when it ends within `b` (a run cut short).
pub(super) fn read_start(r: &mut impl Read, b: &mut [u8]) -> std::io::Result<bool> {
    let mut at = 0;
    while at < b.len() {
        match r.read(&mut b[at..]) {
            Ok(0) if at == 0 => return Ok(false),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

const SIZE: usize = 24;

impl Spilled for Entry {
    fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.to_bytes())
    }

    fn read(r: &mut impl Read) -> std::io::Result<Option<Entry>> {
        let mut b = [0u8; SIZE];
        Ok(read_start(r, &mut b)?.then(|| Entry::from_bytes(&b)))
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

/// Collects entries; sorted runs beyond `limit` entries (or the byte limit) go to temporary
/// files.
pub(super) struct Sorter<T = Entry> {
    dir: PathBuf,
    limit: usize,
    byte_limit: usize,
    bytes: usize,
    buf: Vec<T>,
    /// Each run and how many entries it holds.
    runs: Vec<(tempfile::NamedTempFile, u64)>,
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
            byte_limit: usize::MAX,
            bytes: 0,
            buf: Vec::new(),
            runs: Vec::new(),
        })
    }

    /// Spills a run also once its entries hold `bytes` of memory ([`Spilled::bytes`]).
    pub(super) fn with_byte_limit(mut self, bytes: usize) -> Sorter<T> {
        self.byte_limit = bytes;
        self
    }

    /// Adds an entry (spilling a sorted run when the buffer is full).
    pub(super) fn push(&mut self, e: T) -> Result<()> {
        self.bytes += e.bytes();
        self.buf.push(e);
        if self.buf.len() >= self.limit || self.bytes >= self.byte_limit {
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
        let n = self.buf.len() as u64;
        self.bytes = 0;
        for e in self.buf.drain(..) {
            e.write(&mut w)
                .with_context(|| format!("writing a sorted run to {}", file.path().display()))?;
        }
        w.flush()
            .with_context(|| format!("writing a sorted run to {}", file.path().display()))?;
        drop(w);
        self.runs.push((file, n));
        Ok(())
    }

    /// Every entry, in order.
    pub(super) fn finish(mut self) -> Result<Merged<T>> {
        if self.runs.is_empty() {
            self.buf.sort_unstable();
            return Ok(Merged {
                memory: self.buf.into_iter(),
                readers: Vec::new(),
                read: Vec::new(),
                expected: Vec::new(),
                heap: BinaryHeap::new(),
                _runs: Vec::new(),
            });
        }
        if !self.buf.is_empty() {
            self.spill()?;
        }
        let mut readers = Vec::new();
        let mut heap = BinaryHeap::new();
        let (mut expected, mut paths) = (Vec::new(), Vec::new());
        // Each run read through the handle it was written with (one open file a run).
        for (i, (run, n)) in self.runs.into_iter().enumerate() {
            let (mut f, path) = run.into_parts();
            f.rewind().with_context(|| format!("reading {}", path.display()))?;
            let mut r = BufReader::with_capacity(1 << 16, f);
            match read_entry(&mut r)? {
                Some(e) => heap.push(Reverse((e, i))),
                None => anyhow::bail!("{}: a sorted run of {n} entries is empty", path.display()),
            }
            readers.push(r);
            expected.push(n);
            paths.push(path);
        }
        Ok(Merged {
            memory: Vec::new().into_iter(),
            // The first entry of each run is in the heap.
            read: vec![1; readers.len()],
            readers,
            expected,
            heap,
            _runs: paths,
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
    /// Entries taken from each run so far, and how many it holds: a run that ends early (its
    /// file changed under the audit) is an error, not fewer records.
    read: Vec<u64>,
    expected: Vec<u64>,
    heap: BinaryHeap<Reverse<(T, usize)>>,
    _runs: Vec<tempfile::TempPath>,
}

impl<T: Spilled> Iterator for Merged<T> {
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        if self.readers.is_empty() {
            return self.memory.next().map(Ok);
        }
        let Reverse((e, i)) = self.heap.pop()?;
        match read_entry(&mut self.readers[i]) {
            Ok(Some(n)) => {
                self.read[i] += 1;
                self.heap.push(Reverse((n, i)));
            }
            Ok(None) if self.read[i] == self.expected[i] => {}
            Ok(None) => {
                return Some(Err(anyhow::anyhow!(
                    "a sorted run ended after {} of its {} entries (its temporary file changed during the audit)",
                    self.read[i],
                    self.expected[i]
                )))
            }
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

    #[test]
    fn a_run_cut_short_is_an_error_not_fewer_entries() {
        // Cut at an entry's end (no partial entry to see) and within one.
        for keep in [3 * SIZE as u64, 3 * SIZE as u64 + 5] {
            let dir = tempfile::tempdir().unwrap();
            let mut s: Sorter = Sorter::new(dir.path(), 10).unwrap();
            for i in 0..20u64 {
                s.push(Entry {
                    hash: u128::from(i),
                    loc: i,
                })
                .unwrap();
            }
            assert_eq!(s.spilled(), 2);
            s.runs[0].0.as_file().set_len(keep).unwrap();
            let read: Result<Vec<Entry>> = s.finish().unwrap().collect();
            let e = read.expect_err("a cut run must fail the merge");
            assert!(format!("{e:#}").contains("sorted run"), "{e:#}");
        }
    }

    #[test]
    fn a_byte_limit_spills_runs_before_the_entry_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mut s: Sorter = Sorter::new(dir.path(), 1_000)
            .unwrap()
            .with_byte_limit(10 * std::mem::size_of::<Entry>());
        for i in 0..35u64 {
            s.push(Entry {
                hash: u128::from(35 - i),
                loc: i,
            })
            .unwrap();
        }
        assert_eq!(s.spilled(), 3);
        let merged: Vec<u128> = s.finish().unwrap().map(|e| e.unwrap().hash).collect();
        assert_eq!(merged, (1..=35).collect::<Vec<u128>>());
    }
}
