//! Where the source starts and resumes: every start position, restored offsets winning over it,
//! records lost to retention, a start at the end, topics deleted and recreated, positions beyond
//! the end.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_start_position_and_restored_offsets_winning_over_it() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-start");
    create_topic_with(env, &topic, 1, OLD_TIMESTAMPS).await?;
    let base = 1_700_000_000_000;
    produce_timed(env, &topic, base)?;
    let all: Vec<String> = (0..10).map(|i| format!("v{i}")).collect();

    assert_eq!(run_until(env, &topic, StartPosition::Earliest, 10).await?, all);
    assert_eq!(
        run_until(env, &topic, StartPosition::Timestamp { ms: base + 5000 }, 5).await?,
        all[5..]
    );
    let specific = StartPosition::Specific {
        offsets: [(format!("{topic}:0"), 4)].into(),
        reset: ResetPosition::None,
    };
    assert_eq!(run_until(env, &topic, specific, 6).await?, all[4..]);

    // Group offsets: commit 7 for the group first.
    let group = unique("g-committed");
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .set("group.id", &group)
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Offset(7))?;
    c.commit(&tpl, CommitMode::Sync)?;
    let dir = tempfile::tempdir()?;
    let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], &group);
    source.start = StartPosition::GroupOffsets {
        reset: ResetPosition::Earliest,
    };
    let out: Committed<KafkaRecord> = Arc::default();
    let h = start_job(
        job_config(dir.path(), Duration::from_millis(100)),
        source,
        1,
        out.clone(),
    );
    eventually("records", T, || count(&out) >= 3).await?;
    h.stop().await?;
    h.join().await?;
    assert_eq!(values(&out), all[7..]);

    // Latest: only records produced after the start; then restored offsets beat `latest`.
    let dir = tempfile::tempdir()?;
    let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    source.start = StartPosition::Latest;
    let out: Committed<KafkaRecord> = Arc::default();
    let h = start_job(
        job_config(dir.path(), Duration::from_millis(100)),
        source.clone(),
        1,
        out.clone(),
    );
    let mut n = 0;
    eventually("a record produced after the start", T, || {
        n += 1;
        produce(env, &topic, &[("k".into(), format!("new{n:03}"))]).expect("produce");
        count(&out) > 0
    })
    .await?;
    h.stop().await?;
    h.join().await?;
    let seen = values(&out);
    assert!(seen.iter().all(|v| v.starts_with("new")), "{seen:?}");
    let before_restart = seen.len();
    // Produced while the job is down: `latest` would skip these, the checkpoint does not.
    produce(
        env,
        &topic,
        &[("k".into(), "down-1".into()), ("k".into(), "down-2".into())],
    )?;
    let h = start_job(
        job_config(dir.path(), Duration::from_millis(100)),
        source,
        1,
        out.clone(),
    );
    eventually("records produced while down", T, || {
        values(&out).iter().filter(|v| v.starts_with("down")).count() == 2
    })
    .await?;
    h.stop().await?;
    h.join().await?;
    let seen = values(&out);
    let news = seen.iter().filter(|v| v.starts_with("new")).count();
    assert!(news >= before_restart && news <= n, "new records: {news}");
    let mut dedup = seen.clone();
    dedup.dedup();
    assert_eq!(dedup, seen, "nothing read twice");
    Ok(())
}

