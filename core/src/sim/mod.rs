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
use crate::storage::owner::{Machine, OwnerRecord};
use crate::storage::unfinished::VOID;
use crate::storage::{after_failed_commit, CheckpointStorage, FailedCommit, Storage};

mod sweep;
use sweep::{budget, finish, run, run_seeds, sweep};

mod copies;
mod job;

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
    /// A commit does not check that this run still owns the location: a copy whose claim was
    /// taken over (it stalled past its lease) commits on top of what the other copy restored.
    NoClaimCheck,
    /// The sinks' recovery on restore does not check the owner first: a copy that stalled past
    /// its lease while it restored goes on from what it chose before, behind the new owner.
    NoOwnerCheckBeforeRecovery,
    /// A checkpoint without files of its own is checked for its owner before its first file is
    /// written: a run that stalls between the two, and is taken over meanwhile, commits one the
    /// new owner could not see (and make void) when it listed.
    CheckBeforeBegun,
    /// A renewal writes the owner record again (after reading it still this run's): a run that
    /// stalls between the two, past its lease, writes its claim back over the new owner's and
    /// goes on with checkpoint ids the other may have used and deleted.
    RenewRewritesRecord,
    /// A restart makes unfinished checkpoints void without checking its claim after listing them,
    /// and a commit that finds its checkpoint void takes that for another owner: a run that
    /// stalled while it restored makes the new owner's checkpoint in progress void, and the new
    /// owner stops as if it had lost the location.
    StaleVoidStopsOwner,
    /// Barrier alignment in exactly-once mode never holds an input back: records that follow the
    /// barrier on an input are processed before the snapshot (at-least-once).
    AlignerNeverBlocks,
    /// The coordinator takes a checkpoint as complete one acknowledgement short: a task's state
    /// (and its pre-committed transaction) is missing from the checkpoint.
    AckOneShort,
    /// An alignment given up (its buffer over the limit) drops what it held back instead of
    /// releasing it.
    DropHeldOnAbort,
}

thread_local! {
    static MUTANT: Cell<Mutant> = const { Cell::new(Mutant::None) };
}

/// The mutant active on this thread.
pub(crate) fn mutant() -> Mutant {
    MUTANT.with(Cell::get)
}

/// Runs `f` with `m` active on this thread (and on the threads it starts that ask for it).
fn with_mutant<T>(m: Mutant, f: impl FnOnce() -> T) -> T {
    MUTANT.with(|c| c.set(m));
    let r = f();
    MUTANT.with(|c| c.set(Mutant::None));
    r
}

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

