//! One owner per checkpoint location.
//!
//! Two processes running the same job on one location (a double deployment, a pod rescheduled
//! while the old one still runs) would fence each other's transactions and restore each other's
//! checkpoints: the second copy restores an older checkpoint and writes again what the first has
//! committed. So a job claims its location before it restores anything (`_owner`: who, where,
//! since when; renewed while it runs by a heartbeat beside it, never by writing the record
//! again: see [`beat_key`]), checks the claim before each checkpoint's metadata is written and
//! before its sinks' recovery acts, and gives it up when it ends.
//!
//! Whether the recorded owner is still alive is decided from evidence ([`judge`], a pure
//! function): on the same machine (host name and boot id) its process id and start time say it
//! directly — a crashed process restarted by its supervisor takes over at once; from another
//! machine, a record not renewed for a lease's length (watched here, not compared with another
//! machine's clock) is taken over, and a renewed one is a live owner: this start is refused,
//! naming it.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::blobs::Put;
use super::Storage;
use crate::error::{CoreError, Result};

/// The owner record of a checkpoint location. Every field has a default, so a record of another
/// build still reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct OwnerRecord {
    /// Unique per claim (one job run).
    pub(crate) id: String,
    /// The job's name.
    pub(crate) job: String,
    /// The machine's host name.
    pub(crate) host: String,
    /// The machine's boot id (Linux), empty where unknown: a process id means something only
    /// within one boot of one machine.
    pub(crate) boot_id: String,
    /// The owner's process id.
    pub(crate) pid: u32,
    /// The process's start time (clock ticks since boot, Linux), `None` where unknown: a process
    /// id reused by another process has another start time.
    pub(crate) pid_start: Option<u64>,
    /// When the claim was made (ms since the epoch, the owner's clock).
    pub(crate) since_ms: u64,
    /// Renewals so far, as of this record (builds before the heartbeat file renewed the record
    /// itself): a record whose count moves has a live owner.
    pub(crate) beat: u64,
    /// The process id namespace (`/proc/self/ns/pid`), empty where unknown: containers that
    /// share a host name and a kernel see different processes under one id.
    pub(crate) pid_ns: String,
    /// The lease the owner renews within (ms): a watcher waits at least this long.
    pub(crate) lease_ms: u64,
    /// The run ended and gave the location up: the next start claims it at once.
    pub(crate) released: bool,
}

/// What the owner rule needs of the machine: its clock, who this process is, whether another
/// process of it runs. The real one ([`ThisMachine`]) asks the operating system; the simulation
/// (`sim.rs`) runs processes of several machines on a model clock.
pub(crate) trait Machine: Send + Sync + std::fmt::Debug {
    /// Time since some fixed moment (monotonic).
    fn now(&self) -> Duration;
    /// Waits `d`.
    fn sleep(&self, d: Duration);
    /// A claim by this process for `job`, renewed within `lease`: every field but the id, which
    /// is random.
    fn this_process(&self, job: &str, lease: Duration) -> OwnerRecord;
    /// Whether process `pid` runs with start time `start` on this machine (`None`: cannot tell).
    fn alive(&self, pid: u32, start: Option<u64>) -> Option<bool>;
}

/// The machine this process runs on.
#[derive(Debug)]
pub(crate) struct ThisMachine {
    start: Instant,
}

impl ThisMachine {
    pub(crate) fn shared() -> Arc<dyn Machine> {
        Arc::new(ThisMachine { start: Instant::now() })
    }
}

impl Machine for ThisMachine {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }

    fn this_process(&self, job: &str, lease: Duration) -> OwnerRecord {
        OwnerRecord::this_process(job, lease)
    }

    fn alive(&self, pid: u32, start: Option<u64>) -> Option<bool> {
        alive_here(pid, start)
    }
}

