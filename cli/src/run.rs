//! `exactly run`: builds the job a job file describes, runs it with signal handling, the admin
//! endpoint and the progress line, and reports how it ended.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use exactly_core::runtime::{JobBuilder, JobConfig, JobControl, JobOutcome, Stream, SubtaskRange};
use exactly_core::storage::Storage;
use exactly_core::{BoxError, CoreError, ErrorClass};
use exactly_kafka_sink::KafkaSink;
use exactly_kafka_source::{Deserializer, KafkaRecord, KafkaSource};
use exactly_mysql_sink::MysqlSink;
use exactly_postgres_sink::PostgresSink;
use serde_json::Value;
use tracing::{info, warn};

use crate::admin;
use crate::jobfile::{Change, Job, JobSink, SinkKind, Transform};
use crate::metrics::Registry;
use crate::records;

/// Flags of `exactly run` that override the job file.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Start from this savepoint or checkpoint directory.
    pub from: Option<PathBuf>,
    /// Restore `from` even if newer checkpoints exist (acknowledges possible duplicates).
    pub accept_replay: bool,
    /// Run only these subtasks (scale-out over processes).
    pub subtasks: Option<SubtaskRange>,
    /// Parallelism (overrides `job.parallelism`).
    pub parallelism: Option<u32>,
    /// Admin endpoint address (overrides `job.admin`).
    pub admin: Option<String>,
    /// Draw a progress line on the terminal.
    pub progress: bool,
}

/// Parses "I..J" (inclusive) or "I".
pub fn parse_subtasks(s: &str) -> Result<SubtaskRange, String> {
    let bad = || format!("{s:?} is not a subtask range: expected FIRST..LAST (inclusive), e.g. 0..2, or one index");
    let (a, b) = match s.split_once("..") {
        Some((a, b)) => (a, b.strip_prefix('=').unwrap_or(b)),
        None => (s, s),
    };
    let first: u32 = a.trim().parse().map_err(|_| bad())?;
    let last: u32 = b.trim().parse().map_err(|_| bad())?;
    if first > last {
        return Err(format!("{s:?}: the first subtask must not be after the last"));
    }
    Ok(SubtaskRange { first, last })
}

/// Applies the transforms while deserializing, so that a record that is not JSON follows the
/// source's poison-record policy (fail, skip, dead-letter). `None`: filtered out.
struct Prepare {
    transforms: Arc<Vec<Transform>>,
    /// Values must be JSON even without transforms here (a sink has transforms of its own).
    json: bool,
    registry: Arc<Registry>,
}

impl Deserializer<Option<KafkaRecord>> for Prepare {
    fn deserialize(&self, r: KafkaRecord) -> Result<Option<KafkaRecord>, BoxError> {
        let mut key = r.key;
        // A tombstone (no value) is a deletion of its key, not a JSON `null`: it passes the
        // transforms untouched, keeps its key, and each sink applies it as a deletion (Kafka: a
        // tombstone; MySQL upsert: DELETE by key; MySQL xa: its bad-record policy).
        // A Kafka tombstone in a Debezium topic (after a delete, or alone where compaction removed
        // the delete): a deletion of its key, the key unwrapped as the delete's is (deleting a
        // row twice leaves it deleted).
        if r.value.is_none() && self.transforms.iter().any(|t| matches!(t, Transform::Debezium)) {
            return Ok(Some(KafkaRecord {
                key: crate::jobfile::debezium_key(key),
                ..r
            }));
        }
        let value = if (self.transforms.is_empty() && !self.json) || r.value.is_none() {
            r.value
        } else if self.transforms.is_empty() {
            serde_json::from_slice::<serde::de::IgnoredAny>(r.value.as_deref().unwrap_or_default())
                .map_err(|e| format!("value is not JSON: {e}"))?;
            r.value
        } else {
            let bytes = r.value.as_deref().unwrap_or_default();
            let mut v: Value = serde_json::from_slice(bytes).map_err(|e| format!("value is not JSON: {e}"))?;
            let mut deleted = false;
            for t in self.transforms.iter() {
                match t.apply(&mut v, &mut key)? {
                    Change::Keep => {}
                    Change::Drop => {
                        self.registry.records_filtered.fetch_add(1, Ordering::Relaxed);
                        return Ok(None);
                    }
                    Change::Delete => {
                        deleted = true;
                        break;
                    }
                }
            }
            if deleted {
                None
            } else {
                Some(serde_json::to_vec(&v)?)
            }
        };
        Ok(Some(KafkaRecord { key, value, ..r }))
    }
}

