//! A job run by the binary while a feeder writes its input, for the scenarios that fault a
//! service under it.

use super::*;

/// A job run by the binary while [`feed`] writes its input, returned once its first records are
/// committed: the scenarios that fault a service under a running job start with it and end with
/// [`Running::finish`].
pub(crate) struct Running {
    /// The job's directory (its job file and checkpoints), when [`Running::on_new_topics`] made it.
    _dir: Option<tempfile::TempDir>,
    pub(crate) args: Vec<String>,
    input: String,
    pub(crate) output: String,
    next: Arc<std::sync::Mutex<Vec<usize>>>,
    feeder: Option<Feeder>,
    /// Records fed by feeders already stopped.
    fed: usize,
    pub(crate) job: ChildJob,
    /// Records committed when it was returned.
    pub(crate) committed: usize,
}

impl Running {
    /// On fresh topics `NAME-in` and `NAME-out` of three partitions, the job whose file `job`
    /// writes (given the input, the output and a directory of its own).
    pub(crate) async fn on_new_topics(
        env: &TestEnv,
        name: &str,
        job: impl FnOnce(&str, &str, &Path) -> Vec<String>,
    ) -> Result<Running> {
        let (input, output) = (unique(&format!("{name}-in")), unique(&format!("{name}-out")));
        create_topic(env, &input, 3).await?;
        create_topic(env, &output, 3).await?;
        let dir = tempfile::tempdir()?;
        let args = job(&input, &output, dir.path());
        let mut run = Running::spawn(env, &input, &output, args, &[]).await?;
        run._dir = Some(dir);
        Ok(run)
    }

    /// Feeds `input` and runs the job of `args` (reading `input`, writing `output`), with `job_env`
    /// set or removed in its environment; waits (90 s at most) for its first commit.
    pub(crate) async fn spawn(
        env: &TestEnv,
        input: &str,
        output: &str,
        args: Vec<String>,
        job_env: &[(&str, Option<&str>)],
    ) -> Result<Running> {
        let next = Arc::new(std::sync::Mutex::new(vec![0usize; KEYS]));
        let feeder = feed(env, input, next.clone());
        let mut job = ChildJob::spawn_env(exactly(), &args, "", job_env)?;
        let committed = wait_for_more_output(env, output, 0, &mut job, Duration::from_secs(90))
            .await?
            .0;
        Ok(Running {
            _dir: None,
            args,
            input: input.to_owned(),
            output: output.to_owned(),
            next,
            feeder: Some(feeder),
            fed: 0,
            job,
            committed,
        })
    }

    /// The job's input topic.
    pub(crate) fn input(&self) -> &str {
        &self.input
    }

    /// Records fed by the feeders stopped so far.
    pub(crate) fn fed(&self) -> usize {
        self.fed
    }

    /// Stops feeding (a feeder cannot produce while the broker hangs).
    pub(crate) fn stop_feeding(&mut self) -> Result<()> {
        if let Some(feeder) = self.feeder.take() {
            self.fed += feeder.finish()?;
        }
        Ok(())
    }

    /// Why the feeder stopped on its own (it failed to produce), if it did: a job that commits
    /// nothing new may simply have been given nothing.
    pub(crate) fn feeder_failure(&mut self) -> Option<String> {
        if !self.feeder.as_ref()?.handle.is_finished() {
            return None;
        }
        let feeder = self.feeder.take()?;
        Some(match feeder.handle.join() {
            Ok(Ok(sent)) => {
                self.fed += sent;
                format!("the feeder ended after {sent} records")
            }
            Ok(Err(e)) => format!("the feeder failed: {e:#}"),
            Err(_) => "the feeder panicked".to_owned(),
        })
    }

    /// The high watermarks of the input's and the output's three partitions, for a failure's
    /// message: an input that grew while the committed output did not means the job (or the
    /// output's last stable offset) stalled, not the feeder.
    pub(crate) fn ends(&self, env: &TestEnv) -> String {
        let ends = |topic: &str| -> String {
            (0..3)
                .map(|p| match high_watermark(env, topic, p, Duration::from_secs(10)) {
                    Ok(end) => end.to_string(),
                    Err(e) => format!("? ({e:#})"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "input ends [{}], output ends [{}]",
            ends(&self.input),
            ends(&self.output)
        )
    }

    /// Feeds the input again after [`Running::stop_feeding`].
    pub(crate) fn feed_again(&mut self, env: &TestEnv) -> Result<()> {
        self.stop_feeding()?;
        self.feeder = Some(feed(env, &self.input, self.next.clone()));
        Ok(())
    }

    /// Stops feeding; the job must still run. SIGKILLs it, then drains and checks the output
    /// (every record once, in order per key, and `exactly verify`). Returns the records fed and
    /// out, and how many times the job restarted an attempt.
    pub(crate) async fn finish(mut self, env: &TestEnv) -> Result<(usize, usize, usize)> {
        self.stop_feeding()?;
        assert!(
            self.job.running(),
            "the job exited (code {:?}):\n{}",
            self.job.exit_code(),
            self.job.log(40)
        );
        let log = self.job.tail(1_000_000);
        let restarts: Vec<&str> = log.lines().filter(|l| l.contains("restarting")).collect();
        for line in &restarts {
            // Why each attempt restarted (a restart is allowed; its cause tells whether it had to be).
            eprintln!("restart: {}", line.chars().take(400).collect::<String>());
        }
        let restarts = restarts.len();
        self.job.kill();
        let out = drain_and_verify(env, &self.args, &self.output, &self.next).await?;
        Ok((self.fed, out, restarts))
    }

    /// Stops feeding, then the job with SIGTERM, as a service manager stops it, and waits (60 s at
    /// most) for it to exit after its final checkpoint; then drains and checks the output as
    /// [`Running::finish`] does. Returns the records fed and out.
    pub(crate) async fn stop(mut self, env: &TestEnv) -> Result<(usize, usize)> {
        self.stop_feeding()?;
        signal(self.job.pid(), "TERM")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.job.running() {
            if Instant::now() > deadline {
                bail!("the job did not exit within 60 s of SIGTERM:\n{}", self.job.log(40));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let log = self.job.tail(20);
        assert!(log.contains("Final checkpoint complete."), "{log}");
        let out = drain_and_verify(env, &self.args, &self.output, &self.next).await?;
        Ok((self.fed, out))
    }
}
