//! State: keyed state backends (in memory, RocksDB), typed state handles, key groups, and the
//! redistribution of operator state when parallelism changes.

mod backend;
mod key_groups;
mod memory;
mod operator_state;
#[cfg(feature = "rocksdb")]
mod rocks;

pub use backend::{KeyedContext, KeyedStateBackend, ListState, MapState, ValueState};
pub use key_groups::{hash_key, key_group, subtask_for_key_group, KeyGroupRange, DEFAULT_MAX_PARALLELISM};
pub use memory::MemoryBackend;
pub use operator_state::{redistribute, RestoredState};
#[cfg(feature = "rocksdb")]
pub use rocks::{RocksDbBackend, RocksDbMemory};

/// The default memory (MiB) that the RocksDB instances of a job share in one process
/// (`StateBackendConfig::RocksDb::memory_mb`). Small on purpose: the process's resident memory
/// runs well above the budget (glibc keeps what RocksDB frees). At 10 M keys (`exactly bench
/// state`) 64 MiB peaked at 284–338 MiB, 256 MiB at 592–699, RocksDB's own per-instance
/// defaults at 234; jobs with large state raise it.
pub const DEFAULT_ROCKSDB_MEMORY_MB: u64 = 64;

#[cfg(test)]
mod tests;
