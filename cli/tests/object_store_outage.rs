//! The object store holding a job's checkpoints (SeaweedFS, started by `scripts/services`) is
//! SIGKILLed while a Kafka-to-Kafka exactly-once job runs, and restarted 8 s later: checkpoints
//! fail while it is gone (their output stays uncommitted), the job goes on without restarting, checkpoints and
//! commits resume when it is back, and the read_committed output ends exactly once. Then the
//! store is killed again and the job with it, and started again while the store is still gone
//! (a supervisor restarting it): it waits for the store, trying again every 2 s at most, however
//! long that takes, and resumes when the store is back. Alone in its test binary: no other test
//! may use the store while it is down.

mod k2k;

use std::time::Duration;

use anyhow::Result;
use exactly_integration_tests::{read_committed, unique, ChildJob, TestEnv};
use k2k::{wait_for_more_output, Job, Running};

/// Starts the store again when the test ends while it is down (a failed assertion), so that the
/// tests after this one find it.
struct StoreBack<'a> {
    env: &'a TestEnv,
    address: String,
}

impl Drop for StoreBack<'_> {
    fn drop(&mut self) {
        if std::net::TcpStream::connect(&self.address).is_err() {
            let _ = self.env.services("start-s3");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_store_killed_mid_run_fails_checkpoints_not_the_job() -> Result<()> {
    let env = TestEnv::get().await?;
    let s3 = env.s3()?;
    let _back = StoreBack {
        env,
        address: s3.endpoint.trim_start_matches("http://").to_owned(),
    };
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

    // Down again, and the job killed with it: a supervisor starts it again at once. Its start
    // cannot read the location, for longer than five attempts to start take (the start-up
    // bound, with the back-off, gave up after about 18 s).
    run.feed_again(env)?;
    env.services("kill-s3")?;
    run.job.kill();
    run.job = ChildJob::spawn(k2k::exactly(), &run.args, "")?;
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert!(
        run.job.running(),
        "a job started while its checkpoint store is down must wait for it, not exit:\n{}",
        run.job.log(40)
    );
    let during = read_committed(env, &run.output, Duration::from_secs(30))?.len();
    env.services("start-s3")?;
    let (after, took) = wait_for_more_output(env, &run.output, during, &mut run.job, Duration::from_secs(120)).await?;
    let log = run.job.log(usize::MAX);
    if took > Duration::from_secs(10) {
        eprintln!("slow resume after the restart; the job's log:\n{}", run.job.log(200));
    }
    let waits: Vec<&str> = log.lines().filter(|l| l.contains("waiting_s=")).collect();
    assert!(!waits.is_empty(), "the job's log says it waits:\n{log}");
    for line in &waits {
        // The delay the job chose (not a measured time): the cadence of its attempts.
        let delay_ms: u64 = line
            .split("delay_ms=")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no delay_ms in {line}"));
        assert!(delay_ms <= 2_000, "waited {delay_ms} ms between attempts: {line}");
    }
    eprintln!(
        "job restarted while the store was down 25 s: {} attempts to start, committed records {during} at the end of the outage, {after} {took:?} after it was back",
        waits.len() + 1
    );
    let (_, out, _) = run.finish(env).await?;
    eprintln!("{out} records out, 0 duplicates, 0 missing");
    Ok(())
}
