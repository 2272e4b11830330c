//! `exactly bench partitions`: how the cost of a Kafka-to-Kafka exactly-once job grows with the
//! partitions of its input and output, against the plain consume-produce loop on topics of the
//! same count and Kafka's textbook transactional loop (the same loop, a transaction per checkpoint
//! interval with the consumer's positions in it: what Kafka's transactions cost without exactly's
//! engine), each system its own process (as `bench peers` runs them). Per count: records/s
//! (first output record until a read_committed reader has them all), start-up to the first output
//! record, peak RSS, and for `exactly run` the time from process start to its first completed
//! checkpoint, the checkpoints' durations and the size of the state they wrote (read from its
//! log). With `--json FILE` each curve is also drawn as an SVG chart next to the JSON.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Result};

use super::kafka::*;
use super::peers::{job_file, time_child, Timed};
use super::{median, Report};
use exactly_kafka_client::Cluster;

/// Settings of `bench partitions`.
pub(crate) struct ScaleOptions<'a> {
    pub(crate) cluster: &'a Cluster,
    pub(crate) records: u64,
    pub(crate) size: usize,
    pub(crate) counts: &'a [i32],
    pub(crate) interval: Duration,
    pub(crate) parallelism: u32,
    pub(crate) rounds: usize,
    /// Where the charts go: `<stem>-<figure>.svg` next to this (the `--json` file).
    pub(crate) charts: Option<&'a Path>,
}

/// What one process did.
#[derive(Default, Clone)]
struct Measured {
    rate: f64,
    /// Rate and peak RSS ÷ the plain loop's in the same round (medians: the median of the
    /// rounds' ratios).
    ratio: f64,
    rss_ratio: f64,
    startup_ms: f64,
    rss_mb: f64,
    /// µs of CPU per record: the process's (from its start until its output was complete) and
    /// the local broker's meanwhile.
    cpu_us: Option<f64>,
    broker_us: Option<f64>,
    /// `exactly run` only: process start to its first completed checkpoint, and the checkpoints.
    first_checkpoint_ms: Option<f64>,
    checkpoint_ms_p50: Option<f64>,
    checkpoint_ms_max: Option<f64>,
    state_bytes: Option<f64>,
}

/// The systems, the baseline first, exactly last.
const SYSTEMS: [&str; 3] = ["plain loop", "plain transactional", "exactly"];
/// The subcommand of `exactly bench` that runs each loop as a child.
const LOOPS: [&str; 2] = ["plain-loop", "plain-transactional-loop"];

