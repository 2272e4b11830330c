//! `exactly bench soak`: one Kafka-to-Kafka exactly-once job (`exactly run`, a process of its own)
//! fed at a steady rate for `--duration` (an hour by default) and SIGKILLed every `--kill-every`
//! (ten minutes), restarted at once as an orchestrator would. Every 10 s: the process's resident
//! memory, open file descriptors, threads and CPU, the checkpoints completed meanwhile (duration,
//! from its log), the end-to-end latency (a read_committed reader: read time − the record's
//! producer timestamp, which the job keeps), the records fed but not yet read, the transactional
//! ids of the sink's form the broker knows under the job's prefix, and the checkpoint directory.
//! [`summary`] judges the samples against the soak's goals; at the end every record is accounted
//! for: each key fed read back exactly once.

mod sampling;
mod summary;
mod traffic;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};

use super::kafka::*;
use super::peers::{job_file, status_kb, Guard};
use super::scale::checkpoints_in;
use super::{median, Report};
use exactly_kafka_client::Cluster;
use sampling::sample;
use traffic::{feed, input_records, read, Deliveries, Seen};

/// Partitions of the input and output topics.
const TOPIC_PARTITIONS: i32 = 6;
/// How often the job is sampled.
const SAMPLE: Duration = Duration::from_secs(10);
/// The transactional ids of each subtask's pool (`pool_size` of the bench's job file).
const POOL: u32 = 3;

/// Settings of `bench soak`.
#[derive(Clone)]
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
    /// Judge the samples of this earlier run's JSON instead of running (the flags as they were).
    pub(crate) judge: Option<&'a Path>,
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
    if let Some(path) = o.judge {
        if o.charts.is_some_and(|json| json == path) {
            bail!("--json names the file --judge reads: it would be overwritten with the judgement alone");
        }
        let (samples, processes, settings, outcome) = summary::read_json(path)?;
        // The settings the run recorded win over the flags.
        let mut o = o.clone();
        if let Some(f) = settings {
            let get = |k: &str| f[k].as_f64();
            o.rate = get("rate").map_or(o.rate, |v| v as u64);
            o.duration = get("duration_s").map_or(o.duration, Duration::from_secs_f64);
            o.kill_every = get("kill_every_s").map_or(o.kill_every, Duration::from_secs_f64);
            o.interval = get("interval_ms").map_or(o.interval, |v| Duration::from_millis(v as u64));
            o.parallelism = get("parallelism").map_or(o.parallelism, |v| v as u32);
        }
        let o = &o;
        println!("The samples of {} ({} of them, {} processes), judged with --rate {} --intervals {} --parallelism {} --duration {}:", path.display(), samples.len(), processes.len(), o.rate, humantime::format_duration(o.interval), o.parallelism, humantime::format_duration(o.duration));
        let mut unmet = summary::judge(o, &samples, &processes, report);
        unmet.extend(outcome);
        return goals(unmet);
    }
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
    // An hour's samples are kept also when the soak fails (`bench` writes its JSON only after
    // a run that succeeded): judged again later with --judge.
    if let (Err(_), Some(json)) = (&r, o.charts) {
        match report.write_json(json) {
            Ok(()) => eprintln!("the samples so far are in {}", json.display()),
            Err(e) => eprintln!("the samples could not be written to {}: {e:#}", json.display()),
        }
    }
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
    report.row(
        "soak",
        "settings",
        &[
            ("rate", o.rate as f64),
            ("size", o.size as f64),
            ("duration_s", o.duration.as_secs_f64()),
            ("kill_every_s", o.kill_every.as_secs_f64()),
            ("interval_ms", o.interval.as_millis() as f64),
            ("parallelism", f64::from(o.parallelism)),
        ],
    );
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
    let (run, drained) = match drained {
        Ok(d) => d,
        // With the feeder's and the reader's own errors, which may be why.
        Err(e) => {
            let mut why = format!("{e:#}");
            if let Ok(Err(f)) = &fed_result {
                why.push_str(&format!("; the feeder: {f:#}"));
            }
            if let Ok(Err(r)) = &read_result {
                why.push_str(&format!("; the reader: {r:#}"));
            }
            bail!(why);
        }
    };
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
            ("foreign", seen.foreign as f64),
            ("not_delivered", failed as f64),
            ("drained", f64::from(u8::from(drained))),
            ("exited_by_itself", run.unplanned.len() as f64),
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
    let processes: Vec<summary::Process> = run
        .starts
        .iter()
        .map(|&(n, start_s)| summary::Process {
            n,
            start_s,
            recovered_s: run.kills.iter().find(|k| k.next == n).and_then(|k| k.recovered_s),
        })
        .collect();
    for kill in &run.kills {
        println!(
            "kill at {:.0} s: process {}'s first checkpoint {} after the kill",
            kill.at,
            kill.next,
            kill.recovered_s.map_or("never".to_owned(), |s| format!("{s:.1} s"))
        );
    }
    let unmet = summary::judge(o, &run.samples, &processes, report);
    if !run.unplanned.is_empty() {
        bail!(
            "the job exited by itself {} time(s): {}",
            run.unplanned.len(),
            run.unplanned.join("; ")
        );
    }
    goals(unmet)
}

