//! Deterministic simulation of checkpoint storage: the real [`Storage`] (checkpoint commit and its
//! settling, retention, the owner claim, the restore choice with the unfinished checkpoints a
//! restart gives up) and the coordinator's decision on a failed commit
//! ([`after_failed_commit`]), driven by a model job against a model object store, with faults and
//! crashes chosen by a seeded generator (ChaCha8: the same seed gives the same trace on any
//! machine and `rand` release).
//!
//! The store: keys and bytes, create-if-absent, listings by prefix. Faults, per call: an error
//! with nothing done; a write done whose answer is lost; a write the network holds and applies
//! later (sometimes only after the process crashed and a new one runs); a directory delete that
//! stops halfway; a listing that still shows a directory deleted lately. The job: each checkpoint
//! writes a private file and uploads the shared files its (model) RocksDB references, some old,
//! some new, then commits and keeps the newest two; the process crashes at any storage call and
//! a new one claims the location and restores. When a commit fails, the checkpoint's files are
//! kept or deleted as the coordinator decides; deletes run in the background, later.
//!
//! The checks, from the model's truth: every restore succeeds (I/O errors retried) without
//! falling back past a checkpoint the job itself made unreadable, reads every file it references,
//! is never behind the newest checkpoint whose commit was answered (the sinks committed on it),
//! and is never a checkpoint an earlier restart gave up (its transactions were aborted). Once
//! faults stop, the job reaches its target; then every held write lands and a last restart must
//! pass the same checks.

use std::cell::Cell;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::checkpoint::{
    BackendKind, CheckpointMetadata, FileHandle, FileScope, KeyedStateHandle, OperatorSnapshot, SubtaskSnapshot,
    METADATA_VERSION,
};
use crate::error::{CoreError, ErrorClass, Result};
use crate::message::{CheckpointId, SnapshotKind};
use crate::runtime::RestorePlan;
use crate::state::KeyGroupRange;
use crate::storage::blobs::{Blobs, Put};
use crate::storage::unfinished::VOID;
use crate::storage::{after_failed_commit, CheckpointStorage, FailedCommit, Storage};

/// Known bugs, put back on purpose (one at a time, per thread): the simulation must catch each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// None: the code as it is.
    None,
    /// Retention reads past a kept checkpoint whose metadata it cannot read (an outage) and
    /// deletes the shared files it did not see used.
    RetainPastReadError,
    /// A commit whose outcome is unknown (an answer lost) deletes the checkpoint's files like a
    /// plain failure: its metadata may land after.
    DiscardAfterUnknown,
    /// A restart leaves the unfinished checkpoints above the one it restored as they are: one
    /// whose metadata lands late becomes the newest, with its transactions aborted.
    NoVoid,
    /// Private files are named as the state backend names them, the same for every process: a
    /// checkpoint id begun again after a crash shares their names with the earlier attempt, whose
    /// write landing late replaces a file of the new one.
    UntaggedPrivateNames,
    /// An aborted checkpoint's files are deleted by deleting its directory: a delete held by the
    /// network lands after a later process began the same id again, and takes its files.
    AbortDeletesDir,
    /// A checkpoint without files of its own is committed without a file first: a restart cannot
    /// see it to make it void, and its metadata lands after.
    NoBegunFile,
}

thread_local! {
    static MUTANT: Cell<Mutant> = const { Cell::new(Mutant::None) };
}

/// The mutant active on this thread.
pub(crate) fn mutant() -> Mutant {
    MUTANT.with(Cell::get)
}

const ROOT: &str = "s3://sim/job";
const KEEP: usize = 2;
const TRACE_LINES: usize = 120;

#[derive(Debug, Clone)]
enum Op {
    Put(String, Vec<u8>, Put),
    Delete(String),
    DeleteDir(String),
    /// The files directly under a directory whose names begin with a prefix.
    DeleteNamed(String, String),
}

impl Op {
    fn describe(&self) -> String {
        match self {
            Op::Put(k, b, how) => format!("put {k} ({} bytes, {how:?})", b.len()),
            Op::Delete(k) => format!("delete {k}"),
            Op::DeleteDir(d) => format!("delete {d}/"),
            Op::DeleteNamed(d, p) => format!("delete {d}/{p}*"),
        }
    }
}

