//! Deterministic simulation of a job's checkpoints: the real checkpoint coordinator
//! ([`CheckpointCoordinator`]: triggers, acknowledgements, timeouts, declines, checkpoints
//! subsumed by a newer one, the tolerance of failures, the metadata it builds) and the real barrier
//! alignment ([`BarrierAligner`] in exactly-once mode, with its buffer limit), in a model job whose
//! every message, control and event goes through a queue the seeded generator picks from.
//!
//! The job: sources read finite inputs of keyed records (their offsets are their state) and send
//! each to the sink subtask of its key (a shuffle: every sink has an input per source); a sink
//! counts records per key (keyed state) and writes each with its count into a transaction that it
//! pre-commits at each barrier and commits when the checkpoint's completion reaches it, or, after a
//! restart, when it restores a checkpoint that lists it (the two-phase protocol of the real sinks;
//! transactions of later checkpoints are aborted). The coordinator side does what the runtime's
//! coordination does with the coordinator's answers: metadata made durable before any sink is
//! told, subsumed and failed checkpoints announced as aborted, the final checkpoint once every task
//! ended, a restart when the tolerance is exceeded. Faults: a crash at any step (everything in
//! flight is lost; the next run restores the newest durable checkpoint), a metadata write that
//! fails, short timeouts and small alignment buffers; once faults stop, runs get generous limits.
//!
//! The checks, from the model's truth: every input record is in the committed output exactly once
//! (`DUPLICATES`, `DATA LOST`), each key's counts run 1, 2, 3… in commit order (the state restored
//! with the output it produced: `STATE`), each key's records from one source commit in their order
//! (`ORDER`), no restore commits a transaction that was aborted, and the job finishes once faults
//! stop (`LIVENESS`). Not modelled: the runtime's tasks and channels themselves (the real-runtime
//! tests run those), watermarks, savepoints, scale changes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{with_mutant, Mutant};

mod steps;
use crate::checkpoint::{AlignmentMode, BarrierAligner, CheckpointMetadata, SubtaskSnapshot};
use crate::coordinator::{CheckpointConfig, CheckpointCoordinator, TaskSnapshot};
use crate::message::{CheckpointBarrier, CheckpointId, Message};

const TRACE_LINES: usize = 300;
/// Steps after the faults stop within which the job must finish.
const LIVENESS_STEPS: u64 = 200_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Rec {
    key: u32,
    src: u32,
    offset: u32,
}

/// A record as a sink wrote it: with the count of its key so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Out {
    rec: Rec,
    count: u32,
}

#[derive(Debug, Clone, Copy)]
enum Control {
    Trigger(CheckpointBarrier),
    SnapshotIfEnded(CheckpointBarrier),
    Complete(CheckpointId),
    Aborted(CheckpointId),
}

