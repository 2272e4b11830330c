//! `exactly bench processes`: one Kafka-to-Kafka exactly-once job of parallelism P split over 1,
//! 2, 4 … processes on this machine (`exactly run --subtasks FIRST..LAST --parallelism P`, as an
//! operator scales out), on the same backlog: the rate of the whole (first output record until a
//! read_committed reader has them all), each process's peak RSS and CPU and their sums, the local
//! broker's CPU, start-up and checkpoints per process. Checkpoints go to `--checkpoints` (an
//! object store URL: each run under a prefix of its own) or a local directory. The baseline is
//! the first count (1 process by default), measured in the same rounds, the order turning.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Result};
use rdkafka::Message;

use super::kafka::*;
use super::peers::{job_file, time_children, TimedAll};
use super::scale::{checkpoints_in, spread_backlog};
use super::{median, Report};
use exactly_kafka_client::Cluster;

/// Partitions of the input and output. A subtask reads every P-th partition (from an offset the
/// topic's name sets): with P dividing them every subtask reads as many, and with each process
/// count dividing P every process runs as many subtasks.
const TOPIC_PARTITIONS: i32 = 12;

/// Settings of `bench processes`.
pub(crate) struct ProcessesOptions<'a> {
    pub(crate) cluster: &'a Cluster,
    pub(crate) records: u64,
    pub(crate) size: usize,
    /// Process counts, the baseline first.
    pub(crate) counts: &'a [u32],
    pub(crate) interval: Duration,
    /// The whole job's parallelism (each process runs a share of its subtasks).
    pub(crate) parallelism: u32,
    pub(crate) rounds: usize,
    /// An object store location (`s3://bucket/prefix`) for the checkpoints, else a local directory.
    pub(crate) checkpoints: Option<&'a str>,
    /// Where the charts go: `<stem>-<figure>.svg` next to this (the `--json` file).
    pub(crate) charts: Option<&'a Path>,
}

/// What one split of the job did.
#[derive(Default, Clone)]
struct Measured {
    rate: f64,
    /// Rate ÷ the baseline count's in the same round (medians: the median of the rounds' ratios).
    ratio: f64,
    startup_ms: f64,
    /// Peak RSS (MB): summed over the processes, and the largest process's.
    rss_total: f64,
    rss_max: f64,
    /// µs of CPU per record of the whole output: summed over the processes, the largest
    /// process's, and the local broker's meanwhile.
    cpu_total: Option<f64>,
    cpu_max: Option<f64>,
    broker: Option<f64>,
    /// From the processes' start to the last one's first completed checkpoint (ms), and the
    /// median and longest checkpoint of all of them.
    first_checkpoint_ms: f64,
    checkpoint_ms_p50: f64,
    checkpoint_ms_max: f64,
}

/// The subtask ranges of `processes` processes over `parallelism` subtasks, as even as they go.
fn ranges(processes: u32, parallelism: u32) -> Vec<(u32, u32)> {
    (0..processes)
        .map(|i| (i * parallelism / processes, (i + 1) * parallelism / processes - 1))
        .collect()
}