pub(crate) async fn bench_partitions(o: &ScaleOptions<'_>, report: &mut Report) -> Result<()> {
    println!(
        "Kafka-to-Kafka pass-through as the partitions grow: {} records of {} B spread evenly over the input's partitions, the output as many; exactly-once checkpoints every {}, parallelism {}; {} round(s); each system its own process",
        o.records,
        o.size,
        humantime::format_duration(o.interval),
        o.parallelism,
        o.rounds.max(1)
    );
    println!("rate: records ÷ (a read_committed reader has them all − a read_uncommitted reader saw the first); start: process start to first output record; first ckpt: process start to the first completed checkpoint; ckpt p50/max: checkpoint durations during the run; state: bytes the last checkpoint wrote; RSS: peak resident memory; cpu µs: the process's CPU per record from its start until its output was complete; broker µs: the local broker's meanwhile (`BENCH_BROKER_PID`, else the one local `kafka.Kafka` process; `-` when not found)");
    println!(
        "{:>10} {:<6} {:<19} {:>10} {:>7} {:>9} {:>11} {:>9} {:>9} {:>10} {:>8} {:>7} {:>7} {:>9}",
        "partitions",
        "round",
        "system",
        "records/s",
        "ratio",
        "start ms",
        "first ckpt",
        "ckpt p50",
        "ckpt max",
        "state B",
        "RSS MB",
        "ratio",
        "cpu µs",
        "broker µs"
    );
    // Per count: the medians over rounds of each system.
    let mut curves: Vec<(i32, [Measured; 3])> = Vec::new();
    for &count in o.counts {
        let input = unique("scale-in");
        create_topic(o.cluster, &input, count).await?;
        spread_backlog(o.cluster, &input, count, o.records, o.size)?;
        let mut rounds: [Vec<Measured>; 3] = [Vec::new(), Vec::new(), Vec::new()];
        for round in 1..=o.rounds.max(1) {
            // The order turns each round: no system always runs first, or right after the
            // largest topics were deleted.
            let mut measured: [Measured; 3] = Default::default();
            for k in 0..SYSTEMS.len() {
                let i = (k + round - 1) % SYSTEMS.len();
                measured[i] = run_one(o, i, &input, count).await?;
            }
            let (base_rate, base_rss) = (measured[0].rate, measured[0].rss_mb);
            for (i, system) in SYSTEMS.iter().enumerate() {
                let m = &mut measured[i];
                m.ratio = m.rate / base_rate;
                m.rss_ratio = m.rss_mb / base_rss;
                print_row(count, &round.to_string(), system, m);
                report.row("partitions", &format!("{count} round {round} {system}"), &figures(m));
                rounds[i].push(m.clone());
            }
        }
        delete_topics(o.cluster, &[&input]).await;
        tokio::time::sleep(SETTLE).await;
        let medians = [medians(&rounds[0]), medians(&rounds[1]), medians(&rounds[2])];
        if o.rounds > 1 {
            for (i, system) in SYSTEMS.iter().enumerate() {
                print_row(count, "median", system, &medians[i]);
                report.row("partitions", &format!("{count} median {system}"), &figures(&medians[i]));
            }
        }
        curves.push((count, medians));
    }
    if let Some(json) = o.charts {
        for path in charts(json, o.parallelism, &curves)? {
            println!("chart: {}", path.display());
        }
    }
    Ok(())
}

fn print_row(count: i32, round: &str, system: &str, m: &Measured) {
    let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}"));
    println!(
        "{:>10} {:<6} {:<19} {:>10.0} {:>7.3} {:>9.0} {:>11} {:>9} {:>9} {:>10} {:>8.0} {:>7.2} {:>7} {:>9}",
        count,
        round,
        system,
        m.rate,
        m.ratio,
        m.startup_ms,
        opt(m.first_checkpoint_ms),
        opt(m.checkpoint_ms_p50),
        opt(m.checkpoint_ms_max),
        opt(m.state_bytes),
        m.rss_mb,
        m.rss_ratio,
        super::cpu::show(m.cpu_us),
        super::cpu::show(m.broker_us)
    );
}

fn figures(m: &Measured) -> Vec<(&'static str, f64)> {
    let mut f = vec![
        ("records_per_s", m.rate),
        ("ratio_to_plain", m.ratio),
        ("startup_ms", m.startup_ms),
        ("peak_rss_mb", m.rss_mb),
        ("rss_ratio_to_plain", m.rss_ratio),
    ];
    for (name, v) in [
        ("first_checkpoint_ms", m.first_checkpoint_ms),
        ("checkpoint_ms_p50", m.checkpoint_ms_p50),
        ("checkpoint_ms_max", m.checkpoint_ms_max),
        ("state_bytes", m.state_bytes),
        ("cpu_us_per_record", m.cpu_us),
        ("broker_cpu_us_per_record", m.broker_us),
    ] {
        if let Some(v) = v {
            f.push((name, v));
        }
    }
    f
}

/// The median of each figure over rounds (of the ratios: the median of the rounds' ratios), but
/// the longest checkpoint: the longest of all rounds.
fn medians(rounds: &[Measured]) -> Measured {
    let of = |f: fn(&Measured) -> f64| median(rounds.iter().map(f).collect());
    let of_opt = |f: fn(&Measured) -> Option<f64>| {
        let v: Vec<f64> = rounds.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(v))
    };
    Measured {
        rate: of(|m| m.rate),
        ratio: of(|m| m.ratio),
        rss_ratio: of(|m| m.rss_ratio),
        startup_ms: of(|m| m.startup_ms),
        rss_mb: of(|m| m.rss_mb),
        cpu_us: of_opt(|m| m.cpu_us),
        broker_us: of_opt(|m| m.broker_us),
        first_checkpoint_ms: of_opt(|m| m.first_checkpoint_ms),
        checkpoint_ms_p50: of_opt(|m| m.checkpoint_ms_p50),
        checkpoint_ms_max: rounds.iter().filter_map(|m| m.checkpoint_ms_max).reduce(f64::max),
        state_bytes: of_opt(|m| m.state_bytes),
    }
}

