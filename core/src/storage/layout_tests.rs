use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use crate::checkpoint::{BackendKind, KeyedStateHandle, OperatorSnapshot, SubtaskSnapshot, METADATA_VERSION};
use crate::message::SnapshotKind;
use crate::state::KeyGroupRange;

#[path = "layout_tests_claims.rs"]
mod claims;

fn meta(id: CheckpointId, files: Vec<FileHandle>) -> CheckpointMetadata {
    let mut operators = BTreeMap::new();
    operators.insert(
        "op".to_owned(),
        OperatorSnapshot {
            parallelism: 1,
            max_parallelism: 128,
            subtasks: vec![SubtaskSnapshot {
                keyed: Some(KeyedStateHandle {
                    backend: BackendKind::RocksDb,
                    key_groups: KeyGroupRange::new(0, 127),
                    files,
                    encoding: crate::checkpoint::StateEncoding::Postcard,
                }),
                ..Default::default()
            }],
        },
    );
    CheckpointMetadata {
        version: METADATA_VERSION,
        job: "j".into(),
        id,
        kind: SnapshotKind::Checkpoint,
        timestamp_ms: 0,
        completed_ms: 0,
        operators,
    }
}

fn checkpoint(storage: &Storage, id: CheckpointId, shared: &[&str]) -> CheckpointMetadata {
    let w = storage.writer(id).unwrap();
    let src = tempfile::NamedTempFile::new().unwrap();
    let mut files = vec![w
        .write_private("private.bin", format!("private {id}").as_bytes())
        .unwrap()];
    for name in shared {
        fs::write(src.path(), format!("content of {name}")).unwrap();
        files.push(w.upload_shared(name, name, src.path()).unwrap());
    }
    let m = meta(id, files);
    storage.commit(&m).unwrap();
    m
}

#[test]
fn committed_checkpoints_are_listed_and_verified() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path()).unwrap();
    let m1 = checkpoint(&storage, 1, &["a.sst"]);
    let _ = storage.writer(2).unwrap(); // in progress, no metadata: not completed
    assert_eq!(storage.completed().unwrap(), vec![1]);
    let s = storage.latest().unwrap().unwrap();
    assert_eq!(s.meta, m1);
    for f in s.meta.files() {
        assert!(!s.reader.read(f).unwrap().is_empty());
    }
    storage.abort(2).unwrap();
    assert!(!storage.checkpoint_dir(2).exists());
}

fn flip_last_byte(path: &Path) {
    let mut bytes = fs::read(path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(path, bytes).unwrap();
}

#[test]
fn a_corrupt_newest_checkpoint_is_an_error_that_names_it_never_a_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path()).unwrap();
    checkpoint(&storage, 1, &["a.sst"]);
    checkpoint(&storage, 2, &["a.sst", "b.sst"]);
    checkpoint(&storage, 3, &["c.sst"]);
    flip_last_byte(&storage.checkpoint_dir(3).join(METADATA_FILE));
    assert!(matches!(storage.open(3), Err(CoreError::Corrupt { .. })));
    let err = storage.latest().unwrap_err();
    assert!(
        matches!(err, CoreError::NewestCheckpointUnusable { id: 3, ref older, .. } if older.contains("2, 1")),
        "{err}"
    );
    assert_eq!(err.class(), crate::ErrorClass::Fatal);
    let text = err.to_string();
    assert!(text.contains("checksum") && text.contains("--accept-replay"), "{text}");
}

