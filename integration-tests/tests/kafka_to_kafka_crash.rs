//! A Kafka-to-Kafka exactly-once job, run as a child process, is killed with SIGKILL at every
//! named step of the two-phase protocol, many times, and restarted each time; input keeps
//! arriving throughout. An independent read_committed consumer then finds every input record
//! exactly once in the output, in order per key.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_integration_tests::{create_topic, produce, read_committed, unique, ChildJob, TestEnv};

const KEYS: usize = 20;

struct Feeder {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Result<usize>>,
}

/// Produces `key:seq` records in small batches until stopped; returns how many per key it sent.
fn feed(env: &TestEnv, topic: &str, next: Arc<std::sync::Mutex<Vec<usize>>>) -> Feeder {
    let stop = Arc::new(AtomicBool::new(false));
    let (env, topic, flag) = (env.clone(), topic.to_owned(), stop.clone());
    let handle = std::thread::spawn(move || {
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
            produce(&env, &topic, &batch)?;
            sent += batch.len();
            std::thread::sleep(Duration::from_millis(40));
        }
        Ok(sent)
    });
    Feeder { stop, handle }
}

impl Feeder {
    fn finish(self) -> Result<usize> {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().map_err(|_| anyhow::anyhow!("feeder panicked"))?
    }
}

fn job_still_failed_by_timing(e: &anyhow::Error) -> bool {
    e.to_string().contains("did not reach")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_kafka_is_exactly_once_across_sigkills_at_every_protocol_step() -> Result<()> {
    let env = TestEnv::get().await?;
    let input = unique("k2k-in");
    let output = unique("k2k-out");
    create_topic(env, &input, 3).await?;
    create_topic(env, &output, 3).await?;
    let checkpoints = tempfile::tempdir()?;
    let args: Vec<String> = [
        "--bootstrap",
        &env.kafka_bootstrap,
        "--input",
        &input,
        "--output",
        &output,
        "--group",
        &unique("k2k-group"),
        "--prefix",
        &unique("k2k"),
        "--checkpoints",
        &checkpoints.path().display().to_string(),
        "--parallelism",
        "2",
        "--interval",
        "200ms",
        "--checkpoint-timeout",
        "500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let program = env!("CARGO_BIN_EXE_exactly-k2k");
    let next = Arc::new(std::sync::Mutex::new(vec![0usize; KEYS]));

    let steps: &[(&str, &str)] = &[
        ("sink.before_pre_commit", "sink.before_pre_commit=freeze@4"),
        ("sink.after_pre_commit", "sink.after_pre_commit=freeze@3"),
        ("checkpoint.after_durable", "checkpoint.after_durable=freeze@3"),
        // A pre-commit slow enough for its checkpoint to time out leaves two transactions to
        // commit at the next completion: die between them.
        (
            "sink.between_commits",
            "sink.before_pre_commit=delay@1500ms@3;sink.between_commits=freeze@1",
        ),
        ("sink.after_commit", "sink.after_commit=freeze@2"),
    ];
    let mut kills = 0;
    for round in 0..2 {
        for (point, spec) in steps {
            // Reaching a point can depend on timing (a checkpoint must time out first for
            // `between_commits`): an attempt that does not get there within its time is killed
            // anyway (a kill at an arbitrary point) and the step is tried again.
            let mut attempt = 0;
            loop {
                attempt += 1;
                let feeder = feed(env, &input, next.clone());
                let mut job = ChildJob::spawn(program, &args, spec)?;
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

    // A last run without fail points drains the input.
    let expected: usize = next.lock().unwrap().iter().sum();
    let mut job = ChildJob::spawn(program, &args, "")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let seen = loop {
        let seen = read_committed(env, &output, Duration::from_secs(30))?;
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
    let seen = if read_committed(env, &output, Duration::from_secs(30))?.len() != seen.len() {
        read_committed(env, &output, Duration::from_secs(30))?
    } else {
        seen
    };

    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    let mut last_seq: BTreeMap<(String, i32), usize> = BTreeMap::new();
    for r in &seen {
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
    let next = next.lock().unwrap();
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
    assert_eq!(seen.len(), expected);
    eprintln!(
        "{kills} kills; {expected} records in, {} out, 0 duplicates, 0 missing",
        seen.len()
    );
    Ok(())
}