/// The note in a checkpoint directory naming the savepoint its layout started from (none: the
/// job's first start).
const GENERATION: &str = "_restored_from";

/// Where a process keeps its checkpoints: the configured directory, or under it a directory per
/// subtask range. Refuses a range that overlaps another range's checkpoints (their state would
/// be missing here and partitions would be read again).
///
/// Layouts have generations: a start with `--from SAVEPOINT` begins a new one (noted in the
/// directory as `_restored_from`), and directories of an older generation — the layout the
/// savepoint was taken from — are stale and ignored: a job of 6 subtasks over 3 processes,
/// stopped with a savepoint, continues as 4 over 2 or as 1 process. (A range's own directory that
/// holds older checkpoints is the restore plan's business: it restores the savepoint, and refuses
/// when a checkpoint there is newer unless replay is accepted.)
pub fn checkpoint_dir(
    base: &Path,
    subtasks: Option<SubtaskRange>,
    parallelism: u32,
    from: Option<&Path>,
) -> Result<PathBuf> {
    let list = |dir: &Path| Storage::list_dirs(dir).with_context(|| format!("listing {}", dir.display()));
    let generation = |dir: &Path| -> Result<String> {
        Ok(Storage::read_note(dir, GENERATION)
            .with_context(|| format!("reading {}", dir.display()))?
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default())
    };
    let mine_name = subtasks.map(|r| format!("subtasks-{}-{}-of-{parallelism}", r.first, r.last));
    let mine = mine_name.as_ref().map_or_else(|| base.to_owned(), |n| base.join(n));
    let current = match from {
        Some(f) => f.display().to_string(),
        None => generation(&mine)?,
    };
    let names = list(base)?;
    let mut others = Vec::new();
    for name in &names {
        if Some(name) == mine_name.as_ref() {
            continue;
        }
        if let Some(rest) = name.strip_prefix("subtasks-") {
            // Another layout's generation: stale, superseded by the savepoint this one started from.
            if generation(&base.join(name))? == current {
                others.push((name.clone(), rest.to_owned()));
            }
        }
    }
    let whole_job = mine_name.is_some() && names.iter().any(|n| n.starts_with("chk-")) && generation(base)? == current;
    let Some(r) = subtasks else {
        if !others.is_empty() {
            bail!(
                "{} holds checkpoints of a job split over processes ({}): run each range with --subtasks, or restore one with --from",
                base.display(),
                others.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
            );
        }
        if from.is_some() {
            Storage::write_note(base, GENERATION, current.as_bytes())?;
        }
        return Ok(base.to_owned());
    };
    if whole_job {
        bail!(
            "{} holds checkpoints of the whole job: a range of subtasks cannot continue from them (restore with --from a savepoint of a job with the same subtasks)",
            base.display()
        );
    }
    for (name, rest) in &others {
        let parsed = rest.split_once("-of-").and_then(|(range, p)| {
            let (a, b) = range.split_once('-')?;
            Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?, p.parse::<u32>().ok()?))
        });
        match parsed {
            Some((a, b, p)) if p == parallelism && (b < r.first || a > r.last) => {}
            Some((_, _, p)) if p != parallelism => bail!(
                "{} holds checkpoints of the same job with parallelism {p} ({name}); this process runs parallelism {parallelism}: changing it needs a savepoint of every range (stop each with a savepoint into one directory, then start every new range with --from that directory)",
                base.display()
            ),
            _ => bail!(
                "{} holds checkpoints of subtasks overlapping {}..{} ({name}): give every process its own, disjoint range",
                base.display(),
                r.first,
                r.last
            ),
        }
    }
    if from.is_some() {
        Storage::write_note(&mine, GENERATION, current.as_bytes())?;
    }
    Ok(mine)
}

