//! `exactly bench state`: how keyed state's cost grows with the number of keys. The keyed
//! running count of `bench core` (a source → key_by → a count per key in RocksDB state → a sink),
//! with the Kafka ends left out so that what is measured is the state: per key count, one process
//! first writes every key once, then updates keys chosen uniformly at a steady rate with
//! checkpoints every interval (each checkpoint's duration and the bytes it wrote to checkpoint
//! storage: incremental snapshots should write what changed, not the state), and a second process
//! restores the latest checkpoint and reads a sample of keys back (the time from the job's start
//! to the first counted record: the restore; the counts must be what the first process left).
//! Peak and sampled resident memory of both.
//!
//! Each key count runs in child processes of its own (`exactly bench state-child`), so one
//! count's memory does not carry into the next.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::{median, Report};
use exactly_core::coordinator::CheckpointConfig;
use exactly_core::runtime::{
    CheckpointListener, CheckpointedFunction, Collector, InitContext, JobBuilder, JobConfig, KeyedProcessFunction,
    Sink, SnapshotContext, Source, SourceStatus, StateBackendConfig,
};
use exactly_core::state::{KeyedContext, ValueState};

/// Settings of `bench state`.
pub(crate) struct StateOptions<'a> {
    pub(crate) keys: &'a [u64],
    /// Updates in the steady phase, and their rate (records/s).
    pub(crate) updates: u64,
    pub(crate) rate: u64,
    pub(crate) interval: Duration,
    /// `s3://…` (or any location `exactly run` takes); a temporary local directory if `None`.
    pub(crate) checkpoints: Option<&'a str>,
    /// RocksDB's memory (MiB; the job's default if `None`).
    pub(crate) memory_mb: Option<u64>,
    pub(crate) charts: Option<&'a Path>,
}

/// Which half of a key count a child runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatePhase {
    /// Write every key, then update at the steady rate, checkpointing.
    Load,
    /// Restore the latest checkpoint and read the sample keys back.
    Restore,
}

/// What a child reports (one JSON line on stdout after `RESULT `).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ChildResult {
    /// Load: records/s while every key was first written.
    load_rate: f64,
    /// Steady-phase checkpoints: durations (ms) and bytes written.
    durations_ms: Vec<f64>,
    written: Vec<u64>,
    /// Steady-phase records per checkpoint interval actually reached (records/s).
    steady_rate: f64,
    /// State size of the latest checkpoint (bytes).
    state_bytes: u64,
    /// Resident memory: highest sample in the steady phase, and the process's peak (MiB).
    rss_steady_mb: f64,
    rss_peak_mb: f64,
    /// Restore: job start to the first counted record (ms), and the whole job (ms).
    restore_ms: f64,
    restore_job_ms: f64,
    /// Restore: sample keys read back, and how many had the count the first process left.
    probed: u64,
    matched: u64,
    /// Restore: the source position the restored checkpoint held.
    restored_pos: u64,
}

/// SplitMix64: the steady phase's key of record `i` (uniform, the same in both processes).
fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of record `i`: every key once in order, then uniformly chosen ones.
fn key_of(i: u64, keys: u64) -> u64 {
    if i < keys {
        i
    } else {
        mix(i) % keys
    }
}

