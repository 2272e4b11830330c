//! What the soak's samples say: printed as they come, then per process (the job between kills)
//! and against the soak's goals — memory, file descriptors, threads, checkpoint duration and
//! latency flat (growth ≤ 5 % within each process's life and from the 10th minute to the end),
//! the transactional-id pool bounded, the checkpoint directory bounded by retention.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::{Kill, Sample, SoakOptions, POOL};
use crate::bench::{median, Report};

/// The growth the goals allow.
const FLAT: f64 = 0.05;

pub(super) fn print_header() {
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
        "dir kB",
        "chk"
    );
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.0}"))
}

pub(super) fn print_sample(s: &Sample) {
    println!(
        "{:>6.0} {:>4} {:>7.1} {:>5.0} {:>7.0} {:>5.2} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8.0} {:>7.0} {:>8.1} {:>4.0}",
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
        s.checkpoint_dir_kb,
        s.checkpoint_dirs
    );
}

pub(super) fn sample_figures(s: &Sample) -> Vec<(&'static str, f64)> {
    let mut f = vec![
        ("t_s", s.t),
        ("incarnation", s.incarnation as f64),
        ("checkpoints", s.checkpoints as f64),
        ("lag", s.lag),
        ("checkpoint_dir_kb", s.checkpoint_dir_kb),
        ("checkpoint_dirs", s.checkpoint_dirs),
    ];
    for (name, v) in [
        ("rss_mb", Some(s.rss_mb)),
        ("fds", Some(s.fds)),
        ("threads", Some(s.threads)),
        ("cpu_cores", Some(s.cpu)),
        ("transactional_ids", Some(s.transactional_ids)),
        ("checkpoint_ms_p50", s.checkpoint_ms_p50),
        ("checkpoint_ms_max", s.checkpoint_ms_max),
        ("latency_ms_p50", s.latency_ms_p50),
        ("latency_ms_p99", s.latency_ms_p99),
        ("latency_ms_max", s.latency_ms_max),
    ] {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            f.push((name, v));
        }
    }
    f
}

/// A figure judged for growth: its name, how a sample gives it, and the change below which it
/// counts as flat whatever the ratio (the figure's resolution: a few ms of a 7 ms checkpoint are
/// noise, not growth).
struct Figure {
    name: &'static str,
    of: fn(&Sample) -> Option<f64>,
    floor: f64,
}

const FIGURES: [Figure; 7] = [
    Figure {
        name: "RSS MB",
        of: |s| Some(s.rss_mb),
        floor: 1.0,
    },
    Figure {
        name: "open fds",
        of: |s| Some(s.fds),
        floor: 0.0,
    },
    Figure {
        name: "threads",
        of: |s| Some(s.threads),
        floor: 0.0,
    },
    Figure {
        name: "ckpt p50 ms",
        of: |s| s.checkpoint_ms_p50,
        floor: 2.0,
    },
    Figure {
        name: "latency p50 ms",
        of: |s| s.latency_ms_p50,
        floor: 10.0,
    },
    Figure {
        name: "latency p99 ms",
        of: |s| s.latency_ms_p99,
        floor: 10.0,
    },
    Figure {
        name: "dir kB",
        of: |s| Some(s.checkpoint_dir_kb),
        floor: 64.0,
    },
];

/// The samples of one process once it caught up: from the first sample but its first whose lag is
/// at most two checkpoint intervals of records (at least 1 s of them) on. The seconds from its start (the
/// kill, or the soak's start) to that sample: its catch-up, to the sample's resolution.
fn settled<'a>(
    o: &SoakOptions<'_>,
    samples: &'a [Sample],
    incarnation: usize,
    from_s: f64,
) -> (Vec<&'a Sample>, Option<f64>) {
    let mine: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.incarnation == incarnation && s.t >= from_s)
        .collect();
    let caught_up = 2.0 * o.rate as f64 * o.interval.as_secs_f64().max(1.0);
    // Never its first sample: that one's latencies are of records held up by the restart.
    let Some(first) = mine
        .iter()
        .skip(1)
        .position(|s| s.lag <= caught_up && s.rss_mb.is_finite())
        .map(|i| i + 1)
    else {
        return (Vec::new(), None);
    };
    let at = mine[first].t;
    (mine[first..].to_vec(), Some(at))
}

