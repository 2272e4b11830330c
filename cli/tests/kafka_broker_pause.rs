//! The Kafka broker hangs (SIGSTOP) for longer than the clients' session and request timeouts
//! while a Kafka-to-Kafka exactly-once job runs, then continues (SIGCONT): the job rides it out
//! (restarting itself as needed), commits resume (the time is printed), and the read_committed
//! output ends with every record exactly once, in order per key. Alone in its test binary: no
//! other test may use the broker while it hangs.

mod k2k;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use exactly_integration_tests::{create_topic, read_committed, unique, ChildJob, TestEnv};
use k2k::{drain_and_verify, exactly, feed, job_args, wait_for_more_output, KEYS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_paused_beyond_the_client_timeouts_loses_and_doubles_nothing() -> Result<()> {
    let env = TestEnv::get().await?;
    let input = unique("bp-in");
    let output = unique("bp-out");
    create_topic(env, &input, 3).await?;
    create_topic(env, &output, 3).await?;
    let dir = tempfile::tempdir()?;
    let args = job_args(env, &input, &output, dir.path());
    let next = Arc::new(std::sync::Mutex::new(vec![0usize; KEYS]));

    let feeder = feed(env, &input, next.clone());
    let mut job = ChildJob::spawn(exactly(), &args, "")?;
    wait_for_more_output(env, &output, 0, &mut job, Duration::from_secs(60)).await?;
    // The feeder cannot produce while the broker hangs: stop it first.
    feeder.finish()?;
    let before = read_committed(env, &output, Duration::from_secs(30))?.len();

    env.services("pause-kafka")?;
    // Longer than librdkafka's session (45 s) and request (30 s) timeouts.
    tokio::time::sleep(Duration::from_secs(50)).await;
    env.services("resume-kafka")?;
    let feeder = feed(env, &input, next.clone());
    let (n, after) = wait_for_more_output(env, &output, before, &mut job, Duration::from_secs(180)).await?;
    eprintln!("commits resumed {after:?} after SIGCONT ({n} records)");
    if after > Duration::from_secs(10) {
        // Not a failure (no timing thresholds in tests), but the slow path is worth reading.
        eprintln!("slow resume; the job's log:\n{}", job.log(300));
    }
    feeder.finish()?;
    job.kill();

    let out = drain_and_verify(env, &args, &output, &next).await?;
    eprintln!("{out} records out, 0 duplicates, 0 missing");
    Ok(())
}
