//! RocksDB keyed state with incremental snapshots.
//!
//! A snapshot flushes the memtable and takes a RocksDB checkpoint (hard links). SST files are
//! immutable, so each is uploaded to shared storage once, under `<instance>-<name>`, and later
//! snapshots only reference it; the small MANIFEST/CURRENT/OPTIONS files are written privately
//! each time. Storage deletes a shared file when no retained checkpoint references it.
//! The local database is a working copy (no WAL): checkpoints are the durability.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use rocksdb::checkpoint::Checkpoint;
use rocksdb::{BlockBasedOptions, Cache, Env, IteratorMode, Options, WriteBufferManager, WriteOptions, DB};

use super::backend::{entry_key_group, restored_encoding, KeyedStateBackend};
use super::{KeyGroupRange, DEFAULT_ROCKSDB_MEMORY_MB};
use crate::checkpoint::{BackendKind, FileHandle, FileScope, KeyedStateHandle, StateEncoding};
use crate::error::{CoreError, Result};
use crate::message::{CheckpointId, SnapshotKind};
use crate::storage::{SnapshotReader, SnapshotWriter};

/// Keyed state in a local RocksDB instance.
pub struct RocksDbBackend {
    range: KeyGroupRange,
    db: Option<DB>,
    dir: PathBuf,
    instance: String,
    write: WriteOptions,
    /// Local SST name -> its handle in shared storage.
    uploaded: HashMap<String, FileHandle>,
    /// The local SST names known to be in the shared storage snapshots are written to: uploaded
    /// by this backend, or found there. A restored snapshot's files may live elsewhere (another
    /// checkpoint location's `--from`, a range directory of a split job, a local directory
    /// moved to an object store): each is checked, and uploaded if missing, on first use.
    confirmed: HashSet<String>,
    /// How values and map keys are encoded (the restored state's; postcard for new state).
    encoding: StateEncoding,
}

impl std::fmt::Debug for RocksDbBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksDbBackend")
            .field("range", &self.range)
            .field("dir", &self.dir)
            .finish()
    }
}

fn new_instance() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The memory all RocksDB instances of one job in one process share: one block cache holding
/// data blocks, index and filter blocks, with the write buffers (memtables) charged to it, so the
/// state's memory is this budget whatever the state's size (Flink's managed memory for RocksDB).
/// Without it each instance had its own cache and write buffers, and index blocks outside any
/// cache: resident memory grew with the state.
#[derive(Clone)]
pub struct RocksDbMemory {
    cache: Cache,
    buffers: WriteBufferManager,
    bytes: usize,
}

impl std::fmt::Debug for RocksDbMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksDbMemory").field("bytes", &self.bytes).finish()
    }
}

impl RocksDbMemory {
    /// A budget of `bytes` for the block cache, the write buffers charged to it; the write
    /// buffers are flushed once they pass half of it (a soft limit: writes never stall on it).
    pub fn new(bytes: u64) -> Self {
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        let cache = Cache::new_lru_cache(bytes);
        let buffers = WriteBufferManager::new_write_buffer_manager_with_cache(bytes / 2, false, cache.clone());
        bottom_compaction_thread();
        RocksDbMemory { cache, buffers, bytes }
    }

    /// The budget in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes of the budget in use (cached blocks and the write buffers charged to it).
    pub fn usage(&self) -> usize {
        self.cache.get_usage()
    }

    /// The process's default budget (tests and programs that do not set one).
    pub fn shared_default() -> Self {
        static DEFAULT: std::sync::OnceLock<RocksDbMemory> = std::sync::OnceLock::new();
        DEFAULT
            .get_or_init(|| RocksDbMemory::new(DEFAULT_ROCKSDB_MEMORY_MB << 20))
            .clone()
    }

