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
use crate::storage::owner::{Machine, OwnerRecord};
use crate::storage::unfinished::VOID;
use crate::storage::{after_failed_commit, CheckpointStorage, FailedCommit, Storage};

mod process;
mod sweep;
use process::{process, violation, Outcome, Proc, Truth};
use sweep::{budget, finish, run, run_seeds, sweep};

mod copies;
mod job;
mod mutant;
use mutant::with_mutant;
pub(crate) use mutant::{mutant, Mutant};

const ROOT: &str = "s3://sim/job";
const KEEP: usize = 2;
const TRACE_LINES: usize = 400;

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
    /// Two copies: a process stopped because the other copy owns the location.
    pub(crate) owner_stops: u64,
    /// Two copies: a claim made while a process of the other copy was still running.
    pub(crate) takeovers: u64,
    /// Two copies: a copy paused past the lease (a stall, a partition).
    pub(crate) long_pauses: u64,
    /// Two copies: a recovery that reached the sinks after another run took over since its owner
    /// check (`copies::STALE_RECOVERY`).
    pub(crate) stale_recovery: u64,
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
            (&mut c.owner_stops, p.owner_stops),
            (&mut c.takeovers, p.takeovers),
            (&mut c.long_pauses, p.long_pauses),
            (&mut c.stale_recovery, p.stale_recovery),
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
    /// The processes whose calls reach the store (the others crashed or ended).
    alive: BTreeSet<u32>,
    /// The id of the next process to start.
    next_pid: u32,
    /// Two copies of the job at once (`copies.rs`): whose turn it is; `None` for one copy.
    sched: Option<copies::Sched>,
    /// Fault rates per call: an error (nothing done), an answer lost (done), held, a crash.
    fail: f64,
    lost: f64,
    hold: f64,
    crash: f64,
    /// No faults after this step.
    faults_until: u64,
    /// The job has no keyed state: its checkpoints write no files of their own.
    stateless: bool,
    /// Two copies of the job ran (`copies.rs`): for the replay command.
    copies: bool,
    /// Two copies: an owner that stopped as if it had lost the location.
    spurious_stop: Option<String>,
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
            copies: false,
            spurious_stop: None,
            rng,
            step: 0,
            files: BTreeMap::new(),
            held: Vec::new(),
            ghosts: Vec::new(),
            alive: BTreeSet::new(),
            next_pid: 0,
            sched: None,
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

    /// A call's description in the trace: with two copies, whose call it is.
    fn who(&self, me: u32, what: &str) -> String {
        if self.copies {
            format!("p{me} {what}")
        } else {
            what.to_owned()
        }
    }

    /// The owner record in the store, as it reads now.
    fn owner(&self) -> Option<OwnerRecord> {
        self.files.get("_owner").and_then(|b| serde_json::from_slice(b).ok())
    }

    /// A new process: its id.
    fn spawn(&mut self) -> u32 {
        let me = self.next_pid;
        self.next_pid += 1;
        self.alive.insert(me);
        me
    }

    /// The run is over (two copies: one finished): no call reaches the store any more.
    fn over(&self) -> bool {
        self.sched.as_ref().is_some_and(|s| s.over)
    }

    /// Entering a call of process `me`: the step, a crash, a failure.
    fn enter(&mut self, me: u32, what: &str) -> Result<()> {
        if self.over() {
            return Err(outage("the run is over", what));
        }
        self.tick();
        if !self.alive.contains(&me) {
            return Err(outage("the process is gone", what));
        }
        if self.faulty() && self.chance(self.crash) {
            self.crash_now(me, what);
            return Err(outage("the process crashed", what));
        }
        Ok(())
    }

    fn crash_now(&mut self, me: u32, at: &str) {
        self.alive.remove(&me);
        self.paths.crashes += 1;
        self.note(format!("CRASH at {at}"));
    }

    fn read(&mut self, me: u32, what: &str) -> Result<()> {
        let what = &self.who(me, what);
        self.enter(me, what)?;
        if self.faulty() && self.chance(self.fail) {
            self.note(format!("{what}: failed"));
            return Err(outage("a read failed", what));
        }
        self.note(what.to_owned());
        Ok(())
    }

    fn write(&mut self, me: u32, op: Op) -> Result<bool> {
        let what = self.who(me, &op.describe());
        if self.over() {
            return Err(outage("the run is over", &what));
        }
        self.tick();
        if !self.alive.contains(&me) {
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
            self.crash_now(me, &what);
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
    /// Two copies at once: each call waits for this copy's turn.
    baton: Option<Arc<copies::Baton>>,
}

impl Sim {
    fn world(&self) -> MutexGuard<'_, World> {
        let w = self.world.lock().expect("not poisoned");
        match &self.baton {
            Some(b) => b.pass(w),
            None => w,
        }
    }
}

/// The machine a model process runs on: the model's clock (a step is 100 ms), its process ids.
struct SimMachine {
    world: Arc<Mutex<World>>,
    baton: Option<Arc<copies::Baton>>,
    host: String,
    pid: u32,
}

/// The id of model process `pid`'s claim.
fn claim_id(pid: u32) -> String {
    format!("p{pid}-claim")
}

/// Model time per step.
const STEP: Duration = Duration::from_millis(100);

impl std::fmt::Debug for SimMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimMachine")
            .field("host", &self.host)
            .field("pid", &self.pid)
            .finish()
    }
}

impl Machine for SimMachine {
    fn now(&self) -> Duration {
        STEP * self.world.lock().expect("not poisoned").step as u32
    }

    fn sleep(&self, d: Duration) {
        let steps = d.as_millis().div_ceil(STEP.as_millis()) as u64;
        let mut w = self.world.lock().expect("not poisoned");
        match &self.baton {
            Some(b) => {
                let wake = w.step + steps;
                if let Some(s) = w.sched.as_mut() {
                    s.wake[b.copy] = wake;
                }
                drop(b.pass(w));
            }
            None => {
                for _ in 0..steps {
                    w.tick();
                }
            }
        }
    }

    fn this_process(&self, job: &str, lease: Duration) -> OwnerRecord {
        let step = self.world.lock().expect("not poisoned").step;
        OwnerRecord {
            id: claim_id(self.pid),
            job: job.to_owned(),
            host: self.host.clone(),
            boot_id: "boot".into(),
            pid: self.pid,
            pid_start: Some(1),
            since_ms: step * STEP.as_millis() as u64,
            beat: 0,
            pid_ns: "pid-ns".into(),
            lease_ms: lease.as_millis() as u64,
            released: false,
        }
    }

    fn alive(&self, pid: u32, _start: Option<u64>) -> Option<bool> {
        Some(self.world.lock().expect("not poisoned").alive.contains(&pid))
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

#[cfg(test)]
mod tests;