/// The paths a seed took (counted over a run of seeds: none may be left untaken).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Paths {
    pub(crate) crashes: u64,
    pub(crate) restored_some: u64,
    pub(crate) outcome_unknown: u64,
    pub(crate) late_metadata: u64,
    pub(crate) voided: u64,
    pub(crate) late_refused: u64,
    pub(crate) shared_deleted: u64,
    pub(crate) retention_stopped: u64,
    pub(crate) late_owner_stop: u64,
    pub(crate) restarted_in_process: u64,
    /// Model steps (store calls and landings' turns) the seed covered.
    pub(crate) steps: u64,
}

/// Seeds that took each path (and, in `steps`, the steps of all seeds).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Coverage(pub(crate) Paths);

impl Coverage {
    fn add(&mut self, p: Paths) {
        let c = &mut self.0;
        for (sum, n) in [
            (&mut c.crashes, p.crashes),
            (&mut c.restored_some, p.restored_some),
            (&mut c.outcome_unknown, p.outcome_unknown),
            (&mut c.late_metadata, p.late_metadata),
            (&mut c.voided, p.voided),
            (&mut c.late_refused, p.late_refused),
            (&mut c.shared_deleted, p.shared_deleted),
            (&mut c.retention_stopped, p.retention_stopped),
            (&mut c.late_owner_stop, p.late_owner_stop),
            (&mut c.restarted_in_process, p.restarted_in_process),
        ] {
            *sum += u64::from(n > 0);
        }
        c.steps += p.steps;
    }
}

/// The object store and the faults.
struct World {
    rng: ChaCha8Rng,
    step: u64,
    files: BTreeMap<String, Vec<u8>>,
    /// Writes the network holds, applied at that step (`u64::MAX`: only when the run ends).
    held: Vec<(u64, Op)>,
    /// Directories deleted lately that listings still show, until that step.
    ghosts: Vec<(String, u64)>,
    /// The process whose calls reach the store (earlier ones crashed or ended).
    alive: u32,
    /// Fault rates per call: an error (nothing done), an answer lost (done), held, a crash.
    fail: f64,
    lost: f64,
    hold: f64,
    crash: f64,
    /// No faults after this step.
    faults_until: u64,
    /// The job has no keyed state: its checkpoints write no files of their own.
    stateless: bool,
    trace: DefaultHasher,
    lines: VecDeque<String>,
    paths: Paths,
}

fn outage(what: &str, key: &str) -> CoreError {
    CoreError::io(
        "reaching the object store",
        PathBuf::from(key),
        std::io::Error::new(std::io::ErrorKind::TimedOut, format!("simulated: {what}")),
    )
}

impl World {
    fn new(seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let scale = [0.0, 0.3, 1.0, 2.5][rng.random_range(0..4)];
        World {
            fail: 0.03 * scale,
            lost: 0.01 * scale,
            hold: 0.015 * scale,
            crash: 0.006 * scale,
            faults_until: rng.random_range(200..1_500),
            // From the seed, not the generator: every other seed's world stays as it was.
            stateless: seed % 4 == 3,
            rng,
            step: 0,
            files: BTreeMap::new(),
            held: Vec::new(),
            ghosts: Vec::new(),
            alive: 0,
            trace: DefaultHasher::new(),
            lines: VecDeque::new(),
            paths: Paths::default(),
        }
    }

    fn note(&mut self, line: String) {
        line.hash(&mut self.trace);
        if self.lines.len() == TRACE_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(format!("{:>5} {line}", self.step));
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random_bool(p.min(1.0))
    }

    fn faulty(&self) -> bool {
        self.step <= self.faults_until
    }

    /// Applies a write; `false` for a create that found the key there.
    fn apply(&mut self, op: &Op) -> bool {
        match op {
            Op::Put(k, b, Put::Create) => {
                if let Some(there) = self.files.get(k) {
                    if k.ends_with("/_metadata") && b.as_slice() != VOID && there.as_slice() == VOID {
                        self.paths.late_refused += 1;
                    }
                    return false;
                }
                if k.ends_with("/_metadata") && b.as_slice() == VOID {
                    self.paths.voided += 1;
                }
                self.files.insert(k.clone(), b.clone());
            }
            Op::Put(k, b, _) => {
                self.files.insert(k.clone(), b.clone());
            }
            Op::Delete(k) => {
                if k.starts_with("shared/") && self.files.contains_key(k) {
                    self.paths.shared_deleted += 1;
                }
                self.files.remove(k);
            }
            Op::DeleteDir(d) => {
                let prefix = format!("{d}/");
                self.files.retain(|k, _| !k.starts_with(&prefix));
                let until = self.step + self.rng.random_range(0..30);
                self.ghosts.push((d.clone(), until));
            }
            Op::DeleteNamed(d, p) => {
                let prefix = format!("{d}/{p}");
                self.files
                    .retain(|k, _| !k.starts_with(&prefix) || k[prefix.len()..].contains('/'));
            }
        }
        true
    }