impl OwnerRecord {
    /// A new claim by this process for `job`, renewed within `lease`.
    pub(crate) fn this_process(job: &str, lease: Duration) -> Self {
        let pid = std::process::id();
        OwnerRecord {
            pid_ns: std::fs::read_link("/proc/self/ns/pid")
                .map(|l| l.to_string_lossy().into_owned())
                .unwrap_or_default(),
            lease_ms: lease.as_millis() as u64,
            released: false,
            id: new_claim_id(),
            job: job.to_owned(),
            host: read_trimmed("/proc/sys/kernel/hostname")
                .or_else(|| read_trimmed("/etc/hostname"))
                .unwrap_or_default(),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id").unwrap_or_default(),
            pid,
            pid_start: process_start(pid),
            since_ms: now_ms(),
            beat: 0,
        }
    }

    /// Who it is, for messages.
    pub(crate) fn describe(&self) -> String {
        format!(
            "job '{}', process {} on {} (claimed at {} ms since the epoch, claim {})",
            self.job,
            self.pid,
            if self.host.is_empty() {
                "an unknown host"
            } else {
                &self.host
            },
            self.since_ms,
            self.id
        )
    }

    /// Whether process ids of `other` mean the same processes as this one's: one boot of one
    /// machine, one process id namespace.
    fn same_machine(&self, other: &OwnerRecord) -> bool {
        !self.boot_id.is_empty()
            && !self.pid_ns.is_empty()
            && self.host == other.host
            && self.boot_id == other.boot_id
            && self.pid_ns == other.pid_ns
    }
}

/// What a start does about the recorded owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nobody owns the location, or its owner is gone: claim it.
    Claim,
    /// A live process owns it: refuse, saying why.
    Refuse(String),
    /// The owner is on another machine: watch its record for a lease's length.
    Watch,
}

/// Whether process `pid` runs with start time `start` on this machine (`None`: cannot tell).
pub(crate) type Alive<'a> = &'a dyn Fn(u32, Option<u64>) -> Option<bool>;

/// The decision for a start by `me`, given the recorded owner.
pub(crate) fn judge(current: Option<&OwnerRecord>, me: &OwnerRecord, alive: Alive<'_>) -> Verdict {
    let Some(owner) = current else {
        return Verdict::Claim;
    };
    if owner.id == me.id || owner.released {
        return Verdict::Claim;
    }
    if !owner.same_machine(me) {
        return Verdict::Watch;
    }
    if owner.pid == me.pid && owner.pid_start == me.pid_start {
        // This very process (an earlier run of the job in it, or a process id namespace where
        // every container is process 1, restarted): the earlier claim's run has ended.
        return Verdict::Claim;
    }
    match alive(owner.pid, owner.pid_start) {
        Some(false) => Verdict::Claim,
        Some(true) => Verdict::Refuse(format!("it is running: {}", owner.describe())),
        None => Verdict::Watch,
    }
}

/// What watching another machine's owner for a lease concluded: `first` was read at the start,
/// `last` at the end, with the owner's heartbeat then (`beats`: first, last).
pub(crate) fn after_watch(
    first: &OwnerRecord,
    last: Option<&OwnerRecord>,
    beats: (u64, u64),
    lease: Duration,
) -> Verdict {
    match last {
        None => Verdict::Claim,
        Some(last) if last.released => Verdict::Claim,
        Some(last) if last.id == first.id && last.beat == first.beat && beats.0 == beats.1 => Verdict::Claim,
        Some(last) => Verdict::Refuse(format!(
            "its owner renewed its claim within {}: {}",
            humantime::format_duration(lease),
            last.describe()
        )),
    }
}

const OWNER_FILE: &str = "_owner";

/// The heartbeat of claim `id`: the number of its renewals. Renewals write this, never the owner
/// record: a renewal is a read of the record (still mine?) and then a write, and a run that
/// stalled between the two — past its lease, taken over meanwhile — would otherwise write its
/// claim back over the new owner's and go on as the owner (with checkpoint ids the other run
/// may have used and retention deleted since: output committed twice). Only a claim writes the
/// record, and a claim is followed by a restore.
fn beat_key(id: &str) -> String {
    format!("_owner-beat-{id}")
}

