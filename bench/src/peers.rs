//! `exactly bench peers`: the same Kafka-to-Kafka pass-through run by what users would otherwise
//! pick — a plain rdkafka consume-produce loop (the baseline), `exactly run` with a job file,
//! Kafka Streams (`exactly_once_v2`) and Apache Flink (KafkaSource → KafkaSink,
//! `DeliveryGuarantee.EXACTLY_ONCE`) from `bench/peers/` (built by `scripts/peers`) — each as its
//! own process on the same pre-filled topic, timed the same way from outside, rounds interleaved.
//!
//! Timing: a read_uncommitted reader marks the first output record (start-up excluded); a
//! read_committed reader marks when all N are visible (the last commit included); rate = N ÷ the
//! time between. Visible: the same from the first output record until the output's last stable
//! offsets (ListOffsets at read_committed, every 10 ms) pass the last record in every partition —
//! without the reader's own time to read the last transaction once committed. Peak RSS: the
//! process's `VmHWM` (Linux) just before it is stopped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::kafka::*;
use super::{median, Report};
use exactly_kafka_client::Cluster;

/// A system measured by `bench peers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Peer {
    /// One rdkafka consumer and one idempotent producer in a loop (no guarantee beyond
    /// at-least-once): the baseline.
    Plain,
    /// `exactly run` on a pass-through job file, exactly-once Kafka sink, checkpoints as
    /// configured by default (at the interval, and once the source caught up after a backlog).
    Exactly,
    /// The same with `[checkpoints] when_caught_up = false`: at the interval only, as Flink.
    ExactlyInterval,
    /// The same with `[checkpoints] when_caught_up = true`.
    ExactlyCaughtUp,
    /// Kafka Streams, processing.guarantee=exactly_once_v2, commit.interval.ms = the interval.
    KafkaStreams,
    /// Apache Flink, KafkaSink EXACTLY_ONCE, checkpoints at the interval (local MiniCluster).
    Flink,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Plain => "plain loop",
            Peer::Exactly => "exactly",
            Peer::ExactlyInterval => "exactly interval",
            Peer::ExactlyCaughtUp => "exactly caught-up",
            Peer::KafkaStreams => "kafka streams",
            Peer::Flink => "flink",
        }
    }
}

/// Settings of `bench peers`.
pub(crate) struct PeersOptions<'a> {
    pub(crate) cluster: &'a Cluster,
    pub(crate) records: u64,
    pub(crate) size: usize,
    pub(crate) rounds: usize,
    pub(crate) intervals: &'a [Duration],
    pub(crate) parallelism: u32,
    pub(crate) systems: &'a [Peer],
    pub(crate) peers_dir: &'a Path,
}

struct Measured {
    rate: f64,
    visible: f64,
    startup_ms: u128,
    rss_mb: f64,
}

