//! The order check (`--key`/`--order`) in bounded memory: each output record's key, place and
//! order value go into sorted runs on disk (by partition, key and offset), and once the output is
//! read, each key's values are compared in offset order: a value below that of the key's record
//! before it is out of order. Memory: one run of at most `limit` entries or `byte_limit` bytes;
//! disk: 29 bytes a record with a number, 25 and the text with a string. The examples' ids are
//! read again at their places (as for the other examples).

use std::io::{Read, Write};
use std::path::Path;

use anyhow::Result;

use super::sorted::{read_start, Sorter, Spilled};
use super::OrderValue;

/// An output record as the order check needs it.
#[derive(Debug, Clone)]
struct Keyed {
    /// The partition and the key's 64-bit hash: the records whose order is compared.
    slot: (u32, u64),
    /// partition << 48 | offset.
    loc: u64,
    value: OrderValue,
}

// Each output place is read once: the slot and the place order (and identify) every entry.
impl PartialEq for Keyed {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Keyed {}

impl Ord for Keyed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.slot, self.loc).cmp(&(other.slot, other.loc))
    }
}

impl PartialOrd for Keyed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

fn write_text(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    let n = u32::try_from(s.len()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("an order value of {} bytes (at most 4 GiB)", s.len()),
        )
    })?;
    w.write_all(&n.to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn read_text(r: &mut impl Read) -> std::io::Result<String> {
    let mut n = [0u8; 4];
    r.read_exact(&mut n)?;
    let n = u64::from(u32::from_le_bytes(n));
    // Read as it comes (a damaged length asks for no memory up front).
    let mut b = Vec::new();
    r.take(n).read_to_end(&mut b)?;
    if b.len() as u64 != n {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    String::from_utf8(b).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

impl Spilled for Keyed {
    fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.slot.0.to_le_bytes())?;
        w.write_all(&self.slot.1.to_le_bytes())?;
        w.write_all(&self.loc.to_le_bytes())?;
        match &self.value {
            OrderValue::Number(n) => {
                w.write_all(&[0])?;
                w.write_all(&n.to_le_bytes())
            }
            OrderValue::Text(t) => {
                w.write_all(&[1])?;
                write_text(w, t)
            }
        }
    }

    fn read(r: &mut impl Read) -> std::io::Result<Option<Keyed>> {
        let mut partition = [0u8; 4];
        if !read_start(r, &mut partition)? {
            return Ok(None);
        }
        let mut b = [0u8; 8];
        r.read_exact(&mut b)?;
        let key = u64::from_le_bytes(b);
        r.read_exact(&mut b)?;
        let loc = u64::from_le_bytes(b);
        let mut tag = [0u8; 1];
        r.read_exact(&mut tag)?;
        let value = match tag[0] {
            0 => {
                r.read_exact(&mut b)?;
                OrderValue::Number(f64::from_le_bytes(b))
            }
            1 => OrderValue::Text(read_text(r)?),
            other => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("an order value of kind {other} in a sorted run"),
                ))
            }
        };
        Ok(Some(Keyed {
            slot: (u32::from_le_bytes(partition), key),
            loc,
            value,
        }))
    }

    fn bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + match &self.value {
                OrderValue::Text(t) => t.capacity(),
                OrderValue::Number(_) => 0,
            }
    }
}

/// Records out of order: how many, and the first examples (the place of the key's record before
/// it, then its own).
pub(super) struct OutOfOrder {
    pub(super) count: u64,
    pub(super) examples: Vec<(u64, u64)>,
}

/// The output's records with a key and an order value, collected as they are read.
pub(super) struct OrderCheck {
    sorter: Sorter<Keyed>,
}

impl OrderCheck {
    /// A check whose runs of at most `limit` records, or `byte_limit` bytes of memory, spill
    /// into `dir`.
    pub(super) fn new(dir: &Path, limit: usize, byte_limit: usize) -> Result<OrderCheck> {
        Ok(OrderCheck {
            sorter: Sorter::new(dir, limit)?.with_byte_limit(byte_limit),
        })
    }

    /// The record at `loc` (partition << 48 | offset) with key `key` (as text) and order value
    /// `value`.
    pub(super) fn push(&mut self, loc: u64, key: &str, value: OrderValue) -> Result<()> {
        self.sorter.push(Keyed {
            slot: ((loc >> 48) as u32, xxhash_rust::xxh3::xxh3_64(key.as_bytes())),
            loc,
            value,
        })
    }

    /// Runs spilled so far.
    pub(super) fn spilled(&self) -> usize {
        self.sorter.spilled()
    }