    fn db_options(&self) -> Options {
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&self.cache);
        // A read of a key looks only into files whose filter may hold it: with checkpoints every
        // second flushing a new L0 file, a read without filters searched every one.
        table.set_bloom_filter(10.0, false);
        // Index and filter blocks in the cache (bounded), partitioned: a large SST's single
        // filter block (megabytes) does not fit a cache shard, so each read would load and
        // checksum it again; partitions of a few KiB are cached like data blocks, and only the
        // small top level of each file stays pinned.
        table.set_cache_index_and_filter_blocks(true);
        table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_partition_filters(true);
        table.set_metadata_block_size(4096);
        table.set_pin_top_level_index_and_filter(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        let mut o = Options::default();
        o.create_if_missing(true);
        o.set_max_background_jobs(2);
        o.set_block_based_table_factory(&table);
        o.set_write_buffer_manager(&self.buffers);
        // Universal compaction (sorted runs merged by size; all runs rewritten into one once the
        // newer runs' files add up to half the oldest run's). RocksDB's levelled default, with a
        // level-0 file flushed by every checkpoint and keys updated all over their range, rewrote
        // the whole level below at every compaction of the level-0 files: `exactly bench state`
        // at 10 M keys wrote ≈185 B to checkpoint storage per update, and compaction took the CPU
        // the updates needed, likely (88 k of 100 k a second, checkpoint p50 ≈0.7 s); universally,
        // 66–69 B, the updates kept up with, p50 ≈0.06 s. What it costs: the files of a running job
        // up to about 1.5 × those of a fully compacted state (more while a compaction is behind), the
        // checkpoints' stored files briefly more after each full rewrite (retained checkpoints
        // still reference the old ones), and room for the output of a full rewrite while it runs.
        // State written by levels (earlier builds) opens under it, and back.
        o.set_compaction_style(rocksdb::DBCompactionStyle::Universal);
        let mut universal = rocksdb::UniversalCompactOptions::default();
        universal.set_max_size_amplification_percent(50);
        o.set_universal_compaction_options(&universal);
        o
    }
}

/// Every instance in the process shares RocksDB's default environment (one per process) and its
/// one compaction thread; a universal compaction rewriting an instance's whole state would hold it
/// while the other instances' checkpoints add runs until their writes slow down. Compactions into
/// the bottom level (those) go to a second pool of one thread, set once for the process. Each
/// instance still runs one compaction at a time. Universal compaction also rewrites each
/// instance's state at least every 30 days (RocksDB's periodic compaction).
fn bottom_compaction_thread() {
    static SET: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    SET.get_or_init(|| {
        if let Ok(mut env) = Env::new() {
            env.set_bottom_priority_background_threads(1);
        }
    });
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CoreError + 'a {
    move |e| CoreError::io(action, path, e)
}

impl RocksDbBackend {
    /// An empty backend for `range`, with its working copy under `local_root`, in the process's
    /// default memory budget.
    pub fn new(range: KeyGroupRange, local_root: &Path) -> Result<Self> {
        Self::new_in(range, local_root, &RocksDbMemory::shared_default())
    }

    /// An empty backend for `range`, with its working copy under `local_root`, in `memory`.
    pub fn new_in(range: KeyGroupRange, local_root: &Path, memory: &RocksDbMemory) -> Result<Self> {
        let instance = new_instance();
        let dir = local_root.join(format!("rocksdb-{instance}"));
        crate::private_fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        let db = DB::open(&memory.db_options(), dir.join("db"))?;
        Ok(Self::wrap(range, db, dir, instance, HashMap::new()))
    }

    fn wrap(
        range: KeyGroupRange,
        db: DB,
        dir: PathBuf,
        instance: String,
        uploaded: HashMap<String, FileHandle>,
    ) -> Self {
        let mut write = WriteOptions::default();
        write.disable_wal(true);
        RocksDbBackend {
            range,
            db: Some(db),
            dir,
            instance,
            write,
            uploaded,
            confirmed: HashSet::new(),
            encoding: StateEncoding::default(),
        }
    }

    fn db(&self) -> &DB {
        self.db.as_ref().expect("open until dropped")
    }

    /// A backend for `range` from snapshot handles. One handle covering exactly `range` is
    /// restored by copying its files (and later snapshots keep sharing them); otherwise (rescaling)
    /// the entries of `range` are copied out of every intersecting handle.
    pub fn restore(
        range: KeyGroupRange,
        handles: &[(&KeyedStateHandle, &dyn SnapshotReader)],
        local_root: &Path,
    ) -> Result<Self> {
        Self::restore_in(range, handles, local_root, &RocksDbMemory::shared_default())
    }

