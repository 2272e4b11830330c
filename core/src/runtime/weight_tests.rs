//! The alignment buffer's byte limit weighs records as their source says: a source of large
//! records whose barrier alignment would hold back more than `max_alignment_buffer_bytes` has
//! that checkpoint aborted, not the memory exhausted.

use std::time::Duration;

use super::*;
use crate::coordinator::CheckpointConfig;

/// Subtask 0 emits a 128 KiB record every 2 ms; subtask 1 emits nothing and returns from each
/// poll after 300 ms, so its barrier arrives late and subtask 0's records are held back.
struct Heavy {
    index: u32,
}

impl Source<Vec<u8>> for Heavy {
    async fn poll_next(&mut self, out: &mut Vec<Vec<u8>>) -> crate::Result<SourceStatus> {
        if self.index == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
            out.push(vec![7; 128 * 1024]);
            Ok(SourceStatus::More)
        } else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(SourceStatus::Idle)
        }
    }

    fn record_size(record: &Vec<u8>) -> usize {
        std::mem::size_of::<Vec<u8>>() + record.len()
    }
}

/// Discards what it is given.
struct Discard;

impl Sink<Vec<u8>> for Discard {
    async fn write(&mut self, _records: Vec<Vec<u8>>) -> crate::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_records_held_back_by_alignment_count_their_payload_against_the_byte_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut checkpoint = CheckpointConfig::new(dir.path().join("checkpoints"));
    checkpoint.interval = Duration::from_millis(100);
    // Counted in messages this limit would never act: only the byte limit (1 MiB, 8 records of
    // this source) can abort a checkpoint here.
    checkpoint.max_alignment_buffer = usize::MAX;
    checkpoint.max_alignment_buffer_bytes = 1024 * 1024;
    let mut config = JobConfig::new("heavy");
    config.checkpointing = Some(checkpoint);
    let mut job = JobBuilder::new(config);
    job.source("heavy", 2, |info: &SubtaskInfo| Heavy { index: info.index })
        .filter(|r| !r.is_empty())
        .rebalance(1)
        .sink("discard", |_: &SubtaskInfo| Discard);
    let handle = job.build().unwrap().start();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while handle.metrics().checkpoints().failed == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = handle.metrics().checkpoints();
    handle.cancel();
    handle.join().await.unwrap();
    assert!(
        stats.failed > 0,
        "alignment held back many 128 KiB records against a 1 MiB limit and no checkpoint was \
         aborted (records weighed without their payload?): {stats:?}"
    );
}