/// The median of a figure over samples (None without a finite value).
fn med(samples: &[&Sample], f: fn(&Sample) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = samples.iter().filter_map(|s| f(s)).filter(|v| v.is_finite()).collect();
    (!v.is_empty()).then(|| median(v))
}

/// The first and last third of a process's settled samples.
fn thirds<'a>(s: &[&'a Sample]) -> (Vec<&'a Sample>, Vec<&'a Sample>) {
    let n = (s.len() / 3).max(1).min(s.len());
    (s[..n].to_vec(), s[s.len() - n..].to_vec())
}

fn growth(from: Option<f64>, to: Option<f64>, floor: f64) -> Option<(f64, bool)> {
    let (a, b) = (from?, to?);
    let g = if a > 0.0 { b / a - 1.0 } else { 0.0 };
    Some((g, g <= FLAT + 1e-9 || b - a <= floor))
}

fn show(g: Option<(f64, bool)>) -> String {
    g.map_or("-".to_owned(), |(g, ok)| {
        format!("{:+.1} %{}", g * 100.0, if ok { "" } else { " !" })
    })
}

/// Per process and against the goals; charts with `--json`. Says what it judges; fails nothing
/// (the records' audit does): the figures are the result.
pub(super) fn summarize(o: &SoakOptions<'_>, samples: &[Sample], kills: &[Kill], report: &mut Report) {
    let last = samples.iter().map(|s| s.incarnation).max().unwrap_or(1);
    // Without kills one process: judged from the 10th minute on, as the goal reads.
    let from_s = if kills.is_empty() && o.duration.as_secs() >= 1200 {
        600.0
    } else {
        0.0
    };
    println!("Per process, from the sample where it had caught up (lag ≤ 2 checkpoint intervals of records): the median of its first and last third of samples, and the growth between them (! : above {:.0} % and above the figure's resolution)", FLAT * 100.0);
    println!(
        "{:>4} {:>8} {:>9} {:>7} {:>7} {:>17} {:>11} {:>11} {:>14} {:>15} {:>15} {:>10}",
        "inc",
        "start s",
        "recovered",
        "caught",
        "samples",
        "RSS MB",
        "fds",
        "threads",
        "ckpt p50 ms",
        "latency p50",
        "latency p99",
        "dir kB"
    );
    let mut worst: Vec<Option<(f64, bool)>> = vec![None; FIGURES.len()];
    let mut late_of = Vec::new();
    for inc in 1..=last {
        let start = if inc == 1 {
            0.0
        } else {
            kills.iter().find(|k| k.next == inc).map_or(f64::NAN, |k| k.at)
        };
        let (settled, at) = settled(o, samples, inc, from_s);
        let (early, late) = thirds(&settled);
        let mut cells = Vec::new();
        for (i, f) in FIGURES.iter().enumerate() {
            let (a, b) = (med(&early, f.of), med(&late, f.of));
            let g = growth(a, b, f.floor);
            if g.is_some_and(|g| worst[i].is_none_or(|w| g.0 > w.0)) {
                worst[i] = g;
            }
            cells.push(format!("{}→{} {}", opt(a), opt(b), show(g)));
        }
        let recovered = kills.iter().find(|k| k.next == inc).and_then(|k| k.recovered_s);
        println!(
            "{:>4} {:>8.0} {:>9} {:>7} {:>7} {:>17} {:>11} {:>11} {:>14} {:>15} {:>15} {:>10}",
            inc,
            start,
            recovered.map_or("-".to_owned(), |r| format!("{r:.1} s")),
            at.map_or("never".to_owned(), |at| format!("{:.0} s", at - start)),
            settled.len(),
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            cells[6]
        );
        let mut row: Vec<(&str, f64)> = vec![("start_s", start), ("samples", settled.len() as f64)];
        if let Some(r) = recovered {
            row.push(("first_checkpoint_after_kill_s", r));
        }
        if let Some(at) = at {
            row.push(("caught_up_s", at - start));
        }
        report.row("soak", &format!("process {inc}"), &row);
        late_of.push(late);
    }
    // From the 10th minute to the end: the last third of the process running after minute 10
    // (the first restored one, with kills every 10 minutes: restored processes were seen holding
    // ~10 MB more than the first) against the last third of the last process.
    let after = if kills.is_empty() {
        600.0
    } else {
        o.kill_every.as_secs_f64()
    };
    let base = samples.iter().find(|s| s.t > after).map_or(1, |s| s.incarnation);
    println!(
        "Against the goals (growth ≤ {:.0} % unless below the figure's resolution):",
        FLAT * 100.0
    );
    for (i, f) in FIGURES.iter().enumerate() {
        let across = growth(med(&late_of[base - 1], f.of), med(&late_of[last - 1], f.of), f.floor);
        let flat = worst[i].is_none_or(|g| g.1) && across.is_none_or(|g| g.1);
        println!(
            "  {:<15} within a process at most {:>10}; process {base} to process {last} {:>10}: {}",
            f.name,
            show(worst[i]),
            show(across),
            if worst[i].is_none() && across.is_none() {
                "not measured"
            } else if flat {
                "flat"
            } else {
                "GREW"
            }
        );
        let mut row = Vec::new();
        if let Some(g) = worst[i] {
            row.push(("growth_within_max", g.0));
        }
        if let Some(g) = across {
            row.push(("growth_across", g.0));
        }
        row.push(("flat", if flat { 1.0 } else { 0.0 }));
        report.row("soak", f.name, &row);
    }
    let ids: Vec<f64> = samples
        .iter()
        .map(|s| s.transactional_ids)
        .filter(|v| v.is_finite())
        .collect();
    let pool = f64::from(o.parallelism * POOL);
    let most = ids.iter().copied().fold(0.0, f64::max);
    println!(
        "  transactional ids: at most {most:.0} in {} samples (the pool: {} subtask(s) × {POOL} = {pool:.0}){}: {}",
        ids.len(),
        o.parallelism,
        if ids.len() < samples.len() {
            format!(", {} samples could not list them", samples.len() - ids.len())
        } else {
            String::new()
        },
        if ids.is_empty() {
            "not measured"
        } else if most <= pool {
            "bounded"
        } else {
            "ABOVE THE POOL"
        }
    );
    let dirs = samples.iter().map(|s| s.checkpoint_dirs).fold(0.0, f64::max);
    let kb = samples.iter().map(|s| s.checkpoint_dir_kb).fold(0.0, f64::max);
    println!(
        "  checkpoint directory: at most {dirs:.0} chk-N directories (one retained, one being written) and {kb:.1} kB: {}",
        if dirs <= 2.0 { "bounded by retention" } else { "MORE THAN RETENTION KEEPS" }
    );
    report.row(
        "soak",
        "bounds",
        &[
            ("transactional_ids_max", most),
            ("pool", pool),
            ("checkpoint_dirs_max", dirs),
            ("checkpoint_dir_kb_max", kb),
        ],
    );
    for (k, kill) in kills.iter().enumerate() {
        println!(
            "kill {} at {:.0} s: process {}'s first checkpoint {} after the kill",
            k + 1,
            kill.at,
            kill.next,
            kill.recovered_s.map_or("never".to_owned(), |s| format!("{s:.1} s"))
        );
    }
    if let Some(json) = o.charts {
        match charts(json, samples) {
            Ok(paths) => paths.iter().for_each(|p| println!("chart: {}", p.display())),
            Err(e) => eprintln!("the charts could not be written: {e:#}"),
        }
    }
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
        crate::bench::chart::lines(&path, title, "minutes", y, &series)?;
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
        "end-to-end latency, ms",
        vec![("p50", xs(&|s| s.latency_ms_p50)), ("p99", xs(&|s| s.latency_ms_p99))],
    )?;
    chart(
        "dir",
        "checkpoint directory, kB",
        vec![("size", xs(&|s| Some(s.checkpoint_dir_kb)))],
    )?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_is_flat_within_five_percent_or_the_resolution() {
        assert_eq!(growth(Some(100.0), Some(105.0), 0.0).map(|g| g.1), Some(true));
        assert_eq!(growth(Some(100.0), Some(106.0), 1.0).map(|g| g.1), Some(false));
        assert_eq!(growth(Some(7.0), Some(8.5), 2.0).map(|g| g.1), Some(true));
        assert_eq!(growth(None, Some(8.5), 2.0), None);
    }
}
