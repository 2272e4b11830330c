//! The demo (`scripts/demo` runs this with its output shown): example job files run as real
//! `exactly` processes on sample orders arriving throughout — Kafka to Kafka (paid orders, keyed by
//! customer), and one job with two sinks on one checkpoint (paid orders to a topic, every order a
//! row of a table, XA) — each process is SIGKILLed mid-run and restarted, both are stopped with
//! SIGTERM, and the outputs are checked with an independent read_committed consumer and SQL, and
//! with `exactly verify`, whose reports are printed. Prints a summary.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use common::{
    checkpoints_completed, committed_records, orders, spawn_run, status, verify_report, wait, wait_exit, Examples,
};
use exactly_integration_tests::{connect_mysql, produce, query_i64, read_committed, signal, TestEnv};

const TOTAL: u64 = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_orders_to_kafka_and_mysql_with_sigkills() -> Result<()> {
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let ex = Examples::prepare(env, dir.path(), "demo").await?;
    let Examples {
        k2k,
        k2k_port,
        fan_out,
        fan_out_port,
        ..
    } = ex.clone();
    let (orders_topic, paid_topic) = (ex.orders.clone(), ex.paid.clone());
    let (fan_paid, table) = (ex.fan_paid.clone(), ex.fan_table.clone());

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
    let mut fan_job = spawn_run(&fan_out, &[], "")?;

    // Mid-run, once a few checkpoints have committed output: SIGKILL each process, then start it
    // again.
    let kill_and_restart = |job: &mut exactly_integration_tests::ChildJob,
                            port: u16,
                            file: &std::path::Path,
                            what: &str|
     -> Result<(serde_json::Value, u64)> {
        wait(
            &format!("the {what} job's third checkpoint"),
            Duration::from_secs(120),
            || {
                if !job.running() {
                    bail!("the job exited:\n{}", job.tail(30));
                }
                Ok(checkpoints_completed(port) >= Some(3))
            },
        )?;
        let before = status(port)?;
        job.kill();
        let killed_at = produced.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs(1));
        *job = spawn_run(file, &[], "")?;
        Ok((before, killed_at))
    };
    let (before, killed_at) = kill_and_restart(&mut k2k_job, k2k_port, &k2k, "Kafka-to-Kafka")?;
    let (fan_before, fan_killed_at) = kill_and_restart(&mut fan_job, fan_out_port, &fan_out, "fan-out")?;
    feeder.join().expect("feeder")?;

    let paid_expected = (0..TOTAL).filter(|i| i % 3 != 0).count();
    let mut sql = connect_mysql(env).await?;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let k2k_done = committed_records(k2k_port).is_some_and(|n| n >= TOTAL);
        let fan_done = committed_records(fan_out_port).is_some_and(|n| n >= TOTAL);
        if k2k_done && fan_done {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the jobs did not finish;\n{}\n---\n{}",
                k2k_job.tail(20),
                fan_job.tail(20)
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let k2k_status = status(k2k_port)?;
    let fan_status = status(fan_out_port)?;
    signal(k2k_job.pid(), "TERM")?;
    signal(fan_job.pid(), "TERM")?;
    wait_exit(&mut k2k_job, Duration::from_secs(30))?;
    wait_exit(&mut fan_job, Duration::from_secs(30))?;

    // Independent checks: a read_committed consumer and SQL.
    let paid_check = |topic: &str| -> Result<(usize, usize, usize)> {
        let records = read_committed(env, topic, Duration::from_secs(60))?;
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
        let dup = seen.values().filter(|n| **n > 1).map(|n| n - 1).sum::<usize>();
        let missing = (0..TOTAL).filter(|i| i % 3 != 0 && !seen.contains_key(i)).count();
        Ok((records.len(), dup, missing))
    };
    let (k2k_out, k2k_dup, k2k_missing) = paid_check(&paid_topic)?;
    let (fan_out_n, fan_dup, fan_missing) = paid_check(&fan_paid)?;
    let rows = query_i64(&mut sql, &format!("SELECT COUNT(*) FROM {table}")).await? as u64;
    let distinct = query_i64(&mut sql, &format!("SELECT COUNT(DISTINCT id) FROM {table}")).await? as u64;
    let k2m_dup = rows - distinct;
    let k2m_missing = TOTAL - distinct;

    // `exactly verify`: the same question, answered by the tool users have, from the job files.
    println!();
    let k2k_file = k2k.display().to_string();
    let fan_file = fan_out.display().to_string();
    let bootstrap = ["--bootstrap-servers", env.kafka_bootstrap.as_str()];
    let mut reports = Vec::new();
    for (output, file, sink) in [
        (format!("topic:{paid_topic}"), &k2k_file, "kafka-sink"),
        (format!("topic:{fan_paid}"), &fan_file, "paid-orders"),
        (format!("mysql:{table}"), &fan_file, "orders-table"),
    ] {
        let mut args = vec![
            "--source",
            &orders_topic,
            "--output",
            &output,
            "--id",
            "id",
            "--job",
            file,
            "--sink",
            sink,
        ];
        args.extend(bootstrap);
        let (code, text) = verify_report(&args)?;
        println!(
            "$ exactly verify --source {orders_topic} --output {output} --id id --job {} --sink {sink}",
            file.rsplit('/').next().unwrap_or(file)
        );
        println!("{text}");
        reports.push((output, code));
    }

    println!();
    println!("demo summary ({TOTAL} sample orders; each process SIGKILLed after 3 checkpoints and restarted: Kafka-to-Kafka at ~{killed_at} orders produced, the fan-out job at ~{fan_killed_at})");
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
        k2k_out as u64,
        k2k_dup as u64,
        k2k_missing as u64,
        n(&before["checkpoints"]["completed"]) + n(&k2k_status["checkpoints"]["completed"]),
        1,
        n(&k2k_status["restarts"]),
    );
    let fan_checkpoints = n(&fan_before["checkpoints"]["completed"]) + n(&fan_status["checkpoints"]["completed"]);
    row(
        "fan-out -> kafka (paid orders)",
        fan_out_n as u64,
        fan_dup as u64,
        fan_missing as u64,
        fan_checkpoints,
        1,
        n(&fan_status["restarts"]),
    );
    row(
        "fan-out -> mysql (XA, all)",
        rows,
        k2m_dup,
        k2m_missing,
        fan_checkpoints,
        1,
        n(&fan_status["restarts"]),
    );
    println!("verified with read_committed consumers of {paid_topic} and {fan_paid}, SQL on table {table}, and exactly verify");
    assert_eq!((k2k_dup, k2k_missing, k2k_out), (0, 0, paid_expected));
    assert_eq!((fan_dup, fan_missing, fan_out_n), (0, 0, paid_expected));
    assert_eq!((k2m_dup, k2m_missing, rows), (0, 0, TOTAL));
    for (output, code) in reports {
        assert_eq!(code, 0, "exactly verify of {output}");
    }
    Ok(())
}