pub(crate) async fn bench_peers(o: &PeersOptions<'_>, report: &mut Report) -> Result<()> {
    let java = |dir: &str| -> Result<(PathBuf, String)> {
        let d = o.peers_dir.join(dir).join("target");
        let cp = std::fs::read_to_string(d.join("classpath.txt"))
            .with_context(|| format!("{} is not built: run scripts/peers first", d.display()))?;
        Ok((d.join("classes"), cp.trim().to_owned()))
    };
    for s in o.systems {
        match s {
            Peer::KafkaStreams => drop(java("kafka-streams")?),
            Peer::Flink => drop(java("flink")?),
            _ => {}
        }
    }
    let input = unique("peers-in");
    topic(o.cluster, &input).await?;
    println!(
        "filling {input} with {} records of {} B ({PARTITIONS} partitions)",
        o.records, o.size
    );
    backlog(o.cluster, &input, o.records, o.size, false)?;
    println!(
        "Kafka-to-Kafka pass-through, {} records of {} B, parallelism {}, {} round(s), systems one after the other in each round, each its own process",
        o.records, o.size, o.parallelism, o.rounds
    );
    println!("rate: records ÷ (a read_committed reader has them all − a read_uncommitted reader saw the first); visible: records ÷ (the last stable offsets pass the last record in every partition − the same first); start: process start to first output record; RSS: peak resident memory of the process");
    println!(
        "{:<9} {:<6} {:<17} {:>10} {:>7} {:>10} {:>7} {:>9} {:>8}",
        "interval", "round", "system", "records/s", "ratio", "visible/s", "ratio", "start ms", "RSS MB"
    );
    for &interval in o.intervals {
        let label = humantime::format_duration(interval).to_string();
        let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); o.systems.len()];
        let mut visible: Vec<Vec<f64>> = vec![Vec::new(); o.systems.len()];
        let mut rss: Vec<Vec<f64>> = vec![Vec::new(); o.systems.len()];
        for round in 1..=o.rounds.max(1) {
            let mut baseline = None;
            for (i, &system) in o.systems.iter().enumerate() {
                let m = run_one(o, system, &input, interval, &java).await?;
                let (base, base_visible) = *baseline.get_or_insert((m.rate, m.visible));
                let ratio = m.rate / base;
                let visible_ratio = m.visible / base_visible;
                ratios[i].push(ratio);
                visible[i].push(visible_ratio);
                rss[i].push(m.rss_mb);
                println!(
                    "{:<9} {:<6} {:<17} {:>10.0} {:>7.3} {:>10.0} {:>7.3} {:>9} {:>8.0}",
                    label,
                    round,
                    system.name(),
                    m.rate,
                    ratio,
                    m.visible,
                    visible_ratio,
                    m.startup_ms,
                    m.rss_mb
                );
                report.row(
                    "peers",
                    &format!("{label} round {round} {}", system.name()),
                    &[
                        ("records_per_s", m.rate),
                        ("ratio_to_first", ratio),
                        ("visible_records_per_s", m.visible),
                        ("visible_ratio_to_first", visible_ratio),
                        ("startup_ms", m.startup_ms as f64),
                        ("peak_rss_mb", m.rss_mb),
                    ],
                );
            }
        }
        for (i, &system) in o.systems.iter().enumerate() {
            let (r, v, m) = (
                median(ratios[i].clone()),
                median(visible[i].clone()),
                median(rss[i].clone()),
            );
            println!(
                "{:<9} {:<6} {:<17} {:>10} {:>7.3} {:>10} {:>7.3} {:>9} {:>8.0}",
                label,
                "median",
                system.name(),
                "",
                r,
                "",
                v,
                "",
                m
            );
            report.row(
                "peers",
                &format!("{label} median {}", system.name()),
                &[("ratio_to_first", r), ("visible_ratio_to_first", v), ("peak_rss_mb", m)],
            );
        }
    }
    delete_topics(o.cluster, &[&input]).await;
    Ok(())
}

async fn run_one(
    o: &PeersOptions<'_>,
    system: Peer,
    input: &str,
    interval: Duration,
    java: &dyn Fn(&str) -> Result<(PathBuf, String)>,
) -> Result<Measured> {
    let output = unique("peers-out");
    topic(o.cluster, &output).await?;
    let id = unique("peer");
    let dir = tempfile::tempdir()?;
    let n = o.records;
    let ms = interval.as_millis().to_string();
    let p = o.parallelism.to_string();
    let cmd = match system {
        Peer::Plain => {
            let mut c = Command::new(std::env::current_exe()?);
            c.args(["bench", "plain-loop", "--bootstrap", &o.cluster.bootstrap, "--records"])
                .arg(n.to_string())
                .args(["--input", input, "--output", &output]);
            c
        }
        Peer::Exactly | Peer::ExactlyInterval | Peer::ExactlyCaughtUp => {
            let job = dir.path().join("job.toml");
            // `exactly` leaves it out: the job as configured by default.
            let caught_up = match system {
                Peer::ExactlyInterval => "when_caught_up = false",
                Peer::ExactlyCaughtUp => "when_caught_up = true",
                _ => "",
            };
            std::fs::write(
                &job,
                job_file(
                    &o.cluster.bootstrap,
                    input,
                    &output,
                    &id,
                    &ms,
                    &p,
                    dir.path(),
                    caught_up,
                ),
            )?;
            let mut c = Command::new(std::env::current_exe()?);
            c.args(["run", "--no-progress"]).arg(&job);
            c
        }
        Peer::KafkaStreams | Peer::Flink => {
            let (classes, cp) = java(if system == Peer::Flink {
                "flink"
            } else {
                "kafka-streams"
            })?;
            let mut c = Command::new("java");
            c.arg("-cp")
                .arg(format!("{}:{cp}", classes.display()))
                .arg("dev.exactly.peers.PassThrough")
                .args([&o.cluster.bootstrap, input, &output, &ms, &p, &id]);
            c
        }
    };
    let stable = StableOffsets::start(o.cluster, &output);
    let Timed {
        first,
        all,
        rss_mb,
        start,
        ..
    } = time_child(o.cluster, &output, n, cmd, &dir.path().join("out.log"), system.name()).await?;
    let visible_at = stable.visible_at(all.last_offsets).await?.ok_or_else(|| {
        anyhow::anyhow!("the last stable offsets of {output} never passed the last records the reader saw")
    })?;
    delete_topics(o.cluster, &[&output]).await;
    tokio::time::sleep(SETTLE).await;
    Ok(Measured {
        rate: n as f64 / all.marked.duration_since(first.first).as_secs_f64(),
        visible: n as f64 / visible_at.duration_since(first.first).as_secs_f64(),
        startup_ms: first.first.duration_since(start).as_millis(),
        rss_mb,
    })
}

