//! A Kafka-to-Kafka exactly-once job, run as a child process, is killed with SIGKILL at every
//! named step of the two-phase protocol, many times, and restarted each time; input keeps
//! arriving throughout. An independent read_committed consumer then finds every input record
//! exactly once in the output, in order per key.

mod k2k;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use exactly_integration_tests::{create_topic, unique, ChildJob, TestEnv};
use k2k::{drain_and_verify, exactly, feed, job_args, KEYS};

fn job_still_failed_by_timing(e: &anyhow::Error) -> bool {
    e.to_string().contains("did not reach")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_kafka_is_exactly_once_across_sigkills_at_every_protocol_step() -> Result<()> {
    let env = TestEnv::get().await?;
    let input = unique("k2k-in");
    let output = unique("k2k-out");
    create_topic(env, &input, 3).await?;
    create_topic(env, &output, 3).await?;
    let dir = tempfile::tempdir()?;
    let args = job_args(env, &input, &output, dir.path());
    let program = exactly();
    let next = Arc::new(std::sync::Mutex::new(vec![0usize; KEYS]));

    let steps: &[(&str, &str)] = &[
        ("sink.before_pre_commit", "sink.before_pre_commit=freeze@4"),
        ("sink.after_pre_commit", "sink.after_pre_commit=freeze@3"),
        ("checkpoint.after_durable", "checkpoint.after_durable=freeze@3"),
        // A pre-commit slow enough for its checkpoint to time out leaves two transactions to
        // commit at the next completion: die between them.
        (
            "sink.between_commits",
            "sink.before_pre_commit=delay@1500ms@3;sink.between_commits=freeze@1",
        ),
        ("sink.after_commit", "sink.after_commit=freeze@2"),
    ];
    let mut kills = 0;
    for round in 0..2 {
        for (point, spec) in steps {
            // Reaching a point can depend on timing (a checkpoint must time out first for
            // `between_commits`): an attempt that does not get there within its time is killed
            // anyway (a kill at an arbitrary point) and the step is tried again.
            let mut attempt = 0;
            loop {
                attempt += 1;
                let feeder = feed(env, &input, next.clone());
                let mut job = ChildJob::spawn(program, &args, spec)?;
                let reached = job.wait_for_failpoint(point, Duration::from_secs(30));
                let reached = reached.map_err(|e| anyhow::anyhow!("{e}\n{}", job.tail(300)));
                job.kill();
                feeder.finish()?;
                kills += 1;
                match reached {
                    Ok(()) => break,
                    Err(e) if attempt < 5 && job_still_failed_by_timing(&e) => {
                        eprintln!("round {round}: {point} not reached (attempt {attempt}); killed anyway");
                        if std::env::var_os("EXACTLY_DEBUG_CRASH").is_some() {
                            eprintln!("{e}");
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            eprintln!("round {round}: killed at {point}");
        }
    }

    let out = drain_and_verify(env, &args, &output, &next).await?;
    eprintln!("{kills} kills; {out} records out, 0 duplicates, 0 missing");
    Ok(())
}
