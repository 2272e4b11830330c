//! The `exactly` image as a user runs it (`scripts/images build exactly`): `--version`, then a
//! Kafka-to-Kafka exactly-once job in a container — the job file and the checkpoints on a mounted
//! directory, the broker reached over the host's network — killed with `docker kill` (SIGKILL)
//! while input arrives, and started again as a new container on the same directory. The output
//! then holds every input record once, in order per key, and `exactly verify` agrees.

mod docker;
mod k2k;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use docker::docker;
use exactly_integration_tests::{create_topic, read_committed, unique, TestEnv};

/// A container removed when the test ends, whatever happened.
struct Container(String);

impl Container {
    fn run(image: &str, dir: &std::path::Path) -> Result<Container> {
        let name = unique("exactly-job");
        let volume = format!("{}:/state", dir.display());
        let label = docker::run_label();
        docker(&[
            "run",
            "-d",
            "--name",
            &name,
            "--label",
            &label,
            "--network",
            "host",
            "-v",
            &volume,
            image,
            "run",
            "/state/k2k.toml",
        ])?;
        Ok(Container(name))
    }

    fn running(&self) -> bool {
        docker(&["inspect", "-f", "{{.State.Running}}", &self.0]).is_ok_and(|s| s == "true")
    }

    fn logs(&self) -> String {
        docker::logs(&self.0, 40)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

/// Waits until the output holds at least `n` committed records, the container still running.
async fn output_reaches(env: &TestEnv, output: &str, n: usize, c: &Container) -> Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let seen = read_committed(env, output, Duration::from_secs(30))?.len();
        if seen >= n {
            return Ok(seen);
        }
        if !c.running() || Instant::now() > deadline {
            bail!(
                "the output has {seen} of {n} records; the container's log:\n{}",
                c.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_a_job_that_is_exactly_once_across_a_docker_kill() -> Result<()> {
    let env = TestEnv::get().await?;
    let image = docker::image("EXACTLY_IMAGE_EXACTLY")?;
    let version = docker(&["run", "--rm", &image, "--version"])?;
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");

    let input = unique("container-in");
    let output = unique("container-out");
    create_topic(env, &input, 3).await?;
    create_topic(env, &output, 3).await?;
    let dir = tempfile::tempdir()?;
    // The image runs as a user of its own: it must be able to write the checkpoints there.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    let mut job = k2k::Job::new(&input, &output);
    job.checkpoints = Some("/state/checkpoints".into());
    let args = job.write(env, dir.path(), "k2k");

    let next = Arc::new(std::sync::Mutex::new(vec![0usize; k2k::KEYS]));
    let feeder = k2k::feed(env, &input, next.clone());
    let first = Container::run(&image, dir.path())?;
    let before = output_reaches(env, &output, 400, &first).await?;
    docker(&["kill", &first.0])?;
    let exit = docker(&["inspect", "-f", "{{.State.ExitCode}}", &first.0])?;
    assert_eq!(exit, "137", "killed by SIGKILL");
    assert!(
        std::fs::read_dir(dir.path().join("checkpoints"))?.next().is_some(),
        "the killed job left its checkpoints on the mounted directory"
    );

    let second = Container::run(&image, dir.path())?;
    output_reaches(env, &output, before + 400, &second).await?;
    feeder.finish()?;
    let expected: usize = next.lock().unwrap().iter().sum();
    output_reaches(env, &output, expected, &second).await?;
    // A duplicate, if any, has the time to show up.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = read_committed(env, &output, Duration::from_secs(30))?;
    drop(second);
    k2k::check_exactly_once(&seen, &next.lock().unwrap())?;
    assert_eq!(seen.len(), expected);
    k2k::exactly_verify(&args[1], &["--id", "@value"])?;
    eprintln!("{expected} records through two containers, the first killed after {before} were out");
    Ok(())
}
