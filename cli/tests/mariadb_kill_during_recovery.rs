//! MariaDB SIGKILLed while a restarted Kafka-to-MySQL XA job commits the branches its restored
//! checkpoint prepared (the job was killed after the checkpoint became durable, before its
//! commits): the prepared branches survive the database's crash, the job commits them once
//! MariaDB is back, and the table ends with every record exactly once (no primary key on the
//! record id: a duplicate would be a second row). Twice: once just before the XA COMMITs, once as
//! they run. Alone in its test binary: no other test may use the database while it is down.

mod k2m;

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{ensure, Result};
use exactly_integration_tests::{create_topic, ChildJob, TestEnv};
use k2m::{drain_and_verify, exactly, feed, prepared_branches, setup, stop_feed, wait_rows};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_killed_while_restored_branches_commit_loses_and_doubles_nothing() -> Result<()> {
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let s = setup(env, "xa", dir.path());
    create_topic(env, &s.input, 2).await?;
    for (round, wait_ms) in [(0, 1300u64), (1, 1600)] {
        // Kill the job once a durable checkpoint's branches are prepared and not yet committed.
        // A checkpoint whose transactions were all empty (the input had nothing new for those
        // subtasks yet) prepares no branch: kill later and try again.
        let mut prepared = 0;
        for attempt in 0..5 {
            let feeder = feed(env, &s)?;
            let spec = format!("checkpoint.after_durable=freeze@{}", 3 + 2 * attempt);
            let mut job = ChildJob::spawn(exactly(), &s.args, &spec)?;
            job.wait_for_failpoint("checkpoint.after_durable", Duration::from_secs(60))?;
            job.kill();
            stop_feed(feeder)?;
            prepared = prepared_branches(env, &s).await?;
            if prepared > 0 {
                break;
            }
            eprintln!("round {round}: no branch prepared at {spec}; again, later");
        }
        ensure!(
            prepared > 0,
            "round {round}: no killed job left a prepared branch to commit"
        );

        // The restart pauses 1.5 s before committing the restored branches; MariaDB dies then.
        let mut job = ChildJob::spawn(exactly(), &s.args, "sink.before_recovery_commit=delay@1500ms")?;
        job.wait_for_line("FAILPOINT sink.before_recovery_commit delay", Duration::from_secs(60))?;
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        env.services("kill-mysql")?;
        tokio::time::sleep(Duration::from_millis(700)).await;
        env.services("start-mysql")?;
        let fed = s.next_id.load(Ordering::SeqCst) as i64;
        wait_rows(env, &s, &mut job, fed, Duration::from_secs(120)).await?;
        eprintln!("round {round}: {prepared} prepared branches, MariaDB killed {wait_ms} ms into the commit pause; all {fed} rows in");
        job.kill();
    }
    drain_and_verify(env, &s).await
}