/// Records that retention deleted while the job was down are lost, and the source says so: the
/// restored source reads on from the partition's first offset, counts the offsets lost
/// (`lost_to_retention`) and logs an error (before, librdkafka's `earliest` reset jumped there
/// without a word). A given start offset beyond the partition's end is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_deleted_by_retention_while_the_job_was_down_are_counted_as_lost() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-retention");
    create_topic(env, &topic, 1).await?;
    let batch =
        |prefix: &str| -> Vec<(String, String)> { (0..10).map(|i| ("k".into(), format!("{prefix}{i}"))).collect() };
    produce(env, &topic, &batch("a"))?;
    let dir = tempfile::tempdir()?;
    let source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    let out: Committed<KafkaRecord> = Arc::default();
    let metrics: Arc<std::sync::Mutex<Vec<Arc<exactly_kafka_source::KafkaSourceMetrics>>>> = Arc::default();
    let start = || {
        let (source, out, metrics) = (source.clone(), out.clone(), metrics.clone());
        let mut job = JobBuilder::new(job_config(dir.path(), Duration::from_millis(100)));
        job.source("kafka", 1, move |_| {
            let s = KafkaSource::new(source.clone(), RawBytes);
            metrics.lock().unwrap().push(s.metrics());
            s
        })
        .sink("collect", move |_| CommittingCollector::new(out.clone()));
        job.build().expect("valid job").start()
    };
    let h = start();
    // Committed output: a checkpoint holding offset 10 completed.
    eventually("the first records", T, || count(&out) == 10).await?;
    h.stop().await?;
    h.join().await?;

    // While the job is down: ten more (offsets 10..19), and retention deletes all but three.
    produce(env, &topic, &batch("b"))?;
    delete_records_before(env, &topic, 0, 17).await?;
    metrics.lock().unwrap().clear();
    let h = start();
    eventually("the records retention left", T, || count(&out) == 13).await?;
    h.stop().await?;
    h.join().await?;
    let mut expected: Vec<String> = (0..10).map(|i| format!("a{i}")).collect();
    expected.extend(["b7", "b8", "b9"].map(String::from));
    assert_eq!(values(&out), expected);
    let lost: u64 = metrics.lock().unwrap().iter().map(|m| m.lost_to_retention()).sum();
    assert_eq!(lost, 7, "offsets 10..16 reported lost");

    // A given start offset beyond the end is refused, not read from somewhere else.
    let mut config = source.clone();
    config.start = StartPosition::Specific {
        offsets: [(format!("{topic}:0"), 100)].into(),
        reset: ResetPosition::None,
    };
    let info = subtask_info("beyond");
    let error = started(config, &info, None)
        .await
        .err()
        .expect("a start offset beyond the end")
        .to_string();
    assert!(error.contains("beyond the partition's end 20"), "{error}");
    Ok(())
}

/// A start at the end of the log as it is now (`latest`, a `latest` reset) is read only once a
/// checkpoint has recorded it: the runtime checkpoints at once and holds the source until then, so
/// a restart before the job's first checkpoint — a new process too — restores that position
/// instead of looking `latest` up again (cli's `kafka_to_kafka_recovery` kills such a process;
/// core's `waiting_tests` check the hold). A place (`earliest`) or a restored position is not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_at_the_end_is_read_only_once_a_checkpoint_recorded_it() -> Result<()> {
    use exactly_core::runtime::Source;
    let env = TestEnv::get().await?;
    let (_, config, info, state) = ten_read_and_snapshotted(env, "src-held", "held").await?;
    let held = |start: StartPosition, restored| {
        let mut config = config.clone();
        config.start = start;
        let info = &info;
        async move { Ok::<_, anyhow::Error>(started(config, info, restored).await?.reads_after_first_checkpoint()) }
    };
    let latest_reset = StartPosition::GroupOffsets {
        reset: ResetPosition::Latest,
    };
    assert!(held(StartPosition::Latest, None).await?, "latest");
    assert!(
        held(latest_reset.clone(), None).await?,
        "group offsets, reset to latest"
    );
    assert!(held(StartPosition::Timestamp { ms: 0 }, None).await?, "a timestamp");
    assert!(!held(StartPosition::Earliest, None).await?, "earliest");
    let earliest_reset = StartPosition::GroupOffsets {
        reset: ResetPosition::Earliest,
    };
    assert!(!held(earliest_reset, None).await?, "group offsets, reset to earliest");
    assert!(!held(StartPosition::Latest, Some(&state)).await?, "latest, restored");
    assert!(!held(latest_reset, Some(&state)).await?, "reset to latest, restored");
    Ok(())
}

/// A topic deleted and recreated under the same name while the job was down is read from its
/// first offset: the checkpoint records the topic's ID with its offsets, and the new topic has
/// another. Before, a restored position inside the new log's range (10, in a new log of 15) was
/// read on from: the new topic's first ten records were skipped without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_deleted_and_recreated_while_the_job_was_down_is_read_from_its_first_offset() -> Result<()> {
    let env = TestEnv::get().await?;
    let (topic, config, info, state) = ten_read_and_snapshotted(env, "src-recreated", "recreated").await?;

    recreate_topic(env, &topic, 1).await?;
    produce(env, &topic, &labelled("c", 15))?;
    let mut source = started(config, &info, Some(&state)).await?;
    assert_eq!(read_values(&mut source, 15).await?, values_of("c", 15));
    Ok(())
}

