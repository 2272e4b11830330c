//! `exactly bench k2k`: Kafka-to-Kafka exactly-once and at-least-once vs a plain consume-produce
//! loop (rates with a backlog, then end-to-end latency at a fixed rate).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::cpu::{self, CpuClock, CpuPerRecord};
use super::kafka::*;
use super::{median, BenchOptions, Report};
use exactly_core::coordinator::WhenCaughtUp;
use exactly_core::runtime::{JobBuilder, JobHandle};
use exactly_kafka_client::Cluster;
use exactly_kafka_sink::{DeliveryGuarantee, KafkaSink, KafkaSinkConfig};
use exactly_kafka_source::{KafkaSource, RawBytes};
use rdkafka::consumer::Consumer;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::Message;

/// What one measured run runs: the mode, its checkpoint interval and parallelism.
#[derive(Clone, Copy)]
pub(super) struct Pipeline {
    pub(super) mode: K2k,
    pub(super) interval: Duration,
    pub(super) parallelism: u32,
}

/// The pass-through job of an at-least-once or exactly-once `pipeline`.
pub(super) fn k2k_job(
    cluster: &Cluster,
    input: &str,
    output: &str,
    dir: &std::path::Path,
    pipeline: Pipeline,
) -> JobHandle {
    let delivery = match pipeline.mode {
        K2k::ExactlyOnce(_) => DeliveryGuarantee::ExactlyOnce {
            transactional_id_prefix: unique("bench"),
            pool_size: 3,
            max_pool_size: exactly_kafka_sink::DEFAULT_MAX_POOL_SIZE,
            transaction_timeout: Duration::from_secs(120),
            accept_unknown_outcome_up_to: None,
        },
        _ => DeliveryGuarantee::AtLeastOnce,
    };
    let mut source = source_config(cluster, input, &unique("g"));
    source.client.extend(client_overrides("BENCH_SOURCE_CLIENT"));
    let mut sink = KafkaSinkConfig::new(cluster.bootstrap.clone(), output, delivery);
    sink.security = cluster.security.clone();
    sink.client.extend(client_overrides("BENCH_SINK_CLIENT"));
    let mut config = job_config_every(dir, pipeline.interval);
    if let (Some(c), K2k::ExactlyOnce(when)) = (config.checkpointing.as_mut(), pipeline.mode) {
        c.when_caught_up = when;
    }
    let mut job = JobBuilder::new(config);
    job.source("in", pipeline.parallelism, move |_| {
        KafkaSource::new(source.clone(), RawBytes)
    })
    .map(exactly_jobs::records::to_kafka)
    .sink("out", move |_| KafkaSink::new(sink.clone()).expect("valid"));
    job.build().expect("valid job").start()
}