    /// One step of the world: held writes that are due land, old ghosts fade.
    fn tick(&mut self) {
        self.step += 1;
        let now = self.step;
        let due: Vec<Op> = {
            let (due, rest): (Vec<_>, Vec<_>) = self.held.drain(..).partition(|(at, _)| *at <= now);
            self.held = rest;
            due.into_iter().map(|(_, op)| op).collect()
        };
        for op in due {
            self.land(&op);
        }
        self.ghosts.retain(|(_, until)| *until >= now);
    }

    fn land(&mut self, op: &Op) {
        let applied = self.apply(op);
        if let Op::Put(k, b, Put::Create) = op {
            if applied && k.ends_with("/_metadata") && b.as_slice() != VOID {
                self.paths.late_metadata += 1;
            }
        }
        self.note(format!(
            "held write landed: {} ({})",
            op.describe(),
            if applied { "done" } else { "refused" }
        ));
    }

    /// Entering a call of process `me`: the step, a crash, a failure.
    fn enter(&mut self, me: u32, what: &str) -> Result<()> {
        self.tick();
        if me != self.alive {
            return Err(outage("the process is gone", what));
        }
        if self.faulty() && self.chance(self.crash) {
            self.crash_now(what);
            return Err(outage("the process crashed", what));
        }
        Ok(())
    }

    fn crash_now(&mut self, at: &str) {
        self.alive += 1;
        self.paths.crashes += 1;
        self.note(format!("CRASH at {at}"));
    }

    fn read(&mut self, me: u32, what: &str) -> Result<()> {
        self.enter(me, what)?;
        if self.faulty() && self.chance(self.fail) {
            self.note(format!("{what}: failed"));
            return Err(outage("a read failed", what));
        }
        self.note(what.to_owned());
        Ok(())
    }

    fn write(&mut self, me: u32, op: Op) -> Result<bool> {
        let what = op.describe();
        self.tick();
        if me != self.alive {
            return Err(outage("the process is gone", &what));
        }
        if self.faulty() && self.chance(self.crash) {
            // Crashed as it wrote: sent or not, held or not.
            match self.rng.random_range(0..3) {
                0 => {
                    self.apply(&op);
                }
                1 => self.hold(op.clone()),
                _ => {}
            }
            self.crash_now(&what);
            return Err(outage("the process crashed", &what));
        }
        if self.faulty() {
            let r: f64 = self.rng.random();
            if r < self.fail {
                if let Op::DeleteDir(d) = &op {
                    // Stopped halfway.
                    let prefix = format!("{d}/");
                    let keys: Vec<String> = self.files.keys().filter(|k| k.starts_with(&prefix)).cloned().collect();
                    for k in keys {
                        if self.rng.random_bool(0.5) {
                            self.files.remove(&k);
                        }
                    }
                }
                self.note(format!("{what}: failed"));
                return Err(outage("a write failed", &what));
            }
            if r < self.fail + self.lost {
                let done = self.apply(&op);
                self.note(format!("{what}: done ({done}), answer lost"));
                return Err(outage("the answer was lost", &what));
            }
            if r < self.fail + self.lost + self.hold {
                self.hold(op);
                self.note(format!("{what}: held"));
                return Err(outage("no answer", &what));
            }
        }
        let done = self.apply(&op);
        self.note(format!("{what}: {done}"));
        Ok(done)
    }

    fn hold(&mut self, op: Op) {
        let at = if self.rng.random_bool(0.15) {
            u64::MAX
        } else {
            self.step + self.rng.random_range(1..120)
        };
        self.held.push((at, op));
    }

    /// Every held write lands (the run is over: the worst moment for a late one).
    fn land_all(&mut self) {
        let held: Vec<Op> = self.held.drain(..).map(|(_, op)| op).collect();
        for op in held {
            self.land(&op);
        }
    }
}

