//! Helpers of the Kafka-to-Kafka scenarios (shared by several test binaries): a feeder of
//! `key:seq` records, the job file run by the `exactly` binary, and the drain that checks the read_committed output
//! has every record once, in order per key.

// Each test binary uses some of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use exactly_integration_tests::{
    create_topic, high_watermark, read_committed, signal, unique, ChildJob, Feed, TestEnv,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

mod running;
// (Not every test binary runs a job under a feeder.)
#[allow(unused_imports)]
pub(crate) use running::Running;

pub(crate) const KEYS: usize = 20;

pub(crate) struct Feeder {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Result<usize>>,
}

/// Produces `key:seq` records in small batches until stopped; returns how many per key it sent.
pub(crate) fn feed(env: &TestEnv, topic: &str, next: Arc<std::sync::Mutex<Vec<usize>>>) -> Feeder {
    let stop = Arc::new(AtomicBool::new(false));
    let (env, topic, flag) = (env.clone(), topic.to_owned(), stop.clone());
    let handle = std::thread::spawn(move || {
        // One idempotent producer for the whole feed (a new one per batch cost the broker an
        // InitProducerId and the machine new connections 25 times a second).
        let feed = Feed::new(&env)?;
        let mut sent = 0;
        while !flag.load(Ordering::SeqCst) {
            let batch: Vec<(String, String)> = {
                let mut next = next.lock().unwrap();
                (0..KEYS)
                    .map(|k| {
                        next[k] += 1;
                        (format!("k{k}"), format!("k{k}:{}", next[k]))
                    })
                    .collect()
            };
            feed.send(&topic, &batch)?;
            sent += batch.len();
            std::thread::sleep(Duration::from_millis(40));
        }
        Ok(sent)
    });
    Feeder { stop, handle }
}

impl Feeder {
    pub(crate) fn finish(self) -> Result<usize> {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().map_err(|_| anyhow::anyhow!("feeder panicked"))?
    }
}

/// The `exactly` binary under test.
pub(crate) fn exactly() -> &'static str {
    env!("CARGO_BIN_EXE_exactly")
}

/// Settings of the crash tests' Kafka-to-Kafka job file (what a user would write: no transforms,
/// every record passed through with its key, value, timestamp and headers).
pub(crate) struct Job<'a> {
    pub(crate) input: &'a str,
    pub(crate) output: &'a str,
    pub(crate) group: String,
    pub(crate) prefix: String,
    pub(crate) parallelism: u32,
    pub(crate) interval: &'a str,
    pub(crate) checkpoint_timeout: &'a str,
    /// `false`: `[restart] type = "none"` (the job ends at its first failure).
    pub(crate) restart: bool,
    /// Where the job reaches the broker (default: the test environment's bootstrap).
    pub(crate) bootstrap: Option<String>,
    /// The sink's transaction timeout.
    pub(crate) transaction_timeout: &'a str,
    /// The body of a `[kafka]` section (security settings), if any.
    pub(crate) kafka: Option<String>,
    /// Where checkpoints go (default: `DIR/checkpoints`), e.g. an `s3://` URL.
    pub(crate) checkpoints: Option<String>,
    /// The source's `start` (default: its own, `earliest`), e.g. `{ type = "latest" }`.
    pub(crate) start: Option<&'a str>,
    /// The source's `client` properties (an inline table), if any.
    pub(crate) source_client: Option<&'a str>,
    /// Restarts allowed (fixed delay of 200 ms) when `restart`.
    pub(crate) restart_attempts: u32,
    /// `[job] startup_attempts` (default: the job's own, 5).
    pub(crate) startup_attempts: Option<u32>,
}

impl<'a> Job<'a> {
    /// Two subtasks, checkpoints every 200 ms that time out after 500 ms (so a slow pre-commit
    /// leaves two transactions for one completion), restarts, a fresh group and prefix.
    pub(crate) fn new(input: &'a str, output: &'a str) -> Self {
        Job {
            input,
            output,
            group: unique("k2k-group"),
            prefix: unique("k2k"),
            parallelism: 2,
            interval: "200ms",
            checkpoint_timeout: "500ms",
            restart: true,
            bootstrap: None,
            transaction_timeout: "2m",
            kafka: None,
            checkpoints: None,
            start: None,
            source_client: None,
            restart_attempts: 20,
            startup_attempts: None,
        }
    }

