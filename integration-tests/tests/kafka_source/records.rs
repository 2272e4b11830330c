//! Watermarks per partition, records as written (every field, every codec), dead letters that
//! cannot be written, and the source's caught-up and backlog reports.

use super::*;

/// Collects the watermarks that reach it.
struct Watermarks(Arc<std::sync::Mutex<Vec<i64>>>);

impl exactly_core::runtime::CheckpointedFunction for Watermarks {}
impl exactly_core::runtime::CheckpointListener for Watermarks {}
impl exactly_core::runtime::ProcessFunction<KafkaRecord, KafkaRecord> for Watermarks {
    fn process(
        &mut self,
        r: KafkaRecord,
        out: &mut exactly_core::runtime::Collector<'_, KafkaRecord>,
    ) -> exactly_core::Result<()> {
        out.emit(r)
    }
    fn on_watermark(
        &mut self,
        w: exactly_core::Watermark,
        _out: &mut exactly_core::runtime::Collector<'_, KafkaRecord>,
    ) -> exactly_core::Result<()> {
        self.0.lock().unwrap().push(w.0);
        Ok(())
    }
}

/// `records` (partition, timestamp) written with explicit partitions and timestamps.
fn produce_at(env: &TestEnv, topic: &str, records: &[(i32, i64)]) -> Result<()> {
    let p: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()?;
    for (partition, ts) in records {
        p.send(
            BaseRecord::<str, str>::to(topic)
                .partition(*partition)
                .payload("x")
                .timestamp(*ts),
        )
        .map_err(|(e, _)| e)?;
    }
    p.flush(T)?;
    Ok(())
}

/// Source subtasks (`parallelism`) → rebalance into one collecting stage; `later` is produced
/// once the first `records` were read and 800 ms passed; returns the watermarks the stage saw.
async fn watermarks_seen(
    env: &TestEnv,
    topic: &str,
    parallelism: u32,
    watermarks: exactly_kafka_source::WatermarkConfig,
    records: usize,
    later: &[(i32, i64)],
) -> Result<Vec<i64>> {
    let dir = tempfile::tempdir()?;
    let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.to_owned()], unique("g"));
    source.watermarks = Some(watermarks);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let out: Committed<KafkaRecord> = Arc::default();
    let mut job = JobBuilder::new(job_config(dir.path(), Duration::from_millis(200)));
    let (s, o) = (seen.clone(), out.clone());
    job.source("kafka", parallelism, move |_| {
        KafkaSource::new(source.clone(), RawBytes)
    })
    .rebalance(1)
    .process("watermarks", move |_| Watermarks(s.clone()))
    .sink("collect", move |_| CommittingCollector::new(o.clone()));
    let handle = job.build()?.start();
    eventually("every record", T, || count(&out) >= records).await?;
    if !later.is_empty() {
        tokio::time::sleep(Duration::from_millis(800)).await;
        produce_at(env, topic, later)?;
        eventually("the later records", T, || count(&out) >= records + later.len()).await?;
    }
    // A few more polls, for watermarks that follow the last records.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    handle.cancel();
    handle.join().await?;
    let w = seen.lock().unwrap().clone();
    Ok(w)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watermarks_per_partition_with_idle_partitions_and_idle_subtasks() -> Result<()> {
    let env = TestEnv::get().await?;
    let bound = Duration::from_millis(100);

    // Two partitions, three subtasks: subtask 2 has no partition and says it is idle, so the
    // single downstream stage's watermark is the minimum over the partitions (minus the bound).
    let topic = unique("wm");
    create_topic(env, &topic, 2).await?;
    produce_at(
        env,
        &topic,
        &[(0, 10_000), (0, 30_000), (0, 20_000), (1, 12_000), (1, 15_000)],
    )?;
    let no_idle = exactly_kafka_source::WatermarkConfig {
        max_out_of_orderness: bound,
        idle_timeout: None,
    };
    let seen = watermarks_seen(env, &topic, 3, no_idle, 5, &[]).await?;
    assert_eq!(
        seen.last(),
        Some(&(15_000 - 101)),
        "min(30 000, 15 000) - bound - 1: {seen:?}"
    );
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "never backwards: {seen:?}");

    // Only partition 0 has records: without an idle timeout partition 1 holds the watermark back
    // for good; with one, it stops counting once silent, and partition 0's later records drive
    // the watermark alone.
    let topic = unique("wm-idle");
    create_topic(env, &topic, 2).await?;
    produce_at(env, &topic, &[(0, 50_000), (0, 51_000)])?;
    let seen = watermarks_seen(env, &topic, 1, no_idle, 2, &[(0, 52_000)]).await?;
    assert!(seen.is_empty(), "partition 1 never had a record: {seen:?}");
    let idle = exactly_kafka_source::WatermarkConfig {
        max_out_of_orderness: bound,
        idle_timeout: Some(Duration::from_millis(300)),
    };
    let topic = unique("wm-idle");
    create_topic(env, &topic, 2).await?;
    produce_at(env, &topic, &[(0, 50_000), (0, 51_000)])?;
    let seen = watermarks_seen(env, &topic, 1, idle, 2, &[(0, 52_000)]).await?;
    assert_eq!(seen.last(), Some(&(52_000 - 101)), "{seen:?}");
    Ok(())
}

