//! Savepoints stay restorable across changes of the checkpoint format.
//!
//! `tests/fixtures/format-v1/` holds savepoints written by the first checkpoint format (metadata
//! and keyed state in bincode), one per state backend, of the word count below stopped after
//! 1 000 numbers. Each test restores one (copied first: a restore must not need to write to it),
//! reads the next 1 000 numbers, takes a savepoint in today's format, restores that and reads
//! 1 000 more: every count, and every count per bucket (map state under keys that encode
//! differently in the two formats), must go on from where it was, once.
//!
//! `a_savepoint_of_todays_format_restores` runs the same from a fresh start; with
//! `EXACTLY_STATE_FIXTURE_OUT=DIR` it also copies its first savepoint to `DIR/<backend>/`, which is
//! how the fixtures were made (see the fixture directory's README).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use exactly_core::coordinator::CheckpointConfig;
use exactly_core::restart::RestartStrategy;
use exactly_core::runtime::{
    CheckpointListener, CheckpointedFunction, Collector, InitContext, JobBuilder, JobConfig, JobHandle, Sink,
    SnapshotContext, Source, SourceStatus, StateBackendConfig,
};
use exactly_core::state::{KeyedContext, MapState, ValueState};
use exactly_core::CheckpointId;

/// Few words, so that counts pass 128 and 251, where the two formats' integers differ.
const WORDS: u64 = 5;
const STEP: u64 = 1_000;

fn word(seq: u64) -> String {
    format!("w{}", seq % WORDS)
}

/// The bucket of `seq`: map keys of 0, 1 000 and 2 000 (encoded differently in the two formats).
fn bucket(seq: u64) -> u64 {
    (seq / WORDS % 3) * 1_000
}

/// Numbers `index, index + parallelism, …` below `to`, then idle (or the end with `end`).
struct Numbers {
    next: u64,
    step: u64,
    to: u64,
    end: bool,
}

impl Source<u64> for Numbers {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        if let Some(pos) = ctx.list_state("pos").first() {
            self.next = u64::from_be_bytes(pos.as_slice().try_into().expect("8 bytes"));
        }
        Ok(())
    }

    async fn poll_next(&mut self, out: &mut Vec<u64>) -> exactly_core::Result<SourceStatus> {
        if self.next >= self.to {
            if self.end {
                return Ok(SourceStatus::End);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            return Ok(SourceStatus::Idle);
        }
        while out.len() < 20 && self.next < self.to {
            out.push(self.next);
            self.next += self.step;
        }
        Ok(SourceStatus::More)
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        ctx.put_list_state("pos", vec![self.next.to_be_bytes().to_vec()]);
        Ok(())
    }
}

/// (word, its count, bucket, the word's count in that bucket)
type Row = (String, u64, u64, u64);

/// Counts per word (value state) and per word and bucket (map state).
struct Count {
    counts: ValueState<u64>,
    buckets: MapState<u64, u64>,
}

impl CheckpointedFunction for Count {}
impl CheckpointListener for Count {}

impl exactly_core::runtime::KeyedProcessFunction<u64, Row> for Count {
    fn process(
        &mut self,
        seq: u64,
        state: &mut KeyedContext<'_>,
        out: &mut Collector<'_, Row>,
    ) -> exactly_core::Result<()> {
        let n = self.counts.get(state)?.unwrap_or(0) + 1;
        self.counts.set(state, &n)?;
        let b = bucket(seq);
        let m = self.buckets.get(state, &b)?.unwrap_or(0) + 1;
        self.buckets.put(state, &b, &m)?;
        out.emit((word(seq), n, b, m))
    }
}

type Committed = Arc<Mutex<Vec<Row>>>;

/// Rows become visible when the checkpoint that covers them completes.
struct Staging {
    current: Vec<Row>,
    staged: BTreeMap<CheckpointId, Vec<Row>>,
    committed: Committed,
}

