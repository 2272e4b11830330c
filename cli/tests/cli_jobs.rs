//! The command against a real broker: run a job file, watch it through the admin endpoint, take a
//! savepoint, stop with one, inspect it, resume from it; list and abort hanging transactions
//! while sparing the one a checkpoint still has to commit. Output checked with an independent
//! read_committed consumer.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use assert_cmd::Command;
use common::{free_port, orders, spawn_run, status, wait_exit, wait_status, K2k};
use exactly_integration_tests::{create_topic, produce, read_committed, signal, unique, wait_for_committed, TestEnv};

#[path = "cli_jobs/txn_tool.rs"]
mod txn_tool;

fn cmd() -> Command {
    Command::cargo_bin("exactly").expect("binary built")
}

fn stdout(c: &mut Command) -> String {
    let out = c.assert().success();
    String::from_utf8_lossy(&out.get_output().stdout).trim().to_owned()
}

const PAID_KEYED_BY_CUSTOMER: &str = r#"
[[transform]]
type = "filter"
field = "status"
equals = "paid"

[[transform]]
type = "key"
field = "customer"
"#;

/// Paid orders of `ids`, each exactly once, keyed by customer, in id order per customer.
fn assert_paid_exactly_once(env: &TestEnv, topic: &str, ids: std::ops::Range<u64>) {
    let records = read_committed(env, topic, Duration::from_secs(60)).expect("read_committed");
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    let mut per_key: BTreeMap<(i32, Vec<u8>), Vec<u64>> = BTreeMap::new();
    for r in &records {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let id = v["id"].as_u64().unwrap();
        assert_eq!(v["status"], "paid", "{v}");
        assert_eq!(
            r.key.as_deref(),
            Some(v["customer"].as_str().unwrap().as_bytes()),
            "{v}"
        );
        *seen.entry(id).or_default() += 1;
        per_key
            .entry((r.partition, r.key.clone().unwrap()))
            .or_default()
            .push(id);
    }
    let expected: Vec<u64> = ids.filter(|i| i % 3 != 0).collect();
    let duplicates: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).map(|(i, _)| *i).collect();
    let missing: Vec<_> = expected.iter().filter(|i| !seen.contains_key(i)).collect();
    assert!(duplicates.is_empty(), "duplicates: {duplicates:?}");
    assert!(
        missing.is_empty(),
        "missing {} of {}: {:?}",
        missing.len(),
        expected.len(),
        &missing[..missing.len().min(20)]
    );
    assert_eq!(seen.len(), expected.len());
    for (k, ids) in per_key {
        // One input partition per key here (the input is keyed by id, the output by customer):
        // order holds per input partition, so check only that nothing is duplicated per key.
        let mut sorted = ids.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len(), "key {k:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_status_savepoint_stop_inspect_and_resume() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique("cli-in"), unique("cli-out"));
    create_topic(env, &input, 3).await?;
    create_topic(env, &output, 3).await?;
    let dir = tempfile::tempdir()?;
    let port = free_port();
    let file = K2k {
        env,
        name: &unique("cli-job"),
        input: &input,
        output: &output,
        prefix: &unique("cli-txn"),
        dir: dir.path(),
        parallelism: 2,
        admin: Some(port),
        transforms: PAID_KEYED_BY_CUSTOMER,
    }
    .write();
    produce(env, &input, &orders(0..3000))?;
    let mut job = spawn_run(&file, &[], "")?;
    wait_status(&mut job, port, "3000 records read", Duration::from_secs(60), |s| {
        s["records_in"].as_u64() >= Some(3000) && s["checkpoints"]["completed"].as_u64() >= Some(2)
    })?;
    let admin = format!("127.0.0.1:{port}");
    let s: serde_json::Value = serde_json::from_str(&stdout(cmd().args(["status", "--admin", &admin])))?;
    assert_eq!(s["records_filtered"], 1000, "{s}");
    assert_eq!(s["partitions"].as_array().map(Vec::len), Some(3), "{s}");
    let metrics = exactly_cli::admin::get_text(&admin, "/metrics")?;
    assert!(
        metrics.contains(&format!(
            "exactly_records_filtered_total{{job=\"{}\"}} 1000",
            s["job"].as_str().unwrap()
        )),
        "{metrics}"
    );
    assert!(metrics.contains("exactly_source_partition_position{"), "{metrics}");
    // The live page and the latest checkpoints it shows.
    let page = exactly_cli::admin::get_text(&admin, "/")?;
    assert!(
        page.contains("<title>exactly</title>") && page.contains("fetch(\"status\""),
        "{page}"
    );
    let latest = exactly_cli::admin::get(&admin, "/checkpoints")?;
    let latest = latest.as_array().expect("a list");
    assert!(!latest.is_empty() && latest.len() <= 5, "{latest:?}");
    let newest = latest.last().unwrap();
    assert_eq!(newest["kind"], "checkpoint", "{newest}");
    assert_eq!(newest["offsets"].as_array().map(Vec::len), Some(3), "{newest}");
    let shown = exactly_cli::admin::get_text(&admin, "/job")?;
    assert_eq!(shown, exactly_cli::jobfile::masked(&std::fs::read_to_string(&file)?));
    assert!(shown.contains("[source]"), "{shown}");

    let savepoint = stdout(cmd().args(["savepoint", "--admin", &admin]));
    assert!(
        std::path::Path::new(&savepoint).join("_metadata").is_file(),
        "{savepoint}"
    );

    produce(env, &input, &orders(3000..6000))?;
    wait_status(&mut job, port, "6000 records read", Duration::from_secs(60), |s| {
        s["records_in"].as_u64() >= Some(6000)
    })?;
    // A savepoint path is taken under the job's savepoint root; one leaving it is refused.
    let outside = dir.path().join("elsewhere");
    let refused = cmd()
        .args(["stop", "--admin", &admin, "--savepoint"])
        .arg(&outside)
        .output()?;
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("savepoints are written only under"),
        "{said}"
    );
    let stop_dir = dir.path().join("checkpoints").join("savepoints").join("stopped");
    let stopped = stdout(cmd().args(["stop", "--admin", &admin, "--savepoint", "stopped"]));
    assert!(stopped.starts_with(&stop_dir.display().to_string()), "{stopped}");
    wait_exit(&mut job, Duration::from_secs(30))?;
    assert!(job.tail(5).contains("Job ended."), "{}", job.tail(20));
    // Its last line reads as words and numbers (it said `latest_checkpoint=Some(3)` before).
    let ended = job.tail(5);
    let line = ended.lines().find(|l| l.contains("Job ended.")).unwrap_or_default();
    assert!(
        line.contains(" latest_checkpoint=") && !line.contains("Some(") && !line.contains("=None"),
        "{line}"
    );

    // list and inspect what the job left.
    let listed = stdout(cmd().args(["checkpoints", "list"]).arg(dir.path()));
    assert!(listed.contains("savepoint") && listed.contains(&stopped), "{listed}");
    let inspected: serde_json::Value =
        serde_json::from_str(&stdout(cmd().args(["checkpoints", "inspect", "--json"]).arg(&stopped)))?;
    let next: i64 = inspected["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["next_offset"].as_i64().unwrap())
        .sum();
    assert_eq!(next, 6000, "{inspected}");
    assert_eq!(inspected["kind"], "savepoint");
    // Each offset with the topic's ID then (a recreated topic would have another).
    let id = inspected["offsets"][0]["topic_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(id.len(), 36, "a topic ID: {inspected}");
    let text = stdout(cmd().args(["checkpoints", "inspect"]).arg(&stopped));
    assert!(
        text.contains("source offsets") && text.contains(&format!("{input}-0")) && text.contains(&id),
        "{text}"
    );

    // Resume from the savepoint with more input; SIGTERM ends it with a final checkpoint.
    produce(env, &input, &orders(6000..9000))?;
    let mut job = spawn_run(&file, &["--from", &stopped], "")?;
    wait_status(&mut job, port, "the 3000 new records", Duration::from_secs(60), |s| {
        s["records_in"].as_u64() >= Some(3000) && s["checkpoints"]["completed"].as_u64() >= Some(1)
    })?;
    assert_eq!(
        status(port)?["records_in"],
        3000,
        "resumed from the savepoint, not from the start"
    );
    signal(job.pid(), "TERM")?;
    wait_exit(&mut job, Duration::from_secs(30))?;
    assert!(job.tail(10).contains("Final checkpoint complete."), "{}", job.tail(20));

    assert_paid_exactly_once(env, &output, 0..9000);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagen_writes_the_orders_and_creates_topics() -> Result<()> {
    let env = TestEnv::get().await?;
    let (topic, extra) = (unique("gen"), unique("gen-extra"));
    let out = stdout(cmd().args([
        "datagen",
        "--bootstrap",
        &env.kafka_bootstrap,
        "--topic",
        &topic,
        "--count",
        "500",
        "--first",
        "100",
        "--create",
        &extra,
    ]));
    assert!(out.contains("500 orders (100..600)"), "{out}");
    let records = read_committed(env, &topic, Duration::from_secs(60))?;
    let mut ids: Vec<u64> = records
        .iter()
        .map(|r| {
            serde_json::from_slice::<serde_json::Value>(r.value.as_deref().unwrap()).unwrap()["id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (100..600).collect::<Vec<_>>());
    assert!(
        read_committed(env, &extra, Duration::from_secs(60))?.is_empty(),
        "created, empty"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_cancels_and_logs_can_be_json() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique("term-in"), unique("term-out"));
    create_topic(env, &input, 1).await?;
    create_topic(env, &output, 1).await?;
    let dir = tempfile::tempdir()?;
    let port = free_port();
    let file = K2k {
        env,
        name: &unique("term-job"),
        input: &input,
        output: &output,
        prefix: &unique("term-txn"),
        dir: dir.path(),
        parallelism: 1,
        admin: Some(port),
        transforms: "",
    }
    .write();
    produce(env, &input, &orders(0..100))?;
    // Every pre-commit takes 3 s, so the final checkpoint a SIGTERM asks for is still running
    // when the second SIGTERM comes.
    let mut job = spawn_run(&file, &["--log-format", "json"], "sink.before_pre_commit=delay@3s")?;
    wait_status(&mut job, port, "the job answering", Duration::from_secs(60), |s| {
        s["records_in"].as_u64() >= Some(100)
    })?;
    signal(job.pid(), "TERM")?;
    std::thread::sleep(Duration::from_millis(300));
    signal(job.pid(), "TERM")?;
    wait_exit(&mut job, Duration::from_secs(30))?;
    assert_eq!(
        job.exit_code(),
        Some(3),
        "a job ending without its final checkpoint exits non-zero"
    );
    let log = job.tail(200);
    assert!(log.contains("Aborting: no final checkpoint"), "{log}");
    assert!(log.contains("\"cancelled\":true"), "{log}");
    for line in log
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("FAILPOINT"))
    {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| anyhow::anyhow!("{e}: {line}"))?;
        assert!(v.get("level").is_some() && v.get("fields").is_some(), "{line}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_terminal_run_draws_a_progress_line() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique("tty-in"), unique("tty-out"));
    create_topic(env, &input, 1).await?;
    create_topic(env, &output, 1).await?;
    let dir = tempfile::tempdir()?;
    let name = unique("tty-job");
    let file = K2k {
        env,
        name: &name,
        input: &input,
        output: &output,
        prefix: &unique("tty-txn"),
        dir: dir.path(),
        parallelism: 1,
        admin: None,
        transforms: "",
    }
    .write();
    produce(env, &input, &orders(0..100))?;
    // `script` gives the job a terminal; SIGTERM after 5 s stops it gracefully.
    let inner = format!("timeout -s TERM 5 {} run {}", common::exactly(), file.display());
    let out = std::process::Command::new("script")
        .args(["-qefc", &inner, "/dev/null"])
        .env_remove("RUST_LOG")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains(&format!("\r\x1b[2K{name} | in ")),
        "no progress line in:\n{text}"
    );
    assert!(text.contains("| checkpoint #"), "{text}");
    assert!(text.contains("job ended:"), "{text}");
    Ok(())
}

/// Restore never guesses. A flipped byte in the newest checkpoint's `_metadata` used to make the
/// job fall back to the previous checkpoint and write its output again (exit status 0); a
/// checkpoint directory emptied by accident used to start over from `source.start`. Both now stop
/// with an error that names the checkpoint or directory and the way out, and write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_vanished_checkpoint_stops_the_job_instead_of_replaying() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique("cli-corrupt-in"), unique("cli-corrupt-out"));
    create_topic(env, &input, 2).await?;
    create_topic(env, &output, 2).await?;
    let dir = tempfile::tempdir()?;
    let port = free_port();
    let file = K2k {
        env,
        name: &unique("cli-corrupt"),
        input: &input,
        output: &output,
        prefix: &unique("cli-corrupt-txn"),
        dir: dir.path(),
        parallelism: 1,
        admin: Some(port),
        transforms: PAID_KEYED_BY_CUSTOMER,
    }
    .write();
    produce(env, &input, &orders(0..1500))?;
    let mut job = spawn_run(&file, &[], "")?;
    wait_status(&mut job, port, "1500 records read", Duration::from_secs(60), |s| {
        s["records_in"].as_u64() >= Some(1500) && s["checkpoints"]["completed"].as_u64() >= Some(2)
    })?;
    signal(job.pid(), "TERM")?;
    wait_exit(&mut job, Duration::from_secs(60))?;
    assert_paid_exactly_once(env, &output, 0..1500);

    let checkpoints = dir.path().join("checkpoints");
    let newest = exactly_integration_tests::damage_newest_checkpoint(&checkpoints)?;
    let out = cmd()
        .args(["run", file.to_str().unwrap(), "--no-progress"])
        .timeout(Duration::from_secs(120))
        .assert()
        .failure();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        stderr.contains(&format!("the newest checkpoint, {newest} in")) && stderr.contains("--accept-replay"),
        "{stderr}"
    );
    assert_paid_exactly_once(env, &output, 0..1500);

    // Every checkpoint gone: refuse rather than start from the beginning of the topic.
    for e in std::fs::read_dir(&checkpoints)? {
        let p = e?.path();
        if p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("chk-"))
        {
            std::fs::remove_dir_all(p)?;
        }
    }
    let out = cmd()
        .args(["run", file.to_str().unwrap(), "--no-progress"])
        .timeout(Duration::from_secs(120))
        .assert()
        .failure();
    let stderr = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        stderr.contains("has held completed checkpoints") && stderr.contains(&checkpoints.display().to_string()),
        "{stderr}"
    );
    assert_paid_exactly_once(env, &output, 0..1500);
    Ok(())
}
