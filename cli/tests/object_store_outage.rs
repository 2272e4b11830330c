//! The object store holding a job's checkpoints (SeaweedFS, started by `scripts/services`) is
//! SIGKILLed while a Kafka-to-Kafka exactly-once job runs, and restarted 8 s later: checkpoints
//! fail while it is gone (their output stays uncommitted), the job goes on without restarting, checkpoints and
//! commits resume when it is back, and the read_committed output ends exactly once. Alone in its
//! test binary: no other test may use the store while it is down.

mod k2k;

use std::time::Duration;

use anyhow::Result;
use exactly_integration_tests::{read_committed, unique, TestEnv};
use k2k::{wait_for_more_output, Job, Running};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_store_killed_mid_run_fails_checkpoints_not_the_job() -> Result<()> {
    let env = TestEnv::get().await?;
    let s3 = env.s3()?;
    let mut run = Running::on_new_topics(env, "s3o", |input, output, dir| {
        Job {
            checkpoints: Some(s3.url(&unique("k2k-outage"))),
            ..Job::new(input, output)
        }
        .write(env, dir, "k2k")
    })
    .await?;
    let before = read_committed(env, &run.output, Duration::from_secs(30))?.len();

    env.services("kill-s3")?;
    // Checkpoints cannot become durable while the store is gone: output stays uncommitted.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let during = read_committed(env, &run.output, Duration::from_secs(30))?.len();
    env.services("start-s3")?;
    let (after, took) = wait_for_more_output(env, &run.output, during, &mut run.job, Duration::from_secs(120)).await?;
    run.stop_feeding()?;
    if took > Duration::from_secs(10) {
        // Not a failure (no timing thresholds in tests), but the slow path is worth reading.
        eprintln!("slow resume; the job's log:\n{}", run.job.log(200));
    }
    assert!(run.job.running(), "the job went on:\n{}", run.job.log(40));
    let log = run.job.log(usize::MAX);
    // Failed checkpoints are not a reason to restart: a restart cannot even list the store while
    // it is gone (the Kafka sink's pool grows instead of declining; it declined at twice its size
    // before, and every run restarted 11-20 times).
    assert!(
        !log.contains("restarting"),
        "the job restarted during the outage:\n{}",
        log.lines()
            .filter(|l| l.contains("restarting") || l.contains("Task failed"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        log.contains("18333") || log.contains("s3://"),
        "the job's log names the failing store:\n{log}"
    );
    eprintln!(
        "store down 8 s: committed records {before} before, {during} at the end of the outage, {after} {took:?} after it was back"
    );
    let (_, out, _) = run.finish(env).await?;
    eprintln!("{out} records out, 0 duplicates, 0 missing");
    Ok(())
}
