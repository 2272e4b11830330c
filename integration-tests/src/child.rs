use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A job running as a child process, its stderr collected; killed with SIGKILL on drop.
pub struct ChildJob {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// The reader has seen the end of the child's stderr: `lines` holds all it wrote.
    eof: Arc<AtomicBool>,
}

impl ChildJob {
    /// Starts `program args`, with `EXACTLY_FAILPOINTS` set to `failpoints` (empty: none).
    pub fn spawn(program: &str, args: &[String], failpoints: &str) -> Result<Self> {
        Self::spawn_env(program, args, failpoints, &[])
    }

    /// [`ChildJob::spawn`] with the environment changed: each variable set to its value, or
    /// removed (`None`).
    pub fn spawn_env(program: &str, args: &[String], failpoints: &str, env: &[(&str, Option<&str>)]) -> Result<Self> {
        let mut cmd = Command::new(program);
        for (k, v) in env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
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
        let eof = Arc::new(AtomicBool::new(false));
        let (sink, end) = (lines.clone(), eof.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(std::result::Result::ok) {
                sink.lock().expect("not poisoned").push(line);
            }
            end.store(true, Ordering::SeqCst);
        });
        Ok(ChildJob { child, lines, eof })
    }

    /// Once the child has exited: waits (at most 10 s) until the reader has every line it wrote.
    /// A busy machine may run the exit before the reader's last lines: a check of the log right
    /// after would otherwise see part of it (seen as an empty log of a job that failed at start).
    fn read_to_end(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.eof.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether the child has exited; if so, its whole output has been read.
    fn exited(&mut self) -> Result<Option<std::process::ExitStatus>> {
        let status = self.child.try_wait()?;
        if status.is_some() {
            self.read_to_end();
        }
        Ok(status)
    }

    /// The last `n` lines the child wrote to stderr.
    pub fn tail(&self, n: usize) -> String {
        let lines = self.lines.lock().expect("not poisoned");
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// How many lines the child has written to stderr so far.
    pub fn line_count(&self) -> usize {
        self.lines.lock().expect("not poisoned").len()
    }

    /// The lines the child wrote to stderr from line `from` (a [`ChildJob::line_count`]) on.
    pub fn lines_from(&self, from: usize) -> Vec<String> {
        let lines = self.lines.lock().expect("not poisoned");
        lines.get(from..).unwrap_or_default().to_vec()
    }

    /// The last `n` lines the child wrote to stderr, without the backtrace lines indented under
    /// an error.
    pub fn log(&self, n: usize) -> String {
        self.last_lines(n, |_| true)
    }

    /// The last `n` lines that `keep`, without the backtrace lines indented under an error.
    fn last_lines(&self, n: usize, keep: impl Fn(&str) -> bool) -> String {
        let lines = self.lines.lock().expect("not poisoned");
        let kept: Vec<&str> = lines
            .iter()
            .map(String::as_str)
            .filter(|l| !l.starts_with(' ') && keep(l))
            .collect();
        kept[kept.len().saturating_sub(n)..].join("\n")
    }

    /// [`ChildJob::log`] without the lines of completed checkpoints, which a job checkpointing
    /// every 200 ms writes so often that they hide what else it said; with how many were left out.
    pub fn log_but_checkpoints(&self, n: usize) -> String {
        let checkpoint = |l: &str| l.contains("Checkpoint complete.");
        let left_out = self
            .lines
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|l| checkpoint(l))
            .count();
        format!(
            "{}\n({left_out} 'Checkpoint complete.' lines left out)",
            self.last_lines(n, |l| !checkpoint(l))
        )
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
        let written = |job: &Self| job.lines.lock().expect("not poisoned").iter().any(|l| l.trim() == line);
        loop {
            if written(self) {
                return Ok(());
            }
            if let Some(status) = self.exited()? {
                // It may have written the line just before it exited.
                if written(self) {
                    return Ok(());
                }
                bail!("the job exited ({status}) before it could {what}:\n{}", self.tail(40));
            }
            if Instant::now() > deadline {
                bail!("the job did not {what} within {timeout:?}:\n{}", self.tail(40));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the child is still running (once it is not, its whole output has been read).
    pub fn running(&mut self) -> bool {
        matches!(self.exited(), Ok(None))
    }

    /// The exit code once the child has exited (`None` while it runs or if a signal ended it);
    /// its whole output has been read then.
    pub fn exit_code(&mut self) -> Option<i32> {
        self.exited().ok().flatten().and_then(|s| s.code())
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
    fails_at_start_env(program, args, &[], expected)
}

/// [`fails_at_start`] with `env` set (or, for `None`, removed) in the child's environment.
pub fn fails_at_start_env(
    program: &str,
    args: &[String],
    env: &[(&str, Option<&str>)],
    expected: &[&str],
) -> Result<String> {
    let mut job = ChildJob::spawn_env(program, args, "", env)?;
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

/// Waits (up to 60 s) for `job`, started afresh over output its sink committed, to refuse to
/// start: it exits with an error that names the committed checkpoint and `--accept-replay`.
/// Returns what it said.
pub fn refused_fresh_start(job: &mut ChildJob) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while job.running() {
        if Instant::now() > deadline {
            bail!("the fresh start was not refused:\n{}", job.tail(40));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let said = job.tail(40);
    assert!(
        said.contains("committed, but the job starts afresh") && said.contains("--accept-replay"),
        "{said}"
    );
    assert!(job.exit_code().is_some_and(|c| c != 0), "refused with an error: {said}");
    Ok(said)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that writes more than a pipe holds and exits at once: by the time its exit is
    /// seen, the reader may still have lines to read. Once `running` says it is gone, every line
    /// is there (before, a job failing at start was once seen with an empty log on a busy machine).
    #[test]
    fn once_the_child_has_exited_its_whole_output_is_read() {
        for _ in 0..5 {
            let mut job =
                ChildJob::spawn("sh", &["-c".to_owned(), "seq 1 30000 >&2; exit 1".to_owned()], "").expect("sh runs");
            while job.running() {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(job.tail(1), "30000", "the last line of the output");
            assert_eq!(job.lines.lock().expect("not poisoned").len(), 30000);
            assert_eq!(job.exit_code(), Some(1));
        }
    }
}