/// The baseline: one rdkafka consumer, one idempotent producer, a loop.
///
/// With `transactions`, the textbook exactly-once loop of Kafka's own clients instead: the producer
/// is transactional and commits a transaction every `transactions`, the consumer's positions
/// inside it (`send_offsets_to_transaction`) — what Kafka's transactions cost on this machine,
/// without exactly's engine (`--modes plain-transactional`).
pub(super) fn plain_loop(
    cluster: &Cluster,
    input: &str,
    output: &str,
    n: u64,
    transactions: Option<Duration>,
) -> Result<()> {
    let c = consumer(cluster, input, true)?;
    // Partition for partition, unless `bench partitions` has the producer partition by key.
    let same_partition = std::env::var_os("BENCH_LOOP_PARTITIONER").is_none();
    let p = match transactions {
        None => producer(cluster)?,
        Some(_) => {
            let p: BaseProducer = producer_config(cluster)?
                .set("transactional.id", unique("bench-loop"))
                .create()?;
            p.init_transactions(TXN_TIMEOUT)?;
            p.begin_transaction()?;
            p
        }
    };
    let mut moved = 0;
    let mut committed_at = Instant::now();
    while moved < n {
        let polled = c.poll(Duration::from_millis(100));
        // The clock is read every 16 records (or when nothing came), not per record: the loop is
        // a baseline and should not pay for its own bookkeeping (8 ms late at 2 000 records/s).
        let check_clock = polled.is_none() || moved % 16 == 15;
        if let Some(m) = polled {
            let m = m?;
            let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(output);
            if same_partition {
                rec = rec.partition(m.partition());
            }
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
        if let Some(every) = transactions {
            if moved == n || (check_clock && committed_at.elapsed() >= every) {
                let group = c
                    .group_metadata()
                    .ok_or_else(|| anyhow::anyhow!("the loop's consumer has no group metadata"))?;
                p.send_offsets_to_transaction(&c.position()?, &group, TXN_TIMEOUT)?;
                p.commit_transaction(TXN_TIMEOUT)?;
                if moved < n {
                    p.begin_transaction()?;
                }
                committed_at = Instant::now();
            }
        }
    }
    p.flush(Duration::from_secs(60))?;
    Ok(())
}

/// How long the transactional loop's transaction calls may take.
const TXN_TIMEOUT: Duration = Duration::from_secs(60);

pub(super) fn quantile(v: &mut [i64], q: f64) -> i64 {
    v.sort_unstable();
    v.get(((v.len().saturating_sub(1)) as f64 * q) as usize)
        .copied()
        .unwrap_or(0)
}

#[derive(Clone, Copy, PartialEq)]
pub(super) enum K2k {
    Plain,
    /// The plain loop with a transaction per checkpoint interval.
    PlainTransactional,
    AtLeastOnce,
    /// Exactly-once with this `checkpoint.when_caught_up`.
    ExactlyOnce(WhenCaughtUp),
}

/// A mode of `bench k2k` measured against the plain loop (which always runs first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum K2kMode {
    /// The plain loop once more, after the first: whether running later in a round changes a
    /// mode's figures (the ratio of this row is the loop against itself).
    PlainAgain,
    /// A second baseline: the plain loop with a Kafka transaction per checkpoint interval
    /// (transactional producer, consumer positions sent to the transaction), no engine.
    PlainTransactional,
    /// The Kafka sink at-least-once (idempotent producer, flushed at every barrier).
    AtLeastOnce,
    /// The Kafka sink exactly-once (transactions committed at checkpoint completion), checkpoints
    /// as configured by default (at the interval, and once the source caught up after a backlog).
    ExactlyOnce,
    /// Exactly-once with `[checkpoints] when_caught_up = false`: at the interval only.
    ExactlyOnceInterval,
    /// Exactly-once with `[checkpoints] when_caught_up = true`: also whenever the source caught up.
    ExactlyOnceCaughtUp,
}

impl K2kMode {
    fn mode(self) -> (K2k, &'static str) {
        match self {
            K2kMode::PlainAgain => (K2k::Plain, "plain loop again"),
            K2kMode::PlainTransactional => (K2k::PlainTransactional, "plain transactional"),
            K2kMode::AtLeastOnce => (K2k::AtLeastOnce, "at-least-once"),
            K2kMode::ExactlyOnce => (K2k::ExactlyOnce(WhenCaughtUp::default()), "exactly-once"),
            K2kMode::ExactlyOnceInterval => (K2k::ExactlyOnce(WhenCaughtUp::Never), "exactly-once interval"),
            K2kMode::ExactlyOnceCaughtUp => (K2k::ExactlyOnce(WhenCaughtUp::Always), "exactly-once caught-up"),
        }
    }
}

/// Figures of one mode with a backlog: records/s written (seen by a read_uncommitted reader, from
/// its first record to the last: the pipeline's own rate, start-up excluded), the start-up (job
/// start to first record written) and records/s committed (job start until a read_committed
/// reader has them all: start-up and the last commit included); then latency at a fixed rate.
pub(super) struct K2kFigures {
    written: f64,
    startup_ms: u128,
    committed: f64,
    /// Timed from outside as `bench peers` times every system: from a read_uncommitted reader's
    /// first record until a read_committed reader has the backlog (start-up excluded, the last
    /// commit included).
    timed: f64,
    /// From the same first record until the last stable offsets show every record of the backlog
    /// visible to read_committed readers: `timed` without the reader's own time to read the last
    /// transaction once it is committed.
    visible: f64,
    p50: i64,
    p99: i64,
    /// CPU per record from the start of the run until a read_committed reader has the backlog.
    cpu: CpuPerRecord,
}