/// `n` records of `size` bytes, partition by partition in turn (the bench's usual keys would
/// reach at most a thousand partitions).
pub(super) fn spread_backlog(cluster: &Cluster, topic: &str, partitions: i32, n: u64, size: usize) -> Result<()> {
    use rdkafka::producer::{BaseRecord, Producer};
    let p = producer(cluster)?;
    let value = vec![b'x'; size];
    for i in 0..n {
        let key = format!("k{i}");
        send_record(
            &p,
            BaseRecord::to(topic)
                .partition((i % partitions as u64) as i32)
                .key(key.as_bytes())
                .payload(&value),
        );
    }
    p.flush(Duration::from_secs(300))?;
    Ok(())
}

async fn run_one(o: &ScaleOptions<'_>, system: usize, input: &str, count: i32) -> Result<Measured> {
    let exactly = system == SYSTEMS.len() - 1;
    let output = unique("scale-out");
    create_topic(o.cluster, &output, count).await?;
    let id = unique("scale");
    let dir = tempfile::tempdir()?;
    let n = o.records;
    let mut cmd = Command::new(std::env::current_exe()?);
    if exactly {
        let job = dir.path().join("job.toml");
        let ms = o.interval.as_millis().to_string();
        let p = o.parallelism.to_string();
        std::fs::write(
            &job,
            job_file(&o.cluster.bootstrap, input, &output, &id, &ms, &p, dir.path(), ""),
        )?;
        // Its log's "Checkpoint complete." lines are read: the default filter, whatever RUST_LOG
        // the benchmark runs with.
        cmd.args(["run", "--no-progress"]).arg(&job).env_remove("RUST_LOG");
    } else {
        let every = format!("{}ms", o.interval.as_millis());
        // The loops partition the output as the sink does (the Java client's murmur2 of the key),
        // not partition for partition: the same batches for all.
        cmd.env("BENCH_LOOP_PARTITIONER", "murmur2_random");
        cmd.args(["bench", LOOPS[system], "--bootstrap", &o.cluster.bootstrap, "--records"])
            .arg(n.to_string())
            .args(["--intervals", &every, "--input", input, "--output", &output]);
    }
    let log_path = dir.path().join("out.log");
    let Timed {
        first,
        all,
        rss_mb,
        start,
        started,
        cpu_us,
        broker_cpu_us,
    } = time_child(o.cluster, &output, n, cmd, &log_path, SYSTEMS[system]).await?;
    let mut m = Measured {
        rate: n as f64 / all.marked.duration_since(first.first).as_secs_f64(),
        startup_ms: first.first.duration_since(start).as_millis() as f64,
        rss_mb,
        cpu_us,
        broker_us: broker_cpu_us,
        ..Measured::default()
    };
    if exactly {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        let checkpoints = checkpoints_in(&text);
        let Some(&(at, _, _)) = checkpoints.first() else {
            bail!(
                "exactly completed no checkpoint while it ran (its log: {})",
                log_path.display()
            );
        };
        m.first_checkpoint_ms = Some(at.duration_since(started).unwrap_or_default().as_millis() as f64);
        let mut durations: Vec<f64> = checkpoints.iter().map(|c| c.1).collect();
        m.checkpoint_ms_p50 = Some(median(durations.clone()));
        durations.sort_by(f64::total_cmp);
        m.checkpoint_ms_max = durations.last().copied();
        m.state_bytes = checkpoints.last().map(|c| c.2);
    }
    delete_topics(o.cluster, &[&output]).await;
    tokio::time::sleep(SETTLE).await;
    Ok(m)
}

