//! What the soak's samples say: printed as they come, then per process (the job between kills)
//! and against the soak's goals, from the 10th minute on — memory, file descriptors, threads,
//! checkpoint duration and latency flat (growth ≤ 5 % within each process's life, the trend
//! fitted over its samples, and from the first process after minute 10 to the last), the
//! transactional-id pool bounded, the checkpoint directory bounded by retention. Also judges the
//! samples of an earlier run's JSON again (`bench soak --judge FILE`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{Sample, SoakOptions, POOL};
use crate::{median, Report};

mod charts;
use charts::charts;

/// The growth the goals allow.
const FLAT: f64 = 0.05;
/// Fewer settled samples than this: a process's trend is not judged.
const FEWEST: usize = 6;

/// One process of the job: its number, when it started (s since the soak's start) and, after a
/// planned kill, how long until its first completed checkpoint.
pub(super) struct Process {
    pub(super) n: usize,
    pub(super) start_s: f64,
    pub(super) recovered_s: Option<f64>,
}

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

/// What an earlier run's JSON holds: its samples, its processes, the settings it recorded (runs
/// before that recorded none) and what its audit of the records found wrong.
type Earlier = (Vec<Sample>, Vec<Process>, Option<serde_json::Value>, Vec<String>);

/// The samples of an earlier run's JSON (`bench soak --json`), its processes and the settings it
/// recorded (the figures of its `settings` row), and the goals its records' audit did not meet
/// (none audited: that too).
pub(super) fn read_json(path: &Path) -> Result<Earlier> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let rows = v["rows"]
        .as_array()
        .with_context(|| format!("{} has no rows: not a bench JSON file", path.display()))?;
    let (mut samples, mut processes) = (Vec::new(), Vec::new());
    let settings = rows
        .iter()
        .find(|r| r["bench"] == "soak" && r["case"] == "settings")
        .map(|r| r["figures"].clone());
    for row in rows.iter().filter(|r| r["bench"] == "soak") {
        let case = row["case"].as_str().unwrap_or_default();
        let f = |name: &str| row["figures"][name].as_f64();
        let nan = |name: &str| f(name).unwrap_or(f64::NAN);
        if case.starts_with("sample ") {
            samples.push(Sample {
                t: nan("t_s"),
                incarnation: f("incarnation").unwrap_or(0.0) as usize,
                rss_mb: nan("rss_mb"),
                fds: nan("fds"),
                threads: nan("threads"),
                cpu: nan("cpu_cores"),
                checkpoints: f("checkpoints").unwrap_or(0.0) as usize,
                checkpoint_ms_p50: f("checkpoint_ms_p50"),
                checkpoint_ms_max: f("checkpoint_ms_max"),
                latency_ms_p50: f("latency_ms_p50"),
                latency_ms_p99: f("latency_ms_p99"),
                latency_ms_max: f("latency_ms_max"),
                lag: nan("lag"),
                transactional_ids: nan("transactional_ids"),
                // Runs before the directory was given in kB gave it in MB.
                checkpoint_dir_kb: f("checkpoint_dir_kb")
                    .or(f("checkpoint_dir_mb").map(|mb| mb * 1e3))
                    .unwrap_or(f64::NAN),
                checkpoint_dirs: nan("checkpoint_dirs"),
            });
        } else if let Some(n) = case.strip_prefix("process ").and_then(|n| n.parse().ok()) {
            processes.push(Process {
                n,
                start_s: nan("start_s"),
                recovered_s: f("first_checkpoint_after_kill_s"),
            });
        }
    }
    if samples.is_empty() {
        bail!("{} holds no samples of bench soak", path.display());
    }
    // A run that failed before it judged has no process rows: from the samples (a process
    // started one sample before its first).
    if processes.is_empty() {
        let mut last = 0;
        for s in &samples {
            if s.incarnation != last {
                last = s.incarnation;
                let start_s = if last == 1 {
                    0.0
                } else {
                    s.t - super::SAMPLE.as_secs_f64()
                };
                processes.push(Process {
                    n: last,
                    start_s,
                    recovered_s: None,
                });
            }
        }
    }
    let records = rows
        .iter()
        .find(|r| r["bench"] == "soak" && r["case"] == "records")
        .map(|r| &r["figures"]);
    let outcome = match records {
        None => vec!["the run ended before its records were audited".to_owned()],
        Some(f) => {
            let n = |k: &str| f[k].as_f64();
            let mut wrong = Vec::new();
            for (key, what) in [
                ("duplicates", "read more than once"),
                ("missing", "never read"),
                ("foreign", "not the feeder's"),
                ("not_delivered", "not delivered by the feeder"),
                ("exited_by_itself", "times the job exited by itself"),
            ] {
                if n(key).is_some_and(|v| v > 0.0) {
                    wrong.push(format!("{} {what}", n(key).unwrap_or_default()));
                }
            }
            if n("drained") == Some(0.0) {
                wrong.push("the output did not catch up with the input".to_owned());
            }
            if n("in_input") != n("fed") {
                wrong.push("the input does not hold what the feeder fed".to_owned());
            }
            wrong
        }
    };
    Ok((samples, processes, settings, outcome))
}

