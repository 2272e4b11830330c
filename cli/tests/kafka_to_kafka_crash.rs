//! A Kafka-to-Kafka exactly-once job, run as a child process, is killed with SIGKILL at every
//! named step of the two-phase protocol, many times, and restarted each time; input keeps
//! arriving throughout. An independent read_committed consumer then finds every input record
//! exactly once in the output, in order per key.

mod k2k;

use std::sync::Arc;

use anyhow::Result;
use exactly_integration_tests::{create_topic, unique, TestEnv};
use k2k::{drain_and_verify, job_args, sigkill_at_every_step, KEYS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_kafka_is_exactly_once_across_sigkills_at_every_protocol_step() -> Result<()> {
    let env = TestEnv::get().await?;
    let input = unique("k2k-in");
    let output = unique("k2k-out");
    create_topic(env, &input, 3).await?;
    create_topic(env, &output, 3).await?;
    let dir = tempfile::tempdir()?;
    let args = job_args(env, &input, &output, dir.path());
    let next = Arc::new(std::sync::Mutex::new(vec![0usize; KEYS]));

    let kills = sigkill_at_every_step(env, &args, &input, &next, 2)?;
    let out = drain_and_verify(env, &args, &output, &next).await?;
    eprintln!("{kills} kills; {out} records out, 0 duplicates, 0 missing");
    Ok(())
}
