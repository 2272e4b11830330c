//! Kafka-to-MySQL jobs, run as child processes, killed with SIGKILL at named points (before
//! prepare, after prepare before the checkpoint is durable, after it is durable before XA COMMIT)
//! many times, in both modes; MariaDB itself killed and restarted mid-run; prepared branches of a
//! job killed for good rolled back by the next start. SQL then finds every input record exactly
//! once, and the progress table agrees with the input.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use exactly_integration_tests::{connect_mysql, create_topic, produce, query_i64, unique, ChildJob, TestEnv};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use sqlx::Row;

struct Setup {
    input: String,
    table: String,
    progress: String,
    job: String,
    args: Vec<String>,
    next_id: Arc<AtomicU64>,
}

fn setup(env: &TestEnv, mode: &str, dir: &str) -> Setup {
    let input = unique("k2m-in");
    let table = unique("k2m_rows").replace('-', "_");
    let progress = unique("k2m_progress").replace('-', "_");
    let job = unique("k2m");
    let args = [
        "--bootstrap",
        &env.kafka_bootstrap,
        "--input",
        &input,
        "--group",
        &unique("g"),
        "--mysql",
        &env.mysql_url,
        "--table",
        &table,
        "--progress",
        &progress,
        "--mode",
        mode,
        "--job",
        &job,
        "--checkpoints",
        dir,
        "--parallelism",
        "2",
        "--interval",
        "200ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Setup {
        input,
        table,
        progress,
        job,
        args,
        next_id: Arc::new(AtomicU64::new(0)),
    }
}

/// Produces `id,k<id%7>,<id>` records until stopped.
fn feed(env: &TestEnv, s: &Setup) -> (Arc<AtomicBool>, std::thread::JoinHandle<Result<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (env, topic, next, flag) = (env.clone(), s.input.clone(), s.next_id.clone(), stop.clone());
    let handle = std::thread::spawn(move || {
        while !flag.load(Ordering::SeqCst) {
            let batch: Vec<(String, String)> = (0..25)
                .map(|_| {
                    let id = next.fetch_add(1, Ordering::SeqCst) + 1;
                    (format!("k{}", id % 7), format!("{id},k{},{id}", id % 7))
                })
                .collect();
            produce(&env, &topic, &batch)?;
            std::thread::sleep(Duration::from_millis(40));
        }
        Ok(())
    });
    (stop, handle)
}

fn stop_feed(f: (Arc<AtomicBool>, std::thread::JoinHandle<Result<()>>)) -> Result<()> {
    f.0.store(true, Ordering::SeqCst);
    f.1.join().map_err(|_| anyhow::anyhow!("feeder panicked"))?
}