/// Every field of a record survives the source's batch read: keys present, absent and empty;
/// values present, absent (tombstones) and empty; headers in order, repeated names, null values
/// and non-ASCII bytes; timestamps; records of several partitions, each in offset order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_arrive_with_every_field_as_written() -> Result<()> {
    use rdkafka::message::{Header, OwnedHeaders};
    let env = TestEnv::get().await?;
    let topic = unique("src-fields");
    create_topic_with(env, &topic, 3, OLD_TIMESTAMPS).await?;
    let p: rdkafka::producer::BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()?;
    type Expected = (
        i32,
        Option<Vec<u8>>,
        Option<Vec<u8>>,
        i64,
        Vec<(String, Option<Vec<u8>>)>,
    );
    let mut expected: Vec<Expected> = Vec::new();
    for i in 0..300i64 {
        let partition = (i % 3) as i32;
        let key = match i % 3 {
            0 => Some(format!("k{i}").into_bytes()),
            1 => None,
            _ => Some(Vec::new()),
        };
        let value = match i % 5 {
            0 => None,
            1 => Some(Vec::new()),
            _ => Some(vec![(i % 251) as u8; (i as usize * 7) % 3000]),
        };
        let headers: Vec<(String, Option<Vec<u8>>)> = match i % 4 {
            0 => vec![],
            1 => vec![("a".into(), Some(b"1".to_vec())), ("a".into(), Some(b"2".to_vec()))],
            2 => vec![("null".into(), None), ("bytes".into(), Some(vec![0, 255, 128]))],
            _ => vec![("ünïcode".into(), Some("wert".as_bytes().to_vec()))],
        };
        let ts = 1_700_000_000_000 + i;
        let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&topic).partition(partition).timestamp(ts);
        if let Some(k) = &key {
            rec = rec.key(k.as_slice());
        }
        if let Some(v) = &value {
            rec = rec.payload(v.as_slice());
        }
        if !headers.is_empty() {
            rec = rec.headers(headers.iter().fold(OwnedHeaders::new(), |h, (k, v)| {
                h.insert(Header {
                    key: k,
                    value: v.as_deref(),
                })
            }));
        }
        p.send(rec).map_err(|(e, _)| e)?;
        expected.push((partition, key, value, ts, headers));
    }
    p.flush(T)?;

    let dir = tempfile::tempdir()?;
    let source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    let out: Committed<KafkaRecord> = Arc::default();
    let handle = start_job(
        job_config(dir.path(), Duration::from_millis(100)),
        source,
        1,
        out.clone(),
    );
    eventually("records", T, || count(&out) >= expected.len()).await?;
    handle.stop().await?;
    handle.join().await?;

    let got = out.lock().unwrap().clone();
    assert_eq!(got.len(), expected.len());
    for partition in 0..3 {
        let ours: Vec<&KafkaRecord> = got.iter().filter(|r| r.partition == partition).collect();
        let theirs: Vec<&Expected> = expected.iter().filter(|e| e.0 == partition).collect();
        assert_eq!(ours.len(), theirs.len(), "partition {partition}");
        for (offset, (r, e)) in ours.iter().zip(theirs).enumerate() {
            assert_eq!(&*r.topic, topic.as_str());
            assert_eq!(
                r.offset, offset as i64,
                "partition {partition}: records in offset order"
            );
            assert_eq!(r.key, e.1, "key at {partition}@{offset}");
            assert_eq!(r.value, e.2, "value at {partition}@{offset}");
            assert_eq!(r.timestamp, Some(e.3), "timestamp at {partition}@{offset}");
            assert_eq!(r.headers, e.4, "headers at {partition}@{offset}");
        }
    }
    Ok(())
}