pub(crate) async fn bench_processes(o: &ProcessesOptions<'_>, report: &mut Report) -> Result<()> {
    if o.counts.is_empty() || o.counts.iter().any(|&c| c == 0 || !o.parallelism.is_multiple_of(c)) {
        bail!(
            "--processes needs counts that divide the job's parallelism ({}; set it with --parallelism): each process runs as many subtasks",
            o.parallelism
        );
    }
    if o.parallelism == 0 || TOPIC_PARTITIONS % o.parallelism as i32 != 0 {
        bail!(
            "--parallelism must divide the topics' {TOPIC_PARTITIONS} partitions (1, 2, 3, 4, 6 or 12): each subtask reads as many"
        );
    }
    println!(
        "One Kafka-to-Kafka exactly-once job (parallelism {}) split over {:?} processes: {} records of {} B spread evenly over {} input partitions, the output as many; checkpoints every {} in {}; {} round(s), the order turning",
        o.parallelism,
        o.counts,
        o.records,
        o.size,
        TOPIC_PARTITIONS,
        humantime::format_duration(o.interval),
        o.checkpoints.unwrap_or("a local directory"),
        o.rounds.max(1)
    );
    println!("rate: records ÷ (a read_committed reader has them all − a read_uncommitted reader saw the first, of any process: the later processes' start-up counts against the split), every key then read back once; ratio: ÷ the first count's rate in the same round; start: processes started to the first output record; first ckpt: processes started to the last one's first completed checkpoint; ckpt p50/max: all processes' checkpoints; RSS: peak resident memory, the processes' sum and the largest; cpu µs: CPU per record of the whole output, the processes' sum and the largest, and the local broker's meanwhile");
    println!(
        "{:>9} {:<6} {:>10} {:>7} {:>8} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "processes",
        "round",
        "records/s",
        "ratio",
        "start ms",
        "first ckpt",
        "ckpt p50",
        "ckpt max",
        "RSS sum",
        "RSS max",
        "cpu sum",
        "cpu max",
        "broker"
    );
    if let Some(url) = o.checkpoints {
        println!(
            "(the checkpoints are left in the store, under {}/procs-<id>/)",
            url.trim_end_matches('/')
        );
    }
    let input = unique("procs-in");
    create_topic(o.cluster, &input, TOPIC_PARTITIONS).await?;
    let measured = measure(o, &input, report).await;
    delete_topics(o.cluster, &[&input]).await;
    let medians = measured?;
    if o.rounds > 1 {
        for (i, m) in medians.iter().enumerate() {
            print_row(o.counts[i], "median", m);
            report.row("processes", &format!("{} median", o.counts[i]), &figures(m));
        }
    }
    if let Some(json) = o.charts {
        for path in charts(json, o.parallelism, o.counts, &medians)? {
            println!("chart: {}", path.display());
        }
    }
    Ok(())
}

/// Every round of every count on a backlog written into `input`; each count's medians.
async fn measure(o: &ProcessesOptions<'_>, input: &str, report: &mut Report) -> Result<Vec<Measured>> {
    spread_backlog(o.cluster, input, TOPIC_PARTITIONS, o.records, o.size)?;
    let mut rounds: Vec<Vec<Measured>> = vec![Vec::new(); o.counts.len()];
    for round in 1..=o.rounds.max(1) {
        let mut measured: Vec<Measured> = vec![Measured::default(); o.counts.len()];
        for k in 0..o.counts.len() {
            let i = (k + round - 1) % o.counts.len();
            measured[i] = run_split(o, input, o.counts[i]).await?;
        }
        let base = measured[0].rate;
        for (i, m) in measured.iter_mut().enumerate() {
            m.ratio = m.rate / base;
            print_row(o.counts[i], &round.to_string(), m);
            report.row("processes", &format!("{} round {round}", o.counts[i]), &figures(m));
            rounds[i].push(m.clone());
        }
    }
    Ok(rounds.iter().map(|r| medians(r)).collect())
}

/// One split of the job timed on a fresh output topic (deleted afterwards, also on failure; the
/// processes' logs are kept on failure, where the error names them).
async fn run_split(o: &ProcessesOptions<'_>, input: &str, processes: u32) -> Result<Measured> {
    let output = unique("procs-out");
    create_topic(o.cluster, &output, TOPIC_PARTITIONS).await?;
    let dir = tempfile::tempdir()?;
    let measured = run_split_in(o, input, &output, processes, dir.path()).await;
    delete_topics(o.cluster, &[&output]).await;
    if measured.is_err() {
        let _ = dir.keep();
    }
    tokio::time::sleep(SETTLE).await;
    measured
}