#[test]
fn a_truncated_or_missing_state_file_of_the_newest_checkpoint_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path()).unwrap();
    checkpoint(&storage, 1, &["a.sst"]);
    checkpoint(&storage, 2, &["a.sst", "b.sst"]);
    fs::write(dir.path().join("shared/b.sst"), "short").unwrap();
    assert!(matches!(
        storage.latest(),
        Err(CoreError::NewestCheckpointUnusable { id: 2, .. })
    ));
    fs::remove_file(dir.path().join("shared/b.sst")).unwrap();
    let err = storage.latest().unwrap_err();
    assert!(
        matches!(err, CoreError::NewestCheckpointUnusable { id: 2, ref reason, .. } if reason.contains("missing")),
        "{err}"
    );
    // A corrupt file's content is caught on read, too.
    let s1 = storage.open(1).unwrap();
    fs::write(dir.path().join("shared/a.sst"), "content of a.ss!").unwrap();
    let a = s1.meta.files().find(|f| f.name == "a.sst").unwrap().clone();
    assert!(matches!(s1.reader.read(&a), Err(CoreError::Corrupt { .. })));
    // And on a download, streamed: the file half written is removed, not left for RocksDB.
    let dest = dir.path().join("restored-a.sst");
    let err = s1.reader.download(&a, &dest).unwrap_err();
    assert!(
        matches!(&err, CoreError::Corrupt { reason, .. } if reason.contains("crc32")),
        "{err}"
    );
    assert!(!dest.exists(), "a corrupt download is not left behind");
    fs::write(dir.path().join("shared/a.sst"), "content of a.sst").unwrap();
    s1.reader.download(&a, &dest).unwrap();
    assert_eq!(fs::read(&dest).unwrap(), b"content of a.sst");
}

#[test]
fn an_unreadable_newest_checkpoint_is_a_retriable_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path()).unwrap();
    checkpoint(&storage, 1, &[]);
    checkpoint(&storage, 2, &[]);
    // A directory where the metadata file should be: reading it fails with an I/O error (as EIO,
    // ESTALE or a permission error would; root ignores permission bits, so they cannot stand in).
    let md = storage.checkpoint_dir(2).join(METADATA_FILE);
    fs::remove_file(&md).unwrap();
    fs::create_dir(&md).unwrap();
    let err = storage.latest().unwrap_err();
    assert!(matches!(err, CoreError::Io { .. }), "{err}");
    assert_eq!(err.class(), crate::ErrorClass::Restart);
}

#[test]
fn a_directory_that_held_checkpoints_and_holds_none_refuses_to_start_over() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path()).unwrap();
    assert!(storage.latest().unwrap().is_none(), "a new directory starts empty");
    checkpoint(&storage, 1, &[]);
    fs::remove_dir_all(storage.checkpoint_dir(1)).unwrap();
    let err = storage.latest().unwrap_err();
    assert!(
        matches!(err, CoreError::CheckpointsVanished(ref d) if d == dir.path()),
        "{err}"
    );
    assert!(err.to_string().contains(&dir.path().display().to_string()), "{err}");
    // Discarding on purpose (retention on cancel) starts anew.
    checkpoint(&storage, 2, &[]);
    storage.discard_all().unwrap();
    assert!(storage.latest().unwrap().is_none());
}

#[test]
fn a_directory_from_before_the_marker_gets_it_on_restore() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path()).unwrap();
    checkpoint(&storage, 1, &[]);
    fs::remove_file(dir.path().join(MARKER_FILE)).unwrap();
    assert_eq!(storage.latest().unwrap().unwrap().meta.id, 1);
    assert!(dir.path().join(MARKER_FILE).exists());
}

#[test]
fn retain_deletes_old_checkpoints_and_their_unshared_files() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path()).unwrap();
    checkpoint(&storage, 1, &["a.sst", "old.sst"]);
    checkpoint(&storage, 2, &["a.sst", "b.sst"]);
    checkpoint(&storage, 3, &["a.sst", "c.sst"]);
    assert_eq!(storage.retain(2).unwrap(), vec![1]);
    assert_eq!(storage.completed().unwrap(), vec![2, 3]);
    let shared = dir.path().join("shared");
    assert!(shared.join("a.sst").exists(), "still used by 2 and 3");
    assert!(!shared.join("old.sst").exists(), "only 1 used it");
    assert!(shared.join("b.sst").exists());
    // Retained checkpoints still restore after older ones are deleted.
    let s = storage.latest().unwrap().unwrap();
    for f in s.meta.files() {
        s.reader.read(f).unwrap();
    }
    assert_eq!(storage.retain(1).unwrap(), vec![2]);
    assert!(!shared.join("b.sst").exists());
    storage.discard_all().unwrap();
    assert!(storage.completed().unwrap().is_empty());
}

