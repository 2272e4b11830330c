//! Deterministic simulation of the commit after restart: the real decision code ([`CommitSteps`]
//! and the probe's [`ProbeReader`]) driven against a model of a Kafka transaction coordinator
//! (transaction version 1: one producer id and epoch for every transaction of a producer
//! session), with faults and a zombie chosen by a seeded random generator. The same seed gives the
//! same trace (its hash is compared), and a failing seed names itself.
//!
//! The world: the restored transaction (ours) is open under the id; the crashed process's
//! producer (the zombie) may still commit it, then begin transactions of its own under the same
//! producer id and epoch; the coordinator may abort an open transaction on timeout (bumping the
//! epoch), answer that it moved or is loading with or without having applied an EndTxn, lose an
//! answer after applying it, or hold an EndTxn and apply it later; a decided commit or abort takes
//! a few steps to be written (Prepare… → Complete…). The probe reader sees our record when a
//! read_committed reader could: after the commit's markers; before, it stops at the end of what it
//! may read, and a watermark query may meanwhile show the stable offset past our record.
//!
//! The checks, every seed: an EndTxn is sent only right after a description that showed our
//! transaction open (the rule that keeps a zombie's transaction from being committed blind);
//! "committed" only when the model committed ours; "lost" only when the model aborted it; an
//! EndTxn of ours that committed a zombie's transaction is reported (fatal), never passed off as
//! success. Not modelled: librdkafka, the wire client's retries and timing, the broker's real
//! scheduling; after the recovery decides, the sink's pool initialises the id (fencing the zombie)
//! before a held EndTxn lands — the real sink does that within the same start.

use std::cell::Cell;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::probe::{ProbeReader, ReadEvent, Seen};
use super::steps::{CommitSteps, EndTxnAnswer, Next};
use crate::committable::{KafkaCommittable, Probe, COMMITTABLE_VERSION};
use crate::protocol::{code, TxnDescription};

mod sweep;
use sweep::{run, run_seeds};

/// Known bugs, put back on purpose (one at a time, per thread): the simulation must catch each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// None: the code as it is.
    None,
    /// After an unclear EndTxn answer (coordinator moving, no answer), send it again at once
    /// instead of describing first.
    ResendUnclearEndTxn,
    /// Take an EndTxn's success as the end, without describing the id again.
    TrustEndTxnSuccess,
    /// The probe decides "skipped" from a watermark query after the reader reached the end of
    /// what it may read (the stable offset moved past the record meanwhile, the record not read).
    ProbeSecondWatermark,
    /// Stops (fatal) on every unclear EndTxn answer: safe-looking, but it stops healthy
    /// recoveries.
    FatalOnUnclear,
    /// The rule before the simulation found its gap: an EndTxn in doubt followed by a
    /// description of a later transaction of the same producer goes to the probe.
    InDoubtLaterToProbe,
    /// Each try of a commit starts afresh, forgetting an EndTxn in doubt of the try before.
    ForgetAcrossTries,
    /// The rule before the simulation found its second gap: after an EndTxn in doubt, only a
    /// later transaction under our very epoch counts as a zombie's — not one a timeout aborted
    /// since, whose description shows the epoch the timeout bumped.
    InDoubtLaterSameEpochOnly,
}

thread_local! {
    static MUTANT: Cell<Mutant> = const { Cell::new(Mutant::None) };
}

/// The mutant active on this thread.
pub(crate) fn mutant() -> Mutant {
    MUTANT.with(Cell::get)
}

const PID: i64 = 17;
/// The crashed session's producer epoch (ours, and the zombie's until it is fenced), in most
/// seeds; in some it is the last the coordinator gives a session before it must move the id to a
/// new producer id ([`EXHAUSTED`]).
const EPOCH: i16 = 3;
/// An epoch the coordinator no longer bumps by an InitProducerId (Kafka's "epoch exhausted",
/// from `i16::MAX - 1`): it gives the id a new producer id, epoch 0. A timeout still bumps it once.
const EXHAUSTED: i16 = i16::MAX - 1;
const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
const OURS_START: i64 = 1_000;
const PROBE_OFFSET: i64 = 40;
const PRODUCER_FENCED: i16 = 90;
const INVALID_TXN_STATE: i16 = 48;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum State {
    /// Initialised (InitProducerId), no transaction begun since.
    Empty,
    Ongoing,
    PrepareCommit,
    CompleteCommit,
    PrepareAbort,
    CompleteAbort,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Empty => "Empty",
            State::Ongoing => "Ongoing",
            State::PrepareCommit => "PrepareCommit",
            State::CompleteCommit => "CompleteCommit",
            State::PrepareAbort => "PrepareAbort",
            State::CompleteAbort => "CompleteAbort",
        }
    }
    fn committed(self) -> bool {
        matches!(self, State::PrepareCommit | State::CompleteCommit)
    }
    fn aborted(self) -> bool {
        matches!(self, State::PrepareAbort | State::CompleteAbort)
    }
}

