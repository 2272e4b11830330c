//! `exactly bench soak`: one Kafka-to-Kafka exactly-once job (`exactly run`, a process of its own)
//! fed at a steady rate for `--duration` (an hour by default) and SIGKILLed every `--kill-every`
//! (ten minutes), restarted at once as an orchestrator would. Every 10 s: the process's resident
//! memory, open file descriptors, threads and CPU, the checkpoints completed meanwhile (duration,
//! from its log), the end-to-end latency (a read_committed reader: read time − the record's
//! producer timestamp, which the job keeps), the records fed but not yet read, the transactional
//! ids of the sink's form the broker knows under the job's prefix, and the checkpoint directory.
//! [`summary`] judges the samples against the soak's goals; at the end every record is accounted
//! for: each key fed read back exactly once.

mod summary;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Message};

use super::kafka::*;
use super::peers::{job_file, status_kb, Guard};
use super::scale::checkpoints_in;
use super::{median, Report};
use exactly_kafka_client::Cluster;

/// Partitions of the input and output topics.
const TOPIC_PARTITIONS: i32 = 6;
/// How often the job is sampled.
const SAMPLE: Duration = Duration::from_secs(10);
/// The transactional ids of each subtask's pool (`pool_size` of the bench's job file).
const POOL: u32 = 3;

/// Settings of `bench soak`.
pub(crate) struct SoakOptions<'a> {
    pub(crate) cluster: &'a Cluster,
    /// Records per second fed to the input.
    pub(crate) rate: u64,
    pub(crate) size: usize,
    pub(crate) duration: Duration,
    /// Zero: never killed.
    pub(crate) kill_every: Duration,
    pub(crate) interval: Duration,
    pub(crate) parallelism: u32,
    pub(crate) charts: Option<&'a Path>,
}

/// One sample of the running job. The process's figures are NaN when it was gone at the sample.
#[derive(Default, Clone)]
struct Sample {
    /// Seconds since the soak started, as scheduled (every 10 s).
    t: f64,
    incarnation: usize,
    rss_mb: f64,
    fds: f64,
    threads: f64,
    /// CPU of the job's process since the last sample, in cores.
    cpu: f64,
    checkpoints: usize,
    checkpoint_ms_p50: Option<f64>,
    checkpoint_ms_max: Option<f64>,
    latency_ms_p50: Option<f64>,
    latency_ms_p99: Option<f64>,
    latency_ms_max: Option<f64>,
    /// Records delivered to the input but not yet read from the output.
    lag: f64,
    /// NaN when the broker could not be asked.
    transactional_ids: f64,
    checkpoint_dir_kb: f64,
    /// `chk-N` directories in it (completed, or one being written).
    checkpoint_dirs: f64,
}

/// What the reader of the output has seen.
#[derive(Default)]
struct Seen {
    /// Keys `s<i>` read, as bits.
    keys: Vec<u64>,
    distinct: u64,
    duplicates: u64,
    /// Keys that are not the feeder's.
    foreign: u64,
    /// Latencies (ms) since the last sample.
    latencies: Vec<i64>,
    /// Errors the reader's consumer reported (it goes on).
    errors: u64,
}

impl Seen {
    fn record(&mut self, key: &[u8], latency: i64) {
        self.latencies.push(latency);
        let Some(i) = std::str::from_utf8(key)
            .ok()
            .and_then(|k| k.strip_prefix('s'))
            .and_then(|i| i.parse::<u64>().ok())
        else {
            self.foreign += 1;
            return;
        };
        let (word, bit) = ((i / 64) as usize, 1u64 << (i % 64));
        if word >= self.keys.len() {
            self.keys.resize(word + 1 + word / 4, 0);
        }
        if self.keys[word] & bit != 0 {
            self.duplicates += 1;
        } else {
            self.keys[word] |= bit;
            self.distinct += 1;
        }
    }