/// One system's process timed from outside (its output read as `bench peers` reads it).
pub(super) struct Timed {
    /// When a read_uncommitted reader saw the first output record.
    pub(super) first: Seen,
    /// When a read_committed reader had them all.
    pub(super) all: Seen,
    /// Peak resident memory of the process.
    pub(super) rss_mb: f64,
    /// When the process was started.
    pub(super) start: Instant,
    /// The same on the wall clock (to compare with its log's times).
    pub(super) started: std::time::SystemTime,
    /// µs of CPU per record the process used from its start until its output was complete.
    pub(super) cpu_us: Option<f64>,
    /// µs of CPU per record the local broker used meanwhile (`None`: no single local broker found).
    pub(super) broker_cpu_us: Option<f64>,
}

/// Starts `cmd` (its output and log into `log`) and waits until a read_committed reader has all
/// `n` records of `output`; fails when the process exits first, with the end of its log.
pub(super) async fn time_child(
    cluster: &Cluster,
    output: &str,
    n: u64,
    cmd: Command,
    log: &Path,
    name: &str,
) -> Result<Timed> {
    let all = time_children(cluster, output, n, vec![(cmd, log.to_owned())], name).await?;
    let (rss_mb, cpu_us) = all.each[0];
    Ok(Timed {
        first: all.first,
        all: all.all,
        rss_mb,
        start: all.start,
        started: all.started,
        cpu_us,
        broker_cpu_us: all.broker_cpu_us,
    })
}

/// Processes writing one output, timed together from outside: [`Timed`] with each process's
/// peak RSS (MB) and CPU per record of the whole output (µs) in `each`, in the order started.
pub(super) struct TimedAll {
    pub(super) first: Seen,
    pub(super) all: Seen,
    pub(super) start: Instant,
    pub(super) started: std::time::SystemTime,
    pub(super) each: Vec<(f64, Option<f64>)>,
    pub(super) broker_cpu_us: Option<f64>,
}