/// The sample keys the restore reads back.
fn probes(keys: u64) -> Vec<u64> {
    (0..1000u64.min(keys))
        .map(|j| mix(j ^ 0x5eed) % keys)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[derive(Default)]
struct Shared {
    /// ms since the child's start when the steady phase began (0: not yet).
    steady_at: AtomicU64,
    /// The position the restore's source resumed from.
    restored_pos: AtomicU64,
    /// When each sink subtask had its first record after the restore.
    first_output: Mutex<std::collections::BTreeMap<u32, Instant>>,
    probed: Mutex<Vec<(u64, u64)>>,
    /// The ordinal of the first completed checkpoint of the steady phase (0: not yet).
    first_steady: AtomicU64,
    /// The highest resident memory sampled in the steady phase (f64 bits, MiB).
    rss_steady: AtomicU64,
}

struct KeyGen {
    next: u64,
    keys: u64,
    end: u64,
    rate: u64,
    steady: Option<(Instant, u64)>,
    probe: Option<Vec<u64>>,
    shared: Arc<Shared>,
    start: Instant,
}

impl Source<(u64, u64)> for KeyGen {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        if let Some(p) = ctx.list_state("pos").first() {
            self.next = u64::from_be_bytes(p.as_slice().try_into().expect("8 bytes"));
        }
        self.shared.restored_pos.store(self.next, Ordering::SeqCst);
        Ok(())
    }

    async fn poll_next(&mut self, out: &mut Vec<(u64, u64)>) -> exactly_core::Result<SourceStatus> {
        if let Some(keys) = self.probe.take() {
            out.extend(keys.into_iter().map(|k| (k, 0)));
            // Nothing after the sample: the restored counts are read, not changed.
            self.end = self.next;
            return Ok(SourceStatus::More);
        }
        if self.next >= self.end {
            return Ok(SourceStatus::End);
        }
        let mut limit = self.end;
        if self.next >= self.keys {
            let (at, from) = *self.steady.get_or_insert_with(|| {
                self.shared
                    .steady_at
                    .store(self.start.elapsed().as_millis().max(1) as u64, Ordering::SeqCst);
                (Instant::now(), self.next)
            });
            let due = from + (at.elapsed().as_secs_f64() * self.rate as f64) as u64;
            if due <= self.next {
                tokio::time::sleep(Duration::from_millis(5)).await;
                return Ok(SourceStatus::More);
            }
            limit = limit.min(due);
        } else {
            limit = limit.min(self.keys);
        }
        while out.len() < 1024 && self.next < limit {
            out.push((key_of(self.next, self.keys), 1));
            self.next += 1;
        }
        Ok(SourceStatus::More)
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        ctx.put_list_state("pos", vec![self.next.to_be_bytes().to_vec()]);
        Ok(())
    }
}

struct Count(ValueState<u64>);
impl CheckpointedFunction for Count {}
impl CheckpointListener for Count {}
impl KeyedProcessFunction<(u64, u64), (u64, u64)> for Count {
    fn process(
        &mut self,
        r: (u64, u64),
        s: &mut KeyedContext<'_>,
        out: &mut Collector<'_, (u64, u64)>,
    ) -> exactly_core::Result<()> {
        let n = self.0.get(s)?.unwrap_or(0) + r.1;
        self.0.set(s, &n)?;
        out.emit((r.0, n))
    }
}

struct Probe {
    shared: Arc<Shared>,
    keep: bool,
    index: u32,
}
impl Sink<(u64, u64)> for Probe {
    async fn write(&mut self, records: Vec<(u64, u64)>) -> exactly_core::Result<()> {
        if self.keep && !records.is_empty() {
            self.shared
                .first_output
                .lock()
                .expect("not poisoned")
                .entry(self.index)
                .or_insert_with(Instant::now);
            self.shared.probed.lock().expect("not poisoned").extend(records);
        }
        Ok(())
    }
}

/// Resident memory of this process now and at its peak (MiB).
fn rss_mb() -> (f64, f64) {
    let mib = |field| super::peers::status_kb(std::process::id(), field).unwrap_or(0) as f64 / 1024.0;
    (mib("VmRSS:"), mib("VmHWM:"))
}

