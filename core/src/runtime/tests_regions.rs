//! Subtask ranges over processes, region failover, regions failing together and fan-outs.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subtask_ranges_split_a_forward_job_over_processes() {
    let dir = tempfile::tempdir().unwrap();
    let committed: Committed = Arc::default();
    let total = 6_000;
    let ranges = [SubtaskRange { first: 0, last: 0 }, SubtaskRange { first: 1, last: 2 }];
    let cfg = |r: SubtaskRange| {
        let mut c = config(&dir.path().join(format!("range-{r}")), StateBackendConfig::Memory);
        c.subtasks = Some(r);
        c
    };
    let mut handles = Vec::new();
    for r in ranges {
        let job = forward_job(cfg(r), total, committed.clone(), Duration::from_millis(10)).unwrap();
        handles.push(job.start());
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    for h in handles {
        h.stop().await.unwrap();
        h.join().await.unwrap();
    }
    let partial: usize = committed.lock().unwrap().values().map(Vec::len).sum();
    assert!(
        partial > 0 && (partial as u64) < total,
        "stopped mid-stream ({partial} of {total})"
    );
    for r in ranges {
        let job = forward_job(cfg(r), total, committed.clone(), Duration::ZERO).unwrap();
        let outcome = job.run().await.unwrap();
        assert!(outcome.checkpoints > 0);
    }
    assert_each_once("split over processes", &committed, total);

    // A range cannot split a job whose records cross subtasks, nor exceed the parallelism.
    let mut c = cfg(SubtaskRange { first: 0, last: 0 });
    let err = word_count_build(c.clone()).err().unwrap().to_string();
    assert!(err.contains("forward edges only"), "{err}");
    c.subtasks = Some(SubtaskRange { first: 1, last: 3 });
    let err = forward_job(c, 1, Arc::default(), Duration::ZERO)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("below the parallelism (3)"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn region_failover_restarts_only_the_failed_region() {
    let (inits, committed, total) = failing_forward_job(FailoverStrategy::Region).await;
    assert_eq!(
        inits,
        BTreeMap::from([(0, 1), (1, 3), (2, 1)]),
        "only subtask 1 restarted"
    );
    assert_each_once("region", &committed, total);

    let (inits, committed, total) = failing_forward_job(FailoverStrategy::Full).await;
    assert_eq!(inits, BTreeMap::from([(0, 3), (1, 3), (2, 3)]), "everything restarted");
    assert_each_once("full", &committed, total);
}

/// An outage of a shared service fails several regions at once: they restart together, as one
/// restart, while the healthy region keeps running. Before, the second failure arriving while the
/// first region stopped failed the whole run (every region restarted, two restarts counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_failing_together_restart_together_as_one_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), StateBackendConfig::Memory);
    // Long enough that the second failure (milliseconds after the first) lands within it.
    cfg.restart = crate::restart::RestartStrategy::FixedDelay {
        attempts: 10,
        delay: Duration::from_secs(1),
    };
    let total = 9_000;
    let committed: Committed = Arc::default();
    let inits: Arc<Mutex<BTreeMap<u32, u32>>> = Arc::default();
    // Subtask 0 fails at n = 1 500; subtask 2 fails at its next record after that (the outage).
    let outage = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failed = Arc::new(Mutex::new(BTreeSet::<u32>::new()));
    let mut job = JobBuilder::new(cfg);
    let gen = gen_source(total, Duration::from_millis(1));
    let (i2, c2) = (inits.clone(), committed.clone());
    job.source("numbers", 3, move |info| Counted {
        inner: gen(info),
        index: info.index,
        inits: i2.clone(),
    })
    .flat_map(move |n: u64, out| {
        let subtask = (n % 3) as u32;
        let hit = match subtask {
            0 => n >= 1_500,
            2 => outage.load(Ordering::SeqCst),
            _ => false,
        };
        if hit && failed.lock().unwrap().insert(subtask) {
            outage.store(true, Ordering::SeqCst);
            return Err(CoreError::operator("check", ErrorClass::Restart, "injected outage"));
        }
        out.emit((word(n), n))
    })
    .sink("out", move |info| StagingSink {
        subtask: info.index,
        current: Vec::new(),
        staged: BTreeMap::new(),
        committed: c2.clone(),
    });
    let outcome = job.build().unwrap().run().await.unwrap();
    assert_eq!(outcome.restarts, 1, "one restart for both regions");
    assert_eq!(
        *inits.lock().unwrap(),
        BTreeMap::from([(0, 2), (1, 1), (2, 2)]),
        "regions 0 and 2 restarted together, region 1 kept running"
    );
    assert_each_once("two regions", &committed, total);
}

/// One source fanned out to two sinks (one of them behind a filter): every record reaches each
/// sink exactly once despite failures, with region failover and with full restarts; both sinks
/// commit on the same checkpoints.
async fn fanned_out_job(failover: FailoverStrategy) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), StateBackendConfig::Memory);
    cfg.failover = failover;
    let total = 9_000;
    let all: Committed = Arc::default();
    let even: Committed = Arc::default();
    let failures = Arc::new(AtomicU32::new(3));
    let left = failures.clone();
    let mut job = JobBuilder::new(cfg);
    let mut branches = job
        .source("numbers", 3, gen_source(total, Duration::from_millis(1)))
        .map(|n| (word(n), n))
        .fan_out(&["all", "even"])
        .into_iter();
    let staging = |committed: Committed| {
        move |info: &SubtaskInfo| StagingSink {
            subtask: info.index,
            current: Vec::new(),
            staged: BTreeMap::new(),
            committed: committed.clone(),
        }
    };
    branches.next().unwrap().sink("all-out", staging(all.clone()));
    branches
        .next()
        .unwrap()
        .flat_map(move |(w, n): (String, u64), out| {
            // The second branch fails (its region, or the job) now and then.
            if n % 2_000 == 1_001
                && failures
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
                    .is_ok()
            {
                return Err(CoreError::operator("even", ErrorClass::Restart, "injected failure"));
            }
            if n % 2 == 0 {
                out.emit((w, n))?;
            }
            Ok(())
        })
        .sink("even-out", staging(even.clone()));
    let outcome = job.build().unwrap().run().await.unwrap();
    assert_eq!(
        left.load(Ordering::SeqCst),
        0,
        "{failover:?}: all three failures injected"
    );
    // Failures in one attempt share its restart. With region failover a failure while another
    // region is restarting joins that restart (by design: "its region restarts together with the
    // others failing now"); with full restarts a subtask may fail before the first failure has
    // stopped it (the failing numbers belong to different subtasks, which a loaded machine runs
    // far apart: both strategies counted 2 on 2 busy cores).
    assert!(
        (1..=3).contains(&outcome.restarts),
        "{failover:?}: {} restarts for 3 failures",
        outcome.restarts
    );
    assert_each_once(&format!("{failover:?}: first branch"), &all, total);
    assert_eq!(
        committed_numbers(&even),
        (0..total).filter(|n| n % 2 == 0).collect::<Vec<_>>(),
        "{failover:?}: second branch, each even number once"
    );
    // Same checkpoints: each branch committed output under the same (subtask, checkpoint) keys
    // where it had output.
    let keys = |c: &Committed| c.lock().unwrap().keys().copied().collect::<BTreeSet<_>>();
    assert!(keys(&even).is_subset(&keys(&all)), "{failover:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_feeds_each_sink_exactly_once_with_region_failover() {
    fanned_out_job(FailoverStrategy::Region).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_feeds_each_sink_exactly_once_with_full_restarts() {
    fanned_out_job(FailoverStrategy::Full).await;
}

#[test]
fn a_fan_out_branch_without_a_sink_is_refused() {
    let mut job = JobBuilder::new(JobConfig::new("dangling"));
    let mut branches = job
        .source("numbers", 1, gen_source(1, Duration::ZERO))
        .map(|n| (word(n), n))
        .fan_out(&["a", "b"]);
    branches.pop().unwrap().sink("a-out", |_| StagingSink {
        subtask: 0,
        current: Vec::new(),
        staged: BTreeMap::new(),
        committed: Arc::default(),
    });
    drop(branches);
    let err = job.build().err().unwrap().to_string();
    assert!(err.contains("dropped before reaching a sink"), "{err}");
    // No branch, or two with one name: refused too.
    for names in [&[][..], &["a", "a"][..]] {
        let mut job = JobBuilder::new(JobConfig::new("bad fan-out"));
        for b in job
            .source("numbers", 1, gen_source(1, Duration::ZERO))
            .map(|n| (word(n), n))
            .fan_out(names)
            .into_iter()
            .enumerate()
        {
            b.1.sink(&format!("out-{}", b.0), |_| StagingSink {
                subtask: 0,
                current: Vec::new(),
                staged: BTreeMap::new(),
                committed: Arc::default(),
            });
        }
        let err = job.build().err().unwrap().to_string();
        assert!(
            err.contains("at least one branch, each with its own name"),
            "{names:?}: {err}"
        );
    }
}