/// How often a claimant watching another machine's owner reads its record again.
const WATCH_STEP: Duration = Duration::from_secs(1);

/// This run's claim, kept beside the storage.
#[derive(Debug)]
pub(crate) struct Claim {
    /// The record as this run wrote it last.
    me: OwnerRecord,
    /// The lease it renews within.
    lease: Duration,
    /// When the record was last written (claimed or renewed), by [`Machine::now`].
    renewed: Duration,
    /// Given up (the run ended) or found taken over: no renewal writes it again.
    over: bool,
}

impl Storage {
    /// The recorded owner: `Ok(None)` when there is none; a record that does not parse (cut
    /// short, written by hand) is an owner nobody can tell anything of (`Some` of an empty
    /// record): watched for a lease like one on another machine, then replaced.
    fn read_owner(&self) -> Result<Option<OwnerRecord>> {
        if self.blobs.size(OWNER_FILE)?.is_none() {
            return Ok(None);
        }
        let bytes = match self.blobs.get(OWNER_FILE) {
            Err(CoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            other => other?,
        };
        Ok(Some(serde_json::from_slice(&bytes).unwrap_or_default()))
    }

    fn write_owner(&self, record: &OwnerRecord, how: Put) -> Result<bool> {
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| CoreError::Serialization {
            what: "the owner record".into(),
            reason: e.to_string(),
        })?;
        self.blobs.put(OWNER_FILE, &bytes, how)
    }

    /// The heartbeat of claim `id` (0: none yet, or unreadable).
    fn read_beat(&self, id: &str) -> Result<u64> {
        let key = beat_key(id);
        if self.blobs.size(&key)?.is_none() {
            return Ok(0);
        }
        let bytes = match self.blobs.get(&key) {
            Err(CoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            other => other?,
        };
        Ok(std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0))
    }

    fn owned(&self, reason: String) -> CoreError {
        CoreError::LocationOwned {
            location: self.root.clone(),
            reason,
        }
    }

    /// Claims the location for a run of `job` before it restores anything: at once when nobody
    /// owns it or its owner is gone; after watching the record for a lease (`lease`, or the
    /// owner's if longer) when the owner runs on another machine; never while its owner runs
    /// ([`CoreError::LocationOwned`], fatal). Blocks (storage calls, the watch).
    pub fn claim(&self, job: &str, lease: Duration) -> Result<()> {
        let mut me = self.machine.this_process(job, lease);
        me.id = self.claim_id.get_or_init(|| me.id.clone()).clone();
        let alive = |pid, start| self.machine.alive(pid, start);
        for _ in 0..5 {
            let current = self.read_owner()?;
            let verdict = match judge(current.as_ref(), &me, &alive) {
                Verdict::Watch => {
                    let owner = current.as_ref().expect("watched");
                    self.watch(owner, &me.id, lease.max(Duration::from_millis(owner.lease_ms)))?
                }
                v => v,
            };
            if let Verdict::Refuse(why) = verdict {
                return Err(self.owned(why));
            }
            let how = if current.is_some() { Put::Replace } else { Put::Create };
            // From before the write: a watcher elsewhere may count the lease from its appearance.
            let written = self.machine.now();
            if !self.write_owner(&me, how)? {
                continue; // created meanwhile by another start: judge it
            }
            // Two starts taking over at once both write: the one whose record stays wins.
            if self.read_owner()?.is_some_and(|r| r.id == me.id) {
                if let Some(old) = current.filter(|c| c.id != me.id) {
                    if !old.released {
                        warn!(location = %self.root.display(), previous = %old.describe(), "Took over the checkpoint location from a run that has ended.");
                    }
                    // Its heartbeat is of no use any more (best effort: a leftover is harmless).
                    let _ = self.blobs.delete(&beat_key(&old.id));
                }
                *self.claim.lock().expect("not poisoned") = Some(Claim {
                    me,
                    lease,
                    renewed: written,
                    over: false,
                });
                return Ok(());
            }
        }
        Err(self.owned("other starts claimed it at the same time".into()))
    }

