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

#[cfg(feature = "rocksdb")]
#[path = "tests_rocksdb.rs"]
mod rocksdb;

#[path = "tests_caught_up.rs"]
mod caught_up;
#[path = "tests_regions.rs"]
mod regions;
#[path = "tests_restore.rs"]
mod restore;

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

/// All committed (word, count) rows.
fn committed_rows(committed: &Committed) -> Vec<(String, u64)> {
    committed.lock().unwrap().values().flatten().cloned().collect()
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