/// A figure judged for growth: its name, its JSON key, how a sample gives it, and the change
/// below which it counts as flat whatever the ratio (the figure's resolution: a few ms of a 7 ms
/// checkpoint are noise, not growth).
struct Figure {
    name: &'static str,
    key: &'static str,
    of: fn(&Sample) -> Option<f64>,
    floor: f64,
}

const FIGURES: [Figure; 7] = [
    Figure {
        name: "RSS MB",
        key: "rss",
        of: |s| Some(s.rss_mb),
        floor: 1.0,
    },
    Figure {
        name: "open fds",
        key: "fds",
        of: |s| Some(s.fds),
        floor: 0.0,
    },
    Figure {
        name: "threads",
        key: "threads",
        of: |s| Some(s.threads),
        floor: 0.0,
    },
    Figure {
        name: "ckpt p50 ms",
        key: "checkpoint_p50",
        of: |s| s.checkpoint_ms_p50,
        floor: 2.0,
    },
    Figure {
        name: "latency p50 ms",
        key: "latency_p50",
        of: |s| s.latency_ms_p50,
        floor: 10.0,
    },
    Figure {
        name: "latency p99 ms",
        key: "latency_p99",
        of: |s| s.latency_ms_p99,
        floor: 10.0,
    },
    Figure {
        name: "dir kB",
        key: "dir",
        of: |s| Some(s.checkpoint_dir_kb),
        floor: 4.0,
    },
];

/// A figure's (t, value) points over samples, finite values only.
fn points(samples: &[&Sample], f: fn(&Sample) -> Option<f64>) -> Vec<(f64, f64)> {
    samples
        .iter()
        .filter_map(|s| f(s).filter(|v| v.is_finite()).map(|v| (s.t, v)))
        .collect()
}

/// The trend of `points` (Theil–Sen: the median of the slopes between every two points, robust to
/// a few outliers): its value at the first and the last point.
fn trend(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    if points.len() < FEWEST {
        return None;
    }
    let mut slopes = Vec::new();
    for (i, a) in points.iter().enumerate() {
        for b in &points[i + 1..] {
            if b.0 > a.0 {
                slopes.push((b.1 - a.1) / (b.0 - a.0));
            }
        }
    }
    let m = median(slopes);
    let b = median(points.iter().map(|p| p.1 - m * p.0).collect());
    let (t0, t1) = (points[0].0, points[points.len() - 1].0);
    Some((b + m * t0, b + m * t1))
}

/// Growth from `a` to `b`, and whether it is flat (≤ 5 %, or less than `floor`).
fn growth(a: f64, b: f64, floor: f64) -> (f64, bool) {
    let g = if a > 0.0 { b / a - 1.0 } else { 0.0 };
    (g, g <= FLAT + 1e-9 || b - a <= floor)
}

fn show(a: f64, b: f64, (g, flat): (f64, bool)) -> String {
    format!("{a:.0}→{b:.0} {:+.1} %{}", g * 100.0, if flat { "" } else { " !" })
}

/// The samples of process `p` judged: those after `from_s`, without its first when it started in
/// the window (that one's latencies are of records held up by the restart), from the first whose
/// lag is at most two checkpoint intervals of records (at least 1 s of them) on. Also when it
/// caught up (s since the soak's start), if it did.
fn settled<'a>(o: &SoakOptions<'_>, samples: &'a [Sample], p: &Process, from_s: f64) -> (Vec<&'a Sample>, Option<f64>) {
    let mine: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.incarnation == p.n && s.t > from_s)
        .collect();
    let skip = usize::from(p.start_s >= from_s);
    let caught_up = 2.0 * o.rate as f64 * o.interval.as_secs_f64().max(1.0);
    match mine
        .iter()
        .skip(skip)
        .position(|s| s.lag <= caught_up && s.rss_mb.is_finite())
    {
        Some(i) => (mine[i + skip..].to_vec(), Some(mine[i + skip].t)),
        None => (Vec::new(), None),
    }
}

