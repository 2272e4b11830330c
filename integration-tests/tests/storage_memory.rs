//! A checkpoint's RocksDB files are streamed to and from checkpoint storage, a piece at a time:
//! the memory an upload or a restore's download holds does not grow with the file (a RocksDB
//! file of a large state is tens to hundreds of megabytes, and several subtasks upload at once).
//! Measured with a counting allocator (peak_alloc) — this test binary's own, so one test only — in a local
//! directory and in the S3 object store `scripts/services` starts (a multipart upload).

use std::io::Write;

use anyhow::{ensure, Result};
use exactly_core::storage::{CheckpointStorage, Storage};
use exactly_integration_tests::{unique, TestEnv};
use peak_alloc::PeakAlloc;

#[global_allocator]
static COUNTING: PeakAlloc = PeakAlloc;

/// The peak starts again from what is allocated now; returns that.
fn reset() -> usize {
    COUNTING.reset_peak_usage();
    COUNTING.current_usage()
}

/// How far the peak rose above `base` since the [`reset`].
fn rise(base: usize) -> usize {
    COUNTING.peak_usage().saturating_sub(base)
}

/// The file: 64 MiB and a bit (not a whole number of pieces or parts), not all one byte.
const SIZE: usize = (64 << 20) + 12_345;

/// What an upload or a download may hold above what was allocated before it: well under the
/// file (reading it whole held the file, twice over for the object store).
const BOUND: usize = 24 << 20;

fn write_file(path: &std::path::Path) -> Result<Vec<u8>> {
    let mut f = std::fs::File::create(path)?;
    let mut all = Vec::with_capacity(SIZE);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while all.len() < SIZE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        all.extend_from_slice(&x.to_le_bytes());
    }
    all.truncate(SIZE);
    f.write_all(&all)?;
    f.sync_all()?;
    Ok(all)
}

/// Uploads `src` as a shared file of checkpoint 1 of `storage`, commits it, downloads it again;
/// exports it as a savepoint; the rise of the peak during the upload and the most during the
/// download or the export.
fn round_trip(storage: &Storage, src: &std::path::Path, dest: &std::path::Path) -> Result<(usize, usize)> {
    let w = storage.writer(1)?;
    let base = reset();
    let handle = w.upload_shared("big.sst", "big.sst", src)?;
    let up = rise(base);
    ensure!(handle.size == SIZE as u64, "uploaded {} bytes", handle.size);
    let meta = exactly_core::checkpoint::CheckpointMetadata {
        version: exactly_core::checkpoint::METADATA_VERSION,
        job: "j".into(),
        id: 1,
        kind: exactly_core::SnapshotKind::Checkpoint,
        timestamp_ms: 0,
        completed_ms: 0,
        operators: [(
            "op".to_owned(),
            exactly_core::checkpoint::OperatorSnapshot {
                parallelism: 1,
                max_parallelism: 128,
                subtasks: vec![exactly_core::checkpoint::SubtaskSnapshot {
                    keyed: Some(exactly_core::checkpoint::KeyedStateHandle {
                        backend: exactly_core::checkpoint::BackendKind::RocksDb,
                        key_groups: exactly_core::state::KeyGroupRange::new(0, 127),
                        files: vec![handle.clone()],
                        encoding: exactly_core::checkpoint::StateEncoding::Postcard,
                    }),
                    ..Default::default()
                }],
            },
        )]
        .into_iter()
        .collect(),
    };
    storage.commit(&meta)?;
    let snapshot = storage.latest()?.expect("checkpoint 1");
    let base = reset();
    snapshot.reader.download(&handle, dest)?;
    let down = rise(base);
    // A savepoint exported from it passes the file through the same way.
    let savepoint = dest.with_extension("savepoint");
    let base = reset();
    storage.export(1, &savepoint)?;
    let export = rise(base);
    ensure!(
        std::fs::metadata(savepoint.join("shared-big.sst"))?.len() == SIZE as u64,
        "the savepoint holds the file"
    );
    std::fs::remove_dir_all(&savepoint)?;
    Ok((up, down.max(export)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocksdb_files_are_streamed_to_and_from_checkpoint_storage() -> Result<()> {
    let env = TestEnv::get().await?;
    let s3 = env.s3()?;
    let dir = tempfile::tempdir()?;
    let src = dir.path().join("src.sst");
    let content = write_file(&src)?;
    let local = Storage::new(dir.path().join("checkpoints"))?;
    let remote = Storage::new(s3.url(&unique("streamed")))?;
    for (place, storage) in [("a local directory", &local), ("the S3 object store", &remote)] {
        let dest = dir.path().join("restored.sst");
        let (up, down) = tokio::task::block_in_place(|| round_trip(storage, &src, &dest))?;
        ensure!(
            std::fs::read(&dest)? == content,
            "{place}: the file came back different"
        );
        ensure!(
            up < BOUND && down < BOUND,
            "{place}: uploading a {SIZE}-byte file held {up} bytes more at its peak, downloading or exporting it {down} (bound {BOUND})"
        );
        eprintln!("{place}: peak rise uploading {up} bytes, downloading or exporting {down}");
        std::fs::remove_file(&dest)?;
    }
    Ok(())
}
