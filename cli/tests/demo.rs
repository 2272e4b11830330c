//! The demo (`scripts/demo` runs this with its output shown): the example job files run as real
//! `exactly` processes on sample orders arriving throughout — Kafka to Kafka (paid orders, keyed by
//! customer) and Kafka to MySQL (every order a row, XA) — the Kafka-to-Kafka process is SIGKILLed
//! mid-run and restarted, both are stopped with SIGTERM, and the output is checked with an
//! independent read_committed consumer and SQL. Prints a summary.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use common::{checkpoints_completed, committed_records, orders, spawn_run, status, wait, wait_exit, Examples};
use exactly_integration_tests::{connect_mysql, produce, query_i64, read_committed, signal, TestEnv};

const TOTAL: u64 = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_orders_to_kafka_and_mysql_with_a_sigkill() -> Result<()> {
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let ex = Examples::prepare(env, dir.path(), "demo").await?;
    let Examples {
        k2k,
        k2m,
        k2k_port,
        k2m_port,
        ..
    } = ex.clone();
    let (orders_topic, paid_topic, table) = (ex.orders.clone(), ex.paid.clone(), ex.table.clone());

    // Sample orders arrive throughout.
    let produced = Arc::new(AtomicU64::new(0));
    let feeder = {
        let (env, topic, produced) = (env.clone(), orders_topic.clone(), produced.clone());
        std::thread::spawn(move || -> Result<()> {
            while produced.load(Ordering::Relaxed) < TOTAL {
                let first = produced.load(Ordering::Relaxed);
                produce(&env, &topic, &orders(first..first + 250))?;
                produced.store(first + 250, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(())
        })
    };
    let mut k2k_job = spawn_run(&k2k, &[], "")?;
    let mut k2m_job = spawn_run(&k2m, &[], "")?;

    // Mid-run, once a few checkpoints have committed output: SIGKILL the Kafka-to-Kafka process.
    wait(
        "the Kafka-to-Kafka job's third checkpoint",
        Duration::from_secs(120),
        || {
            if !k2k_job.running() {
                bail!("the job exited:\n{}", k2k_job.tail(30));
            }
            Ok(checkpoints_completed(k2k_port) >= Some(3))
        },
    )?;
    let before = status(k2k_port)?;
    k2k_job.kill();
    let killed_at = produced.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(1));
    let mut k2k_job = spawn_run(&k2k, &[], "")?;
    feeder.join().expect("feeder")?;

    let paid_expected = (0..TOTAL).filter(|i| i % 3 != 0).count();
    let mut sql = connect_mysql(env).await?;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let k2k_done = committed_records(k2k_port).is_some_and(|n| n >= TOTAL);
        let rows = query_i64(&mut sql, &format!("SELECT COUNT(*) FROM {table}"))
            .await
            .unwrap_or(0);
        if k2k_done && rows as u64 >= TOTAL {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the jobs did not finish: {rows} rows;\n{}\n---\n{}",
                k2k_job.tail(20),
                k2m_job.tail(20)
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let k2k_status = status(k2k_port)?;
    let k2m_status = status(k2m_port)?;
    signal(k2k_job.pid(), "TERM")?;
    signal(k2m_job.pid(), "TERM")?;
    wait_exit(&mut k2k_job, Duration::from_secs(30))?;
    wait_exit(&mut k2m_job, Duration::from_secs(30))?;

    // Independent checks: a read_committed consumer and SQL.
    let records = read_committed(env, &paid_topic, Duration::from_secs(60))?;
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &records {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap_or_default())?;
        assert_eq!(
            r.key.as_deref(),
            v["customer"].as_str().map(str::as_bytes),
            "keyed by customer"
        );
        *seen.entry(v["id"].as_u64().unwrap()).or_default() += 1;
    }
    let k2k_dup = seen.values().filter(|n| **n > 1).map(|n| n - 1).sum::<usize>();
    let k2k_missing = (0..TOTAL).filter(|i| i % 3 != 0 && !seen.contains_key(i)).count();
    let rows = query_i64(&mut sql, &format!("SELECT COUNT(*) FROM {table}")).await? as u64;
    let distinct = query_i64(&mut sql, &format!("SELECT COUNT(DISTINCT id) FROM {table}")).await? as u64;
    let k2m_dup = rows - distinct;
    let k2m_missing = TOTAL - distinct;

    println!();
    println!("demo summary ({TOTAL} sample orders; the Kafka-to-Kafka process SIGKILLed after {} checkpoints, at ~{killed_at} orders produced, and restarted)", before["checkpoints"]["completed"]);
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let row = |job: &str, out: u64, dup: u64, missing: u64, checkpoints: u64, kills: u64, restarts: u64| {
        println!("{job:<30} {TOTAL:>7} {out:>7} {dup:>11} {missing:>8} {checkpoints:>12} {kills:>7} {restarts:>9}");
    };
    println!(
        "{:<30} {:>7} {:>7} {:>11} {:>8} {:>12} {:>7} {:>9}",
        "job", "in", "out", "duplicates", "missing", "checkpoints", "killed", "restarts"
    );
    row(
        "kafka -> kafka (paid orders)",
        records.len() as u64,
        k2k_dup as u64,
        k2k_missing as u64,
        n(&before["checkpoints"]["completed"]) + n(&k2k_status["checkpoints"]["completed"]),
        1,
        n(&k2k_status["restarts"]),
    );
    row(
        "kafka -> mysql (XA)",
        rows,
        k2m_dup,
        k2m_missing,
        n(&k2m_status["checkpoints"]["completed"]),
        0,
        n(&k2m_status["restarts"]),
    );
    println!("verified with a read_committed consumer of {paid_topic} and SQL on table {table}");
    assert_eq!((k2k_dup, k2k_missing, records.len()), (0, 0, paid_expected));
    assert_eq!((k2m_dup, k2m_missing, rows), (0, 0, TOTAL));
    Ok(())
}