/// A topic deleted and recreated while the job reads it. librdkafka reads the new topic on from
/// the old position (here: the new topic's first ten records skipped, without a word — seen
/// before this check). The source's snapshot finds the topic's new ID and fails, the attempt
/// restarts from the last checkpoint (recorded with the old ID), and the restore reads the new
/// topic from its first offset: every record of both topics, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_recreated_while_the_job_reads_it_is_read_from_its_first_offset() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-recreated-live");
    create_topic(env, &topic, 1).await?;
    produce(env, &topic, &labelled("a", 10))?;
    let dir = tempfile::tempdir()?;
    let mut config = job_config(dir.path(), Duration::from_millis(100));
    config.restart = RestartStrategy::FixedDelay {
        attempts: 5,
        delay: Duration::from_millis(200),
    };
    let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    // The client's fetches wait 3 s after an error (the deleted topic): the new topic has its
    // records before the client reads it, as with a busy producer. (Sooner, the client finds
    // the new log shorter than the old position: out of range, which restarts the attempt too.)
    source.client.insert("fetch.error.backoff.ms".into(), "3000".into());
    let out: Committed<KafkaRecord> = Arc::default();
    let h = start_job(config, source, 1, out.clone());
    eventually("the first topic's records", T, || count(&out) == 10).await?;

    recreate_topic(env, &topic, 1).await?;
    produce(env, &topic, &labelled("c", 15))?;
    let mut expected = values_of("a", 10);
    expected.extend(values_of("c", 15));
    expected.sort();
    let reached = eventually("both topics' records", T, || count(&out) >= expected.len()).await;
    // A few more checkpoints: a record committed twice would show.
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.stop().await?;
    h.join().await?;
    assert_eq!(values(&out), expected, "{reached:?}");
    Ok(())
}

/// Deletes and recreates `topic` (one partition) with fifteen records `c0`…`c14` while `source`
/// reads it, and asserts that the source fails the attempt (`Recreated`) within `T`.
async fn recreated_under(env: &TestEnv, topic: &str, mut source: KafkaSource<KafkaRecord, RawBytes>) -> Result<()> {
    use exactly_core::runtime::Source;
    recreate_topic(env, topic, 1).await?;
    produce(env, topic, &labelled("c", 15))?;
    let mut read = Vec::new();
    let until = std::time::Instant::now() + T;
    let failed = loop {
        match source.poll_next(&mut read).await {
            Err(e) => break Some(e.to_string()),
            Ok(_) if std::time::Instant::now() > until => break None,
            Ok(_) => {}
        }
    };
    assert!(
        failed
            .as_deref()
            .is_some_and(|e| e.contains("was deleted and recreated")),
        "{failed:?} ({} records read after the recreation)",
        read.len()
    );
    Ok(())
}

/// Without checkpointing no snapshot checks the topics' IDs: the source checks them every few
/// seconds itself. A topic recreated while such a job reads it fails the attempt (`Recreated`)
/// instead of being read on from the old position (without the check: the new topic's first ten
/// records skipped without a word); the next attempt starts where its start position says, here
/// at the new topic's first offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_checkpointing_a_topic_recreated_under_the_source_fails_the_attempt() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-recreated-unchecked");
    create_topic(env, &topic, 1).await?;
    produce(env, &topic, &labelled("a", 10))?;
    let mut config = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    // As in the test above: the new topic has its records before the client reads it.
    config.client.insert("fetch.error.backoff.ms".into(), "3000".into());
    // `subtask_info`: no checkpointing (no commit window).
    let mut info = subtask_info("recreated-unchecked");
    let mut source = started(config.clone(), &info, None).await?;
    assert_eq!(read_values(&mut source, 10).await?, values_of("a", 10));

    recreated_under(env, &topic, source).await?;

    info.attempt = 1;
    let mut source = started(config, &info, None).await?;
    assert_eq!(read_values(&mut source, 15).await?, values_of("c", 15));
    Ok(())
}

/// Without checkpointing, `offset_commit = periodic` commits the source's positions to the group
/// every interval; a successor starting from the group's offsets reads on from them. The topic's
/// ID is checked before each commit: once the topic is deleted and recreated under the job, the
/// attempt fails and the old topic's position never becomes the new topic's group offset (which
/// would make the successor skip the new topic's first records: here ten of fifteen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_offset_commits_advance_the_group_and_never_carry_over_to_a_recreated_topic() -> Result<()> {
    use exactly_core::runtime::Source;
    use exactly_kafka_source::OffsetCommitMode;
    let env = TestEnv::get().await?;
    let topic = unique("src-periodic");
    create_topic(env, &topic, 1).await?;
    produce(env, &topic, &labelled("a", 10))?;
    let group = unique("g");
    let mut config = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], &group);
    config.start = StartPosition::GroupOffsets {
        reset: ResetPosition::Earliest,
    };
    config.offset_commit = OffsetCommitMode::Periodic {
        interval: Duration::from_millis(500),
    };
    // As in the tests above: the new topic has its records before the client reads it.
    config.client.insert("fetch.error.backoff.ms".into(), "3000".into());
    // `subtask_info`: no checkpointing.
    let mut info = subtask_info("periodic");
    let mut source = started(config.clone(), &info, None).await?;
    assert_eq!(read_values(&mut source, 10).await?, values_of("a", 10));
    let until = std::time::Instant::now() + T;
    let mut more = Vec::new();
    while !matches!(group_offset(env, &group, &topic)?, Offset::Offset(10)) {
        assert!(
            std::time::Instant::now() < until,
            "no periodic commit of offset 10 within {T:?}"
        );
        source.poll_next(&mut more).await?;
    }
    assert!(more.is_empty(), "read more than was written: {}", more.len());

    recreated_under(env, &topic, source).await?;
    assert_eq!(
        group_offset(env, &group, &topic)?,
        Offset::Invalid,
        "the old topic's position was committed as the new topic's"
    );

    info.attempt = 1;
    let mut source = started(config, &info, None).await?;
    assert_eq!(read_values(&mut source, 15).await?, values_of("c", 15));
    Ok(())
}