/// A local directory whose `get` or `delete` of chosen keys fails, as an object store outage or
/// EMFILE would.
struct Flaky {
    dir: Dir,
    fail_get: std::sync::Mutex<Vec<String>>,
    fail_delete: std::sync::Mutex<Vec<String>>,
    /// Puts that fail before writing anything.
    fail_put: std::sync::Mutex<Vec<String>>,
    /// Puts that write, then lose their answer (an error).
    lose_answer: std::sync::Mutex<Vec<String>>,
    /// Creates that write, then answer "already there" (a retried create whose first try landed).
    answer_exists: std::sync::Mutex<Vec<String>>,
}

impl Flaky {
    fn storage(root: &Path) -> (Storage, Arc<Flaky>) {
        Self::storage_named(root, root)
    }

    /// Files in `root`, the location named `name` (an `s3://` URL stands for an object store).
    fn storage_named(root: &Path, name: &Path) -> (Storage, Arc<Flaky>) {
        let flaky = Arc::new(Flaky {
            dir: Dir {
                root: root.to_path_buf(),
            },
            fail_get: Default::default(),
            fail_delete: Default::default(),
            fail_put: Default::default(),
            lose_answer: Default::default(),
            answer_exists: Default::default(),
        });
        let storage = Storage {
            blobs: flaky.clone(),
            root: name.to_path_buf(),
            claim: Arc::default(),
            claim_id: Arc::default(),
            tag: super::new_tag(),
            machine: crate::storage::owner::ThisMachine::shared(),
        };
        (storage, flaky)
    }

    fn listed(list: &std::sync::Mutex<Vec<String>>, key: &str) -> bool {
        list.lock().unwrap().iter().any(|k| k == key)
    }

    fn fails(list: &std::sync::Mutex<Vec<String>>, key: &str) -> Result<()> {
        if list.lock().unwrap().iter().any(|k| k == key) {
            return Err(CoreError::io(
                "reading",
                Path::new(key),
                std::io::Error::other("injected: the object store answered 503"),
            ));
        }
        Ok(())
    }
}

impl Blobs for Flaky {
    fn locate(&self, key: &str) -> PathBuf {
        self.dir.locate(key)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        Self::fails(&self.fail_get, key)?;
        self.dir.get(key)
    }
    fn size(&self, key: &str) -> Result<Option<u64>> {
        self.dir.size(key)
    }
    fn put(&self, key: &str, bytes: &[u8], how: Put) -> Result<bool> {
        Self::fails(&self.fail_put, key)?;
        let written = self.dir.put(key, bytes, how)?;
        Self::fails(&self.lose_answer, key)?;
        Ok(written && !Self::listed(&self.answer_exists, key))
    }
    fn dirs(&self) -> Result<Vec<String>> {
        self.dir.dirs()
    }
    fn delete(&self, key: &str) -> Result<()> {
        Self::fails(&self.fail_delete, key)?;
        self.dir.delete(key)
    }
    fn delete_dir(&self, dir: &str) -> Result<()> {
        self.dir.delete_dir(dir)
    }
    fn delete_named(&self, dir: &str, prefix: &str) -> Result<()> {
        self.dir.delete_named(dir, prefix)
    }
}

