//! What a job restores: a corrupt or vanished newest checkpoint, an older savepoint, the same
//! restore twice, state restored from another location, a location taken over.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_newest_checkpoint_stops_the_job_instead_of_replaying_from_an_older_one() {
    let dir = tempfile::tempdir().unwrap();
    let committed: Committed = Arc::default();
    let job = word_count(
        config(dir.path(), StateBackendConfig::Memory),
        20_000,
        1,
        1,
        FailPlan::new(0),
        committed.clone(),
        Duration::from_millis(2),
    );
    let handle = job.start();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let newest = handle.stop().await.unwrap();
    handle.join().await.unwrap();
    let before = committed_rows(&committed).len();
    assert!(before > 0);
    // One flipped byte in the newest checkpoint's metadata.
    let md = newest.join("_metadata");
    let mut bytes = std::fs::read(&md).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&md, bytes).unwrap();

    let job = word_count(
        config(dir.path(), StateBackendConfig::Memory),
        20_000,
        1,
        1,
        FailPlan::new(0),
        committed.clone(),
        Duration::ZERO,
    );
    let err = job.run().await.unwrap_err();
    // Its sink keeps no record of what it committed: it cannot show that restoring the previous
    // checkpoint is safe.
    assert!(matches!(err, CoreError::FallbackNotProven { .. }), "{err}");
    assert!(err.to_string().contains("metadata checksum mismatch"), "{err}");
    assert_eq!(committed_rows(&committed).len(), before, "nothing written again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_directory_whose_checkpoints_vanished_refuses_to_start_from_the_beginning() {
    let dir = tempfile::tempdir().unwrap();
    let committed: Committed = Arc::default();
    let run = |committed: Committed| {
        word_count(
            config(dir.path(), StateBackendConfig::Memory),
            2_000,
            1,
            1,
            FailPlan::new(0),
            committed,
            Duration::ZERO,
        )
    };
    run(committed.clone()).run().await.unwrap();
    for entry in std::fs::read_dir(dir.path().join("checkpoints")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_str().unwrap().starts_with("chk-") {
            std::fs::remove_dir_all(path).unwrap();
        }
    }
    let again: Committed = Arc::default();
    let err = run(again.clone()).run().await.unwrap_err();
    assert!(matches!(err, CoreError::CheckpointsVanished(_)), "{err}");
    assert!(committed_rows(&again).is_empty(), "nothing written again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_older_savepoint_needs_accept_replay_and_then_wins_over_newer_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let total = 20_000;
    let committed: Committed = Arc::default();
    let job = word_count(
        config(dir.path(), StateBackendConfig::Memory),
        total,
        1,
        1,
        FailPlan::new(0),
        committed.clone(),
        Duration::from_millis(1),
    );
    let handle = job.start();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let savepoint = handle.savepoint(dir.path().join("savepoints")).await.unwrap();
    // The job goes on to the end of its input: newer checkpoints follow the savepoint.
    handle.join().await.unwrap();
    assert_exact(&committed, total);

    let again = |accept_replay: bool, committed: Committed| {
        let mut cfg = config(dir.path(), StateBackendConfig::Memory);
        cfg.restore_from = Some(savepoint.clone());
        cfg.accept_replay = accept_replay;
        word_count(cfg, total, 1, 1, FailPlan::new(0), committed, Duration::ZERO)
    };
    let refused: Committed = Arc::default();
    let err = again(false, refused.clone()).run().await.unwrap_err();
    assert!(matches!(err, CoreError::RestoreOlderThanNewest { .. }), "{err}");
    assert!(err.to_string().contains("--accept-replay"), "{err}");
    assert!(committed_rows(&refused).is_empty());

    // Accepted: the savepoint is restored (counts continue from its state, so none starts at 1,
    // and the input after it is read again), not the newest checkpoint (which would add nothing).
    let replayed: Committed = Arc::default();
    again(true, replayed.clone()).run().await.unwrap();
    let rows = committed_rows(&replayed);
    assert!(
        !rows.is_empty(),
        "the savepoint's position was restored, not the end of input"
    );
    assert!(
        rows.len() < total as usize,
        "not from the beginning: {} rows",
        rows.len()
    );
    // And a restart of that job later restores its own checkpoints, not those from before.
    // (Started again with the same snapshot, a job continues from the checkpoints made since;
    // restoring it once more on purpose means clearing the location's record of that restore.)
    std::fs::remove_file(dir.path().join("checkpoints").join("_restore")).unwrap();
    let mut cfg = config(dir.path(), StateBackendConfig::Memory);
    cfg.restore_from = Some(savepoint.clone());
    cfg.accept_replay = true;
    let fail = FailPlan::new(1);
    let restarted: Committed = Arc::default();
    let outcome = word_count(
        cfg,
        total,
        1,
        1,
        fail.clone(),
        restarted.clone(),
        Duration::from_millis(1),
    )
    .run()
    .await
    .unwrap();
    assert_eq!(fail.remaining.load(Ordering::SeqCst), 0, "the failure happened");
    assert!(outcome.restarts >= 1);
    let mut rows = committed_rows(&restarted);
    rows.sort();
    let before = rows.len();
    rows.dedup();
    assert_eq!(rows.len(), before, "the restarted attempt did not write anything twice");
    assert_eq!(
        rows.len(),
        committed_rows(&replayed).len(),
        "same output as the failure-free replay"
    );
}

/// A process started again with the same `--from` (a pod whose `FROM` is still set) continues from
/// the checkpoints it made since that restore, not from the snapshot (which would write again what
/// they committed) and not with an error (which asked for `--accept-replay`: a replay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_restore_twice_continues_from_the_checkpoints_made_since() {
    let dir = tempfile::tempdir().unwrap();
    let total = 20_000;
    let committed: Committed = Arc::default();
    let job = word_count(
        config(dir.path(), StateBackendConfig::Memory),
        total,
        1,
        1,
        FailPlan::new(0),
        committed.clone(),
        Duration::from_millis(1),
    );
    let handle = job.start();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let savepoint = handle.savepoint(dir.path().join("savepoints")).await.unwrap();
    handle.join().await.unwrap();

    // A new deployment with its own checkpoint directory starts from the savepoint, twice.
    let moved = tempfile::tempdir().unwrap();
    let from_savepoint = |committed: Committed| {
        let mut cfg = config(moved.path(), StateBackendConfig::Memory);
        cfg.restore_from = Some(savepoint.clone());
        word_count(cfg, total, 1, 1, FailPlan::new(0), committed, Duration::ZERO)
    };
    let first: Committed = Arc::default();
    from_savepoint(first.clone()).run().await.unwrap();
    let rows = committed_rows(&first);
    assert!(!rows.is_empty() && rows.len() < total as usize, "{} rows", rows.len());
    let second: Committed = Arc::default();
    from_savepoint(second.clone()).run().await.unwrap();
    assert_only_recommitted(&first, &second);
}

