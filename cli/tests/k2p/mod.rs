//! Helpers of the Kafka-to-PostgreSQL scenarios: the job file run by the `exactly` binary (a
//! `[sink.postgres]` table, TLS with certificate checks), a feeder of JSON `{id, k, seq}`
//! records, and the SQL check of the table.

// Each test binary uses some of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_integration_tests::{
    connect_postgres, high_watermark, pg_i64, postgres_url, unique, verify_job, ChildJob, Feed, TestEnv,
};
use sqlx::Row;

/// The `exactly` binary under test.
pub(crate) fn exactly() -> &'static str {
    env!("CARGO_BIN_EXE_exactly")
}

pub(crate) struct Setup {
    pub(crate) input: String,
    pub(crate) table: String,
    pub(crate) progress: String,
    pub(crate) job: String,
    pub(crate) args: Vec<String>,
    pub(crate) next_id: Arc<AtomicU64>,
}

/// A Kafka-to-PostgreSQL job file in `dir` (checkpoints in `dir/checkpoints`): JSON records from
/// a fresh topic, two subtasks, checkpoints every 200 ms, rows in `mode` (two_phase or upsert).
pub(crate) fn setup(env: &TestEnv, mode: &str, dir: &Path) -> Result<Setup> {
    let input = unique("k2p-in");
    let table = unique("k2p_rows").replace('-', "_");
    let progress = unique("k2p_progress").replace('-', "_");
    let job = unique("k2p");
    let args = write_job(env, mode, dir, &input, &table, &progress, &job, "k2p")?;
    Ok(Setup {
        input,
        table,
        progress,
        job,
        args,
        next_id: Arc::new(AtomicU64::new(0)),
    })
}

/// Writes `dir/FILE.toml` and returns the arguments of `exactly run` for it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_job(
    env: &TestEnv,
    mode: &str,
    dir: &Path,
    input: &str,
    table: &str,
    progress: &str,
    job: &str,
    file: &str,
) -> Result<Vec<String>> {
    // Upsert needs its key. Two-phase writes plain INSERTs into a table without a primary key:
    // a record written twice is a second row the check sees, not a unique-violation restart
    // loop that would hide it.
    let id_key = if mode == "upsert" { ", key = true" } else { "" };
    let text = format!(
        r#"
[job]
name = "k2p"
parallelism = 2

[checkpoints]
dir = "{checkpoints}"
interval = "200ms"
timeout = "10s"
retained = 2
tolerable_failures = 100

[restart]
type = "fixed_delay"
attempts = 50
delay = "500ms"

[source]
bootstrap_servers = "{bootstrap}"
topics = ["{input}"]
group_id = "{group}"

[sink.postgres]
url = "{url}"
table = "{table}"
mode = "{mode}"
job_id = "{job}"
sink_id = "rows"
batch_size = 200
create_table = true
progress_table = "{progress}"
columns = [
  {{ name = "id", type = "bigint"{id_key} }},
  {{ name = "k", type = "text" }},
  {{ name = "seq", type = "bigint" }},
]
"#,
        checkpoints = dir.join("checkpoints").display(),
        bootstrap = env.kafka_bootstrap,
        group = unique("g"),
        url = postgres_url()?,
    );
    let path = dir.join(format!("{file}.toml"));
    std::fs::write(&path, text)?;
    Ok(vec!["run".to_owned(), path.display().to_string()])
}

/// A running feeder: its stop flag and thread.
pub(crate) type Feeder = (Arc<AtomicBool>, std::thread::JoinHandle<Result<()>>);