#[test]
fn retention_that_cannot_read_a_kept_checkpoint_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, flaky) = Flaky::storage(dir.path());
    checkpoint(&storage, 1, &["a.sst", "old.sst"]);
    checkpoint(&storage, 2, &["a.sst", "b.sst"]);
    // The newest (and, with one retained, the only kept) checkpoint's metadata does not read.
    flaky.fail_get.lock().unwrap().push("chk-2/_metadata".into());
    let err = storage.retain(1).unwrap_err();
    assert!(matches!(err, CoreError::Io { .. }), "{err}");
    assert_eq!(storage.completed().unwrap(), vec![1, 2], "nothing deleted");
    assert!(dir.path().join("shared/a.sst").exists(), "2 still uses it");
    // The outage ends: the restart restores 2 with every file, and the next pass catches up.
    flaky.fail_get.lock().unwrap().clear();
    let s = storage.latest().unwrap().unwrap();
    assert_eq!(s.meta.id, 2);
    for f in s.meta.files() {
        s.reader.read(f).unwrap();
    }
    assert_eq!(storage.retain(1).unwrap(), vec![1]);
    assert!(!dir.path().join("shared/old.sst").exists());
    assert!(dir.path().join("shared/a.sst").exists());
}

#[test]
fn retention_that_cannot_read_a_dropped_checkpoint_deletes_nothing_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, flaky) = Flaky::storage(dir.path());
    checkpoint(&storage, 1, &["old.sst"]);
    checkpoint(&storage, 2, &["b.sst"]);
    flaky.fail_get.lock().unwrap().push("chk-1/_metadata".into());
    assert!(storage.retain(1).is_err());
    assert_eq!(storage.completed().unwrap(), vec![1, 2]);
    assert!(
        dir.path().join("shared/old.sst").exists(),
        "left for the next pass to delete"
    );
    flaky.fail_get.lock().unwrap().clear();
    assert_eq!(storage.retain(1).unwrap(), vec![1]);
    assert!(!dir.path().join("shared/old.sst").exists());
}

#[test]
fn retention_deletes_a_checkpoints_metadata_before_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, flaky) = Flaky::storage(dir.path());
    checkpoint(&storage, 1, &["old.sst"]);
    checkpoint(&storage, 2, &["b.sst"]);
    // Stopped (a crash, an error) at the metadata's deletion: checkpoint 1 is still listed, so
    // every file it references must still be there.
    flaky.fail_delete.lock().unwrap().push("chk-1/_metadata".into());
    assert!(storage.retain(1).is_err());
    assert_eq!(storage.completed().unwrap(), vec![1, 2]);
    let one = Storage::open_verified(&storage.checkpoint_dir(1));
    assert!(one.is_ok(), "a listed checkpoint lost a file: {:?}", one.err());
}

#[test]
fn retention_drops_a_checkpoint_whose_metadata_is_damaged_and_keeps_every_shared_file() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path()).unwrap();
    checkpoint(&storage, 1, &["old.sst"]);
    checkpoint(&storage, 2, &["b.sst"]);
    flip_last_byte(&storage.checkpoint_dir(1).join(METADATA_FILE));
    assert_eq!(storage.retain(1).unwrap(), vec![1]);
    assert_eq!(storage.completed().unwrap(), vec![2]);
    assert!(
        dir.path().join("shared/old.sst").exists(),
        "what it used is unknown: kept"
    );
}

/// The metadata write answered an error (a lost answer, a timeout) but landed, or a retried
/// create answered "already there" for its own first try: what is there settles it — committed.
#[test]
fn a_metadata_write_whose_answer_was_lost_is_settled_by_reading_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, flaky) = Flaky::storage(dir.path());
    checkpoint(&storage, 1, &[]);
    flaky.lose_answer.lock().unwrap().push("chk-2/_metadata".into());
    let m2 = meta(2, Vec::new());
    storage.commit(&m2).expect("written, answer lost: committed");
    flaky.answer_exists.lock().unwrap().push("chk-3/_metadata".into());
    let m3 = meta(3, Vec::new());
    storage
        .commit(&m3)
        .expect("a retried create finding its own first try: committed");
    assert_eq!(storage.latest().unwrap().unwrap().meta, m3);
    // Another writer's metadata under the id: the location is another run's.
    let mut other = meta(4, Vec::new());
    other.timestamp_ms = 1;
    flaky
        .dir
        .put("chk-4/_metadata", &encode_metadata(&other).unwrap(), Put::Create)
        .unwrap();
    let err = storage.commit(&meta(4, Vec::new())).unwrap_err();
    assert!(matches!(err, CoreError::LocationOwned { .. }), "{err}");
}