/// A restored position beyond its partition's end. With the topic's ID in the checkpoint and the
/// same topic in the cluster, the log was truncated (an unclean leader election, which a
/// single broker cannot stage: the checkpoint's offset is raised instead): the source resumes at
/// the log's end, reading what is written there next, and nothing before. Without an ID (a
/// checkpoint of an earlier build) nothing tells truncation from recreation: the restore fails
/// by default, naming `position_beyond_end`, and follows that setting when it is given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_position_beyond_the_end_resumes_by_the_topic_id_or_is_refused_without_one() -> Result<()> {
    use exactly_kafka_source::BeyondEnd;

    let env = TestEnv::get().await?;
    let (topic, config, info, state) = ten_read_and_snapshotted(env, "src-beyond", "beyond").await?;
    // The snapshot's one entry, as JSON, with its position moved to `offset`, and its topic ID
    // kept or dropped.
    let (name, entries) = state.union_state.iter().next().expect("the source's offsets");
    assert_eq!(entries.len(), 1, "one partition");
    let entry: serde_json::Value = serde_json::from_slice(&entries[0])?;
    assert_eq!(entry["next_offset"], 10);
    assert!(entry["topic_id"].is_string(), "the topic's ID is recorded: {entry}");
    let moved = |offset: i64, keep_id: bool| {
        let mut e = entry.clone();
        e["next_offset"] = offset.into();
        if !keep_id {
            e.as_object_mut().expect("an object").remove("topic_id");
        }
        let mut restored = state.clone();
        restored
            .union_state
            .insert(name.clone(), vec![serde_json::to_vec(&e).expect("serializes")]);
        restored
    };

    // The same topic, its end (10) below the position (25): resume at the end.
    let truncated = moved(25, true);
    let mut source = started(config.clone(), &info, Some(&truncated)).await?;
    produce(env, &topic, &labelled("b", 3))?;
    assert_eq!(read_values(&mut source, 3).await?, values_of("b", 3));
    drop(source);

    // No ID: refused, by default.
    let unclear = moved(25, false);
    let error = started(config.clone(), &info, Some(&unclear))
        .await
        .err()
        .expect("a position beyond the end without a topic ID")
        .to_string();
    assert!(
        error.contains("beyond the partition's end 13") && error.contains("position_beyond_end"),
        "{error}"
    );
    // ... and as the operator says, once told.
    let mut told = config.clone();
    told.position_beyond_end = BeyondEnd::Recreated;
    let mut source = started(told.clone(), &info, Some(&unclear)).await?;
    let mut all = values_of("a", 10);
    all.extend(values_of("b", 3));
    assert_eq!(read_values(&mut source, 13).await?, all);
    drop(source);
    told.position_beyond_end = BeyondEnd::Truncated;
    let mut source = started(told, &info, Some(&unclear)).await?;
    produce(env, &topic, &labelled("c", 2))?;
    assert_eq!(read_values(&mut source, 2).await?, values_of("c", 2));
    Ok(())
}