/// Produces `{"id": n, "k": "k<n%7>", "seq": n}` records until stopped, 25 every 40 ms or
/// so, with one producer. The first 25 are acknowledged before it returns: a new producer's start
/// takes most of a second on a busy machine, in which a job started meanwhile reached the
/// checkpoints a test meant for records before any existed.
pub(crate) fn feed(env: &TestEnv, s: &Setup) -> Result<Feeder> {
    let stop = Arc::new(AtomicBool::new(false));
    let (topic, next, flag) = (s.input.clone(), s.next_id.clone(), stop.clone());
    let feed = Feed::new(env)?;
    feed.send(&topic, &rows(&next))?;
    let handle = std::thread::spawn(move || {
        while !flag.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(40));
            feed.send(&topic, &rows(&next))?;
        }
        Ok(())
    });
    Ok((stop, handle))
}

/// The next 25 records of a feeder.
fn rows(next: &AtomicU64) -> Vec<(String, String)> {
    (0..25)
        .map(|_| {
            let id = next.fetch_add(1, Ordering::SeqCst) + 1;
            (
                format!("k{}", id % 7),
                format!(r#"{{"id":{id},"k":"k{}","seq":{id}}}"#, id % 7),
            )
        })
        .collect()
}

pub(crate) fn stop_feed(f: Feeder) -> Result<()> {
    f.0.store(true, Ordering::SeqCst);
    f.1.join().map_err(|_| anyhow::anyhow!("feeder panicked"))?
}

/// Runs the job without fail points until the table holds every record, then checks with SQL:
/// every id exactly once with its own values, and the progress rows reach the end of the input.
pub(crate) async fn drain_and_verify(env: &TestEnv, s: &Setup) -> Result<()> {
    let expected = s.next_id.load(Ordering::SeqCst) as i64;
    let mut job = ChildJob::spawn(exactly(), &s.args, "")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut conn = connect_postgres().await?;
    let count = format!("SELECT COUNT(*) FROM \"{}\"", s.table);
    loop {
        let n = pg_i64(&mut conn, &count).await.unwrap_or(0);
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
    let log = job.tail(100_000);
    assert!(
        !log.contains("restarting"),
        "the recovering job restarted:\n{}",
        job.tail(40)
    );
    let rows = pg_i64(&mut conn, &count).await?;
    let distinct = pg_i64(&mut conn, &format!("SELECT COUNT(DISTINCT id) FROM \"{}\"", s.table)).await?;
    let wrong = pg_i64(
        &mut conn,
        &format!(
            "SELECT COUNT(*) FROM \"{}\" WHERE seq <> id OR k <> 'k' || (id % 7)",
            s.table
        ),
    )
    .await?;
    let max = pg_i64(&mut conn, &format!("SELECT COALESCE(MAX(id), 0) FROM \"{}\"", s.table)).await?;
    assert_eq!(
        (rows, distinct, wrong, max),
        (expected, expected, 0, expected),
        "rows, distinct ids, wrong rows, max id"
    );
    // `exactly verify` agrees (servers, TLS and the table from the job file).
    verify_job(exactly(), &s.args[1], &s.input, &format!("postgres:{}", s.table), "id")?;
    // The progress rows agree: the newest offsets recorded per partition reach the input's end.
    let progress = sqlx::query(&format!("SELECT offsets::text FROM \"{}\" WHERE job = $1", s.progress))
        .bind(&s.job)
        .fetch_all(&mut conn)
        .await?;
    let mut recorded: BTreeMap<String, i64> = BTreeMap::new();
    for row in progress {
        let offsets: BTreeMap<String, i64> = serde_json::from_str(&row.try_get::<String, _>(0)?)?;
        for (tp, o) in offsets {
            let e = recorded.entry(tp).or_insert(o);
            *e = (*e).max(o);
        }
    }
    for p in 0..2 {
        let high = high_watermark(env, &s.input, p, Duration::from_secs(30))?;
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

/// This job's prepared transactions in PostgreSQL.
pub(crate) async fn prepared(job: &str) -> Result<i64> {
    let mut conn = connect_postgres().await?;
    pg_i64(
        &mut conn,
        &format!("SELECT COUNT(*) FROM pg_prepared_xacts WHERE gid LIKE 'exactly:{job}:%'"),
    )
    .await
}
