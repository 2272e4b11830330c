//! read_committed isolation, partitions and topics appearing at runtime, rescaling across
//! restores, and the poison-record policies.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_aborted_and_open_transactions_are_not_delivered() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-isolation");
    create_topic(env, &topic, 1).await?;
    let send = |p: &rdkafka::producer::BaseProducer, v: &str| -> Result<()> {
        p.send(BaseRecord::<str, str>::to(&topic).partition(0).payload(v))
            .map_err(|(e, _)| e)?;
        p.flush(T)?;
        Ok(())
    };
    let committer = transactional_producer(env, &unique("tx-c"))?;
    committer.begin_transaction()?;
    send(&committer, "c1")?;
    committer.commit_transaction(T)?;
    let aborter = transactional_producer(env, &unique("tx-a"))?;
    aborter.begin_transaction()?;
    send(&aborter, "a1")?;
    aborter.abort_transaction(T)?;
    let open = transactional_producer(env, &unique("tx-o"))?;
    open.begin_transaction()?;
    send(&open, "o1")?;
    committer.begin_transaction()?;
    send(&committer, "c2")?;
    committer.commit_transaction(T)?;

    let dir = tempfile::tempdir()?;
    let source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    let out: Committed<KafkaRecord> = Arc::default();
    let h = start_job(
        job_config(dir.path(), Duration::from_millis(100)),
        source,
        1,
        out.clone(),
    );
    eventually("c1", T, || count(&out) >= 1).await?;
    // o1 is open: nothing after it (c2 included) may be delivered yet.
    assert_eq!(values(&out), ["c1"]);
    open.commit_transaction(T)?;
    eventually("o1 and c2", T, || count(&out) >= 3).await?;
    h.stop().await?;
    h.join().await?;
    assert_eq!(values(&out), ["c1", "c2", "o1"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_and_topics_appearing_at_runtime_are_read_once_from_earliest() -> Result<()> {
    let env = TestEnv::get().await?;
    let stem = unique("disc");
    let first = format!("{stem}-a");
    create_topic(env, &first, 1).await?;
    produce(env, &first, &[("k".into(), "a-0".into())])?;
    let dir = tempfile::tempdir()?;
    let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![], unique("g"));
    source.topic_pattern = Some(format!("^{stem}-.*"));
    source.discovery_interval = Some(Duration::from_millis(300));
    source.start = StartPosition::Latest; // new partitions still start at their earliest
    let out: Committed<KafkaRecord> = Arc::default();
    let h = start_job(
        job_config(dir.path(), Duration::from_millis(100)),
        source,
        2,
        out.clone(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()?;
    admin
        .create_partitions(&[NewPartitions::new(&first, 2)], &AdminOptions::new())
        .await?;
    let second = format!("{stem}-b");
    create_topic(env, &second, 2).await?;
    // Produced before discovery sees them: read from earliest all the same.
    let p: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()?;
    p.send(
        BaseRecord::<str, str>::to(&first)
            .partition(1)
            .payload("a-new-partition"),
    )
    .map_err(|(e, _)| e)?;
    p.send(BaseRecord::<str, str>::to(&second).partition(0).payload("b-0"))
        .map_err(|(e, _)| e)?;
    p.send(BaseRecord::<str, str>::to(&second).partition(1).payload("b-1"))
        .map_err(|(e, _)| e)?;
    p.flush(T)?;
    eventually("discovered records", T, || count(&out) >= 3).await?;
    h.stop().await?;
    h.join().await?;
    assert_eq!(
        values(&out),
        ["a-new-partition", "b-0", "b-1"],
        "a-0 predates the start (latest)"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rescaling_across_restores_delivers_every_offset_exactly_once() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-rescale");
    create_topic(env, &topic, 6).await?;
    let batch = |from: usize| -> Vec<(String, String)> {
        (from..from + 300)
            .map(|i| (format!("k{}", i % 37), format!("r{i:05}")))
            .collect()
    };
    let dir = tempfile::tempdir()?;
    let source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    let out: Committed<KafkaRecord> = Arc::default();
    let config = job_config(dir.path(), Duration::from_millis(100));

    produce(env, &topic, &batch(0))?;
    let h = start_job(config.clone(), source.clone(), 2, out.clone());
    eventually("run 1 (2 subtasks)", T, || count(&out) >= 300).await?;
    h.stop().await?;
    h.join().await?;

    produce(env, &topic, &batch(300))?;
    let h = start_job(config.clone(), source.clone(), 3, out.clone());
    eventually("run 2 (3 subtasks) commits some", T, || count(&out) >= 400).await?;
    h.cancel(); // crash-like: what it had not committed is read again by the next run
    h.join().await?;

    produce(env, &topic, &batch(600))?;
    let h = start_job(config, source, 1, out.clone());
    eventually("run 3 (1 subtask)", T, || count(&out) >= 900).await?;
    h.stop().await?;
    h.join().await?;

    let mut by_offset: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for r in out.lock().unwrap().iter() {
        *by_offset.entry((r.partition, r.offset)).or_default() += 1;
    }
    assert_eq!(by_offset.len(), 900, "every offset delivered");
    assert!(by_offset.values().all(|n| *n == 1), "none twice");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_records_fail_skip_or_go_to_the_dead_letter_topic() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-poison");
    create_topic(env, &topic, 1).await?;
    produce(
        env,
        &topic,
        &[
            ("k".into(), "1".into()),
            ("k".into(), "{oops".into()),
            ("k".into(), "3".into()),
        ],
    )?;

    let run = |policy: PoisonPolicy| {
        let dir = tempfile::tempdir().unwrap();
        let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
        source.on_deserialization_error = policy;
        let out: Committed<serde_json::Value> = Arc::default();
        let mut job = JobBuilder::new(job_config(dir.path(), Duration::from_millis(100)));
        job.source("kafka", 1, move |_| KafkaSource::new(source.clone(), Json))
            .sink("collect", {
                let out = out.clone();
                move |_| CommittingCollector::new(out.clone())
            });
        (job.build().unwrap().start(), out, dir)
    };

    // fail: the job stops for good, naming the record; no restart loop.
    let (h, _, _dir) = run(PoisonPolicy::Fail);
    let err = h.join().await.unwrap_err().to_string();
    let chain = err.clone();
    assert!(chain.contains("kafka source failed"), "{chain}");
    let (h, _, _dir) = run(PoisonPolicy::Fail);
    let err = format!("{:?}", h.join().await.unwrap_err());
    assert!(err.contains(topic.as_str()) && err.contains("offset: 1"), "{err}");

    // skip
    let (h, out, _dir) = run(PoisonPolicy::Skip);
    eventually("two good records", T, || out.lock().unwrap().len() >= 2).await?;
    h.stop().await?;
    h.join().await?;
    assert_eq!(*out.lock().unwrap(), vec![serde_json::json!(1), serde_json::json!(3)]);

    // dead letter
    let dlq = unique("src-dlq");
    create_topic(env, &dlq, 1).await?;
    let (h, out, _dir) = run(PoisonPolicy::DeadLetter { topic: dlq.clone() });
    eventually("two good records", T, || out.lock().unwrap().len() >= 2).await?;
    h.stop().await?;
    h.join().await?;
    let dead = read_committed(env, &dlq, T)?;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].value_str(), "{oops");
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .set("group.id", unique("dlq-headers"))
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&dlq, 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let m = loop {
        if let Some(m) = c.poll(T) {
            break m?;
        }
    };
    use rdkafka::message::{Headers, Message};
    let headers: BTreeMap<String, String> = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| {
                    (
                        h.key.to_owned(),
                        String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(headers.get("exactly.source.topic"), Some(&topic));
    assert_eq!(headers.get("exactly.source.offset").map(String::as_str), Some("1"));
    assert!(headers.get("exactly.error").is_some_and(|e| !e.is_empty()));
    Ok(())
}
