//! `exactly run` with its checkpoints in a real S3-compatible object store (SeaweedFS, started by
//! `scripts/services`), as on Kubernetes with S3: the Kafka-to-Kafka job SIGKILLed at every step
//! of the two-phase protocol and restarted from the checkpoints in the store; the read_committed
//! output ends exactly once, and `exactly checkpoints list` finds the checkpoints in the store.

mod k2k;

use std::sync::Arc;

use anyhow::Result;
use exactly_integration_tests::{create_topic, unique, TestEnv};
use k2k::{drain_and_verify, exactly, sigkill_at_every_step, Job, KEYS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_kafka_with_s3_checkpoints_is_exactly_once_across_sigkills() -> Result<()> {
    let env = TestEnv::get().await?;
    let s3 = env.s3()?;
    let input = unique("s3k-in");
    let output = unique("s3k-out");
    create_topic(env, &input, 3).await?;
    create_topic(env, &output, 3).await?;
    let dir = tempfile::tempdir()?;
    let location = s3.url(&unique("k2k-crash"));
    let args = Job {
        checkpoints: Some(location.clone()),
        ..Job::new(&input, &output)
    }
    .write(env, dir.path(), "k2k");
    let next = Arc::new(std::sync::Mutex::new(vec![0usize; KEYS]));

    let kills = sigkill_at_every_step(env, &args, &input, &next, 1)?;
    let out = drain_and_verify(env, &args, &output, &next).await?;
    assert!(
        !dir.path().join("checkpoints").exists(),
        "checkpoints went to the store, not the local directory"
    );
    let listed = std::process::Command::new(exactly())
        .args(["checkpoints", "list", &location])
        .output()?;
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains(&format!("{location}/chk-")),
        "exactly checkpoints list {location}:\n{listed}"
    );
    eprintln!("{kills} kills with checkpoints in {location}; {out} records out, 0 duplicates, 0 missing");
    Ok(())
}