    /// Keys below `n` never read.
    fn missing(&self, n: u64) -> u64 {
        (0..n)
            .filter(|&i| {
                self.keys
                    .get((i / 64) as usize)
                    .is_none_or(|w| w & (1 << (i % 64)) == 0)
            })
            .count() as u64
    }
}

/// The job's process: the current incarnation and its log.
struct Job {
    child: Guard,
    log: PathBuf,
    /// CPU seconds at the last sample, and when it was taken.
    cpu_secs: f64,
    cpu_at: Instant,
}

/// A planned kill: when (s since the start), which incarnation it started, and how long until
/// that incarnation's first completed checkpoint.
struct Kill {
    at: f64,
    killed: SystemTime,
    next: usize,
    recovered_s: Option<f64>,
}

pub(crate) async fn bench_soak(o: &SoakOptions<'_>, report: &mut Report) -> Result<()> {
    if o.rate == 0 || o.duration < SAMPLE * 2 {
        bail!("bench soak needs --rate above 0 and a --duration of at least 20s");
    }
    if !o.kill_every.is_zero()
        && (!o.kill_every.as_millis().is_multiple_of(SAMPLE.as_millis()) || o.kill_every < SAMPLE * 6)
    {
        bail!("--kill-every must be a multiple of 10s and at least 1m (or 0s: never)");
    }
    let input = unique("soak-in");
    let output = unique("soak-out");
    create_topic(o.cluster, &input, TOPIC_PARTITIONS).await?;
    if let Err(e) = create_topic(o.cluster, &output, TOPIC_PARTITIONS).await {
        delete_topics(o.cluster, &[&input]).await;
        return Err(e);
    }
    let dir = tempfile::tempdir()?;
    let r = soak(o, &input, &output, dir.path(), report).await;
    delete_topics(o.cluster, &[&input, &output]).await;
    if r.is_err() {
        let kept = dir.keep();
        eprintln!("the job's logs and checkpoints are kept in {}", kept.display());
    }
    r
}