/// RocksDB state restored from another checkpoint location (`--from /backup/chk-N`, a local
/// directory moved to an object store): the restored SST files live there, not in the job's own
/// location, so the job's checkpoints must not merely reference them — once the other location is
/// gone, its own newest checkpoint must still restore. Before, the restored files counted as
/// already uploaded, and the restart after the old location went failed ("missing").
#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocksdb_state_restored_from_another_location_is_copied_into_the_jobs_own() {
    use crate::storage::{CheckpointStorage, Storage};
    let local = tempfile::tempdir().unwrap();
    let backend = || StateBackendConfig::RocksDb {
        local_dir: Some(local.path().to_path_buf()),
        memory_mb: None,
    };
    let other = tempfile::tempdir().unwrap();
    // Only the checkpoint at the end of input: one SST a run, never enough for a compaction.
    let backend_config = |dir: &std::path::Path| {
        let mut c = config(dir, backend());
        c.checkpointing.as_mut().expect("on").interval = Duration::from_secs(3600);
        c
    };
    let run = |cfg: JobConfig, total: u64, committed: Committed| {
        word_count(cfg, total, 1, 1, FailPlan::new(0), committed, Duration::ZERO).run()
    };
    let first: Committed = Arc::default();
    run(config(other.path(), backend()), 1_000, first.clone())
        .await
        .unwrap();
    let storage = Storage::new(other.path().join("checkpoints")).unwrap();
    let newest = *storage.completed().unwrap().last().unwrap();
    let shared_names = |s: &crate::storage::Snapshot| -> Vec<String> {
        s.meta
            .files()
            .filter(|f| f.scope == crate::checkpoint::FileScope::Shared)
            .map(|f| f.name.clone())
            .collect()
    };
    assert!(
        !shared_names(&storage.open(newest).unwrap()).is_empty(),
        "shared SST files to restore"
    );

    let own = tempfile::tempdir().unwrap();
    let mut cfg = backend_config(own.path());
    cfg.restore_from = Some(storage.checkpoint_dir(newest));
    // A few records more, and few files restored: RocksDB compacts none of them away.
    let second: Committed = Arc::default();
    run(cfg, 1_050, second.clone()).await.unwrap();
    assert!(
        !committed_rows(&second).is_empty(),
        "went on from the restored position"
    );
    let own_storage = Storage::new(own.path().join("checkpoints")).unwrap();
    let latest = own_storage
        .latest()
        .expect("the job's own newest checkpoint restores")
        .unwrap();
    let restored = shared_names(&storage.open(newest).unwrap());
    assert!(
        shared_names(&latest).iter().any(|n| restored.contains(n)),
        "the newest checkpoint still uses a restored file (else this test shows nothing)"
    );
    // The other location goes (a backup deleted, an old directory cleared).
    std::fs::remove_dir_all(other.path()).unwrap();
    for f in latest.meta.files() {
        latest.reader.read(f).unwrap();
    }
    assert_eq!(own_storage.latest().unwrap().unwrap().meta.id, latest.meta.id);
    let third: Committed = Arc::default();
    run(backend_config(own.path()), 1_050, third.clone()).await.unwrap();
    assert_only_recommitted(&second, &third);
}