/// Input in every compression codec Kafka ships (gzip, snappy, lz4, zstd) is read. Before, zstd
/// input stalled the source: librdkafka was built without zstd, and the fetch error was only
/// logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_compressed_with_every_kafka_codec_are_read() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-codecs");
    create_topic(env, &topic, 1).await?;
    let codecs = ["gzip", "snappy", "lz4", "zstd"];
    let mut expected = Vec::new();
    for codec in codecs {
        let p: rdkafka::producer::BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &env.kafka_bootstrap)
            .set("compression.codec", codec)
            .set("linger.ms", "20")
            .create()?;
        for i in 0..50 {
            // Repetitive values compress, so the batches really are compressed.
            let v = format!("{codec}-{i:03}-{}", "x".repeat(200));
            p.send(BaseRecord::<str, str>::to(&topic).partition(0).payload(&v))
                .map_err(|(e, _)| e)?;
            expected.push(v);
        }
        p.flush(T)?;
    }
    expected.sort();
    let got = run_until(env, &topic, StartPosition::Earliest, expected.len()).await?;
    assert_eq!(got, expected);
    Ok(())
}

/// A dead letter the broker refuses (larger than the dead-letter topic's `max.message.bytes`) fails
/// the checkpoint: the job stops with the error instead of completing a checkpoint past a record
/// that went nowhere. Before, the flush succeeded whatever the delivery reports said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_that_cannot_be_written_fails_the_checkpoint() -> Result<()> {
    let env = TestEnv::get().await?;
    let topic = unique("src-dlq-refused-in");
    create_topic(env, &topic, 1).await?;
    let dlq = unique("src-dlq-refused");
    create_topic_with(env, &dlq, 1, &[("max.message.bytes", "2000")]).await?;
    produce(
        env,
        &topic,
        &[
            ("k".into(), "1".into()),
            ("k".into(), format!("not json {}", "x".repeat(10_000))),
        ],
    )?;

    let dir = tempfile::tempdir()?;
    let mut source = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    source.on_deserialization_error = PoisonPolicy::DeadLetter { topic: dlq.clone() };
    let out: Committed<serde_json::Value> = Arc::default();
    let mut job = JobBuilder::new(job_config(dir.path(), Duration::from_millis(100)));
    job.source("kafka", 1, move |_| KafkaSource::new(source.clone(), Json))
        .sink("collect", {
            let out = out.clone();
            move |_| CommittingCollector::new(out.clone())
        });
    let h = job.build()?.start();
    let ended = tokio::time::timeout(T, h.join()).await;
    let err = match ended {
        Ok(Err(e)) => format!("{e:?}"),
        Ok(Ok(outcome)) => anyhow::bail!("the job ended normally: {outcome:?}"),
        Err(_) => anyhow::bail!("the job kept running past a dead letter it could not write"),
    };
    assert!(err.contains("DeadLetter") && err.contains(&dlq), "{err}");
    Ok(())
}

/// Under steady traffic a source subtask rarely finds nothing for the whole of its brief wait, so
/// `Idle` alone seldom tells it has caught up (measured: `when_caught_up` barely fired with two
/// source subtasks). The source also says `CaughtUp` when it read all it had, waited, and the next
/// fetch brought less than a batch. A feeder writes a record every 2 ms, alternating between two
/// partitions (never 20 ms without one); while it runs the source must report `CaughtUp`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_under_steady_traffic_reports_caught_up() -> Result<()> {
    steady_traffic(false).await
}

/// The same, polled as the runtime polls: after `Idle` or `CaughtUp` it waits in
/// `Source::available` (and meanwhile serves checkpoints), every other wait cut short as a
/// barrier would cut it. The statuses are the same, and every record is read exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_waiting_in_available_reads_steady_traffic_exactly_once() -> Result<()> {
    steady_traffic(true).await
}

