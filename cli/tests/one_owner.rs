//! Operators' mistakes on one checkpoint location, against a real broker: the same job file
//! started twice while the first still runs (a double deployment, a pod rescheduled while the
//! old one lives), and a process restarted with the `--from` it was first started with (a
//! Kubernetes pod whose `FROM` is still set). Output checked with an independent read_committed
//! consumer: every order exactly once.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use common::{exactly, free_port, orders, spawn_run, wait_exit, wait_status, K2k};
use exactly_integration_tests::{create_topic, produce, read_committed, signal, unique, wait_for_committed, TestEnv};

/// Every order of `ids` in `topic` exactly once.
fn assert_exactly_once(env: &TestEnv, topic: &str, ids: std::ops::Range<u64>) {
    let records = read_committed(env, topic, Duration::from_secs(60)).expect("read_committed");
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &records {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        *seen.entry(v["id"].as_u64().unwrap()).or_default() += 1;
    }
    let duplicates: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).map(|(i, _)| *i).collect();
    let missing: Vec<_> = ids.clone().filter(|i| !seen.contains_key(i)).collect();
    assert!(
        duplicates.is_empty(),
        "{} duplicated: {:?}",
        duplicates.len(),
        &duplicates[..duplicates.len().min(20)]
    );
    assert!(
        missing.is_empty(),
        "missing {}: {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    assert_eq!(seen.len() as u64, ids.end - ids.start);
}

/// The job file of `file` with its admin port changed: a second deployment of the same job.
fn with_admin_port(file: &Path, from: u16, to: u16, dir: &Path) -> Result<std::path::PathBuf> {
    let text = std::fs::read_to_string(file)?;
    let old = format!("127.0.0.1:{from}");
    assert!(text.contains(&old));
    let copy = dir.join("second.toml");
    std::fs::write(&copy, text.replace(&old, &format!("127.0.0.1:{to}")))?;
    Ok(copy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_job_started_twice_refuses_the_second_and_duplicates_nothing() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique("owner-in"), unique("owner-out"));
    create_topic(env, &input, 2).await?;
    create_topic(env, &output, 2).await?;
    let dir = tempfile::tempdir()?;
    let (port, second_port) = (free_port(), free_port());
    let file = K2k {
        env,
        name: &unique("owner"),
        input: &input,
        output: &output,
        prefix: &unique("owner-txn"),
        dir: dir.path(),
        parallelism: 2,
        admin: Some(port),
        transforms: "",
    }
    .write();
    let second = with_admin_port(&file, port, second_port, dir.path())?;
    produce(env, &input, &orders(0..1000))?;
    let mut first = spawn_run(&file, &[], "")?;
    wait_status(&mut first, port, "1000 records read", Duration::from_secs(60), |s| {
        s["records_in"].as_u64() >= Some(1000) && s["checkpoints"]["completed"].as_u64() >= Some(2)
    })?;

    // The same job again while input flows: it must refuse, naming the first, and touch nothing.
    produce(env, &input, &orders(1000..2000))?;
    let mut again = spawn_run(&second, &["--no-progress"], "")?;
    wait_exit(&mut again, Duration::from_secs(60))?;
    let said = again.tail(30);
    assert!(
        again.exit_code().is_some_and(|c| c != 0),
        "refused with an error: {said}"
    );
    assert!(
        said.contains("checkpoint location of another run") && said.contains(&format!("process {}", first.pid())),
        "{said}"
    );
    produce(env, &input, &orders(2000..3000))?;
    wait_status(&mut first, port, "3000 records read", Duration::from_secs(60), |s| {
        s["records_in"].as_u64() >= Some(3000)
    })?;
    assert!(first.running(), "the first run goes on:\n{}", first.tail(30));
    signal(first.pid(), "TERM")?;
    wait_exit(&mut first, Duration::from_secs(60))?;
    assert_exactly_once(env, &output, 0..3000);
    let owner: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("checkpoints/_owner"))?)?;
    assert_eq!(
        owner["released"], true,
        "the first gave up its claim as it ended: {owner}"
    );

    // The first ended and gave up its claim: the second deployment now starts and continues.
    produce(env, &input, &orders(3000..3500))?;
    let mut next = spawn_run(&second, &["--no-progress"], "")?;
    wait_status(
        &mut next,
        second_port,
        "the 500 new records",
        Duration::from_secs(60),
        |s| s["records_in"].as_u64() >= Some(500) && s["checkpoints"]["completed"].as_u64() >= Some(1),
    )?;
    signal(next.pid(), "TERM")?;
    wait_exit(&mut next, Duration::from_secs(60))?;
    assert_exactly_once(env, &output, 0..3500);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_restarted_with_the_same_from_continues_where_it_left_off() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique("same-from-in"), unique("same-from-out"));
    create_topic(env, &input, 2).await?;
    create_topic(env, &output, 2).await?;
    let dir = tempfile::tempdir()?;
    let port = free_port();
    let file = K2k {
        env,
        name: &unique("same-from"),
        input: &input,
        output: &output,
        prefix: &unique("same-from-txn"),
        dir: dir.path(),
        parallelism: 2,
        admin: Some(port),
        transforms: "",
    }
    .write();
    produce(env, &input, &orders(0..1000))?;
    let mut job = spawn_run(&file, &[], "")?;
    wait_status(&mut job, port, "1000 records read", Duration::from_secs(60), |s| {
        s["records_in"].as_u64() >= Some(1000) && s["checkpoints"]["completed"].as_u64() >= Some(1)
    })?;
    let admin = format!("127.0.0.1:{port}");
    let stopped = std::process::Command::new(exactly())
        .args(["stop", "--admin", &admin, "--savepoint", "upgrade"])
        .output()?;
    assert!(stopped.status.success(), "{}", String::from_utf8_lossy(&stopped.stderr));
    let savepoint = String::from_utf8_lossy(&stopped.stdout).trim().to_owned();
    wait_exit(&mut job, Duration::from_secs(60))?;

    // The StatefulSet's command line: `exactly run FILE ... --from "$FROM"`, FROM still set.
    let args = ["--log-format", "json", "--from", savepoint.as_str()];
    produce(env, &input, &orders(1000..2000))?;
    let mut job = spawn_run(&file, &args, "")?;
    wait_status(&mut job, port, "the 1000 new records", Duration::from_secs(60), |s| {
        s["records_in"].as_u64() >= Some(1000) && s["checkpoints"]["completed"].as_u64() >= Some(2)
    })?;
    // The pod dies; Kubernetes starts it again with the same command line — after the savepoint
    // was cleaned up, even.
    signal(job.pid(), "KILL")?;
    wait_exit(&mut job, Duration::from_secs(30))?;
    std::fs::remove_dir_all(&savepoint)?;
    produce(env, &input, &orders(2000..3000))?;
    let mut job = spawn_run(&file, &args, "")?;
    wait_status(
        &mut job,
        port,
        "a checkpoint after the restart",
        Duration::from_secs(90),
        |s| s["checkpoints"]["completed"].as_u64() >= Some(1),
    )?;
    let written = wait_for_committed(env, &output, 3000, Duration::from_secs(90))?;
    assert!(
        written.len() >= 3000,
        "{} of 3000 written:\n{}",
        written.len(),
        job.tail(30)
    );
    let said = job.tail(usize::MAX);
    assert!(said.contains("Already restored from this snapshot"), "{said}");
    signal(job.pid(), "TERM")?;
    wait_exit(&mut job, Duration::from_secs(60))?;
    assert_exactly_once(env, &output, 0..3000);
    Ok(())
}
