//! Backend tests: typed state, snapshot and restore, rescaling, RocksDB incremental snapshots.
// Helpers shared with the RocksDB tests go unused in a build without them.
#![cfg_attr(not(feature = "rocksdb"), allow(unused))]

use std::collections::BTreeMap;

use super::backend::entry_key;
use super::*;
use crate::checkpoint::{CheckpointMetadata, OperatorSnapshot, SubtaskSnapshot, METADATA_VERSION};
use crate::message::SnapshotKind;
use crate::storage::{CheckpointStorage, SnapshotReader, Storage};

const MAX: u32 = 128;

fn ctx<'a>(backend: &'a mut dyn KeyedStateBackend, key: &'a [u8]) -> KeyedContext<'a> {
    KeyedContext {
        key_group: key_group(key, MAX),
        backend,
        key,
    }
}

fn fill(backend: &mut dyn KeyedStateBackend, keys: std::ops::Range<u32>) {
    let count = ValueState::<u64>::new("count");
    let tags = MapState::<String, u32>::new("tags");
    for i in keys {
        let key = format!("key-{i}");
        if !backend.key_groups().contains(key_group(key.as_bytes(), MAX)) {
            continue;
        }
        let mut c = ctx(backend, key.as_bytes());
        count.set(&mut c, &u64::from(i)).unwrap();
        tags.put(&mut c, &"a".to_owned(), &i).unwrap();
        tags.put(&mut c, &"b".to_owned(), &(i + 1)).unwrap();
    }
}

fn check(backend: &mut dyn KeyedStateBackend, keys: std::ops::Range<u32>) -> usize {
    let count = ValueState::<u64>::new("count");
    let tags = MapState::<String, u32>::new("tags");
    let mut seen = 0;
    for i in keys {
        let key = format!("key-{i}");
        let mine = backend.key_groups().contains(key_group(key.as_bytes(), MAX));
        let c = ctx(backend, key.as_bytes());
        let got = count.get(&c).unwrap();
        if mine {
            assert_eq!(got, Some(u64::from(i)), "{key}");
            assert_eq!(
                tags.entries(&c).unwrap(),
                vec![("a".to_owned(), i), ("b".to_owned(), i + 1)]
            );
            seen += 1;
        } else {
            assert_eq!(got, None, "{key} belongs to another subtask");
        }
    }
    seen
}

fn commit(storage: &Storage, id: u64, handles: Vec<crate::checkpoint::KeyedStateHandle>) {
    let mut operators = BTreeMap::new();
    operators.insert(
        "op".to_owned(),
        OperatorSnapshot {
            parallelism: handles.len() as u32,
            max_parallelism: MAX,
            subtasks: handles
                .into_iter()
                .map(|h| SubtaskSnapshot {
                    keyed: Some(h),
                    ..Default::default()
                })
                .collect(),
        },
    );
    storage
        .commit(&CheckpointMetadata {
            version: METADATA_VERSION,
            job: "t".into(),
            id,
            kind: SnapshotKind::Checkpoint,
            timestamp_ms: 0,
            completed_ms: 0,
            operators,
        })
        .unwrap();
}

enum Kind {
    Memory,
    #[cfg(feature = "rocksdb")]
    Rocks,
}

fn new_backend(kind: &Kind, range: KeyGroupRange, dir: &std::path::Path) -> Box<dyn KeyedStateBackend> {
    match kind {
        Kind::Memory => Box::new(MemoryBackend::new(range)),
        #[cfg(feature = "rocksdb")]
        Kind::Rocks => Box::new(RocksDbBackend::new(range, dir).unwrap()),
    }
}

fn restore(
    kind: &Kind,
    range: KeyGroupRange,
    handles: &[(&crate::checkpoint::KeyedStateHandle, &dyn SnapshotReader)],
    dir: &std::path::Path,
) -> Box<dyn KeyedStateBackend> {
    match kind {
        Kind::Memory => Box::new(MemoryBackend::restore(range, handles).unwrap()),
        #[cfg(feature = "rocksdb")]
        Kind::Rocks => Box::new(RocksDbBackend::restore(range, handles, dir).unwrap()),
    }
}