    /// Watches another machine's owner record for `lease`: a record that moves has a live owner;
    /// one that goes (released, removed) frees the location at once.
    /// (`mine`: this run's claim id. A claim write of an earlier attempt of this run, answered by
    /// an error, may land while it watches: the record is then this run's, not a live owner's.)
    fn watch(&self, first: &OwnerRecord, mine: &str, lease: Duration) -> Result<Verdict> {
        info!(
            location = %self.root.display(),
            owner = %first.describe(),
            lease = %humantime::format_duration(lease),
            "The checkpoint location's owner ran on another machine: waiting for its claim to lapse before taking over."
        );
        let clock = || self.machine.now();
        let start = clock();
        let mut logged = start;
        let first_beat = self.read_beat(&first.id)?;
        loop {
            // The heartbeat first, the record last: a record this run's own late write made its
            // own is seen as such, whatever the heartbeat read before it said.
            let beat = self.read_beat(&first.id)?;
            let last = self.read_owner()?;
            if last.as_ref().is_some_and(|l| l.id == mine) {
                return Ok(Verdict::Claim);
            }
            let verdict = after_watch(first, last.as_ref(), (first_beat, beat), lease);
            let freed = last.as_ref().is_none_or(|l| l.released);
            let waited = clock() - start;
            if freed || matches!(verdict, Verdict::Refuse(_)) || waited >= lease {
                return Ok(verdict);
            }
            if clock() - logged >= Duration::from_secs(10) {
                logged = clock();
                info!(
                    location = %self.root.display(),
                    waited_s = waited.as_secs(),
                    lease_s = lease.as_secs(),
                    "Still waiting for the previous owner's claim to lapse."
                );
            }
            self.machine.sleep(WATCH_STEP.min(lease.saturating_sub(waited)));
        }
    }

    /// Checks that this run still owns the location (no claim made: nothing to check). Called
    /// before each checkpoint's metadata is written, so a run that lost its location never makes
    /// another checkpoint durable, and its sinks never commit for one. Lost — the record names
    /// another run, was released or removed — is [`CoreError::LocationOwned`] (fatal); a claim not
    /// renewed for two thirds of its lease (another machine may take over after a lease) is
    /// [`CoreError::ClaimNotRenewed`]: the attempt restarts, and renews before it restores.
    pub(super) fn check_claim(&self) -> Result<()> {
        // The bug this guards against, put back for the simulation to catch.
        #[cfg(test)]
        if crate::sim::mutant() == crate::sim::Mutant::NoClaimCheck {
            return Ok(());
        }
        let Some((me, lease, renewed, over)) = self
            .claim
            .lock()
            .expect("not poisoned")
            .as_ref()
            .map(|c| (c.me.clone(), c.lease, c.renewed, c.over))
        else {
            return Ok(());
        };
        if over {
            return Err(self.owned("this run gave it up or lost it".into()));
        }
        let since_renewed = self.machine.now().saturating_sub(renewed);
        if since_renewed > lease * 2 / 3 {
            // Renewed here, now (the store may be back before the renewal task's next turn);
            // failing that, nothing is made durable.
            return match self.renew_claim() {
                Ok(()) => Ok(()),
                Err(e @ CoreError::LocationOwned { .. }) => Err(e),
                Err(e) => {
                    warn!(location = %self.root.display(), error = %e, "Renewing the checkpoint location's claim failed.");
                    Err(CoreError::ClaimNotRenewed {
                        location: self.root.clone(),
                        seconds: since_renewed.as_secs(),
                    })
                }
            };
        }
        self.still_mine(&me)
    }