/// A write whose outcome cannot be read back is neither committed nor failed: unknown, and the
/// checkpoint fails keeping its files (a later one, or a restore, settles it) — never an abort
/// that deletes files of a checkpoint that may yet be listed. An object store's write absent now may still land; a local
/// directory's failed write is plainly absent.
#[test]
fn a_metadata_write_of_unknown_outcome_is_reported_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, flaky) = Flaky::storage(dir.path());
    flaky.lose_answer.lock().unwrap().push("chk-1/_metadata".into());
    flaky.fail_get.lock().unwrap().push("chk-1/_metadata".into());
    let err = storage.commit(&meta(1, Vec::new())).unwrap_err();
    assert!(matches!(err, CoreError::CommitOutcomeUnknown { id: 1, .. }), "{err}");
    assert_eq!(err.class(), crate::ErrorClass::Restart);

    flaky.fail_put.lock().unwrap().push("chk-2/_metadata".into());
    let err = storage.commit(&meta(2, Vec::new())).unwrap_err();
    assert!(
        matches!(err, CoreError::Io { .. }),
        "a local directory's failed write: {err}"
    );

    let (bucket, flaky) = Flaky::storage_named(dir.path(), Path::new("s3://bucket/job"));
    flaky.fail_put.lock().unwrap().push("chk-3/_metadata".into());
    let err = bucket.commit(&meta(3, Vec::new())).unwrap_err();
    assert!(matches!(err, CoreError::CommitOutcomeUnknown { id: 3, .. }), "{err}");
}

#[test]
fn exported_snapshot_is_self_contained() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path().join("chk")).unwrap();
    checkpoint(&storage, 4, &["a.sst"]);
    let out = dir.path().join("savepoint-4");
    storage.export(4, &out).unwrap();
    storage.discard_all().unwrap();
    let s = Storage::open_path(&out).unwrap();
    assert_eq!(s.meta.id, 4);
    let contents: Vec<_> = s.meta.files().map(|f| s.reader.read(f).unwrap()).collect();
    assert_eq!(contents, vec![b"private 4".to_vec(), b"content of a.sst".to_vec()]);
}

#[test]
fn newer_metadata_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path()).unwrap();
    checkpoint(&storage, 1, &[]);
    let md = storage.checkpoint_dir(1).join(METADATA_FILE);
    let mut bytes = fs::read(&md).unwrap();
    bytes[4..8].copy_from_slice(&(METADATA_VERSION + 1).to_le_bytes());
    fs::write(&md, bytes).unwrap();
    let err = storage.open(1).unwrap_err().to_string();
    assert!(err.contains("newer than this build"), "{err}");
}

#[test]
fn a_checkpoint_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path()).unwrap();
    let m = checkpoint(&storage, 1, &[]);
    // The same metadata again (a retried write) is the same checkpoint; another is refused.
    storage.commit(&m).expect("idempotent");
    let mut other = m.clone();
    other.timestamp_ms += 1;
    let err = storage.commit(&other).unwrap_err();
    assert!(matches!(err, CoreError::LocationOwned { .. }), "{err}");
    assert_eq!(err.class(), crate::ErrorClass::Fatal, "another writer stops the run");
    assert!(
        err.to_string().contains("checkpoint 1 was written by another process"),
        "{err}"
    );
    assert_eq!(storage.latest().unwrap().unwrap().meta, m);
}

