//! The Kafka sink's record of what it committed (each transaction commits its checkpoint's id as
//! an offset of the group `{prefix}-progress-{subtask}`), checked by the real binary against the
//! real broker: a fresh start over output the sink committed is refused, and a newest checkpoint
//! that cannot be read is restored past when the record shows none of its transactions committed
//! — and not when the record is gone (expired, deleted, or never written by an older version).

mod k2k;

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_integration_tests::{create_topic, read_committed, signal, unique, ChildJob, TestEnv};
use k2k::{drain_and_verify, exactly, feed, killed_before_its_commits, Job, KEYS};

const T: Duration = Duration::from_secs(30);

async fn stopped(job: &mut ChildJob, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while job.running() {
        if Instant::now() > deadline {
            bail!("{what}:\n{}", job.tail(40));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The checkpoint directory removed after the job committed output (an operator "starting over",
/// or `checkpoints.dir` pointed somewhere new): the source would start again from its start and
/// the sink write again what readers already have. The sink's record shows its commits, and the
/// start is refused, naming the checkpoint; the output is left as it was. (Before the record,
/// the fresh start went ahead and wrote every record a second time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_start_over_output_the_sink_committed_is_refused() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique("record-in"), unique("record-out"));
    create_topic(env, &input, 2).await?;
    create_topic(env, &output, 2).await?;
    let dir = tempfile::tempdir()?;
    let args = Job::new(&input, &output).write(env, dir.path(), "k2k");
    let next = std::sync::Arc::new(std::sync::Mutex::new(vec![0usize; KEYS]));
    let feeder = feed(env, &input, next.clone());
    let mut job = ChildJob::spawn(exactly(), &args, "")?;
    let deadline = Instant::now() + Duration::from_secs(90);
    while read_committed(env, &output, T)?.len() < 200 {
        if !job.running() || Instant::now() > deadline {
            bail!("no output committed:\n{}", job.tail(40));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    feeder.finish()?;
    signal(job.pid(), "TERM")?;
    stopped(&mut job, "the job did not stop").await?;
    let before = read_committed(env, &output, T)?.len();

    std::fs::remove_dir_all(dir.path().join("checkpoints"))?;
    let mut again = ChildJob::spawn(exactly(), &args, "")?;
    exactly_integration_tests::refused_fresh_start(&mut again)?;
    let after = read_committed(env, &output, T)?.len();
    assert_eq!(after, before, "the output was written again");
    Ok(())
}

/// The newest checkpoint unreadable after a crash between its metadata becoming durable and its
/// commits: the record shows none of its transactions committed, so the job restores the one
/// before, sets the unreadable one aside, aborts the transactions it left open, and the output
/// ends exactly once. (Before the record, the job stopped: the sink could not show it safe.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_newest_checkpoint_none_of_whose_transactions_committed_is_restored_past() -> Result<()> {
    restored_past(2).await
}

/// A job on an input of `input_partitions` (two subtasks) killed between a durable checkpoint
/// and its commits, that checkpoint's metadata damaged: the next run restores the one before,
/// sets the damaged one aside, and the output ends exactly once.
async fn restored_past(input_partitions: i32) -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique("record-in"), unique("record-out"));
    create_topic(env, &input, input_partitions).await?;
    create_topic(env, &output, 2).await?;
    let dir = tempfile::tempdir()?;
    let args = Job::new(&input, &output).write(env, dir.path(), "k2k");
    let (next, _) = killed_before_its_commits(env, &input, &args)?;
    let checkpoints = damage_newest(dir.path())?;

    drain_and_verify(env, &args, &output, &next).await?;
    assert!(
        std::fs::read_dir(&checkpoints)?.any(|e| e.is_ok_and(|e| e.path().join("_metadata.unusable").exists())),
        "the unreadable checkpoint is set aside"
    );
    Ok(())
}

/// The newest checkpoint's metadata, damaged (one flipped byte); returns the checkpoint
/// directory.
fn damage_newest(dir: &std::path::Path) -> Result<std::path::PathBuf> {
    let checkpoints = dir.join("checkpoints");
    exactly_integration_tests::damage_newest_checkpoint(&checkpoints)?;
    Ok(checkpoints)
}

/// As above with a subtask that never wrote (one input partition, two subtasks): its group got a
/// record when it started, so it proves nothing newer committed and the fallback goes ahead. (It
/// was refused before: an idle subtask's group held nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_subtask_does_not_stop_the_fallback() -> Result<()> {
    restored_past(1).await
}

/// As above, but the record is gone (deleted here; expired after `offsets.retention.minutes`, or
/// never written by an older version, look the same): it proves nothing, and the start is refused
/// before anything changes. (It was restored past before: a missing record read as "nothing
/// committed".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_newest_checkpoint_is_not_restored_past_when_the_record_is_gone() -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions};
    let env = TestEnv::get().await?;
    let (input, output) = (unique("record-in"), unique("record-out"));
    create_topic(env, &input, 2).await?;
    create_topic(env, &output, 2).await?;
    let dir = tempfile::tempdir()?;
    let spec = Job::new(&input, &output);
    let args = spec.write(env, dir.path(), "k2k");
    killed_before_its_commits(env, &input, &args)?;
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &env.kafka_bootstrap)
        .create()?;
    let groups: Vec<String> = (0..spec.parallelism)
        .map(|s| format!("{}-progress-{s}", spec.prefix))
        .collect();
    let refs: Vec<&str> = groups.iter().map(String::as_str).collect();
    for r in admin.delete_groups(&refs, &AdminOptions::new()).await? {
        r.map_err(|(g, e)| anyhow::anyhow!("deleting group {g}: {e}"))?;
    }
    damage_newest(dir.path())?;
    let before = read_committed(env, &output, T)?.len();

    let mut again = ChildJob::spawn(exactly(), &args, "")?;
    stopped(&mut again, "the start was not refused").await?;
    let said = again.tail(40);
    assert!(
        said.contains("holds nothing in consumer group") && said.contains("cannot be read"),
        "{said}"
    );
    assert!(
        again.exit_code().is_some_and(|c| c != 0),
        "refused with an error: {said}"
    );
    assert_eq!(read_committed(env, &output, T)?.len(), before, "nothing written");
    Ok(())
}
