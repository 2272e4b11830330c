//! The keyed state backend interface and the typed state handles user functions use.
//!
//! Backends store sorted byte keys. A state entry's key is
//! `[key group: u16 BE][state name length: u8][state name][user key length: u32 BE][user key][map key]`,
//! so one key group's entries form a contiguous range (snapshots and rescaling filter by range).
//! Values and map keys are encoded as the backend's [`StateEncoding`] says: postcard for state
//! started today, bincode for state first written by a build of checkpoint format 1.

use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::checkpoint::{KeyedStateHandle, StateEncoding};
use crate::error::{CoreError, Result};
use crate::message::{CheckpointId, SnapshotKind};
use crate::state::KeyGroupRange;
use crate::storage::SnapshotWriter;

/// A sorted key-value store holding one subtask's keyed state.
pub trait KeyedStateBackend: Send {
    /// The key groups this backend holds.
    fn key_groups(&self) -> KeyGroupRange;
    /// The value at `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Sets `key` to `value`.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()>;
    /// Removes `key`.
    fn delete(&mut self, key: &[u8]) -> Result<()>;
    /// Every entry whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// Writes a snapshot for checkpoint `id` and returns its handle. `name` is unique per operator
    /// and subtask within the checkpoint.
    fn snapshot(
        &mut self,
        id: CheckpointId,
        kind: SnapshotKind,
        name: &str,
        writer: &dyn SnapshotWriter,
    ) -> Result<KeyedStateHandle>;
    /// Told that checkpoint `id` completed (a backend may release what only older ones needed).
    fn checkpoint_complete(&mut self, _id: CheckpointId) {}
    /// How values and map keys are encoded in this backend: the encoding of the state it restored
    /// (its handles' [`KeyedStateHandle::encoding`]), postcard for new state. Its snapshots must
    /// record it.
    fn encoding(&self) -> StateEncoding {
        StateEncoding::Postcard
    }
}

/// Builds the composite key of a state entry.
pub(crate) fn entry_key(kg: u32, state: &str, key: &[u8], map_key: Option<&[u8]>) -> Vec<u8> {
    let mut out = entry_prefix(kg, state, key);
    if let Some(mk) = map_key {
        out.extend_from_slice(mk);
    }
    out
}

pub(crate) fn entry_prefix(kg: u32, state: &str, key: &[u8]) -> Vec<u8> {
    debug_assert!(state.len() < 256, "state names are limited to 255 bytes");
    let mut out = Vec::with_capacity(2 + 1 + state.len() + 4 + key.len() + 16);
    out.extend_from_slice(&(kg as u16).to_be_bytes());
    out.push(state.len() as u8);
    out.extend_from_slice(state.as_bytes());
    out.extend_from_slice(&(key.len() as u32).to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// The key group of a composite entry key.
pub(crate) fn entry_key_group(entry: &[u8]) -> u32 {
    u32::from(u16::from_be_bytes([entry[0], entry[1]]))
}

pub(crate) fn encode<V: Serialize>(encoding: StateEncoding, what: &str, v: &V) -> Result<Vec<u8>> {
    match encoding {
        StateEncoding::Postcard => postcard::to_allocvec(v).map_err(|e| CoreError::ser(what, e)),
        StateEncoding::Bincode => {
            bincode::serde::encode_to_vec(v, bincode::config::standard()).map_err(|e| CoreError::ser(what, e))
        }
    }
}

pub(crate) fn decode<V: DeserializeOwned>(encoding: StateEncoding, what: &str, bytes: &[u8]) -> Result<V> {
    match encoding {
        StateEncoding::Postcard => match postcard::take_from_bytes(bytes) {
            Ok((v, [])) => Ok(v),
            Ok((_, rest)) => Err(CoreError::ser(what, format!("{} bytes left over", rest.len()))),
            Err(e) => Err(CoreError::ser(what, e)),
        },
        StateEncoding::Bincode => bincode::serde::decode_from_slice(bytes, bincode::config::standard())
            .map(|(v, _)| v)
            .map_err(|e| CoreError::ser(what, e)),
    }
}

/// The one encoding of `handles` (postcard when there are none): state restored from several
/// snapshots is one store, and its values must all read the same way.
pub(crate) fn restored_encoding<'a>(handles: impl IntoIterator<Item = &'a KeyedStateHandle>) -> Result<StateEncoding> {
    let mut found: Option<StateEncoding> = None;
    for h in handles {
        match found {
            Some(e) if e != h.encoding => {
                return Err(CoreError::Config(format!(
                    "the keyed state to restore was written in two encodings ({e:?} and {:?}): the \
                     snapshots come from different lineages of the job's state",
                    h.encoding
                )))
            }
            _ => found = Some(h.encoding),
        }
    }
    Ok(found.unwrap_or_default())
}

/// Access to the keyed state of the record being processed: the runtime sets the current key.
pub struct KeyedContext<'a> {
    pub(crate) backend: &'a mut dyn KeyedStateBackend,
    pub(crate) key: &'a [u8],
    pub(crate) key_group: u32,
}