    /// Compares each key's values in offset order; up to `max_examples` examples.
    pub(super) fn finish(self, max_examples: usize) -> Result<OutOfOrder> {
        let mut out = OutOfOrder {
            count: 0,
            examples: Vec::new(),
        };
        let mut before: Option<Keyed> = None;
        for e in self.sorter.finish()? {
            let e = e?;
            if let Some(b) = before.as_ref().filter(|b| b.slot == e.slot) {
                if e.value < b.value {
                    out.count += 1;
                    if out.examples.len() < max_examples {
                        out.examples.push((b.loc, e.loc));
                    }
                }
            }
            before = Some(e);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order check as it was, in memory: the last value of each key.
    fn in_memory(records: &[(u64, &str, OrderValue)]) -> (u64, Vec<(u64, u64)>) {
        let mut last: std::collections::HashMap<(u32, &str), (OrderValue, u64)> = Default::default();
        let (mut n, mut examples) = (0, Vec::new());
        for (loc, key, v) in records {
            let slot = ((loc >> 48) as u32, *key);
            if let Some((prev, prev_loc)) = last.get(&slot) {
                if v < prev {
                    n += 1;
                    examples.push((*prev_loc, *loc));
                }
            }
            last.insert(slot, (v.clone(), *loc));
        }
        (n, examples)
    }

    #[test]
    fn spilled_runs_find_what_the_in_memory_check_found() {
        // Three partitions, keys spread over them, numbers and text (key "f" both), equal
        // neighbouring values (key "d" repeats each value), offsets read in order per partition
        // (as the reader hands them over), partitions interleaved.
        let keys = ["a", "b", "c", "d", "e", "f"];
        let mut records = Vec::new();
        let mut next = [0u64; 3];
        for i in 0..3_000u64 {
            let p = (i * 7 % 3) as u32;
            let key = keys[(i * 13 % 6) as usize];
            // Mostly rising, one in nine dropping back.
            let n = if i % 9 == 0 { 0 } else { i };
            let value = match key {
                "e" => OrderValue::Text(format!("2026-12-{:02}", if i % 9 == 0 { 1 } else { 10 + i % 20 })),
                "d" => OrderValue::Number((n / 2) as f64),
                "f" if i % 5 == 0 => OrderValue::Text(format!("{n}")),
                _ => OrderValue::Number(n as f64),
            };
            let loc = (u64::from(p) << 48) | next[p as usize];
            next[p as usize] += 1;
            records.push((loc, key, value));
        }
        let (count, mut examples) = in_memory(&records);
        assert!(count > 100, "the data has records out of order: {count}");

        let dir = tempfile::tempdir().unwrap();
        let mut check = OrderCheck::new(dir.path(), 64, usize::MAX).unwrap();
        for (loc, key, value) in &records {
            check.push(*loc, key, value.clone()).unwrap();
        }
        assert!(check.spilled() > 20, "runs were spilled: {}", check.spilled());
        let found = check.finish(usize::MAX).unwrap();
        assert_eq!(found.count, count);
        // The same records, found in another order (by partition and key, not as read).
        let mut got = found.examples;
        got.sort();
        examples.sort();
        assert_eq!(got, examples);

        // Examples stop at the limit; the count does not. Runs spilled by bytes find the same.
        let mut check = OrderCheck::new(dir.path(), 1_000_000, 4096).unwrap();
        for (loc, key, value) in &records {
            check.push(*loc, key, value.clone()).unwrap();
        }
        assert!(check.spilled() > 20, "runs were spilled by bytes: {}", check.spilled());
        let found = check.finish(3).unwrap();
        assert_eq!((found.count, found.examples.len()), (count, 3));
    }

    #[test]
    fn equal_values_of_a_key_are_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut check = OrderCheck::new(dir.path(), 2, usize::MAX).unwrap();
        for (offset, v) in [(0, 1.0), (1, 1.0), (2, 2.0), (3, 2.0), (4, 1.0)] {
            check.push(offset, "k", OrderValue::Number(v)).unwrap();
        }
        let found = check.finish(10).unwrap();
        assert_eq!((found.count, found.examples), (1, vec![(3, 4)]));
    }

    #[test]
    fn a_damaged_length_is_an_error_without_a_large_allocation() {
        // A text value whose length says 4 GiB - 1 but whose run ends after 3 bytes.
        let mut run = Vec::new();
        run.extend_from_slice(&0u32.to_le_bytes());
        run.extend_from_slice(&7u64.to_le_bytes());
        run.extend_from_slice(&9u64.to_le_bytes());
        run.push(1);
        run.extend_from_slice(&u32::MAX.to_le_bytes());
        run.extend_from_slice(b"abc");
        let e = Keyed::read(&mut &run[..]).expect_err("a cut text");
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
