//! End-to-end tests of the runtime: a stateful word count failed at random points and restarted
//! automatically must produce exactly the output of a failure-free run, on both state backends;
//! savepoints restore with another parallelism; unknown state is refused.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::coordinator::{CheckpointConfig, WhenCaughtUp};
use crate::error::{CoreError, ErrorClass};
use crate::message::CheckpointId;
use crate::state::{hash_key, KeyedContext, ValueState};

const WORDS: u64 = 37;

fn word(seq: u64) -> String {
    format!("w{}", hash_key(&seq.to_be_bytes()) % WORDS)
}

/// Emits `seq` for seq = index, index + p, ... < total, in batches, a little at a time.
struct Gen {
    next: u64,
    step: u64,
    total: u64,
    batch: usize,
    pause: Duration,
}

impl Source<u64> for Gen {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> crate::Result<()> {
        // One position per subtask; unchanged parallelism gives each subtask its own back.
        if let Some(pos) = ctx.list_state("pos").first() {
            self.next = u64::from_be_bytes(pos.as_slice().try_into().expect("8 bytes"));
        }
        Ok(())
    }

    async fn poll_next(&mut self, out: &mut Vec<u64>) -> crate::Result<SourceStatus> {
        if self.next >= self.total {
            return Ok(SourceStatus::End);
        }
        while out.len() < self.batch && self.next < self.total {
            out.push(self.next);
            self.next += self.step;
        }
        tokio::time::sleep(self.pause).await;
        Ok(SourceStatus::More)
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> crate::Result<()> {
        ctx.put_list_state("pos", vec![self.next.to_be_bytes().to_vec()]);
        Ok(())
    }
}

fn gen_source(total: u64, pause: Duration) -> impl Fn(&SubtaskInfo) -> Gen + Send + Sync + 'static {
    move |info| Gen {
        next: u64::from(info.index),
        step: u64::from(info.parallelism),
        total,
        batch: 50,
        pause,
    }
}

/// Fails the job at random points, `remaining` times.
struct FailPlan {
    remaining: AtomicU32,
    countdown: AtomicU64,
    seed: AtomicU64,
}

impl FailPlan {
    fn new(failures: u32) -> Arc<Self> {
        Arc::new(FailPlan {
            remaining: AtomicU32::new(failures),
            countdown: AtomicU64::new(700),
            seed: AtomicU64::new(1),
        })
    }

    fn should_fail(&self) -> bool {
        if self.remaining.load(Ordering::SeqCst) == 0 {
            return false;
        }
        if self.countdown.fetch_sub(1, Ordering::SeqCst) != 1 {
            return false;
        }
        let s = self.seed.fetch_add(1, Ordering::SeqCst);
        self.countdown
            .store(200 + hash_key(&s.to_be_bytes()) % 3000, Ordering::SeqCst);
        self.remaining.fetch_sub(1, Ordering::SeqCst);
        true
    }
}

/// Running count per word; emits (word, new count).
struct Count {
    counts: ValueState<u64>,
    fail: Arc<FailPlan>,
}

impl CheckpointedFunction for Count {}
impl CheckpointListener for Count {}

impl KeyedProcessFunction<String, (String, u64)> for Count {
    fn process(
        &mut self,
        w: String,
        state: &mut KeyedContext<'_>,
        out: &mut Collector<'_, (String, u64)>,
    ) -> crate::Result<()> {
        if self.fail.should_fail() {
            return Err(CoreError::operator("count", ErrorClass::Restart, "injected failure"));
        }
        let n = self.counts.get(state)?.unwrap_or(0) + 1;
        self.counts.set(state, &n)?;
        out.emit((w, n))
    }
}

type Committed = Arc<Mutex<BTreeMap<(u32, CheckpointId), Vec<(String, u64)>>>>;

/// A two-phase sink in miniature: output of checkpoint N is staged at the barrier, recorded in the
/// checkpoint, and committed (idempotently, keyed by subtask and checkpoint) once N completes or
/// when a restore finds it staged in the restored checkpoint.
struct StagingSink {
    subtask: u32,
    current: Vec<(String, u64)>,
    staged: BTreeMap<CheckpointId, Vec<(String, u64)>>,
    committed: Committed,
}

impl StagingSink {
    fn commit_up_to(&mut self, id: CheckpointId) {
        let later = self.staged.split_off(&(id + 1));
        let mut committed = self.committed.lock().unwrap();
        for (chk, rows) in std::mem::replace(&mut self.staged, later) {
            committed.insert((self.subtask, chk), rows);
        }
    }
}