async fn soak(o: &SoakOptions<'_>, input: &str, output: &str, dir: &Path, report: &mut Report) -> Result<()> {
    let id = unique("soak");
    let job = dir.join("job.toml");
    let text = job_file(
        &o.cluster.bootstrap,
        input,
        output,
        &id,
        &o.interval.as_millis().to_string(),
        &o.parallelism.to_string(),
        dir,
        "",
    );
    if !text.contains(&format!("pool_size = {POOL}")) {
        bail!("the bench's job file no longer has a pool of {POOL} transactional ids per subtask:\n{text}");
    }
    std::fs::write(&job, text)?;
    println!(
        "Soak: one Kafka-to-Kafka exactly-once job (parallelism {}, {} partitions in and out, checkpoints every {}, one retained) fed {} records/s of {} B for {}, SIGKILLed every {} and restarted at once; sampled every {}",
        o.parallelism,
        TOPIC_PARTITIONS,
        humantime::format_duration(o.interval),
        o.rate,
        o.size,
        humantime::format_duration(o.duration),
        if o.kill_every.is_zero() {
            "never".to_owned()
        } else {
            humantime::format_duration(o.kill_every).to_string()
        },
        humantime::format_duration(SAMPLE)
    );
    println!("inc: the job's process (a new one after each kill); RSS: resident memory; cpu: cores used since the last sample; ckpts: checkpoints completed since the last sample, their median and longest duration; latency: a read_committed reader's read time − the record's producer timestamp (the feeder's linger, the job's commit and the reader's poll included); lag: records in the input not yet read from the output; txn ids: transactional ids of the sink's form the broker knows under the job's prefix; dir: the checkpoint directory's size and its chk-N directories");
    summary::print_header();
    let (stop_feed, stop_read) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let delivered = Arc::new(Deliveries::default());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let feeder = {
        let (c, t, stop, d, rate, size) = (
            o.cluster.clone(),
            input.to_owned(),
            stop_feed.clone(),
            delivered.clone(),
            o.rate,
            o.size,
        );
        std::thread::spawn(move || feed(&c, &t, rate, size, &stop, d))
    };
    let reader = {
        let (c, t, stop, seen) = (o.cluster.clone(), output.to_owned(), stop_read.clone(), seen.clone());
        std::thread::spawn(move || read(&c, &t, &stop, &seen))
    };
    let run = run_and_sample(o, &job, dir, &id, &delivered, &seen, &feeder, &reader, report).await;
    // Feeding stops; the job (still running) drains what was fed.
    stop_feed.store(true, Ordering::Relaxed);
    let fed_result = tokio::task::spawn_blocking(move || feeder.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the feeder panicked"));
    let drained = match (run, &fed_result) {
        (Ok(mut run), Ok(Ok(fed))) => drain(&mut run, *fed, &seen).await.map(|d| (run, d)),
        (Err(e), _) => Err(e),
        (Ok(_), Ok(Err(e))) => Err(anyhow::anyhow!("the feeder failed: {e:#}")),
        (Ok(_), Err(e)) => Err(anyhow::anyhow!("{e}")),
    };
    stop_read.store(true, Ordering::Relaxed);
    let read_result = tokio::task::spawn_blocking(move || reader.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the reader panicked"));
    let (run, drained) = drained?;
    let fed = fed_result??;
    read_result??;
    let in_input = input_records(o.cluster, input)?;
    let seen = seen.lock().expect("seen");
    let missing = seen.missing(fed);
    let failed = delivered.failed.load(Ordering::Relaxed);
    println!(
        "records: {fed} fed at {:.0} records/s ({in_input} in the input, {failed} not delivered), {} distinct keys read from the output, {} read again, {missing} never read{}, {} not the feeder's; the reader's consumer reported {} error(s)",
        fed as f64 / o.duration.as_secs_f64(),
        seen.distinct,
        seen.duplicates,
        if drained { "" } else { " (the output did not catch up)" },
        seen.foreign,
        seen.errors
    );
    report.row(
        "soak",
        "records",
        &[
            ("fed", fed as f64),
            ("in_input", in_input as f64),
            ("distinct_read", seen.distinct as f64),
            ("duplicates", seen.duplicates as f64),
            ("missing", missing as f64),
        ],
    );
    if in_input != fed || failed > 0 {
        bail!("the feeder queued {fed} records, {failed} were not delivered and the input holds {in_input}: the soak's own producer lost or doubled some");
    }
    if !drained {
        bail!("the output did not catch up with the input ({missing} of {fed} records not read: not drained, so not counted as lost; logs in {})", dir.display());
    }
    if seen.duplicates > 0 || missing > 0 || seen.foreign > 0 {
        bail!(
            "the output is not exactly the input: {} read again, {missing} never read, {} foreign keys (logs in {})",
            seen.duplicates,
            seen.foreign,
            dir.display()
        );
    }
    summary::summarize(o, &run.samples, &run.kills, report);
    if !run.unplanned.is_empty() {
        bail!(
            "the job exited by itself {} time(s): {}",
            run.unplanned.len(),
            run.unplanned.join("; ")
        );
    }
    Ok(())
}

/// The feeder's deliveries: those that succeeded and those that failed.
#[derive(Default)]
struct Deliveries {
    delivered: AtomicU64,
    failed: AtomicU64,
}

/// The feeder's producer's context: counts into [`Deliveries`].
struct Counting(Arc<Deliveries>);

impl ClientContext for Counting {}

impl ProducerContext for Counting {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        match r {
            Ok(_) => {
                self.0.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                if self.0.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("the feeder's producer could not deliver a record: {e}");
                }
            }
        }
    }
}

