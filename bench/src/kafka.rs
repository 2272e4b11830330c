//! Benchmarks against the real services, each measured side by side with its baseline in the
//! same run (machines are noisy: ratios hold, absolute numbers do not).
//!
//! `exactly bench source|k2k|mysql [--records N] [--sizes 100,1024]` (services from `EXACTLY_KAFKA_BOOTSTRAP` and
//! `EXACTLY_MYSQL_URL`, as printed by `scripts/services env`, or `--bootstrap`/`--mysql`; a secured
//! cluster's TLS and SASL from `--kafka-config FILE`, for every client of the run, the baselines' too).
//!
//! - source: this Kafka source (in a job, checkpoints every 1 s) vs a plain rdkafka consumer loop.
//! - k2k: Kafka-to-Kafka pass-through with exactly-once, at-least-once, and a plain rdkafka
//!   consume-and-produce loop (optionally also that loop with a transaction per interval), for
//!   100-byte and 1 KB records, checkpoints every `--intervals`: records/s with a backlog,
//!   written (seen by a read_uncommitted reader: the pipeline's rate) and committed (seen by a
//!   read_committed reader: exactly-once waits for the commit after the next checkpoint), then
//!   p50/p99 end-to-end latency to a read_committed consumer at a fixed rate.
//! - mysql: rows/s for xa, upsert, and a plain batched INSERT loop, for the same input.
//!
//! This module holds what the benchmarks against the services share (topics, producers,
//! consumers, the independent verifier); `k2k.rs`, `source.rs` and `mysql.rs` hold one each.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};

use exactly_core::coordinator::CheckpointConfig;
use exactly_core::restart::RestartStrategy;
use exactly_core::runtime::JobConfig;
use exactly_kafka_client::Cluster;
use exactly_kafka_source::KafkaSourceConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