async fn steady_traffic(wait_in_available: bool) -> Result<()> {
    use exactly_core::runtime::{InitContext, Source, SourceStatus};
    use std::sync::atomic::{AtomicBool, Ordering};

    let env = TestEnv::get().await?;
    let topic = unique("steady");
    create_topic(env, &topic, 2).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (bootstrap, topic, stop) = (env.kafka_bootstrap.clone(), topic.clone(), stop.clone());
        std::thread::spawn(move || -> Result<u64> {
            let p: rdkafka::producer::BaseProducer = ClientConfig::new()
                .set("bootstrap.servers", &bootstrap)
                .set("linger.ms", "0")
                .create()?;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let v = n.to_string();
                p.send(BaseRecord::<str, str>::to(&topic).partition((n % 2) as i32).payload(&v))
                    .map_err(|(e, _)| e)?;
                p.poll(Duration::ZERO);
                n += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            p.flush(T)?;
            Ok(n)
        })
    };
    let mut config = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    config.start = StartPosition::Earliest;
    let mut source = KafkaSource::new(config, RawBytes);
    let info = subtask_info("steady");
    source.initialize_state(&InitContext::new(&info, None)).await?;
    let mut out = Vec::new();
    let (mut caught_up, mut statuses) = (0usize, BTreeMap::<String, usize>::new());
    let mut seen = BTreeSet::new();
    let (mut waiting, mut waits) = (false, 0u64);
    let mut poll =
        async |source: &mut KafkaSource<KafkaRecord, RawBytes>, out: &mut Vec<KafkaRecord>| -> Result<SourceStatus> {
            if wait_in_available && waiting {
                waits += 1;
                if waits % 2 == 0 {
                    let _ = tokio::time::timeout(Duration::from_millis(1), source.available()).await;
                } else {
                    source.available().await;
                }
            }
            let status = source.poll_next(out).await?;
            waiting = matches!(status, SourceStatus::Idle | SourceStatus::CaughtUp);
            Ok(status)
        };
    let until = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < until {
        let status = poll(&mut source, &mut out).await?;
        seen.extend(out.drain(..).map(|r: KafkaRecord| (r.partition, r.offset)));
        caught_up += usize::from(status == SourceStatus::CaughtUp);
        *statuses.entry(format!("{status:?}")).or_default() += 1;
    }
    let read = seen.len();
    stop.store(true, Ordering::Relaxed);
    let written = feeder.join().expect("feeder")?;
    assert!(
        read > 500,
        "the source read only {read} of the {written} records written meanwhile"
    );
    assert!(
        caught_up > 0,
        "no CaughtUp in 4 s of steady traffic ({read} records read); statuses: {statuses:?}"
    );
    // Traffic it keeps up with is no backlog: no early checkpoint by default for it.
    assert!(
        !statuses.contains_key("Backlog"),
        "Backlog under steady traffic ({read} records read); statuses: {statuses:?}"
    );
    // The rest, then every record once (a set of offsets: a record read twice is counted too).
    let mut polled = read;
    let until = std::time::Instant::now() + T;
    while (seen.len() as u64) < written && std::time::Instant::now() < until {
        poll(&mut source, &mut out).await?;
        polled += out.len();
        seen.extend(out.drain(..).map(|r: KafkaRecord| (r.partition, r.offset)));
    }
    assert_eq!(seen.len() as u64, written, "records read of those written");
    assert_eq!(polled, seen.len(), "records read more than once");
    Ok(())
}

/// A topic filled before the source starts is a backlog: its polls take whole batches already
/// fetched and say `Backlog` (what `when_caught_up = "after-backlog"`, the default, checkpoints
/// after), until the source has read it all — then no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_reading_a_filled_topic_reports_backlog_until_it_has_read_it() -> Result<()> {
    use exactly_core::runtime::{InitContext, Source, SourceStatus};

    let env = TestEnv::get().await?;
    let topic = unique("backlog");
    create_topic(env, &topic, 2).await?;
    let n = 50_000usize;
    let records: Vec<(String, String)> = (0..n).map(|i| (i.to_string(), format!("value-{i:06}"))).collect();
    produce(env, &topic, &records)?;
    let mut config = KafkaSourceConfig::new(&env.kafka_bootstrap, vec![topic.clone()], unique("g"));
    config.start = StartPosition::Earliest;
    let batch = config.poll_batch;
    let mut source = KafkaSource::new(config, RawBytes);
    let info = subtask_info("backlog");
    source.initialize_state(&InitContext::new(&info, None)).await?;
    let mut out = Vec::new();
    let (mut read, mut backlog, mut after) = (0usize, 0usize, BTreeMap::<String, usize>::new());
    let until = std::time::Instant::now() + T;
    // Read the backlog, then 2 s more with nothing new.
    let mut done: Option<std::time::Instant> = None;
    while done.is_none_or(|d| d.elapsed() < Duration::from_secs(2)) && std::time::Instant::now() < until {
        let status = source.poll_next(&mut out).await?;
        if status == SourceStatus::Backlog {
            assert_eq!(out.len(), batch, "a Backlog poll brings a whole batch");
        }
        read += out.len();
        out.clear();
        if done.is_some() {
            *after.entry(format!("{status:?}")).or_default() += 1;
        } else {
            backlog += usize::from(status == SourceStatus::Backlog);
            if read >= n {
                done = Some(std::time::Instant::now());
            }
        }
    }
    assert_eq!(read, n, "the source read {read} of {n} records in {T:?}");
    assert!(
        backlog * batch >= n / 2,
        "only {backlog} Backlog polls of {batch} while reading {n} records that were waiting"
    );
    assert!(
        !after.contains_key("Backlog"),
        "Backlog after the topic was read to its end; statuses then: {after:?}"
    );
    Ok(())
}
