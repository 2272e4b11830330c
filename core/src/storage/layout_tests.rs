use std::collections::BTreeMap;

use super::*;
use crate::checkpoint::{BackendKind, KeyedStateHandle, OperatorSnapshot, SubtaskSnapshot, METADATA_VERSION};
use crate::message::SnapshotKind;
use crate::state::KeyGroupRange;

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
}

impl Flaky {
    fn storage(root: &Path) -> (Storage, Arc<Flaky>) {
        let flaky = Arc::new(Flaky {
            dir: Dir {
                root: root.to_path_buf(),
            },
            fail_get: Default::default(),
            fail_delete: Default::default(),
        });
        let storage = Storage {
            blobs: flaky.clone(),
            root: root.to_path_buf(),
            claim: Arc::default(),
        };
        (storage, flaky)
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
        self.dir.put(key, bytes, how)
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
    let err = storage.commit(&m).unwrap_err();
    assert!(matches!(err, CoreError::LocationOwned { .. }), "{err}");
    assert_eq!(err.class(), crate::ErrorClass::Fatal, "another writer stops the run");
    assert!(
        err.to_string().contains("checkpoint 1 was written by another process"),
        "{err}"
    );
    assert_eq!(storage.latest().unwrap().unwrap().meta, m);
}