pub(super) const PARTITIONS: i32 = 3;
/// Pause after deleting a mode's topics (the local broker deletes files 1 s after the topic).
pub(super) const SETTLE: Duration = Duration::from_secs(5);

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(super) fn unique(p: &str) -> String {
    format!("{p}-{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

/// The start of every client configuration of the benchmarks: the cluster's bootstrap servers and
/// its TLS and SASL settings (`--kafka-config`).
pub(super) fn client_config(cluster: &Cluster) -> Result<ClientConfig> {
    cluster
        .client_config()
        .map_err(|e| anyhow::anyhow!("Kafka settings for {}: {e}", cluster.bootstrap))
}

pub(super) async fn topic(cluster: &Cluster, name: &str) -> Result<()> {
    create_topic(cluster, name, PARTITIONS).await
}

/// Creates topic `name` with `partitions` partitions.
pub(super) async fn create_topic(cluster: &Cluster, name: &str, partitions: i32) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client_config(cluster)?.create()?;
    for r in admin
        .create_topics(
            &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await?
    {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    Ok(())
}

/// Whether every bootstrap address of `cluster` is this machine's (a loopback address or
/// `localhost`): only then is a local broker process the cluster's.
pub(super) fn is_local(cluster: &Cluster) -> bool {
    cluster.addresses().all(|a| {
        let host = a.rsplit_once(':').map_or(a, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    })
}

/// A Kafka source's settings for `cluster` (its TLS and SASL too): reads `input` in `group`.
pub(super) fn source_config(cluster: &Cluster, input: &str, group: &str) -> KafkaSourceConfig {
    let mut c = KafkaSourceConfig::new(cluster.bootstrap.clone(), vec![input.to_owned()], group);
    c.security = cluster.security.clone();
    c
}

/// librdkafka settings from the environment variable `var` (`key=value,key=value`), for trying
/// client tuning without rebuilding.
pub(super) fn client_overrides(var: &str) -> Vec<(String, String)> {
    std::env::var(var)
        .unwrap_or_default()
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Deletes the benchmark's topics (a large backlog per run would fill the broker's disk).
pub(super) async fn delete_topics(cluster: &Cluster, names: &[&str]) {
    let admin: Result<AdminClient<DefaultClientContext>> =
        client_config(cluster).and_then(|c| c.create().map_err(anyhow::Error::from));
    match admin {
        Ok(a) => {
            if let Err(e) = a.delete_topics(names, &AdminOptions::new()).await {
                eprintln!("warning: could not delete benchmark topics {names:?}: {e}");
            }
        }
        Err(e) => eprintln!("warning: could not delete benchmark topics {names:?}: {e}"),
    }
}

pub(super) fn producer(cluster: &Cluster) -> Result<BaseProducer> {
    Ok(producer_config(cluster)?.create()?)
}

/// The settings of [`producer`]: idempotent, 10 ms linger, a queue of a million records.
pub(super) fn producer_config(cluster: &Cluster) -> Result<ClientConfig> {
    let mut c = client_config(cluster)?;
    c.set("linger.ms", "10")
        .set("enable.idempotence", "true")
        .set("queue.buffering.max.messages", "1000000");
    // `bench partitions` has its loops partition by key, as exactly's sink does.
    if let Ok(p) = std::env::var("BENCH_LOOP_PARTITIONER") {
        c.set("partitioner", p);
    }
    Ok(c)
}

pub(super) fn send(p: &BaseProducer, topic: &str, key: &[u8], value: &[u8]) {
    send_record(p, BaseRecord::to(topic).key(key).payload(value).timestamp(now_ms()));
}

/// Queues `rec`, serving the producer while its queue is full.
pub(super) fn send_record(p: &BaseProducer, mut rec: BaseRecord<'_, [u8], [u8]>) {
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

pub(super) fn backlog(cluster: &Cluster, topic: &str, n: u64, size: usize, csv: bool) -> Result<()> {
    let p = producer(cluster)?;
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

pub(super) fn consumer(cluster: &Cluster, topic: &str, committed: bool) -> Result<BaseConsumer> {
    let mut cfg = client_config(cluster)?;
    for (k, v) in client_overrides("BENCH_PLAIN_CLIENT") {
        cfg.set(k, v);
    }
    // The baseline gets the source's `fetch.queue.backoff.ms` (see the source's consumer), not its
    // smaller prefetch (`queued.min.messages`, for memory): the loop measured no faster with a
    // smaller one (2 M × 100 B: 697 / 653 / 839 / 766 k records/s with librdkafka's 100 000, then
    // 610 / 732 / 678 / 670 k with 20 000, alternating; `BENCH_PLAIN_CLIENT` sets it).
    let c: BaseConsumer = cfg
        .set("fetch.queue.backoff.ms", "10")
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
    for p in 0..partitions_of(&c, topic)? {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    Ok(c)
}

/// How many partitions `topic` has (asked until the broker knows it: a topic just created may be
/// unknown to it for a moment).
pub(super) fn partitions_of<C: rdkafka::consumer::ConsumerContext>(c: &BaseConsumer<C>, topic: &str) -> Result<i32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let md = c.fetch_metadata(Some(topic), Duration::from_secs(10));
        if let Some(t) = md.as_ref().ok().and_then(|md| {
            md.topics()
                .iter()
                .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
                .map(|t| t.partitions().len())
        }) {
            return Ok(t as i32);
        }
        if Instant::now() > deadline {
            bail!("{topic}: no partitions in the metadata after 30 s ({:?})", md.err());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What a reader saw: when the first and the `mark`-th record arrived, and the latency of each
/// (receive time minus record timestamp, ms).
pub(super) struct Seen {
    pub(super) first: Instant,
    pub(super) marked: Instant,
    /// Latency (now − record timestamp, ms) of each record after the `mark`-th.
    pub(super) lat: Vec<i64>,
    /// The highest offset of the first `mark` records in each partition (−1: none there).
    pub(super) last_offsets: Vec<i64>,
}

/// Reads `n` records of `topic` (read_committed or not), counting them in `progress`.
///
/// Measures while the systems under test run on the same cores, so it does as little per record
/// as it can: the clock is read for the first record, the `mark`-th and those after it (whose
/// latency is wanted), not for the backlog before it.
pub(super) fn verify(
    cluster: &Cluster,
    topic: &str,
    n: u64,
    mark: u64,
    committed: bool,
    progress: &AtomicU64,
    deadline: Duration,
) -> Result<Seen> {
    let c = consumer(cluster, topic, committed)?;
    let end = Instant::now() + deadline;
    let mut lat = Vec::with_capacity(n.saturating_sub(mark) as usize);
    let (mut first, mut marked) = (None, None);
    let mut last_offsets = vec![-1i64; c.assignment()?.count()];
    let mut count = 0u64;
    while count < n {
        match c.poll(Duration::from_millis(100)) {
            Some(m) => {
                let m = m?;
                count += 1;
                if count == 1 {
                    first = Some(Instant::now());
                }
                if count <= mark {
                    if let Some(last) = last_offsets.get_mut(m.partition() as usize) {
                        *last = (*last).max(m.offset());
                    }
                }
                if count > mark {
                    lat.push(now_ms() - m.timestamp().to_millis().unwrap_or(0));
                }
                if count == mark {
                    marked = Some(Instant::now());
                }
                if count.is_multiple_of(1024) || count >= mark {
                    progress.store(count, Ordering::Relaxed);
                }
            }
            None => {
                progress.store(count, Ordering::Relaxed);
                if Instant::now() > end {
                    bail!("only {count} of {n} records arrived in {topic}");
                }
            }
        }
    }
    progress.store(count, Ordering::Relaxed);
    let now = Instant::now();
    Ok(Seen {
        first: first.unwrap_or(now),
        marked: marked.unwrap_or(now),
        lat,
        last_offsets,
    })
}

/// The last stable offsets of a topic's partitions (what a read_committed reader may read up to),
/// sampled every 10 ms on a thread of their own from [`StableOffsets::start`] until
/// [`StableOffsets::visible_at`].
pub(super) struct StableOffsets {
    stop: Arc<AtomicBool>,
    samples: std::thread::JoinHandle<Result<Vec<Sample>>>,
}

/// When an answer came, and the last stable offset of each partition in it.
type Sample = (Instant, Vec<i64>);

impl StableOffsets {
    pub(super) fn start(cluster: &Cluster, topic: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (b, t, s) = (cluster.clone(), topic.to_owned(), stop.clone());
        StableOffsets {
            stop,
            samples: std::thread::spawn(move || sample(&b, &t, &s)),
        }
    }

    /// Stops sampling (once everything was read, so the last sample shows it) and answers the
    /// first sample in which every partition's last stable offset lay past `last` (the highest
    /// offset of the records wanted there): from then on a read_committed reader could read them all.
    pub(super) async fn visible_at(self, last: Vec<i64>) -> Result<Option<Instant>> {
        self.stop.store(true, Ordering::Relaxed);
        let samples = tokio::task::spawn_blocking(move || self.samples.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the stable-offset sampler panicked"))??;
        Ok(samples
            .iter()
            .find(|(_, stable)| last.iter().zip(stable).all(|(l, s)| s > l))
            .map(|(t, _)| *t))
    }
}

/// A [`Sample`] every 10 ms until `stop` is set, and once after. A sample whose question failed (a
/// busy broker) is left out; the one after `stop` is asked up to three times.
fn sample(cluster: &Cluster, topic: &str, stop: &AtomicBool) -> Result<Vec<Sample>> {
    // Assigned nothing (it only asks); ListOffsets at its isolation level answers the last stable offset.
    let mut cfg = client_config(cluster)?;
    for (k, v) in client_overrides("BENCH_PLAIN_CLIENT") {
        cfg.set(k, v);
    }
    let c: BaseConsumer = cfg
        .set("group.id", unique("bench-stable"))
        .set("isolation.level", "read_committed")
        .create()?;
    let partitions = partitions_of(&c, topic)?;
    let mut samples = Vec::new();
    let mut final_tries = 0;
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        let offsets: Result<Vec<i64>, _> = (0..partitions)
            .map(|p| {
                c.fetch_watermarks(topic, p, Duration::from_secs(10))
                    .map(|(_, stable)| stable)
            })
            .collect();
        let answered = offsets.is_ok();
        if let Ok(offsets) = offsets {
            samples.push((Instant::now(), offsets));
        }
        if stopping {
            final_tries += 1;
            if answered || final_tries == 3 {
                break;
            }
        } else {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(samples)
}

pub(super) fn job_config(dir: &std::path::Path) -> JobConfig {
    job_config_every(dir, Duration::from_secs(1))
}

pub(super) fn job_config_every(dir: &std::path::Path, interval: Duration) -> JobConfig {
    let mut c = CheckpointConfig::new(dir);
    c.interval = interval;
    let mut config = JobConfig::new("bench");
    config.checkpointing = Some(c);
    config.restart = RestartStrategy::None;
    config
}

/// A table job (`bench mysql`, `bench postgres`) that stops making progress this long fails.
const STALL: Duration = Duration::from_secs(120);

/// Rows/s of a job moving the `n` records of `topic` into `table`: from `start` until the job's
/// source has committed all `n` offsets ([`wait_consumed`]) and `count` (the table's rows) has
/// all `n`; then cancels and joins the job (cancelled as well when anything fails). The table is
/// counted only at the end: counting all along would scan it under the writer.
pub(super) async fn table_job_rate(
    cluster: &Cluster,
    (topic, group): (&str, &str),
    n: u64,
    (job, start): (exactly_core::runtime::JobHandle, Instant),
    table: &str,
    mut count: impl AsyncFnMut() -> Result<u64>,
) -> Result<f64> {
    let done = async {
        wait_consumed(cluster, (topic, group), n).await?;
        let deadline = Instant::now() + STALL;
        while count().await? < n {
            if Instant::now() > deadline {
                bail!("{table} lacks rows {STALL:?} after the input was consumed");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(n as f64 / start.elapsed().as_secs_f64())
    }
    .await;
    job.cancel();
    let rate = done?;
    job.join().await?;
    Ok(rate)
}

/// Waits until consumer group `group` (a job's Kafka source) has committed offsets through all `n`
/// records of `topic`: the source commits them when a checkpoint completes, when its sinks commit
/// too (the caller then counts the sink's output until it has all `n`). Fails when the offsets do
/// not move for [`STALL`].
///
/// Not the sinks' progress tables: they keep only the latest checkpoint's rows (older ones are
/// pruned), so their sums stop short of `n`.
async fn wait_consumed(cluster: &Cluster, (topic, group): (&str, &str), n: u64) -> Result<()> {
    let c: BaseConsumer = client_config(cluster)?
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(topic, p);
    }
    let (mut last, mut moved) = (0u64, Instant::now());
    loop {
        let committed = tokio::task::block_in_place(|| c.committed_offsets(tpl.clone(), Duration::from_secs(10)))?;
        let now: u64 = committed
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o.max(0) as u64,
                _ => 0,
            })
            .sum();
        if now >= n {
            return Ok(());
        }
        if now != last {
            (last, moved) = (now, Instant::now());
        } else if moved.elapsed() > STALL {
            bail!("no progress for {STALL:?}: {now} of {n} input offsets committed");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_is_local_only_when_every_bootstrap_address_is_this_machine() {
        let local = |b: &str| is_local(&Cluster::plaintext(b));
        assert!(local("127.0.0.1:19092"));
        assert!(local("localhost:9092, 127.0.0.2:9093"));
        assert!(local("SASL_SSL://[::1]:19096"));
        assert!(!local("127.0.0.1:19092,broker-2.example.com:9092"));
        assert!(!local("10.0.0.5:9092"));
        assert!(!local("kafka:9092"));
    }
}