/// The store as one process sees it.
struct Sim {
    world: Arc<Mutex<World>>,
    me: u32,
}

impl Sim {
    fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().expect("not poisoned")
    }
}

fn not_found(key: &str) -> CoreError {
    CoreError::io("reading", PathBuf::from(key), std::io::ErrorKind::NotFound.into())
}

impl Blobs for Sim {
    fn locate(&self, key: &str) -> PathBuf {
        PathBuf::from(format!("{ROOT}/{key}"))
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        let mut w = self.world();
        w.read(self.me, &format!("get {key}"))?;
        w.files.get(key).cloned().ok_or_else(|| not_found(key))
    }

    fn size(&self, key: &str) -> Result<Option<u64>> {
        let mut w = self.world();
        w.read(self.me, &format!("size {key}"))?;
        Ok(w.files.get(key).map(|b| b.len() as u64))
    }

    fn put(&self, key: &str, bytes: &[u8], how: Put) -> Result<bool> {
        self.world()
            .write(self.me, Op::Put(key.to_owned(), bytes.to_vec(), how))
    }

    fn dirs(&self) -> Result<Vec<String>> {
        let mut w = self.world();
        w.read(self.me, "list")?;
        let mut dirs: BTreeSet<String> = w
            .files
            .keys()
            .filter_map(|k| k.split_once('/').map(|(d, _)| d.to_owned()))
            .collect();
        dirs.extend(w.ghosts.iter().map(|(d, _)| d.clone()));
        Ok(dirs.into_iter().collect())
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.world().write(self.me, Op::Delete(key.to_owned())).map(|_| ())
    }

    fn delete_dir(&self, dir: &str) -> Result<()> {
        self.world().write(self.me, Op::DeleteDir(dir.to_owned())).map(|_| ())
    }

    fn delete_named(&self, dir: &str, prefix: &str) -> Result<()> {
        self.world()
            .write(self.me, Op::DeleteNamed(dir.to_owned(), prefix.to_owned()))
            .map(|_| ())
    }
}

/// A local file with the content of shared file `name` (a name always has the same content, as
/// an SST file's does), for an upload: one scratch file per thread, rewritten each time.
fn shared_source(name: &str) -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    // In memory where there is a tmpfs: the simulation's speed is its reach.
    let dir = DIR.get_or_init(|| {
        tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("a temporary directory")
    });
    let path = dir
        .path()
        .join(format!("{:?}", std::thread::current().id()).replace(['(', ')'], ""));
    std::fs::write(&path, format!("sst {name} {}", "x".repeat(name.len() * 3))).expect("writing a local file");
    path
}

/// Checkpoint `id`'s metadata as process `me` writes it (the writer in its timestamps: an id
/// may be begun again by a later process when an earlier one left nothing of it listed).
fn metadata(id: CheckpointId, me: u32, files: Vec<FileHandle>) -> CheckpointMetadata {
    let mut operators = BTreeMap::new();
    operators.insert(
        "op".to_owned(),
        OperatorSnapshot {
            parallelism: 1,
            max_parallelism: 128,
            subtasks: vec![SubtaskSnapshot {
                keyed: Some(KeyedStateHandle {
                    backend: BackendKind::RocksDb,
                    key_groups: KeyGroupRange::new(0, 127),
                    files,
                }),
                ..Default::default()
            }],
        },
    );
    CheckpointMetadata {
        version: METADATA_VERSION,
        job: "sim".into(),
        id,
        kind: SnapshotKind::Checkpoint,
        timestamp_ms: u64::from(me),
        completed_ms: u64::from(me),
        operators,
    }
}

/// What the job knows and what the sinks did, by the model's truth.
#[derive(Default)]
struct Truth {
    /// The newest checkpoint whose commit was answered: the sinks committed its transactions.
    acked: CheckpointId,
    /// Every checkpoint whose commit was answered: its id and the process.
    committed: BTreeSet<(CheckpointId, u32)>,
    /// Every checkpoint a process began: its id and the process.
    started: BTreeSet<(CheckpointId, u32)>,
    /// Checkpoints a restart went past (restoring an older one): their transactions aborted.
    abandoned: BTreeSet<(CheckpointId, u32)>,
    /// Checkpoints completed since the last restore, and in all.
    done: u64,
    /// The last checkpoint id a process used: an attempt of the job that starts again in the
    /// same process goes on past it (the executor keeps it), never begins an id again.
    last_used: BTreeMap<u32, CheckpointId>,
}