impl Sink<(String, u64)> for StagingSink {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> crate::Result<()> {
        // Committed idempotently under the subtask that *staged* the output: after a rescale an
        // entry comes back to whichever subtask the list state hands it to, and the savepoint's
        // own staged output was already committed by its origin when the savepoint completed.
        for entry in ctx.list_state("staged") {
            let (origin, chk, rows): (u32, CheckpointId, Vec<(String, u64)>) = serde_json::from_slice(&entry).unwrap();
            self.committed.lock().unwrap().insert((origin, chk), rows);
        }
        Ok(())
    }
    async fn write(&mut self, records: Vec<(String, u64)>) -> crate::Result<()> {
        self.current.extend(records);
        Ok(())
    }
    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> crate::Result<()> {
        self.staged.insert(ctx.checkpoint_id, std::mem::take(&mut self.current));
        let entries = self
            .staged
            .iter()
            .map(|(chk, rows)| serde_json::to_vec(&(self.subtask, chk, rows)).unwrap())
            .collect();
        ctx.put_list_state("staged", entries);
        Ok(())
    }
    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> crate::Result<()> {
        self.commit_up_to(id);
        Ok(())
    }
}

fn config(dir: &std::path::Path, backend: StateBackendConfig) -> JobConfig {
    let mut checkpoint = CheckpointConfig::new(dir.join("checkpoints"));
    checkpoint.interval = Duration::from_millis(20);
    checkpoint.retained = 2;
    let mut c = JobConfig::new("word-count");
    c.checkpointing = Some(checkpoint);
    c.restart = crate::restart::RestartStrategy::FixedDelay {
        attempts: 100,
        delay: Duration::from_millis(5),
    };
    c.state_backend = backend;
    c.max_parallelism = 32;
    // Failures are injected every few milliseconds of records and the first before the first
    // checkpoint: on a busy machine five attempts can fail before one completes its first
    // checkpoint, which the start-up bound (tested in `restart.rs`) rightly calls a job that does
    // not start (failed so once in a full run: StartupFailed { attempts: 5 }).
    c.startup_attempts = None;
    c
}

fn word_count(
    config: JobConfig,
    total: u64,
    sources: u32,
    counters: u32,
    fail: Arc<FailPlan>,
    committed: Committed,
    pause: Duration,
) -> Job {
    let mut job = JobBuilder::new(config);
    job.source("numbers", sources, gen_source(total, pause))
        .map(word)
        .key_by(|w: &String| w.as_bytes().to_vec())
        .process("count", counters, move |_| Count {
            counts: ValueState::new("count"),
            fail: fail.clone(),
        })
        .sink("out", move |info| StagingSink {
            subtask: info.index,
            current: Vec::new(),
            staged: BTreeMap::new(),
            committed: committed.clone(),
        });
    job.build().unwrap()
}

/// Every count 1..=n of every word committed exactly once.
fn assert_exact(committed: &Committed, total: u64) {
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for seq in 0..total {
        *expected.entry(word(seq)).or_default() += 1;
    }
    let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for rows in committed.lock().unwrap().values() {
        for (w, n) in rows {
            seen.entry(w.clone()).or_default().push(*n);
        }
    }
    assert_eq!(seen.len(), expected.len(), "words");
    for (w, n) in expected {
        let mut counts = seen.remove(&w).unwrap();
        counts.sort_unstable();
        assert_eq!(counts, (1..=n).collect::<Vec<_>>(), "counts of {w}");
    }
}

