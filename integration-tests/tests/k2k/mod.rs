//! Helpers of the Kafka-to-Kafka scenarios (shared by several test binaries): a feeder of
//! `key:seq` records, the job's arguments, and the drain that checks the read_committed output
//! has every record once, in order per key.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_integration_tests::{produce, read_committed, unique, ChildJob, TestEnv};

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
    pub(crate) fn finish(self) -> Result<usize> {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().map_err(|_| anyhow::anyhow!("feeder panicked"))?
    }
}

/// The arguments of the `exactly-k2k` job for these topics.
pub(crate) fn job_args(env: &TestEnv, input: &str, output: &str, checkpoints: &std::path::Path) -> Vec<String> {
    [
        "--bootstrap",
        &env.kafka_bootstrap,
        "--input",
        input,
        "--output",
        output,
        "--group",
        &unique("k2k-group"),
        "--prefix",
        &unique("k2k"),
        "--checkpoints",
        &checkpoints.display().to_string(),
        "--parallelism",
        "2",
        "--interval",
        "200ms",
        "--checkpoint-timeout",
        "500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Runs the job without fail points until the output has every record fed, then checks it:
/// every record once, in order per key. Returns how many records came out.
pub(crate) async fn drain_and_verify(
    env: &TestEnv,
    program: &str,
    args: &[String],
    output: &str,
    next: &Arc<std::sync::Mutex<Vec<usize>>>,
) -> Result<usize> {
    // A last run without fail points drains the input.
    let expected: usize = next.lock().unwrap().iter().sum();
    let mut job = ChildJob::spawn(program, args, "")?;
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
    Ok(seen.len())
}
