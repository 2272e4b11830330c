//! Helpers of the Kafka-to-MySQL scenarios (shared by several test binaries): the job file run
//! by the `exactly` binary, a feeder of `id,key,seq` records, and the SQL check of the table.

// Each test binary uses some of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_integration_tests::{
    connect_mysql, high_watermark, query_i64, unique, verify_job, ChildJob, Feed, TestEnv,
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
    /// `exactly run JOBFILE`.
    pub(crate) args: Vec<String>,
    pub(crate) next_id: Arc<AtomicU64>,
}

/// The crash tests' Kafka-to-MySQL job file, written into `dir` (checkpoints in
/// `dir/checkpoints`): reads delimited `id,key,seq` records from a fresh topic with two subtasks,
/// checkpoints every 200 ms, and writes rows in `mode` (xa or upsert).
pub(crate) fn setup(env: &TestEnv, mode: &str, dir: &Path) -> Setup {
    let input = unique("k2m-in");
    let table = unique("k2m_rows").replace('-', "_");
    let progress = unique("k2m_progress").replace('-', "_");
    let job = unique("k2m");
    let args = write_job(env, mode, dir, &input, &table, &progress, &job, "k2m");
    Setup {
        input,
        table,
        progress,
        job,
        args,
        next_id: Arc::new(AtomicU64::new(0)),
    }
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
) -> Vec<String> {
    // Upsert needs its key. XA writes plain INSERTs: without a primary key on `id`, a record
    // written twice is a second row the test sees, not a "Duplicate entry" error and a restart
    // loop that would hide it.
    let id_key = if mode == "upsert" { ", key = true" } else { "" };
    let text = format!(
        r#"
[job]
name = "k2m"
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

[sink.mysql]
url = "{url}"
table = "{table}"
mode = "{mode}"
job_id = "{job}"
sink_id = "rows"
batch_size = 200
create_table = true
progress_table = "{progress}"

[sink.mysql.mapping]
format = {{ type = "delimited", delimiter = "," }}
columns = [
  {{ name = "id", type = "bigint"{id_key} }},
  {{ name = "k", type = "varchar", length = 64 }},
  {{ name = "seq", type = "bigint" }},
]
"#,
        checkpoints = dir.join("checkpoints").display(),
        bootstrap = env.kafka_bootstrap,
        group = unique("g"),
        url = env.mysql_url,
    );
    let path = dir.join(format!("{file}.toml"));
    std::fs::write(&path, text).expect("write job file");
    vec!["run".to_owned(), path.display().to_string()]
}

/// A running feeder: its stop flag and thread.
pub(crate) type Feeder = (Arc<AtomicBool>, std::thread::JoinHandle<Result<()>>);

/// Produces `id,k<id%7>,<id>` records until stopped, 25 every 40 ms or
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
            (format!("k{}", id % 7), format!("{id},k{},{id}", id % 7))
        })
        .collect()
}

pub(crate) fn stop_feed(f: Feeder) -> Result<()> {
    f.0.store(true, Ordering::SeqCst);
    f.1.join().map_err(|_| anyhow::anyhow!("feeder panicked"))?
}

/// `exactly verify` of the job in `job_file` (its source topic against its table, servers and
/// credentials from the job) must find the table exactly once.
fn exactly_verify(job_file: &str) -> Result<()> {
    let job = exactly_cli::jobfile::Job::load(std::path::Path::new(job_file))?;
    let input = job.file.source.topics.first().expect("a topic").clone();
    let exactly_cli::jobfile::SinkKind::Mysql(m) = &job.sinks[0].kind else {
        bail!("not a MySQL job");
    };
    verify_job(exactly(), job_file, &input, &format!("mysql:{}", m.table), "id")
}

pub(crate) async fn drain_and_verify(env: &TestEnv, s: &Setup) -> Result<()> {
    let expected = s.next_id.load(Ordering::SeqCst) as i64;
    let mut job = ChildJob::spawn(exactly(), &s.args, "")?;
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
    let log = job.tail(100_000);
    assert!(
        !log.contains("Duplicate entry") && !log.contains("restarting"),
        "the recovering job met a duplicate or restarted:\n{}",
        job.tail(40)
    );
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
    exactly_verify(&s.args[1])?;

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

/// Waits until the table has at least `at_least` rows (the job keeps running).
pub(crate) async fn wait_rows(
    env: &TestEnv,
    s: &Setup,
    job: &mut ChildJob,
    at_least: i64,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let n = match connect_mysql(env).await {
            Ok(mut conn) => query_i64(&mut conn, &format!("SELECT COUNT(*) FROM `{}`", s.table))
                .await
                .unwrap_or(0),
            Err(_) => 0,
        };
        if n >= at_least {
            return Ok(());
        }
        if !job.running() || Instant::now() > deadline {
            bail!("table has {n} of {at_least} rows:\n{}", job.tail(40));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Branches of this job's sink that MariaDB holds prepared (XA RECOVER).
pub(crate) async fn prepared_branches(env: &TestEnv, s: &Setup) -> Result<usize> {
    let gtrid = format!("exactly:{}:rows", s.job);
    let mut conn = connect_mysql(env).await?;
    let rows = sqlx::Executor::fetch_all(&mut conn, "XA RECOVER").await?;
    Ok(rows
        .iter()
        .filter(|r| {
            let data = r
                .try_get::<Vec<u8>, _>("data")
                .or_else(|_| r.try_get::<String, _>("data").map(String::into_bytes));
            data.is_ok_and(|d| d.starts_with(gtrid.as_bytes()))
        })
        .count())
}