    /// [`RocksDbBackend::restore`] in `memory`.
    pub fn restore_in(
        range: KeyGroupRange,
        handles: &[(&KeyedStateHandle, &dyn SnapshotReader)],
        local_root: &Path,
        memory: &RocksDbMemory,
    ) -> Result<Self> {
        for (h, _) in handles {
            if h.backend != BackendKind::RocksDb {
                return Err(CoreError::Config(format!(
                    "keyed state was written by the {:?} backend; restore it with that backend",
                    h.backend
                )));
            }
        }
        let encoding = restored_encoding(handles.iter().map(|(h, _)| *h))?;
        let relevant: Vec<_> = handles
            .iter()
            .filter(|(h, _)| h.key_groups.intersects(&range))
            .collect();
        if let [(handle, reader)] = relevant.as_slice() {
            if handle.key_groups == range {
                let instance = new_instance();
                let dir = local_root.join(format!("rocksdb-{instance}"));
                let db_dir = dir.join("db");
                crate::private_fs::create_dir_all(&db_dir).map_err(io("creating", &db_dir))?;
                let mut uploaded = HashMap::new();
                for file in &handle.files {
                    reader.download(file, &db_dir.join(&file.local_name))?;
                    if file.scope == FileScope::Shared {
                        uploaded.insert(file.local_name.clone(), file.clone());
                    }
                }
                let db = DB::open(&memory.db_options(), &db_dir)?;
                let mut backend = Self::wrap(range, db, dir, instance, uploaded);
                backend.encoding = encoding;
                return Ok(backend);
            }
        }
        let mut backend = RocksDbBackend::new_in(range, local_root, memory)?;
        backend.encoding = encoding;
        for (handle, reader) in relevant {
            let tmp = backend.dir.join(format!("import-{}", new_instance()));
            crate::private_fs::create_dir_all(&tmp).map_err(io("creating", &tmp))?;
            for file in &handle.files {
                reader.download(file, &tmp.join(&file.local_name))?;
            }
            {
                let source = DB::open_for_read_only(&memory.db_options(), &tmp, false)?;
                for item in source.iterator(IteratorMode::Start) {
                    let (k, v) = item?;
                    if range.contains(entry_key_group(&k)) {
                        backend.put(&k, &v)?;
                    }
                }
            }
            fs::remove_dir_all(&tmp).map_err(io("removing", &tmp))?;
        }
        Ok(backend)
    }
}

impl Drop for RocksDbBackend {
    fn drop(&mut self) {
        drop(self.db.take());
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl KeyedStateBackend for RocksDbBackend {
    fn key_groups(&self) -> KeyGroupRange {
        self.range
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.db().get(key)?)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        Ok(self.db().put_opt(key, value, &self.write)?)
    }

    fn delete(&mut self, key: &[u8]) -> Result<()> {
        Ok(self.db().delete_opt(key, &self.write)?)
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        for item in self
            .db()
            .iterator(IteratorMode::From(prefix, rocksdb::Direction::Forward))
        {
            let (k, v) = item?;
            if !k.starts_with(prefix) {
                break;
            }
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    fn snapshot(
        &mut self,
        id: CheckpointId,
        _kind: SnapshotKind,
        name: &str,
        writer: &dyn SnapshotWriter,
    ) -> Result<KeyedStateHandle> {
        self.db().flush()?;
        let tmp = self.dir.join(format!("chk-{id}"));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io("removing", &tmp))?;
        }
        Checkpoint::new(self.db())?.create_checkpoint(&tmp)?;
        let mut files = Vec::new();
        let mut entries: Vec<_> = fs::read_dir(&tmp)
            .map_err(io("listing", &tmp))?
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(io("listing", &tmp))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let local = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if local.ends_with(".sst") {
                let handle = match self.uploaded.get(&local) {
                    Some(h) if self.confirmed.contains(&local) => h.clone(),
                    // Restored: under the same shared name, a no-op where it already is.
                    Some(h) => {
                        let h = writer.upload_shared(&h.name, &local, &path)?;
                        self.confirmed.insert(local.clone());
                        h
                    }
                    None => {
                        let h = writer.upload_shared(&format!("{}-{local}", self.instance), &local, &path)?;
                        self.uploaded.insert(local.clone(), h.clone());
                        self.confirmed.insert(local.clone());
                        h
                    }
                };
                files.push(handle);
            } else {
                let bytes = fs::read(&path).map_err(io("reading", &path))?;
                let mut h = writer.write_private(&format!("{name}-{local}"), &bytes)?;
                h.local_name = local;
                files.push(h);
            }
        }
        fs::remove_dir_all(&tmp).map_err(io("removing", &tmp))?;
        // Files RocksDB compacted away are no longer needed by later snapshots.
        self.uploaded
            .retain(|local, _| files.iter().any(|f| &f.local_name == local));
        let uploaded = &self.uploaded;
        self.confirmed.retain(|local| uploaded.contains_key(local));
        Ok(KeyedStateHandle {
            backend: BackendKind::RocksDb,
            key_groups: self.range,
            files,
            encoding: self.encoding,
        })
    }

