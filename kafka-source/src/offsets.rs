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
    /// The topic's ID when the offset was recorded (absent in checkpoints of earlier builds, and
    /// with brokers before Kafka 2.8): tells a recreated topic from a truncated one on restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) topic_id: Option<String>,
}

pub(crate) const STATE_VERSION: u32 = 1;

impl OffsetEntry {
    pub(crate) fn encode(tp: &TopicPartition, next_offset: i64, topic_id: Option<&str>) -> Vec<u8> {
        let e = OffsetEntry {
            version: STATE_VERSION,
            tp: tp.clone(),
            next_offset,
            topic_id: topic_id.map(str::to_owned),
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

/// Where a partition resumes, given an offset to read it from (restored, a group's or a given
/// one), the log's range `low..=high`, and the topic's ID when the offset was recorded (`then`)
/// and now (`now`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resume {
    /// In the log's range: there.
    At(i64),
    /// Below the log's first offset: retention deleted the records from the offset up to `low`
    /// before the job read them; on from `low`.
    LostToRetention {
        /// The log's first offset.
        low: i64,
    },
    /// The topic has another ID: it was deleted and recreated, and the offset belongs to the old
    /// log. The new one from its first offset.
    Recreated {
        /// The new log's first offset.
        low: i64,
    },
    /// The same topic, its end below the offset: the log was truncated (unclean leader
    /// election); the records from `end` on that the job read are no longer in it. At the end.
    Truncated {
        /// The log's end.
        end: i64,
    },
    /// Beyond the end, with no ID to tell truncation from recreation.
    Unclear {
        /// The log's first offset.
        low: i64,
        /// The log's end.
        end: i64,
    },
}

pub(crate) fn resume(offset: i64, (low, high): (i64, i64), then: Option<&str>, now: Option<&str>) -> Resume {
    match (then, now) {
        (Some(a), Some(b)) if a != b => Resume::Recreated { low },
        _ if offset < low => Resume::LostToRetention { low },
        (Some(_), Some(_)) if offset > high => Resume::Truncated { end: high },
        _ if offset > high => Resume::Unclear { low, end: high },
        _ => Resume::At(offset),
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
    fn a_position_resumes_by_the_log_range_and_the_topic_id() {
        let range = (10, 20);
        let (a, b) = (Some("id-a"), Some("id-b"));
        for ids in [(None, None), (a, None), (None, a), (a, a)] {
            assert_eq!(resume(15, range, ids.0, ids.1), Resume::At(15), "{ids:?}");
            assert_eq!(resume(10, range, ids.0, ids.1), Resume::At(10), "{ids:?}");
            assert_eq!(
                resume(20, range, ids.0, ids.1),
                Resume::At(20),
                "the end is in range: {ids:?}"
            );
            assert_eq!(
                resume(3, range, ids.0, ids.1),
                Resume::LostToRetention { low: 10 },
                "{ids:?}"
            );
        }
        // Another ID: recreated, wherever the offset falls (a silent skip of the new topic's
        // records when it is inside the new log's range).
        for offset in [3, 15, 20, 30] {
            assert_eq!(resume(offset, range, a, b), Resume::Recreated { low: 10 }, "{offset}");
        }
        assert_eq!(resume(30, range, a, a), Resume::Truncated { end: 20 });
        for ids in [(None, None), (a, None), (None, a)] {
            assert_eq!(
                resume(30, range, ids.0, ids.1),
                Resume::Unclear { low: 10, end: 20 },
                "{ids:?}"
            );
        }
    }

    #[test]
    fn state_entries_round_trip_and_refuse_newer_versions() {
        let tp = TopicPartition {
            topic: "a".into(),
            partition: 3,
        };
        let e = OffsetEntry::decode(&OffsetEntry::encode(&tp, 42, Some("id-1"))).unwrap();
        assert_eq!((e.tp, e.next_offset, e.topic_id.as_deref()), (tp, 42, Some("id-1")));
        // Fixture of version 1 as written by earlier builds (no topic ID): must keep decoding.
        let v1 = br#"{"version":1,"tp":{"topic":"a","partition":3},"next_offset":42}"#;
        let e = OffsetEntry::decode(v1).unwrap();
        assert_eq!((e.next_offset, e.topic_id), (42, None));
        // Without a topic ID, an entry is written as earlier builds wrote it.
        assert_eq!(OffsetEntry::encode(&e.tp, 42, None), v1);
        assert!(OffsetEntry::decode(br#"{"version":9,"tp":{"topic":"a","partition":3},"next_offset":1}"#).is_err());
    }
}
