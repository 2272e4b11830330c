//! `exactly bench soak`: one Kafka-to-Kafka exactly-once job (`exactly run`, a process of its own)
//! fed at a steady rate for `--duration` (an hour by default) and SIGKILLed every `--kill-every`
//! (ten minutes), restarted at once as an orchestrator would. Every 10 s: the process's resident
//! memory, open file descriptors, threads and CPU, the checkpoints completed meanwhile (duration,
//! from its log), the commit latency (a read_committed reader: read time − the record's producer
//! timestamp, which the job keeps), the reader's lag, the transactional ids the broker knows under
//! the job's prefix, and the checkpoint directory's size. Per stretch between kills: the medians
//! (each stretch's first tenth, at most a minute, left out: the restart's recovery), and how much
//! the last stretch grew over the second (the first whole stretch after a kill: from minute ten on
//! by default).
//! At the end every record is accounted for: each input key read back once from the output.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use rdkafka::consumer::Consumer;
use rdkafka::Message;

use super::kafka::*;
use super::peers::{job_file, status_kb, Guard};
use super::scale::checkpoints_in;
use super::{median, Report};
use exactly_kafka_client::Cluster;

/// Partitions of the input and output topics.
const TOPIC_PARTITIONS: i32 = 6;
/// How often the job is sampled.
const SAMPLE: Duration = Duration::from_secs(10);

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

/// One sample of the running job.
#[derive(Default, Clone)]
struct Sample {
    /// Seconds since the soak started.
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
    /// Records fed but not yet read back committed.
    lag: f64,
    transactional_ids: f64,
    checkpoint_dir_mb: f64,
    /// Completed checkpoints (`chk-N`) in the directory.
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
    /// CPU seconds at the last sample.
    cpu_secs: f64,
}