    /// Whether this storage holds a claim (made once per run; the simulation's model process
    /// keeps its storage across attempts as the executor does).
    #[cfg(test)]
    pub(crate) fn has_claim(&self) -> bool {
        self.claim.lock().expect("not poisoned").is_some()
    }

    /// Whether the record is still `me`'s.
    fn still_mine(&self, me: &OwnerRecord) -> Result<()> {
        let lost = |why: String| {
            if let Some(c) = self.claim.lock().expect("not poisoned").as_mut() {
                c.over = true;
            }
            Err(self.owned(why))
        };
        match self.read_owner()? {
            Some(r) if r.id == me.id && !r.released => Ok(()),
            Some(r) if r.id.is_empty() => lost("its owner record was overwritten".into()),
            Some(r) if r.released => lost(format!("another run released it: {}", r.describe())),
            Some(r) => lost(format!("another run took it over: {}", r.describe())),
            None => lost("its owner record was removed".into()),
        }
    }

    /// Renews this run's claim (while it runs, every third of the lease; and before each
    /// restart restores): a record that moves tells a start on another machine that its owner
    /// is alive. A claim found lost is [`CoreError::LocationOwned`].
    pub fn renew_claim(&self) -> Result<()> {
        let Some((mut me, over)) = self
            .claim
            .lock()
            .expect("not poisoned")
            .as_ref()
            .map(|c| (c.me.clone(), c.over))
        else {
            return Ok(());
        };
        if over {
            return Err(self.owned("this run gave it up or lost it".into()));
        }
        self.still_mine(&me)?;
        me.beat += 1;
        let started = self.machine.now();
        if self.claim.lock().expect("not poisoned").as_ref().is_none_or(|c| c.over) {
            return Err(self.owned("this run gave it up or lost it".into())); // released meanwhile
        }
        // The bug this guards against (see `beat_key`), put back for the simulation to catch.
        #[cfg(test)]
        let in_record = crate::sim::mutant() == crate::sim::Mutant::RenewRewritesRecord;
        #[cfg(not(test))]
        let in_record = false;
        if in_record {
            self.write_owner(&me, Put::Replace)?;
        } else {
            self.blobs
                .put(&beat_key(&me.id), format!("{}\n", me.beat).as_bytes(), Put::Replace)?;
        }
        let mut guard = self.claim.lock().expect("not poisoned");
        if let Some(c) = guard.as_mut().filter(|c| !c.over) {
            c.me = me;
            // From before the write: a slow write does not stretch the lease.
            c.renewed = started;
        }
        Ok(())
    }

    /// Gives up this run's claim when it ends: the record says so, and the next start anywhere
    /// claims at once. Renewals after this write nothing.
    pub fn release_claim(&self) -> Result<()> {
        let me = {
            let mut guard = self.claim.lock().expect("not poisoned");
            let Some(c) = guard.as_mut().filter(|c| !c.over) else {
                return Ok(());
            };
            c.over = true;
            c.me.clone()
        };
        if self.read_owner()?.is_some_and(|r| r.id == me.id) {
            self.write_owner(
                &OwnerRecord {
                    released: true,
                    ..me.clone()
                },
                Put::Replace,
            )?;
        }
        let _ = self.blobs.delete(&beat_key(&me.id)); // best effort: a leftover is harmless
        Ok(())
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

/// A running process's start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`);
/// `None` for no such process, or one that has exited and waits to be reaped (a zombie).
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after the last ')'.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    if matches!(fields.next(), Some("Z" | "X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether `pid` runs on this machine with start time `start`, from `/proc`.
pub(crate) fn alive_here(pid: u32, start: Option<u64>) -> Option<bool> {
    if !std::path::Path::new("/proc/self/stat").exists() {
        return None;
    }
    match process_start(pid) {
        None => Some(false),
        Some(s) => Some(start.is_none_or(|start| start == s)),
    }
}

/// A new random claim id.
pub(crate) fn new_claim_id() -> String {
    format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
#[path = "owner_tests.rs"]
mod tests;