/// Why a seed fails: the violation, then the trace's last lines.
fn violation(world: &Arc<Mutex<World>>, seed: u64, what: String) -> String {
    let w = world.lock().expect("not poisoned");
    let lines: Vec<&str> = w.lines.iter().map(String::as_str).collect();
    format!(
        "seed {seed}: {what}\n(replay: scripts/simulate --storage --first {seed} --seeds 1)\nlast steps:\n{}",
        lines.join("\n")
    )
}

enum Outcome {
    /// The process is gone (crashed, or stopped): a new one starts.
    Gone,
    /// The job reached its target.
    Finished,
}

/// Checks the snapshot a process (`me`) restored, reads its files, and records in `truth` what
/// the run going on from it does: `None` when the process is gone meanwhile (or an outage
/// stopped the reads: the attempt restarts), else the restored id and the shared files its
/// model RocksDB holds.
fn went_on(
    world: &Arc<Mutex<World>>,
    truth: &mut Truth,
    me: u32,
    snapshot: Option<&crate::storage::Snapshot>,
    plan: &RestorePlan,
) -> std::result::Result<Option<(CheckpointId, Vec<String>)>, String> {
    let gone = || world.lock().expect("not poisoned").alive != me;
    if let Some(f) = &plan.fallback {
        return Err(format!(
            "UNRESTORABLE: fell back to checkpoint {} past {}, which the job itself made unreadable: {}",
            f.restored, f.unusable, f.error
        ));
    }
    let restored = snapshot.map_or(0, |s| s.meta.id);
    let writer = snapshot.map_or(0, |s| s.meta.timestamp_ms as u32);
    if restored < truth.acked {
        return Err(format!(
            "restored checkpoint {restored}, behind checkpoint {} whose transactions the sinks committed",
            truth.acked
        ));
    }
    if truth.abandoned.contains(&(restored, writer)) {
        return Err(format!(
            "restored checkpoint {restored} of process {writer}, whose transactions a restart had aborted (it went on from an older one)"
        ));
    }
    let mut live: Vec<String> = Vec::new();
    if let Some(s) = snapshot {
        for f in s.meta.files() {
            match s.reader.read(f) {
                Ok(_) => {}
                Err(_) if gone() => return Ok(None),
                Err(e @ CoreError::Corrupt { .. }) => {
                    return Err(format!(
                        "UNRESTORABLE: checkpoint {restored} restored, a file reads wrong: {e}"
                    ))
                }
                Err(_) => return Ok(None), // an outage while reading: the attempt restarts
            }
            if f.scope == FileScope::Shared {
                live.push(f.name.clone());
            }
        }
        world.lock().expect("not poisoned").paths.restored_some += 1;
    }
    // The run goes on from `restored`: every checkpoint begun above it is given up, its
    // transactions aborted by the sinks' recovery; the restored one's are committed.
    truth
        .abandoned
        .extend(truth.started.range((restored + 1, 0)..).copied());
    truth.acked = truth.acked.max(restored);
    world
        .lock()
        .expect("not poisoned")
        .note(format!("process {me} restored {restored}"));
    Ok(Some((restored, live)))
}

/// Process `me` stopped, naming another run: here (one copy of the job), an earlier process
/// whose write of the owner record landed late. The operator (or the supervisor) starts it again.
fn stopped(world: &Arc<Mutex<World>>, me: u32, e: &CoreError) -> Outcome {
    let mut w = world.lock().expect("not poisoned");
    w.paths.late_owner_stop += 1;
    w.note(format!("process {me} stopped: {e}"));
    if w.alive == me {
        w.alive += 1;
    }
    Outcome::Gone
}