impl Sink<Row> for Staging {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        for entry in ctx.list_state("staged") {
            let rows: Vec<Row> = serde_json::from_slice(&entry).expect("staged rows");
            self.committed.lock().unwrap().extend(rows);
        }
        Ok(())
    }
    async fn write(&mut self, records: Vec<Row>) -> exactly_core::Result<()> {
        self.current.extend(records);
        Ok(())
    }
    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        self.staged.insert(ctx.checkpoint_id, std::mem::take(&mut self.current));
        let entries = self
            .staged
            .values()
            .map(|rows| serde_json::to_vec(rows).unwrap())
            .collect();
        ctx.put_list_state("staged", entries);
        Ok(())
    }
    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> exactly_core::Result<()> {
        let later = self.staged.split_off(&(id + 1));
        let done = std::mem::replace(&mut self.staged, later);
        self.committed.lock().unwrap().extend(done.into_values().flatten());
        Ok(())
    }
}

fn backend(name: &str, dir: &Path) -> StateBackendConfig {
    match name {
        "memory" => StateBackendConfig::Memory,
        _ => StateBackendConfig::RocksDb {
            local_dir: Some(dir.join("rocksdb-local")),
            memory_mb: None,
        },
    }
}

/// The word count over numbers below `to`, on `counters` counting subtasks, restored from `from`.
fn start(
    dir: &Path,
    state: &str,
    to: u64,
    counters: u32,
    from: Option<PathBuf>,
    end: bool,
    committed: Committed,
) -> JobHandle {
    let mut checkpoint = CheckpointConfig::new(dir.join("checkpoints"));
    checkpoint.interval = Duration::from_millis(50);
    let mut config = JobConfig::new("format-fixture");
    config.checkpointing = Some(checkpoint);
    config.restart = RestartStrategy::None;
    config.state_backend = backend(state, dir);
    config.max_parallelism = 32;
    config.restore_from = from;
    let mut job = JobBuilder::new(config);
    job.source("numbers", 2, move |info| Numbers {
        next: u64::from(info.index),
        step: u64::from(info.parallelism),
        to,
        end,
    })
    .key_by(|seq: &u64| word(*seq).into_bytes())
    .process("count", counters, |_| Count {
        counts: ValueState::new("count"),
        buckets: MapState::new("buckets"),
    })
    .sink("out", move |_| Staging {
        current: Vec::new(),
        staged: BTreeMap::new(),
        committed: committed.clone(),
    });
    job.build().expect("job builds").start()
}

/// The rows of the numbers `from..to`, after the counts of `0..from`: every word's counts are
/// exactly the next ones, `c + 1 ..= c'` (its occurrences below `from`, then below `to`), and so
/// are its counts per bucket. (Which number got which count depends on how the two sources'
/// records interleave; that the counts go on, once each, does not.)
fn assert_counts_go_on(rows: &[Row], from: u64, to: u64) {
    let occurrences = |below: u64| {
        let mut words: BTreeMap<String, u64> = BTreeMap::new();
        let mut buckets: BTreeMap<(String, u64), u64> = BTreeMap::new();
        for seq in 0..below {
            *words.entry(word(seq)).or_default() += 1;
            *buckets.entry((word(seq), bucket(seq))).or_default() += 1;
        }
        (words, buckets)
    };
    let (words_before, buckets_before) = occurrences(from);
    let (words_after, buckets_after) = occurrences(to);
    let mut words: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut buckets: BTreeMap<(String, u64), Vec<u64>> = BTreeMap::new();
    for (w, n, b, m) in rows {
        words.entry(w.clone()).or_default().push(*n);
        buckets.entry((w.clone(), *b)).or_default().push(*m);
    }
    assert_eq!(rows.len() as u64, to - from, "rows for the numbers {from}..{to}");
    for (w, after) in &words_after {
        let before = words_before.get(w).copied().unwrap_or(0);
        let mut counts = words.remove(w).unwrap_or_default();
        counts.sort_unstable();
        assert_eq!(
            counts,
            (before + 1..=*after).collect::<Vec<_>>(),
            "counts of {w} after the numbers below {from}"
        );
    }
    assert!(words.is_empty(), "words no number has: {words:?}");
    for (k, after) in &buckets_after {
        let before = buckets_before.get(k).copied().unwrap_or(0);
        let mut counts = buckets.remove(k).unwrap_or_default();
        counts.sort_unstable();
        assert_eq!(
            counts,
            (before + 1..=*after).collect::<Vec<_>>(),
            "counts of {k:?} after the numbers below {from}"
        );
    }
}

