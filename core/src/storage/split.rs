//! Savepoints of a job split over processes (`--subtasks` ranges): every range writes its own into
//! one job-level location, `<location>/subtasks-<first>-<last>-of-<p>/savepoint-<n>`. Restoring that
//! location merges them into one snapshot of the whole job — subtask `i` of every operator taken from
//! the range that ran it, the files read from where that range wrote them — which then restores in
//! any layout (a new parallelism, a new number of processes, one process) like any savepoint.
//! Refused, naming what is wrong: ranges that overlap or leave a subtask out, ranges of different
//! parallelisms, a range directory with more than one snapshot.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Snapshot, SnapshotReader, Storage};
use crate::checkpoint::{FileHandle, OperatorSnapshot};
use crate::error::{CoreError, Result};
use crate::message::SnapshotKind;

/// `subtasks-<first>-<last>-of-<p>` → `(first, last, p)`.
pub(crate) fn parse_range(name: &str) -> Option<(u32, u32, u32)> {
    let rest = name.strip_prefix("subtasks-")?;
    let (range, p) = rest.split_once("-of-")?;
    let (a, b) = range.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?, p.parse().ok()?))
}

fn refuse(location: &Path, reason: String) -> CoreError {
    CoreError::Config(format!("{}: {reason}", location.display()))
}