    fn encoding(&self) -> StateEncoding {
        self.encoding
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Writes the value `b{batch}` to every `step`-th key of `0..keys` from `batch % step` on, and
    /// flushes it into a file of its own.
    fn write_flushed(db: &DB, batch: u32, keys: u32, step: u32, expected: &mut BTreeMap<Vec<u8>, Vec<u8>>) {
        for k in (batch % step..keys).step_by(step as usize) {
            let (key, value) = (format!("k{k:06}").into_bytes(), format!("b{batch}").into_bytes());
            db.put(&key, &value).unwrap();
            expected.insert(key, value);
        }
        db.flush().unwrap();
    }

    fn files_at(db: &DB, level: u32) -> u64 {
        db.property_int_value(&format!("rocksdb.num-files-at-level{level}"))
            .unwrap()
            .unwrap()
    }

    fn assert_holds(db: &DB, expected: &BTreeMap<Vec<u8>, Vec<u8>>, when: &str) {
        let found: BTreeMap<Vec<u8>, Vec<u8>> = db
            .iterator(IteratorMode::Start)
            .map(|item| item.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
            .collect();
        assert!(
            found == *expected,
            "{when}: {} entries, {} expected",
            found.len(),
            expected.len()
        );
    }

    /// State is now compacted universally (sorted runs merged by size); earlier builds compacted
    /// it by levels, and their checkpoints and savepoints hold files at level 0 and the bottom
    /// level. Such state must open under today's options, with every entry, and go on being
    /// compacted — universally: small runs merged into a level above the bottom, where levelled
    /// compaction would have moved them to the bottom level. And state in that universal layout
    /// must open under the levelled options of an earlier build (a rollback), with every entry.
    #[test]
    fn state_compacted_by_levels_opens_under_universal_compaction_and_back() {
        let memory = RocksDbMemory::new(16 << 20);
        let mut levelled = memory.db_options();
        levelled.set_compaction_style(rocksdb::DBCompactionStyle::Level);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let mut expected = BTreeMap::new();
        {
            let db = DB::open(&levelled, &path).unwrap();
            write_flushed(&db, 0, 30_000, 1, &mut expected);
            db.compact_range(None::<&[u8]>, None::<&[u8]>);
            for batch in 1..3 {
                write_flushed(&db, batch, 30_000, 300, &mut expected);
            }
            assert!(
                files_at(&db, 0) == 2 && files_at(&db, 6) >= 1,
                "files at level 0 and the bottom level"
            );
        }
        {
            let db = DB::open(&memory.db_options(), &path).unwrap();
            assert_holds(&db, &expected, "levelled state opened under universal compaction");
            // Runs far smaller than the bottom one: merged by count, not into the bottom level.
            for batch in 3..13 {
                write_flushed(&db, batch, 30_000, 300, &mut expected);
            }
            db.wait_for_compact(&rocksdb::WaitForCompactOptions::default()).unwrap();
            let above_bottom: u64 = (1..6).map(|level| files_at(&db, level)).sum();
            assert!(
                above_bottom >= 1 && files_at(&db, 0) < 12,
                "small runs merged above the bottom level (universal compaction): {} files at level 0, {above_bottom} at levels 1-5",
                files_at(&db, 0)
            );
            assert_holds(&db, &expected, "after universal compactions");
        }
        let db = DB::open(&levelled, &path).unwrap();
        assert_holds(&db, &expected, "universally compacted state opened by levels");
        write_flushed(&db, 13, 30_000, 300, &mut expected);
        db.compact_range(None::<&[u8]>, None::<&[u8]>);
        assert_holds(&db, &expected, "after compacting it by levels");
    }
}
