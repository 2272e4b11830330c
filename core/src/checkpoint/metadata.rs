//! What a completed checkpoint or savepoint records. Every type here is written to storage, so it
//! is versioned ([`METADATA_VERSION`]) and has a serde round-trip test.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::message::{CheckpointId, SnapshotKind};
use crate::state::KeyGroupRange;

/// Version of the metadata format written by this build: 2, in postcard. Version 1 (bincode) is
/// still read (`storage::format`).
pub const METADATA_VERSION: u32 = 2;

/// The metadata of one completed checkpoint or savepoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    /// Format version ([`METADATA_VERSION`] when written by this build).
    pub version: u32,
    /// The job's name.
    pub job: String,
    /// The checkpoint id.
    pub id: CheckpointId,
    /// Checkpoint or savepoint.
    pub kind: SnapshotKind,
    /// When it was triggered (ms since the Unix epoch).
    pub timestamp_ms: u64,
    /// When it completed (ms since the Unix epoch).
    pub completed_ms: u64,
    /// State by operator uid.
    pub operators: BTreeMap<String, OperatorSnapshot>,
}

impl CheckpointMetadata {
    /// Bytes of state files referenced (private and shared).
    pub fn state_size(&self) -> u64 {
        self.files().map(|f| f.size).sum::<u64>()
            + self
                .operators
                .values()
                .flat_map(|o| &o.subtasks)
                .map(SubtaskSnapshot::inline_size)
                .sum::<u64>()
    }

    /// Every file this snapshot references.
    pub fn files(&self) -> impl Iterator<Item = &FileHandle> {
        self.operators
            .values()
            .flat_map(|o| &o.subtasks)
            .filter_map(|s| s.keyed.as_ref())
            .flat_map(|k| k.files.iter())
    }
}

/// The state of one operator (all its subtasks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperatorSnapshot {
    /// Parallelism when the snapshot was taken.
    pub parallelism: u32,
    /// Maximum parallelism (number of key groups); fixed for the life of the state.
    pub max_parallelism: u32,
    /// One entry per subtask, in subtask order.
    pub subtasks: Vec<SubtaskSnapshot>,
}

/// The state of one subtask of one operator.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubtaskSnapshot {
    /// Operator list state by name: entries are split among subtasks on restore.
    pub list_state: BTreeMap<String, Vec<Vec<u8>>>,
    /// Union list state by name: every subtask receives all entries on restore.
    pub union_state: BTreeMap<String, Vec<Vec<u8>>>,
    /// Keyed state, if the operator has any.
    pub keyed: Option<KeyedStateHandle>,
}

impl SubtaskSnapshot {
    fn inline_size(&self) -> u64 {
        self.list_state
            .values()
            .chain(self.union_state.values())
            .flatten()
            .map(|e| e.len() as u64)
            .sum()
    }
}

/// Which state backend wrote keyed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BackendKind {
    /// In-memory hash map, full snapshots.
    Memory,
    /// RocksDB, incremental snapshots.
    RocksDb,
}

/// Keyed state of one subtask: the key groups it covers and the files that hold them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyedStateHandle {
    /// The backend that wrote it.
    pub backend: BackendKind,
    /// Key groups covered.
    pub key_groups: KeyGroupRange,
    /// The files (private to this checkpoint, or shared between checkpoints).
    pub files: Vec<FileHandle>,
    /// How the state's values and map keys are encoded. Carried from snapshot to snapshot: state
    /// first written in one encoding keeps it (a restore cannot re-encode values whose types only
    /// the operators know).
    pub encoding: StateEncoding,
}

/// The encoding of keyed state values (and of map state's keys).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateEncoding {
    /// bincode 2 in its standard configuration: state first written by a build of metadata
    /// format 1. Still read and written for such state; nothing new starts in it.
    Bincode,
    /// postcard 1 (its wire format is specified and stable): all state started since.
    #[default]
    Postcard,
}

/// Where a file lives relative to a checkpoint's directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileScope {
    /// Inside this checkpoint's own directory; deleted with it.
    Private,
    /// In the storage's `shared/` directory; deleted when no retained checkpoint references it.
    Shared,
}

/// Whether `name` is one path component that stays where it is put: not empty, not `.` or `..`,
/// no `/`, `\` or NUL, at most 255 bytes. A checkpoint's metadata names the files a restore
/// writes, reads and retention deletes; a crafted one (a bucket others can write to, a savepoint
/// handed over for `--from`) must not reach outside the checkpoint's or the backend's directory.
pub fn is_single_component(name: &str) -> bool {
    !name.is_empty() && name.len() <= 255 && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// A state file, with what is needed to verify it on restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileHandle {
    /// Private or shared.
    pub scope: FileScope,
    /// File name within its scope's directory.
    pub name: String,
    /// Name the backend gave the file locally (e.g. RocksDB's `000012.sst`).
    pub local_name: String,
    /// Size in bytes.
    pub size: u64,
    /// CRC-32 of the content.
    pub crc32: u32,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> CheckpointMetadata {
        let mut operators = BTreeMap::new();
        let mut list_state = BTreeMap::new();
        list_state.insert("offsets".to_owned(), vec![b"a".to_vec(), b"bc".to_vec()]);
        operators.insert(
            "counter".to_owned(),
            OperatorSnapshot {
                parallelism: 2,
                max_parallelism: 128,
                subtasks: vec![
                    SubtaskSnapshot {
                        list_state,
                        union_state: BTreeMap::new(),
                        keyed: Some(KeyedStateHandle {
                            backend: BackendKind::RocksDb,
                            key_groups: KeyGroupRange::new(0, 63),
                            files: vec![FileHandle {
                                scope: FileScope::Shared,
                                name: "x-000012.sst".into(),
                                local_name: "000012.sst".into(),
                                size: 10,
                                crc32: 7,
                            }],
                            encoding: StateEncoding::Postcard,
                        }),
                    },
                    SubtaskSnapshot::default(),
                ],
            },
        );
        CheckpointMetadata {
            version: METADATA_VERSION,
            job: "job".into(),
            id: 7,
            kind: SnapshotKind::Checkpoint,
            timestamp_ms: 1,
            completed_ms: 2,
            operators,
        }
    }

    #[test]
    fn metadata_round_trips_through_postcard() {
        let meta = sample();
        let bytes = postcard::to_allocvec(&meta).unwrap();
        let back: CheckpointMetadata = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, meta);
        assert_eq!(meta.state_size(), 10 + 3);
    }
}