impl KeyedContext<'_> {
    /// The serialized key of the current record.
    pub fn key(&self) -> &[u8] {
        self.key
    }
}

/// A single value per key.
pub struct ValueState<V> {
    name: String,
    _v: PhantomData<fn() -> V>,
}

impl<V: Serialize + DeserializeOwned> ValueState<V> {
    /// The state called `name` (unique within its operator).
    pub fn new(name: impl Into<String>) -> Self {
        ValueState {
            name: name.into(),
            _v: PhantomData,
        }
    }

    /// The current key's value.
    pub fn get(&self, ctx: &KeyedContext<'_>) -> Result<Option<V>> {
        let k = entry_key(ctx.key_group, &self.name, ctx.key, None);
        ctx.backend
            .get(&k)?
            .map(|b| decode(ctx.backend.encoding(), &self.name, &b))
            .transpose()
    }

    /// Sets the current key's value.
    pub fn set(&self, ctx: &mut KeyedContext<'_>, v: &V) -> Result<()> {
        let k = entry_key(ctx.key_group, &self.name, ctx.key, None);
        let value = encode(ctx.backend.encoding(), &self.name, v)?;
        ctx.backend.put(&k, &value)
    }

    /// Removes the current key's value.
    pub fn clear(&self, ctx: &mut KeyedContext<'_>) -> Result<()> {
        let k = entry_key(ctx.key_group, &self.name, ctx.key, None);
        ctx.backend.delete(&k)
    }
}

/// A map per key.
pub struct MapState<K, V> {
    name: String,
    _kv: PhantomData<fn() -> (K, V)>,
}

impl<K: Serialize + DeserializeOwned, V: Serialize + DeserializeOwned> MapState<K, V> {
    /// The state called `name` (unique within its operator).
    pub fn new(name: impl Into<String>) -> Self {
        MapState {
            name: name.into(),
            _kv: PhantomData,
        }
    }

    /// The value under `k` for the current key.
    pub fn get(&self, ctx: &KeyedContext<'_>, k: &K) -> Result<Option<V>> {
        let mk = encode(ctx.backend.encoding(), &self.name, k)?;
        let key = entry_key(ctx.key_group, &self.name, ctx.key, Some(&mk));
        ctx.backend
            .get(&key)?
            .map(|b| decode(ctx.backend.encoding(), &self.name, &b))
            .transpose()
    }

    /// Sets `k` to `v` for the current key.
    pub fn put(&self, ctx: &mut KeyedContext<'_>, k: &K, v: &V) -> Result<()> {
        let mk = encode(ctx.backend.encoding(), &self.name, k)?;
        let key = entry_key(ctx.key_group, &self.name, ctx.key, Some(&mk));
        let value = encode(ctx.backend.encoding(), &self.name, v)?;
        ctx.backend.put(&key, &value)
    }

    /// Removes `k` for the current key.
    pub fn remove(&self, ctx: &mut KeyedContext<'_>, k: &K) -> Result<()> {
        let mk = encode(ctx.backend.encoding(), &self.name, k)?;
        let key = entry_key(ctx.key_group, &self.name, ctx.key, Some(&mk));
        ctx.backend.delete(&key)
    }

    /// Every entry of the current key's map.
    pub fn entries(&self, ctx: &KeyedContext<'_>) -> Result<Vec<(K, V)>> {
        let prefix = entry_prefix(ctx.key_group, &self.name, ctx.key);
        let encoding = ctx.backend.encoding();
        ctx.backend
            .scan_prefix(&prefix)?
            .into_iter()
            .map(|(k, v)| {
                Ok((
                    decode(encoding, &self.name, &k[prefix.len()..])?,
                    decode(encoding, &self.name, &v)?,
                ))
            })
            .collect()
    }
}

/// A list per key.
pub struct ListState<V> {
    inner: ValueState<Vec<V>>,
}

impl<V: Serialize + DeserializeOwned> ListState<V> {
    /// The state called `name` (unique within its operator).
    pub fn new(name: impl Into<String>) -> Self {
        ListState {
            inner: ValueState::new(name),
        }
    }

    /// The current key's list (empty if none).
    pub fn get(&self, ctx: &KeyedContext<'_>) -> Result<Vec<V>> {
        Ok(self.inner.get(ctx)?.unwrap_or_default())
    }

    /// Appends to the current key's list.
    pub fn add(&self, ctx: &mut KeyedContext<'_>, v: V) -> Result<()> {
        let mut list = self.get(ctx)?;
        list.push(v);
        self.inner.set(ctx, &list)
    }

    /// Empties the current key's list.
    pub fn clear(&self, ctx: &mut KeyedContext<'_>) -> Result<()> {
        self.inner.clear(ctx)
    }
}