/// A local file with the content of shared file `name` (a name always has the same content, as
/// an SST file's does), for an upload: one scratch file per thread, rewritten each time.
pub(in crate::sim) fn shared_source(name: &str) -> PathBuf {
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
pub(in crate::sim) fn metadata(id: CheckpointId, me: u32, files: Vec<FileHandle>) -> CheckpointMetadata {
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
                    encoding: crate::checkpoint::StateEncoding::Postcard,
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
pub(in crate::sim) struct Truth {
    /// The newest checkpoint whose commit was answered: the sinks committed its transactions.
    pub(in crate::sim) acked: CheckpointId,
    /// Every checkpoint whose commit was answered: its id and the process.
    pub(in crate::sim) committed: BTreeSet<(CheckpointId, u32)>,
    /// Every checkpoint a process began: its id and the process.
    pub(in crate::sim) started: BTreeSet<(CheckpointId, u32)>,
    /// Checkpoints a restart went past (restoring an older one): their transactions aborted.
    pub(in crate::sim) abandoned: BTreeSet<(CheckpointId, u32)>,
    /// Checkpoints completed since the last restore, and in all.
    pub(in crate::sim) done: u64,
    /// The last checkpoint id a process used: an attempt of the job that starts again in the
    /// same process goes on past it (the executor keeps it), never begins an id again.
    pub(in crate::sim) last_used: BTreeMap<u32, CheckpointId>,
    /// Per process, the checkpoint (id, writer) its output goes on from: the one it restored,
    /// then each it committed.
    pub(in crate::sim) base: BTreeMap<u32, (CheckpointId, u32)>,
    /// Each committed checkpoint by the one it went on from. Two on the same one: the output
    /// between was committed twice.
    pub(in crate::sim) child: BTreeMap<(CheckpointId, u32), (CheckpointId, u32)>,
}

impl Truth {
    /// Process `me`'s commit of checkpoint `id` was answered: the sinks commit its transactions.
    pub(in crate::sim) fn committed(&mut self, me: u32, id: CheckpointId) -> std::result::Result<(), String> {
        if self.abandoned.contains(&(id, me)) {
            return Err(format!(
                "DATA LOST: checkpoint {id} of process {me} committed, but a restore elsewhere had gone on from an older one and aborted its transactions"
            ));
        }
        let base = self.base.get(&me).copied().unwrap_or_default();
        if let Some(&(other, by)) = self.child.get(&base).filter(|&&c| c != (id, me)) {
            return Err(format!(
                "DUPLICATES: checkpoint {id} of process {me} committed on top of checkpoint {} of process {}, as checkpoint {other} of process {by} was: the output between was committed twice",
                base.0, base.1
            ));
        }
        self.child.insert(base, (id, me));
        // (A late answer: another run may have restored this one and gone on already.)
        self.acked = self.acked.max(id);
        self.committed.insert((id, me));
        self.done += 1;
        self.base.insert(me, (id, me));
        Ok(())
    }
}

/// A model process: the world, the truth, who it is, what it reaches the store through.
pub(in crate::sim) struct Proc<'a> {
    pub(in crate::sim) world: &'a Arc<Mutex<World>>,
    pub(in crate::sim) truth: &'a Mutex<Truth>,
    pub(in crate::sim) me: u32,
    pub(in crate::sim) baton: Option<Arc<copies::Baton>>,
    /// The machine it runs on (two copies may run on two).
    pub(in crate::sim) host: String,
    /// Its storage, when kept across attempts (two copies).
    pub(in crate::sim) storage: Option<Storage>,
}

impl Proc<'_> {
    pub(in crate::sim) fn truth(&self) -> MutexGuard<'_, Truth> {
        self.truth.lock().expect("not poisoned")
    }

    pub(in crate::sim) fn gone(&self) -> bool {
        !self.world.lock().expect("not poisoned").alive.contains(&self.me)
    }

    /// A storage for this process on the model store and machine.
    pub(in crate::sim) fn new_storage(&self) -> Storage {
        let machine = Arc::new(SimMachine {
            world: self.world.clone(),
            baton: self.baton.clone(),
            host: self.host.clone(),
            pid: self.me,
        });
        Storage::on_blobs(
            Arc::new(Sim {
                world: self.world.clone(),
                me: self.me,
                baton: self.baton.clone(),
            }),
            PathBuf::from(ROOT),
            &format!("p{}", self.me),
            machine,
        )
    }
}

/// Why a seed fails: the violation, then the trace's last lines.
pub(in crate::sim) fn violation(world: &Arc<Mutex<World>>, seed: u64, what: String) -> String {
    let w = world.lock().expect("not poisoned");
    let lines: Vec<&str> = w.lines.iter().map(String::as_str).collect();
    format!(
        "seed {seed}: {what}\n(replay: scripts/simulate --{} --first {seed} --seeds 1)\nlast steps:\n{}",
        if w.copies { "copies" } else { "storage" },
        lines.join("\n")
    )
}

pub(in crate::sim) enum Outcome {
    /// The process is gone (crashed, or stopped): a new one starts.
    Gone,
    /// The job reached its target.
    Finished,
}

