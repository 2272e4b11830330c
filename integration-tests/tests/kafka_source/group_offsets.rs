//! Offsets committed to the consumer group only on completed checkpoints, one commit at a time.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_offsets_advance_only_when_a_checkpoint_completes() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-group");
    create_topic_with(env, &topic, 1, OLD_TIMESTAMPS).await?;
    produce_timed(env, &topic, 1_700_000_000_000)?;
    let group = unique("g");
    let dir = tempfile::tempdir()?;
    let source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], &group);
    // No periodic checkpoint in this test's lifetime.
    let config = job_config(dir.path(), Duration::from_secs(3600));

    let seen_first: Committed<KafkaRecord> = Arc::default();
    let staged = Arc::new(std::sync::Mutex::new(0usize));
    let h = {
        let mut job = JobBuilder::new(config.clone());
        let s2 = staged.clone();
        job.source("kafka", 1, {
            let source = source.clone();
            move |_| KafkaSource::new(source.clone(), RawBytes)
        })
        .map(move |r: KafkaRecord| {
            *s2.lock().unwrap() += 1;
            r
        })
        .sink("collect", {
            let out = seen_first.clone();
            move |_| CommittingCollector::new(out.clone())
        });
        job.build()?.start()
    };
    eventually("all ten read", T, || *staged.lock().unwrap() == 10).await?;
    assert_eq!(
        group_offset(env, &group, &topic)?,
        Offset::Invalid,
        "read, but no checkpoint completed"
    );
    // Crash before any checkpoint completes: group offsets unchanged, the next run re-reads.
    h.cancel();
    h.join().await?;
    assert_eq!(group_offset(env, &group, &topic)?, Offset::Invalid);
    assert_eq!(count(&seen_first), 0, "nothing was committed by the cancelled run");

    let out: Committed<KafkaRecord> = Arc::default();
    let read_again = Arc::new(std::sync::Mutex::new(0usize));
    let h = {
        let mut job = JobBuilder::new(config);
        let r2 = read_again.clone();
        job.source("kafka", 1, move |_| KafkaSource::new(source.clone(), RawBytes))
            .map(move |r: KafkaRecord| {
                *r2.lock().unwrap() += 1;
                r
            })
            .sink("collect", {
                let out = out.clone();
                move |_| CommittingCollector::new(out.clone())
            });
        job.build()?.start()
    };
    eventually("all ten read again", T, || *read_again.lock().unwrap() == 10).await?;
    h.stop().await?; // final checkpoint: completes, commits offsets
    h.join().await?;
    assert_eq!(values(&out).len(), 10, "the restarted job re-read from the beginning");
    eventually("group offset 10", T, || {
        matches!(group_offset(env, &group, &topic), Ok(Offset::Offset(10)))
    })
    .await?;
    Ok(())
}

/// Each completed checkpoint's offsets go to the group — not only the first's — and the commit
/// does not hold the source: it is sent, and its result served by the polls that follow (it was a
/// synchronous round trip on the source's task, which a group coordinator that stopped
/// answering held for a minute). One commit is on its way at a time: a checkpoint completed
/// meanwhile is committed after it, never before. Every commit is counted, and the per-partition
/// figures show what the group holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_offsets_follow_every_completed_checkpoint_one_commit_at_a_time() -> Result<()> {
    use exactly_core::runtime::{SnapshotContext, Source};
    let env = TestEnv::get().await?;
    let topic = unique("src-commits");
    create_topic(env, &topic, 1).await?;
    let group = unique("g");
    let config = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], &group);
    let mut source = started(config, &subtask_info("commits"), None).await?;
    let metrics = source.metrics();
    // Checkpoint `id` of what the source has read, completed.
    async fn checkpoint(source: &mut KafkaSource<KafkaRecord, RawBytes>, id: u64) -> Result<()> {
        let mut ctx = SnapshotContext::new(id, exactly_core::SnapshotKind::Checkpoint, 0);
        source.snapshot_state(&mut ctx).await?;
        ctx.finish_deferred().await?;
        source.notify_checkpoint_complete(id).await?;
        Ok(())
    }
    let mut commits = 0;
    for round in 1..=3u64 {
        let label = format!("r{round}-");
        produce(env, &topic, &labelled(&label, 5))?;
        assert_eq!(read_values(&mut source, 5).await?, values_of(&label, 5));
        checkpoint(&mut source, round).await?;
        commits += 1;
        wait_committed(env, &mut source, &group, &topic, 5 * round as i64, commits).await?;
    }
    // Two checkpoints complete before any poll: the first's commit is on its way (its result is
    // served only by a poll), so the second's waits and goes after it.
    produce(env, &topic, &labelled("r4-", 5))?;
    assert_eq!(read_values(&mut source, 5).await?, values_of("r4-", 5));
    checkpoint(&mut source, 4).await?;
    produce(env, &topic, &labelled("r5-", 5))?;
    assert_eq!(read_values(&mut source, 5).await?, values_of("r5-", 5));
    checkpoint(&mut source, 5).await?;
    commits += 2;
    wait_committed(env, &mut source, &group, &topic, 25, commits).await?;
    assert_eq!(metrics.commits_failed(), 0);
    // Two completions again, and the source dropped at once (a job stopping after its final
    // checkpoint): the waiting commit is sent then, and the group holds the last checkpoint's
    // offsets.
    // Both snapshots first, then both completions with no poll between: 7's commit waits.
    produce(env, &topic, &labelled("r6-", 5))?;
    assert_eq!(read_values(&mut source, 5).await?, values_of("r6-", 5));
    let mut six = SnapshotContext::new(6, exactly_core::SnapshotKind::Checkpoint, 0);
    source.snapshot_state(&mut six).await?;
    six.finish_deferred().await?;
    produce(env, &topic, &labelled("r7-", 5))?;
    assert_eq!(read_values(&mut source, 5).await?, values_of("r7-", 5));
    let mut seven = SnapshotContext::new(7, exactly_core::SnapshotKind::Checkpoint, 0);
    source.snapshot_state(&mut seven).await?;
    seven.finish_deferred().await?;
    source.notify_checkpoint_complete(6).await?;
    source.notify_checkpoint_complete(7).await?;
    drop(source);
    assert_eq!(group_offset(env, &group, &topic)?, Offset::Offset(35));
    Ok(())
}

/// Polls `source` (serving its commits' results) until the group holds `offset` for partition 0
/// of `topic` and the source counted `commits` successful commits, whose figures show `offset`.
async fn wait_committed(
    env: &TestEnv,
    source: &mut KafkaSource<KafkaRecord, RawBytes>,
    group: &str,
    topic: &str,
    offset: i64,
    commits: u64,
) -> Result<()> {
    use exactly_core::runtime::Source;
    let metrics = source.metrics();
    let until = std::time::Instant::now() + T;
    let mut more = Vec::new();
    loop {
        source.poll_next(&mut more).await?;
        let held = group_offset(env, group, topic)?;
        let counted = metrics.commits_succeeded();
        let shown = metrics.partitions().values().next().and_then(|p| p.committed);
        if held == Offset::Offset(offset) && counted == commits && shown == Some(offset) {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the group holds {held:?}, {counted} commits counted, the figures show {shown:?}; expected offset {offset} after {commits} commits"
        );
    }
    assert!(more.is_empty(), "read more than was written: {}", more.len());
    Ok(())
}