/// The one snapshot of range directory `dir`: itself, or its only child that is one.
fn range_snapshot(dir: &Path) -> Result<Snapshot> {
    if Storage::is_snapshot(dir)? {
        return Storage::open_verified(dir);
    }
    let mut found = Vec::new();
    for name in Storage::list_dirs(dir)? {
        let child = dir.join(&name);
        if Storage::is_snapshot(&child)? {
            found.push(child);
        }
    }
    match found.as_slice() {
        [one] => Storage::open_verified(one),
        [] => Err(refuse(dir, "holds no savepoint".into())),
        many => Err(refuse(
            dir,
            format!(
                "holds {} snapshots ({}): give each savepoint of a split job its own name",
                many.len(),
                many.iter()
                    .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// Reads each file from the range that wrote it.
struct Merged {
    parts: Vec<Arc<dyn SnapshotReader>>,
    owner: HashMap<(String, u64, u32), usize>,
}

impl Merged {
    fn part(&self, file: &FileHandle) -> Result<&dyn SnapshotReader> {
        self.owner
            .get(&(file.name.clone(), file.size, file.crc32))
            .map(|i| self.parts[*i].as_ref())
            .ok_or_else(|| CoreError::Corrupt {
                path: PathBuf::from(&file.name),
                reason: "no range of the split savepoint holds this file".into(),
            })
    }
}

impl SnapshotReader for Merged {
    fn read(&self, file: &FileHandle) -> Result<Vec<u8>> {
        self.part(file)?.read(file)
    }

    fn download(&self, file: &FileHandle, dest: &Path) -> Result<()> {
        self.part(file)?.download(file, dest)
    }

    fn check(&self, file: &FileHandle) -> Result<()> {
        self.part(file)?.check(file)
    }
}

/// Opens `location` as the savepoint of a split job; `None` when it holds no range directories.
pub(crate) fn open(location: &Path) -> Result<Option<Snapshot>> {
    let mut ranges: Vec<(u32, u32, u32, String)> = Storage::list_dirs(location)?
        .into_iter()
        .filter_map(|n| parse_range(&n).map(|(a, b, p)| (a, b, p, n)))
        .collect();
    if ranges.is_empty() {
        return Ok(None);
    }
    ranges.sort();
    let p = ranges[0].2;
    if let Some(other) = ranges.iter().find(|r| r.2 != p) {
        return Err(refuse(
            location,
            format!(
                "holds savepoints of parallelism {p} ({}) and {} ({}): keep one job's savepoint per directory",
                ranges[0].3, other.2, other.3
            ),
        ));
    }
    let mut next = 0;
    for (a, b, _, name) in &ranges {
        if *a != next || b < a || *b >= p {
            return Err(refuse(
                location,
                format!(
                    "its ranges must cover subtasks 0..{} once each, in order; {name} does not follow subtask {}",
                    p - 1,
                    i64::from(next) - 1
                ),
            ));
        }
        next = b + 1;
    }
    if next != p {
        return Err(refuse(
            location,
            format!(
                "subtasks {next}..{} have no savepoint here (is a process's savepoint missing?)",
                p - 1
            ),
        ));
    }

    let parts: Vec<Snapshot> = ranges
        .iter()
        .map(|(_, _, _, name)| range_snapshot(&location.join(name)))
        .collect::<Result<_>>()?;
    let mut meta = parts[0].meta.clone();
    meta.kind = SnapshotKind::Savepoint;
    meta.id = parts.iter().map(|s| s.meta.id).max().unwrap_or(0);
    meta.timestamp_ms = parts.iter().map(|s| s.meta.timestamp_ms).max().unwrap_or(0);
    meta.completed_ms = parts.iter().map(|s| s.meta.completed_ms).max().unwrap_or(0);
    let uids: std::collections::BTreeSet<&String> = parts.iter().flat_map(|s| s.meta.operators.keys()).collect();
    let mut operators = BTreeMap::new();
    let mut owner = HashMap::new();
    for uid in uids {
        let mut merged: Option<OperatorSnapshot> = None;
        for (k, ((a, b, _, name), part)) in ranges.iter().zip(&parts).enumerate() {
            let Some(op) = part.meta.operators.get(uid) else {
                return Err(refuse(
                    location,
                    format!("{name} has no state of operator {uid:?}: not the same job"),
                ));
            };
            if op.parallelism != p || op.subtasks.len() != p as usize {
                return Err(refuse(
                    location,
                    format!("{name}: operator {uid:?} has parallelism {}, not {p}", op.parallelism),
                ));
            }
            let m = merged.get_or_insert_with(|| OperatorSnapshot {
                parallelism: p,
                max_parallelism: op.max_parallelism,
                subtasks: vec![Default::default(); p as usize],
            });
            if m.max_parallelism != op.max_parallelism {
                return Err(refuse(
                    location,
                    format!("{name}: operator {uid:?} has another max parallelism"),
                ));
            }
            for i in *a..=*b {
                let s = op.subtasks[i as usize].clone();
                for f in s.keyed.iter().flat_map(|k| k.files.iter()) {
                    owner.entry((f.name.clone(), f.size, f.crc32)).or_insert(k);
                }
                m.subtasks[i as usize] = s;
            }
        }
        operators.insert(uid.clone(), merged.expect("at least one range"));
    }
    meta.operators = operators;
    let reader = Arc::new(Merged {
        parts: parts.iter().map(|s| s.reader.clone()).collect(),
        owner,
    });
    let snapshot = Snapshot { meta, reader };
    for f in snapshot.meta.files() {
        snapshot.reader.check(f)?;
    }
    tracing::info!(
        location = %location.display(),
        ranges = %ranges.iter().map(|r| r.3.as_str()).collect::<Vec<_>>().join(", "),
        "Restoring the savepoint of a split job, merged from every range."
    );
    Ok(Some(snapshot))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::checkpoint::{BackendKind, CheckpointMetadata, KeyedStateHandle, SubtaskSnapshot, METADATA_VERSION};
    use crate::state::KeyGroupRange;
    use crate::storage::CheckpointStorage;

    /// Writes, under `dir/subtasks-A-B-of-P/savepoint-ID`, the savepoint a process running
    /// subtasks `a..=b` of parallelism `p` would: its subtasks with a state file and a union
    /// entry, the others empty.
    fn range_savepoint(dir: &Path, a: u32, b: u32, p: u32, id: u64) {
        let work = tempfile::tempdir().unwrap();
        let storage = Storage::new(work.path()).unwrap();
        let w = storage.writer(id).unwrap();
        let mut subtasks = vec![SubtaskSnapshot::default(); p as usize];
        for i in a..=b {
            let file = w
                .write_private(&format!("op-{i}.state"), format!("state of {i}").as_bytes())
                .unwrap();
            subtasks[i as usize] = SubtaskSnapshot {
                union_state: BTreeMap::from([("offsets".to_owned(), vec![vec![i as u8]])]),
                keyed: Some(KeyedStateHandle {
                    backend: BackendKind::Memory,
                    key_groups: KeyGroupRange::new(0, 127),
                    files: vec![file],
                    encoding: crate::checkpoint::StateEncoding::Postcard,
                }),
                ..Default::default()
            };
        }
        let meta = CheckpointMetadata {
            version: METADATA_VERSION,
            job: "j".into(),
            id,
            kind: SnapshotKind::Savepoint,
            timestamp_ms: id,
            completed_ms: id,
            operators: BTreeMap::from([(
                "op".to_owned(),
                OperatorSnapshot {
                    parallelism: p,
                    max_parallelism: 128,
                    subtasks,
                },
            )]),
        };
        storage.commit(&meta).unwrap();
        storage
            .export(
                id,
                &dir.join(format!("subtasks-{a}-{b}-of-{p}"))
                    .join(format!("savepoint-{id}")),
            )
            .unwrap();
    }

    #[test]
    fn the_ranges_of_a_split_savepoint_merge_into_one_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        range_savepoint(dir.path(), 0, 1, 4, 7);
        range_savepoint(dir.path(), 2, 3, 4, 9);
        let s = Storage::open_verified(dir.path()).unwrap();
        assert_eq!((s.meta.id, s.meta.kind), (9, SnapshotKind::Savepoint));
        let op = &s.meta.operators["op"];
        assert_eq!(op.parallelism, 4);
        for (i, sub) in op.subtasks.iter().enumerate() {
            assert_eq!(
                sub.union_state["offsets"],
                vec![vec![i as u8]],
                "subtask {i} from its own range"
            );
            let f = &sub.keyed.as_ref().unwrap().files[0];
            assert_eq!(s.reader.read(f).unwrap(), format!("state of {i}").into_bytes());
        }
    }

    #[test]
    fn gaps_overlaps_mixed_parallelisms_and_ambiguous_ranges_are_refused() {
        let refused = |setup: &dyn Fn(&Path), expected: &str| {
            let dir = tempfile::tempdir().unwrap();
            setup(dir.path());
            let err = Storage::open_verified(dir.path()).unwrap_err().to_string();
            assert!(err.contains(expected), "expected {expected:?} in: {err}");
        };
        refused(&|d| range_savepoint(d, 0, 1, 4, 1), "subtasks 2..3 have no savepoint");
        refused(
            &|d| {
                range_savepoint(d, 0, 2, 4, 1);
                range_savepoint(d, 2, 3, 4, 1);
            },
            "does not follow subtask 2",
        );
        refused(
            &|d| {
                range_savepoint(d, 0, 1, 4, 1);
                range_savepoint(d, 0, 0, 2, 1);
            },
            "parallelism",
        );
        refused(
            &|d| {
                range_savepoint(d, 0, 0, 2, 1);
                range_savepoint(d, 0, 0, 2, 2);
                range_savepoint(d, 1, 1, 2, 1);
            },
            "holds 2 snapshots",
        );
    }
}