    /// Writes job `k2k` into `DIR/FILE.toml` (checkpoints in `DIR/checkpoints`, shared by the job files of one
    /// directory) and returns the arguments of `exactly run` for it.
    pub(crate) fn write(&self, env: &TestEnv, dir: &Path, file: &str) -> Vec<String> {
        let restart = if self.restart {
            format!(
                "type = \"fixed_delay\"\nattempts = {}\ndelay = \"200ms\"",
                self.restart_attempts
            )
        } else {
            "type = \"none\"".to_owned()
        };
        let text = format!(
            r#"
[job]
name = "k2k"
parallelism = {parallelism}
{startup_attempts}

[checkpoints]
dir = "{checkpoints}"
interval = "{interval}"
timeout = "{timeout}"
retained = 2
tolerable_failures = 100

[restart]
{restart}

{kafka}

[source]
bootstrap_servers = "{bootstrap}"
topics = ["{input}"]
group_id = "{group}"
{start}
{source_client}

[sink.kafka]
bootstrap_servers = "{bootstrap}"
topic = "{output}"
delivery = {{ type = "exactly_once", transactional_id_prefix = "{prefix}", pool_size = 3, transaction_timeout = "{transaction_timeout}" }}
"#,
            parallelism = self.parallelism,
            checkpoints = self
                .checkpoints
                .clone()
                .unwrap_or_else(|| dir.join("checkpoints").display().to_string()),
            interval = self.interval,
            timeout = self.checkpoint_timeout,
            bootstrap = self.bootstrap.as_deref().unwrap_or(&env.kafka_bootstrap),
            input = self.input,
            transaction_timeout = self.transaction_timeout,
            kafka = self.kafka.as_deref().map_or(String::new(), |k| format!("[kafka]\n{k}")),
            group = self.group,
            start = self.start.map_or(String::new(), |s| format!("start = {s}")),
            source_client = self.source_client.map_or(String::new(), |c| format!("client = {c}")),
            startup_attempts = self
                .startup_attempts
                .map_or(String::new(), |n| format!("startup_attempts = {n}")),
            output = self.output,
            prefix = self.prefix,
        );
        let path = dir.join(format!("{file}.toml"));
        std::fs::write(&path, text).expect("write job file");
        vec!["run".to_owned(), path.display().to_string()]
    }
}

/// The arguments of `exactly run` for the crash tests' job on these topics (job file written
/// into `dir`).
pub(crate) fn job_args(env: &TestEnv, input: &str, output: &str, dir: &Path) -> Vec<String> {
    Job::new(input, output).write(env, dir, "k2k")
}

