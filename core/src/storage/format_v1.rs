//! Metadata of format 1, as the first builds wrote it (bincode 2, standard configuration), read
//! so that their checkpoints and savepoints stay restorable. The types below are that format's
//! layout, frozen: bincode is not self-describing, so they must not change. Read only; every
//! checkpoint since is written in format 2 ([`super::format`]).
//!
//! Keyed state restored from such metadata stays in bincode ([`StateEncoding::Bincode`]): its
//! values' types are known only to the operators that read them.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::checkpoint::{
    BackendKind, CheckpointMetadata, FileHandle, KeyedStateHandle, OperatorSnapshot, StateEncoding, SubtaskSnapshot,
    METADATA_VERSION,
};
use crate::message::{CheckpointId, SnapshotKind};
use crate::state::KeyGroupRange;

#[derive(Deserialize)]
struct MetadataV1 {
    version: u32,
    job: String,
    id: CheckpointId,
    kind: SnapshotKind,
    timestamp_ms: u64,
    completed_ms: u64,
    operators: BTreeMap<String, OperatorV1>,
}

#[derive(Deserialize)]
struct OperatorV1 {
    parallelism: u32,
    max_parallelism: u32,
    subtasks: Vec<SubtaskV1>,
}

#[derive(Deserialize)]
struct SubtaskV1 {
    list_state: BTreeMap<String, Vec<Vec<u8>>>,
    union_state: BTreeMap<String, Vec<Vec<u8>>>,
    keyed: Option<KeyedV1>,
}

#[derive(Deserialize)]
struct KeyedV1 {
    backend: BackendKind,
    key_groups: KeyGroupRange,
    files: Vec<FileHandle>,
}

/// The metadata of format 1 in `payload`, as today's types (format 2 in memory: written again,
/// it is written in format 2).
pub(crate) fn decode(payload: &[u8]) -> Result<CheckpointMetadata, String> {
    let (v1, _): (MetadataV1, _) =
        bincode::serde::decode_from_slice(payload, bincode::config::standard()).map_err(|e| e.to_string())?;
    if v1.version != 1 {
        return Err(format!(
            "the header says format 1, the metadata inside says {}",
            v1.version
        ));
    }
    Ok(CheckpointMetadata {
        version: METADATA_VERSION,
        job: v1.job,
        id: v1.id,
        kind: v1.kind,
        timestamp_ms: v1.timestamp_ms,
        completed_ms: v1.completed_ms,
        operators: v1
            .operators
            .into_iter()
            .map(|(uid, op)| {
                let subtasks = op
                    .subtasks
                    .into_iter()
                    .map(|s| SubtaskSnapshot {
                        list_state: s.list_state,
                        union_state: s.union_state,
                        keyed: s.keyed.map(|k| KeyedStateHandle {
                            backend: k.backend,
                            key_groups: k.key_groups,
                            files: k.files,
                            encoding: StateEncoding::Bincode,
                        }),
                    })
                    .collect();
                let op = OperatorSnapshot {
                    parallelism: op.parallelism,
                    max_parallelism: op.max_parallelism,
                    subtasks,
                };
                (uid, op)
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Format 1's bytes of a sample, as the first builds encoded it (the same types, with bincode).
    fn v1_bytes() -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Keyed<'a> {
            backend: BackendKind,
            key_groups: KeyGroupRange,
            files: &'a Vec<FileHandle>,
        }
        #[derive(serde::Serialize)]
        struct Subtask<'a> {
            list_state: &'a BTreeMap<String, Vec<Vec<u8>>>,
            union_state: &'a BTreeMap<String, Vec<Vec<u8>>>,
            keyed: Option<Keyed<'a>>,
        }
        #[derive(serde::Serialize)]
        struct Operator<'a> {
            parallelism: u32,
            max_parallelism: u32,
            subtasks: Vec<Subtask<'a>>,
        }
        #[derive(serde::Serialize)]
        struct Meta<'a> {
            version: u32,
            job: &'a str,
            id: CheckpointId,
            kind: SnapshotKind,
            timestamp_ms: u64,
            completed_ms: u64,
            operators: BTreeMap<&'a String, Operator<'a>>,
        }
        let meta = crate::checkpoint::tests::sample();
        let v1 = Meta {
            version: 1,
            job: &meta.job,
            id: meta.id,
            kind: meta.kind,
            timestamp_ms: meta.timestamp_ms,
            completed_ms: meta.completed_ms,
            operators: meta
                .operators
                .iter()
                .map(|(uid, op)| {
                    let subtasks = op
                        .subtasks
                        .iter()
                        .map(|s| Subtask {
                            list_state: &s.list_state,
                            union_state: &s.union_state,
                            keyed: s.keyed.as_ref().map(|k| Keyed {
                                backend: k.backend,
                                key_groups: k.key_groups,
                                files: &k.files,
                            }),
                        })
                        .collect();
                    (
                        uid,
                        Operator {
                            parallelism: op.parallelism,
                            max_parallelism: op.max_parallelism,
                            subtasks,
                        },
                    )
                })
                .collect(),
        };
        bincode::serde::encode_to_vec(&v1, bincode::config::standard()).unwrap()
    }

    #[test]
    fn format_1_reads_as_todays_types_with_its_keyed_state_in_bincode() {
        let mut expected = crate::checkpoint::tests::sample();
        for s in expected.operators.values_mut().flat_map(|o| &mut o.subtasks) {
            if let Some(k) = &mut s.keyed {
                k.encoding = StateEncoding::Bincode;
            }
        }
        assert_eq!(decode(&v1_bytes()).unwrap(), expected);
    }

    #[test]
    fn format_2_bytes_are_not_taken_for_format_1() {
        let today = postcard::to_allocvec(&crate::checkpoint::tests::sample()).unwrap();
        assert!(decode(&today).is_err());
    }
}
