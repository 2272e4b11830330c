//! Helpers of the CLI tests: job files written for one test's topics, free ports, the binary.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use exactly_integration_tests::{ChildJob, TestEnv};

/// The `exactly` binary under test.
pub fn exactly() -> &'static str {
    env!("CARGO_BIN_EXE_exactly")
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Settings of a Kafka-to-Kafka job file.
pub struct K2k<'a> {
    pub env: &'a TestEnv,
    pub name: &'a str,
    pub input: &'a str,
    pub output: &'a str,
    pub prefix: &'a str,
    pub dir: &'a Path,
    pub parallelism: u32,
    pub admin: Option<u16>,
    /// Extra `[[transform]]` tables.
    pub transforms: &'a str,
}

impl K2k<'_> {
    /// Writes the job file into `dir` and returns its path.
    pub fn write(&self) -> PathBuf {
        let admin = self
            .admin
            .map_or(String::new(), |p| format!("admin = \"127.0.0.1:{p}\""));
        let text = format!(
            r#"
[job]
name = "{name}"
parallelism = {parallelism}
{admin}

[checkpoints]
dir = "{dir}"
interval = "500ms"
timeout = "20s"
retained = 2
tolerable_failures = 100

[restart]
type = "fixed_delay"
attempts = 20
delay = "200ms"

[source]
bootstrap_servers = "{bootstrap}"
topics = ["{input}"]
group_id = "{name}"

{transforms}

[sink.kafka]
bootstrap_servers = "{bootstrap}"
topic = "{output}"
delivery = {{ type = "exactly_once", transactional_id_prefix = "{prefix}", pool_size = 3, transaction_timeout = "2m" }}
"#,
            name = self.name,
            parallelism = self.parallelism,
            dir = self.dir.join("checkpoints").display(),
            bootstrap = self.env.kafka_bootstrap,
            input = self.input,
            output = self.output,
            prefix = self.prefix,
            transforms = self.transforms,
        );
        let path = self.dir.join(format!("{}.toml", self.name));
        std::fs::write(&path, text).expect("write job file");
        path
    }
}

/// `exactly run FILE ARGS...` as a child process (stderr collected, SIGKILL on drop).
pub fn spawn_run(file: &Path, args: &[&str], failpoints: &str) -> Result<ChildJob> {
    let mut all = vec!["run".to_owned(), file.display().to_string()];
    all.extend(args.iter().map(|s| (*s).to_owned()));
    ChildJob::spawn(exactly(), &all, failpoints)
}

/// The JSON status of the job behind `port`, once it answers.
pub fn status(port: u16) -> Result<serde_json::Value> {
    exactly_cli::admin::get(&format!("127.0.0.1:{port}"), "/status")
}

/// Waits until `f(status)` holds.
pub fn wait_status(
    job: &mut ChildJob,
    port: u16,
    what: &str,
    timeout: Duration,
    f: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(s) = status(port) {
            if f(&s) {
                return Ok(s);
            }
        }
        if !job.running() {
            bail!("the job exited while waiting for {what}:\n{}", job.tail(40));
        }
        if Instant::now() > deadline {
            bail!(
                "timed out after {timeout:?} waiting for {what}; status {:?}\n{}",
                status(port).ok(),
                job.tail(40)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for the child to exit on its own.
pub fn wait_exit(job: &mut ChildJob, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while job.running() {
        if Instant::now() > deadline {
            bail!("the job did not exit within {timeout:?}:\n{}", job.tail(40));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Orders `range` as (key, JSON value) records keyed by id.
pub fn orders(range: std::ops::Range<u64>) -> Vec<(String, String)> {
    range
        .map(|i| (i.to_string(), exactly_cli::datagen::order(i).to_string()))
        .collect()
}
