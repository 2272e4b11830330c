//! Zombies and leftovers, with real processes: a paused old process resumed after its
//! replacement started cannot commit anything; a job killed and never restarted leaves open
//! transactions that the next start with the same prefix aborts, so stuck readers move on.

mod k2k;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_integration_tests::{
    create_topic, produce, read_committed, signal, transactional_producer, unique, ChildJob, TestEnv,
};
use k2k::{exactly, Job};
use rdkafka::producer::{BaseRecord, Producer};

const T: Duration = Duration::from_secs(30);

/// The crash tests' job with checkpoints that may take 2 s, a given group and prefix.
fn job<'a>(input: &'a str, output: &'a str, prefix: &str) -> Job<'a> {
    Job {
        group: unique("g"),
        prefix: prefix.to_owned(),
        checkpoint_timeout: "2s",
        ..Job::new(input, output)
    }
}

fn batch(from: usize, n: usize) -> Vec<(String, String)> {
    (from..from + n)
        .map(|i| (format!("k{}", i % 13), format!("v{i:05}")))
        .collect()
}

async fn wait_for_output(env: &TestEnv, topic: &str, at_least: usize, job: &mut ChildJob) -> Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let n = read_committed(env, topic, T)?.len();
        if n >= at_least {
            return Ok(n);
        }
        if !job.running() || Instant::now() > deadline {
            bail!("output has {n} of {at_least}:\n{}", job.tail(40));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn assert_exactly_once(env: &TestEnv, topic: &str, expected: usize) -> Result<()> {
    let seen = read_committed(env, topic, T)?;
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for r in &seen {
        *count.entry(r.value_str()).or_default() += 1;
    }
    let dups: Vec<_> = count.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(dups.is_empty(), "duplicates: {dups:?}");
    assert_eq!(count.len(), expected, "distinct records");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_zombie_cannot_commit_after_its_replacement_started() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique("zombie-in"), unique("zombie-out"));
    create_topic(env, &input, 2).await?;
    create_topic(env, &output, 2).await?;
    let dir = tempfile::tempdir()?;
    let j = job(&input, &output, &unique("zombie"));
    let a = j.write(env, dir.path(), "replacement");
    // The old process ends at its first failure instead of restarting; same checkpoints.
    let old_args = Job { restart: false, ..j }.write(env, dir.path(), "replacement-no-restart");
    let program = exactly();

    produce(env, &input, &batch(0, 200))?;
    let mut old = ChildJob::spawn(program, &old_args, "")?;
    wait_for_output(env, &output, 200, &mut old).await?;
    produce(env, &input, &batch(200, 200))?;
    tokio::time::sleep(Duration::from_millis(300)).await; // let it take some of them into transactions
    signal(old.pid(), "STOP")?;

    let mut replacement = ChildJob::spawn(program, &a, "")?;
    wait_for_output(env, &output, 400, &mut replacement).await?;
    signal(old.pid(), "CONT")?;
    produce(env, &input, &batch(400, 200))?;
    // The zombie's producers were fenced by the replacement's start: it fails instead of committing.
    let deadline = Instant::now() + Duration::from_secs(60);
    while old.running() {
        if Instant::now() > deadline {
            let interesting: Vec<String> = old
                .tail(5000)
                .lines()
                .filter(|l| !l.contains("already exists"))
                .map(str::to_owned)
                .collect();
            bail!("the resumed zombie kept running:\n{}", interesting.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("the zombie failed:\n{}", old.tail(8));
    wait_for_output(env, &output, 600, &mut replacement).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    replacement.kill();
    assert_exactly_once(env, &output, 600)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_killed_for_good_leaves_transactions_the_next_start_aborts() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique("linger-in"), unique("linger-out"));
    create_topic(env, &input, 2).await?;
    create_topic(env, &output, 2).await?;
    let prefix = unique("linger");
    let program = exactly();
    let dir = tempfile::tempdir()?;
    let a = job(&input, &output, &prefix).write(env, dir.path(), "dead");

    produce(env, &input, &batch(0, 100))?;
    // Frozen with records in an open transaction, then killed: never restarted.
    let mut dead = ChildJob::spawn(program, &a, "sink.before_pre_commit=freeze@1")?;
    dead.wait_for_failpoint("sink.before_pre_commit", Duration::from_secs(60))?;
    dead.kill();

    // Someone else commits to the output: a read_committed reader cannot see it.
    let other = transactional_producer(env, &unique("other"))?;
    other.begin_transaction()?;
    for p in 0..2 {
        other
            .send(BaseRecord::<str, str>::to(&output).partition(p).payload("after"))
            .map_err(|(e, _)| e)?;
    }
    other.commit_transaction(T)?;
    let stuck = read_committed(env, &output, T)?;
    assert!(
        stuck.iter().all(|r| r.value_str() != "after"),
        "the lingering transaction pins the stable offset"
    );

    // A new job with the same prefix (fresh state) aborts them on start.
    let unused = unique("unused-in");
    create_topic(env, &unused, 1).await?;
    let fresh = tempfile::tempdir()?;
    let b = job(&unused, &output, &prefix).write(env, fresh.path(), "fresh");
    let mut next = ChildJob::spawn(program, &b, "")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = read_committed(env, &output, T)?;
        if seen.iter().filter(|r| r.value_str() == "after").count() == 2 {
            break;
        }
        if !next.running() || Instant::now() > deadline {
            bail!("the reader is still stuck:\n{}", next.tail(30));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    next.kill();
    Ok(())
}
