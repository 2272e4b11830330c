//! One simulated process: the truth it is checked against, what it does between restarts, and
//! how it stops.

use super::*;

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