/// Checks the snapshot process `p` restored, reads its files, and records in the truth what
/// the run going on from it does: `None` when the process is gone meanwhile (or an outage
/// stopped the reads: the attempt restarts), else the restored id and the shared files its
/// model RocksDB holds.
pub(in crate::sim) fn went_on(
    p: &Proc<'_>,
    storage: &Storage,
    snapshot: Option<&crate::storage::Snapshot>,
    plan: &RestorePlan,
) -> std::result::Result<Option<(CheckpointId, Vec<String>)>, String> {
    let me = p.me;
    if let Some(f) = &plan.fallback {
        return Err(format!(
            "UNRESTORABLE: fell back to checkpoint {} past {}, which the job itself made unreadable: {}",
            f.restored, f.unusable, f.error
        ));
    }
    let restored = snapshot.map_or(0, |s| s.meta.id);
    let writer = snapshot.map_or(0, |s| s.meta.timestamp_ms as u32);
    let mut live: Vec<String> = Vec::new();
    if let Some(s) = snapshot {
        for f in s.meta.files() {
            match s.reader.read(f) {
                Ok(_) => {}
                Err(_) if p.gone() => return Ok(None),
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
        p.world.lock().expect("not poisoned").paths.restored_some += 1;
    }
    // With two copies: the state restored, the tasks start and the sinks connect (seconds, in
    // which a stall may come as at any call); then the sinks' recovery changes nothing before
    // the owner check right before it (the two-phase driver's, `InitContext::check_still_owner`).
    // (One copy: no other run to check for; the model of one copy stays as it was.)
    let two = p.baton.is_some();
    if two {
        copies::starting_tasks(p);
    }
    let made = two && mutant() != Mutant::NoOwnerCheckBeforeRecovery;
    let checked = if made { storage.check_owner() } else { Ok(()) };
    match &checked {
        Ok(()) => {}
        Err(_) if p.gone() => return Ok(None),
        Err(e @ CoreError::LocationOwned { .. }) => {
            stopped(p.world, me, e);
            return Ok(None);
        }
        Err(_) => return Ok(None), // an outage: the attempt restarts
    }
    // Then the sinks reach their external systems: another turn (a stall may come here too).
    if copies::recovery_went_stale(p, made && checked.is_ok()) {
        return Err(copies::STALE_RECOVERY.into());
    }
    if p.gone() {
        return Ok(None); // the run ended (the other copy finished) meanwhile
    }
    // What the sinks' recovery does is judged now: it commits the restored checkpoint's
    // transactions and aborts the others'.
    {
        let truth = p.truth();
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
    }
    // The run goes on from `restored`: every checkpoint begun above it is given up, its
    // transactions aborted by the sinks' recovery; the restored one's are committed.
    {
        let mut truth = p.truth();
        let above: Vec<_> = truth.started.range((restored + 1, 0)..).copied().collect();
        truth.abandoned.extend(above);
        truth.acked = truth.acked.max(restored);
        truth.base.insert(me, (restored, writer));
    }
    p.world
        .lock()
        .expect("not poisoned")
        .note(format!("process {me} restored {restored}"));
    Ok(Some((restored, live)))
}

/// Process `me` stopped, naming another run: with one copy of the job, an earlier process whose
/// write of the owner record landed late; with two, the other copy. The operator (or the
/// supervisor) starts it again.
pub(in crate::sim) fn stopped(world: &Arc<Mutex<World>>, me: u32, e: &CoreError) -> Outcome {
    let mut w = world.lock().expect("not poisoned");
    if w.sched.is_some() {
        w.paths.owner_stops += 1;
        // The record still names this process: it stopped though nobody took its place.
        if w.owner().is_some_and(|o| o.id == claim_id(me) && !o.released) && w.spurious_stop.is_none() {
            w.spurious_stop = Some(format!(
                "SPURIOUS STOP: process {me} owns the location, yet stopped: {e}"
            ));
        }
    } else {
        w.paths.late_owner_stop += 1;
    }
    w.note(format!("process {me} stopped: {e}"));
    w.alive.remove(&me);
    Outcome::Gone
}

/// The lease of a claim: with one copy, never lapsing; with two, 20 s (200 steps).
pub(in crate::sim) fn lease(two: bool) -> Duration {
    if two {
        copies::LEASE
    } else {
        Duration::from_secs(3_600)
    }
}

/// One process: claims, restores, checks, then checkpoints until it crashes or the job is done.
pub(in crate::sim) fn process(p: &Proc<'_>, target: u64, last: bool) -> std::result::Result<Outcome, String> {
    let (world, me) = (p.world, p.me);
    let two = p.baton.is_some();
    let machine = Arc::new(SimMachine {
        world: world.clone(),
        baton: p.baton.clone(),
        host: p.host.clone(),
        pid: me,
    });
    // The process's storage, kept across its attempts as the executor keeps it (with one copy,
    // the model as it was: one per attempt, the claim made again).
    let storage = p.storage.clone().unwrap_or_else(|| p.new_storage());
    // Claim, then restore as the executor does (renewing the claim first): I/O errors are retried.
    let mut tries = 0;
    let mut claimed = storage.has_claim();
    let (snapshot, plan) = loop {
        tries += 1;
        if tries > 400 {
            return Err("no progress: the restore kept failing after faults stopped".into());
        }
        let chosen = if claimed {
            storage.renew_claim()
        } else {
            storage.claim("sim", lease(two))
        }
        .and_then(|()| {
            if !claimed && two {
                copies::claimed(world, me);
            }
            claimed = true;
            RestorePlan::first(Some(&storage), None, false)
        });
        match chosen {
            Ok(c) => break c,
            Err(_) if p.gone() => return Ok(Outcome::Gone),
            Err(e) if e.class() == ErrorClass::Restart => continue,
            Err(e @ CoreError::LocationOwned { .. }) => return Ok(stopped(world, me, &e)),
            Err(e) => return Err(format!("UNRESTORABLE: the restore failed: {e}")),
        }
    };
    let (restored, mut live) = match went_on(p, &storage, snapshot.as_ref(), &plan)? {
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
                Err(_) if p.gone() => return Err("the last process crashed without faults".into()),
                Err(_) => continue,
            }
        };
        for &id in &kept {
            let s = storage
                .open(id)
                .map_err(|e| format!("UNRESTORABLE: listed checkpoint {id} does not open: {e}"))?;
            let writer = s.meta.timestamp_ms as u32;
            if p.truth().abandoned.contains(&(id, writer)) {
                return Err(format!(
                    "checkpoint {id} of process {writer}, whose transactions a restart had aborted, is listed as completed"
                ));
            }
        }
        for &id in kept.iter().rev().take(KEEP) {
            let s = storage
                .open(id)
                .map_err(|e| format!("UNRESTORABLE: kept checkpoint {id} does not open: {e}"))?;
            if !p.truth().committed.contains(&(id, s.meta.timestamp_ms as u32)) {
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
    let used = p.truth().last_used.get(&me).copied().unwrap_or(0);
    let mut next = loop {
        match storage.highest_id() {
            Ok(h) => break h.max(restored).max(used) + 1,
            Err(_) if p.gone() => return Ok(Outcome::Gone),
            Err(_) => continue,
        }
    };
    let mut discards: VecDeque<CheckpointId> = VecDeque::new();
    let mut steps_after_faults = 0;
    let mut renewed = machine.now();
    loop {
        {
            let w = world.lock().expect("not poisoned");
            if !w.faulty() {
                steps_after_faults += 1;
                if p.truth().done >= target {
                    return Ok(Outcome::Finished);
                }
            }
        }
        if steps_after_faults > 300 {
            return Err(format!(
                "no progress: {} checkpoints of {target} after faults stopped",
                p.truth().done
            ));
        }
        // The claim is renewed every third of its lease (the executor's renewal task).
        if two && machine.now() - renewed >= lease(two) / 3 {
            match storage.renew_claim() {
                Ok(()) => renewed = machine.now(),
                Err(_) if p.gone() => return Ok(Outcome::Gone),
                Err(e @ CoreError::LocationOwned { .. }) => return Ok(stopped(world, me, &e)),
                Err(_) => {} // the next try, or the check before a commit, renews
            }
        }
        // Background deletes of failed checkpoints run when they get their turn.
        while !discards.is_empty() && world.lock().expect("not poisoned").rng.random_bool(0.4) {
            let id = discards.pop_front().expect("not empty");
            let _ = storage.abort(id);
        }
        let id = next;
        next += 1;
        {
            let mut truth = p.truth();
            truth.started.insert((id, me));
            truth.last_used.insert(me, id);
        }
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
        if p.gone() {
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
                p.truth().committed(me, id)?;
                match storage.retain(KEEP) {
                    Err(_) if p.gone() => return Ok(Outcome::Gone),
                    Err(_) => world.lock().expect("not poisoned").paths.retention_stopped += 1,
                    Ok(_) => {}
                }
            }
            Err(_) if p.gone() => return Ok(Outcome::Gone),
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
                        Ok(snapshot) => match went_on(p, &storage, snapshot.as_ref(), &plan)? {
                            Some((restored, restored_live)) => {
                                world.lock().expect("not poisoned").paths.restarted_in_process += 1;
                                live = restored_live;
                                let highest = loop {
                                    match storage.highest_id() {
                                        Ok(h) => break h,
                                        Err(_) if p.gone() => return Ok(Outcome::Gone),
                                        Err(_) => continue,
                                    }
                                };
                                next = (next - 1).max(highest).max(restored) + 1;
                            }
                            None => return Ok(Outcome::Gone),
                        },
                        Err(_) if p.gone() => return Ok(Outcome::Gone),
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

#[cfg(test)]
mod tests;