/// One process: claims, restores, checks, then checkpoints until it crashes or the job is done.
fn process(
    world: &Arc<Mutex<World>>,
    truth: &mut Truth,
    target: u64,
    last: bool,
) -> std::result::Result<Outcome, String> {
    let me = world.lock().expect("not poisoned").alive;
    let gone = || world.lock().expect("not poisoned").alive != me;
    let storage = Storage::on_blobs(
        Arc::new(Sim {
            world: world.clone(),
            me,
        }),
        PathBuf::from(ROOT),
        &format!("p{me}"),
    );
    // Claim, then restore as the executor does (renewing the claim first): I/O errors are retried.
    let mut tries = 0;
    let mut claimed = false;
    let (snapshot, plan) = loop {
        tries += 1;
        if tries > 400 {
            return Err("no progress: the restore kept failing after faults stopped".into());
        }
        let chosen = if claimed {
            storage.renew_claim()
        } else {
            storage.claim("sim", Duration::from_secs(3_600))
        }
        .and_then(|()| {
            claimed = true;
            RestorePlan::first(Some(&storage), None, false)
        });
        match chosen {
            Ok(c) => break c,
            Err(_) if gone() => return Ok(Outcome::Gone),
            Err(e) if e.class() == ErrorClass::Restart => continue,
            Err(e @ CoreError::LocationOwned { .. }) => return Ok(stopped(world, me, &e)),
            Err(e) => return Err(format!("UNRESTORABLE: the restore failed: {e}")),
        }
    };
    let (restored, mut live) = match went_on(world, truth, me, snapshot.as_ref(), &plan)? {
        Some(r) => r,
        None => return Ok(Outcome::Gone),
    };
    let mut plan = plan;
    if last {
        // What retention keeps stays whole: each of the newest checkpoints it keeps that the
        // job committed reads well (the checkpoints a restore past an unreadable newest one needs).
        let kept = loop {
            match storage.completed() {
                Ok(ids) => break ids,
                Err(_) if gone() => return Err("the last process crashed without faults".into()),
                Err(_) => continue,
            }
        };
        for &id in &kept {
            let s = storage
                .open(id)
                .map_err(|e| format!("UNRESTORABLE: listed checkpoint {id} does not open: {e}"))?;
            let writer = s.meta.timestamp_ms as u32;
            if truth.abandoned.contains(&(id, writer)) {
                return Err(format!(
                    "checkpoint {id} of process {writer}, whose transactions a restart had aborted, is listed as completed"
                ));
            }
        }
        for &id in kept.iter().rev().take(KEEP) {
            let s = storage
                .open(id)
                .map_err(|e| format!("UNRESTORABLE: kept checkpoint {id} does not open: {e}"))?;
            if !truth.committed.contains(&(id, s.meta.timestamp_ms as u32)) {
                continue; // landed late, never committed: retention may have taken its files
            }
            for f in s.meta.files() {
                s.reader
                    .read(f)
                    .map_err(|e| format!("UNRESTORABLE: kept checkpoint {id}, committed, does not read back: {e}"))?;
            }
        }
        return Ok(Outcome::Finished);
    }
    let used = truth.last_used.get(&me).copied().unwrap_or(0);
    let mut next = loop {
        match storage.highest_id() {
            Ok(h) => break h.max(restored).max(used) + 1,
            Err(_) if gone() => return Ok(Outcome::Gone),
            Err(_) => continue,
        }
    };
    let mut discards: VecDeque<CheckpointId> = VecDeque::new();
    let mut steps_after_faults = 0;
    loop {
        {
            let w = world.lock().expect("not poisoned");
            if !w.faulty() {
                steps_after_faults += 1;
                if truth.done >= target {
                    return Ok(Outcome::Finished);
                }
            }
        }
        if steps_after_faults > 300 {
            return Err(format!(
                "no progress: {} checkpoints of {target} after faults stopped",
                truth.done
            ));
        }
        // Background deletes of failed checkpoints run when they get their turn.
        while !discards.is_empty() && world.lock().expect("not poisoned").rng.random_bool(0.4) {
            let id = discards.pop_front().expect("not empty");
            let _ = storage.abort(id);
        }
        let id = next;
        next += 1;
        truth.started.insert((id, me));
        truth.last_used.insert(me, id);
        let stateless = world.lock().expect("not poisoned").stateless;
        let files = (|| -> Result<Vec<FileHandle>> {
            let w = storage.writer(id)?;
            if stateless {
                return Ok(Vec::new()); // a job without keyed state: its state is in the metadata
            }
            let mut files = vec![w.write_private("state", format!("state of {id} by {me}").as_bytes())?];
            // The model RocksDB: compaction drops some files, new ones appear.
            {
                let mut world = world.lock().expect("not poisoned");
                live.retain(|_| !world.rng.random_bool(0.3));
                for _ in 0..world.rng.random_range(1..3) {
                    let n = world.rng.random::<u32>();
                    live.push(format!("{n:08x}.sst"));
                }
            }
            for name in &live {
                files.push(w.upload_shared(name, name, &shared_source(name))?);
            }
            Ok(files)
        })();
        if gone() {
            return Ok(Outcome::Gone);
        }
        let files = match files {
            Ok(f) => f,
            Err(_) => {
                discards.push_back(id); // a snapshot failed: the checkpoint is aborted
                continue;
            }
        };
        match storage.commit(&metadata(id, me, files)) {
            Ok(()) => {
                truth.acked = id;
                truth.committed.insert((id, me));
                truth.done += 1;
                match storage.retain(KEEP) {
                    Err(_) if gone() => return Ok(Outcome::Gone),
                    Err(_) => world.lock().expect("not poisoned").paths.retention_stopped += 1,
                    Ok(_) => {}
                }
            }
            Err(_) if gone() => return Ok(Outcome::Gone),
            Err(e) => {
                match after_failed_commit(&e) {
                    FailedCommit::KeepFiles => {
                        world.lock().expect("not poisoned").paths.outcome_unknown += 1;
                    }
                    FailedCommit::Discard => discards.push_back(id),
                    FailedCommit::RunEnds => return Ok(stopped(world, me, &e)),
                }
                // Now and then the executor restarts the whole job in this process (failures
                // past its tolerance): the plan's next choice, the same storage and tag, ids
                // going on past the last one used. (From the step, not the generator: the
                // other seeds' worlds stay as they were.)
                let step = world.lock().expect("not poisoned").step;
                if step % 4 == 0 {
                    match plan.later_job(Some(&storage)) {
                        Ok(snapshot) => match went_on(world, truth, me, snapshot.as_ref(), &plan)? {
                            Some((restored, restored_live)) => {
                                world.lock().expect("not poisoned").paths.restarted_in_process += 1;
                                live = restored_live;
                                let highest = loop {
                                    match storage.highest_id() {
                                        Ok(h) => break h,
                                        Err(_) if gone() => return Ok(Outcome::Gone),
                                        Err(_) => continue,
                                    }
                                };
                                next = (next - 1).max(highest).max(restored) + 1;
                            }
                            None => return Ok(Outcome::Gone),
                        },
                        Err(_) if gone() => return Ok(Outcome::Gone),
                        Err(e @ CoreError::LocationOwned { .. }) => return Ok(stopped(world, me, &e)),
                        // The restart's restore failed (an outage): the process starts over.
                        Err(e) if e.class() == ErrorClass::Restart => return Ok(Outcome::Gone),
                        Err(e) => return Err(format!("UNRESTORABLE: the restore of a restart failed: {e}")),
                    }
                }
            }
        }
    }
}

