//! Benchmarks against the real services, each measured side by side with its baseline in the
//! same run (machines are noisy: ratios hold, absolute numbers do not).
//!
//! `exactly bench source|k2k|mysql [--records N] [--sizes 100,1024]` (services from `EXACTLY_KAFKA_BOOTSTRAP` and
//! `EXACTLY_MYSQL_URL`, as printed by `scripts/services env`, or `--bootstrap`/`--mysql`).
//!
//! - source: this Kafka source (in a job, checkpoints every 1 s) vs a plain rdkafka consumer loop.
//! - k2k: Kafka-to-Kafka pass-through with exactly-once, at-least-once, and a plain rdkafka
//!   consume-and-produce loop, for 100-byte and 1 KB records, checkpoints every 1 s: records/s
//!   with a backlog, written (seen by a read_uncommitted reader: the pipeline's rate) and committed
//!   (seen by a read_committed reader: exactly-once waits for the commit after the next
//!   checkpoint), then p50/p99 end-to-end latency to a read_committed consumer at a fixed rate.
//! - mysql: rows/s for xa, upsert, and a plain batched INSERT loop, for the same input.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};

use super::Report;
use exactly_core::coordinator::CheckpointConfig;
use exactly_core::restart::RestartStrategy;
use exactly_core::runtime::{JobBuilder, JobConfig, JobHandle, Sink};
use exactly_kafka_sink::{DeliveryGuarantee, KafkaSink, KafkaSinkConfig, ProducerRecord};
use exactly_kafka_source::{KafkaRecord, KafkaSource, KafkaSourceConfig, RawBytes};
use exactly_mysql_sink::{
    Column, ColumnType, Format, Mapping, Mode, MysqlSink, MysqlSinkConfig, OnError, Origin, SinkRecord,
};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