/// Checkpoint metadata is input too: a crafted `_metadata` whose file names leave their
/// directory (`../`, an absolute path) is refused when it is read, before a restore could write
/// or read there or retention delete there.
#[test]
fn a_checkpoint_naming_files_outside_its_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path().join("chk")).unwrap();
    let outside = dir.path().join("outside");
    fs::write(&outside, b"precious").unwrap();
    for (name, local) in [
        ("../../outside", "000012.sst"),
        ("ok.sst", "../../../outside"),
        ("ok.sst", "/etc/passwd"),
        ("..", "000012.sst"),
        ("", "000012.sst"),
    ] {
        let crafted = meta(
            7,
            vec![FileHandle {
                scope: FileScope::Shared,
                name: name.into(),
                local_name: local.into(),
                size: 8,
                crc32: crc32fast::hash(b"precious"),
            }],
        );
        let key = "chk-7/_metadata";
        fs::create_dir_all(dir.path().join("chk/chk-7")).unwrap();
        fs::write(dir.path().join("chk").join(key), encode_metadata(&crafted).unwrap()).unwrap();
        let err = storage.open(7).unwrap_err();
        assert!(
            matches!(&err, CoreError::Corrupt { reason, .. } if reason.contains("not a single file name")),
            "{name:?} / {local:?}: {err}"
        );
        assert!(storage.latest().is_err(), "{name:?} / {local:?}");
        assert_eq!(fs::read(&outside).unwrap(), b"precious");
    }
}

#[test]
fn an_abort_deletes_only_the_files_its_own_process_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let ours = Storage::new(dir.path()).unwrap();
    // Another process's storage on the same location (a crashed run's, say): another tag.
    let theirs = Storage::new(dir.path()).unwrap();
    let mine = ours.writer(3).unwrap().write_private("state", b"ours").unwrap();
    let other = theirs.writer(3).unwrap().write_private("state", b"theirs").unwrap();
    assert_ne!(mine.name, other.name, "private names carry the writer's tag");
    assert_eq!(
        (mine.local_name.as_str(), other.local_name.as_str()),
        ("state", "state")
    );
    ours.abort(3).unwrap();
    let left: Vec<String> = fs::read_dir(ours.checkpoint_dir(3))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, vec![other.name.clone()]);
    theirs.abort(3).unwrap();
    assert!(!ours.checkpoint_dir(3).exists(), "removed once empty");
}

#[test]
fn a_restart_makes_unfinished_checkpoints_above_the_restored_one_void() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path()).unwrap();
    let m1 = checkpoint(&storage, 1, &["a.sst"]);
    // 2 and 3 began (their files written), and their metadata never came (yet).
    for id in [2, 3] {
        storage.writer(id).unwrap().write_private("state", b"x").unwrap();
    }
    assert_eq!(storage.void_unfinished_above(1, false).unwrap(), vec![2, 3]);
    // A late write of 3's metadata is refused: 3 stays void, never completed or restorable.
    let late = meta(3, Vec::new());
    assert!(storage.commit(&late).is_err(), "a late metadata write must not land");
    let scan = storage.scan().unwrap();
    assert_eq!((scan.completed, scan.void), (vec![1], vec![2, 3]));
    assert_eq!(storage.latest().unwrap().unwrap().meta, m1);
    assert!(!Storage::is_snapshot(&storage.checkpoint_dir(3)).unwrap());
    assert!(storage.highest_id().unwrap() >= 3, "ids go past void ones");
    // One that completed meanwhile makes the restart choose again (unless newer ones are expected).
    checkpoint(&storage, 4, &["a.sst"]);
    let err = storage.void_unfinished_above(1, false).unwrap_err();
    assert!(err.to_string().contains("checkpoint 4 completed"), "{err}");
    assert_eq!(
        storage.void_unfinished_above(1, true).unwrap(),
        Vec::<CheckpointId>::new()
    );
}

#[test]
fn an_empty_metadata_is_damage_not_a_void_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::new(dir.path()).unwrap();
    checkpoint(&storage, 1, &["a.sst"]);
    checkpoint(&storage, 2, &["a.sst"]);
    fs::write(storage.checkpoint_dir(2).join(METADATA_FILE), b"").unwrap();
    assert_eq!(
        storage.completed().unwrap(),
        vec![1, 2],
        "still listed: never skipped silently"
    );
    let err = storage.latest().unwrap_err();
    assert!(
        matches!(err, CoreError::NewestCheckpointUnusable { id: 2, .. }),
        "{err}"
    );
}
