//! The Kafka broker itself SIGKILLed and restarted on the same data while a Kafka-to-Kafka
//! exactly-once job runs, several times — once while a pre-committed transaction waits for its
//! commit (the job frozen between pre-commit and commit): the job rides it out (restarting itself
//! as needed) and the read_committed output ends with every record exactly once, in order per key.
//! Alone in its test binary: no other test may use the broker while it is down.

mod k2k;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use exactly_integration_tests::{create_topic, read_committed, unique, ChildJob, TestEnv};
use k2k::{drain_and_verify, exactly, feed, job_args, KEYS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_killed_and_restarted_mid_run_loses_and_doubles_nothing() -> Result<()> {
    let env = TestEnv::get().await?;
    let input = unique("bk-in");
    let output = unique("bk-out");
    create_topic(env, &input, 3).await?;
    create_topic(env, &output, 3).await?;
    let dir = tempfile::tempdir()?;
    let args = job_args(env, &input, &output, dir.path());
    let program = exactly();
    let next = Arc::new(std::sync::Mutex::new(vec![0usize; KEYS]));

    // 1. Between pre-commit and commit: the job freezes after a pre-commit, the broker dies and
    //    comes back, the job is killed and restarted, and must commit what it pre-committed.
    let feeder = feed(env, &input, next.clone());
    let mut job = ChildJob::spawn(program, &args, "sink.after_pre_commit=freeze@3")?;
    job.wait_for_failpoint("sink.after_pre_commit", Duration::from_secs(60))?;
    env.services("kill-kafka")?;
    env.services("start-kafka")?;
    job.kill();
    feeder.finish()?;

    // 2. While it runs with input arriving: twice.
    let feeder = feed(env, &input, next.clone());
    let mut job = ChildJob::spawn(program, &args, "")?;
    for _ in 0..2 {
        let before = read_committed(env, &output, Duration::from_secs(30))?.len();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while read_committed(env, &output, Duration::from_secs(30))?.len() <= before {
            if std::time::Instant::now() > deadline || !job.running() {
                bail!("no new output before the broker restart:\n{}", job.tail(40));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        env.services("kill-kafka")?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        env.services("start-kafka")?;
    }
    feeder.finish()?;
    if !job.running() {
        bail!(
            "the job did not survive the broker restarts (exit code {:?}):\n{}",
            job.exit_code(),
            job.log(40)
        );
    }
    job.kill();

    let out = drain_and_verify(env, &args, &output, &next).await?;
    eprintln!("3 broker restarts; {out} records out, 0 duplicates, 0 missing");
    Ok(())
}
