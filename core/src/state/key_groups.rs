//! Key groups: the unit in which keyed state is assigned to subtasks and moved when rescaling.
//!
//! A key hashes to one of `max_parallelism` key groups; subtask `i` of `p` owns a contiguous range
//! of them (the same arithmetic as Flink's `KeyGroupRangeAssignment`). `max_parallelism` is fixed
//! for the life of a job's state; parallelism can change between restores up to it.

use serde::{Deserialize, Serialize};

/// Default number of key groups.
pub const DEFAULT_MAX_PARALLELISM: u32 = 128;

/// An inclusive range of key groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyGroupRange {
    /// First key group.
    pub start: u32,
    /// Last key group (inclusive).
    pub end: u32,
}

impl KeyGroupRange {
    /// The range `start..=end`.
    pub fn new(start: u32, end: u32) -> Self {
        KeyGroupRange { start, end }
    }

    /// Whether `kg` lies in the range.
    pub fn contains(&self, kg: u32) -> bool {
        self.start <= kg && kg <= self.end
    }

    /// Whether the two ranges share a key group.
    pub fn intersects(&self, other: &KeyGroupRange) -> bool {
        self.start <= other.end && other.start <= self.end
    }

    /// The key groups of subtask `index` of `parallelism`.
    pub fn for_subtask(max_parallelism: u32, parallelism: u32, index: u32) -> Self {
        assert!(parallelism > 0 && parallelism <= max_parallelism && index < parallelism);
        let start = (index * max_parallelism).div_ceil(parallelism);
        let end = ((index + 1) * max_parallelism - 1) / parallelism;
        KeyGroupRange { start, end }
    }
}

/// A stable 64-bit hash of key bytes (FNV-1a followed by a murmur3 finaliser), identical on every
/// platform and release: key groups are persisted in checkpoints.
pub fn hash_key(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The key group of a key.
pub fn key_group(key: &[u8], max_parallelism: u32) -> u32 {
    (hash_key(key) % u64::from(max_parallelism)) as u32
}

/// The subtask (of `parallelism`) that owns key group `kg`.
pub fn subtask_for_key_group(max_parallelism: u32, parallelism: u32, kg: u32) -> u32 {
    kg * parallelism / max_parallelism
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn ranges_partition_the_key_groups(max in 1u32..300, p in 1u32..300) {
            prop_assume!(p <= max);
            let mut next = 0;
            for i in 0..p {
                let r = KeyGroupRange::for_subtask(max, p, i);
                prop_assert_eq!(r.start, next);
                prop_assert!(r.end >= r.start);
                for kg in r.start..=r.end {
                    prop_assert_eq!(subtask_for_key_group(max, p, kg), i);
                }
                next = r.end + 1;
            }
            prop_assert_eq!(next, max);
        }
    }

    #[test]
    fn hash_is_stable() {
        // Persisted in checkpoints: these values must never change (computed independently).
        assert_eq!(hash_key(b""), 0xefd0_1f60_ba99_2926);
        assert_eq!(hash_key(b"hello"), 0xe9c5_62c0_fdb2_3244);
        assert_eq!(key_group(b"hello", 128), 68);
        assert_eq!(key_group(b"user-42", 128), 13);
    }
}
