//! The RocksDB backend in a job: what a checkpoint reports it wrote, one memory budget for every
//! instance.

use super::*;

/// Each completed checkpoint reports the bytes it wrote to checkpoint storage: with RocksDB,
/// exactly the files its metadata references that the checkpoint before did not (new SST files,
/// the small private ones), not the whole state.
#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_reports_the_bytes_it_wrote_not_the_whole_state() {
    use crate::checkpoint::FileScope;
    use crate::storage::{CheckpointStorage, Storage};
    use std::collections::HashSet;
    let dir = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let mut cfg = config(
        dir.path(),
        StateBackendConfig::RocksDb {
            local_dir: Some(local.path().to_path_buf()),
            memory_mb: None,
        },
    );
    cfg.checkpointing.as_mut().expect("on").retained = 10_000;
    let job = word_count(
        cfg,
        20_000,
        1,
        1,
        FailPlan::new(0),
        Arc::default(),
        Duration::from_micros(200),
    );
    let handle = job.start();
    let metrics = handle.metrics();
    handle.join().await.unwrap();
    let stats = metrics.checkpoints();
    assert_eq!(stats.written.len(), stats.durations.len());
    let storage = Storage::new(dir.path().join("checkpoints")).unwrap();
    let ids = storage.completed().unwrap();
    assert_eq!(ids.len(), stats.written.len(), "every completed checkpoint retained");
    assert!(ids.len() >= 3, "a few checkpoints: {}", ids.len());
    let mut before: HashSet<String> = HashSet::new();
    let mut smaller = 0;
    for (id, written) in ids.iter().zip(&stats.written) {
        let meta = storage.open(*id).unwrap().meta;
        let new: u64 = meta
            .files()
            .filter(|f| f.scope == FileScope::Private || !before.contains(&f.name))
            .map(|f| f.size)
            .sum();
        assert_eq!(*written, new, "checkpoint {id}");
        if new < meta.files().map(|f| f.size).sum::<u64>() {
            smaller += 1;
        }
        before = meta
            .files()
            .filter(|f| f.scope == FileScope::Shared)
            .map(|f| f.name.clone())
            .collect();
    }
    assert!(smaller > 0, "some checkpoint wrote less than its state");
    assert_eq!(stats.last_written, *stats.written.last().unwrap());
}

/// Every RocksDB instance of a job in one process draws on one memory budget: the backend
/// factory is made per task, and when each made its own budget, two subtasks held two block
/// caches of the configured size (`bench state` showed resident memory growing by twice the
/// budget and two caches in RocksDB's log). Writes through backends of two factories both show in
/// the job's one budget.
#[cfg(feature = "rocksdb")]
#[test]
fn every_rocksdb_instance_of_a_job_shares_its_memory_budget() {
    let local = tempfile::tempdir().unwrap();
    let mut cfg = JobConfig::new("budget");
    cfg.state_backend = StateBackendConfig::RocksDb {
        local_dir: Some(local.path().to_path_buf()),
        memory_mb: Some(64),
    };
    let job = word_count(cfg, 1, 1, 2, FailPlan::new(0), Arc::default(), Duration::ZERO);
    let mut backends = Vec::new();
    for index in 0..2 {
        let factory = job.backend_factory(None);
        let mut b = factory(&SubtaskInfo::new("count", index, 2), None).unwrap();
        // 4 MiB of values: in the write buffer, charged to the budget.
        for k in 0..1024u32 {
            b.put(&k.to_be_bytes(), &[7u8; 4096]).unwrap();
        }
        backends.push(b);
    }
    let memory = job.rocksdb_memory.get().expect("made for the first backend");
    assert_eq!(memory.bytes(), 64 << 20);
    // Each instance's write buffer is charged in whole reservations of its arena; both are in
    // the one budget.
    assert!(
        memory.usage() >= 7 << 20,
        "usage {} of one budget for two instances",
        memory.usage()
    );
}