/// Runs `f` until it succeeds or fails otherwise than with storage that does not answer
/// ([`CoreError::is_unavailable`]: the checkpoint store is down, not misconfigured), trying again
/// every [`exactly_core::restart::WAIT_CADENCE`] and saying so in the log.
async fn wait_while_unavailable<T>(what: &str, mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let since = Instant::now();
    loop {
        match f() {
            Err(e)
                if e.chain()
                    .any(|c| c.downcast_ref::<CoreError>().is_some_and(CoreError::is_unavailable)) =>
            {
                warn!(
                    waiting_s = since.elapsed().as_secs(),
                    delay_ms = exactly_core::restart::WAIT_CADENCE.as_millis() as u64,
                    error = %format!("{e:#}"),
                    "{what} does not answer; waiting for it."
                );
                tokio::time::sleep(exactly_core::restart::WAIT_CADENCE).await;
            }
            other => return other,
        }
    }
}

/// Whether the checkpoint location of this process (under `base`, or its range's directory)
/// already continues from an explicit restore of `from` (see `Storage::continues_from`). An
/// unreadable location answers no: the usual checks then speak.
fn continues_from(base: &Path, subtasks: Option<SubtaskRange>, parallelism: u32, from: &Path) -> bool {
    let mine = match subtasks {
        Some(r) => base.join(format!("subtasks-{}-{}-of-{parallelism}", r.first, r.last)),
        None => base.to_owned(),
    };
    if !Storage::is_url(&mine) && !mine.exists() {
        return false;
    }
    Storage::new(&mine)
        .and_then(|s| s.continues_from(from))
        .unwrap_or(false)
}

