//! Measures what checkpointing costs: the same chained, keyed job (generate -> map -> filter ->
//! key_by -> running count -> sink) runs with exactly-once checkpoints every 100 ms and with
//! checkpointing off, alternating, in one process. Prints records/s of both, the ratio, and the
//! p50/p99 checkpoint duration.
//!
//! `exactly bench core [--records N] [--rounds R]`
//!
//! [`storage`] runs the same job with RocksDB state and checkpoints every second in a local
//! directory and in an object store (`exactly bench storage --checkpoints s3://bucket/prefix`),
//! alternating: records/s and checkpoint durations of both.

use std::time::{Duration, Instant};

use super::{median, Report};

use exactly_core::coordinator::CheckpointConfig;
use exactly_core::runtime::{
    CheckpointListener, CheckpointedFunction, Collector, InitContext, JobBuilder, JobConfig, KeyedProcessFunction,
    Sink, SnapshotContext, Source, SourceStatus, StateBackendConfig,
};
use exactly_core::state::{KeyedContext, ValueState};

struct Gen {
    next: u64,
    step: u64,
    total: u64,
}

impl Source<u64> for Gen {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        if let Some(p) = ctx.list_state("pos").first() {
            self.next = u64::from_be_bytes(p.as_slice().try_into().expect("8 bytes"));
        }
        Ok(())
    }
    async fn poll_next(&mut self, out: &mut Vec<u64>) -> exactly_core::Result<SourceStatus> {
        if self.next >= self.total {
            return Ok(SourceStatus::End);
        }
        while out.len() < 1024 && self.next < self.total {
            out.push(self.next);
            self.next += self.step;
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
impl KeyedProcessFunction<(u64, u64), u64> for Count {
    fn process(
        &mut self,
        r: (u64, u64),
        s: &mut KeyedContext<'_>,
        out: &mut Collector<'_, u64>,
    ) -> exactly_core::Result<()> {
        let n = self.0.get(s)?.unwrap_or(0) + r.1;
        self.0.set(s, &n)?;
        out.emit(n)
    }
}

struct Discard(u64);
impl Sink<u64> for Discard {
    async fn write(&mut self, records: Vec<u64>) -> exactly_core::Result<()> {
        self.0 += records.len() as u64;
        Ok(())
    }
}

/// Runs the job once: checkpoints every `interval` into `checkpoints` (none: off), state in
/// `backend`. Returns records/s and the checkpoint durations.
async fn run(
    records: u64,
    checkpoints: Option<(&std::path::Path, Duration)>,
    backend: StateBackendConfig,
) -> (f64, Vec<Duration>) {
    let mut config = JobConfig::new("bench");
    config.state_backend = backend;
    if let Some((dir, interval)) = checkpoints {
        let mut c = CheckpointConfig::new(dir);
        c.interval = interval;
        config.checkpointing = Some(c);
    }
    let mut job = JobBuilder::new(config);
    job.source("gen", 2, move |i| Gen {
        next: u64::from(i.index),
        step: u64::from(i.parallelism),
        total: records,
    })
    .map(|n| (n % 10_000, 1u64))
    .filter(|(k, _)| k % 7 != 3)
    .key_by(|(k, _)| k.to_be_bytes().to_vec())
    .process("count", 2, |_| Count(ValueState::new("n")))
    .sink("out", |_| Discard(0));
    let job = job.build().expect("valid job");
    let start = Instant::now();
    let handle = job.start();
    let metrics = handle.metrics();
    handle.join().await.expect("job succeeds");
    let secs = start.elapsed().as_secs_f64();
    (records as f64 / secs, metrics.checkpoints().durations)
}

fn quantile(d: &mut [Duration], q: f64) -> Duration {
    d.sort_unstable();
    d.get(((d.len().saturating_sub(1)) as f64 * q).round() as usize)
        .copied()
        .unwrap_or_default()
}

/// Runs the comparison `rounds` times with `records` records each.
pub(crate) async fn overhead(records: u64, rounds: usize, report: &mut Report) -> anyhow::Result<()> {
    let rounds = rounds.max(1);
    let dir = tempfile::tempdir()?;
    let mut with = Vec::new();
    let mut without = Vec::new();
    let mut durations = Vec::new();
    for round in 0..rounds {
        let (r, _) = run(records, None, StateBackendConfig::Memory).await;
        without.push(r);
        let at = dir.path().join(format!("round-{round}"));
        let (r, d) = run(
            records,
            Some((at.as_path(), Duration::from_millis(100))),
            StateBackendConfig::Memory,
        )
        .await;
        with.push(r);
        durations.extend(d);
        eprintln!(
            "round {}: off {:.0} rec/s, on {:.0} rec/s",
            round + 1,
            without[round],
            with[round]
        );
    }
    let (on, off) = (median(with), median(without));
    println!("records per run:            {records}");
    println!("checkpointing off:          {off:>12.0} records/s (median of {rounds})");
    println!("checkpoints every 100 ms:   {on:>12.0} records/s (median of {rounds})");
    println!("ratio on/off:               {:>12.3}", on / off);
    println!("checkpoints completed:      {:>12}", durations.len());
    println!("checkpoint duration p50:    {:>12.2?}", quantile(&mut durations, 0.5));
    println!("checkpoint duration p99:    {:>12.2?}", quantile(&mut durations, 0.99));
    report.row(
        "core",
        "checkpoints every 100 ms vs off",
        &[
            ("off_records_per_s", off),
            ("on_records_per_s", on),
            ("ratio", on / off),
            ("checkpoints", durations.len() as f64),
            ("p50_ms", quantile(&mut durations, 0.5).as_secs_f64() * 1000.0),
            ("p99_ms", quantile(&mut durations, 0.99).as_secs_f64() * 1000.0),
        ],
    );
    Ok(())
}

/// Checkpoints in a local directory vs in the object store at `url` (RocksDB state, incremental
/// checkpoints every second), `rounds` interleaved rounds of `records` records.
pub(crate) async fn storage(records: u64, rounds: usize, url: &str, report: &mut Report) -> anyhow::Result<()> {
    let rounds = rounds.max(1);
    let dir = tempfile::tempdir()?;
    let rocks = || StateBackendConfig::RocksDb {
        local_dir: Some(dir.path().join("rocksdb")),
        memory_mb: None,
    };
    let interval = Duration::from_secs(1);
    let (mut local, mut remote) = (Vec::new(), Vec::new());
    let (mut local_d, mut remote_d) = (Vec::new(), Vec::new());
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    for round in 0..rounds {
        let at = dir.path().join(format!("round-{round}"));
        let (r, d) = run(records, Some((at.as_path(), interval)), rocks()).await;
        local.push(r);
        local_d.extend(d);
        let at = std::path::PathBuf::from(format!("{}/bench-{stamp}/round-{round}", url.trim_end_matches('/')));
        let (r, d) = run(records, Some((at.as_path(), interval)), rocks()).await;
        remote.push(r);
        remote_d.extend(d);
        eprintln!(
            "round {}: local {:.0} rec/s, object store {:.0} rec/s",
            round + 1,
            local[round],
            remote[round]
        );
    }
    let (l, r) = (median(local), median(remote));
    println!("records per run:              {records} (RocksDB state, checkpoints every 1 s)");
    println!("local directory:              {l:>12.0} records/s (median of {rounds})");
    println!("object store ({url}): {r:>12.0} records/s");
    println!("ratio object store/local:     {:>12.3}", r / l);
    for (name, d) in [("local", &mut local_d), ("object store", &mut remote_d)] {
        println!(
            "{name:<13} checkpoints {:>4}, duration p50 {:>10.2?}, p99 {:>10.2?}",
            d.len(),
            quantile(d, 0.5),
            quantile(d, 0.99)
        );
    }
    report.row(
        "storage",
        "checkpoints in an object store vs a local directory",
        &[
            ("local_records_per_s", l),
            ("object_store_records_per_s", r),
            ("ratio", r / l),
            ("local_p50_ms", quantile(&mut local_d, 0.5).as_secs_f64() * 1000.0),
            ("local_p99_ms", quantile(&mut local_d, 0.99).as_secs_f64() * 1000.0),
            (
                "object_store_p50_ms",
                quantile(&mut remote_d, 0.5).as_secs_f64() * 1000.0,
            ),
            (
                "object_store_p99_ms",
                quantile(&mut remote_d, 0.99).as_secs_f64() * 1000.0,
            ),
        ],
    );
    Ok(())
}