/// Fails with the goals not met, if any.
fn goals(unmet: Vec<String>) -> Result<()> {
    if unmet.is_empty() {
        println!("Every goal met.");
        return Ok(());
    }
    bail!("goals not met: {}", unmet.join("; "))
}

/// The soak so far: the job still running, the samples, the planned kills and the job's own exits.
struct Run {
    job: Job,
    dir: PathBuf,
    /// Every process: its number and when it started (s since the soak's start).
    starts: Vec<(usize, f64)>,
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
        starts: vec![(1, 0.0)],
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
            bail!("the soak's feeder or reader stopped early");
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
            run.starts.push((incarnation, start.elapsed().as_secs_f64()));
        } else if every.is_some_and(|k| tick % k == 0) && due + SAMPLE <= o.duration {
            let _ = run.job.child.0.kill();
            let _ = run.job.child.0.wait();
            let (at, killed) = (start.elapsed().as_secs_f64(), SystemTime::now());
            incarnation += 1;
            run.job = start_job(job, dir, incarnation)?;
            run.starts.push((incarnation, at));
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

/// Waits until the reader has read `fed` distinct records, as long as it makes progress (three
/// minutes without a new record, beyond a checkpoint's timeout: not drained, false); then the job
/// is stopped as an operator would (SIGTERM: a final checkpoint and its commits, whose records the
/// reader still reads: a duplicate there is seen too) and each kill's recovery read from the logs.
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
        } else if progressed.elapsed() > Duration::from_secs(180) {
            eprintln!(
                "the output holds {distinct} of {fed} records and has not grown for three minutes (log: {})",
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
    stop_gracefully(&mut run.job).await?;
    Ok(drained)
}

/// SIGTERM, and a minute for the job to take its final checkpoint and exit (then SIGKILL).
async fn stop_gracefully(job: &mut Job) -> Result<()> {
    let pid = job.child.0.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status();
    if !sent.is_ok_and(|s| s.success()) {
        eprintln!("could not send SIGTERM to the job ({pid}): killed instead");
    } else {
        let since = Instant::now();
        while since.elapsed() < Duration::from_secs(60) {
            if let Some(status) = job.child.0.try_wait()? {
                println!(
                    "-- the job stopped on SIGTERM ({status}) in {:.1} s",
                    since.elapsed().as_secs_f64()
                );
                // A final checkpoint that failed may leave a transaction the reader never sees.
                if !status.success() {
                    bail!("the job ended with {status} on SIGTERM (log: {})", job.log.display());
                }
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!(
            "the job had not stopped a minute after SIGTERM: killed (log: {})",
            job.log.display()
        );
    }
    let _ = job.child.0.kill();
    let _ = job.child.0.wait();
    bail!("the job did not stop on SIGTERM (log: {})", job.log.display())
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