/// Runs `job` until it ends, is stopped (SIGTERM/SIGINT: final checkpoint and commits; a second
/// signal cancels) or fails for good.
pub async fn run(job: Job, opts: RunOptions) -> Result<JobOutcome> {
    for w in job.warnings() {
        warn!(file = %job.path.display(), "{w}");
    }
    let f = &job.file;
    let parallelism = opts.parallelism.unwrap_or(f.job.parallelism);
    if parallelism == 0 {
        bail!("--parallelism must be at least 1");
    }
    if let Some(r) = opts.subtasks {
        if r.last >= parallelism {
            bail!("--subtasks {r}: the last subtask must be below the parallelism ({parallelism})");
        }
    }
    if let Some(from) = &opts.from {
        // A start with the `--from` the job's checkpoints already continue from restores those
        // (the snapshot may be gone since): no need for it to open.
        let continues = f
            .checkpoints
            .as_ref()
            .is_some_and(|c| continues_from(&c.dir, opts.subtasks, parallelism, from));
        if !continues {
            let opened =
                wait_while_unavailable(&format!("The snapshot to restore (--from {})", from.display()), || {
                    Storage::open_verified(from).map_err(anyhow::Error::from)
                })
                .await;
            if let Err(e) = opened {
                bail!(
                "--from {}: not a checkpoint or savepoint directory (nor the savepoints of every range of a split job): {e}; `exactly checkpoints list DIR` shows the stored ones",
                from.display()
            );
            }
        }
    }
    let mut config = JobConfig::new(f.job.name.clone());
    let mut savepoint_dir = None;
    let mut checkpoints_dir = None;
    if let Some(c) = &f.checkpoints {
        let mut c = c.clone();
        c.dir = wait_while_unavailable(&format!("The checkpoint location {}", c.dir.display()), || {
            checkpoint_dir(&c.dir, opts.subtasks, parallelism, opts.from.as_deref())
        })
        .await?;
        checkpoints_dir = Some(c.dir.clone());
        savepoint_dir = Some(admin::SavepointDir {
            root: f.checkpoints.as_ref().map(|c| c.dir.join("savepoints")).expect("set"),
            range: opts
                .subtasks
                .map(|r| format!("subtasks-{}-{}-of-{parallelism}", r.first, r.last)),
        });
        config.checkpointing = Some(c);
    }
    if let Some(r) = &f.restart {
        config.restart = r.clone();
    }
    if let Some(b) = &f.state_backend {
        config.state_backend = b.clone();
    }
    if let Some(m) = f.job.max_parallelism {
        config.max_parallelism = m;
    }
    if let Some(t) = f.job.shutdown_timeout {
        config.shutdown_timeout = t;
    }
    if let Some(n) = f.job.startup_attempts {
        config.startup_attempts = (n > 0).then_some(n);
    }
    config.restore_from = opts.from.clone();
    config.accept_replay = opts.accept_replay;
    config.subtasks = opts.subtasks;

    let range = opts.subtasks.map_or_else(|| "all".to_owned(), |r| r.to_string());
    let registry = Registry::new(&f.job.name, parallelism, range.clone());
    let transforms = Arc::new(f.transforms.clone());
    let json = job.needs_json();
    let source_config = f.source.clone();
    let mut builder = JobBuilder::new(config);
    let reg = registry.clone();
    let stream = builder
        .source("kafka-source", parallelism, move |info| {
            let source = KafkaSource::new(
                source_config.clone(),
                Prepare {
                    transforms: transforms.clone(),
                    json,
                    registry: reg.clone(),
                },
            );
            reg.source(info.index, source.metrics());
            source
        })
        .flat_map(|r: Option<KafkaRecord>, out| {
            if let Some(r) = r {
                out.emit(r)?;
            }
            Ok(())
        });
    match job.sinks.as_slice() {
        [one] => attach_sink(stream, one, &registry),
        several => {
            // One reading of the source feeds every sink: each gets a copy of every record, its
            // own transforms, and pre-commits at the same barriers as the others.
            let names: Vec<&str> = several.iter().map(|s| s.name.as_str()).collect();
            for (branch, sink) in stream.fan_out(&names).into_iter().zip(several) {
                attach_sink(branch, sink, &registry);
            }
        }
    }
    let admin_addr = opts.admin.clone().or_else(|| f.job.admin.clone());
    let access = admin::AdminAccess {
        token: job.admin_token()?,
        tls: job.admin_tls()?,
        client_certs: f.job.admin_tls_client_ca.is_some(),
        allowed_hosts: f.job.admin_allowed_hosts.clone(),
    };
    if let Some(addr) = &admin_addr {
        admin::check_access(addr, &access)?;
    }
    let built = builder.build().context("building the job")?;
    let handle = built.start();
    let control = handle.control();
    registry.job_metrics(control.metrics());
    info!(
        job = %f.job.name,
        parallelism,
        subtasks = %range,
        file = %job.path.display(),
        "Job started."
    );

    let admin_task = match admin_addr {
        Some(addr) => Some(
            admin::serve(
                &addr,
                registry.clone(),
                control.clone(),
                savepoint_dir.clone(),
                checkpoints_dir.clone(),
                crate::jobfile::masked(&std::fs::read_to_string(&job.path).unwrap_or_default()),
                access,
            )
            .await?,
        ),
        None => None,
    };
    let signals = tokio::spawn(handle_signals(control.clone(), registry.clone()));
    let progress = tokio::spawn(progress(registry.clone(), opts.progress));
    let outcome = handle.join().await;
    signals.abort();
    progress.abort();
    if opts.progress {
        eprintln!();
    }
    if let Some(t) = admin_task {
        // Let a pending `stop` request receive its answer before the process exits.
        tokio::time::sleep(Duration::from_millis(200)).await;
        t.abort();
    }
    let outcome = outcome.with_context(|| format!("job {:?} failed", f.job.name))?;
    let s = registry.status();
    info!(
        job = %f.job.name,
        records_in = s.records_in,
        records_out = s.records_out,
        checkpoints = outcome.checkpoints,
        // A word when there is none, not `None`.
        latest_checkpoint = %outcome.latest_checkpoint.map_or("none".into(), |c| c.to_string()),
        restarts = outcome.restarts,
        cancelled = outcome.cancelled,
        "Job ended."
    );
    Ok(outcome)
}