/// Starts every command (each with its output and log into its file) and waits until a
/// read_committed reader has all `n` records of `output`; fails when any process exits first,
/// with the end of its log.
pub(super) async fn time_children(
    cluster: &Cluster,
    output: &str,
    n: u64,
    cmds: Vec<(Command, PathBuf)>,
    name: &str,
) -> Result<TimedAll> {
    // The logs first: nothing to leave running if one cannot be created.
    let mut logged = Vec::new();
    for (mut cmd, log) in cmds {
        let file = std::fs::File::create(&log)?;
        cmd.stdout(Stdio::from(file.try_clone()?)).stderr(Stdio::from(file));
        logged.push((cmd, log));
    }
    let (b1, o1) = (cluster.clone(), output.to_owned());
    let (b2, o2) = (cluster.clone(), output.to_owned());
    // Generous deadlines: a system on a busy machine may take minutes for a large backlog.
    let deadline = Duration::from_secs(900);
    let uncommitted = std::thread::spawn(move || verify(&b1, &o1, 1, 1, false, &AtomicU64::new(0), deadline));
    let committed = std::thread::spawn(move || verify(&b2, &o2, n, n, true, &AtomicU64::new(0), deadline));
    let (start, started) = (Instant::now(), std::time::SystemTime::now());
    let clock = super::cpu::CpuClock::start(super::kafka::is_local(cluster));
    let mut children = Vec::new();
    for (i, (mut cmd, log)) in logged.into_iter().enumerate() {
        let child = Guard(
            cmd.spawn()
                .with_context(|| format!("starting {name} (process {})", i + 1))?,
        );
        children.push((child, log));
    }
    let wait = tokio::task::spawn_blocking(move || (uncommitted.join(), committed.join()));
    let mut wait = std::pin::pin!(wait);
    let (first, all) = loop {
        tokio::select! {
            r = &mut wait => break r?,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                for (child, log) in &mut children {
                    if let Some(status) = child.0.try_wait()? {
                        let text = std::fs::read_to_string(&log).unwrap_or_default();
                        let tail: Vec<&str> = text.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect();
                        bail!("{name} exited ({status}) before its output was complete ({}):\n{}", log.display(), tail.join("\n"));
                    }
                }
            }
        }
    };
    let each = children
        .iter()
        .map(|(child, _)| {
            let pid = child.0.id();
            let rss_mb = peak_rss_kb(pid).unwrap_or(0) as f64 / 1024.0;
            let cpu_us = super::cpu::child_cpu_secs(pid).map(|s| s * 1e6 / n.max(1) as f64);
            (rss_mb, cpu_us)
        })
        .collect();
    let broker_cpu_us = clock.per_record(n).broker;
    drop(children);
    Ok(TimedAll {
        first: first.map_err(|_| anyhow::anyhow!("reader panicked"))??,
        all: all.map_err(|_| anyhow::anyhow!("reader panicked"))??,
        start,
        started,
        each,
        broker_cpu_us,
    })
}

/// Kills the child when dropped (also when the benchmark fails half-way).
pub(super) struct Guard(pub(super) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Peak resident set size of a process in KiB (`VmHWM` of /proc/PID/status).
pub(super) fn peak_rss_kb(pid: u32) -> Option<u64> {
    status_kb(pid, "VmHWM:")
}

/// A KiB figure of /proc/PID/status (`field` with its colon, e.g. `VmRSS:`).
pub(super) fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A pass-through job file: no transforms (records are copied as they are), an exactly-once
/// Kafka sink, checkpoints every `ms` (and when the source caught up, as the `caught_up` line
/// says: `when_caught_up = …`, or nothing for the default). `BENCH_SOURCE_CLIENT` and
/// `BENCH_SINK_CLIENT` (`key=value,…`) add librdkafka properties to the source and the sink, as
/// for `bench k2k`.
#[allow(clippy::too_many_arguments)]
pub(super) fn job_file(
    bootstrap: &str,
    input: &str,
    output: &str,
    id: &str,
    ms: &str,
    p: &str,
    dir: &Path,
    caught_up: &str,
) -> String {
    format!(
        r#"[job]
name = "{id}"
parallelism = {p}

[checkpoints]
dir = "{dir}/checkpoints"
interval = "{ms}ms"
timeout = "60s"
{caught_up}

[restart]
type = "none"

[source]
bootstrap_servers = "{bootstrap}"
topics = ["{input}"]
group_id = "{id}"
start = {{ type = "earliest" }}
client = {{ {source_client} }}

[sink.kafka]
bootstrap_servers = "{bootstrap}"
topic = "{output}"
delivery = {{ type = "exactly_once", transactional_id_prefix = "{id}", pool_size = 3, transaction_timeout = "2m" }}
client = {{ {sink_client} }}
"#,
        dir = dir.display(),
        source_client = inline_table("BENCH_SOURCE_CLIENT"),
        sink_client = inline_table("BENCH_SINK_CLIENT"),
    )
}

/// The `key=value,…` overrides in `var` as the inside of a TOML inline table (keys quoted:
/// librdkafka's names have dots).
fn inline_table(var: &str) -> String {
    client_overrides(var)
        .iter()
        .map(|(k, v)| format!("{k:?} = {v:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}
