//! Zombies, leftovers and early deaths, with real processes: a paused old process resumed after
//! its replacement started cannot commit anything; a job killed and never restarted leaves open
//! transactions that the next start with the same prefix aborts, so stuck readers move on; a job
//! started at `latest` and killed before it committed anything starts again where it first
//! started.

mod k2k;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_integration_tests::{
    create_topic, produce, read_committed, read_uncommitted, signal, transactional_producer, unique,
    wait_for_uncommitted, ChildJob, Feed, TestEnv,
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

    // On the same machine the stopped zombie is known alive: the replacement refuses, naming it.
    let mut refused = ChildJob::spawn(program, &a, "")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while refused.running() {
        if Instant::now() > deadline {
            bail!("the replacement started beside a live zombie:\n{}", refused.tail(40));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let said = refused.tail(40);
    assert!(
        said.contains("checkpoint location of another run") && said.contains(&format!("process {}", old.pid())),
        "{said}"
    );
    // From another machine (the zombie's record made to say so), a claim unrenewed for a lease
    // is taken over: the replacement watches it for its 3 s lease, then starts.
    let owner = dir.path().join("checkpoints/_owner");
    let mut record: serde_json::Value = serde_json::from_slice(&std::fs::read(&owner)?)?;
    let zombie_claim = record["id"].clone();
    record["boot_id"] = "another-machine".into();
    record["lease_ms"] = 3000.into();
    let tmp = dir.path().join("checkpoints/_owner.test");
    std::fs::write(&tmp, serde_json::to_vec(&record)?)?;
    std::fs::rename(&tmp, &owner)?;
    let text = std::fs::read_to_string(&a[1])?.replace("retained = 2\n", "retained = 2\nowner_lease = \"3s\"\n");
    let short = dir.path().join("replacement-elsewhere.toml");
    std::fs::write(&short, text)?;
    let mut replacement = ChildJob::spawn(program, &["run".to_owned(), short.display().to_string()], "")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now: serde_json::Value = serde_json::from_slice(&std::fs::read(&owner)?)?;
        if now["id"] != zombie_claim {
            break;
        }
        if !replacement.running() || Instant::now() > deadline {
            bail!("the replacement did not take over:\n{}", replacement.tail(40));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for_output(env, &output, 400, &mut replacement).await?;
    signal(old.pid(), "CONT")?;
    produce(env, &input, &batch(400, 200))?;
    // The zombie's producers were fenced by the replacement's start, and its location taken: it
    // fails instead of committing.
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
    // The partitions its open transaction holds records on, once the broker has them (librdkafka
    // sends them while the task is frozen; a record still queued at the kill was never written).
    // Each input partition's keys go to one output partition: a first transaction may hold only
    // one of them.
    let deadline = Instant::now() + Duration::from_secs(30);
    let pinned: std::collections::BTreeSet<i32> = loop {
        let written: std::collections::BTreeSet<i32> =
            read_uncommitted(env, &output, T)?.iter().map(|r| r.partition).collect();
        if !written.is_empty() {
            break written;
        }
        if Instant::now() > deadline {
            bail!("the frozen job's records never reached the output:\n{}", dead.tail(20));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
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
        stuck
            .iter()
            .all(|r| r.value_str() != "after" || !pinned.contains(&r.partition)),
        "the lingering transaction pins the stable offset of partitions {pinned:?}"
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

/// A job that starts at the end of its input (`latest`), reads records and is killed before it
/// committed any, then started again as a new process, reads again from where it first started:
/// the records the killed process read, those produced while it was down, and on, each once.
/// The source's start was checkpointed before it read (`reads_after_first_checkpoint`); before,
/// the new process found no checkpoint, resolved `latest` anew and skipped all of those (Flink
/// and Kafka Streams do the same).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_started_at_latest_and_killed_before_committing_starts_again_where_it_first_started() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique("latest-in"), unique("latest-out"));
    create_topic(env, &input, 1).await?;
    create_topic(env, &output, 1).await?;
    produce(env, &input, &[("k".into(), "old".into())])?;
    let dir = tempfile::tempdir()?;
    let (group, prefix) = (unique("g"), unique("latest"));
    let job = |interval| Job {
        group: group.clone(),
        prefix: prefix.clone(),
        start: Some(r#"{ type = "latest" }"#),
        interval,
        checkpoint_timeout: "2s",
        transaction_timeout: "10m",
        ..Job::new(&input, &output)
    };
    // The first process would checkpoint what it read after five minutes: it is killed long
    // before. The second one checkpoints every 200 ms.
    let first = job("5m").write(env, dir.path(), "first");
    let again = job("200ms").write(env, dir.path(), "again");

    // Input keeps arriving, n00000, n00001, … in one partition, from before the first start
    // until a second after the second one's.
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (feed, topic, stop) = (Feed::new(env)?, input.clone(), stop.clone());
        std::thread::spawn(move || -> Result<usize> {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                feed.send(&topic, &[("k".into(), format!("n{n:05}"))])?;
                n += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(n)
        })
    };
    let mut a = ChildJob::spawn(exactly(), &first, "")?;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let written = wait_for_uncommitted(env, &output, 5, Duration::from_secs(1))?.len();
        if written >= 5 {
            break;
        }
        if !a.running() || Instant::now() > deadline {
            bail!("the first process wrote {written} records:\n{}", a.tail(40));
        }
    }
    a.kill();
    let read_by_first: Vec<String> = read_uncommitted(env, &output, T)?
        .iter()
        .map(|r| r.value_str())
        .collect();
    assert!(
        read_committed(env, &output, T)?.is_empty(),
        "the first process committed nothing"
    );
    // Produced while no process runs.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut b = ChildJob::spawn(exactly(), &again, "")?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The feed ends: what it fed is known, and the marker below comes after all of it.
    stop.store(true, Ordering::SeqCst);
    let fed = feeder.join().map_err(|_| anyhow::anyhow!("the feeder panicked"))??;
    let from: usize = read_by_first[0]
        .strip_prefix('n')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("first record written: {:?}", read_by_first[0]))?;
    let expected: Vec<String> = (from..fed).map(|n| format!("n{n:05}")).collect();
    // Then a marker, again and again until one comes out: what was fed before it has been read.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        produce(env, &input, &[("k".into(), "end".into())])?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        if read_committed(env, &output, T)?.iter().any(|r| r.value_str() == "end") {
            break;
        }
        if !b.running() || Instant::now() > deadline {
            bail!("no marker came out:\n{}", b.tail(40));
        }
    }
    // A record committed twice would show meanwhile.
    tokio::time::sleep(Duration::from_secs(1)).await;
    b.kill();
    let committed: Vec<String> = read_committed(env, &output, T)?
        .iter()
        .map(|r| r.value_str())
        .filter(|v| v != "end")
        .collect();
    let missing: Vec<&String> = read_by_first.iter().filter(|v| !committed.contains(v)).collect();
    assert!(
        missing.is_empty(),
        "records the killed process read, never committed: {missing:?} (committed from {:?})",
        committed.first()
    );
    assert_eq!(
        committed, expected,
        "every record from the first start on, once, in order"
    );
    Ok(())
}