pub(crate) async fn bench_soak(o: &SoakOptions<'_>, report: &mut Report) -> Result<()> {
    if o.rate == 0 || o.duration < SAMPLE * 2 {
        bail!("bench soak needs --rate above 0 and a --duration of at least 20s");
    }
    let input = unique("soak-in");
    let output = unique("soak-out");
    create_topic(o.cluster, &input, TOPIC_PARTITIONS).await?;
    create_topic(o.cluster, &output, TOPIC_PARTITIONS).await?;
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
    std::fs::write(&job, text)?;
    println!(
        "Soak: one Kafka-to-Kafka exactly-once job (parallelism {}, {} partitions in and out, checkpoints every {}, one retained) fed {} records/s of {} B for {}, SIGKILLed every {} and restarted at once; sampled every {}",
        o.parallelism,
        TOPIC_PARTITIONS,
        humantime::format_duration(o.interval),
        o.rate,
        o.size,
        humantime::format_duration(o.duration),
        if o.kill_every.is_zero() { "never".to_owned() } else { humantime::format_duration(o.kill_every).to_string() },
        humantime::format_duration(SAMPLE)
    );
    println!("RSS: resident memory; cpu: cores used since the last sample; ckpt: checkpoints completed since the last sample, their median and longest duration; latency: a read_committed reader's read time − the record's producer timestamp; lag: records fed, not yet read committed; txn ids: transactional ids the broker knows under the job's prefix; dir: the checkpoint directory's size and completed checkpoints");
    println!(
        "{:>6} {:>4} {:>7} {:>5} {:>7} {:>5} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8} {:>4}",
        "t s",
        "inc",
        "RSS MB",
        "fds",
        "threads",
        "cpu",
        "ckpts",
        "ckpt p50",
        "ckpt max",
        "lat p50",
        "lat p99",
        "lat max",
        "lag",
        "txn ids",
        "dir MB",
        "chk"
    );
    let (stop_feed, stop_read) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let fed = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let feeder = {
        let (c, t, stop, fed, rate, size) = (
            o.cluster.clone(),
            input.to_owned(),
            stop_feed.clone(),
            fed.clone(),
            o.rate,
            o.size,
        );
        std::thread::spawn(move || feed(&c, &t, rate, size, &stop, &fed))
    };
    let reader = {
        let (c, t, stop, seen) = (o.cluster.clone(), output.to_owned(), stop_read.clone(), seen.clone());
        std::thread::spawn(move || read(&c, &t, &stop, &seen))
    };
    let run = run_and_sample(o, &job, dir, &id, &fed, &seen, &feeder, &reader, report).await;
    // Feeding stops; the job (still running) drains what was fed.
    stop_feed.store(true, Ordering::Relaxed);
    let fed_result = tokio::task::spawn_blocking(move || feeder.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the feeder panicked"));
    let drained = match (run, &fed_result) {
        (Ok(mut run), Ok(Ok(()))) => drain(&mut run, fed.load(Ordering::Relaxed), &seen).await.map(|()| run),
        (Err(e), _) => Err(e),
        (Ok(_), _) => Err(anyhow::anyhow!("the feeder failed")),
    };
    stop_read.store(true, Ordering::Relaxed);
    let read_result = tokio::task::spawn_blocking(move || reader.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the reader panicked"));
    fed_result??;
    read_result??;
    let Run {
        samples,
        kills,
        unplanned,
        ..
    } = drained?;
    let fed = fed.load(Ordering::Relaxed);
    let delivered = input_records(o.cluster, input)?;
    let seen = seen.lock().expect("seen");
    let missing = seen.missing(fed);
    summarize(o, &samples, &kills, report)?;
    println!(
        "records: {fed} fed ({delivered} in the input), {} read back once, {} read more than once, {missing} never read, {} not the feeder's",
        seen.distinct, seen.duplicates, seen.foreign
    );
    report.row(
        "soak",
        "records",
        &[
            ("fed", fed as f64),
            ("in_input", delivered as f64),
            ("read_once", seen.distinct as f64),
            ("duplicates", seen.duplicates as f64),
            ("missing", missing as f64),
        ],
    );
    if delivered != fed {
        bail!("the feeder queued {fed} records but the input holds {delivered}: the soak's own producer lost or doubled some");
    }
    if seen.duplicates > 0 || missing > 0 || seen.foreign > 0 {
        bail!(
            "the output is not exactly the input: {} read more than once, {missing} never read, {} foreign keys (logs in {})",
            seen.duplicates,
            seen.foreign,
            dir.display()
        );
    }
    if !unplanned.is_empty() {
        bail!(
            "the job exited by itself {} time(s): {}",
            unplanned.len(),
            unplanned.join("; ")
        );
    }
    Ok(())
}

/// Feeds `rate` records/s of keys `s0`, `s1`, … until `stop`; `fed` counts those queued.
fn feed(cluster: &Cluster, topic: &str, rate: u64, size: usize, stop: &AtomicBool, fed: &AtomicU64) -> Result<()> {
    let p = producer(cluster)?;
    let value = vec![b'x'; size];
    let start = Instant::now();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while i < due {
            send(&p, topic, format!("s{i}").as_bytes(), &value);
            i += 1;
        }
        fed.store(i, Ordering::Relaxed);
        p.poll(Duration::from_millis(5));
    }
    rdkafka::producer::Producer::flush(&p, Duration::from_secs(120))?;
    Ok(())
}

/// Reads `topic` committed until `stop` and then until it has been idle for 10 s.
fn read(cluster: &Cluster, topic: &str, stop: &AtomicBool, seen: &Mutex<Seen>) -> Result<()> {
    let c = consumer(cluster, topic, true)?;
    let mut idle_since: Option<Instant> = None;
    loop {
        match c.poll(Duration::from_millis(100)) {
            Some(m) => {
                let m = m?;
                idle_since = None;
                let latency = m.timestamp().to_millis().map_or(-1, |ts| now_ms() - ts);
                seen.lock().expect("seen").record(m.key().unwrap_or_default(), latency);
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

/// A kill: when (s since the start), and how long until the next incarnation's first completed
/// checkpoint.
struct Kill {
    at: f64,
    killed: SystemTime,
    recovered_s: Option<f64>,
}

/// The soak so far: the job still running, the samples, the kills and the job's own exits.
struct Run {
    job: Job,
    dir: PathBuf,
    samples: Vec<Sample>,
    kills: Vec<Kill>,
    unplanned: Vec<String>,
}

/// Starts the job, samples it every 10 s and kills it on schedule (not in the last sample) until
/// the duration is over; the job is left running.
#[allow(clippy::too_many_arguments)]
async fn run_and_sample(
    o: &SoakOptions<'_>,
    job: &Path,
    dir: &Path,
    id: &str,
    fed: &AtomicU64,
    seen: &Mutex<Seen>,
    feeder: &std::thread::JoinHandle<Result<()>>,
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
    let mut next_kill = (!o.kill_every.is_zero()).then_some(o.kill_every);
    let mut last_sample = SystemTime::now();
    for tick in 1.. {
        let due = SAMPLE * tick;
        if due > o.duration {
            break;
        }
        tokio::time::sleep_until((start + due).into()).await;
        if feeder.is_finished() || reader.is_finished() {
            bail!("the soak's feeder or reader stopped early (its error follows)");
        }
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
        }
        let now = SystemTime::now();
        let s = sample(
            o.cluster,
            &mut run.job,
            incarnation,
            dir,
            id,
            start,
            last_sample,
            now,
            fed,
            seen,
        )
        .await?;
        last_sample = now;
        print_sample(&s);
        report.row("soak", &format!("sample {:.0}", s.t), &sample_figures(&s));
        run.samples.push(s);
        if next_kill.is_some_and(|k| start.elapsed() >= k && due + SAMPLE <= o.duration) {
            let _ = run.job.child.0.kill();
            let _ = run.job.child.0.wait();
            let (at, killed) = (start.elapsed().as_secs_f64(), SystemTime::now());
            incarnation += 1;
            run.job = start_job(job, dir, incarnation)?;
            println!("-- SIGKILLed at {at:.0} s; incarnation {incarnation} started");
            run.kills.push(Kill {
                at,
                killed,
                recovered_s: None,
            });
            next_kill = next_kill.map(|k| k + o.kill_every);
        }
    }
    Ok(run)
}

/// Waits (up to 5 minutes) until the reader has read `fed` distinct records; then each kill's
/// recovery is read from the logs and the job stopped.
async fn drain(run: &mut Run, fed: u64, seen: &Mutex<Seen>) -> Result<()> {
    println!("-- the feeder stopped after {fed} records; waiting until the output holds them all");
    let since = Instant::now();
    loop {
        let distinct = seen.lock().expect("seen").distinct;
        if distinct >= fed {
            println!("-- drained in {:.1} s", since.elapsed().as_secs_f64());
            break;
        }
        if since.elapsed() > Duration::from_secs(300) {
            // Said, and the audit below counts what is missing.
            eprintln!(
                "the output holds {distinct} of {fed} records 5 minutes after the feeding stopped (log: {})",
                run.job.log.display()
            );
            break;
        }
        if let Some(status) = run.job.child.0.try_wait()? {
            bail!(
                "the job exited ({status}) while the output was drained; its log: {}\n{}",
                run.job.log.display(),
                tail(&run.job.log)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (k, kill) in run.kills.iter_mut().enumerate() {
        let log = run.dir.join(format!("job-{}.log", k + 2));
        let first = checkpoints_in(&std::fs::read_to_string(&log).unwrap_or_default())
            .first()
            .map(|c| c.0);
        kill.recovered_s = first
            .and_then(|at| at.duration_since(kill.killed).ok())
            .map(|d| d.as_secs_f64());
    }
    let _ = run.job.child.0.kill();
    let _ = run.job.child.0.wait();
    Ok(())
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
    })
}

/// The last 30 lines of a log.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// One sample of the running job: its process, its log's checkpoints in (`from`, `to`], the
/// reader's latencies since the last sample, the broker's transactional ids, the directory.
#[allow(clippy::too_many_arguments)]
async fn sample(
    cluster: &Cluster,
    job: &mut Job,
    incarnation: usize,
    dir: &Path,
    id: &str,
    start: Instant,
    from: SystemTime,
    to: SystemTime,
    fed: &AtomicU64,
    seen: &Mutex<Seen>,
) -> Result<Sample> {
    let pid = job.child.0.id();
    let cpu_secs = super::cpu::child_cpu_secs(pid).unwrap_or(0.0);
    let cpu = (cpu_secs - job.cpu_secs).max(0.0) / SAMPLE.as_secs_f64();
    job.cpu_secs = cpu_secs;
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
    let transactional_ids = exactly_kafka_sink::admin::list_transactions(cluster, id)
        .await
        .map(|t| t.len() as f64)
        .unwrap_or(f64::NAN);
    let checkpoints = dir.join("checkpoints");
    let (bytes, dirs) = dir_size(&checkpoints);
    Ok(Sample {
        t: start.elapsed().as_secs_f64(),
        incarnation,
        rss_mb: status_kb(pid, "VmRSS:").unwrap_or(0) as f64 / 1024.0,
        fds: std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count() as f64)
            .unwrap_or(0.0),
        threads: status_kb(pid, "Threads:").unwrap_or(0) as f64,
        cpu,
        checkpoints: durations.len(),
        checkpoint_ms_p50: (!durations.is_empty()).then(|| median(durations.clone())),
        checkpoint_ms_max: durations.last().copied(),
        latency_ms_p50: q(&latencies, 0.5),
        latency_ms_p99: q(&latencies, 0.99),
        latency_ms_max: latencies.last().map(|&l| l as f64),
        lag: fed.load(Ordering::Relaxed).saturating_sub(distinct) as f64,
        transactional_ids,
        checkpoint_dir_mb: bytes as f64 / 1e6,
        checkpoint_dirs: dirs as f64,
    })
}

/// Bytes of the files under `dir`, and its completed checkpoints (`chk-N` directories with their
/// metadata, at any depth).
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

fn opt(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.0}"))
}

fn print_sample(s: &Sample) {
    println!(
        "{:>6.0} {:>4} {:>7.1} {:>5.0} {:>7.0} {:>5.2} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8.0} {:>7.0} {:>8.3} {:>4.0}",
        s.t,
        s.incarnation,
        s.rss_mb,
        s.fds,
        s.threads,
        s.cpu,
        s.checkpoints,
        opt(s.checkpoint_ms_p50),
        opt(s.checkpoint_ms_max),
        opt(s.latency_ms_p50),
        opt(s.latency_ms_p99),
        opt(s.latency_ms_max),
        s.lag,
        s.transactional_ids,
        s.checkpoint_dir_mb,
        s.checkpoint_dirs
    );
}

fn sample_figures(s: &Sample) -> Vec<(&'static str, f64)> {
    let mut f = vec![
        ("t_s", s.t),
        ("incarnation", s.incarnation as f64),
        ("rss_mb", s.rss_mb),
        ("fds", s.fds),
        ("threads", s.threads),
        ("cpu_cores", s.cpu),
        ("checkpoints", s.checkpoints as f64),
        ("lag", s.lag),
        ("transactional_ids", s.transactional_ids),
        ("checkpoint_dir_mb", s.checkpoint_dir_mb),
        ("checkpoint_dirs", s.checkpoint_dirs),
    ];
    for (name, v) in [
        ("checkpoint_ms_p50", s.checkpoint_ms_p50),
        ("checkpoint_ms_max", s.checkpoint_ms_max),
        ("latency_ms_p50", s.latency_ms_p50),
        ("latency_ms_p99", s.latency_ms_p99),
        ("latency_ms_max", s.latency_ms_max),
    ] {
        if let Some(v) = v {
            f.push((name, v));
        }
    }
    f
}

/// The figures compared from stretch to stretch: name, and how a sample gives it.
type Figure = (&'static str, fn(&Sample) -> Option<f64>);

const FIGURES: [Figure; 8] = [
    ("RSS MB", |s| Some(s.rss_mb)),
    ("fds", |s| Some(s.fds)),
    ("threads", |s| Some(s.threads)),
    ("ckpt p50 ms", |s| s.checkpoint_ms_p50),
    ("lat p50 ms", |s| s.latency_ms_p50),
    ("lat p99 ms", |s| s.latency_ms_p99),
    ("txn ids", |s| Some(s.transactional_ids)),
    ("dir MB", |s| Some(s.checkpoint_dir_mb)),
];

/// Per stretch (between kills, or 10-minute stretches without them): each figure's median over
/// its samples but the first minute's (a restart's recovery); the growth of the last stretch over
/// the second; the kills' recoveries; charts over time.
fn summarize(o: &SoakOptions<'_>, samples: &[Sample], kills: &[Kill], report: &mut Report) -> Result<()> {
    let stretch = if o.kill_every.is_zero() {
        Duration::from_secs(600)
    } else {
        o.kill_every
    }
    .as_secs_f64();
    let stretches = (o.duration.as_secs_f64() / stretch).ceil() as usize;
    // A stretch's start is left out of its medians: a restart's recovery, or the job's start.
    let skip = (stretch / 10.0).min(60.0);
    println!(
        "Medians per stretch (each without its first {skip:.0} s; a stretch starts with a restart but the first):"
    );
    print!("{:<14}", "figure");
    for k in 0..stretches {
        print!(
            " {:>9}",
            format!(
                "{:.0}-{:.0} m",
                k as f64 * stretch / 60.0,
                ((k + 1) as f64 * stretch).min(o.duration.as_secs_f64()) / 60.0
            )
        );
    }
    println!(" {:>9}", "growth");
    for (name, f) in FIGURES {
        let per: Vec<Option<f64>> = (0..stretches)
            .map(|k| {
                let (lo, hi) = (k as f64 * stretch + skip, (k + 1) as f64 * stretch);
                let v: Vec<f64> = samples
                    .iter()
                    .filter(|s| s.t > lo && s.t <= hi)
                    .filter_map(f)
                    .filter(|v| v.is_finite())
                    .collect();
                (!v.is_empty()).then(|| median(v))
            })
            .collect();
        print!("{name:<14}");
        for v in &per {
            print!(" {:>9}", v.map_or("-".to_owned(), |v| format!("{v:.1}")));
        }
        // From the second stretch (minute ten on) to the last, as the soak's goal reads.
        let base = per.get(1).or(per.first()).copied().flatten();
        let growth = base
            .zip(per.last().copied().flatten())
            .filter(|(b, _)| *b > 0.0)
            .map(|(b, l)| (l / b - 1.0) * 100.0);
        println!(" {:>9}", growth.map_or("-".to_owned(), |g| format!("{g:+.1} %")));
        let mut figures: Vec<(&str, f64)> = Vec::new();
        let names = [
            "stretch_1",
            "stretch_2",
            "stretch_3",
            "stretch_4",
            "stretch_5",
            "stretch_6",
            "stretch_7",
            "stretch_8",
        ];
        for (k, v) in per.iter().enumerate().take(names.len()) {
            if let Some(v) = v {
                figures.push((names[k], *v));
            }
        }
        if let Some(g) = growth {
            figures.push(("growth_percent", g));
        }
        report.row("soak", name, &figures);
    }
    let max = |f: fn(&Sample) -> f64| samples.iter().map(f).fold(0.0, f64::max);
    println!(
        "largest sample: RSS {:.1} MB, fds {:.0}, threads {:.0}, transactional ids {:.0}, checkpoint directory {:.1} MB in {:.0} checkpoint(s)",
        max(|s| s.rss_mb),
        max(|s| s.fds),
        max(|s| s.threads),
        max(|s| if s.transactional_ids.is_finite() { s.transactional_ids } else { 0.0 }),
        max(|s| s.checkpoint_dir_mb),
        max(|s| s.checkpoint_dirs)
    );
    for (k, kill) in kills.iter().enumerate() {
        println!(
            "kill {} at {:.0} s: first checkpoint of the next incarnation {} after the kill",
            k + 1,
            kill.at,
            kill.recovered_s.map_or("never".to_owned(), |s| format!("{s:.1} s"))
        );
        if let Some(r) = kill.recovered_s {
            report.row(
                "soak",
                &format!("kill {}", k + 1),
                &[("at_s", kill.at), ("recovered_s", r)],
            );
        }
    }
    if let Some(json) = o.charts {
        for path in charts(json, samples)? {
            println!("chart: {}", path.display());
        }
    }
    Ok(())
}

/// The samples over time as SVG charts next to `json`: `<stem>-<figure>.svg`.
fn charts(json: &Path, samples: &[Sample]) -> Result<Vec<PathBuf>> {
    let stem = json.file_stem().and_then(|s| s.to_str()).unwrap_or("bench");
    let dir = json.parent().unwrap_or(Path::new("."));
    let xs = |f: &dyn Fn(&Sample) -> Option<f64>| -> Vec<(f64, f64)> {
        samples
            .iter()
            .filter_map(|s| f(s).filter(|v| v.is_finite()).map(|y| (s.t / 60.0, y)))
            .collect()
    };
    let title = "Kafka-to-Kafka exactly-once soak, SIGKILLed on schedule";
    let mut written = Vec::new();
    let mut chart = |name: &str, y: &str, series: Vec<(&str, Vec<(f64, f64)>)>| -> Result<()> {
        let path = dir.join(format!("{stem}-{name}.svg"));
        super::chart::lines(&path, title, "minutes", y, &series)?;
        written.push(path);
        Ok(())
    };
    chart("rss", "resident memory, MB", vec![("RSS", xs(&|s| Some(s.rss_mb)))])?;
    chart(
        "handles",
        "count",
        vec![
            ("open fds", xs(&|s| Some(s.fds))),
            ("threads", xs(&|s| Some(s.threads))),
            ("transactional ids", xs(&|s| Some(s.transactional_ids))),
        ],
    )?;
    chart(
        "checkpoint",
        "checkpoint duration, ms",
        vec![
            ("p50", xs(&|s| s.checkpoint_ms_p50)),
            ("max", xs(&|s| s.checkpoint_ms_max)),
        ],
    )?;
    chart(
        "latency",
        "commit latency, ms",
        vec![("p50", xs(&|s| s.latency_ms_p50)), ("p99", xs(&|s| s.latency_ms_p99))],
    )?;
    chart(
        "dir",
        "checkpoint directory, MB",
        vec![("size", xs(&|s| Some(s.checkpoint_dir_mb)))],
    )?;
    Ok(written)
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