/// Per process and against the goals; charts with `--json`. Returns the goals not met.
pub(super) fn judge(
    o: &SoakOptions<'_>,
    samples: &[Sample],
    processes: &[Process],
    report: &mut Report,
) -> Vec<String> {
    let mut unmet = Vec::new();
    // The goals hold from the 10th minute on (all of a shorter run).
    let from_s = if o.duration.as_secs() >= 1200 { 600.0 } else { 0.0 };
    println!(
        "Per process, judged from {from_s:.0} s on, from the sample where it had caught up (lag ≤ 2 checkpoint intervals of records; never a restarted process's first sample): each figure's trend over its samples (Theil–Sen), its value at the first and last sample and the growth (! : above {:.0} % and above the figure's resolution; - : fewer than {FEWEST} samples)",
        FLAT * 100.0
    );
    println!(
        "{:>4} {:>7} {:>9} {:>7} {:>7} {:>17} {:>13} {:>13} {:>16} {:>17} {:>19} {:>13}",
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
    let mut judged: Vec<(usize, Vec<&Sample>)> = Vec::new();
    let mut trended = [false; FIGURES.len()];
    for p in processes {
        let (settled, at) = settled(o, samples, p, from_s);
        let in_window = samples.iter().any(|s| s.incarnation == p.n && s.t > from_s);
        let mut cells = Vec::new();
        let mut row: Vec<(String, f64)> = vec![("start_s".into(), p.start_s), ("samples".into(), settled.len() as f64)];
        for (i, f) in FIGURES.iter().enumerate() {
            match trend(&points(&settled, f.of)) {
                Some((a, b)) => {
                    trended[i] = true;
                    let g = growth(a, b, f.floor);
                    if !g.1 {
                        unmet.push(format!(
                            "{} grew {:+.1} % within process {} ({a:.1} → {b:.1})",
                            f.name,
                            g.0 * 100.0,
                            p.n
                        ));
                    }
                    row.push((format!("{}_growth", f.key), g.0));
                    cells.push(show(a, b, g));
                }
                None => cells.push("-".into()),
            }
        }
        if in_window && at.is_none() {
            unmet.push(format!(
                "process {} never caught up (its lag stayed above two checkpoint intervals of records)",
                p.n
            ));
        }
        if let Some(r) = p.recovered_s {
            row.push(("first_checkpoint_after_kill_s".into(), r));
        }
        let caught = at.filter(|_| p.start_s >= from_s).map(|at| at - p.start_s);
        if let Some(c) = caught {
            row.push(("caught_up_s".into(), c));
        }
        println!(
            "{:>4} {:>7.0} {:>9} {:>7} {:>7} {:>17} {:>13} {:>13} {:>16} {:>17} {:>19} {:>13}",
            p.n,
            p.start_s,
            p.recovered_s.map_or("-".to_owned(), |r| format!("{r:.1} s")),
            match (in_window, at, caught) {
                (false, _, _) => "before".to_owned(),
                (true, None, _) => "never".to_owned(),
                (true, Some(_), Some(c)) => format!("{c:.0} s"),
                (true, Some(_), None) => "-".to_owned(),
            },
            settled.len(),
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            cells[6]
        );
        let row: Vec<(&str, f64)> = row.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        report.row("soak", &format!("process {}", p.n), &row);
        if !settled.is_empty() {
            judged.push((p.n, settled));
        }
    }
    // From the first process judged to the last: the last third of each (the same part of a
    // process's life; with kills every 10 minutes, from the first restored process on).
    println!(
        "Against the goals, from {from_s:.0} s on (growth ≤ {:.0} % unless below the figure's resolution):",
        FLAT * 100.0
    );
    // A restored process holds more than the first, which restored nothing (its recovery's
    // clients: about 10 more file descriptors and 12-28 MB seen): with two restored processes
    // judged, the first is left out of the comparison.
    let restored: Vec<&(usize, Vec<&Sample>)> = judged.iter().filter(|(n, _)| *n > 1).collect();
    let compared: Vec<&(usize, Vec<&Sample>)> = if restored.len() >= 2 {
        restored
    } else {
        judged.iter().collect()
    };
    let ends = compared.first().zip(compared.last()).filter(|(a, b)| a.0 != b.0);
    let last_third = |s: &[&Sample], f: fn(&Sample) -> Option<f64>| {
        let v: Vec<f64> = points(&s[s.len() - (s.len() / 3).max(1)..], f)
            .iter()
            .map(|p| p.1)
            .collect();
        (!v.is_empty()).then(|| median(v))
    };
    for (i, f) in FIGURES.iter().enumerate() {
        if !trended[i] {
            unmet.push(format!(
                "{} not judged within any process: none had {FEWEST} samples after catching up",
                f.name
            ));
        }
        let within = unmet.iter().any(|u| u.starts_with(f.name) && u.contains(" grew "));
        let across = ends.and_then(|(a, b)| {
            let (x, y) = (last_third(&a.1, f.of)?, last_third(&b.1, f.of)?);
            Some((a.0, b.0, x, y, growth(x, y, f.floor)))
        });
        if let Some((a, b, x, y, g)) = across {
            if !g.1 {
                unmet.push(format!(
                    "{} grew {:+.1} % from process {a} to process {b} ({x:.1} → {y:.1})",
                    f.name,
                    g.0 * 100.0
                ));
            }
        }
        println!(
            "  {:<15} within each process: {}; {}",
            f.name,
            if within { "GREW" } else { "flat where judged" },
            across.map_or(
                "one process judged: not compared across processes".to_owned(),
                |(a, b, x, y, g)| format!(
                    "process {a} to process {b}: {}: {}",
                    show(x, y, g),
                    if g.1 { "flat" } else { "GREW" }
                )
            )
        );
        if let Some((_, _, _, _, g)) = across {
            report.row(
                "soak",
                &format!("{} across", f.key),
                &[("growth", g.0), ("flat", f64::from(u8::from(g.1)))],
            );
        }
    }
    // The pool: no new transactional ids once the first process judged ended.
    let ids = |keep: &dyn Fn(&Sample) -> bool| {
        samples
            .iter()
            .filter(|s| keep(s))
            .map(|s| s.transactional_ids)
            .filter(|v| v.is_finite())
            .fold(f64::NAN, f64::max)
    };
    let first_end = judged.first().map_or(f64::INFINITY, |(_, s)| s[s.len() - 1].t);
    let (early, late) = (ids(&|s| s.t <= first_end), ids(&|s| s.t > first_end));
    let pool = f64::from(o.parallelism * POOL);
    let unlisted = samples.iter().filter(|s| !s.transactional_ids.is_finite()).count();
    // NaN (none listed after, or before) counts as no new ids.
    let bounded = late.is_nan() || early.is_nan() || late <= early;
    println!(
        "  transactional ids: at most {early:.0} until {first_end:.0} s, at most {late:.0} after (the pool: {} subtask(s) × {POOL} = {pool:.0}; the sink adds ids while every producer of its pool waits){}: {}",
        o.parallelism,
        if unlisted > 0 { format!("; {unlisted} samples could not list them") } else { String::new() },
        if early.is_nan() { "not measured" } else if bounded { "no new ids" } else { "MORE IDS" }
    );
    if !bounded {
        unmet.push(format!(
            "the broker knew {late:.0} transactional ids of the job after {first_end:.0} s, {early:.0} before"
        ));
    }
    let dirs = samples
        .iter()
        .map(|s| s.checkpoint_dirs)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let kb = samples
        .iter()
        .map(|s| s.checkpoint_dir_kb)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    println!(
        "  checkpoint directory: at most {dirs:.0} chk-N directories (one retained, one being written) and {kb:.1} kB: {}",
        if dirs <= 2.0 { "bounded by retention" } else { "MORE THAN RETENTION KEEPS" }
    );
    if dirs > 2.0 {
        unmet.push(format!(
            "the checkpoint directory held {dirs:.0} checkpoints, one retained"
        ));
    }
    let mut bounds = vec![
        ("checkpoint_dirs_max", dirs),
        ("checkpoint_dir_kb_max", kb),
        ("pool", pool),
    ];
    if !early.is_nan() {
        bounds.push(("transactional_ids_early_max", early));
    }
    if !late.is_nan() {
        bounds.push(("transactional_ids_late_max", late));
    }
    report.row("soak", "bounds", &bounds);
    if let Some(json) = o.charts {
        match charts(json, samples) {
            Ok(paths) => paths.iter().for_each(|p| println!("chart: {}", p.display())),
            Err(e) => eprintln!("the charts could not be written: {e:#}"),
        }
    }
    unmet
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