#[derive(Debug)]
enum Event {
    Ack(usize, CheckpointId, TaskSnapshot),
    Decline(CheckpointId),
    Ended(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxnState {
    Prepared,
    Committed,
    Aborted,
}

struct Txn {
    records: Vec<Out>,
    state: TxnState,
}

struct Source {
    offset: u32,
    ended: bool,
}

struct Sink {
    aligner: BarrierAligner<Rec>,
    counts: BTreeMap<u32, u32>,
    open: Vec<Out>,
    /// Pre-committed transactions by checkpoint id.
    pending: BTreeMap<CheckpointId, usize>,
    ended: bool,
}

/// One run of the job: all of it is lost in a crash.
struct Run {
    coord: CheckpointCoordinator,
    sources: Vec<Source>,
    sinks: Vec<Sink>,
    /// Source `p` to sink `m`: `p * sinks + m`.
    channels: Vec<VecDeque<Message<Rec>>>,
    /// Per task: sources first, then sinks.
    controls: Vec<VecDeque<Control>>,
    events: VecDeque<Event>,
    ended: BTreeSet<usize>,
    shutdown_after: Option<CheckpointId>,
    /// The final checkpoint completed: the run ends once the sinks took its completion.
    finishing: bool,
}

/// The paths a seed took (summed over a sweep: none may be left untaken).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Paths {
    crashes: u64,
    restored_some: u64,
    committed_on_restore: u64,
    aborted_on_restore: u64,
    buffer_limit: u64,
    expired: u64,
    declined: u64,
    persist_failed: u64,
    tolerance_exceeded: u64,
    concurrent: u64,
    subsumed: u64,
    ended_snapshots: u64,
    landed_after_error: u64,
    final_failed: u64,
    steps: u64,
}

impl Paths {
    fn add(&mut self, o: Paths) {
        self.crashes += o.crashes;
        self.restored_some += o.restored_some;
        self.committed_on_restore += o.committed_on_restore;
        self.aborted_on_restore += o.aborted_on_restore;
        self.buffer_limit += o.buffer_limit;
        self.expired += o.expired;
        self.declined += o.declined;
        self.persist_failed += o.persist_failed;
        self.tolerance_exceeded += o.tolerance_exceeded;
        self.concurrent += o.concurrent;
        self.subsumed += o.subsumed;
        self.ended_snapshots += o.ended_snapshots;
        self.landed_after_error += o.landed_after_error;
        self.final_failed += o.final_failed;
        self.steps += o.steps;
    }
    /// Each path counted once per seed that took it.
    fn seen(self) -> Paths {
        let b = |n: u64| u64::from(n > 0);
        Paths {
            crashes: b(self.crashes),
            restored_some: b(self.restored_some),
            committed_on_restore: b(self.committed_on_restore),
            aborted_on_restore: b(self.aborted_on_restore),
            buffer_limit: b(self.buffer_limit),
            expired: b(self.expired),
            declined: b(self.declined),
            persist_failed: b(self.persist_failed),
            tolerance_exceeded: b(self.tolerance_exceeded),
            concurrent: b(self.concurrent),
            subsumed: b(self.subsumed),
            ended_snapshots: b(self.ended_snapshots),
            landed_after_error: b(self.landed_after_error),
            final_failed: b(self.final_failed),
            steps: self.steps,
        }
    }
}

struct World {
    rng: ChaCha8Rng,
    seed: u64,
    base: Instant,
    clock_ms: u64,
    step: u64,
    faults_until: u64,
    /// The chance of a crash at each step while faults last.
    crash_rate: f64,
    /// The keys of each source's input, by offset.
    inputs: Vec<Vec<u32>>,
    sinks: usize,
    config: CheckpointConfig,
    buffer: usize,
    txns: Vec<Txn>,
    committed: Vec<Out>,
    /// Completed checkpoints' metadata (the durable store).
    durable: Vec<CheckpointMetadata>,
    last_id: CheckpointId,
    run: Run,
    trace: VecDeque<String>,
    hash: DefaultHasher,
    paths: Paths,
    violation: Option<String>,
}

fn text<T: std::fmt::Display>(v: T) -> Vec<u8> {
    v.to_string().into_bytes()
}

fn number<T: std::str::FromStr>(b: &[u8]) -> T {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("model state {b:?}"))
}