fn rescale_round_trip(kind: Kind) {
    let tmp = tempfile::tempdir().unwrap();
    let storage = Storage::new(tmp.path().join("chk")).unwrap();
    let local = tmp.path().join("local");
    // Two subtasks write, snapshot into checkpoint 1.
    let writer = storage.writer(1).unwrap();
    let mut handles = Vec::new();
    for i in 0..2 {
        let range = KeyGroupRange::for_subtask(MAX, 2, i);
        let mut b = new_backend(&kind, range, &local);
        fill(b.as_mut(), 0..300);
        handles.push(
            b.snapshot(1, SnapshotKind::Checkpoint, &format!("op-{i}"), writer.as_ref())
                .unwrap(),
        );
    }
    commit(&storage, 1, handles);
    let snap = storage.latest().unwrap().unwrap();
    let op = &snap.meta.operators["op"];
    // Same parallelism, and rescaled to 3 and to 1: every key found exactly where it belongs.
    for p in [2u32, 3, 1] {
        let mut total = 0;
        for i in 0..p {
            let restored = redistribute(op, p, i);
            let pairs: Vec<_> = restored.keyed.iter().map(|h| (h, snap.reader.as_ref())).collect();
            let mut b = restore(&kind, KeyGroupRange::for_subtask(MAX, p, i), &pairs, &local);
            total += check(b.as_mut(), 0..300);
        }
        assert_eq!(total, 300, "parallelism {p}");
    }
}

#[test]
fn memory_backend_restores_and_rescales() {
    rescale_round_trip(Kind::Memory);
}

#[cfg(feature = "rocksdb")]
#[test]
fn rocksdb_backend_restores_and_rescales() {
    rescale_round_trip(Kind::Rocks);
}

#[test]
fn list_state_and_clear() {
    let mut b = MemoryBackend::new(KeyGroupRange::new(0, MAX - 1));
    let list = ListState::<String>::new("l");
    let mut c = ctx(&mut b, b"k");
    list.add(&mut c, "x".into()).unwrap();
    list.add(&mut c, "y".into()).unwrap();
    assert_eq!(list.get(&c).unwrap(), vec!["x", "y"]);
    list.clear(&mut c).unwrap();
    assert!(list.get(&c).unwrap().is_empty());
}

#[cfg(feature = "rocksdb")]
#[test]
fn rocksdb_second_snapshot_of_mostly_unchanged_state_writes_far_less() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = Storage::new(tmp.path().join("chk")).unwrap();
    let range = KeyGroupRange::new(0, MAX - 1);
    let mut b = RocksDbBackend::new(range, &tmp.path().join("local")).unwrap();
    // Incompressible values, so sizes reflect what is written.
    let value_of = |i: u32| -> Vec<u8> {
        (0..50u64)
            .flat_map(|j| hash_key(&[i.to_be_bytes(), (j as u32).to_be_bytes()].concat()).to_le_bytes())
            .take(200)
            .collect()
    };
    for i in 0..20_000u32 {
        b.put(
            &entry_key(key_group(&i.to_be_bytes(), MAX), "s", &i.to_be_bytes(), None),
            &value_of(i),
        )
        .unwrap();
    }
    let w1 = storage.writer(1).unwrap();
    let h1 = b.snapshot(1, SnapshotKind::Checkpoint, "op-0", w1.as_ref()).unwrap();
    commit(&storage, 1, vec![h1]);
    for i in 0..20u32 {
        b.put(
            &entry_key(key_group(&i.to_be_bytes(), MAX), "s", &i.to_be_bytes(), None),
            b"changed",
        )
        .unwrap();
    }
    let w2 = storage.writer(2).unwrap();
    let h2 = b.snapshot(2, SnapshotKind::Checkpoint, "op-0", w2.as_ref()).unwrap();
    commit(&storage, 2, vec![h2]);
    let (first, second) = (w1.bytes_written(), w2.bytes_written());
    assert!(first > 1_000_000, "first snapshot wrote {first} bytes");
    assert!(
        second * 10 < first,
        "second snapshot wrote {second} bytes, first {first}"
    );

    // Checkpoint 2 still restores, with the change, after checkpoint 1 is deleted.
    storage.retain(1).unwrap();
    let snap = storage.latest().unwrap().unwrap();
    assert_eq!(snap.meta.id, 2);
    let restored = redistribute(&snap.meta.operators["op"], 1, 0);
    let pairs: Vec<_> = restored.keyed.iter().map(|h| (h, snap.reader.as_ref())).collect();
    let r = RocksDbBackend::restore(range, &pairs, &tmp.path().join("local2")).unwrap();
    let k0 = entry_key(key_group(&0u32.to_be_bytes(), MAX), "s", &0u32.to_be_bytes(), None);
    let k99 = entry_key(key_group(&99u32.to_be_bytes(), MAX), "s", &99u32.to_be_bytes(), None);
    assert_eq!(r.get(&k0).unwrap().as_deref(), Some(&b"changed"[..]));
    assert_eq!(r.get(&k99).unwrap(), Some(value_of(99)));
}