#[derive(Debug, Clone, Hash)]
struct Txn {
    ours: bool,
    /// Begun by the zombie (the crashed session, under ours' producer id and epoch).
    zombie: bool,
    start: i64,
    state: State,
    /// Committed by an EndTxn of the recovery.
    committed_by_us: bool,
    /// ... by one the network held, landing at this clock.
    committed_by_held: Option<i64>,
}

/// The coordinator's view of the id, and the faults.
struct World {
    rng: ChaCha8Rng,
    clock: i64,
    /// The id's producer id and epoch now.
    pid: i64,
    epoch: i16,
    /// Ours' producer epoch.
    ours_epoch: i16,
    /// The zombie's: ours', or one it bumped itself (an InitProducerId after an abortable error,
    /// as librdkafka does); the zombie is fenced once the id's epoch is past it.
    zombie_epoch: i16,
    txns: Vec<Txn>,
    /// EndTxn held by the network: applied after that many steps.
    held: Vec<(u32, i16)>,
    /// The clock of the last description the recovery got.
    last_described: i64,
    /// Paths this seed took (for the coverage check).
    paths: Paths,
    /// Another producer's transaction (another subtask's) open on our record's partition since
    /// before our record: it holds the partition's last stable offset below ours.
    other_open: bool,
    trace: Vec<String>,
}

/// Which paths one seed took; summed over seeds, each must be taken (no vacuous pass).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Paths {
    pub(crate) held_landed: bool,
    pub(crate) zombie_began: bool,
    pub(crate) committed_described: bool,
    pub(crate) committed_probed: bool,
    pub(crate) lost: bool,
    pub(crate) fatal: bool,
    /// The zombie bumped its own epoch.
    pub(crate) zombie_bumped: bool,
    /// A restore of the same checkpoint had recovered it before, and the sink's pool had
    /// initialised the id since.
    pub(crate) initialised_again: bool,
    /// ... and the coordinator had given the id a new producer id (epoch exhausted).
    pub(crate) new_producer_id: bool,
    /// Requests the recovery sent (descriptions, EndTxns, probe reads) in the seed.
    pub(crate) requests: u32,
}

/// The seeds that took each path.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Coverage {
    pub(crate) held_landed: u64,
    pub(crate) zombie_began: u64,
    pub(crate) committed_described: u64,
    pub(crate) committed_probed: u64,
    pub(crate) lost: u64,
    pub(crate) fatal: u64,
    pub(crate) zombie_bumped: u64,
    pub(crate) initialised_again: u64,
    pub(crate) new_producer_id: u64,
    /// Requests of all seeds.
    pub(crate) requests: u64,
}

impl Coverage {
    fn add(&mut self, p: Paths) {
        self.requests += u64::from(p.requests);
        self.held_landed += p.held_landed as u64;
        self.zombie_began += p.zombie_began as u64;
        self.committed_described += p.committed_described as u64;
        self.committed_probed += p.committed_probed as u64;
        self.lost += p.lost as u64;
        self.fatal += p.fatal as u64;
        self.zombie_bumped += p.zombie_bumped as u64;
        self.initialised_again += p.initialised_again as u64;
        self.new_producer_id += p.new_producer_id as u64;
    }
}

/// How a simulated recovery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Committed,
    Lost,
    Fatal,
    /// Retried the whole commit this many times without deciding (faults never stopped).
    Undecided,
}

impl World {
    fn new(seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let epoch = if rng.random_bool(0.2) { EXHAUSTED } else { EPOCH };
        World {
            rng,
            clock: OURS_START + 10,
            pid: PID,
            epoch,
            ours_epoch: epoch,
            zombie_epoch: epoch,
            txns: vec![Txn {
                ours: true,
                zombie: false,
                start: OURS_START,
                state: State::Ongoing,
                committed_by_us: false,
                committed_by_held: None,
            }],
            held: Vec::new(),
            other_open: false,
            last_described: 0,
            paths: Paths::default(),
            trace: Vec::new(),
        }
    }

    fn current(&mut self) -> &mut Txn {
        self.txns.last_mut().expect("the id has a transaction")
    }

