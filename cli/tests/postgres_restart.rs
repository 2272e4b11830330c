//! PostgreSQL itself SIGKILLed and restarted (twice) while a two-phase Kafka-to-PostgreSQL job
//! runs: prepared transactions survive the crash, the job recovers, and the table ends with every
//! record exactly once. Alone in its test binary: no other test may use the database while it is
//! down.

mod k2p;

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_integration_tests::{connect_postgres, create_topic, pg_i64, ChildJob, TestEnv};
use k2p::{drain_and_verify, exactly, feed, setup, stop_feed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_killed_and_restarted_mid_run_loses_and_doubles_nothing() -> Result<()> {
    let env = TestEnv::get().await?;
    let Some(services) = env.services_script.clone() else {
        bail!("this test kills and restarts PostgreSQL, which needs the local services (scripts/services up postgres)");
    };
    let dir = tempfile::tempdir()?;
    let s = setup(env, "two_phase", dir.path())?;
    create_topic(env, &s.input, 2).await?;
    let feeder = feed(env, &s)?;
    let mut job = ChildJob::spawn(exactly(), &s.args, "")?;
    let mut conn = connect_postgres().await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while pg_i64(&mut conn, &format!("SELECT COUNT(*) FROM \"{}\"", s.table))
        .await
        .unwrap_or(0)
        < 100
    {
        if Instant::now() > deadline || !job.running() {
            bail!("no rows arrived:\n{}", job.tail(30));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(conn);
    for _ in 0..2 {
        let status = std::process::Command::new(&services).arg("kill-postgres").status()?;
        assert!(status.success(), "kill-postgres");
        tokio::time::sleep(Duration::from_millis(700)).await;
        let status = std::process::Command::new(&services).arg("start-postgres").status()?;
        assert!(status.success(), "start-postgres");
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    stop_feed(feeder)?;
    assert!(
        job.running(),
        "the job survives database restarts (it restarts itself):\n{}",
        job.tail(30)
    );
    job.kill();
    drain_and_verify(env, &s).await
}