/// Runs the job without fail points until the output has every record fed, then checks it:
/// every record once, in order per key. Returns how many records came out.
pub(crate) async fn drain_and_verify(
    env: &TestEnv,
    args: &[String],
    output: &str,
    next: &Arc<std::sync::Mutex<Vec<usize>>>,
) -> Result<usize> {
    // A last run without fail points drains the input.
    let expected: usize = next.lock().unwrap().iter().sum();
    let mut job = ChildJob::spawn(exactly(), args, "")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let seen = loop {
        let seen = read_committed(env, output, Duration::from_secs(30))?;
        if seen.len() >= expected {
            break seen;
        }
        if !job.running() || Instant::now() > deadline {
            bail!("output has {} of {expected} records:\n{}", seen.len(), job.tail(40));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Give a duplicate, if any, the chance to show up, then stop the job.
    tokio::time::sleep(Duration::from_secs(2)).await;
    job.kill();
    let seen = if read_committed(env, output, Duration::from_secs(30))?.len() != seen.len() {
        read_committed(env, output, Duration::from_secs(30))?
    } else {
        seen
    };

    check_exactly_once(&seen, &next.lock().unwrap())?;
    assert_eq!(seen.len(), expected);
    exactly_verify(&args[1], &["--id", "@value"])?;
    Ok(seen.len())
}

/// Every record fed (`next`: per key, how many) is in `seen` once, in order per key and partition.
pub(crate) fn check_exactly_once(seen: &[exactly_integration_tests::CommittedRecord], next: &[usize]) -> Result<()> {
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    let mut last_seq: BTreeMap<(String, i32), usize> = BTreeMap::new();
    for r in seen {
        let v = r.value_str();
        *count.entry(v.clone()).or_default() += 1;
        let (key, seq) = v.split_once(':').expect("key:seq");
        let seq: usize = seq.parse()?;
        let prev = last_seq.insert((key.to_owned(), r.partition), seq);
        assert!(
            prev.is_none_or(|p| p < seq),
            "{key}: {seq} after {prev:?} (order per key)"
        );
    }
    let duplicates: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicates.is_empty(),
        "duplicates: {:?}",
        &duplicates[..duplicates.len().min(10)]
    );
    let mut missing = Vec::new();
    for (k, n) in next.iter().enumerate() {
        for seq in 1..=*n {
            if !count.contains_key(&format!("k{k}:{seq}")) {
                missing.push(format!("k{k}:{seq}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} missing, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    Ok(())
}

/// A `[kafka]` body for SASL_SSL with SCRAM-SHA-512 as `user`, the password referenced from the
/// environment variable `password_var` (never in the file), trusting the CA certificate at `ca`.
pub(crate) fn scram_settings(user: &str, password_var: &str, ca: &str) -> String {
    format!(
        r#"security.protocol = "SASL_SSL"
sasl.mechanism = "SCRAM-SHA-512"
sasl.username = "{user}"
sasl.password = "${{{password_var}}}"
ssl.ca.location = "{ca}"
"#
    )
}

/// `exactly verify` of the job in `job_file` (its source topic against its sink's output, with
/// the job's servers and credentials) must find the output exactly once.
pub(crate) fn exactly_verify(job_file: &str, extra: &[&str]) -> Result<()> {
    let job = exactly_cli::jobfile::Job::load(Path::new(job_file))?;
    let input = job.file.source.topics.first().expect("a topic").clone();
    let output = match &job.sinks[0].kind {
        exactly_cli::jobfile::SinkKind::Kafka(k) => format!("topic:{}", k.topic),
        exactly_cli::jobfile::SinkKind::Mysql(m) => format!("mysql:{}", m.table),
        exactly_cli::jobfile::SinkKind::Postgres(p) => format!("postgres:{}", p.table),
    };
    let out = std::process::Command::new(exactly())
        .args(["verify", "--source", &input, "--output", &output, "--job", job_file])
        .args(extra)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.code() != Some(0) {
        bail!(
            "exactly verify found the output not exactly once (exit {:?}):\n{stdout}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(stdout.contains("EXACTLY ONCE"), "{stdout}");
    Ok(())
}

/// Feeds `input` and runs the job of `args` until a checkpoint (its fourth) is durable, then
/// SIGKILLs it before its commits. Returns what was fed (per key, for [`drain_and_verify`]) and
/// the killed job's log.
pub(crate) fn killed_before_its_commits(
    env: &TestEnv,
    input: &str,
    args: &[String],
) -> Result<(Arc<std::sync::Mutex<Vec<usize>>>, String)> {
    let next = Arc::new(std::sync::Mutex::new(vec![0usize; KEYS]));
    let feeder = feed(env, input, next.clone());
    let mut job = ChildJob::spawn(exactly(), args, "checkpoint.after_durable=freeze@4")?;
    job.wait_for_failpoint("checkpoint.after_durable", Duration::from_secs(60))?;
    let log = job.tail(100_000);
    job.kill();
    feeder.finish()?;
    Ok((next, log))
}

/// For `rounds` rounds: waits `pause`, then for the output to grow (30 s at most); returns the
/// records committed. The job's log must then say no attempt restarted and no authentication
/// failed: for jobs that must run through a change of credentials (expiring tokens and tickets,
/// an identity provider's outage) without noticing.
pub(crate) async fn keeps_committing(
    env: &TestEnv,
    output: &str,
    job: &mut ChildJob,
    committed: usize,
    rounds: usize,
    pause: Duration,
) -> Result<usize> {
    let mut committed = committed;
    for _ in 0..rounds {
        tokio::time::sleep(pause).await;
        committed = wait_for_more_output(env, output, committed, job, Duration::from_secs(30))
            .await?
            .0;
    }
    Ok(committed)
}

/// Fails if the job's log shows an attempt restarted or an authentication that failed.
pub(crate) fn assert_no_restart(job: &ChildJob) {
    let log = job.tail(100_000);
    for sign in ["restarting", "uthentication failed", "Task failed"] {
        assert!(!log.contains(sign), "{sign:?} in the job's log:\n{log}");
    }
}

/// How many records of `output` a read_committed reader sees now, read again (every 500 ms) while
/// the reader itself fails — the brokers recovering from a fault — until `until`.
pub(crate) async fn committed_count(env: &TestEnv, output: &str, until: Instant) -> Result<usize> {
    loop {
        match read_committed(env, output, Duration::from_secs(30)) {
            Ok(records) => return Ok(records.len()),
            Err(e) if Instant::now() < until => {
                eprintln!("verifier: {e:#}; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Waits until the read_committed output holds more than `before` records; returns how many and
/// how long it took. Fails if the job exits or `timeout` passes.
pub(crate) async fn wait_for_more_output(
    env: &TestEnv,
    output: &str,
    before: usize,
    job: &mut ChildJob,
    timeout: Duration,
) -> Result<(usize, Duration)> {
    let start = Instant::now();
    loop {
        let n = committed_count(env, output, start + timeout).await?;
        if n > before {
            return Ok((n, start.elapsed()));
        }
        if !job.running() {
            bail!(
                "the job exited (code {:?}) with {n} records committed:\n{}",
                job.exit_code(),
                job.log(40)
            );
        }
        if start.elapsed() > timeout {
            bail!(
                "no new output within {timeout:?} ({n} records):\n{}",
                job.log_but_checkpoints(80)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn job_still_failed_by_timing(e: &anyhow::Error) -> bool {
    e.to_string().contains("did not reach")
}

/// Runs the job of `args`, with input arriving, and SIGKILLs it at each named step of the
/// two-phase protocol, `rounds` times over, restarting it each time. Returns the number of kills.
pub(crate) fn sigkill_at_every_step(
    env: &TestEnv,
    args: &[String],
    input: &str,
    next: &Arc<std::sync::Mutex<Vec<usize>>>,
    rounds: usize,
) -> Result<usize> {
    let steps: &[(&str, &str)] = &[
        ("sink.before_pre_commit", "sink.before_pre_commit=freeze@4"),
        // The pre-commit completes in the background: die while it flushes, the next
        // transaction already taking the records after the barrier...
        (
            "sink.in_background_pre_commit",
            "sink.in_background_pre_commit=freeze@3",
        ),
        // ...and once it is prepared, before the checkpoint is acknowledged.
        ("sink.after_pre_commit", "sink.after_pre_commit=freeze@3"),
        ("checkpoint.after_durable", "checkpoint.after_durable=freeze@3"),
        // A pre-commit slow enough for its checkpoint to time out leaves two transactions to
        // commit at the next completion: die between them.
        (
            "sink.between_commits",
            "sink.before_pre_commit=delay@1500ms@3;sink.between_commits=freeze@1",
        ),
        // The commit completes in the background while the records after the completion flow
        // into the next transaction: die before it ends (the restart commits it from the
        // checkpoint, or finds it committed)...
        ("sink.in_background_commit", "sink.in_background_commit=freeze@2"),
        // ...and once it has.
        ("sink.after_commit", "sink.after_commit=freeze@2"),
    ];
    let mut kills = 0;
    for round in 0..rounds {
        for (point, spec) in steps {
            // Reaching a point can depend on timing (a checkpoint must time out first for
            // `between_commits`): an attempt that does not get there within its time is killed
            // anyway (a kill at an arbitrary point) and the step is tried again.
            let mut attempt = 0;
            loop {
                attempt += 1;
                let feeder = feed(env, input, next.clone());
                let mut job = ChildJob::spawn(exactly(), args, spec)?;
                let reached = job.wait_for_failpoint(point, Duration::from_secs(30));
                let reached = reached.map_err(|e| anyhow::anyhow!("{e}\n{}", job.tail(300)));
                job.kill();
                feeder.finish()?;
                kills += 1;
                match reached {
                    Ok(()) => break,
                    Err(e) if attempt < 5 && job_still_failed_by_timing(&e) => {
                        eprintln!("round {round}: {point} not reached (attempt {attempt}); killed anyway");
                        if std::env::var_os("EXACTLY_DEBUG_CRASH").is_some() {
                            eprintln!("{e}");
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            eprintln!("round {round}: killed at {point}");
        }
    }

    Ok(kills)
}

/// The transaction log: with one partition, its leader coordinates every transactional id.
pub(crate) const TRANSACTION_LOG: &str = "__transaction_state";

/// The node leading partition 0 of `topic` (asked again, 60 s at most, while no node leads it or
/// the node asked does not answer).
pub(crate) fn leader_of(env: &TestEnv, topic: &str) -> Result<i32> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()
        .context("creating a metadata client")?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        // A stopped node's answer never comes: asked again (the next request may go elsewhere).
        let leader = match consumer.fetch_metadata(Some(topic), Duration::from_secs(10)) {
            Ok(metadata) => metadata
                .topics()
                .first()
                .and_then(|t| t.partitions().first())
                .map(|p| p.leader()),
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("metadata of {topic}: {e}; asking again");
                None
            }
            Err(e) => return Err(e).with_context(|| format!("metadata of {topic}")),
        };
        match leader {
            Some(l) if l >= 0 => return Ok(l),
            _ if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(500)),
            _ => anyhow::bail!("{topic}/0 has no leader after 60 s: {leader:?}"),
        }
    }
}