/// Retention overtaking a running source: the partition's next fetch position falls below the
/// log's first offset while the source lags (its prefetch held to a record or two), the fetch
/// reports it out of range, and the attempt fails with an error that restarts it (the restart
/// checks the restored offset against the log's range, as above). Before: librdkafka's silent
/// reset to the first offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_overtaking_a_lagging_source_fails_the_attempt_instead_of_a_silent_jump() -> Result<()> {
    use exactly_core::runtime::{InitContext, Source};

    let env = TestEnv::get().await?;
    let topic = unique("src-overtaken");
    create_topic(env, &topic, 1).await?;
    // Twenty records of 10 KB, each in its own batch (the fetcher's unit).
    let p: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .set("linger.ms", "0")
        .create()?;
    let big = "x".repeat(10_000);
    for i in 0..20 {
        let v = format!("{i:02}{big}");
        p.send(BaseRecord::<str, str>::to(&topic).partition(0).payload(&v))
            .map_err(|(e, _)| e)?;
        p.flush(T)?;
    }
    let mut config = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    config.start = StartPosition::Earliest;
    config.poll_batch = 1;
    for (k, v) in [
        ("queued.min.messages", "1"),
        ("queued.max.messages.kbytes", "1"),
        ("max.partition.fetch.bytes", "1"),
    ] {
        config.client.insert(k.into(), v.into());
    }
    let mut source = KafkaSource::new(config, RawBytes);
    let metrics = source.metrics();
    let info = subtask_info("overtaken");
    source.initialize_state(&InitContext::new(&info, None)).await?;
    let mut out = Vec::new();
    // The first record read: the fetcher has started, and holds at most a few ahead.
    let until = std::time::Instant::now() + T;
    while out.is_empty() && std::time::Instant::now() < until {
        source.poll_next(&mut out).await?;
    }
    assert!(!out.is_empty(), "no record within {T:?}");
    delete_records_before(env, &topic, 0, 17).await?;
    let error = loop {
        if std::time::Instant::now() > until {
            anyhow::bail!("no error within {T:?}; read {} records", out.len());
        }
        match source.poll_next(&mut out).await {
            Ok(_) => {}
            Err(e) => break e.to_string(),
        }
    };
    assert!(error.contains("outside the partition's log"), "{error}");
    assert!(
        out.len() < 17,
        "read {} records: the deleted ones were not all prefetched",
        out.len()
    );
    let last = out
        .last()
        .and_then(|r| r.value.as_deref())
        .map(|v| String::from_utf8_lossy(&v[..2]).into_owned());
    assert!(
        last.as_ref().is_some_and(|l| l.parse::<i64>().is_ok_and(|n| n < 17)),
        "{last:?}"
    );
    assert_eq!(
        metrics.lost_to_retention(),
        0,
        "counted by the restart that checks the range"
    );
    Ok(())
}

/// A pattern-subscribed source restored while a topic it had read is not listed (its metadata
/// showed an error for a moment; here the topic is absent at restore and appears later, and the
/// checkpoint — an earlier build's — recorded no topic ID, so its position is taken as the same
/// topic's) carries that topic's restored offset into its checkpoints and takes it up when
/// discovery sees the topic. Before, the offset was dropped and the topic read again from its
/// earliest offset: a whole-topic replay into the exactly-once sinks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_topic_not_listed_at_restore_resumes_at_its_offset_when_seen_again() -> Result<()> {
    let env = TestEnv::get().await?;
    let prefix = unique("src-unseen");
    let (listed, later) = (format!("{prefix}-a"), format!("{prefix}-b"));
    create_topic(env, &listed, 1).await?;
    produce(env, &listed, &labelled("a", 3))?;
    let mut config = KafkaSourceConfig::new(&env.kafka_bootstrap, Vec::new(), unique("g"));
    config.topic_pattern = Some(format!("^{prefix}-.*"));
    config.discovery_interval = Some(Duration::from_millis(300));
    let info = subtask_info("unseen");
    // A checkpoint that had read the later topic's partition up to offset 5.
    let entry = serde_json::json!({"version": 1, "tp": {"topic": later, "partition": 0}, "next_offset": 5});
    let mut restored = exactly_core::state::RestoredState::default();
    restored
        .union_state
        .insert("kafka-source-offsets".into(), vec![serde_json::to_vec(&entry)?]);
    let mut source = started(config, &info, Some(&restored)).await?;
    assert_eq!(read_values(&mut source, 3).await?, values_of("a", 3));
    // Its checkpoints still hold the offset while the topic is not listed.
    let carried = snapshot_of(&mut source).await?;
    let offsets: Vec<serde_json::Value> = carried.union_state["kafka-source-offsets"]
        .iter()
        .map(|e| serde_json::from_slice(e).expect("JSON"))
        .collect();
    assert!(
        offsets
            .iter()
            .any(|e| e["tp"]["topic"] == later.as_str() && e["next_offset"] == 5),
        "{offsets:?}"
    );
    // The topic is listed again, with ten records: read from the restored offset on.
    create_topic(env, &later, 1).await?;
    produce(env, &later, &labelled("b", 10))?;
    let read = read_values(&mut source, 5).await?;
    assert_eq!(read, (5..10).map(|i| format!("b{i}")).collect::<Vec<_>>());
    Ok(())
}
