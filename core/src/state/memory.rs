//! In-memory keyed state: a sorted map, written whole at every snapshot.

use std::collections::BTreeMap;

use super::backend::{decode, encode, entry_key_group, restored_encoding, KeyedStateBackend};
use super::KeyGroupRange;
use crate::checkpoint::{BackendKind, KeyedStateHandle, StateEncoding};
use crate::error::{CoreError, Result};
use crate::message::{CheckpointId, SnapshotKind};
use crate::storage::{SnapshotReader, SnapshotWriter};

/// Keyed state held in memory; every snapshot writes all of it (full snapshots).
#[derive(Debug)]
pub struct MemoryBackend {
    range: KeyGroupRange,
    entries: BTreeMap<Vec<u8>, Vec<u8>>,
    encoding: StateEncoding,
}

impl MemoryBackend {
    /// An empty backend for `range`.
    pub fn new(range: KeyGroupRange) -> Self {
        MemoryBackend {
            range,
            entries: BTreeMap::new(),
            encoding: StateEncoding::default(),
        }
    }

    /// A backend for `range` holding the entries of `handles` that fall in it (handles of other
    /// ranges are filtered: this is how keyed state is redistributed when rescaling).
    pub fn restore(range: KeyGroupRange, handles: &[(&KeyedStateHandle, &dyn SnapshotReader)]) -> Result<Self> {
        let mut backend = MemoryBackend::new(range);
        backend.encoding = restored_encoding(handles.iter().map(|(h, _)| *h))?;
        for (handle, reader) in handles {
            if handle.backend != BackendKind::Memory {
                return Err(CoreError::Config(format!(
                    "keyed state was written by the {:?} backend; restore it with that backend",
                    handle.backend
                )));
            }
            if !handle.key_groups.intersects(&range) {
                continue;
            }
            for file in &handle.files {
                let entries: Vec<(Vec<u8>, Vec<u8>)> = decode(handle.encoding, "keyed state", &reader.read(file)?)?;
                backend
                    .entries
                    .extend(entries.into_iter().filter(|(k, _)| range.contains(entry_key_group(k))));
            }
        }
        Ok(backend)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl KeyedStateBackend for MemoryBackend {
    fn key_groups(&self) -> KeyGroupRange {
        self.range
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.entries.get(key).cloned())
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.entries.insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.entries.remove(key);
        Ok(())
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(self
            .entries
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn snapshot(
        &mut self,
        _id: CheckpointId,
        _kind: SnapshotKind,
        name: &str,
        writer: &dyn SnapshotWriter,
    ) -> Result<KeyedStateHandle> {
        let entries: Vec<(&Vec<u8>, &Vec<u8>)> = self.entries.iter().collect();
        let file = writer.write_private(
            &format!("{name}.keyed"),
            &encode(self.encoding, "keyed state", &entries)?,
        )?;
        Ok(KeyedStateHandle {
            backend: BackendKind::Memory,
            key_groups: self.range,
            files: vec![file],
            encoding: self.encoding,
        })
    }

    fn encoding(&self) -> StateEncoding {
        self.encoding
    }
}
