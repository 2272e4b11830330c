//! Checkpoint storage in a real S3-compatible object store (SeaweedFS, started by
//! `scripts/services`): the same layout and guarantees as a local directory — metadata written
//! last and never overwritten (a conditional create the server must honour), checksums verified
//! on restore, a corrupt or missing newest checkpoint an error rather than a fallback, shared
//! RocksDB files uploaded once and deleted when no retained checkpoint needs them, savepoints
//! self-contained — and an outage of the store is a retriable I/O error.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;
use exactly_core::checkpoint::{
    BackendKind, CheckpointMetadata, FileHandle, FileScope, KeyedStateHandle, OperatorSnapshot, SubtaskSnapshot,
    METADATA_VERSION,
};
use exactly_core::state::{key_group, redistribute, KeyGroupRange, KeyedStateBackend, RocksDbBackend};
use exactly_core::storage::{CheckpointStorage, Storage};
use exactly_core::{CoreError, ErrorClass, SnapshotKind};
use exactly_integration_tests::{unique, TestEnv};
use object_store::path::Path as Key;
use object_store::ObjectStore;

const MAX: u32 = 128;

fn meta(id: u64, files: Vec<FileHandle>) -> CheckpointMetadata {
    let mut operators = BTreeMap::new();
    operators.insert(
        "op".to_owned(),
        OperatorSnapshot {
            parallelism: 1,
            max_parallelism: MAX,
            subtasks: vec![SubtaskSnapshot {
                keyed: Some(KeyedStateHandle {
                    backend: BackendKind::RocksDb,
                    key_groups: KeyGroupRange::new(0, MAX - 1),
                    files,
                    encoding: exactly_core::checkpoint::StateEncoding::Postcard,
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

/// Writes and commits checkpoint `id` with one private file and the given shared ones.
fn checkpoint(storage: &Storage, id: u64, shared: &[&str]) -> Result<CheckpointMetadata> {
    let w = storage.writer(id)?;
    let src = tempfile::NamedTempFile::new()?;
    let mut files = vec![w.write_private("private.bin", format!("private {id}").as_bytes())?];
    for name in shared {
        std::fs::write(src.path(), format!("content of {name}"))?;
        files.push(w.upload_shared(name, name, src.path())?);
    }
    let m = meta(id, files);
    storage.commit(&m)?;
    Ok(m)
}

/// A raw client of the same bucket, to damage what the storage wrote.
struct Raw {
    store: Arc<dyn ObjectStore>,
    prefix: String,
}

impl Raw {
    fn new(bucket: &str, prefix: &str) -> Result<Raw> {
        let store = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .build()?;
        Ok(Raw {
            store: Arc::new(store),
            prefix: prefix.to_owned(),
        })
    }

    fn key(&self, key: &str) -> Key {
        Key::from(format!("{}/{key}", self.prefix))
    }

    async fn get(&self, key: &str) -> Result<Vec<u8>> {
        Ok(self.store.get(&self.key(key)).await?.bytes().await?.to_vec())
    }

    async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        self.store.put(&self.key(key), bytes.into()).await?;
        Ok(())
    }

    async fn exists(&self, key: &str) -> Result<bool> {
        match self.store.head(&self.key(key)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.store.delete(&self.key(key)).await?;
        Ok(())
    }
}

/// A fresh prefix of the test bucket, its storage, and a raw client. Storage calls block, so
/// they run here on a blocking-capable thread (`block_in_place`).
async fn setup(name: &str) -> Result<(Storage, Raw, String)> {
    let env = TestEnv::get().await?;
    let s3 = env.s3()?;
    let prefix = unique(name);
    let url = s3.url(&prefix);
    let storage = Storage::new(&url)?;
    Ok((storage, Raw::new(&s3.bucket, &prefix)?, url))
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_are_listed_verified_and_never_overwritten() -> Result<()> {
    let (storage, raw, url) = setup("s3-basic").await?;
    // Another process's file in checkpoint 2 (a crashed run that began the same id): an abort
    // here deletes only what this storage wrote.
    raw.put("chk-2/0123456789abcdef-x", b"theirs".to_vec()).await?;
    let x = blocking(|| -> Result<String> {
        assert!(storage.latest()?.is_none(), "a new prefix starts empty");
        let m1 = checkpoint(&storage, 1, &["a.sst"])?;
        let w2 = storage.writer(2)?;
        let x = w2.write_private("x", b"in progress")?.name; // no metadata: not completed
        assert_eq!(storage.completed()?, vec![1]);
        let s = storage.latest()?.expect("checkpoint 1");
        assert_eq!(s.meta, m1);
        for f in s.meta.files() {
            assert!(!s.reader.read(f)?.is_empty());
        }
        assert_eq!(storage.checkpoint_dir(1).display().to_string(), format!("{url}/chk-1"));
        // The metadata is created conditionally: the same again (a retried create) is the same
        // checkpoint, and the server refuses another writer's.
        storage.commit(&m1)?;
        let mut other = m1.clone();
        other.timestamp_ms += 1;
        let err = storage.commit(&other).unwrap_err().to_string();
        assert!(err.contains("written by another process"), "{err}");
        assert_eq!(storage.latest()?.expect("still 1").meta, m1);
        Ok(format!("chk-2/{x}"))
    })?;
    assert!(raw.exists(&x).await?, "{x} written");
    blocking(|| storage.abort(2))?;
    assert!(!raw.exists(&x).await?, "an aborted checkpoint's files are deleted");
    assert!(
        raw.exists("chk-2/0123456789abcdef-x").await?,
        "another process's file stays"
    );
    assert!(raw.exists("chk-1/_metadata").await?);
    // A checkpoint that completed is never deleted by an abort.
    blocking(|| storage.abort(1))?;
    assert!(raw.exists("chk-1/_metadata").await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_incomplete_newest_checkpoint_is_an_error_never_a_fallback() -> Result<()> {
    let (storage, raw, _) = setup("s3-corrupt").await?;
    blocking(|| -> Result<()> {
        checkpoint(&storage, 1, &["a.sst"])?;
        checkpoint(&storage, 2, &["a.sst", "b.sst"])?;
        Ok(())
    })?;
    // One byte of the newest metadata flipped.
    let mut md = raw.get("chk-2/_metadata").await?;
    let last = md.len() - 1;
    md[last] ^= 0xff;
    raw.put("chk-2/_metadata", md.clone()).await?;
    let err = blocking(|| storage.latest()).unwrap_err();
    assert!(
        matches!(err, CoreError::NewestCheckpointUnusable { id: 2, ref older, .. } if older.contains('1')),
        "{err}"
    );
    assert_eq!(err.class(), ErrorClass::Fatal);
    assert!(err.to_string().contains("checksum"), "{err}");
    md[last] ^= 0xff;
    raw.put("chk-2/_metadata", md).await?;
    assert_eq!(blocking(|| storage.latest())?.expect("2").meta.id, 2);

    // A shared file of the newest checkpoint missing, then truncated.
    let b = raw.get("shared/b.sst").await?;
    raw.delete("shared/b.sst").await?;
    let err = blocking(|| storage.latest()).unwrap_err();
    assert!(
        matches!(err, CoreError::NewestCheckpointUnusable { id: 2, ref reason, .. } if reason.contains("missing")),
        "{err}"
    );
    raw.put("shared/b.sst", b[..3].to_vec()).await?;
    assert!(matches!(
        blocking(|| storage.latest()),
        Err(CoreError::NewestCheckpointUnusable { id: 2, .. })
    ));
    // Content damage of the same size is caught when the file is read.
    raw.put("shared/b.sst", b.iter().map(|x| x ^ 1).collect()).await?;
    let s = blocking(|| storage.latest())?.expect("sizes match");
    let bf = s.meta.files().find(|f| f.name == "b.sst").expect("b").clone();
    assert!(matches!(
        blocking(|| s.reader.read(&bf)),
        Err(CoreError::Corrupt { .. })
    ));

    // Every checkpoint gone from a prefix that held some: refuse to start over.
    raw.delete("chk-1/_metadata").await?;
    raw.delete("chk-2/_metadata").await?;
    let err = blocking(|| storage.latest()).unwrap_err();
    assert!(matches!(err, CoreError::CheckpointsVanished(_)), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_unshared_files_and_savepoints_are_self_contained() -> Result<()> {
    let (storage, raw, url) = setup("s3-retain").await?;
    let first = blocking(|| -> Result<CheckpointMetadata> {
        let first = checkpoint(&storage, 1, &["a.sst", "old.sst"])?;
        checkpoint(&storage, 2, &["a.sst", "b.sst"])?;
        checkpoint(&storage, 3, &["a.sst", "c.sst"])?;
        Ok(first)
    })?;
    // Private files are named by the storage (a tag per process before the given name).
    let private = first
        .files()
        .find(|f| f.scope == FileScope::Private)
        .map(|f| format!("chk-1/{}", f.name))
        .expect("a private file");
    assert!(raw.exists(&private).await?, "{private} before retention");
    blocking(|| -> Result<()> {
        assert_eq!(storage.retain(2)?, vec![1]);
        assert_eq!(storage.completed()?, vec![2, 3]);
        Ok(())
    })?;
    assert!(raw.exists("shared/a.sst").await?, "still used by 2 and 3");
    assert!(!raw.exists("shared/old.sst").await?, "only 1 used it");
    assert!(!raw.exists(&private).await?, "{private} after retention");

    // A savepoint in the same store, and one in a local directory: each restores alone.
    let local = tempfile::tempdir()?;
    let in_store = std::path::PathBuf::from(format!("{url}/savepoints/savepoint-3"));
    let on_disk = local.path().join("savepoint-3");
    blocking(|| -> Result<()> {
        storage.export(3, &in_store)?;
        storage.export(3, &on_disk)?;
        storage.discard_all()?;
        assert!(storage.latest()?.is_none(), "discarded on purpose: starts anew");
        for location in [&in_store, &on_disk] {
            let s = Storage::open_verified(location)?;
            assert_eq!(s.meta.id, 3);
            let contents: Vec<Vec<u8>> = s.meta.files().map(|f| s.reader.read(f)).collect::<Result<_, _>>()?;
            assert_eq!(
                contents,
                vec![
                    b"private 3".to_vec(),
                    b"content of a.sst".to_vec(),
                    b"content of c.sst".to_vec()
                ]
            );
        }
        Ok(())
    })?;
    assert!(!raw.exists("shared/a.sst").await?);
    Ok(())
}

/// A raw entry key: its key group first (the layout state entries have), then the id.
fn entry(i: u32) -> Vec<u8> {
    let kg = key_group(&i.to_be_bytes(), MAX) as u16;
    [&kg.to_be_bytes()[..], &i.to_be_bytes()].concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocksdb_incremental_checkpoints_upload_shared_files_once() -> Result<()> {
    let (storage, raw, _) = setup("s3-rocks").await?;
    let local = tempfile::tempdir()?;
    let range = KeyGroupRange::new(0, MAX - 1);
    let (first, second) = blocking(|| -> Result<(u64, u64)> {
        let mut b = RocksDbBackend::new(range, &local.path().join("a"))?;
        // Values that do not compress, so sizes reflect what is uploaded.
        for i in 0..20_000u32 {
            let value: Vec<u8> = (0..50u32)
                .flat_map(|j| (i ^ (j << 20)).wrapping_mul(2_654_435_761).to_le_bytes())
                .collect();
            b.put(&entry(i), &value)?;
        }
        let w1 = storage.writer(1)?;
        let h1 = b.snapshot(1, SnapshotKind::Checkpoint, "op-0", w1.as_ref())?;
        storage.commit(&meta(1, h1.files))?;
        for i in 0..20u32 {
            b.put(&entry(i), b"changed")?;
        }
        let w2 = storage.writer(2)?;
        let h2 = b.snapshot(2, SnapshotKind::Checkpoint, "op-0", w2.as_ref())?;
        storage.commit(&meta(2, h2.files))?;
        Ok((w1.bytes_written(), w2.bytes_written()))
    })?;
    assert!(first > 1_000_000, "the first checkpoint uploaded {first} bytes");
    assert!(
        second * 10 < first,
        "the second uploaded {second} bytes, the first {first}"
    );

    // Checkpoint 2 restores from the store, with the change, after checkpoint 1 is deleted.
    blocking(|| -> Result<()> {
        storage.retain(1)?;
        let snap = storage.latest()?.expect("2");
        assert_eq!(snap.meta.id, 2);
        let restored = redistribute(&snap.meta.operators["op"], 1, 0);
        let pairs: Vec<_> = restored.keyed.iter().map(|h| (h, snap.reader.as_ref())).collect();
        let r = RocksDbBackend::restore(range, &pairs, &local.path().join("b"))?;
        assert_eq!(r.get(&entry(0))?.as_deref(), Some(&b"changed"[..]));
        assert_eq!(r.get(&entry(99))?.map(|v| v.len()), Some(200));
        Ok(())
    })?;
    assert!(raw.exists("chk-2/_metadata").await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_error_is_a_retriable_io_error() -> Result<()> {
    let env = TestEnv::get().await?;
    env.s3()?;
    // Same credentials, a bucket that does not exist: the store answers, with an error.
    let storage = Storage::new(format!("s3://{}/x", unique("no-such-bucket")))?;
    let err = blocking(|| storage.latest()).unwrap_err();
    assert!(matches!(err, CoreError::Io { .. }), "{err}");
    assert_eq!(err.class(), ErrorClass::Restart);
    assert!(err.to_string().contains("no-such-bucket"), "{err}");
    // A store that answers "no such bucket" is misconfigured, not down: never waited for.
    assert!(!err.is_unavailable(), "{err}");
    Ok(())
}
