//! Offsets: what the checkpoint records (the truth) and what waits to be committed to the group
//! (for monitoring) until the checkpoint that recorded it completes.

use std::collections::BTreeMap;

use exactly_core::CheckpointId;
use serde::{Deserialize, Serialize};

use crate::error::{Result, SourceError};

/// Offsets kept per checkpoint before the oldest is dropped (as Flink does).
pub const MAX_PENDING: usize = 100;

/// A topic partition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TopicPartition {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
}

/// One entry of the source's union list state: a partition and the next offset to read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OffsetEntry {
    pub(crate) version: u32,
    pub(crate) tp: TopicPartition,
    pub(crate) next_offset: i64,
}

pub(crate) const STATE_VERSION: u32 = 1;

impl OffsetEntry {
    pub(crate) fn encode(tp: &TopicPartition, next_offset: i64) -> Vec<u8> {
        let e = OffsetEntry {
            version: STATE_VERSION,
            tp: tp.clone(),
            next_offset,
        };
        serde_json::to_vec(&e).expect("plain struct serializes")
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<OffsetEntry> {
        let e: OffsetEntry = serde_json::from_slice(bytes).map_err(|e| SourceError::State(e.to_string()))?;
        if e.version > STATE_VERSION {
            return Err(SourceError::State(format!(
                "offset state version {} is newer than this build ({STATE_VERSION})",
                e.version
            )));
        }
        Ok(e)
    }
}

/// Offsets of checkpoints not yet completed, oldest first, bounded.
#[derive(Debug, Default)]
pub struct PendingOffsets {
    by_checkpoint: BTreeMap<CheckpointId, BTreeMap<TopicPartition, i64>>,
}

impl PendingOffsets {
    /// Records the offsets snapshotted for checkpoint `id`.
    pub fn insert(&mut self, id: CheckpointId, offsets: BTreeMap<TopicPartition, i64>) {
        self.by_checkpoint.insert(id, offsets);
        while self.by_checkpoint.len() > MAX_PENDING {
            self.by_checkpoint.pop_first();
        }
    }

    /// Checkpoint `id` completed: returns its offsets (or the newest older ones, if `id` itself
    /// recorded none here) and forgets everything up to `id`.
    pub fn complete(&mut self, id: CheckpointId) -> Option<BTreeMap<TopicPartition, i64>> {
        let newer = self.by_checkpoint.split_off(&(id + 1));
        let done = std::mem::replace(&mut self.by_checkpoint, newer);
        done.into_iter().next_back().map(|(_, o)| o)
    }

    /// Checkpoints waiting.
    pub fn len(&self) -> usize {
        self.by_checkpoint.len()
    }

    /// Whether none is waiting.
    pub fn is_empty(&self) -> bool {
        self.by_checkpoint.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(n: i64) -> BTreeMap<TopicPartition, i64> {
        [(
            TopicPartition {
                topic: "t".into(),
                partition: 0,
            },
            n,
        )]
        .into()
    }

    #[test]
    fn completion_takes_the_newest_up_to_the_id_and_forgets_older() {
        let mut p = PendingOffsets::default();
        p.insert(1, offsets(10));
        p.insert(2, offsets(20));
        p.insert(3, offsets(30));
        assert_eq!(p.complete(2), Some(offsets(20)));
        assert_eq!(p.len(), 1);
        assert_eq!(p.complete(2), None, "already done");
        assert_eq!(p.complete(5), Some(offsets(30)));
        assert!(p.is_empty());
    }

    #[test]
    fn bounded_at_one_hundred() {
        let mut p = PendingOffsets::default();
        for i in 0..150 {
            p.insert(i, offsets(i as i64));
        }
        assert_eq!(p.len(), MAX_PENDING);
        assert_eq!(p.complete(49), None, "the 50 oldest were dropped");
    }

    #[test]
    fn state_entries_round_trip_and_refuse_newer_versions() {
        let tp = TopicPartition {
            topic: "a".into(),
            partition: 3,
        };
        let e = OffsetEntry::decode(&OffsetEntry::encode(&tp, 42)).unwrap();
        assert_eq!((e.tp, e.next_offset), (tp, 42));
        // Fixture of version 1 as written by this release: must keep decoding.
        let v1 = br#"{"version":1,"tp":{"topic":"a","partition":3},"next_offset":42}"#;
        assert_eq!(OffsetEntry::decode(v1).unwrap().next_offset, 42);
        assert!(OffsetEntry::decode(br#"{"version":9,"tp":{"topic":"a","partition":3},"next_offset":1}"#).is_err());
    }
}