async fn failing_word_count(backend: StateBackendConfig) {
    let dir = tempfile::tempdir().unwrap();
    let committed: Committed = Arc::default();
    let fail = FailPlan::new(6);
    let total = 30_000;
    let job = word_count(
        config(dir.path(), backend),
        total,
        2,
        3,
        fail.clone(),
        committed.clone(),
        Duration::from_millis(1),
    );
    let outcome = job.run().await.unwrap();
    assert_eq!(
        fail.remaining.load(Ordering::SeqCst),
        0,
        "every injected failure happened"
    );
    // Each restart follows at least one injected failure; two failures can land in one attempt
    // (the second in a task that had not yet stopped), so 1..=6 restarts, never more.
    assert!(
        (1..=6).contains(&outcome.restarts),
        "restarts: {} for 6 injected failures",
        outcome.restarts
    );
    assert!(
        outcome.checkpoints > 6,
        "checkpoints completed: {}",
        outcome.checkpoints
    );
    assert_exact(&committed, total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn word_count_with_random_failures_is_exact_in_memory() {
    failing_word_count(StateBackendConfig::Memory).await;
}

#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn word_count_with_random_failures_is_exact_on_rocksdb() {
    let local = tempfile::tempdir().unwrap();
    failing_word_count(StateBackendConfig::RocksDb {
        local_dir: Some(local.path().to_path_buf()),
        memory_mb: None,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_free_run_is_exact_without_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let committed: Committed = Arc::default();
    let job = word_count(
        config(dir.path(), StateBackendConfig::Memory),
        5_000,
        1,
        1,
        FailPlan::new(0),
        committed.clone(),
        Duration::ZERO,
    );
    let outcome = job.run().await.unwrap();
    assert_eq!(outcome.restarts, 0);
    assert_exact(&committed, 5_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_with_savepoint_then_rescale_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let committed: Committed = Arc::default();
    let total = 20_000;
    // Slow enough that the savepoint lands mid-stream.
    let job = word_count(
        config(dir.path(), StateBackendConfig::Memory),
        total,
        2,
        2,
        FailPlan::new(0),
        committed.clone(),
        Duration::from_millis(2),
    );
    let handle = job.start();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let savepoint = handle.stop_with_savepoint(dir.path().join("savepoints")).await.unwrap();
    let first = handle.join().await.unwrap();
    assert!(!first.cancelled);
    let partial: usize = committed.lock().unwrap().values().map(Vec::len).sum();
    assert!(
        partial > 0 && (partial as u64) < total,
        "stopped mid-stream ({partial} of {total})"
    );

    // Resume from the savepoint with 3 counters instead of 2 and a fresh checkpoint directory.
    let mut cfg = config(&dir.path().join("second"), StateBackendConfig::Memory);
    cfg.restore_from = Some(savepoint.clone());
    let job = word_count(cfg, total, 2, 3, FailPlan::new(0), committed.clone(), Duration::ZERO);
    job.run().await.unwrap();
    assert_exact(&committed, total);

    // A job without the "count" operator cannot take that savepoint's state silently.
    let mut cfg = JobConfig::new("other");
    cfg.restore_from = Some(savepoint);
    let mut job = JobBuilder::new(cfg.clone());
    job.source("numbers", 2, gen_source(10, Duration::ZERO))
        .map(|n| (word(n), n))
        .sink("out", |_| StagingSink {
            subtask: 0,
            current: Vec::new(),
            staged: BTreeMap::new(),
            committed: Arc::default(),
        });
    let err = job.build().unwrap().run().await.unwrap_err();
    assert!(
        matches!(err, CoreError::UnknownOperatorState { ref uids } if uids.contains(&"count".to_owned())),
        "{err}"
    );
    cfg.allow_non_restored_state = true;
    let mut job = JobBuilder::new(cfg);
    job.source("numbers", 2, gen_source(10, Duration::ZERO))
        .map(|n| (word(n), n))
        .sink("out", |_| StagingSink {
            subtask: 0,
            current: Vec::new(),
            staged: BTreeMap::new(),
            committed: Arc::default(),
        });
    job.build().unwrap().run().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_strategy_none_surfaces_the_failure() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), StateBackendConfig::Memory);
    cfg.restart = crate::restart::RestartStrategy::None;
    let job = word_count(cfg, 5_000, 1, 1, FailPlan::new(1), Arc::default(), Duration::ZERO);
    let err = job.run().await.unwrap_err();
    assert!(matches!(err, CoreError::RestartsExhausted { restarts: 0, .. }), "{err}");
    assert!(err.to_string().contains("injected failure"), "{err}");
}

#[test]
fn invalid_jobs_are_refused() {
    let mut job = JobBuilder::new(JobConfig::new("bad"));
    job.source("a", 0, gen_source(1, Duration::ZERO))
        .map(|n| (word(n), n))
        .sink("a", |_| StagingSink {
            subtask: 0,
            current: Vec::new(),
            staged: BTreeMap::new(),
            committed: Arc::default(),
        });
    let err = job.build().err().unwrap().to_string();
    assert!(err.contains("parallelism 0"), "{err}");
}

/// RocksDB's shared memory below what its write buffers need (or absurdly large) is refused when
/// the job is built, naming the setting; within the bounds it builds.
#[cfg(feature = "rocksdb")]
#[test]
fn a_rocksdb_memory_out_of_bounds_is_refused() {
    let build = |mb: Option<u64>| {
        let mut config = JobConfig::new("mem");
        config.state_backend = StateBackendConfig::RocksDb {
            local_dir: None,
            memory_mb: mb,
        };
        let mut job = JobBuilder::new(config);
        job.source("a", 1, gen_source(1, Duration::ZERO))
            .map(|n| (word(n), n))
            .sink("b", |_| StagingSink {
                subtask: 0,
                current: Vec::new(),
                staged: BTreeMap::new(),
                committed: Arc::default(),
            });
        job.build().err().map(|e| e.to_string())
    };
    for mb in [0, 15, (1 << 20) + 1] {
        let err = build(Some(mb)).expect("refused");
        assert!(err.contains("memory_mb") && err.contains(&mb.to_string()), "{err}");
    }
    for mb in [None, Some(16), Some(256), Some(1 << 20)] {
        assert_eq!(build(mb), None, "{mb:?}");
    }
}

/// A forward-only job (source -> map -> staging sink) split over "processes": ranges 0..0 and
/// 1..2 of parallelism 3, each with its own checkpoint directory, each stopped mid-stream and
/// resumed from its own checkpoints. Every number reaches the sink exactly once.
fn forward_job(config: JobConfig, total: u64, committed: Committed, pause: Duration) -> Result<Job> {
    let mut job = JobBuilder::new(config);
    job.source("numbers", 3, gen_source(total, pause))
        .map(|n| (word(n), n))
        .sink("out", move |info| StagingSink {
            subtask: info.index,
            current: Vec::new(),
            staged: BTreeMap::new(),
            committed: committed.clone(),
        });
    job.build()
}

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

fn word_count_build(config: JobConfig) -> Result<Job> {
    let mut job = JobBuilder::new(config);
    job.source("numbers", 2, gen_source(10, Duration::ZERO))
        .map(word)
        .key_by(|w: &String| w.as_bytes().to_vec())
        .process("count", 2, move |_| Count {
            counts: ValueState::new("count"),
            fail: FailPlan::new(0),
        })
        .sink("out", |info| StagingSink {
            subtask: info.index,
            current: Vec::new(),
            staged: BTreeMap::new(),
            committed: Arc::default(),
        });
    job.build()
}

/// Counts initialisations per subtask around a `Gen`.
struct Counted {
    inner: Gen,
    index: u32,
    inits: Arc<Mutex<BTreeMap<u32, u32>>>,
}

impl Source<u64> for Counted {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> crate::Result<()> {
        *self.inits.lock().unwrap().entry(self.index).or_default() += 1;
        self.inner.initialize_state(ctx).await
    }
    async fn poll_next(&mut self, out: &mut Vec<u64>) -> crate::Result<SourceStatus> {
        self.inner.poll_next(out).await
    }
    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> crate::Result<()> {
        self.inner.snapshot_state(ctx).await
    }
}

/// A forward-only job of parallelism 3 whose subtask 1 fails twice mid-stream.
async fn failing_forward_job(failover: FailoverStrategy) -> (BTreeMap<u32, u32>, Committed, u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), StateBackendConfig::Memory);
    cfg.failover = failover;
    let total = 9_000;
    let committed: Committed = Arc::default();
    let inits: Arc<Mutex<BTreeMap<u32, u32>>> = Arc::default();
    let failures = Arc::new(AtomicU32::new(2));
    let mut job = JobBuilder::new(cfg);
    let gen = gen_source(total, Duration::from_millis(1));
    let i2 = inits.clone();
    let c2 = committed.clone();
    job.source("numbers", 3, move |info| Counted {
        inner: gen(info),
        index: info.index,
        inits: i2.clone(),
    })
    .flat_map(move |n: u64, out| {
        // Subtask 1 emits n = 1, 4, 7, ...: fail there, at two points.
        if (n == 3_001 || n == 6_001)
            && failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
                .is_ok()
        {
            return Err(CoreError::operator(
                "check",
                ErrorClass::Restart,
                "injected failure in subtask 1",
            ));
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
    assert_eq!(outcome.restarts, 2);
    let inits = inits.lock().unwrap().clone();
    (inits, committed, total)
}

/// Every committed number, sorted (duplicates kept).
fn committed_numbers(committed: &Committed) -> Vec<u64> {
    let mut seen: Vec<u64> = committed
        .lock()
        .unwrap()
        .values()
        .flat_map(|rows| rows.iter().map(|(_, n)| *n))
        .collect();
    seen.sort_unstable();
    seen
}

fn assert_each_once(case: &str, committed: &Committed, total: u64) {
    let seen = committed_numbers(committed);
    let mut dup = seen.clone();
    dup.dedup();
    let duplicates = seen.len() - dup.len();
    let missing: Vec<u64> = (0..total).filter(|n| dup.binary_search(n).is_err()).take(10).collect();
    assert_eq!(
        (duplicates, missing.as_slice()),
        (0, &[][..]),
        "{case}: {} seen of {total}",
        seen.len()
    );
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

/// All committed (word, count) rows.
fn committed_rows(committed: &Committed) -> Vec<(String, u64)> {
    committed.lock().unwrap().values().flatten().cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_newest_checkpoint_stops_the_job_instead_of_replaying_from_an_older_one() {
    let dir = tempfile::tempdir().unwrap();
    let committed: Committed = Arc::default();
    let job = word_count(
        config(dir.path(), StateBackendConfig::Memory),
        20_000,
        1,
        1,
        FailPlan::new(0),
        committed.clone(),
        Duration::from_millis(2),
    );
    let handle = job.start();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let newest = handle.stop().await.unwrap();
    handle.join().await.unwrap();
    let before = committed_rows(&committed).len();
    assert!(before > 0);
    // One flipped byte in the newest checkpoint's metadata.
    let md = newest.join("_metadata");
    let mut bytes = std::fs::read(&md).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&md, bytes).unwrap();

    let job = word_count(
        config(dir.path(), StateBackendConfig::Memory),
        20_000,
        1,
        1,
        FailPlan::new(0),
        committed.clone(),
        Duration::ZERO,
    );
    let err = job.run().await.unwrap_err();
    // Its sink keeps no record of what it committed: it cannot show that restoring the previous
    // checkpoint is safe.
    assert!(matches!(err, CoreError::FallbackNotProven { .. }), "{err}");
    assert!(err.to_string().contains("metadata checksum mismatch"), "{err}");
    assert_eq!(committed_rows(&committed).len(), before, "nothing written again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_directory_whose_checkpoints_vanished_refuses_to_start_from_the_beginning() {
    let dir = tempfile::tempdir().unwrap();
    let committed: Committed = Arc::default();
    let run = |committed: Committed| {
        word_count(
            config(dir.path(), StateBackendConfig::Memory),
            2_000,
            1,
            1,
            FailPlan::new(0),
            committed,
            Duration::ZERO,
        )
    };
    run(committed.clone()).run().await.unwrap();
    for entry in std::fs::read_dir(dir.path().join("checkpoints")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_str().unwrap().starts_with("chk-") {
            std::fs::remove_dir_all(path).unwrap();
        }
    }
    let again: Committed = Arc::default();
    let err = run(again.clone()).run().await.unwrap_err();
    assert!(matches!(err, CoreError::CheckpointsVanished(_)), "{err}");
    assert!(committed_rows(&again).is_empty(), "nothing written again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_older_savepoint_needs_accept_replay_and_then_wins_over_newer_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let total = 20_000;
    let committed: Committed = Arc::default();
    let job = word_count(
        config(dir.path(), StateBackendConfig::Memory),
        total,
        1,
        1,
        FailPlan::new(0),
        committed.clone(),
        Duration::from_millis(1),
    );
    let handle = job.start();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let savepoint = handle.savepoint(dir.path().join("savepoints")).await.unwrap();
    // The job goes on to the end of its input: newer checkpoints follow the savepoint.
    handle.join().await.unwrap();
    assert_exact(&committed, total);

    let again = |accept_replay: bool, committed: Committed| {
        let mut cfg = config(dir.path(), StateBackendConfig::Memory);
        cfg.restore_from = Some(savepoint.clone());
        cfg.accept_replay = accept_replay;
        word_count(cfg, total, 1, 1, FailPlan::new(0), committed, Duration::ZERO)
    };
    let refused: Committed = Arc::default();
    let err = again(false, refused.clone()).run().await.unwrap_err();
    assert!(matches!(err, CoreError::RestoreOlderThanNewest { .. }), "{err}");
    assert!(err.to_string().contains("--accept-replay"), "{err}");
    assert!(committed_rows(&refused).is_empty());

    // Accepted: the savepoint is restored (counts continue from its state, so none starts at 1,
    // and the input after it is read again), not the newest checkpoint (which would add nothing).
    let replayed: Committed = Arc::default();
    again(true, replayed.clone()).run().await.unwrap();
    let rows = committed_rows(&replayed);
    assert!(
        !rows.is_empty(),
        "the savepoint's position was restored, not the end of input"
    );
    assert!(
        rows.len() < total as usize,
        "not from the beginning: {} rows",
        rows.len()
    );
    // And a restart of that job later restores its own checkpoints, not those from before.
    // (Started again with the same snapshot, a job continues from the checkpoints made since;
    // restoring it once more on purpose means clearing the location's record of that restore.)
    std::fs::remove_file(dir.path().join("checkpoints").join("_restore")).unwrap();
    let mut cfg = config(dir.path(), StateBackendConfig::Memory);
    cfg.restore_from = Some(savepoint.clone());
    cfg.accept_replay = true;
    let fail = FailPlan::new(1);
    let restarted: Committed = Arc::default();
    let outcome = word_count(
        cfg,
        total,
        1,
        1,
        fail.clone(),
        restarted.clone(),
        Duration::from_millis(1),
    )
    .run()
    .await
    .unwrap();
    assert_eq!(fail.remaining.load(Ordering::SeqCst), 0, "the failure happened");
    assert!(outcome.restarts >= 1);
    let mut rows = committed_rows(&restarted);
    rows.sort();
    let before = rows.len();
    rows.dedup();
    assert_eq!(rows.len(), before, "the restarted attempt did not write anything twice");
    assert_eq!(
        rows.len(),
        committed_rows(&replayed).len(),
        "same output as the failure-free replay"
    );
}

/// A process started again with the same `--from` (a pod whose `FROM` is still set) continues from
/// the checkpoints it made since that restore, not from the snapshot (which would write again what
/// they committed) and not with an error (which asked for `--accept-replay`: a replay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_restore_twice_continues_from_the_checkpoints_made_since() {
    let dir = tempfile::tempdir().unwrap();
    let total = 20_000;
    let committed: Committed = Arc::default();
    let job = word_count(
        config(dir.path(), StateBackendConfig::Memory),
        total,
        1,
        1,
        FailPlan::new(0),
        committed.clone(),
        Duration::from_millis(1),
    );
    let handle = job.start();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let savepoint = handle.savepoint(dir.path().join("savepoints")).await.unwrap();
    handle.join().await.unwrap();

    // A new deployment with its own checkpoint directory starts from the savepoint, twice.
    let moved = tempfile::tempdir().unwrap();
    let from_savepoint = |committed: Committed| {
        let mut cfg = config(moved.path(), StateBackendConfig::Memory);
        cfg.restore_from = Some(savepoint.clone());
        word_count(cfg, total, 1, 1, FailPlan::new(0), committed, Duration::ZERO)
    };
    let first: Committed = Arc::default();
    from_savepoint(first.clone()).run().await.unwrap();
    let rows = committed_rows(&first);
    assert!(!rows.is_empty() && rows.len() < total as usize, "{} rows", rows.len());
    let second: Committed = Arc::default();
    from_savepoint(second.clone()).run().await.unwrap();
    assert_only_recommitted(&first, &second);
}

/// `later` restored the final checkpoint of the run that committed `earlier`: at most that
/// checkpoint's output is committed again (idempotently, under the same subtask and checkpoint),
/// nothing of its own.
fn assert_only_recommitted(earlier: &Committed, later: &Committed) {
    let (earlier, later) = (earlier.lock().unwrap(), later.lock().unwrap());
    for (key, rows) in later.iter().filter(|(_, rows)| !rows.is_empty()) {
        assert_eq!(earlier.get(key), Some(rows), "written again: checkpoint {key:?}");
    }
}

/// RocksDB state restored from another checkpoint location (`--from /backup/chk-N`, a local
/// directory moved to an object store): the restored SST files live there, not in the job's own
/// location, so the job's checkpoints must not merely reference them — once the other location is
/// gone, its own newest checkpoint must still restore. Before, the restored files counted as
/// already uploaded, and the restart after the old location went failed ("missing").
#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocksdb_state_restored_from_another_location_is_copied_into_the_jobs_own() {
    use crate::storage::{CheckpointStorage, Storage};
    let local = tempfile::tempdir().unwrap();
    let backend = || StateBackendConfig::RocksDb {
        local_dir: Some(local.path().to_path_buf()),
        memory_mb: None,
    };
    let other = tempfile::tempdir().unwrap();
    // Only the checkpoint at the end of input: one SST a run, never enough for a compaction.
    let backend_config = |dir: &std::path::Path| {
        let mut c = config(dir, backend());
        c.checkpointing.as_mut().expect("on").interval = Duration::from_secs(3600);
        c
    };
    let run = |cfg: JobConfig, total: u64, committed: Committed| {
        word_count(cfg, total, 1, 1, FailPlan::new(0), committed, Duration::ZERO).run()
    };
    let first: Committed = Arc::default();
    run(config(other.path(), backend()), 1_000, first.clone())
        .await
        .unwrap();
    let storage = Storage::new(other.path().join("checkpoints")).unwrap();
    let newest = *storage.completed().unwrap().last().unwrap();
    let shared_names = |s: &crate::storage::Snapshot| -> Vec<String> {
        s.meta
            .files()
            .filter(|f| f.scope == crate::checkpoint::FileScope::Shared)
            .map(|f| f.name.clone())
            .collect()
    };
    assert!(
        !shared_names(&storage.open(newest).unwrap()).is_empty(),
        "shared SST files to restore"
    );

    let own = tempfile::tempdir().unwrap();
    let mut cfg = backend_config(own.path());
    cfg.restore_from = Some(storage.checkpoint_dir(newest));
    // A few records more, and few files restored: RocksDB compacts none of them away.
    let second: Committed = Arc::default();
    run(cfg, 1_050, second.clone()).await.unwrap();
    assert!(
        !committed_rows(&second).is_empty(),
        "went on from the restored position"
    );
    let own_storage = Storage::new(own.path().join("checkpoints")).unwrap();
    let latest = own_storage
        .latest()
        .expect("the job's own newest checkpoint restores")
        .unwrap();
    let restored = shared_names(&storage.open(newest).unwrap());
    assert!(
        shared_names(&latest).iter().any(|n| restored.contains(n)),
        "the newest checkpoint still uses a restored file (else this test shows nothing)"
    );
    // The other location goes (a backup deleted, an old directory cleared).
    std::fs::remove_dir_all(other.path()).unwrap();
    for f in latest.meta.files() {
        latest.reader.read(f).unwrap();
    }
    assert_eq!(own_storage.latest().unwrap().unwrap().meta.id, latest.meta.id);
    let third: Committed = Arc::default();
    run(backend_config(own.path()), 1_050, third.clone()).await.unwrap();
    assert_only_recommitted(&second, &third);
}

/// A run whose checkpoint location another run took over (its owner record names another run)
/// stops at its next checkpoint with a fatal error naming the other run, and makes no further
/// checkpoint durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_location_was_taken_over_stops_at_its_next_checkpoint() {
    use crate::storage::{CheckpointStorage, Storage};
    let dir = tempfile::tempdir().unwrap();
    let job = word_count(
        config(dir.path(), StateBackendConfig::Memory),
        1_000_000,
        1,
        1,
        FailPlan::new(0),
        Arc::default(),
        Duration::from_millis(1),
    );
    let run = job.start();
    let storage = Storage::new(dir.path().join("checkpoints")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while storage.completed().unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no checkpoint");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("checkpoints/_owner")).unwrap()).unwrap();
    record["id"] = "a-later-run".into();
    record["host"] = "another-host".into();
    // Into place atomically, as a claim is written: the run may read it at any moment.
    let tmp = dir.path().join("checkpoints/_owner.test");
    std::fs::write(&tmp, serde_json::to_vec(&record).unwrap()).unwrap();
    std::fs::rename(&tmp, dir.path().join("checkpoints/_owner")).unwrap();
    let taken_over = storage.completed().unwrap().len();
    let err = tokio::time::timeout(Duration::from_secs(30), run.join())
        .await
        .expect("the run stops")
        .unwrap_err();
    assert!(
        matches!(err, CoreError::LocationOwned { ref reason, .. } if reason.contains("another-host")),
        "{err}"
    );
    assert_eq!(err.class(), ErrorClass::Fatal);
    // At most the one whose check had passed when the record changed.
    assert!(storage.completed().unwrap().len() <= taken_over + 1);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&std::fs::read(dir.path().join("checkpoints/_owner")).unwrap())
            .unwrap()["id"],
        "a-later-run",
        "the other run's record is left alone"
    );
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
    match failover {
        FailoverStrategy::Full => assert_eq!(outcome.restarts, 3, "{failover:?}"),
        // A failure while another region is restarting joins that restart (by design: "its
        // region restarts together with the others failing now"): under load two of the three
        // can overlap — a full run on 2 busy cores counted 2.
        _ => assert!(
            (1..=3).contains(&outcome.restarts),
            "{failover:?}: {} restarts for 3 failures",
            outcome.restarts
        ),
    }
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

/// Each completed checkpoint reports the bytes it wrote to checkpoint storage: with RocksDB,
/// exactly the files its metadata references that the checkpoint before did not (new SST files,
/// the small private ones), not the whole state.
#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_reports_the_bytes_it_wrote_not_the_whole_state() {
    use crate::checkpoint::FileScope;
    use crate::storage::{CheckpointStorage, Storage};
    use std::collections::HashSet;
    let dir = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let mut cfg = config(
        dir.path(),
        StateBackendConfig::RocksDb {
            local_dir: Some(local.path().to_path_buf()),
            memory_mb: None,
        },
    );
    cfg.checkpointing.as_mut().expect("on").retained = 10_000;
    let job = word_count(
        cfg,
        20_000,
        1,
        1,
        FailPlan::new(0),
        Arc::default(),
        Duration::from_micros(200),
    );
    let handle = job.start();
    let metrics = handle.metrics();
    handle.join().await.unwrap();
    let stats = metrics.checkpoints();
    assert_eq!(stats.written.len(), stats.durations.len());
    let storage = Storage::new(dir.path().join("checkpoints")).unwrap();
    let ids = storage.completed().unwrap();
    assert_eq!(ids.len(), stats.written.len(), "every completed checkpoint retained");
    assert!(ids.len() >= 3, "a few checkpoints: {}", ids.len());
    let mut before: HashSet<String> = HashSet::new();
    let mut smaller = 0;
    for (id, written) in ids.iter().zip(&stats.written) {
        let meta = storage.open(*id).unwrap().meta;
        let new: u64 = meta
            .files()
            .filter(|f| f.scope == FileScope::Private || !before.contains(&f.name))
            .map(|f| f.size)
            .sum();
        assert_eq!(*written, new, "checkpoint {id}");
        if new < meta.files().map(|f| f.size).sum::<u64>() {
            smaller += 1;
        }
        before = meta
            .files()
            .filter(|f| f.scope == FileScope::Shared)
            .map(|f| f.name.clone())
            .collect();
    }
    assert!(smaller > 0, "some checkpoint wrote less than its state");
    assert_eq!(stats.last_written, *stats.written.last().unwrap());
}

/// Every RocksDB instance of a job in one process draws on one memory budget: the backend
/// factory is made per task, and when each made its own budget, two subtasks held two block
/// caches of the configured size (`bench state` showed resident memory growing by twice the
/// budget and two caches in RocksDB's log). Writes through backends of two factories both show in
/// the job's one budget.
#[cfg(feature = "rocksdb")]
#[test]
fn every_rocksdb_instance_of_a_job_shares_its_memory_budget() {
    let local = tempfile::tempdir().unwrap();
    let mut cfg = JobConfig::new("budget");
    cfg.state_backend = StateBackendConfig::RocksDb {
        local_dir: Some(local.path().to_path_buf()),
        memory_mb: Some(64),
    };
    let job = word_count(cfg, 1, 1, 2, FailPlan::new(0), Arc::default(), Duration::ZERO);
    let mut backends = Vec::new();
    for index in 0..2 {
        let factory = job.backend_factory(None);
        let mut b = factory(&SubtaskInfo::new("count", index, 2), None).unwrap();
        // 4 MiB of values: in the write buffer, charged to the budget.
        for k in 0..1024u32 {
            b.put(&k.to_be_bytes(), &[7u8; 4096]).unwrap();
        }
        backends.push(b);
    }
    let memory = job.rocksdb_memory.get().expect("made for the first backend");
    assert_eq!(memory.bytes(), 64 << 20);
    // Each instance's write buffer is charged in whole reservations of its arena; both are in
    // the one budget.
    assert!(
        memory.usage() >= 7 << 20,
        "usage {} of one budget for two instances",
        memory.usage()
    );
}
