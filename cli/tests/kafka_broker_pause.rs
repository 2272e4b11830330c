//! The Kafka broker hangs (SIGSTOP) for longer than the clients' session and request timeouts
//! while a Kafka-to-Kafka exactly-once job runs, then continues (SIGCONT): the job rides it out
//! (restarting itself as needed), commits resume (the time is printed), and the read_committed
//! output ends with every record exactly once, in order per key. Alone in its test binary: no
//! other test may use the broker while it hangs.

mod k2k;

use std::time::Duration;

use anyhow::Result;
use exactly_integration_tests::{read_committed, TestEnv};
use k2k::{job_args, wait_for_more_output, Running};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_paused_beyond_the_client_timeouts_loses_and_doubles_nothing() -> Result<()> {
    let env = TestEnv::get().await?;
    let mut run = Running::on_new_topics(env, "bp", |i, o, d| job_args(env, i, o, d)).await?;
    // The feeder cannot produce while the broker hangs: stop it first.
    run.stop_feeding()?;
    let before = read_committed(env, &run.output, Duration::from_secs(30))?.len();

    env.services("pause-kafka")?;
    // Longer than librdkafka's session (45 s) and request (30 s) timeouts.
    tokio::time::sleep(Duration::from_secs(50)).await;
    env.services("resume-kafka")?;
    run.feed_again(env)?;
    let waited = wait_for_more_output(env, &run.output, before, &mut run.job, Duration::from_secs(180)).await;
    let (n, after) = match waited {
        Ok(found) => found,
        Err(e) => {
            let feeder = run
                .feeder_failure()
                .unwrap_or_else(|| "the feeder had not stopped".to_owned());
            return Err(e.context(format!("{feeder}; {}", run.ends(env))));
        }
    };
    eprintln!("commits resumed {after:?} after SIGCONT ({n} records)");
    if after > Duration::from_secs(10) {
        // Not a failure (no timing thresholds in tests), but the slow path is worth reading.
        eprintln!("slow resume; the job's log:\n{}", run.job.log(300));
    }
    let (_, out, restarts) = run.finish(env).await?;
    eprintln!("{out} records out, 0 duplicates, 0 missing; {restarts} attempt restarts");
    Ok(())
}