const PARTITIONS: i32 = 3;
/// Pause after deleting a mode's topics (the local broker deletes files 1 s after the topic).
const SETTLE: Duration = Duration::from_secs(5);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn unique(p: &str) -> String {
    format!("{p}-{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

async fn topic(bootstrap: &str, name: &str) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    for r in admin
        .create_topics(
            &[NewTopic::new(name, PARTITIONS, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await?
    {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    Ok(())
}

/// librdkafka settings from the environment variable `var` (`key=value,key=value`), for trying
/// client tuning without rebuilding.
fn client_overrides(var: &str) -> Vec<(String, String)> {
    std::env::var(var)
        .unwrap_or_default()
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Deletes the benchmark's topics (a large backlog per run would fill the broker's disk).
async fn delete_topics(bootstrap: &str, names: &[&str]) {
    let admin: Result<AdminClient<DefaultClientContext>, _> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create();
    match admin {
        Ok(a) => {
            if let Err(e) = a.delete_topics(names, &AdminOptions::new()).await {
                eprintln!("warning: could not delete benchmark topics {names:?}: {e}");
            }
        }
        Err(e) => eprintln!("warning: could not delete benchmark topics {names:?}: {e}"),
    }
}

fn producer(bootstrap: &str) -> Result<BaseProducer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "10")
        .set("enable.idempotence", "true")
        .set("queue.buffering.max.messages", "1000000")
        .create()?)
}

fn send(p: &BaseProducer, topic: &str, key: &[u8], value: &[u8]) {
    let mut rec = BaseRecord::to(topic).key(key).payload(value).timestamp(now_ms());
    loop {
        match p.send(rec) {
            Ok(()) => return,
            Err((_, back)) => {
                rec = back;
                p.poll(Duration::from_millis(5));
            }
        }
    }
}

fn backlog(bootstrap: &str, topic: &str, n: u64, size: usize, csv: bool) -> Result<()> {
    let p = producer(bootstrap)?;
    for i in 0..n {
        let key = format!("k{}", i % 1000);
        let value = if csv {
            format!("{i},{key},{i}").into_bytes()
        } else {
            vec![b'x'; size]
        };
        send(&p, topic, key.as_bytes(), &value);
    }
    p.flush(Duration::from_secs(120))?;
    Ok(())
}

fn consumer(bootstrap: &str, topic: &str, committed: bool) -> Result<BaseConsumer> {
    let mut cfg = ClientConfig::new();
    for (k, v) in client_overrides("BENCH_PLAIN_CLIENT") {
        cfg.set(k, v);
    }
    // The baseline gets the same librdkafka tuning the source uses (see the source's consumer).
    let c: BaseConsumer = cfg
        .set("fetch.queue.backoff.ms", "10")
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("bench"))
        .set("enable.auto.commit", "false")
        .set(
            "isolation.level",
            if committed {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        )
        .set("fetch.wait.max.ms", "10")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    Ok(c)
}

/// What a reader saw: when the first and the `mark`-th record arrived, and the latency of each
/// (receive time minus record timestamp, ms).
struct Seen {
    first: Instant,
    marked: Instant,
    lat: Vec<i64>,
}

/// Reads `n` records of `topic` (read_committed or not), counting them in `progress`.
fn verify(
    bootstrap: &str,
    topic: &str,
    n: u64,
    mark: u64,
    committed: bool,
    progress: &AtomicU64,
    deadline: Duration,
) -> Result<Seen> {
    let c = consumer(bootstrap, topic, committed)?;
    let end = Instant::now() + deadline;
    let mut lat = Vec::with_capacity(n as usize);
    let (mut first, mut marked) = (None, None);
    while (lat.len() as u64) < n {
        if Instant::now() > end {
            bail!("only {} of {n} records arrived in {topic}", lat.len());
        }
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m?;
            first.get_or_insert_with(Instant::now);
            lat.push(now_ms() - m.timestamp().to_millis().unwrap_or(0));
            progress.store(lat.len() as u64, Ordering::Relaxed);
            if lat.len() as u64 == mark {
                marked = Some(Instant::now());
            }
        }
    }
    let now = Instant::now();
    Ok(Seen {
        first: first.unwrap_or(now),
        marked: marked.unwrap_or(now),
        lat,
    })
}

fn job_config(dir: &std::path::Path) -> JobConfig {
    let mut c = CheckpointConfig::new(dir);
    c.interval = Duration::from_secs(1);
    let mut config = JobConfig::new("bench");
    config.checkpointing = Some(c);
    config.restart = RestartStrategy::None;
    config
}

fn k2k_job(
    bootstrap: &str,
    input: &str,
    output: &str,
    delivery: DeliveryGuarantee,
    dir: &std::path::Path,
) -> JobHandle {
    let source = KafkaSourceConfig::new(bootstrap, vec![input.to_owned()], unique("g"));
    let mut sink = KafkaSinkConfig::new(bootstrap, output, delivery);
    sink.client.extend(client_overrides("BENCH_SINK_CLIENT"));
    let mut job = JobBuilder::new(job_config(dir));
    // One subtask by default: on 2 cores, more consumers and producers mostly add threads.
    let parallelism: u32 = std::env::var("BENCH_PARALLELISM")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(1);
    job.source("in", parallelism, move |_| KafkaSource::new(source.clone(), RawBytes))
        .map(|r: KafkaRecord| ProducerRecord {
            key: r.key,
            value: r.value,
            timestamp: r.timestamp,
            headers: r.headers,
        })
        .sink("out", move |_| KafkaSink::new(sink.clone()).expect("valid"));
    job.build().expect("valid job").start()
}

/// The baseline: one rdkafka consumer, one idempotent producer, a loop.
fn plain_loop(bootstrap: &str, input: &str, output: &str, n: u64) -> Result<()> {
    let c = consumer(bootstrap, input, true)?;
    let p = producer(bootstrap)?;
    let mut moved = 0;
    while moved < n {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m?;
            let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(output).partition(m.partition());
            if let Some(k) = m.key() {
                rec = rec.key(k);
            }
            if let Some(v) = m.payload() {
                rec = rec.payload(v);
            }
            if let Some(ts) = m.timestamp().to_millis() {
                rec = rec.timestamp(ts);
            }
            loop {
                match p.send(rec) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        rec = back;
                        p.poll(Duration::from_millis(1));
                    }
                }
            }
            moved += 1;
        }
    }
    p.flush(Duration::from_secs(60))?;
    Ok(())
}