/// A child: `phase` of `keys` keys with checkpoints in `location`. Prints `RESULT {json}`.
pub(crate) async fn child(
    phase: StatePhase,
    keys: u64,
    updates: u64,
    rate: u64,
    interval: Duration,
    location: &str,
    memory_mb: Option<u64>,
) -> Result<()> {
    let start = Instant::now();
    let shared = Arc::new(Shared::default());
    let mut config = JobConfig::new("bench-state");
    config.state_backend = StateBackendConfig::RocksDb {
        local_dir: None,
        memory_mb,
    };
    let mut c = CheckpointConfig::new(location);
    c.interval = interval;
    config.checkpointing = Some(c);
    let restore = phase == StatePhase::Restore;
    let mut job = JobBuilder::new(config);
    let (s1, s2) = (shared.clone(), shared.clone());
    job.source("gen", 1, move |_| KeyGen {
        next: 0,
        keys,
        end: keys + updates,
        rate: rate.max(1),
        steady: None,
        probe: restore.then(|| probes(keys)),
        shared: s1.clone(),
        start,
    })
    .key_by(|(k, _)| k.to_be_bytes().to_vec())
    .process("count", 2, |_| Count(ValueState::new("n")))
    .sink("out", move |info| Probe {
        shared: s2.clone(),
        keep: restore,
        index: info.index,
    });
    let job = job.build().context("building the job")?;
    let job_start = Instant::now();
    let handle = job.start();
    let metrics = handle.metrics();
    // Samples resident memory and notes where the steady phase's checkpoints begin.
    let (sampler_shared, sampler_metrics) = (shared.clone(), metrics.clone());
    let sampler = tokio::spawn(async move {
        let s = sampler_shared;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if s.steady_at.load(Ordering::SeqCst) > 0 {
                // Left out: the checkpoint under way when the phase began was seen, and the one
                // after it (its barrier may follow the last loaded keys by up to an interval).
                if s.first_steady.load(Ordering::SeqCst) == 0 {
                    s.first_steady
                        .store(sampler_metrics.checkpoints().completed + 3, Ordering::SeqCst);
                }
                let high = f64::from_bits(s.rss_steady.load(Ordering::SeqCst)).max(rss_mb().0);
                s.rss_steady.store(high.to_bits(), Ordering::SeqCst);
            }
        }
    });
    handle.join().await.context("the job failed")?;
    let job_ms = job_start.elapsed().as_secs_f64() * 1000.0;
    sampler.abort();
    let stats = metrics.checkpoints();
    let mut result = ChildResult {
        state_bytes: stats.last_state_size,
        rss_peak_mb: rss_mb().1,
        ..ChildResult::default()
    };
    match phase {
        StatePhase::Load => {
            let steady_at = shared.steady_at.load(Ordering::SeqCst) as f64;
            result.load_rate = keys as f64 / (steady_at / 1000.0).max(1e-3);
            result.rss_steady_mb = f64::from_bits(shared.rss_steady.load(Ordering::SeqCst));
            // Checkpoints first_steady..=completed; `durations` and `written` keep the most
            // recent 10 000, so they are counted from the end.
            let first = shared.first_steady.load(Ordering::SeqCst);
            let steady = if first == 0 {
                0
            } else {
                (stats.completed + 1).saturating_sub(first) as usize
            };
            let skip = stats.durations.len().saturating_sub(steady);
            result.durations_ms = stats.durations[skip..]
                .iter()
                .map(|d| d.as_secs_f64() * 1000.0)
                .collect();
            result.written = stats.written[skip..].to_vec();
            let steady_secs = (start.elapsed().as_secs_f64() - steady_at / 1000.0).max(1e-3);
            result.steady_rate = updates as f64 / steady_secs;
        }
        StatePhase::Restore => {
            // The restore is done when every subtask counted (the slowest one's first record).
            let last = shared
                .first_output
                .lock()
                .expect("not poisoned")
                .values()
                .max()
                .copied();
            result.restore_ms = last.map_or(f64::NAN, |t| (t - job_start).as_secs_f64() * 1000.0);
            result.restored_pos = shared.restored_pos.load(Ordering::SeqCst);
            result.restore_job_ms = job_ms;
            let pos = shared.restored_pos.load(Ordering::SeqCst);
            let probed = shared.probed.lock().expect("not poisoned").clone();
            // What the first process left: each sample key's updates among records 0..pos.
            let mut expected: std::collections::HashMap<u64, u64> = probed.iter().map(|(k, _)| (*k, 0)).collect();
            for i in 0..pos {
                if let Some(n) = expected.get_mut(&key_of(i, keys)) {
                    *n += 1;
                }
            }
            result.probed = probed.len() as u64;
            result.matched = probed.iter().filter(|(k, n)| expected.get(k) == Some(n)).count() as u64;
        }
    }
    println!("RESULT {}", serde_json::to_string(&result)?);
    Ok(())
}

fn run_child(args: &[String], log: &Path) -> Result<(ChildResult, Duration)> {
    let exe = std::env::current_exe().context("finding this program")?;
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let started = Instant::now();
    let out = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(file))
        .output()
        .context("running exactly bench state-child")?;
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(line) = stdout.lines().find_map(|l| l.strip_prefix("RESULT ")) else {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        bail!(
            "bench state-child {} ended ({}) without a result:\n{}",
            args.join(" "),
            out.status,
            tail.join("\n")
        );
    };
    Ok((serde_json::from_str(line)?, took))
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len().saturating_sub(1)) as f64 * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