/// Ends `stream` in `sink`: its own transforms, then the Kafka, MySQL or PostgreSQL sink under its
/// name.
fn attach_sink(stream: Stream<KafkaRecord>, sink: &JobSink, registry: &Arc<Registry>) {
    let name = sink.name.clone();
    let transforms = Arc::new(sink.transforms.clone());
    let counter = registry.sink_records(&name);
    let stream = stream.flat_map(move |mut r: KafkaRecord, out| {
        if !transforms.is_empty() {
            if let Some(bytes) = &r.value {
                // The source parsed it already (the poison-record policy applies there).
                let mut v: Value = serde_json::from_slice(bytes).map_err(|e| {
                    CoreError::operator("sink transforms", ErrorClass::Fatal, format!("value is not JSON: {e}"))
                })?;
                let mut deleted = false;
                for t in transforms.iter() {
                    match t
                        .apply(&mut v, &mut r.key)
                        .map_err(|e| CoreError::operator("sink transforms", ErrorClass::Fatal, e))?
                    {
                        Change::Keep => {}
                        Change::Drop => return Ok(()),
                        Change::Delete => {
                            deleted = true;
                            break;
                        }
                    }
                }
                r.value = if deleted {
                    None
                } else {
                    Some(
                        serde_json::to_vec(&v)
                            .map_err(|e| CoreError::operator("sink transforms", ErrorClass::Fatal, e))?,
                    )
                };
            }
        }
        counter.fetch_add(1, Ordering::Relaxed);
        out.emit(r)
    });
    match &sink.kind {
        SinkKind::Kafka(k) => {
            let k = (**k).clone();
            let reg = registry.clone();
            let n = name.clone();
            stream.map(records::to_kafka).sink(&name, move |info| {
                let sink = KafkaSink::new(k.clone()).expect("checked when the job file was loaded");
                if let Some(m) = sink.two_phase_metrics() {
                    reg.sink(&n, info.index, m);
                }
                sink
            });
        }
        SinkKind::Mysql(m) => {
            let m = (**m).clone();
            let reg = registry.clone();
            let n = name.clone();
            stream.map(records::to_mysql).sink(&name, move |info| {
                let sink = MysqlSink::new(m.clone()).expect("checked when the job file was loaded");
                if let Some(m) = sink.two_phase_metrics() {
                    reg.sink(&n, info.index, m);
                }
                sink
            });
        }
        SinkKind::Postgres(p) => {
            let p = (**p).clone();
            let reg = registry.clone();
            let n = name.clone();
            stream.map(records::to_postgres).sink(&name, move |info| {
                let sink = PostgresSink::new(p.clone()).expect("checked when the job file was loaded");
                if let Some(m) = sink.two_phase_metrics() {
                    reg.sink(&n, info.index, m);
                }
                sink
            });
        }
    }
}

async fn handle_signals(control: JobControl, registry: Arc<Registry>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        warn!("Cannot install signal handlers; SIGTERM will kill the job without a final checkpoint.");
        return;
    };
    let count = Arc::new(AtomicU32::new(0));
    loop {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        if count.fetch_add(1, Ordering::Relaxed) == 0 {
            registry.set_stopping();
            info!("Stopping: final checkpoint, then commits. Send the signal again to abort at once.");
            let c = control.clone();
            tokio::spawn(async move {
                match c.stop().await {
                    Ok(path) => info!(checkpoint = %path.display(), "Final checkpoint complete."),
                    Err(e) => {
                        warn!(error = %e, "No final checkpoint; cancelling (open transactions are aborted at the next start).");
                        c.cancel();
                    }
                }
            });
        } else {
            warn!("Aborting: no final checkpoint; open transactions are aborted at the next start.");
            control.cancel();
        }
    }
}

fn human(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.1}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

/// One progress line per second on a terminal; a progress log line every 30 s otherwise.
async fn progress(registry: Arc<Registry>, terminal: bool) {
    let tick = if terminal {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(30)
    };
    let mut last = (Instant::now(), 0u64, 0u64);
    loop {
        tokio::time::sleep(tick).await;
        let s = registry.status();
        let secs = last.0.elapsed().as_secs_f64().max(1e-3);
        let rate_in = (s.records_in - last.1) as f64 / secs;
        let rate_out = (s.records_out - last.2) as f64 / secs;
        last = (Instant::now(), s.records_in, s.records_out);
        let checkpoint = match (s.checkpoints.latest_id, s.checkpoints.last_duration_ms) {
            (Some(id), Some(ms)) => format!("#{id} in {ms} ms"),
            _ => "none yet".into(),
        };
        if terminal {
            crate::logging::progress_line(&format!(
                "{} | in {}/s | out {}/s | lag {} | checkpoint {} | pending txn {} | restarts {}",
                s.job,
                human(rate_in),
                human(rate_out),
                s.lag.map_or("?".into(), |l| l.to_string()),
                checkpoint,
                s.pending_transactions,
                s.restarts
            ));
        } else {
            info!(
                records_in = s.records_in,
                records_out = s.records_out,
                in_per_s = rate_in as u64,
                out_per_s = rate_out as u64,
                // Not yet known (no partition read yet): a word, not `None`.
                lag = %s.lag.map_or("unknown".into(), |l| l.to_string()),
                checkpoint = %checkpoint,
                restarts = s.restarts,
                "Progress."
            );
        }
    }
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