fn quantile(v: &mut [i64], q: f64) -> i64 {
    v.sort_unstable();
    v.get(((v.len().saturating_sub(1)) as f64 * q) as usize)
        .copied()
        .unwrap_or(0)
}

#[derive(Clone, Copy, PartialEq)]
enum K2k {
    Plain,
    AtLeastOnce,
    ExactlyOnce,
}

/// Figures of one mode with a backlog: records/s written (seen by a read_uncommitted reader, from
/// its first record to the last: the pipeline's own rate, start-up excluded), the start-up (job
/// start to first record written) and records/s committed (job start until a read_committed
/// reader has them all: start-up and the last commit included); then latency at a fixed rate.
struct K2kFigures {
    written: f64,
    startup_ms: u128,
    committed: f64,
    p50: i64,
    p99: i64,
}

/// Records/s with a backlog of `n`, then latency at `rate`/s for `secs`.
async fn k2k_run(bootstrap: &str, mode: K2k, n: u64, size: usize, rate: u64, secs: u64) -> Result<K2kFigures> {
    let (input, output) = (unique("bench-in"), unique("bench-out"));
    topic(bootstrap, &input).await?;
    topic(bootstrap, &output).await?;
    backlog(bootstrap, &input, n, size, false)?;
    let dir = tempfile::tempdir()?;
    let delivery = |m| match m {
        K2k::ExactlyOnce => DeliveryGuarantee::ExactlyOnce {
            transactional_id_prefix: unique("bench"),
            pool_size: 3,
            transaction_timeout: Duration::from_secs(120),
        },
        _ => DeliveryGuarantee::AtLeastOnce,
    };
    let paced = n + rate * secs;
    let start = Instant::now();
    let (b, o) = (bootstrap.to_owned(), output.clone());
    // read_committed, every record: when the backlog's last arrived, and the latencies.
    let seen = Arc::new(AtomicU64::new(0));
    let seen2 = seen.clone();
    let verifier = std::thread::spawn(move || verify(&b, &o, paced, n, true, &seen2, Duration::from_secs(600)));
    let (b, i, o) = (bootstrap.to_owned(), input.clone(), output.clone());
    let job = match mode {
        K2k::Plain => {
            std::thread::spawn(move || plain_loop(&b, &i, &o, paced));
            None
        }
        m => Some(k2k_job(bootstrap, &input, &output, delivery(m), dir.path())),
    };
    // The pipeline's rate: until a read_uncommitted reader has the backlog (for exactly-once,
    // written in transactions not yet committed: the final commit waits for the next checkpoint,
    // up to one interval, which the committed figure below includes).
    let (b, o) = (bootstrap.to_owned(), output.clone());
    let written =
        tokio::task::spawn_blocking(move || verify(&b, &o, n, n, false, &AtomicU64::new(0), Duration::from_secs(600)))
            .await??;
    let startup_ms = written.first.duration_since(start).as_millis();
    let written = (n - 1) as f64 / written.marked.duration_since(written.first).as_secs_f64();
    // Paced phase: records stamped at send time. It starts once the read_committed reader has the
    // backlog: a reader still catching up (4 GB of 1 KB records) would add its own delay.
    while seen.load(Ordering::Relaxed) < n {
        if verifier.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let p = producer(bootstrap)?;
    let interval = Duration::from_micros(1_000_000 / rate.max(1));
    let begin = Instant::now();
    for i in 0..rate * secs {
        let due = begin + interval * i as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        send(&p, &input, format!("k{}", i % 1000).as_bytes(), &vec![b'y'; size]);
        p.poll(Duration::ZERO);
    }
    p.flush(Duration::from_secs(60))?;
    let seen = tokio::task::spawn_blocking(move || verifier.join().expect("verifier")).await??;
    let committed = n as f64 / seen.marked.duration_since(start).as_secs_f64();
    let mut lat = seen.lat;
    let mut paced_lat: Vec<i64> = lat.split_off(n as usize);
    if let Some(j) = job {
        j.cancel();
        j.join().await?;
    }
    delete_topics(bootstrap, &[&input, &output]).await;
    // The broker removes the files a moment later (gigabytes at 8 M records): let that happen
    // before the next mode is measured rather than during it.
    tokio::time::sleep(SETTLE).await;
    Ok(K2kFigures {
        written,
        startup_ms,
        committed,
        p50: quantile(&mut paced_lat, 0.5),
        p99: quantile(&mut paced_lat, 0.99),
    })
}

pub(crate) async fn bench_k2k(
    bootstrap: &str,
    n: u64,
    sizes: &[usize],
    rounds: usize,
    report: &mut Report,
) -> Result<()> {
    let rounds = rounds.max(1);
    println!("Kafka-to-Kafka pass-through, {PARTITIONS} partitions, one subtask (BENCH_PARALLELISM), checkpoints every 1 s, {n} records backlog, then 5 s at 2000 records/s; {rounds} round(s), the three modes one after the other in each");
    println!("written/s: a read_uncommitted reader's rate from its first record to the backlog's last (the pipeline's rate); start: job start to first record written; committed/s: job start until a read_committed reader has the backlog (start-up and, exactly-once, the last commit included)");
    println!(
        "{:<8} {:<6} {:<14} {:>10} {:>7} {:>8} {:>11} {:>7} {:>7} {:>7}",
        "record", "round", "mode", "written/s", "ratio", "start ms", "committed/s", "ratio", "p50 ms", "p99 ms"
    );
    let modes = [
        (K2k::Plain, "plain loop"),
        (K2k::AtLeastOnce, "at-least-once"),
        (K2k::ExactlyOnce, "exactly-once"),
    ];
    for &size in sizes {
        // Per mode: (written ratio, committed ratio) of each round.
        let mut ratios: Vec<Vec<(f64, f64)>> = vec![Vec::new(); modes.len()];
        for round in 1..=rounds {
            let mut plain = (0.0, 0.0);
            for (i, &(mode, name)) in modes.iter().enumerate() {
                let f = k2k_run(bootstrap, mode, n, size, 2000, 5).await?;
                if mode == K2k::Plain {
                    plain = (f.written, f.committed);
                }
                let r = (f.written / plain.0, f.committed / plain.1);
                ratios[i].push(r);
                println!(
                    "{:<8} {:<6} {:<14} {:>10.0} {:>7.3} {:>8} {:>11.0} {:>7.3} {:>7} {:>7}",
                    format!("{size} B"),
                    round,
                    name,
                    f.written,
                    r.0,
                    f.startup_ms,
                    f.committed,
                    r.1,
                    f.p50,
                    f.p99
                );
                report.row(
                    "k2k",
                    &format!("{size} B round {round} {name}"),
                    &[
                        ("written_records_per_s", f.written),
                        ("written_ratio_to_plain", r.0),
                        ("startup_ms", f.startup_ms as f64),
                        ("committed_records_per_s", f.committed),
                        ("committed_ratio_to_plain", r.1),
                        ("p50_ms", f.p50 as f64),
                        ("p99_ms", f.p99 as f64),
                    ],
                );
            }
        }
        if rounds > 1 {
            for (i, &(_, name)) in modes.iter().enumerate().skip(1) {
                let written = median(ratios[i].iter().map(|r| r.0).collect());
                let committed = median(ratios[i].iter().map(|r| r.1).collect());
                println!(
                    "{:<8} {:<6} {:<14} {:>10} {:>7.3} {:>8} {:>11} {:>7.3}",
                    format!("{size} B"),
                    "median",
                    name,
                    "",
                    written,
                    "",
                    "",
                    committed
                );
                report.row(
                    "k2k",
                    &format!("{size} B median {name}"),
                    &[
                        ("written_ratio_to_plain", written),
                        ("committed_ratio_to_plain", committed),
                    ],
                );
            }
        }
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Counts records; `done` is polled by the benchmark.
struct Count(Arc<AtomicU64>);

impl<T: Send + 'static> Sink<T> for Count {
    async fn write(&mut self, records: Vec<T>) -> exactly_core::Result<()> {
        self.0.fetch_add(records.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

pub(crate) async fn bench_source(bootstrap: &str, n: u64, report: &mut Report) -> Result<()> {
    let input = unique("bench-src");
    topic(bootstrap, &input).await?;
    backlog(bootstrap, &input, n, 100, false)?;
    println!(
        "Kafka source vs plain rdkafka consumer loop: {n} records of 100 B, {PARTITIONS} partitions, one reader each"
    );
    let mut rates = Vec::new();
    for round in 0..2 {
        // plain
        // Rates are timed from the first record on, so start-up (metadata, offset look-ups, job
        // set-up) does not count for either side.
        let created = Instant::now();
        let c = consumer(bootstrap, &input, true)?;
        let mut start = None;
        let mut seen = 0;
        while seen < n {
            if let Some(m) = c.poll(Duration::from_millis(100)) {
                let m = m?;
                start.get_or_insert_with(Instant::now);
                std::hint::black_box(m.payload());
                seen += 1;
            }
        }
        let plain = (n - 1) as f64 / start.expect("records").elapsed().as_secs_f64();
        let plain_total = n as f64 / created.elapsed().as_secs_f64();
        // this source, one subtask, checkpoints every second
        let dir = tempfile::tempdir()?;
        let count = Arc::new(AtomicU64::new(0));
        let mut source = KafkaSourceConfig::new(bootstrap, vec![input.clone()], unique("g"));
        source.client.extend(client_overrides("BENCH_SOURCE_CLIENT"));
        let mut job = JobBuilder::new(job_config(dir.path()));
        let c2 = count.clone();
        job.source("in", 1, move |_| KafkaSource::new(source.clone(), RawBytes))
            .sink("count", move |_| Count(c2.clone()));
        let created = Instant::now();
        let handle = job.build()?.start();
        while count.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (start, first) = (Instant::now(), count.load(Ordering::Relaxed));
        while count.load(Ordering::Relaxed) < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let ours = (n - first) as f64 / start.elapsed().as_secs_f64();
        let ours_total = n as f64 / created.elapsed().as_secs_f64();
        handle.cancel();
        handle.join().await?;
        println!(
            "round {}: from the first record: plain loop {plain:>9.0}/s, exactly source {ours:>9.0}/s, ratio {:.3}; including start-up: {plain_total:>9.0}/s vs {ours_total:>9.0}/s, ratio {:.3}",
            round + 1,
            ours / plain,
            ours_total / plain_total
        );
        rates.push(ours / plain);
        report.row(
            "source",
            &format!("round {}", round + 1),
            &[
                ("plain_records_per_s", plain),
                ("exactly_records_per_s", ours),
                ("ratio", ours / plain),
                ("plain_with_startup_records_per_s", plain_total),
                ("exactly_with_startup_records_per_s", ours_total),
                ("ratio_with_startup", ours_total / plain_total),
            ],
        );
    }
    delete_topics(bootstrap, &[&input]).await;
    Ok(())
}

pub(crate) async fn bench_mysql(bootstrap: &str, mysql: &str, n: u64, report: &mut Report) -> Result<()> {
    let input = unique("bench-sql");
    topic(bootstrap, &input).await?;
    backlog(bootstrap, &input, n, 0, true)?;
    println!("Kafka-to-MySQL: {n} rows (id, k, seq), batches of 500, checkpoints every 1 s");
    let col = |name: &str, ty, key: bool| {
        let c = Column::new(name, ty).length(32);
        if key {
            c.key()
        } else {
            c
        }
    };
    let mapping = Mapping {
        format: Format::Delimited { delimiter: ',' },
        columns: vec![
            col("id", ColumnType::Bigint, true),
            col("k", ColumnType::Varchar, false),
            col("seq", ColumnType::Bigint, false),
        ],
    };
    // Baseline: read the same records, plain batched INSERTs, autocommit per batch.
    let table = unique("bench_plain").replace('-', "_");
    let mut conn = {
        use sqlx::ConnectOptions;
        let o: sqlx::mysql::MySqlConnectOptions = mysql.parse()?;
        o.connect().await?
    };
    sqlx::Executor::execute(&mut conn, mapping.ddl(&table).as_str()).await?;
    let c = consumer(bootstrap, &input, true)?;
    let start = Instant::now();
    let mut seen = 0u64;
    let mut batch: Vec<(i64, String, i64)> = Vec::new();
    while seen < n {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m?;
            let text = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            let f: Vec<&str> = text.split(',').collect();
            batch.push((f[0].parse()?, f[1].to_owned(), f[2].parse()?));
            seen += 1;
        }
        if batch.len() >= 500 || (seen == n && !batch.is_empty()) {
            let mut qb = sqlx::QueryBuilder::<sqlx::MySql>::new(format!("INSERT INTO `{table}` (id, k, seq) "));
            qb.push_values(batch.drain(..), |mut b, (id, k, s)| {
                b.push_bind(id).push_bind(k).push_bind(s);
            });
            qb.build().execute(&mut conn).await?;
        }
    }
    let plain = n as f64 / start.elapsed().as_secs_f64();
    println!("{:<22} {:>12.0} rows/s   ratio 1.000", "plain INSERT loop", plain);
    report.row("mysql", "plain INSERT loop", &[("rows_per_s", plain), ("ratio", 1.0)]);
    sqlx::Executor::execute(&mut conn, format!("DROP TABLE IF EXISTS `{table}`").as_str()).await?;
    for mode in [Mode::Xa, Mode::Upsert] {
        let table = unique("bench_rows").replace('-', "_");
        let job_id = unique("bench");
        let config = MysqlSinkConfig {
            url: mysql.to_owned(),
            password_file: None,
            table: table.clone(),
            mode,
            job_id: job_id.clone(),
            sink_id: "rows".into(),
            mapping: mapping.clone(),
            batch_size: 500,
            create_table: true,
            progress_table: "bench_progress".into(),
            on_error: OnError::Fail,
        };
        let source = KafkaSourceConfig::new(bootstrap, vec![input.clone()], unique("g"));
        let dir = tempfile::tempdir()?;
        let mut job = JobBuilder::new(job_config(dir.path()));
        job.source("in", 1, move |_| KafkaSource::new(source.clone(), RawBytes))
            .map(|r: KafkaRecord| SinkRecord {
                tombstone: r.value.is_none(),
                payload: r.value.unwrap_or_default(),
                key: r.key,
                origin: Some(Origin {
                    topic: r.topic.to_string(),
                    partition: r.partition,
                    offset: r.offset,
                }),
            })
            .sink("mysql", move |_| MysqlSink::new(config.clone()).expect("valid"));
        let start = Instant::now();
        let handle = job.build()?.start();
        loop {
            // The progress rows (a few, by primary key) say how many rows are committed; a
            // COUNT(*) of the table would scan it and slow down the writer it measures.
            let rows: i64 = sqlx::query_scalar(
                "SELECT CAST(COALESCE(SUM(rows_written), 0) AS SIGNED) FROM bench_progress WHERE job = ?",
            )
            .bind(&job_id)
            .fetch_one(&mut conn)
            .await
            .unwrap_or(0);
            if rows as u64 >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let rate = n as f64 / start.elapsed().as_secs_f64();
        handle.cancel();
        handle.join().await?;
        let name = if mode == Mode::Xa {
            "xa (two-phase)"
        } else {
            "upsert (idempotent)"
        };
        println!("{name:<22} {rate:>12.0} rows/s   ratio {:.3}", rate / plain);
        report.row("mysql", name, &[("rows_per_s", rate), ("ratio", rate / plain)]);
        sqlx::Executor::execute(&mut conn, format!("DROP TABLE IF EXISTS `{table}`").as_str()).await?;
    }
    delete_topics(bootstrap, &[&input]).await;
    Ok(())
}