pub(crate) async fn bench_state(o: &StateOptions<'_>, report: &mut Report) -> Result<()> {
    if o.keys.is_empty() || o.keys.contains(&0) {
        bail!("bench state needs key counts of at least 1 (--keys)");
    }
    if o.updates == 0 || o.rate == 0 {
        bail!("bench state needs a steady phase: --records (updates) and --rate of at least 1");
    }
    let tmp = tempfile::tempdir()?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let where_ = o.checkpoints.unwrap_or("a local directory");
    let memory = o.memory_mb.unwrap_or(exactly_core::state::DEFAULT_ROCKSDB_MEMORY_MB);
    println!(
        "Keyed state (RocksDB, {memory} MiB of memory, parallelism 2) as the keys grow: each key written once, then {} updates of uniformly chosen keys at {} records/s, checkpoints every {} in {where_}; then a new process restores the latest checkpoint and reads up to 1000 keys back{}",
        o.updates,
        o.rate,
        humantime::format_duration(o.interval),
        if o.checkpoints.is_some() { " (the checkpoints are left in the store, under bench-state-<time>/)" } else { "" },
    );
    println!("load: records/s writing every key once; ckpt p50/p99/max: steady-phase checkpoint durations; written: MB a steady-phase checkpoint wrote to checkpoint storage (median, max); B/update: all they wrote ÷ the updates; state: MB of the latest checkpoint; RSS: highest sample in the steady phase and the peak of the process (MiB); restore: job start until every subtask counted its first record after the restore (s), its peak RSS, the sample keys whose counts match");
    println!(
        "{:>10} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>9} {:>8} {:>9}",
        "keys",
        "load r/s",
        "ckpt p50",
        "ckpt p99",
        "ckpt max",
        "written",
        "wr max",
        "B/update",
        "state MB",
        "RSS",
        "RSS pk",
        "restore s",
        "rst RSS",
        "matched"
    );
    let mut curve = Vec::new();
    for &keys in o.keys {
        let location = match o.checkpoints {
            Some(url) => format!("{}/bench-state-{stamp}/keys-{keys}", url.trim_end_matches('/')),
            None => tmp.path().join(format!("keys-{keys}")).to_string_lossy().into_owned(),
        };
        let args = |phase: &str| -> Vec<String> {
            let mut args: Vec<String> = [
                "bench",
                "state-child",
                "--state-phase",
                phase,
                "--keys",
                &keys.to_string(),
                "--records",
                &o.updates.to_string(),
                "--rate",
                &o.rate.to_string(),
                "--intervals",
                &humantime::format_duration(o.interval).to_string(),
                "--checkpoints",
                &location,
            ]
            .map(str::to_owned)
            .to_vec();
            if let Some(mb) = o.memory_mb {
                args.extend(["--rocksdb-memory-mb".to_owned(), mb.to_string()]);
            }
            args
        };
        let (load, _) = run_child(&args("load"), &tmp.path().join(format!("load-{keys}.log")))?;
        let (restore, _) = run_child(&args("restore"), &tmp.path().join(format!("restore-{keys}.log")))?;
        if o.checkpoints.is_none() {
            let _ = std::fs::remove_dir_all(&location);
        }
        let written_mb: Vec<f64> = load.written.iter().map(|b| *b as f64 / 1e6).collect();
        if load.written.is_empty() {
            bail!("{keys} keys: no checkpoint completed in the steady phase; give it more updates (--records) or a shorter --intervals");
        }
        // Everything the steady phase's checkpoints wrote (compactions' output included) ÷ the
        // updates: what an update costs in checkpoint storage, whatever the checkpoints' spacing.
        let per_update = load.written.iter().sum::<u64>() as f64 / o.updates as f64;
        let row = [
            ("keys", keys as f64),
            ("load_records_per_s", load.load_rate),
            ("checkpoints", load.durations_ms.len() as f64),
            ("checkpoint_ms_p50", quantile(&load.durations_ms, 0.5)),
            ("checkpoint_ms_p99", quantile(&load.durations_ms, 0.99)),
            ("checkpoint_ms_max", quantile(&load.durations_ms, 1.0)),
            ("written_mb_p50", median(written_mb.clone())),
            ("written_mb_max", quantile(&written_mb, 1.0)),
            ("written_bytes_per_update", per_update),
            ("steady_records_per_s", load.steady_rate),
            ("state_mb", load.state_bytes as f64 / 1e6),
            ("rss_steady_mb", load.rss_steady_mb),
            ("rss_peak_mb", load.rss_peak_mb),
            ("restore_s", restore.restore_ms / 1000.0),
            ("restore_job_s", restore.restore_job_ms / 1000.0),
            ("restore_rss_peak_mb", restore.rss_peak_mb),
            ("probed", restore.probed as f64),
            ("matched", restore.matched as f64),
        ];
        let f = |name: &str| row.iter().find(|(n, _)| *n == name).map_or(f64::NAN, |(_, v)| *v);
        println!(
            "{:>10} {:>9.0} {:>8.0} {:>8.0} {:>8.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.0} {:>8.0} {:>9.1} {:>8.0} {:>4}/{:<4}",
            keys,
            f("load_records_per_s"),
            f("checkpoint_ms_p50"),
            f("checkpoint_ms_p99"),
            f("checkpoint_ms_max"),
            f("written_mb_p50"),
            f("written_mb_max"),
            f("written_bytes_per_update"),
            f("state_mb"),
            f("rss_steady_mb"),
            f("rss_peak_mb"),
            f("restore_s"),
            f("restore_rss_peak_mb"),
            restore.matched,
            restore.probed
        );
        report.row("state", &format!("{keys} keys"), &row);
        let sample = probes(keys).len() as u64;
        if restore.restored_pos != keys + o.updates || restore.probed != sample || restore.matched != sample {
            bail!(
                "the restore of {keys} keys resumed at record {} of {} and read back {} of {sample} sample keys, {} with the count the first process left",
                restore.restored_pos,
                keys + o.updates,
                restore.probed,
                restore.matched
            );
        }
        curve.push(row.map(|(n, v)| (n, v)));
    }
    if let Some(json) = o.charts {
        for path in charts(json, where_, &curve)? {
            println!("chart: {}", path.display());
        }
    }
    Ok(())
}