fn pair(b: &[u8]) -> (u64, u64) {
    let s = std::str::from_utf8(b).expect("model state");
    let (a, b) = s.split_once('=').expect("model state");
    (number(a.as_bytes()), number(b.as_bytes()))
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let sources = rng.random_range(1..=3usize);
        let sinks = rng.random_range(1..=3usize);
        let keys = rng.random_range(1..=6u32);
        let inputs = (0..sources)
            .map(|_| {
                let n = rng.random_range(10..=80);
                (0..n).map(|_| rng.random_range(0..keys)).collect()
            })
            .collect();
        let mut config = CheckpointConfig::new("sim");
        config.interval = Duration::from_millis(rng.random_range(5..=60));
        config.min_pause = Duration::from_millis(rng.random_range(0..=10));
        config.timeout = Duration::from_millis(rng.random_range(30..=400));
        config.max_concurrent = rng.random_range(1..=3);
        config.tolerable_failures = rng.random_range(0..=3);
        let buffer = if rng.random_bool(0.5) {
            rng.random_range(2..=30)
        } else {
            usize::MAX
        };
        let faults_until = rng.random_range(200..=3_000);
        let crash_rate = rng.random_range(0.0005..0.01);
        let base = Instant::now();
        let mut w = World {
            rng,
            seed,
            base,
            clock_ms: 0,
            step: 0,
            faults_until,
            crash_rate,
            inputs,
            sinks,
            run: Run::empty(&config, base),
            config,
            buffer,
            txns: Vec::new(),
            committed: Vec::new(),
            durable: Vec::new(),
            last_id: 0,
            trace: VecDeque::new(),
            hash: DefaultHasher::new(),
            paths: Paths::default(),
            violation: None,
        };
        w.restore();
        w
    }

    fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.clock_ms)
    }

    fn note(&mut self, line: String) {
        line.hash(&mut self.hash);
        if self.trace.len() == TRACE_LINES {
            self.trace.pop_front();
        }
        self.trace
            .push_back(format!("{:>6} {:>6}ms {line}", self.step, self.clock_ms));
    }

    fn faults(&self) -> bool {
        self.step < self.faults_until
    }

    fn tasks(&self) -> usize {
        self.inputs.len() + self.sinks
    }

    /// A new run from the newest durable checkpoint (or the start): what a restart does.
    fn restore(&mut self) {
        let mut config = self.config.clone();
        let mut buffer = self.buffer;
        if !self.faults() {
            // Faults over: limits that no longer fail checkpoints, so the job can finish.
            config.timeout = Duration::from_secs(3_600);
            buffer = usize::MAX;
        }
        let (p, m) = (self.inputs.len(), self.sinks);
        let mut run = Run::empty(&config, self.now());
        run.coord = CheckpointCoordinator::new(&config, p + m, self.last_id + 1, self.now());
        run.channels = (0..p * m).map(|_| VecDeque::new()).collect();
        run.controls = (0..p + m).map(|_| VecDeque::new()).collect();
        let meta = self.durable.last().cloned();
        let state = |uid: &str, i: usize| -> SubtaskSnapshot {
            meta.as_ref()
                .and_then(|m| m.operators.get(uid))
                .and_then(|o| o.subtasks.get(i).cloned())
                .unwrap_or_default()
        };
        for i in 0..p {
            let s = state("source", i);
            let offset = s
                .list_state
                .get("offset")
                .and_then(|v| v.first())
                .map_or(0, |b| number(b));
            run.sources.push(Source { offset, ended: false });
        }
        let mut listed = BTreeSet::new();
        for i in 0..m {
            let s = state("sink", i);
            let counts = s.list_state.get("counts").into_iter().flatten().map(|b| {
                let (k, c) = pair(b);
                (k as u32, c as u32)
            });
            let pending: BTreeMap<CheckpointId, usize> = s
                .list_state
                .get("pending")
                .into_iter()
                .flatten()
                .map(|b| {
                    let (id, t) = pair(b);
                    (id, t as usize)
                })
                .collect();
            listed.extend(pending.values().copied());
            run.sinks.push(Sink {
                aligner: BarrierAligner::new(p, AlignmentMode::ExactlyOnce, buffer),
                counts: counts.collect(),
                open: Vec::new(),
                pending: BTreeMap::new(),
                ended: false,
            });
            // The commit after restart of what the checkpoint lists.
            for (id, t) in pending {
                self.paths.committed_on_restore += u64::from(self.txns[t].state == TxnState::Prepared);
                self.commit(t, &format!("restored checkpoint {id}"));
            }
        }
        // Every other transaction still prepared belongs to a later checkpoint: aborted.
        for (t, txn) in self.txns.iter_mut().enumerate() {
            if txn.state == TxnState::Prepared && !listed.contains(&t) {
                txn.state = TxnState::Aborted;
                self.paths.aborted_on_restore += 1;
            }
        }
        self.paths.restored_some += u64::from(meta.is_some());
        self.run = run;
        let from = meta.map_or("the start".to_owned(), |m| format!("checkpoint {}", m.id));
        self.note(format!("run restored from {from}"));
    }

    fn commit(&mut self, t: usize, why: &str) {
        match self.txns[t].state {
            TxnState::Committed => {}
            TxnState::Prepared => {
                self.txns[t].state = TxnState::Committed;
                let records = self.txns[t].records.clone();
                self.committed.extend(records);
                self.note(format!("txn {t} committed ({why})"));
            }
            TxnState::Aborted => {
                self.fail_later(format!(
                    "DATA LOST: transaction {t} was aborted, and then committed by {why}"
                ));
            }
        }
    }

    fn fail_later(&mut self, v: String) {
        self.note(v.clone());
        self.violation.get_or_insert(v);
    }
}

