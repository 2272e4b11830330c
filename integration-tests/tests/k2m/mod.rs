//! Helpers of the Kafka-to-MySQL scenarios (shared by several test binaries).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_integration_tests::{connect_mysql, produce, query_i64, unique, ChildJob, TestEnv};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use sqlx::Row;

pub(crate) struct Setup {
    pub(crate) input: String,
    pub(crate) table: String,
    pub(crate) progress: String,
    pub(crate) job: String,
    pub(crate) args: Vec<String>,
    pub(crate) next_id: Arc<AtomicU64>,
}

pub(crate) fn setup(env: &TestEnv, mode: &str, dir: &str) -> Setup {
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

/// A running feeder: its stop flag and thread.
pub(crate) type Feeder = (Arc<AtomicBool>, std::thread::JoinHandle<Result<()>>);

/// Produces `id,k<id%7>,<id>` records until stopped.
pub(crate) fn feed(env: &TestEnv, s: &Setup) -> Feeder {
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

pub(crate) fn stop_feed(f: Feeder) -> Result<()> {
    f.0.store(true, Ordering::SeqCst);
    f.1.join().map_err(|_| anyhow::anyhow!("feeder panicked"))?
}

pub(crate) async fn drain_and_verify(env: &TestEnv, s: &Setup, program: &str) -> Result<()> {
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