async fn run_split_in(
    o: &ProcessesOptions<'_>,
    input: &str,
    output: &str,
    processes: u32,
    dir: &Path,
) -> Result<Measured> {
    let id = unique("procs");
    let job = dir.join("job.toml");
    let ms = o.interval.as_millis().to_string();
    let p = o.parallelism.to_string();
    let mut text = job_file(&o.cluster.bootstrap, input, output, &id, &ms, &p, dir, "");
    if let Some(url) = o.checkpoints {
        let local = format!("dir = \"{}/checkpoints\"", dir.display());
        if !text.contains(&local) {
            bail!("the job file's checkpoint directory was not where expected:\n{text}");
        }
        text = text.replace(&local, &format!("dir = \"{}/{id}\"", url.trim_end_matches('/')));
    }
    std::fs::write(&job, text)?;
    let mut cmds = Vec::new();
    let mut logs = Vec::new();
    for (first, last) in ranges(processes, o.parallelism) {
        let mut cmd = Command::new(std::env::current_exe()?);
        // Their logs' "Checkpoint complete." lines are read: the default filter, whatever
        // RUST_LOG the benchmark runs with.
        cmd.args(["run", "--no-progress"])
            .arg(&job)
            .args(["--subtasks", &format!("{first}..{last}"), "--parallelism", &p])
            .env_remove("RUST_LOG");
        let log = dir.join(format!("process-{first}-{last}.log"));
        logs.push(log.clone());
        cmds.push((cmd, log));
    }
    let TimedAll {
        first,
        all,
        start,
        started,
        each,
        broker_cpu_us,
    } = time_children(o.cluster, output, o.records, cmds, "exactly run").await?;
    let mut durations = Vec::new();
    let mut first_checkpoint_ms = 0f64;
    for log in &logs {
        let checkpoints = checkpoints_in(&std::fs::read_to_string(log).unwrap_or_default());
        let Some(&(at, _, _)) = checkpoints.first() else {
            bail!(
                "a process completed no checkpoint while it ran (its log: {})",
                log.display()
            );
        };
        let ms = at.duration_since(started).unwrap_or_default().as_millis() as f64;
        first_checkpoint_ms = first_checkpoint_ms.max(ms);
        durations.extend(checkpoints.iter().map(|c| c.1));
    }
    if each.iter().any(|e| e.0 == 0.0) {
        bail!("a process ended before its memory was read (logs in {})", dir.display());
    }
    distinct_keys(o.cluster, output, o.records)?;
    durations.sort_by(f64::total_cmp);
    let sum = |v: Vec<Option<f64>>| v.into_iter().sum::<Option<f64>>();
    let m = Measured {
        rate: o.records as f64 / all.marked.duration_since(first.first).as_secs_f64(),
        ratio: 0.0,
        startup_ms: first.first.duration_since(start).as_millis() as f64,
        rss_total: each.iter().map(|e| e.0).sum(),
        rss_max: each.iter().map(|e| e.0).fold(0.0, f64::max),
        cpu_total: sum(each.iter().map(|e| e.1).collect()),
        cpu_max: each
            .iter()
            .map(|e| e.1)
            .collect::<Option<Vec<f64>>>()
            .and_then(|v| v.into_iter().reduce(f64::max)),
        broker: broker_cpu_us,
        first_checkpoint_ms,
        checkpoint_ms_p50: median(durations.clone()),
        checkpoint_ms_max: durations.last().copied().unwrap_or(0.0),
    };
    Ok(m)
}

/// Reads `topic` back (read_committed) and fails unless it holds `n` records of `n` different keys:
/// the timed reader counts records, so a split job writing some twice would have looked fast.
fn distinct_keys(cluster: &Cluster, topic: &str, n: u64) -> Result<()> {
    let c = consumer(cluster, topic, true)?;
    let mut seen = std::collections::HashSet::with_capacity(n as usize);
    let (mut count, mut idle) = (0u64, 0);
    while idle < 50 {
        match c.poll(Duration::from_millis(100)) {
            Some(m) => {
                let m = m?;
                idle = 0;
                count += 1;
                if !seen.insert(m.key().unwrap_or_default().to_vec()) {
                    bail!(
                        "{topic}: key {} written twice",
                        String::from_utf8_lossy(m.key().unwrap_or_default())
                    );
                }
            }
            None => idle += 1,
        }
    }
    if count != n {
        bail!("{topic}: {count} records read back, {n} written");
    }
    Ok(())
}

fn print_row(processes: u32, round: &str, m: &Measured) {
    println!(
        "{:>9} {:<6} {:>10.0} {:>7.3} {:>8.0} {:>10.0} {:>8.0} {:>8.0} {:>9.0} {:>9.0} {:>9} {:>9} {:>9}",
        processes,
        round,
        m.rate,
        m.ratio,
        m.startup_ms,
        m.first_checkpoint_ms,
        m.checkpoint_ms_p50,
        m.checkpoint_ms_max,
        m.rss_total,
        m.rss_max,
        super::cpu::show(m.cpu_total),
        super::cpu::show(m.cpu_max),
        super::cpu::show(m.broker)
    );
}

