//! Kafka-to-PostgreSQL jobs (`[sink.postgres]`, a sink written against the public API only), run
//! as child processes and SIGKILLed at every named point of the protocol, in both modes; a job
//! killed for good leaves prepared transactions that the next start rolls back. SQL then finds
//! every input record exactly once (two-phase: a table without a primary key, so a duplicate is
//! a row) and the progress rows agree with the input. PostgreSQL itself killed mid-run:
//! `postgres_restart.rs`, alone in its binary.

mod k2p;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use exactly_integration_tests::{create_topic, unique, ChildJob, TestEnv};
use k2p::{drain_and_verify, exactly, feed, prepared, setup, stop_feed, write_job};

async fn killed_at_every_step(mode: &str, steps: &[(&str, &str)]) -> Result<()> {
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let s = setup(env, mode, dir.path())?;
    create_topic(env, &s.input, 2).await?;
    for round in 0..2 {
        for (point, spec) in steps {
            let feeder = feed(env, &s)?;
            let mut job = ChildJob::spawn(exactly(), &s.args, spec)?;
            let reached = job.wait_for_failpoint(point, Duration::from_secs(60));
            let reached = reached.map_err(|e| anyhow::anyhow!("{e}\n{}", job.tail(40)));
            job.kill();
            stop_feed(feeder)?;
            reached.context(format!("round {round}"))?;
            eprintln!("{mode} round {round}: killed at {point}");
        }
    }
    drain_and_verify(env, &s).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_postgres_two_phase_is_exactly_once_across_sigkills() -> Result<()> {
    killed_at_every_step(
        "two_phase",
        &[
            ("sink.before_pre_commit", "sink.before_pre_commit=freeze@3"),
            ("sink.after_pre_commit", "sink.after_pre_commit=freeze@3"),
            ("checkpoint.after_durable", "checkpoint.after_durable=freeze@3"),
            ("sink.before_commit", "sink.before_commit=freeze@3"),
            // The start after a kill with a prepared transaction pending dies before committing
            // it. It follows the kill before a commit, which leaves one pending for certain (the
            // checkpoint frozen after it was durable may have had no records under load: then the
            // restart has nothing to commit and never got here).
            ("sink.before_recovery_commit", "sink.before_recovery_commit=freeze@1"),
            ("sink.after_commit", "sink.after_commit=freeze@3"),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_postgres_upsert_is_exactly_once_across_sigkills() -> Result<()> {
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
async fn prepared_transactions_of_a_job_killed_for_good_are_rolled_back_by_the_next_start() -> Result<()> {
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let s = setup(env, "two_phase", dir.path())?;
    create_topic(env, &s.input, 2).await?;
    let feeder = feed(env, &s)?;
    let mut job = ChildJob::spawn(exactly(), &s.args, "sink.after_pre_commit=freeze@2")?;
    job.wait_for_failpoint("sink.after_pre_commit", Duration::from_secs(60))?;
    job.kill();
    stop_feed(feeder)?;
    assert!(
        prepared(&s.job).await? > 0,
        "the killed job left a prepared transaction"
    );

    // The next start (fresh state, same job id) rolls them back. It keeps its own progress
    // table: a fresh start behind the commits the old one records is refused
    // (`a_fresh_start_behind_what_the_table_holds_is_refused`).
    let fresh = tempfile::tempdir()?;
    let unused = unique("k2p-unused");
    create_topic(env, &unused, 1).await?;
    let progress = unique("k2p_progress_fresh").replace('-', "_");
    let args = write_job(
        env,
        "two_phase",
        fresh.path(),
        &unused,
        &s.table,
        &progress,
        &s.job,
        "fresh",
    )?;
    let mut next = ChildJob::spawn(exactly(), &args, "")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while prepared(&s.job).await? > 0 {
        if Instant::now() > deadline || !next.running() {
            bail!("prepared transactions remain:\n{}", next.tail(30));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    next.kill();
    Ok(())
}

/// As for MySQL: the checkpoint directory removed while the table holds the job's commits. The
/// sink refuses the fresh start (its progress rows show a newer checkpoint committed), and the
/// table is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_start_behind_what_the_table_holds_is_refused() -> Result<()> {
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let s = setup(env, "two_phase", dir.path())?;
    create_topic(env, &s.input, 2).await?;
    let mut conn = exactly_integration_tests::connect_postgres().await?;
    let count = format!("SELECT COUNT(*) FROM \"{}\"", s.table);
    let feeder = feed(env, &s)?;
    let mut job = ChildJob::spawn(exactly(), &s.args, "")?;
    let until = |job: &mut ChildJob, what: &str, done: &dyn Fn(&mut ChildJob) -> bool| -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(job) {
            if Instant::now() > deadline {
                bail!("timed out waiting for {what}:\n{}", job.tail(40));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while exactly_integration_tests::pg_i64(&mut conn, &count).await.unwrap_or(0) < 200 {
        if Instant::now() > deadline || !job.running() {
            bail!("no rows written:\n{}", job.tail(40));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_feed(feeder)?;
    exactly_integration_tests::signal(job.pid(), "TERM")?;
    until(&mut job, "the job to stop", &|j| !j.running())?;
    let before = exactly_integration_tests::pg_i64(&mut conn, &count).await?;

    std::fs::remove_dir_all(dir.path().join("checkpoints"))?;
    let mut again = ChildJob::spawn(exactly(), &s.args, "")?;
    exactly_integration_tests::refused_fresh_start(&mut again)?;
    let after = exactly_integration_tests::pg_i64(&mut conn, &count).await?;
    assert_eq!(after, before, "the table was written again");
    Ok(())
}
