//! One job, two exactly-once sinks on one checkpoint (`examples/orders-fan-out.toml`: paid orders
//! to a topic, every order to a table), run as an `exactly` process with orders arriving and
//! SIGKILLed at every two-phase fail point of each sink — including between one sink's commit and
//! the other's, both ways, and during the restart's recovery commits. Then both outputs are
//! checked against the input as it is in Kafka, by a read_committed consumer, by SQL on a table
//! without a primary key (a duplicate is a second row), and by `exactly verify`.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Result};
use common::{committed_records, exactly, example, free_port, spawn_run, status, wait, wait_exit, OrderFeeder};
use exactly_integration_tests::{
    connect_mysql, create_topic, execute, query_pairs, read_committed, signal, unique, TestEnv,
};
use serde_json::Value;

const KAFKA: &str = "paid-orders";
const TABLE: &str = "orders-table";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sinks_on_one_checkpoint_are_each_exactly_once_across_sigkills() -> Result<()> {
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let run = unique("fan-out");
    let (orders, paid) = (format!("{run}-orders"), format!("{run}-paid"));
    for t in [&orders, &paid] {
        create_topic(env, t, 3).await?;
    }
    let table = run.replace('-', "_");
    let mut sql = connect_mysql(env).await?;
    // No primary key: a duplicate shows as a second row.
    execute(
        &mut sql,
        &format!(
            "CREATE TABLE `{table}` (`id` BIGINT NOT NULL, `customer` VARCHAR(64) NOT NULL, \
             `amount` DOUBLE NOT NULL, `status` VARCHAR(16) NOT NULL) ENGINE=InnoDB"
        ),
    )
    .await?;
    let port = free_port();
    let job = example(
        "orders-fan-out.toml",
        dir.path(),
        env,
        &[
            ("topics = [\"orders\"]", format!("topics = [\"{orders}\"]")),
            ("topic = \"paid-orders\"", format!("topic = \"{paid}\"")),
            ("table = \"orders_all\"", format!("table = \"{table}\"")),
            (
                "/tmp/exactly/orders-fan-out",
                dir.path().join("checkpoints").display().to_string(),
            ),
            ("127.0.0.1:9251", format!("127.0.0.1:{port}")),
            (
                "transactional_id_prefix = \"orders-fan-out\"",
                format!("transactional_id_prefix = \"{run}\""),
            ),
            ("job_id = \"orders-fan-out\"", format!("job_id = \"{run}\"")),
            ("group_id = \"orders-fan-out\"", format!("group_id = \"{run}\"")),
            // Restarts within a second, as the crash tests' other jobs.
            ("initial_delay = \"1s\"", "initial_delay = \"200ms\"".into()),
        ],
    )?;

    // Each sink's own fail points (`<sink>:<point>`), and the job's.
    let steps: &[(&str, &str)] = &[
        (
            "paid-orders:sink.before_pre_commit",
            "paid-orders:sink.before_pre_commit=freeze@4",
        ),
        (
            "paid-orders:sink.in_background_pre_commit",
            "paid-orders:sink.in_background_pre_commit=freeze@3",
        ),
        (
            "orders-table:sink.after_pre_commit",
            "orders-table:sink.after_pre_commit=freeze@3",
        ),
        ("checkpoint.after_durable", "checkpoint.after_durable=freeze@3"),
        // The topic committed a checkpoint, the table not yet (its commits wait 3 s)...
        (
            "paid-orders:sink.after_commit",
            "paid-orders:sink.after_commit=freeze@4;orders-table:sink.before_commit=delay@3s",
        ),
        // ...and the other way round.
        (
            "orders-table:sink.after_commit",
            "orders-table:sink.after_commit=freeze@4;paid-orders:sink.before_commit=delay@3s",
        ),
        // The restart after a kill with transactions pending dies before committing them.
        (
            "orders-table:sink.before_recovery_commit",
            "orders-table:sink.before_recovery_commit=freeze@1",
        ),
        (
            "paid-orders:sink.before_recovery_commit",
            "paid-orders:sink.before_recovery_commit=freeze@1",
        ),
    ];
    let mut next_id = 0;
    for (point, spec) in steps {
        let feeder = OrderFeeder::start_at(env, &orders, next_id, 60, Duration::from_millis(100));
        let mut job = spawn_run(&job, &[], spec)?;
        let reached = job.wait_for_failpoint(point, Duration::from_secs(90));
        job.kill();
        next_id = feeder.finish()?;
        reached.map_err(|e| anyhow::anyhow!("{e}\n{}", job.tail(60)))?;
        eprintln!("killed at {point} ({next_id} orders so far)");
    }

    // A last run without fail points catches up; SIGTERM ends it with a final checkpoint.
    let mut last = spawn_run(&job, &[], "")?;
    wait("the job to commit every input offset", Duration::from_secs(180), || {
        if !last.running() {
            bail!("the job exited:\n{}", last.tail(40));
        }
        Ok(committed_records(port) >= Some(next_id))
    })?;
    let s = status(port)?;
    signal(last.pid(), "TERM")?;
    wait_exit(&mut last, Duration::from_secs(60))?;
    assert_eq!(last.exit_code(), Some(0), "{}", last.tail(40));
    let names: Vec<&str> = s["sinks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|k| k["name"].as_str())
        .collect();
    assert_eq!(names, [TABLE, KAFKA], "per-sink status: {s:#}");
    assert!(
        s["sinks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|k| k["transactions_committed"].as_u64() > Some(0)),
        "{s:#}"
    );
    let log = last.log(100_000);
    assert!(!log.contains("DATA LOST"), "{log}");

    // The input as it is in Kafka (a feeder batch sent twice is in it twice).
    let mut input: BTreeMap<u64, (usize, bool)> = BTreeMap::new();
    for r in read_committed(env, &orders, Duration::from_secs(60))? {
        let v: Value = serde_json::from_slice(r.value.as_deref().unwrap_or_default())?;
        let e = input
            .entry(v["id"].as_u64().unwrap())
            .or_insert((0, v["status"] == "paid"));
        e.0 += 1;
    }
    assert_eq!(input.len() as u64, next_id, "every order id fed is in the input");
    let mut topic: BTreeMap<u64, usize> = BTreeMap::new();
    for r in read_committed(env, &paid, Duration::from_secs(60))? {
        let v: Value = serde_json::from_slice(r.value.as_deref().unwrap_or_default())?;
        assert_eq!(
            r.key.as_deref(),
            v["customer"].as_str().map(str::as_bytes),
            "keyed by customer"
        );
        *topic.entry(v["id"].as_u64().unwrap()).or_default() += 1;
    }
    let rows: BTreeMap<u64, usize> = query_pairs(&mut sql, &format!("SELECT id, COUNT(*) FROM `{table}` GROUP BY id"))
        .await?
        .into_iter()
        .map(|(id, n)| (id as u64, n as usize))
        .collect();
    let paid_expected: BTreeMap<u64, usize> = input
        .iter()
        .filter(|(_, (_, p))| *p)
        .map(|(id, (n, _))| (*id, *n))
        .collect();
    let all_expected: BTreeMap<u64, usize> = input.iter().map(|(id, (n, _))| (*id, *n)).collect();
    assert_eq!(
        diff(&paid_expected, &topic),
        Vec::<String>::new(),
        "the paid-orders topic"
    );
    assert_eq!(diff(&all_expected, &rows), Vec::<String>::new(), "the table");

    // `exactly verify` agrees, for each sink, with the job's transforms deciding what is expected.
    let verify = |output: String, sink: &str| -> Result<(i32, Value)> {
        let out = Command::new(exactly())
            .args([
                "verify", "--source", &orders, "--output", &output, "--id", "id", "--json",
            ])
            .args(["--job", &job.display().to_string(), "--sink", sink])
            .output()?;
        let report = serde_json::from_slice(&out.stdout)
            .map_err(|e| anyhow::anyhow!("{e}: {}", String::from_utf8_lossy(&out.stderr)))?;
        Ok((out.status.code().unwrap_or(-1), report))
    };
    let (code, r) = verify(format!("topic:{paid}"), KAFKA)?;
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(
        r["expected"].as_u64(),
        Some(paid_expected.values().sum::<usize>() as u64),
        "{r:#}"
    );
    let (code, r) = verify(format!("mysql:{table}"), TABLE)?;
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(
        r["output_records"].as_u64(),
        Some(all_expected.values().sum::<usize>() as u64),
        "{r:#}"
    );
    // Checked against the table's sink, the topic lacks the orders that are not paid.
    let (code, r) = verify(format!("topic:{paid}"), TABLE)?;
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(
        r["lost"].as_u64(),
        Some((all_expected.len() - paid_expected.len()) as u64),
        "{r:#}"
    );
    Ok(())
}

/// What differs between expected and seen counts per id (first 10).
fn diff(expected: &BTreeMap<u64, usize>, seen: &BTreeMap<u64, usize>) -> Vec<String> {
    let mut out = Vec::new();
    for (id, n) in expected {
        let s = seen.get(id).copied().unwrap_or(0);
        if s != *n {
            out.push(format!("id {id}: {s} instead of {n}"));
        }
    }
    for (id, s) in seen {
        if !expected.contains_key(id) {
            out.push(format!("id {id}: {s} but not in the input"));
        }
    }
    out.truncate(10);
    out
}
