//! The order check (`--key`/`--order`) in bounded memory: each output record's key, place, id and
//! order value go into sorted runs on disk (by partition, key and offset), and once the output is
//! read, each key's values are compared in offset order: a value below that of the key's record
//! before it is out of order. Memory: one run of at most `limit` entries; disk: about 40 bytes
//! per record plus its id and order value.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::Result;

use super::sorted::{Sorter, Spilled};
use super::OrderValue;

/// An output record as the order check needs it.
#[derive(Debug, Clone, PartialEq)]
struct Keyed {
    /// The partition and the key's 64-bit hash: the records whose order is compared.
    slot: (u32, u64),
    /// partition << 48 | offset.
    loc: u64,
    id: String,
    value: OrderValue,
}

impl Eq for Keyed {}

impl Ord for Keyed {
    // Each output place is read once: the slot and the place order every entry.
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
    w.write_all(&(s.len() as u32).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn read_text(r: &mut impl Read) -> std::io::Result<String> {
    let mut n = [0u8; 4];
    r.read_exact(&mut n)?;
    let mut b = vec![0u8; u32::from_le_bytes(n) as usize];
    r.read_exact(&mut b)?;
    String::from_utf8(b).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

impl Spilled for Keyed {
    fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.slot.0.to_le_bytes())?;
        w.write_all(&self.slot.1.to_le_bytes())?;
        w.write_all(&self.loc.to_le_bytes())?;
        write_text(w, &self.id)?;
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
        match r.read_exact(&mut partition) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let mut b = [0u8; 8];
        r.read_exact(&mut b)?;
        let key = u64::from_le_bytes(b);
        r.read_exact(&mut b)?;
        let loc = u64::from_le_bytes(b);
        let id = read_text(r)?;
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
            id,
            value,
        }))
    }
}

/// Records out of order: how many, and the first examples (the id, the key's record before it and
/// this one, as places).
pub(super) struct OutOfOrder {
    pub(super) count: u64,
    pub(super) examples: Vec<(String, u64, u64)>,
}

/// The output's records with a key and an order value, collected as they are read.
pub(super) struct OrderCheck {
    sorter: Sorter<Keyed>,
}

impl OrderCheck {
    /// A check whose runs of at most `limit` records spill into `dir`.
    pub(super) fn new(dir: &Path, limit: usize) -> Result<OrderCheck> {
        Ok(OrderCheck {
            sorter: Sorter::new(dir, limit)?,
        })
    }

    /// The record at `loc` (partition << 48 | offset) with id `id`, key `key` (as text) and
    /// order value `value`.
    pub(super) fn push(&mut self, loc: u64, id: &str, key: &str, value: OrderValue) -> Result<()> {
        self.sorter.push(Keyed {
            slot: ((loc >> 48) as u32, xxhash_rust::xxh3::xxh3_64(key.as_bytes())),
            loc,
            id: id.to_owned(),
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
                        out.examples.push((e.id.clone(), b.loc, e.loc));
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
    fn in_memory(records: &[(u64, &str, &str, OrderValue)]) -> (u64, Vec<(String, u64, u64)>) {
        let mut last: std::collections::HashMap<(u32, &str), (OrderValue, u64)> = Default::default();
        let (mut n, mut examples) = (0, Vec::new());
        for (loc, id, key, v) in records {
            let slot = ((loc >> 48) as u32, *key);
            if let Some((prev, prev_loc)) = last.get(&slot) {
                if v < prev {
                    n += 1;
                    examples.push((id.to_string(), *prev_loc, *loc));
                }
            }
            last.insert(slot, (v.clone(), *loc));
        }
        (n, examples)
    }

    #[test]
    fn spilled_runs_find_what_the_in_memory_check_found() {
        // Three partitions, keys spread over them, numbers and text, offsets read in order per
        // partition (as the reader hands them over), partitions interleaved.
        let keys = ["a", "b", "c", "d", "e"];
        let mut records = Vec::new();
        let mut next = [0u64; 3];
        for i in 0..2_000u64 {
            let p = (i * 7 % 3) as u32;
            let key = keys[(i * 13 % 5) as usize];
            // Mostly rising, one in nine dropping back.
            let value = if key == "e" {
                OrderValue::Text(format!("2026-12-{:02}", if i % 9 == 0 { 1 } else { 10 + i % 20 }))
            } else {
                OrderValue::Number(if i % 9 == 0 { 0.0 } else { i as f64 })
            };
            let loc = (u64::from(p) << 48) | next[p as usize];
            next[p as usize] += 1;
            records.push((loc, format!("id-{i}"), key, value));
        }
        let borrowed: Vec<(u64, &str, &str, OrderValue)> = records
            .iter()
            .map(|(l, id, k, v)| (*l, id.as_str(), *k, v.clone()))
            .collect();
        let (count, mut examples) = in_memory(&borrowed);
        assert!(count > 100, "the data has records out of order: {count}");

        let dir = tempfile::tempdir().unwrap();
        let mut check = OrderCheck::new(dir.path(), 64).unwrap();
        for (loc, id, key, value) in &records {
            check.push(*loc, id, key, value.clone()).unwrap();
        }
        assert!(check.spilled() > 20, "runs were spilled: {}", check.spilled());
        let found = check.finish(usize::MAX).unwrap();
        assert_eq!(found.count, count);
        // The same records, found in another order (by partition and key, not as read).
        let mut got = found.examples;
        got.sort();
        examples.sort();
        assert_eq!(got, examples);

        // Examples stop at the limit; the count does not.
        let mut check = OrderCheck::new(dir.path(), 1_000_000).unwrap();
        for (loc, id, key, value) in &records {
            check.push(*loc, id, key, value.clone()).unwrap();
        }
        let found = check.finish(3).unwrap();
        assert_eq!((found.count, found.examples.len()), (count, 3));
    }
}
