//! Checkpoints taken when sources report they caught up (`when_caught_up`), and by default.

use super::*;

/// Emits its numbers at once, then finds nothing new (a burst read to its end); says `status`
/// with them.
struct Burst {
    left: Vec<u64>,
    status: SourceStatus,
}

impl Source<u64> for Burst {
    async fn poll_next(&mut self, out: &mut Vec<u64>) -> crate::Result<SourceStatus> {
        if self.left.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
            return Ok(SourceStatus::Idle);
        }
        out.append(&mut self.left);
        Ok(self.status)
    }
}

/// A backlog: 10 numbers every 10 ms, each poll saying `Backlog`, for `reading`; then nothing new.
struct Backlogged {
    next: u64,
    step: u64,
    until: Option<std::time::Instant>,
    reading: Duration,
}

impl Source<u64> for Backlogged {
    async fn poll_next(&mut self, out: &mut Vec<u64>) -> crate::Result<SourceStatus> {
        let until = *self
            .until
            .get_or_insert_with(|| std::time::Instant::now() + self.reading);
        tokio::time::sleep(Duration::from_millis(if std::time::Instant::now() < until {
            10
        } else {
            5
        }))
        .await;
        if std::time::Instant::now() >= until {
            return Ok(SourceStatus::Idle);
        }
        for _ in 0..10 {
            out.push(self.next);
            self.next += self.step;
        }
        Ok(SourceStatus::Backlog)
    }
}

/// Runs `source` over two subtasks into a staging sink with a 20 s checkpoint interval; returns
/// the numbers committed and the checkpoints completed once `until` holds or `limit` passed.
async fn two_sources_until<S: Source<u64> + 'static>(
    source: impl Fn(&SubtaskInfo) -> S + Send + Sync + 'static,
    when_caught_up: WhenCaughtUp,
    limit: Duration,
    until: impl Fn(usize) -> bool,
) -> (usize, u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), StateBackendConfig::Memory);
    let c = cfg.checkpointing.as_mut().unwrap();
    c.interval = Duration::from_secs(20);
    c.when_caught_up = when_caught_up;
    let committed: Committed = Arc::default();
    let mut job = JobBuilder::new(cfg);
    job.source("numbers", 2, source).map(|n| (word(n), n)).sink("out", {
        let committed = committed.clone();
        move |info| StagingSink {
            subtask: info.index,
            current: Vec::new(),
            staged: BTreeMap::new(),
            committed: committed.clone(),
        }
    });
    let handle = job.build().unwrap().start();
    let count = || committed.lock().unwrap().values().map(Vec::len).sum::<usize>();
    let deadline = std::time::Instant::now() + limit;
    while !until(count()) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let result = (count(), handle.metrics().checkpoints().completed);
    handle.cancel();
    handle.join().await.unwrap();
    result
}