/// Runs seed `seed`: the trace's hash and the paths taken, or the violation.
pub(crate) fn run_paths(seed: u64) -> std::result::Result<(u64, Paths), String> {
    let world = Arc::new(Mutex::new(World::new(seed)));
    let target = world.lock().expect("not poisoned").rng.random_range(6..20);
    let mut truth = Truth::default();
    for _ in 0..200 {
        match process(&world, &mut truth, target, false) {
            Err(v) => return Err(violation(&world, seed, v)),
            Ok(Outcome::Gone) => continue,
            Ok(Outcome::Finished) => {
                // The run is over: every held write lands, and a last process must restore well.
                {
                    let mut w = world.lock().expect("not poisoned");
                    w.alive += 1;
                    w.land_all();
                    w.note("every held write landed; a last process starts".into());
                }
                return match process(&world, &mut truth, target, true) {
                    Err(v) => Err(violation(&world, seed, v)),
                    Ok(Outcome::Gone) => Err(violation(
                        &world,
                        seed,
                        "the last process crashed without faults".into(),
                    )),
                    Ok(Outcome::Finished) => {
                        let w = world.lock().expect("not poisoned");
                        Ok((
                            w.trace.finish(),
                            Paths {
                                steps: w.step,
                                ..w.paths
                            },
                        ))
                    }
                };
            }
        }
    }
    Err(violation(&world, seed, "no progress: 200 processes".into()))
}