fn figures(m: &Measured) -> Vec<(&'static str, f64)> {
    let mut f = vec![
        ("records_per_s", m.rate),
        ("ratio_to_first", m.ratio),
        ("startup_ms", m.startup_ms),
        ("first_checkpoint_ms", m.first_checkpoint_ms),
        ("checkpoint_ms_p50", m.checkpoint_ms_p50),
        ("checkpoint_ms_max", m.checkpoint_ms_max),
        ("peak_rss_mb_sum", m.rss_total),
        ("peak_rss_mb_max", m.rss_max),
    ];
    for (name, v) in [
        ("cpu_us_per_record_sum", m.cpu_total),
        ("cpu_us_per_record_max", m.cpu_max),
        ("broker_cpu_us_per_record", m.broker),
    ] {
        if let Some(v) = v {
            f.push((name, v));
        }
    }
    f
}

/// The median of each figure over rounds, but the longest checkpoint: the longest of all.
fn medians(rounds: &[Measured]) -> Measured {
    let of = |f: fn(&Measured) -> f64| median(rounds.iter().map(f).collect());
    let of_opt = |f: fn(&Measured) -> Option<f64>| {
        let v: Vec<f64> = rounds.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(v))
    };
    Measured {
        rate: of(|m| m.rate),
        ratio: of(|m| m.ratio),
        startup_ms: of(|m| m.startup_ms),
        rss_total: of(|m| m.rss_total),
        rss_max: of(|m| m.rss_max),
        cpu_total: of_opt(|m| m.cpu_total),
        cpu_max: of_opt(|m| m.cpu_max),
        broker: of_opt(|m| m.broker),
        first_checkpoint_ms: of(|m| m.first_checkpoint_ms),
        checkpoint_ms_p50: of(|m| m.checkpoint_ms_p50),
        checkpoint_ms_max: rounds.iter().map(|m| m.checkpoint_ms_max).fold(0.0, f64::max),
    }
}

/// The curves as SVG charts next to `json`: `<stem>-p<parallelism>-<figure>.svg`.
fn charts(json: &Path, parallelism: u32, counts: &[u32], medians: &[Measured]) -> Result<Vec<PathBuf>> {
    let stem = json.file_stem().and_then(|s| s.to_str()).unwrap_or("bench");
    let dir = json.parent().unwrap_or(Path::new("."));
    let xs = |f: &dyn Fn(&Measured) -> Option<f64>| -> Vec<(f64, f64)> {
        counts
            .iter()
            .zip(medians)
            .filter_map(|(c, m)| f(m).map(|y| (f64::from(*c), y)))
            .collect()
    };
    let title = format!("Kafka-to-Kafka exactly-once, parallelism {parallelism}, over processes");
    let mut written = Vec::new();
    let mut chart = |name: &str, y: &str, series: Vec<(&str, Vec<(f64, f64)>)>| -> Result<()> {
        let path = dir.join(format!("{stem}-p{parallelism}-{name}.svg"));
        super::chart::lines(&path, &title, "processes", y, &series)?;
        written.push(path);
        Ok(())
    };
    chart(
        "throughput",
        "records/s",
        vec![("all processes", xs(&|m| Some(m.rate)))],
    )?;
    chart(
        "rss",
        "peak RSS, MB",
        vec![
            ("sum", xs(&|m| Some(m.rss_total))),
            ("largest process", xs(&|m| Some(m.rss_max))),
        ],
    )?;
    chart(
        "cpu",
        "CPU µs per record",
        vec![("processes, sum", xs(&|m| m.cpu_total)), ("broker", xs(&|m| m.broker))],
    )?;
    chart(
        "checkpoint",
        "checkpoint duration, ms",
        vec![
            ("p50", xs(&|m| Some(m.checkpoint_ms_p50))),
            ("max", xs(&|m| Some(m.checkpoint_ms_max))),
        ],
    )?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subtasks_are_split_into_ranges_that_cover_them_once() {
        for parallelism in 1..=12 {
            for processes in 1..=parallelism {
                let r = ranges(processes, parallelism);
                assert_eq!(r.len(), processes as usize);
                assert_eq!(r[0].0, 0);
                assert_eq!(r.last().unwrap().1, parallelism - 1);
                for w in r.windows(2) {
                    assert_eq!(w[1].0, w[0].1 + 1, "{processes} over {parallelism}: {r:?}");
                }
                let sizes: Vec<u32> = r.iter().map(|(a, b)| b - a + 1).collect();
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 1, "{processes} over {parallelism}: {r:?}");
            }
        }
        assert_eq!(ranges(2, 4), vec![(0, 1), (2, 3)]);
    }
}
