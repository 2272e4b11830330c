//! One job split over three processes (`--subtasks` ranges of parallelism 6), input arriving
//! throughout, one process SIGKILLed mid-run and restarted: the read_committed output holds every
//! input record exactly once.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use common::{orders, spawn_run, wait_exit, K2k};
use exactly_integration_tests::{create_topic, produce, read_committed, signal, unique, wait_for_committed, TestEnv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_one_killed_and_restarted_exactly_once() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique("scale-in"), unique("scale-out"));
    create_topic(env, &input, 6).await?;
    create_topic(env, &output, 6).await?;
    let dir = tempfile::tempdir()?;
    let file = K2k {
        env,
        name: &unique("scale"),
        input: &input,
        output: &output,
        prefix: &unique("scale-txn"),
        dir: dir.path(),
        parallelism: 6,
        admin: None,
        transforms: "",
    }
    .write();
    let ranges = ["0..1", "2..3", "4..5"];
    let start = |r: &str| spawn_run(&file, &["--subtasks", r, "--parallelism", "6"], "");
    let mut jobs = ranges.iter().map(|r| start(r)).collect::<Result<Vec<_>>>()?;

    const TOTAL: u64 = 8000;
    let produced = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (env, input, produced, done) = (env.clone(), input.clone(), produced.clone(), done.clone());
        std::thread::spawn(move || -> Result<()> {
            while produced.load(Ordering::Relaxed) < TOTAL {
                let first = produced.load(Ordering::Relaxed);
                produce(&env, &input, &orders(first..first + 100))?;
                produced.store(first + 100, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(60));
            }
            done.store(true, Ordering::Relaxed);
            Ok(())
        })
    };
    // Mid-run: kill the middle process, keep it down a moment, restart it.
    while produced.load(Ordering::Relaxed) < TOTAL / 3 {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(700));
    jobs[1].kill();
    // A process with a range overlapping another's checkpoints is refused.
    let mut overlapping = spawn_run(&file, &["--subtasks", "1..2", "--parallelism", "6"], "")?;
    wait_exit(&mut overlapping, Duration::from_secs(30))?;
    assert!(
        overlapping.tail(5).contains("overlapping 1..2"),
        "{}",
        overlapping.tail(10)
    );
    std::thread::sleep(Duration::from_millis(800));
    jobs[1] = start(ranges[1])?;
    feeder.join().expect("feeder")?;
    assert!(done.load(Ordering::Relaxed));

    let seen = wait_for_committed(env, &output, TOTAL as usize, Duration::from_secs(120))?;
    assert!(
        seen.len() >= TOTAL as usize,
        "{} of {TOTAL} committed;\n{}",
        seen.len(),
        jobs.iter().map(|j| j.tail(15)).collect::<Vec<_>>().join("\n---\n")
    );
    for j in &jobs {
        signal(j.pid(), "TERM")?;
    }
    for j in &mut jobs {
        wait_exit(j, Duration::from_secs(30))?;
        assert!(j.tail(10).contains("Job ended."), "{}", j.tail(20));
    }
    for r in ["subtasks-0-1-of-6", "subtasks-2-3-of-6", "subtasks-4-5-of-6"] {
        assert!(dir.path().join("checkpoints").join(r).is_dir(), "{r}");
    }

    let records = read_committed(env, &output, Duration::from_secs(60))?;
    let mut count: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &records {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap())?;
        *count.entry(v["id"].as_u64().unwrap()).or_default() += 1;
    }
    let duplicates: Vec<_> = count.iter().filter(|(_, n)| **n > 1).map(|(i, _)| *i).collect();
    let missing: Vec<_> = (0..TOTAL).filter(|i| !count.contains_key(i)).collect();
    assert!(
        duplicates.is_empty(),
        "duplicates: {:?}",
        &duplicates[..duplicates.len().min(20)]
    );
    assert!(missing.is_empty(), "missing: {:?}", &missing[..missing.len().min(20)]);
    assert_eq!(records.len() as u64, TOTAL);
    Ok(())
}
