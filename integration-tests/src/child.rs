use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A job running as a child process, its stderr collected; killed with SIGKILL on drop.
pub struct ChildJob {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl ChildJob {
    /// Starts `program args`, with `EXACTLY_FAILPOINTS` set to `failpoints` (empty: none).
    pub fn spawn(program: &str, args: &[String], failpoints: &str) -> Result<Self> {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if failpoints.is_empty() {
            cmd.env_remove("EXACTLY_FAILPOINTS");
        } else {
            cmd.env("EXACTLY_FAILPOINTS", failpoints);
        }
        let mut child = cmd.spawn().with_context(|| format!("starting {program}"))?;
        let stderr = child.stderr.take().expect("piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(std::result::Result::ok) {
                sink.lock().expect("not poisoned").push(line);
            }
        });
        Ok(ChildJob { child, lines })
    }

    /// The last `n` lines the child wrote to stderr.
    pub fn tail(&self, n: usize) -> String {
        let lines = self.lines.lock().expect("not poisoned");
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The last `n` lines the child wrote to stderr, without the backtrace lines indented under
    /// an error.
    pub fn log(&self, n: usize) -> String {
        let lines = self.lines.lock().expect("not poisoned");
        let kept: Vec<&str> = lines
            .iter()
            .filter(|l| !l.starts_with(' '))
            .map(String::as_str)
            .collect();
        kept[kept.len().saturating_sub(n)..].join("\n")
    }

    /// Waits until the child reports reaching fail point `name`; fails if it exits or the
    /// deadline passes first.
    pub fn wait_for_failpoint(&mut self, name: &str, timeout: Duration) -> Result<()> {
        self.wait_until_written(&format!("FAILPOINT {name}"), &format!("reach {name}"), timeout)
    }

    /// Waits until the child writes `line` (trimmed) on stderr — e.g. `FAILPOINT NAME delay` for
    /// a delay fail point; fails if it exits or the deadline passes first.
    pub fn wait_for_line(&mut self, line: &str, timeout: Duration) -> Result<()> {
        self.wait_until_written(line, &format!("write {line:?}"), timeout)
    }

    /// Waits for `line`; `what` says what the child did not do, in the error.
    fn wait_until_written(&mut self, line: &str, what: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self
                .lines
                .lock()
                .expect("not poisoned")
                .iter()
                .any(|l| l.trim() == line)
            {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("the job exited ({status}) before it could {what}:\n{}", self.tail(40));
            }
            if Instant::now() > deadline {
                bail!("the job did not {what} within {timeout:?}:\n{}", self.tail(40));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the child is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The exit code once the child has exited (`None` while it runs or if a signal ended it).
    pub fn exit_code(&mut self) -> Option<i32> {
        self.child.try_wait().ok().flatten().and_then(|s| s.code())
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The child's pid (to SIGSTOP / SIGCONT it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildJob {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `program args` and expects it to fail at start: exit code 1 within 90 s, with every one
/// of `expected` in its log. Returns the log (without backtraces).
pub fn fails_at_start(program: &str, args: &[String], expected: &[&str]) -> Result<String> {
    let mut job = ChildJob::spawn(program, args, "")?;
    let deadline = Instant::now() + Duration::from_secs(90);
    while job.running() {
        if Instant::now() > deadline {
            bail!(
                "still running after 90 s (expected a failure at start):\n{}",
                job.tail(20)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = job.log(30);
    assert_eq!(job.exit_code(), Some(1), "{log}");
    for e in expected {
        assert!(log.contains(e), "expected {e:?} in:\n{log}");
    }
    Ok(log)
}

/// Sends `signal` (e.g. "STOP", "CONT") to `pid` with kill(1).
pub fn signal(pid: u32, signal: &str) -> Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()?;
    if !status.success() {
        bail!("kill -{signal} {pid} failed");
    }
    Ok(())
}

/// Runs `program verify` (the `exactly` binary) on a job file: `input` against `output`
/// (`mysql:TABLE`, `postgres:TABLE`, `topic:NAME`) by the `id` field, servers and credentials from
/// the job. Fails with the report unless it says exactly once.
pub fn verify_job(program: &str, job_file: &str, input: &str, output: &str, id: &str) -> Result<()> {
    let out = std::process::Command::new(program)
        .args(["verify", "--source", input, "--output", output, "--id", id])
        .args(["--job", job_file])
        .output()?;
    if out.status.code() != Some(0) {
        bail!(
            "exactly verify found {output} not exactly once (exit {:?}):\n{}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