async fn drain_and_verify(env: &TestEnv, s: &Setup, program: &str) -> Result<()> {
    let expected = s.next_id.load(Ordering::SeqCst) as i64;
    let mut job = ChildJob::spawn(program, &s.args, "")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut conn = connect_mysql(env).await?;
    loop {
        let n = query_i64(&mut conn, &format!("SELECT COUNT(*) FROM `{}`", s.table))
            .await
            .unwrap_or(0);
        if n >= expected {
            break;
        }
        if !job.running() || Instant::now() > deadline {
            bail!("table has {n} of {expected} rows:\n{}", job.tail(40));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Let the progress rows of the last checkpoints land, then stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    job.kill();
    let rows = query_i64(&mut conn, &format!("SELECT COUNT(*) FROM `{}`", s.table)).await?;
    let distinct = query_i64(&mut conn, &format!("SELECT COUNT(DISTINCT id) FROM `{}`", s.table)).await?;
    let wrong = query_i64(
        &mut conn,
        &format!(
            "SELECT COUNT(*) FROM `{}` WHERE seq <> id OR k <> CONCAT('k', id % 7)",
            s.table
        ),
    )
    .await?;
    let max = query_i64(&mut conn, &format!("SELECT COALESCE(MAX(id), 0) FROM `{}`", s.table)).await?;
    assert_eq!(
        (rows, distinct, wrong, max),
        (expected, expected, 0, expected),
        "rows, distinct ids, wrong rows, max id"
    );

    // The progress table agrees: the newest offsets it records per partition reach the end of
    // the input.
    let progress = sqlx::query(&format!("SELECT offsets FROM `{}` WHERE job = ?", s.progress))
        .bind(&s.job)
        .fetch_all(&mut conn)
        .await?;
    let mut recorded: BTreeMap<String, i64> = BTreeMap::new();
    for row in progress {
        // TEXT under a binary collation comes back as bytes.
        let offsets: BTreeMap<String, i64> = serde_json::from_slice(&row.try_get::<Vec<u8>, _>("offsets")?)?;
        for (tp, o) in offsets {
            let e = recorded.entry(tp).or_insert(o);
            *e = (*e).max(o);
        }
    }
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()?;
    for p in 0..2 {
        let (_, high) = consumer.fetch_watermarks(&s.input, p, Duration::from_secs(30))?;
        if high > 0 {
            assert_eq!(
                recorded.get(&format!("{}:{p}", s.input)),
                Some(&high),
                "progress of partition {p}: {recorded:?}"
            );
        }
    }
    eprintln!("{expected} records in, {rows} rows, 0 duplicates, 0 missing; progress {recorded:?}");
    Ok(())
}

async fn killed_at_every_step(mode: &str, steps: &[(&str, &str)]) -> Result<()> {
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let s = setup(env, mode, &dir.path().display().to_string());
    create_topic(env, &s.input, 2).await?;
    let program = env!("CARGO_BIN_EXE_exactly-k2m");
    for round in 0..2 {
        for (point, spec) in steps {
            let feeder = feed(env, &s);
            let mut job = ChildJob::spawn(program, &s.args, spec)?;
            let reached = job.wait_for_failpoint(point, Duration::from_secs(60));
            let reached = reached.map_err(|e| anyhow::anyhow!("{e}"));
            job.kill();
            stop_feed(feeder)?;
            reached.context(format!("round {round}"))?;
            eprintln!("{mode} round {round}: killed at {point}");
        }
    }
    drain_and_verify(env, &s, program).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_mysql_xa_is_exactly_once_across_sigkills() -> Result<()> {
    killed_at_every_step(
        "xa",
        &[
            ("sink.before_pre_commit", "sink.before_pre_commit=freeze@3"),
            ("sink.after_pre_commit", "sink.after_pre_commit=freeze@3"),
            ("checkpoint.after_durable", "checkpoint.after_durable=freeze@3"),
            ("sink.after_commit", "sink.after_commit=freeze@3"),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_mysql_upsert_is_exactly_once_across_sigkills() -> Result<()> {
    killed_at_every_step(
        "upsert",
        &[
            ("sink.before_pre_commit", "sink.before_pre_commit=freeze@3"),
            ("sink.after_pre_commit", "sink.after_pre_commit=freeze@3"),
            ("checkpoint.after_durable", "checkpoint.after_durable=freeze@3"),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_killed_and_restarted_mid_run_loses_and_doubles_nothing() -> Result<()> {
    let env = TestEnv::get().await?;
    let Some(services) = env.services_script.clone() else {
        bail!(
            "this test kills and restarts MariaDB, which needs the local services (scripts/services), not a container"
        );
    };
    let dir = tempfile::tempdir()?;
    let s = setup(env, "xa", &dir.path().display().to_string());
    create_topic(env, &s.input, 2).await?;
    let program = env!("CARGO_BIN_EXE_exactly-k2m");
    let feeder = feed(env, &s);
    let mut job = ChildJob::spawn(program, &s.args, "")?;
    let mut conn = connect_mysql(env).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while query_i64(&mut conn, &format!("SELECT COUNT(*) FROM `{}`", s.table))
        .await
        .unwrap_or(0)
        < 100
    {
        if Instant::now() > deadline || !job.running() {
            bail!("no rows arrived:\n{}", job.tail(30));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(conn);
    for _ in 0..2 {
        let status = std::process::Command::new(&services).arg("kill-mysql").status()?;
        assert!(status.success(), "kill-mysql");
        tokio::time::sleep(Duration::from_millis(700)).await;
        let status = std::process::Command::new(&services).arg("start-mysql").status()?;
        assert!(status.success(), "start-mysql");
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    stop_feed(feeder)?;
    assert!(
        job.running(),
        "the job survives database restarts (it restarts itself):\n{}",
        job.tail(30)
    );
    job.kill();
    drain_and_verify(env, &s, program).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_branches_of_a_job_killed_for_good_are_rolled_back_by_the_next_start() -> Result<()> {
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let s = setup(env, "xa", &dir.path().display().to_string());
    create_topic(env, &s.input, 2).await?;
    let program = env!("CARGO_BIN_EXE_exactly-k2m");
    let feeder = feed(env, &s);
    let mut job = ChildJob::spawn(program, &s.args, "sink.after_pre_commit=freeze@2")?;
    job.wait_for_failpoint("sink.after_pre_commit", Duration::from_secs(60))?;
    job.kill();
    stop_feed(feeder)?;

    let gtrid = format!("exactly:{}:rows", s.job);
    let mut conn = connect_mysql(env).await?;
    let prepared = |rows: &[sqlx::mysql::MySqlRow]| {
        rows.iter()
            .filter(|r| {
                let data = r
                    .try_get::<Vec<u8>, _>("data")
                    .or_else(|_| r.try_get::<String, _>("data").map(String::into_bytes));
                data.is_ok_and(|d| d.starts_with(gtrid.as_bytes()))
            })
            .count()
    };
    let rows = sqlx::Executor::fetch_all(&mut conn, "XA RECOVER").await?;
    assert!(prepared(&rows) > 0, "the killed job left a prepared branch");
    // Its rows are locked: another writer waits and times out.
    sqlx::Executor::execute(&mut conn, "SET SESSION innodb_lock_wait_timeout = 1").await?;
    let locked = sqlx::query(&format!("SELECT id FROM `{}` ORDER BY id DESC LIMIT 1", s.table))
        .fetch_optional(&mut conn)
        .await?;
    let probe_id: i64 = match locked {
        Some(_) | None => s.next_id.load(Ordering::SeqCst) as i64, // the newest record is in an uncommitted branch or not written
    };
    let blocked = sqlx::query(&format!("DELETE FROM `{}` WHERE id <= ?", s.table))
        .bind(probe_id)
        .execute(&mut conn)
        .await;
    assert!(blocked.is_err(), "rows of the prepared branch are locked");

    // The next start of the job (fresh state, same job id) rolls them back.
    let fresh = tempfile::tempdir()?;
    let mut args = s.args.clone();
    let i = args.iter().position(|a| a == "--checkpoints").unwrap();
    args[i + 1] = fresh.path().display().to_string();
    let i = args.iter().position(|a| a == "--input").unwrap();
    let unused = unique("k2m-unused");
    create_topic(env, &unused, 1).await?;
    args[i + 1] = unused;
    let mut next = ChildJob::spawn(program, &args, "")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rows = sqlx::Executor::fetch_all(&mut conn, "XA RECOVER").await?;
        if prepared(&rows) == 0 {
            break;
        }
        if Instant::now() > deadline || !next.running() {
            bail!("prepared branches remain:\n{}", next.tail(30));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    next.kill();
    let writable = sqlx::query(&format!("DELETE FROM `{}` WHERE id <= ?", s.table))
        .bind(probe_id)
        .execute(&mut conn)
        .await;
    assert!(writable.is_ok(), "rows are writable again: {writable:?}");
    Ok(())
}