/// The curves as SVG charts next to `json`: `<stem>-<figure>.svg`.
fn charts(json: &Path, location: &str, curve: &[[(&str, f64); 18]]) -> Result<Vec<PathBuf>> {
    let stem = json.file_stem().and_then(|s| s.to_str()).unwrap_or("bench");
    let dir = json.parent().unwrap_or(Path::new("."));
    let xs = |name: &str| -> Vec<(f64, f64)> {
        curve
            .iter()
            .map(|row| {
                let v = |n: &str| row.iter().find(|(k, _)| *k == n).map_or(f64::NAN, |(_, v)| *v);
                (v("keys"), v(name))
            })
            .collect()
    };
    let title = format!("Keyed state (RocksDB), checkpoints in {location}");
    let mut written = Vec::new();
    let mut chart = |name: &str, y: &str, series: Vec<(&str, Vec<(f64, f64)>)>| -> Result<()> {
        let path = dir.join(format!("{stem}-{name}.svg"));
        super::chart::lines(&path, &title, "keys", y, &series)?;
        written.push(path);
        Ok(())
    };
    chart(
        "checkpoint",
        "steady-phase checkpoint duration (ms)",
        vec![("p50", xs("checkpoint_ms_p50")), ("p99", xs("checkpoint_ms_p99"))],
    )?;
    chart(
        "written",
        "MB written per checkpoint",
        vec![("median", xs("written_mb_p50")), ("state", xs("state_mb"))],
    )?;
    chart(
        "restore",
        "restore (s)",
        vec![("job start to first record", xs("restore_s"))],
    )?;
    chart(
        "rss",
        "resident memory (MiB)",
        vec![
            ("steady phase", xs("rss_steady_mb")),
            ("peak", xs("rss_peak_mb")),
            ("restore peak", xs("restore_rss_peak_mb")),
        ],
    )?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_written_once_before_the_updates_and_the_updates_stay_in_range() {
        let keys = 1000;
        let first: Vec<u64> = (0..keys).map(|i| key_of(i, keys)).collect();
        assert_eq!(first, (0..keys).collect::<Vec<_>>());
        let updates: Vec<u64> = (keys..keys + 10_000).map(|i| key_of(i, keys)).collect();
        assert!(updates.iter().all(|k| *k < keys));
        // Uniform enough that most keys are updated.
        let distinct: std::collections::BTreeSet<_> = updates.iter().collect();
        assert!(distinct.len() > 990, "{}", distinct.len());
        let p = probes(keys);
        assert!(p.len() > 500 && p.iter().all(|k| *k < keys));
    }
}