/// Feeds `rate` records/s of keys `s0`, `s1`, … until `stop` (or a record is not delivered);
/// returns how many it queued, all delivered by then.
fn feed(cluster: &Cluster, topic: &str, rate: u64, size: usize, stop: &AtomicBool, d: Arc<Deliveries>) -> Result<u64> {
    let p: BaseProducer<Counting> = producer_config(cluster)?.create_with_context(Counting(d.clone()))?;
    let value = vec![b'x'; size];
    let start = Instant::now();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) && d.failed.load(Ordering::Relaxed) == 0 {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while i < due && !stop.load(Ordering::Relaxed) {
            let key = format!("s{i}");
            match p.send(
                BaseRecord::to(topic)
                    .key(key.as_bytes())
                    .payload(&value)
                    .timestamp(now_ms()),
            ) {
                Ok(()) => i += 1,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    p.poll(Duration::from_millis(5));
                }
                Err((e, _)) => bail!("the feeder could not queue record {i}: {e}"),
            }
        }
        p.poll(Duration::from_millis(5));
    }
    p.flush(Duration::from_secs(120))?;
    let failed = d.failed.load(Ordering::Relaxed);
    if failed > 0 {
        bail!("{failed} record(s) of the feeder were not delivered");
    }
    Ok(i)
}

/// Reads `topic` committed until `stop` and then until it has been idle for 10 s. The consumer's
/// errors are counted and it goes on (a broker's hiccup is not the job's fault; records that
/// never arrive are found at the end).
fn read(cluster: &Cluster, topic: &str, stop: &AtomicBool, seen: &Mutex<Seen>) -> Result<()> {
    let c = consumer(cluster, topic, true)?;
    let mut idle_since: Option<Instant> = None;
    loop {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                idle_since = None;
                let latency = m.timestamp().to_millis().map_or(-1, |ts| now_ms() - ts);
                seen.lock().expect("seen").record(m.key().unwrap_or_default(), latency);
            }
            Some(Err(e)) => {
                let mut s = seen.lock().expect("seen");
                if s.errors == 0 {
                    eprintln!("the soak's reader: {e} (it goes on)");
                }
                s.errors += 1;
            }
            None => {
                if stop.load(Ordering::Relaxed)
                    && idle_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(10)
                {
                    return Ok(());
                }
            }
        }
    }
}

/// Records in `topic` (the sum of its partitions' high watermarks: a fresh topic).
fn input_records(cluster: &Cluster, topic: &str) -> Result<u64> {
    let c = consumer(cluster, topic, false)?;
    let mut n = 0;
    for p in 0..TOPIC_PARTITIONS {
        n += c.fetch_watermarks(topic, p, Duration::from_secs(10))?.1.max(0) as u64;
    }
    Ok(n)
}

/// The soak so far: the job still running, the samples, the planned kills and the job's own exits.
struct Run {
    job: Job,
    dir: PathBuf,
    samples: Vec<Sample>,
    kills: Vec<Kill>,
    unplanned: Vec<String>,
}

/// Starts the job, samples it every 10 s and kills it on schedule (not at the last sample) until
/// the duration is over; the job is left running. A job that exited by itself is restarted and
/// said (the soak fails at the end).
#[allow(clippy::too_many_arguments)]
async fn run_and_sample(
    o: &SoakOptions<'_>,
    job: &Path,
    dir: &Path,
    id: &str,
    delivered: &Deliveries,
    seen: &Mutex<Seen>,
    feeder: &std::thread::JoinHandle<Result<u64>>,
    reader: &std::thread::JoinHandle<Result<()>>,
    report: &mut Report,
) -> Result<Run> {
    let start = Instant::now();
    let mut incarnation = 1;
    let mut run = Run {
        job: start_job(job, dir, incarnation)?,
        dir: dir.to_owned(),
        samples: Vec::new(),
        kills: Vec::new(),
        unplanned: Vec::new(),
    };
    let every = (!o.kill_every.is_zero()).then(|| (o.kill_every.as_secs() / SAMPLE.as_secs()) as u32);
    let mut last_sample = SystemTime::now();
    for tick in 1u32.. {
        let due = SAMPLE * tick;
        if due > o.duration {
            break;
        }
        tokio::time::sleep_until((start + due).into()).await;
        if feeder.is_finished() || reader.is_finished() {
            bail!("the soak's feeder or reader stopped early (its error follows)");
        }
        let now = SystemTime::now();
        let mut s = sample(
            o.cluster,
            &mut run.job,
            incarnation,
            dir,
            id,
            last_sample,
            now,
            delivered,
            seen,
        )
        .await?;
        // Its place on the schedule: the sample before a kill belongs to the process killed.
        s.t = due.as_secs_f64();
        last_sample = now;
        summary::print_sample(&s);
        report.row("soak", &format!("sample {:.0}", s.t), &summary::sample_figures(&s));
        run.samples.push(s);
        // Exited by itself (also just before a planned kill): said, and a new process started.
        if let Some(status) = run.job.child.0.try_wait()? {
            let log = run.job.log.display().to_string();
            run.unplanned
                .push(format!("{status} at {:.0} s ({log})", start.elapsed().as_secs_f64()));
            eprintln!(
                "the job exited by itself ({status}); its log: {log}\n{}",
                tail(&run.job.log)
            );
            incarnation += 1;
            run.job = start_job(job, dir, incarnation)?;
        } else if every.is_some_and(|k| tick % k == 0) && due + SAMPLE <= o.duration {
            let _ = run.job.child.0.kill();
            let _ = run.job.child.0.wait();
            let (at, killed) = (start.elapsed().as_secs_f64(), SystemTime::now());
            incarnation += 1;
            run.job = start_job(job, dir, incarnation)?;
            println!("-- SIGKILLed at {at:.0} s; process {incarnation} started");
            run.kills.push(Kill {
                at,
                killed,
                next: incarnation,
                recovered_s: None,
            });
        }
    }
    Ok(run)
}