/// Records/s with a backlog of `n`, then latency at `rate`/s for `secs`.
pub(super) async fn k2k_run(
    cluster: &Cluster,
    pipeline: Pipeline,
    n: u64,
    size: usize,
    rate: u64,
    secs: u64,
) -> Result<K2kFigures> {
    let (input, output) = (unique("bench-in"), unique("bench-out"));
    topic(cluster, &input).await?;
    topic(cluster, &output).await?;
    backlog(cluster, &input, n, size, false)?;
    let dir = tempfile::tempdir()?;
    let paced = n + rate * secs;
    // The paced phase's producer, made now: a new idempotent producer spends its first few hundred
    // ms on metadata and a producer id, which would be counted as the first records' latency.
    let p = producer(cluster)?;
    p.client()
        .fetch_metadata(Some(&input), Duration::from_secs(10))
        .map_err(|e| anyhow::anyhow!("metadata of {input}: {e}"))?;
    let start = Instant::now();
    let cpu = CpuClock::start(is_local(cluster));
    // The output's last stable offsets, sampled until the read_committed reader has the backlog.
    let stable = StableOffsets::start(cluster, &output);
    let (b, o) = (cluster.clone(), output.clone());
    // read_committed, every record: when the backlog's last arrived, and the latencies.
    let seen = Arc::new(AtomicU64::new(0));
    let seen2 = seen.clone();
    let verifier = std::thread::spawn(move || verify(&b, &o, paced, n, true, &seen2, Duration::from_secs(600)));
    let (b, i, o) = (cluster.clone(), input.clone(), output.clone());
    let (job, plain) = match pipeline.mode {
        K2k::Plain | K2k::PlainTransactional => {
            let transactions = (pipeline.mode == K2k::PlainTransactional).then_some(pipeline.interval);
            let run = std::thread::spawn(move || {
                let r = plain_loop(&b, &i, &o, paced, transactions);
                if let Err(e) = &r {
                    // Said at once: the readers would otherwise wait for their deadline.
                    eprintln!("the plain loop failed: {e:#}");
                }
                r
            });
            (None, Some(run))
        }
        _ => (Some(k2k_job(cluster, &input, &output, dir.path(), pipeline)), None),
    };
    // The pipeline's rate: until a read_uncommitted reader has the backlog (for exactly-once,
    // written in transactions not yet committed: the final commit waits for the next checkpoint,
    // up to one interval, which the committed figure below includes).
    let (b, o) = (cluster.clone(), output.clone());
    let written =
        tokio::task::spawn_blocking(move || verify(&b, &o, n, n, false, &AtomicU64::new(0), Duration::from_secs(600)))
            .await??;
    let startup_ms = written.first.duration_since(start).as_millis();
    let first_written = written.first;
    let last_offsets = written.last_offsets;
    let written = (n - 1) as f64 / written.marked.duration_since(written.first).as_secs_f64();
    // Paced phase: records stamped at send time. It starts once the read_committed reader has the
    // backlog: a reader still catching up (4 GB of 1 KB records) would add its own delay.
    while seen.load(Ordering::Relaxed) < n {
        if verifier.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = cpu.per_record(n);
    let visible_at = stable.visible_at(last_offsets).await?;
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
    let timed = n as f64 / seen.marked.duration_since(first_written).as_secs_f64();
    let visible_at = visible_at.ok_or_else(|| {
        anyhow::anyhow!("the last stable offsets of {output} never passed the backlog's last records")
    })?;
    let visible = n as f64 / visible_at.duration_since(first_written).as_secs_f64();
    let mut paced_lat = seen.lat;
    if let Some(j) = job {
        j.cancel();
        j.join().await?;
    }
    if let Some(run) = plain {
        tokio::task::spawn_blocking(move || run.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the plain loop panicked"))??;
    }
    delete_topics(cluster, &[&input, &output]).await;
    // The broker removes the files a moment later (gigabytes at 8 M records): let that happen
    // before the next mode is measured rather than during it.
    tokio::time::sleep(SETTLE).await;
    Ok(K2kFigures {
        written,
        startup_ms,
        committed,
        timed,
        visible,
        p50: quantile(&mut paced_lat, 0.5),
        p99: quantile(&mut paced_lat, 0.99),
        cpu,
    })
}

pub(crate) async fn bench_k2k(cluster: &Cluster, n: u64, o: &BenchOptions, report: &mut Report) -> Result<()> {
    let (sizes, intervals, parallelism) = (&o.sizes, &o.intervals, o.parallelism);
    let rounds = o.rounds.max(1);
    let subtasks = match parallelism {
        1 => "one subtask".to_owned(),
        p => format!("{p} subtasks"),
    };
    println!("Kafka-to-Kafka pass-through, {PARTITIONS} partitions, {subtasks} (--parallelism; the plain loop is one loop), checkpoints every --intervals (record column: size and interval), {n} records backlog, then 5 s at 2000 records/s; {rounds} round(s), the modes one after the other in each (exactly-once: checkpoints by default, at the interval and once the source caught up after a backlog; interval: when_caught_up = false; caught-up: when_caught_up = true)");
    println!("written/s: a read_uncommitted reader's rate from its first record to the backlog's last (the pipeline's rate); start: job start to first record written; committed/s: job start until a read_committed reader has the backlog (start-up and, exactly-once, the last commit included); timed/s: from the first record written until a read_committed reader has the backlog (start-up excluded, the last commit included: how `bench peers` times every system); visible/s: from the same first record until the output's last stable offsets (ListOffsets at read_committed, every 10 ms) pass the backlog's last record in every partition (timed/s without the reader's own time to read the last transaction once committed); cpu µs: CPU per record of this process (the pipeline and the two readers, which cost the same in every mode) from the start until the read_committed reader has the backlog; broker µs: the same of the local broker (`BENCH_BROKER_PID`, else the one local `kafka.Kafka` process; `-` when not found)");
    println!(
        "{:<14} {:<6} {:<22} {:>10} {:>7} {:>8} {:>11} {:>7} {:>10} {:>7} {:>10} {:>7} {:>7} {:>7} {:>7} {:>9}",
        "record",
        "round",
        "mode",
        "written/s",
        "ratio",
        "start ms",
        "committed/s",
        "ratio",
        "timed/s",
        "ratio",
        "visible/s",
        "ratio",
        "p50 ms",
        "p99 ms",
        "cpu µs",
        "broker µs"
    );
    let modes: Vec<(K2k, &str)> = std::iter::once((K2k::Plain, "plain loop"))
        .chain(o.modes.iter().map(|m| m.mode()))
        .collect();
    for (&size, &interval) in sizes.iter().flat_map(|s| intervals.iter().map(move |i| (s, i))) {
        let record = format!("{size} B {}", humantime::format_duration(interval));
        // Per mode: (written, committed, timed, visible) ratio of each round.
        let mut ratios: Vec<Vec<[f64; 4]>> = vec![Vec::new(); modes.len()];
        for round in 1..=rounds {
            let mut plain = [0.0; 4];
            for (i, &(mode, name)) in modes.iter().enumerate() {
                let pipeline = Pipeline {
                    mode,
                    interval,
                    parallelism,
                };
                let f = k2k_run(cluster, pipeline, n, size, 2000, 5).await?;
                let rates = [f.written, f.committed, f.timed, f.visible];
                if i == 0 {
                    plain = rates;
                }
                let r: [f64; 4] = std::array::from_fn(|k| rates[k] / plain[k]);
                ratios[i].push(r);
                println!(
                    "{:<14} {:<6} {:<22} {:>10.0} {:>7.3} {:>8} {:>11.0} {:>7.3} {:>10.0} {:>7.3} {:>10.0} {:>7.3} {:>7} {:>7} {:>7} {:>9}",
                    record, round, name, f.written, r[0], f.startup_ms, f.committed, r[1], f.timed, r[2], f.visible, r[3], f.p50, f.p99,
                    cpu::show(f.cpu.process), cpu::show(f.cpu.broker)
                );
                report.row(
                    "k2k",
                    &format!("{record} round {round} {name}"),
                    &[
                        ("written_records_per_s", f.written),
                        ("written_ratio_to_plain", r[0]),
                        ("startup_ms", f.startup_ms as f64),
                        ("committed_records_per_s", f.committed),
                        ("committed_ratio_to_plain", r[1]),
                        ("timed_records_per_s", f.timed),
                        ("timed_ratio_to_plain", r[2]),
                        ("visible_records_per_s", f.visible),
                        ("visible_ratio_to_plain", r[3]),
                        ("p50_ms", f.p50 as f64),
                        ("p99_ms", f.p99 as f64),
                    ]
                    .into_iter()
                    .chain(f.cpu.process.map(|v| ("cpu_us_per_record", v)))
                    .chain(f.cpu.broker.map(|v| ("broker_cpu_us_per_record", v)))
                    .collect::<Vec<_>>(),
                );
            }
        }
        if rounds > 1 {
            for (i, &(_, name)) in modes.iter().enumerate().skip(1) {
                let [written, committed, timed, visible] =
                    std::array::from_fn(|k| median(ratios[i].iter().map(|r| r[k]).collect()));
                println!(
                    "{:<14} {:<6} {:<22} {:>10} {:>7.3} {:>8} {:>11} {:>7.3} {:>10} {:>7.3} {:>10} {:>7.3}",
                    record, "median", name, "", written, "", "", committed, "", timed, "", visible
                );
                report.row(
                    "k2k",
                    &format!("{record} median {name}"),
                    &[
                        ("written_ratio_to_plain", written),
                        ("committed_ratio_to_plain", committed),
                        ("timed_ratio_to_plain", timed),
                        ("visible_ratio_to_plain", visible),
                    ],
                );
            }
        }
    }
    Ok(())
}