/// The trace hash of `seed`, or its violation.
pub(crate) fn run(seed: u64) -> std::result::Result<u64, String> {
    run_paths(seed).map(|(h, _)| h)
}

/// Runs `seeds` seeds from `first` with `m` active on this thread: the first violation, and the
/// paths taken.
pub(crate) fn run_seeds(first: u64, seeds: u64, m: Mutant) -> (Option<String>, Coverage) {
    MUTANT.with(|c| c.set(m));
    let mut coverage = Coverage::default();
    let found = (first..first + seeds).find_map(|s| match run_paths(s) {
        Err(v) => Some(v),
        Ok((_, paths)) => {
            coverage.add(paths);
            None
        }
    });
    MUTANT.with(|c| c.set(Mutant::None));
    (found, coverage)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed budget of a test run (more with EXACTLY_SIM_SEEDS; EXACTLY_SIM_FIRST to start
    /// elsewhere, e.g. at a seed a failure printed).
    fn budget() -> (u64, u64) {
        let n = std::env::var("EXACTLY_SIM_SEEDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2_000);
        let first = std::env::var("EXACTLY_SIM_FIRST")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        (first, n)
    }

    #[test]
    fn checkpoint_storage_holds_for_every_seed() {
        let (first, n) = budget();
        let started = std::time::Instant::now();
        let (found, coverage) = run_seeds(first, n, Mutant::None);
        if let Some(v) = found {
            panic!("{v}");
        }
        eprintln!(
            "{n} seeds in {:.2} s ({:.0} seeds/s), {:.0} store calls per seed; seeds per path: {:?}",
            started.elapsed().as_secs_f64(),
            n as f64 / started.elapsed().as_secs_f64(),
            coverage.0.steps as f64 / n as f64,
            coverage.0
        );
        if n >= 2_000 {
            let p = coverage.0;
            for (path, seeds) in [
                ("a crash", p.crashes),
                ("a restore of a checkpoint", p.restored_some),
                ("a commit of unknown outcome", p.outcome_unknown),
                ("a checkpoint's metadata landed late", p.late_metadata),
                ("an unfinished checkpoint made void", p.voided),
                ("a late metadata write refused by a void", p.late_refused),
                ("retention deleted a shared file", p.shared_deleted),
                ("retention stopped by an error", p.retention_stopped),
                ("a restart of the job within its process", p.restarted_in_process),
            ] {
                assert!(seeds >= 10, "only {seeds} seeds took the path {path:?}: {p:?}");
            }
        }
    }

    #[test]
    fn a_seed_replays_the_same_trace() {
        for seed in [3, 99, 1_234] {
            assert_eq!(run(seed), run(seed), "seed {seed}");
        }
        assert_ne!(run(3), run(4), "different seeds, different worlds");
    }

    /// Seeds that found real bugs, kept: each passes, and fails again with its bug put back.
    #[test]
    fn the_seeds_that_found_bugs_pass_and_fail_with_the_bug_back() {
        let found: &[(u64, Mutant, &str)] = &[(37_222, Mutant::AbortDeletesDir, "UNRESTORABLE")];
        for &(seed, m, by) in found {
            if let Err(v) = run(seed) {
                panic!("{v}");
            }
            let (found, _) = run_seeds(seed, 1, m);
            let found = found.unwrap_or_else(|| panic!("seed {seed} passes with {m:?} put back"));
            let first = found.lines().next().unwrap_or_default();
            assert!(first.contains(by), "{m:?} caught by another check: {first}");
        }
    }

    /// Each known bug put back is caught, by the check that guards against it.
    #[test]
    fn each_known_bug_put_back_is_caught_within_the_budget() {
        for (m, by) in [
            (Mutant::RetainPastReadError, "UNRESTORABLE"),
            (Mutant::DiscardAfterUnknown, "UNRESTORABLE"),
            (Mutant::NoVoid, "a restart had aborted"),
            (Mutant::UntaggedPrivateNames, "corrupt checkpoint data"),
            (Mutant::NoBegunFile, "a restart had aborted"),
        ] {
            let (found, _) = run_seeds(0, 5_000, m);
            let found = found.unwrap_or_else(|| panic!("{m:?} was not caught in 5 000 seeds"));
            let first = found.lines().next().unwrap_or_default();
            assert!(first.contains(by), "{m:?} caught by another check: {first}");
            eprintln!("{m:?} caught: {first}");
        }
    }
}