async fn wait_for(committed: &Committed, rows: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let n = committed.lock().unwrap().len();
        if n >= rows {
            return;
        }
        assert!(Instant::now() < deadline, "{n} of {rows} rows committed after 120 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Restores `from` (holding the counts of the numbers below `done`), reads `STEP` more numbers,
/// checks the rows, and returns a savepoint of the result (under `dir`).
async fn continue_from(dir: &Path, state: &str, from: PathBuf, done: u64, counters: u32) -> PathBuf {
    let committed: Committed = Arc::default();
    let handle = start(dir, state, done + STEP, counters, Some(from), false, committed.clone());
    wait_for(&committed, STEP as usize).await;
    let savepoint = handle
        .stop_with_savepoint(dir.join("savepoints"))
        .await
        .expect("savepoint");
    handle.join().await.expect("the job ends cleanly");
    assert_counts_go_on(&committed.lock().unwrap(), done, done + STEP);
    savepoint
}

/// The last step: from `from`, to the end of the numbers below `done + STEP`.
async fn finish_from(dir: &Path, state: &str, from: PathBuf, done: u64, counters: u32) {
    let committed: Committed = Arc::default();
    start(dir, state, done + STEP, counters, Some(from), true, committed.clone())
        .join()
        .await
        .expect("the job ends cleanly");
    assert_counts_go_on(&committed.lock().unwrap(), done, done + STEP);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn fixture(state: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/format-v1")
        .join(state)
}

async fn restores_the_first_format(state: &str, counters: u32) {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("fixture");
    copy_dir(&fixture(state), &copy);
    let first = dir.path().join("first");
    let savepoint = continue_from(&first, state, copy, STEP, counters).await;
    finish_from(&dir.path().join("second"), state, savepoint, 2 * STEP, counters).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_savepoint_of_the_first_format_restores_and_its_state_goes_on() {
    restores_the_first_format("memory", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_savepoint_of_the_first_format_restores_rescaled() {
    restores_the_first_format("memory", 3).await;
}

#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rocksdb_savepoint_of_the_first_format_restores_and_its_state_goes_on() {
    restores_the_first_format("rocksdb", 2).await;
}

#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rocksdb_savepoint_of_the_first_format_restores_rescaled() {
    restores_the_first_format("rocksdb", 3).await;
}

async fn todays_format(state: &str) {
    let dir = tempfile::tempdir().unwrap();
    let committed: Committed = Arc::default();
    let first = dir.path().join("first");
    let handle = start(&first, state, STEP, 2, None, false, committed.clone());
    wait_for(&committed, STEP as usize).await;
    let savepoint = handle
        .stop_with_savepoint(first.join("savepoints"))
        .await
        .expect("savepoint");
    handle.join().await.expect("the job ends cleanly");
    assert_counts_go_on(&committed.lock().unwrap(), 0, STEP);
    if let Some(out) = std::env::var_os("EXACTLY_STATE_FIXTURE_OUT") {
        copy_dir(&savepoint, &Path::new(&out).join(state));
    }
    let second = continue_from(&dir.path().join("second"), state, savepoint, STEP, 3).await;
    finish_from(&dir.path().join("third"), state, second, 2 * STEP, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_savepoint_of_todays_format_restores() {
    todays_format("memory").await;
}

#[cfg(feature = "rocksdb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rocksdb_savepoint_of_todays_format_restores() {
    todays_format("rocksdb").await;
}