impl Run {
    fn empty(config: &CheckpointConfig, now: Instant) -> Run {
        Run {
            coord: CheckpointCoordinator::new(config, 0, 1, now),
            sources: Vec::new(),
            sinks: Vec::new(),
            channels: Vec::new(),
            controls: Vec::new(),
            events: VecDeque::new(),
            ended: BTreeSet::new(),
            shutdown_after: None,
            finishing: false,
        }
    }

    /// The final checkpoint completed and every sink took its completion.
    fn finished(&self) -> bool {
        self.finishing && self.controls[self.sources.len()..].iter().all(VecDeque::is_empty)
    }
}

impl World {
    fn report(&self, v: &str) -> String {
        let trace: Vec<&str> = self.trace.iter().map(String::as_str).collect();
        format!(
            "seed {}: {v}\n(replay: scripts/simulate --job --first {} --seeds 1)\nlast steps:\n{}",
            self.seed,
            self.seed,
            trace.join("\n")
        )
    }

    /// The committed output against the input.
    fn check(&self) -> std::result::Result<(), String> {
        let mut seen: BTreeMap<(u32, u32), u32> = BTreeMap::new();
        for o in &self.committed {
            *seen.entry((o.rec.src, o.rec.offset)).or_default() += 1;
        }
        for (p, input) in self.inputs.iter().enumerate() {
            for offset in 0..input.len() as u32 {
                match seen.get(&(p as u32, offset)).copied().unwrap_or(0) {
                    1 => {}
                    0 => return Err(format!("DATA LOST: record {offset} of source {p} was never committed")),
                    n => return Err(format!("DUPLICATES: record {offset} of source {p} committed {n} times")),
                }
            }
        }
        let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
        let mut last: BTreeMap<(u32, u32), u32> = BTreeMap::new();
        for o in &self.committed {
            let c = counts.entry(o.rec.key).or_insert(0);
            *c += 1;
            if o.count != *c {
                return Err(format!(
                    "STATE: record {} of source {} committed as the {}th of key {}, but it is the {}th",
                    o.rec.offset, o.rec.src, o.count, o.rec.key, c
                ));
            }
            if let Some(before) = last.insert((o.rec.key, o.rec.src), o.rec.offset) {
                if before > o.rec.offset {
                    return Err(format!(
                        "ORDER: record {} of source {} committed after its record {before} of the same key",
                        o.rec.offset, o.rec.src
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Runs one seed: the trace's hash and the paths taken, or the violation with its trace.
pub(crate) fn run_paths(seed: u64) -> std::result::Result<(u64, Paths), String> {
    let mut w = World::new(seed);
    while !w.run.finished() {
        if let Some(v) = w.violation.take() {
            return Err(w.report(&v));
        }
        if w.step > w.faults_until + LIVENESS_STEPS {
            let v = format!(
                "LIVENESS: the job did not finish within {LIVENESS_STEPS} steps after faults stopped ({} of {} tasks ended, {} checkpoints pending)",
                w.run.ended.len(),
                w.tasks(),
                w.run.coord.pending().count()
            );
            return Err(w.report(&v));
        }
        w.step_once();
    }
    if let Some(v) = w.violation.take() {
        return Err(w.report(&v));
    }
    w.check().map_err(|v| w.report(&v))?;
    let mut paths = w.paths.seen();
    paths.steps = w.step;
    Ok((w.hash.finish(), paths))
}

/// Runs `seeds` seeds from `first` with `m` active: the first violation, and the paths taken
/// (each counted once per seed that took it).
pub(crate) fn run_seeds(first: u64, seeds: u64, m: Mutant) -> (Option<String>, Paths) {
    with_mutant(m, || {
        let mut paths = Paths::default();
        for s in first..first + seeds {
            match run_paths(s) {
                Ok((_, p)) => paths.add(p),
                Err(v) => return (Some(v), paths),
            }
        }
        (None, paths)
    })
}

#[cfg(test)]
mod tests {
    use super::super::budget;
    use super::*;

    #[test]
    fn a_job_checkpoints_exactly_once_for_every_seed() {
        let (first, n) = budget(2_000);
        let started = Instant::now();
        let (found, p) = run_seeds(first, n, Mutant::None);
        if let Some(v) = found {
            panic!("{v}");
        }
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "{n} seeds in {secs:.2} s ({:.0} seeds/s), {:.0} steps per seed; seeds per path: {p:?}",
            n as f64 / secs,
            p.steps as f64 / n as f64
        );
        if n >= 2_000 {
            for (path, seeds) in [
                ("a crash", p.crashes),
                ("a restore of a checkpoint", p.restored_some),
                ("a transaction committed by a restore", p.committed_on_restore),
                ("a transaction aborted by a restore", p.aborted_on_restore),
                ("an alignment over its buffer limit", p.buffer_limit),
                ("a checkpoint timed out", p.expired),
                ("a checkpoint declined", p.declined),
                ("a metadata write failed", p.persist_failed),
                ("the tolerance of failures exceeded", p.tolerance_exceeded),
                ("checkpoints in flight together", p.concurrent),
                ("an ended sink snapshotted directly", p.ended_snapshots),
                ("a metadata write answered an error that landed", p.landed_after_error),
                ("the final checkpoint failed", p.final_failed),
            ] {
                assert!(seeds >= 10, "only {seeds} seeds took the path {path:?}: {p:?}");
            }
        }
    }

    #[test]
    fn a_seed_of_a_job_replays_the_same_trace() {
        for seed in [5, 77, 4_321] {
            let a = run_paths(seed).map(|r| r.0);
            assert_eq!(a, run_paths(seed).map(|r| r.0), "seed {seed}");
        }
        assert_ne!(run_paths(5).map(|r| r.0), run_paths(6).map(|r| r.0));
    }

    /// Each known bug put back in the coordinator or the aligner is caught, by the check that
    /// guards against it.
    #[test]
    fn each_known_bug_in_checkpointing_put_back_is_caught() {
        for (m, by) in [
            (Mutant::AlignerNeverBlocks, "DUPLICATES"),
            (Mutant::AckOneShort, "DATA LOST"),
            (Mutant::DropHeldOnAbort, "DATA LOST"),
        ] {
            let (found, _) = run_seeds(0, 2_000, m);
            let found = found.unwrap_or_else(|| panic!("{m:?} was not caught in 2 000 seeds"));
            let first = found.lines().next().unwrap_or_default();
            eprintln!("{m:?} caught: {first}");
            assert!(first.contains(by), "{m:?} caught by another check: {first}");
        }
    }
}