/// A run whose checkpoint location another run took over (its owner record names another run)
/// stops at its next checkpoint with a fatal error naming the other run, and makes no further
/// checkpoint durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_location_was_taken_over_stops_at_its_next_checkpoint() {
    use crate::storage::{CheckpointStorage, Storage};
    let dir = tempfile::tempdir().unwrap();
    let job = word_count(
        config(dir.path(), StateBackendConfig::Memory),
        1_000_000,
        1,
        1,
        FailPlan::new(0),
        Arc::default(),
        Duration::from_millis(1),
    );
    let run = job.start();
    let storage = Storage::new(dir.path().join("checkpoints")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while storage.completed().unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no checkpoint");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("checkpoints/_owner")).unwrap()).unwrap();
    record["id"] = "a-later-run".into();
    record["host"] = "another-host".into();
    // Into place atomically, as a claim is written: the run may read it at any moment.
    let tmp = dir.path().join("checkpoints/_owner.test");
    std::fs::write(&tmp, serde_json::to_vec(&record).unwrap()).unwrap();
    std::fs::rename(&tmp, dir.path().join("checkpoints/_owner")).unwrap();
    let taken_over = storage.completed().unwrap().len();
    let err = tokio::time::timeout(Duration::from_secs(30), run.join())
        .await
        .expect("the run stops")
        .unwrap_err();
    assert!(
        matches!(err, CoreError::LocationOwned { ref reason, .. } if reason.contains("another-host")),
        "{err}"
    );
    assert_eq!(err.class(), ErrorClass::Fatal);
    // At most the one whose check had passed when the record changed.
    assert!(storage.completed().unwrap().len() <= taken_over + 1);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&std::fs::read(dir.path().join("checkpoints/_owner")).unwrap())
            .unwrap()["id"],
        "a-later-run",
        "the other run's record is left alone"
    );
}