/// Waits until the reader has read `fed` distinct records, as long as it makes progress (a minute
/// without a new record: not drained, false); then each kill's recovery is read from the logs and
/// the job stopped.
async fn drain(run: &mut Run, fed: u64, seen: &Mutex<Seen>) -> Result<bool> {
    println!("-- the feeder stopped after {fed} records; waiting until the output holds them all");
    let since = Instant::now();
    let (mut last, mut progressed) = (0, Instant::now());
    let drained = loop {
        let distinct = seen.lock().expect("seen").distinct;
        if distinct >= fed {
            println!("-- drained in {:.1} s", since.elapsed().as_secs_f64());
            break true;
        }
        if distinct > last {
            (last, progressed) = (distinct, Instant::now());
        } else if progressed.elapsed() > Duration::from_secs(60) {
            eprintln!(
                "the output holds {distinct} of {fed} records and has not grown for a minute (log: {})",
                run.job.log.display()
            );
            break false;
        }
        if let Some(status) = run.job.child.0.try_wait()? {
            bail!(
                "the job exited ({status}) while the output was drained; its log: {}\n{}",
                run.job.log.display(),
                tail(&run.job.log)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for kill in &mut run.kills {
        let log = run.dir.join(format!("job-{}.log", kill.next));
        let first = checkpoints_in(&std::fs::read_to_string(&log).unwrap_or_default())
            .first()
            .map(|c| c.0);
        kill.recovered_s = first
            .and_then(|at| at.duration_since(kill.killed).ok())
            .map(|d| d.as_secs_f64());
    }
    let _ = run.job.child.0.kill();
    let _ = run.job.child.0.wait();
    Ok(drained)
}

fn start_job(job: &Path, dir: &Path, incarnation: usize) -> Result<Job> {
    let log = dir.join(format!("job-{incarnation}.log"));
    let file = std::fs::File::create(&log)?;
    let mut cmd = Command::new(std::env::current_exe()?);
    // Its "Checkpoint complete." lines are read: the default filter, whatever RUST_LOG is.
    cmd.args(["run", "--no-progress"])
        .arg(job)
        .env_remove("RUST_LOG")
        .stdout(Stdio::from(file.try_clone()?))
        .stderr(Stdio::from(file));
    let child = Guard(cmd.spawn().context("starting exactly run")?);
    Ok(Job {
        child,
        log,
        cpu_secs: 0.0,
        cpu_at: Instant::now(),
    })
}

/// The last 30 lines of a log.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// One sample of the running job: its process (NaN when gone), its log's checkpoints in (`from`,
/// `to`], the reader's latencies since the last sample, the broker's transactional ids, the
/// checkpoint directory.
#[allow(clippy::too_many_arguments)]
async fn sample(
    cluster: &Cluster,
    job: &mut Job,
    incarnation: usize,
    dir: &Path,
    id: &str,
    from: SystemTime,
    to: SystemTime,
    delivered: &Deliveries,
    seen: &Mutex<Seen>,
) -> Result<Sample> {
    let pid = job.child.0.id();
    let alive = job.child.0.try_wait()?.is_none();
    let process = |v: Option<f64>| v.filter(|_| alive).unwrap_or(f64::NAN);
    let cpu = match super::cpu::child_cpu_secs(pid).filter(|_| alive) {
        Some(secs) => {
            let cores = (secs - job.cpu_secs).max(0.0) / job.cpu_at.elapsed().as_secs_f64();
            (job.cpu_secs, job.cpu_at) = (secs, Instant::now());
            cores
        }
        None => f64::NAN,
    };
    let mut durations: Vec<f64> = checkpoints_in(&std::fs::read_to_string(&job.log).unwrap_or_default())
        .into_iter()
        .filter(|c| c.0 > from && c.0 <= to)
        .map(|c| c.1)
        .collect();
    durations.sort_by(f64::total_cmp);
    let (mut latencies, distinct) = {
        let mut s = seen.lock().expect("seen");
        (std::mem::take(&mut s.latencies), s.distinct)
    };
    latencies.sort_unstable();
    let q = |v: &[i64], q: f64| (!v.is_empty()).then(|| v[((v.len() - 1) as f64 * q).round() as usize] as f64);
    let transactional_ids = match exactly_kafka_sink::admin::list_transactions(cluster, id).await {
        Ok(t) => t.len() as f64,
        Err(e) => {
            eprintln!("the transactional ids could not be listed: {e}");
            f64::NAN
        }
    };
    let (bytes, dirs) = dir_size(&dir.join("checkpoints"));
    Ok(Sample {
        t: 0.0,
        incarnation,
        rss_mb: process(status_kb(pid, "VmRSS:").map(|kb| kb as f64 / 1024.0)),
        fds: process(
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .ok()
                .map(|d| d.count() as f64),
        ),
        threads: process(status_kb(pid, "Threads:").map(|n| n as f64)),
        cpu,
        checkpoints: durations.len(),
        checkpoint_ms_p50: (!durations.is_empty()).then(|| median(durations.clone())),
        checkpoint_ms_max: durations.last().copied(),
        latency_ms_p50: q(&latencies, 0.5),
        latency_ms_p99: q(&latencies, 0.99),
        latency_ms_max: latencies.last().map(|&l| l as f64),
        lag: delivered.delivered.load(Ordering::Relaxed).saturating_sub(distinct) as f64,
        transactional_ids,
        checkpoint_dir_kb: bytes as f64 / 1e3,
        checkpoint_dirs: dirs as f64,
    })
}

/// Bytes of the files under `dir`, and its `chk-N` directories (at any depth).
fn dir_size(dir: &Path) -> (u64, u64) {
    let (mut bytes, mut checkpoints) = (0, 0);
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else {
                continue;
            };
            if meta.is_dir() {
                if e.file_name().to_string_lossy().starts_with("chk-") {
                    checkpoints += 1;
                }
                stack.push(e.path());
            } else {
                bytes += meta.len();
            }
        }
    }
    (bytes, checkpoints)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_counted_once_and_the_missing_ones_found() {
        let mut s = Seen::default();
        for k in ["s0", "s2", "s2", "s130", "x7"] {
            s.record(k.as_bytes(), 5);
        }
        assert_eq!((s.distinct, s.duplicates, s.foreign), (3, 1, 1));
        // 0..131 less the three read.
        assert_eq!(s.missing(131), 128);
        assert_eq!(s.missing(1), 0);
        assert_eq!(s.latencies.len(), 5);
    }
}
