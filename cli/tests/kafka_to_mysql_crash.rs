//! Kafka-to-MySQL jobs, run as child processes, killed with SIGKILL at named points (before
//! prepare, after prepare before the checkpoint is durable, after it is durable before XA COMMIT)
//! many times, in both modes; prepared branches of a job killed for good rolled back by the next
//! start (MariaDB killed mid-run: `mariadb_restart.rs`, alone in its binary). SQL then finds every input record exactly
//! once, and the progress table agrees with the input.

mod k2m;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use exactly_integration_tests::{connect_mysql, create_topic, unique, ChildJob, TestEnv};
use k2m::{drain_and_verify, exactly, feed, setup, stop_feed, write_job};
use sqlx::Row;

async fn killed_at_every_step(mode: &str, steps: &[(&str, &str)]) -> Result<()> {
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let s = setup(env, mode, dir.path());
    create_topic(env, &s.input, 2).await?;
    let program = exactly();
    for round in 0..2 {
        for (point, spec) in steps {
            let feeder = feed(env, &s)?;
            let mut job = ChildJob::spawn(program, &s.args, spec)?;
            let reached = job.wait_for_failpoint(point, Duration::from_secs(60));
            let reached = reached.map_err(|e| anyhow::anyhow!("{e}"));
            job.kill();
            stop_feed(feeder)?;
            reached.context(format!("round {round}"))?;
            eprintln!("{mode} round {round}: killed at {point}");
        }
    }
    drain_and_verify(env, &s).await
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
async fn prepared_branches_of_a_job_killed_for_good_are_rolled_back_by_the_next_start() -> Result<()> {
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let s = setup(env, "xa", dir.path());
    create_topic(env, &s.input, 2).await?;
    let program = exactly();
    let feeder = feed(env, &s)?;
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

    // The next start of the job (fresh state, same job id) rolls them back. It keeps its own
    // progress table: a fresh start behind the commits the old one records is refused
    // (`a_fresh_start_behind_what_the_table_holds_is_refused`).
    let fresh = tempfile::tempdir()?;
    let unused = unique("k2m-unused");
    create_topic(env, &unused, 1).await?;
    let progress = unique("k2m_progress_fresh").replace('-', "_");
    let args = write_job(env, "xa", fresh.path(), &unused, &s.table, &progress, &s.job, "fresh");
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

/// The checkpoint directory removed while the table holds the job's commits (what an operator
/// does to "start over", or `checkpoints.dir` pointed somewhere new): the checkpoint ids would
/// start again at 1, below those the progress rows record as committed, and the source at its
/// start. The sink refuses the fresh start, naming the checkpoint it committed; the table is
/// left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_start_behind_what_the_table_holds_is_refused() -> Result<()> {
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let s = setup(env, "xa", dir.path());
    create_topic(env, &s.input, 2).await?;
    let feeder = feed(env, &s)?;
    let mut job = ChildJob::spawn(exactly(), &s.args, "")?;
    k2m::wait_rows(env, &s, &mut job, 200, Duration::from_secs(60)).await?;
    stop_feed(feeder)?;
    exactly_integration_tests::signal(job.pid(), "TERM")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while job.running() {
        if Instant::now() > deadline {
            bail!("the job did not stop:\n{}", job.tail(40));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut conn = connect_mysql(env).await?;
    let count = format!("SELECT COUNT(*) FROM `{}`", s.table);
    let before = exactly_integration_tests::query_i64(&mut conn, &count).await?;

    std::fs::remove_dir_all(dir.path().join("checkpoints"))?;
    let mut again = ChildJob::spawn(exactly(), &s.args, "")?;
    exactly_integration_tests::refused_fresh_start(&mut again)?;
    let after = exactly_integration_tests::query_i64(&mut conn, &count).await?;
    assert_eq!(after, before, "the table was written again");
    Ok(())
}

/// The newest checkpoint unreadable after a crash between its metadata becoming durable and its
/// commits: the table's progress rows show none of its transactions committed, so the job
/// restores the one before (the progress rows prove it safe), sets the unreadable one aside, and
/// the output ends exactly once. (It stopped with "cannot be read" before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_newest_checkpoint_the_table_never_committed_is_restored_past() -> Result<()> {
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let s = setup(env, "xa", dir.path());
    create_topic(env, &s.input, 2).await?;
    let feeder = feed(env, &s)?;
    let mut job = ChildJob::spawn(exactly(), &s.args, "checkpoint.after_durable=freeze@3")?;
    let reached = job.wait_for_failpoint("checkpoint.after_durable", Duration::from_secs(60));
    job.kill();
    stop_feed(feeder)?;
    reached?;
    // The newest checkpoint's metadata, damaged (one flipped byte).
    let checkpoints = dir.path().join("checkpoints");
    let newest = exactly_integration_tests::damage_newest_checkpoint(&checkpoints)?;

    drain_and_verify(env, &s).await?;
    assert!(
        checkpoints.join(format!("chk-{newest}/_metadata.unusable")).exists(),
        "the unreadable checkpoint {newest} is set aside"
    );
    Ok(())
}