    fn ours(&self) -> &Txn {
        &self.txns[0]
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    /// InitProducerId by a new producer of the id: the open transaction aborted, the epoch bumped
    /// — or, when it is exhausted, a new producer id with epoch 0.
    fn init_producer_id(&mut self) {
        let t = self.current();
        if matches!(t.state, State::Ongoing | State::PrepareAbort) {
            t.state = State::CompleteAbort;
        } else if t.state == State::PrepareCommit {
            t.state = State::CompleteCommit;
        }
        if self.epoch >= EXHAUSTED {
            self.pid += 1;
            self.epoch = 0;
        } else {
            self.epoch += 1;
        }
        self.trace
            .push(format!("InitProducerId: producer {}, epoch {}", self.pid, self.epoch));
    }

    /// Before this recovery: a restore of the same checkpoint recovered ours (committed or
    /// aborted by then), and the sink's pool initialised the id; its producer may have begun a
    /// transaction of its own.
    fn recovered_before(&mut self) {
        let ended = if self.chance(0.7) {
            State::CompleteCommit
        } else {
            State::CompleteAbort
        };
        self.current().state = ended;
        self.trace.push(format!("an earlier restore found ours {ended:?}"));
        self.init_producer_id();
        self.paths.initialised_again = true;
        self.paths.new_producer_id = self.pid != PID;
        // The id's state now: initialised, with or without a transaction of the later run's
        // producer (no transaction of ours, nor of the zombie, which is fenced).
        let begun = self.chance(0.5);
        let start = if begun { self.clock } else { -1 };
        self.txns.push(Txn {
            ours: false,
            zombie: false,
            start,
            state: if begun { State::Ongoing } else { State::Empty },
            committed_by_us: false,
            committed_by_held: None,
        });
        if begun {
            self.trace.push("the later run's producer begins a transaction".into());
        }
    }

    /// Applies EndTxn(commit) with ours' producer id and `epoch` now: the coordinator's answer.
    fn apply_end_txn(&mut self, epoch: i16, held: bool) -> i16 {
        if self.pid != PID {
            return INVALID_PRODUCER_ID_MAPPING;
        }
        if epoch != self.epoch {
            return PRODUCER_FENCED;
        }
        let clock = self.clock;
        let t = self.current();
        match t.state {
            State::Ongoing => {
                t.state = State::PrepareCommit;
                t.committed_by_us = true;
                t.committed_by_held = held.then_some(clock);
                code::NONE
            }
            State::PrepareCommit => code::CONCURRENT_TRANSACTIONS,
            State::CompleteCommit => code::NONE,
            State::Empty | State::PrepareAbort | State::CompleteAbort => INVALID_TXN_STATE,
        }
    }

    /// What happens between two requests of the recovery.
    fn step(&mut self) {
        self.clock += 100;
        // Held EndTxns land.
        let mut landed = Vec::new();
        self.held.retain_mut(|(after, epoch)| {
            if *after == 0 {
                landed.push(*epoch);
                false
            } else {
                *after -= 1;
                true
            }
        });
        for epoch in landed {
            let answer = self.apply_end_txn(epoch, true);
            self.paths.held_landed = true;
            self.trace.push(format!("held EndTxn lands: {answer}"));
        }
        if self.other_open && self.chance(0.3) {
            self.other_open = false;
            self.trace.push("the other transaction on the partition ends".into());
        }
        let state = self.current().state;
        match state {
            State::PrepareCommit if self.chance(0.5) => {
                self.current().state = State::CompleteCommit;
                self.trace.push("commit markers written".into());
            }
            State::PrepareAbort if self.chance(0.5) => {
                self.current().state = State::CompleteAbort;
                self.trace.push("abort markers written".into());
            }
            State::Ongoing if self.chance(0.08) => {
                // The zombie commits what it has open (ours, or one of its own).
                self.current().state = State::PrepareCommit;
                self.trace.push("the zombie commits the open transaction".into());
            }
            State::Ongoing if self.chance(0.03) => {
                // Timed out: aborted, the epoch bumped (an exhausted one too, once).
                self.current().state = State::PrepareAbort;
                self.epoch += 1;
                self.trace
                    .push("the coordinator aborts the open transaction (timeout)".into());
            }
            // A zombie fenced by the timeout's epoch bump begins nothing more.
            // The zombie, its transaction ended (by an EndTxn of ours behind its back, say: its
            // records then time out), bumps its own epoch and goes on.
            State::CompleteCommit | State::CompleteAbort
                if self.pid == PID
                    && self.epoch == self.zombie_epoch
                    && self.epoch < EXHAUSTED
                    && self.chance(0.06) =>
            {
                self.epoch += 1;
                self.zombie_epoch = self.epoch;
                self.txns.push(Txn {
                    ours: false,
                    zombie: true,
                    start: -1,
                    state: State::Empty,
                    committed_by_us: false,
                    committed_by_held: None,
                });
                self.paths.zombie_bumped = true;
                self.trace
                    .push(format!("the zombie bumps its own epoch to {}", self.epoch));
            }
            State::CompleteCommit | State::CompleteAbort | State::Empty
                if self.pid == PID && self.epoch == self.zombie_epoch && self.chance(0.25) =>
            {
                let start = self.clock;
                self.txns.push(Txn {
                    ours: false,
                    zombie: true,
                    start,
                    state: State::Ongoing,
                    committed_by_us: false,
                    committed_by_held: None,
                });
                self.paths.zombie_began = true;
                self.trace.push("the zombie begins a transaction of its own".into());
            }
            _ => {}
        }
    }

    fn describe(&mut self) -> Option<TxnDescription> {
        let epoch = self.epoch;
        let t = self.current().clone();
        self.last_described = self.clock;
        self.trace
            .push(format!("describe: {} started {}", t.state.name(), t.start));
        Some(TxnDescription {
            state: t.state.name().into(),
            producer_id: self.pid,
            producer_epoch: epoch,
            timeout_ms: 60_000,
            start_time_ms: t.start,
            partitions: 1,
            topic_partitions: vec!["out-0".into()],
        })
    }

    /// Sends EndTxn(commit) with the committable's epoch, faults included.
    fn end_txn(&mut self, epoch: i16, faults: bool) -> EndTxnAnswer {
        let roll: f64 = if faults { self.rng.random() } else { 1.0 };
        let answer = if roll < 0.10 {
            self.trace.push("EndTxn: coordinator moved, not applied".into());
            EndTxnAnswer::Code(code::NOT_COORDINATOR)
        } else if roll < 0.20 {
            let applied = self.apply_end_txn(epoch, false);
            self.trace
                .push(format!("EndTxn applied ({applied}), answered NOT_COORDINATOR"));
            EndTxnAnswer::Code(code::NOT_COORDINATOR)
        } else if roll < 0.28 {
            let applied = self.apply_end_txn(epoch, false);
            self.trace.push(format!("EndTxn applied ({applied}), answer lost"));
            EndTxnAnswer::NoAnswer("timed out".into())
        } else if roll < 0.34 {
            let after = self.rng.random_range(0..4);
            self.held.push((after, epoch));
            self.trace.push(format!("EndTxn held for {after} steps, answer lost"));
            EndTxnAnswer::NoAnswer("timed out".into())
        } else {
            let applied = self.apply_end_txn(epoch, false);
            self.trace.push(format!("EndTxn answered {applied}"));
            EndTxnAnswer::Code(applied)
        };
        answer
    }

    /// What a reader at `committed` isolation learns polling our record's partition, fed to the
    /// real reader until it decides (`None`: it could not within its polls). Between a poll and
    /// the watermark query after it the world moves on (another transaction may end).
    fn probe(&mut self, committed: bool, probe: &Probe) -> Option<Seen> {
        let mut reader = ProbeReader::new(probe);
        for _ in 0..8 {
            let ours = self.ours().state;
            let pinned =
                committed && (self.other_open || !matches!(ours, State::CompleteCommit | State::CompleteAbort));
            let event = if !committed || (!pinned && ours == State::CompleteCommit) {
                ReadEvent::Record(PROBE_OFFSET)
            } else if !pinned {
                // Aborted: the reader's position goes past our record, which it skips.
                ReadEvent::Position(Some(PROBE_OFFSET + 2))
            } else {
                ReadEvent::EndOfPartition
            };
            self.trace
                .push(format!("probe (read_committed {committed}): {event:?}"));
            if let Some(seen) = reader.on(event) {
                return Some(seen);
            }
            self.step();
            // A watermark query: the stable offset as it is now.
            let ours = self.ours().state;
            let pinned =
                committed && (self.other_open || !matches!(ours, State::CompleteCommit | State::CompleteAbort));
            let end = if pinned { PROBE_OFFSET } else { PROBE_OFFSET + 5 };
            self.trace.push(format!("probe watermarks: end {end}"));
            if let Some(seen) = reader.on(ReadEvent::Watermarks { low: 0, end }) {
                return Some(seen);
            }
        }
        None
    }
}

#[cfg(test)]
#[path = "sim_tests.rs"]
mod tests;