/// A burst of 1 000 numbers over two source subtasks, then idleness (see `two_sources_until`).
async fn burst_then_idle(when_caught_up: WhenCaughtUp, limit: Duration, until: impl Fn(usize) -> bool) -> (usize, u64) {
    let burst = |info: &SubtaskInfo| Burst {
        left: (0..1_000).filter(|n| n % 2 == u64::from(info.index)).collect(),
        status: SourceStatus::More,
    };
    two_sources_until(burst, when_caught_up, limit, until).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_when_caught_up_a_burst_commits_before_the_interval_and_idleness_triggers_nothing_more() {
    // Early checkpoints wait a tenth of the 20 s interval: the burst commits after ≈2 s.
    let (committed, checkpoints) = burst_then_idle(WhenCaughtUp::Always, Duration::from_secs(15), |n| n == 1_000).await;
    assert_eq!(committed, 1_000, "the burst committed by an early checkpoint");
    assert_eq!(checkpoints, 1, "one checkpoint for the burst");
    // Caught up with nothing read since: no checkpoint storm (watched for 5 s, two and a half
    // times the early trigger's minimum distance).
    let (committed, checkpoints) = burst_then_idle(WhenCaughtUp::Always, Duration::from_secs(7), |_| false).await;
    assert_eq!(
        (committed, checkpoints),
        (1_000, 1),
        "nothing read since: no further checkpoint"
    );
}

/// Steady traffic: one number every 4 ms, each poll saying `CaughtUp` (read all there was),
/// never `Idle`.
struct Trickle {
    next: u64,
    step: u64,
}

impl Source<u64> for Trickle {
    async fn poll_next(&mut self, out: &mut Vec<u64>) -> crate::Result<SourceStatus> {
        tokio::time::sleep(Duration::from_millis(4)).await;
        out.push(self.next);
        self.next += self.step;
        Ok(SourceStatus::CaughtUp)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_when_caught_up_sources_that_report_caught_up_with_records_commit_before_the_interval() {
    // Two subtasks that always find a record and never go idle: only `CaughtUp` tells the
    // coordinator they keep up. Early checkpoints wait a tenth of the 20 s interval (2 s).
    let trickle = |info: &SubtaskInfo| Trickle {
        next: u64::from(info.index),
        step: 2,
    };
    let (n, checkpoints) = two_sources_until(trickle, WhenCaughtUp::Always, Duration::from_secs(10), |n| n > 0).await;
    assert!(
        n > 0 && checkpoints > 0,
        "nothing committed in 10 s of a 20 s interval ({checkpoints} checkpoints)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_when_caught_up_a_burst_waits_for_the_interval() {
    let (committed, checkpoints) = burst_then_idle(WhenCaughtUp::Never, Duration::from_secs(5), |_| false).await;
    assert_eq!(
        (committed, checkpoints),
        (0, 0),
        "nothing commits before the 20 s interval"
    );
}

/// Two subtasks reading a backlog for `reading` (see `Backlogged`), with `when_caught_up`.
async fn backlog_then_idle(
    reading: Duration,
    when_caught_up: WhenCaughtUp,
    limit: Duration,
    until: impl Fn(usize) -> bool,
) -> (usize, u64) {
    let backlog = move |info: &SubtaskInfo| Backlogged {
        next: u64::from(info.index),
        step: 2,
        until: None,
        reading,
    };
    two_sources_until(backlog, when_caught_up, limit, until).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_backlog_commits_once_read_and_nothing_follows() {
    assert_eq!(CheckpointConfig::new("x").when_caught_up, WhenCaughtUp::AfterBacklog);
    // 3 s of `Backlog` polls: over a tenth of the 20 s interval. Read to its end, it commits.
    let reading = Duration::from_secs(3);
    let (committed, checkpoints) =
        backlog_then_idle(reading, WhenCaughtUp::AfterBacklog, Duration::from_secs(15), |n| n > 0).await;
    assert!(committed > 0, "the backlog did not commit before the 20 s interval");
    assert_eq!(checkpoints, 1, "one checkpoint for the backlog");
    // Then idle: nothing more (watched 5 s past the backlog's end).
    let (committed, checkpoints) =
        backlog_then_idle(reading, WhenCaughtUp::AfterBacklog, Duration::from_secs(8), |_| false).await;
    assert!(committed > 0);
    assert_eq!(checkpoints, 1, "idle after the backlog: no further checkpoint");
    // Interval only: the same backlog waits.
    let (committed, checkpoints) =
        backlog_then_idle(reading, WhenCaughtUp::Never, Duration::from_secs(6), |_| false).await;
    assert_eq!(
        (committed, checkpoints),
        (0, 0),
        "when_caught_up = false: at the interval only"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_short_backlog_or_a_trickle_waits_for_the_interval() {
    // `Backlog` for less than a tenth of the interval (one poll; 0.5 s of polls): a burst, not
    // a backlog worth a checkpoint of its own.
    let burst = |info: &SubtaskInfo| Burst {
        left: (0..1_000).filter(|n| n % 2 == u64::from(info.index)).collect(),
        status: SourceStatus::Backlog,
    };
    let (committed, checkpoints) =
        two_sources_until(burst, WhenCaughtUp::AfterBacklog, Duration::from_secs(5), |_| false).await;
    assert_eq!((committed, checkpoints), (0, 0), "a one-poll burst");
    let (committed, checkpoints) = backlog_then_idle(
        Duration::from_millis(500),
        WhenCaughtUp::AfterBacklog,
        Duration::from_secs(5),
        |_| false,
    )
    .await;
    assert_eq!((committed, checkpoints), (0, 0), "half a second of backlog");
    // Steady traffic the sources keep up with: caught up at every poll, no backlog.
    let trickle = |info: &SubtaskInfo| Trickle {
        next: u64::from(info.index),
        step: 2,
    };
    let (committed, checkpoints) =
        two_sources_until(trickle, WhenCaughtUp::AfterBacklog, Duration::from_secs(5), |_| false).await;
    assert_eq!((committed, checkpoints), (0, 0), "a trickle");
}