/// The completed checkpoints in an `exactly run` log: when (the line's time), duration (ms) and
/// state size (bytes).
pub(super) fn checkpoints_in(log: &str) -> Vec<(SystemTime, f64, f64)> {
    let field = |line: &str, name: &str| -> Option<f64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
    };
    log.lines()
        .filter(|l| l.contains(" Checkpoint complete."))
        .filter_map(|l| {
            let at = humantime::parse_rfc3339_weak(l.split_whitespace().next()?.trim_end_matches('Z')).ok()?;
            Some((at, field(l, "duration_ms=")?, field(l, "state_bytes=")?))
        })
        .collect()
}

/// The curves as SVG charts next to `json`: `<stem>-p<parallelism>-<figure>.svg`.
fn charts(json: &Path, parallelism: u32, curves: &[(i32, [Measured; 3])]) -> Result<Vec<PathBuf>> {
    let stem = json.file_stem().and_then(|s| s.to_str()).unwrap_or("bench");
    let dir = json.parent().unwrap_or(Path::new("."));
    let xs = |f: &dyn Fn(&[Measured; 3]) -> Option<f64>| -> Vec<(f64, f64)> {
        curves
            .iter()
            .filter_map(|(c, m)| f(m).map(|y| (f64::from(*c), y)))
            .collect()
    };
    let title = format!("Kafka-to-Kafka exactly-once, parallelism {parallelism}");
    let mut written = Vec::new();
    let mut chart = |name: &str, y: &str, series: Vec<(&str, Vec<(f64, f64)>)>| -> Result<()> {
        let path = dir.join(format!("{stem}-p{parallelism}-{name}.svg"));
        super::chart::lines(&path, &title, "partitions (input and output each)", y, &series)?;
        written.push(path);
        Ok(())
    };
    chart(
        "throughput",
        "records/s ÷ the plain loop's",
        vec![
            ("exactly", xs(&|m| Some(m[2].ratio))),
            ("plain transactional", xs(&|m| Some(m[1].ratio))),
        ],
    )?;
    chart(
        "rss",
        "peak RSS, MB",
        vec![
            ("plain loop", xs(&|m| Some(m[0].rss_mb))),
            ("plain transactional", xs(&|m| Some(m[1].rss_mb))),
            ("exactly", xs(&|m| Some(m[2].rss_mb))),
        ],
    )?;
    chart(
        "first-checkpoint",
        "start to first completed checkpoint, ms",
        vec![("exactly", xs(&|m| m[2].first_checkpoint_ms))],
    )?;
    chart(
        "checkpoint",
        "checkpoint duration, ms",
        vec![
            ("p50", xs(&|m| m[2].checkpoint_ms_p50)),
            ("max", xs(&|m| m[2].checkpoint_ms_max)),
        ],
    )?;
    chart(
        "state",
        "checkpoint state, bytes",
        vec![("exactly", xs(&|m| m[2].state_bytes))],
    )?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_are_read_from_the_log_of_exactly_run() {
        let log = "2026-12-06T20:04:05.414428Z  INFO exactly_core::runtime::coordination: Checkpoint complete. checkpoint_id=81 duration_ms=157 alignment_ms=0 persist_ms=1 state_bytes=391\n\
                   2026-12-06T20:04:05.414452Z  INFO exactly_core::runtime::coordination: Checkpoints complete again after 71 aborted in a row.\n\
                   2026-12-06T20:04:06.000000Z  INFO exactly_core::runtime::coordination: Checkpoint complete. checkpoint_id=82 duration_ms=5 alignment_ms=0 persist_ms=2 state_bytes=823\n";
        let c = checkpoints_in(log);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].1, c[0].2), (157.0, 391.0));
        assert_eq!((c[1].1, c[1].2), (5.0, 823.0));
        let gap = c[1].0.duration_since(c[0].0).unwrap();
        assert_eq!(gap, Duration::from_micros(585_572));
    }
}
