//! Choosing the partition of each record.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Decides partitions. Told its subtask when opened; asked per record.
pub trait Partitioner: Send + Sync + 'static {
    /// Called once per subtask before any record.
    fn open(&mut self, _subtask: u32, _parallelism: u32) {}
    /// The partition (an index into `partitions`) for a record. `partitions` is non-empty.
    fn partition(&self, key: Option<&[u8]>, value: Option<&[u8]>, topic: &str, partitions: &[i32]) -> i32;
    /// How many of an output's `partitions` this subtask writes to, at most (after `open`): the
    /// producer's queue is sized for them (at most its share of them among the subtasks). All of
    /// them unless the partitioner says fewer.
    fn partitions_written(&self, partitions: usize) -> usize {
        partitions
    }
}

/// Every record of subtask `i` goes to partition `i % partitions` (Flink's `FlinkFixedPartitioner`).
#[derive(Debug, Default)]
pub struct FixedPartitioner {
    subtask: u32,
    parallelism: u32,
}

impl Partitioner for FixedPartitioner {
    fn open(&mut self, subtask: u32, parallelism: u32) {
        self.subtask = subtask;
        self.parallelism = parallelism;
    }
    fn partition(&self, _key: Option<&[u8]>, _value: Option<&[u8]>, topic: &str, partitions: &[i32]) -> i32 {
        if self.subtask == 0 && (self.parallelism as usize) < partitions.len() {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    topic,
                    subtasks = self.parallelism,
                    partitions = partitions.len(),
                    "Fixed partitioner with fewer subtasks than partitions: some partitions get no data."
                );
            });
        }
        partitions[self.subtask as usize % partitions.len()]
    }
    fn partitions_written(&self, partitions: usize) -> usize {
        partitions.min(1)
    }
}

/// Partitions in turn.
#[derive(Debug, Default)]
pub struct RoundRobinPartitioner {
    next: AtomicUsize,
}

impl Partitioner for RoundRobinPartitioner {
    fn partition(&self, _key: Option<&[u8]>, _value: Option<&[u8]>, _topic: &str, partitions: &[i32]) -> i32 {
        partitions[self.next.fetch_add(1, Ordering::Relaxed) % partitions.len()]
    }
}

/// By key hash, identical to the Java client's default partitioner for keyed records
/// (`toPositive(murmur2(key)) % numPartitions`); records without a key go round robin.
#[derive(Debug, Default)]
pub struct KeyHashPartitioner {
    unkeyed: RoundRobinPartitioner,
}

impl Partitioner for KeyHashPartitioner {
    fn partition(&self, key: Option<&[u8]>, value: Option<&[u8]>, topic: &str, partitions: &[i32]) -> i32 {
        match key {
            Some(k) => partitions[(to_positive(murmur2(k)) as usize) % partitions.len()],
            None => self.unkeyed.partition(None, value, topic, partitions),
        }
    }
}

/// Kafka's `Utils.toPositive`.
pub fn to_positive(n: i32) -> i32 {
    n & 0x7fff_ffff
}

/// Kafka's `Utils.murmur2` (MurmurHash2, seed 0x9747b28c), bit for bit.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    match tail.len() {
        3 => {
            h ^= u32::from(tail[2]) << 16;
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        2 => {
            h ^= u32::from(tail[1]) << 8;
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        1 => {
            h ^= u32::from(tail[0]);
            h = h.wrapping_mul(M);
        }
        _ => {}
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixed_partitioner_writes_one_partition_the_others_all() {
        let mut fixed = FixedPartitioner::default();
        fixed.open(1, 2);
        assert_eq!(fixed.partitions_written(600), 1);
        assert_eq!(fixed.partitions_written(0), 0);
        assert_eq!(RoundRobinPartitioner::default().partitions_written(600), 600);
        assert_eq!(KeyHashPartitioner::default().partitions_written(600), 600);
    }

    /// Computed with the Java client (kafka-clients 4.1.1: `Utils.murmur2`, `toPositive(h) % n`).
    const VECTORS: &[(&str, i32, i32, i32)] = &[
        ("", 275_646_681, 0, 9),
        ("21", -973_932_308, 0, 0),
        ("foobar", -790_332_482, 0, 6),
        ("a-little-bit-long-string", -985_981_536, 2, 8),
        ("order-42", 501_153_024, 0, 0),
        ("user-7", 696_778_364, 2, 8),
        ("été", -2_101_193_575, 1, 1),
    ];

    #[test]
    fn murmur2_matches_the_java_client() {
        for (key, hash, mod3, mod12) in VECTORS {
            assert_eq!(murmur2(key.as_bytes()), *hash, "{key:?}");
            let p3: Vec<i32> = (0..3).collect();
            let p12: Vec<i32> = (0..12).collect();
            let part = KeyHashPartitioner::default();
            assert_eq!(
                part.partition(Some(key.as_bytes()), None, "t", &p3),
                *mod3,
                "{key:?} of 3"
            );
            assert_eq!(
                part.partition(Some(key.as_bytes()), None, "t", &p12),
                *mod12,
                "{key:?} of 12"
            );
        }
    }

    #[test]
    fn fixed_and_round_robin() {
        let mut f = FixedPartitioner::default();
        f.open(4, 6);
        assert_eq!(f.partition(None, None, "t", &[0, 1, 2]), 1);
        let rr = RoundRobinPartitioner::default();
        let got: Vec<i32> = (0..4).map(|_| rr.partition(None, None, "t", &[5, 6])).collect();
        assert_eq!(got, [5, 6, 5, 6]);
    }
}
