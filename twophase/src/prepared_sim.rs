//! Deterministic simulation of settling a prepared transaction's commit: the real driver
//! ([`settle`]) and its steps ([`PreparedCommit`](crate::prepared::PreparedCommit)), and the real classification of the servers' answers ([`mysql_answer`],
//! [`postgres_answer`]) — what the MySQL/MariaDB and PostgreSQL sinks run — against a model of
//! one prepared transaction on each kind of server, with faults chosen by a seeded generator
//! (ChaCha8: the same seed gives the same trace anywhere).
//!
//! The model: the transaction is prepared; a commit may be applied and answered, applied with its
//! answer lost, held by the server (still running, answered by nothing; it ends some steps later),
//! or not applied (a transient error). Another session — a commit sent before a crash, or a second
//! copy of the job — may be committing it meanwhile (busy: MariaDB answers XAER_RMFAIL or
//! XAER_NOTA, PostgreSQL 55000). MariaDB may answer XAER_NOTA while its preparing session detaches.
//! A timeout, an operator or another copy's cleanup may roll it back while it is prepared.
//! Listing and reading the progress record may fail. A try ends with a decision or "try again";
//! the driver tries again (its retries, then restarts) until one decides.
//!
//! The checks, from the model's truth: "committed" only when the model committed it; "lost"
//! (DATA LOST) only when the model rolled it back; a stop (fatal) never (the model refuses nothing);
//! once faults stop, a decision within a bounded number of tries.

use std::cell::Cell;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::prepared::{mysql_answer, postgres_answer, settle, CommitAnswer, Next, Settle};
use std::future::Future;

/// Known bugs, put back on purpose (one at a time, per thread): the simulation must catch each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// None: the code as it is.
    None,
    /// The progress record read before the listing (the MySQL sink's last check before this
    /// simulation): a commit still running ends between the two reads, and reads as rolled back.
    RecordBeforeList,
    /// "Not found" taken as committed.
    NotFoundIsCommitted,
    /// PostgreSQL's "busy" (55000) taken as a refusal: the job stops while a commit runs.
    BusyRefused,
    /// The driver ([`settle`]) takes a listing that failed for "not listed": the record is read
    /// while the transaction may still be prepared or committing, and its absence reads as lost.
    FailedListingIsNotListed,
}

thread_local! {
    static MUTANT: Cell<Mutant> = const { Cell::new(Mutant::None) };
}

/// The mutant active on this thread.
pub(crate) fn mutant() -> Mutant {
    MUTANT.with(Cell::get)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Dialect {
    MariaDb,
    Postgres,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum State {
    Prepared,
    /// A commit of it is running in another session (or one whose answer was lost), ending at
    /// that step.
    Committing(u64),
    Committed,
    RolledBack,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Paths {
    pub(crate) committed_answered: u64,
    pub(crate) committed_recorded: u64,
    pub(crate) lost: u64,
    pub(crate) busy: u64,
    pub(crate) landed: u64,
    pub(crate) retried: u64,
    /// Model steps (statements, pauses, backoffs) the seed covered.
    pub(crate) steps: u64,
}

struct World {
    rng: ChaCha8Rng,
    dialect: Dialect,
    step: u64,
    state: State,
    faults_until: u64,
    fault: f64,
    trace: DefaultHasher,
    lines: Vec<String>,
    paths: Paths,
    /// The last try's decision came from the progress record.
    by_record: bool,
}

impl World {
    fn faulty(&self) -> bool {
        self.step <= self.faults_until
    }

    fn chance(&mut self, p: f64) -> bool {
        self.faulty() && self.rng.random_bool(p)
    }

    fn note(&mut self, line: String) {
        line.hash(&mut self.trace);
        self.lines.push(format!("{:>4} {line}", self.step));
    }

    /// One step: a running commit may end; a prepared transaction may be rolled back by
    /// someone else, or begin to be committed by another session.
    fn tick(&mut self) {
        self.step += 1;
        match self.state {
            State::Committing(at) if at <= self.step => {
                self.state = State::Committed;
                self.paths.landed += 1;
                self.note("the running commit ended: committed".into());
            }
            State::Prepared => {
                if self.chance(self.fault * 0.1) {
                    self.state = State::RolledBack;
                    self.note("rolled back by someone else (a timeout, an operator, another copy)".into());
                } else if self.chance(self.fault * 0.1) {
                    self.state = State::Committing(self.step + self.rng.random_range(1..40));
                    self.note("another session began committing it".into());
                }
            }
            _ => {}
        }
    }

    /// The server's answer to a commit: its error code (`Err(None)`: no answer).
    fn commit(&mut self) -> Result<(), Option<&'static str>> {
        self.tick();
        let (not_found, busy, transient) = match self.dialect {
            Dialect::MariaDb => ("1397", "1399", "1205"),
            Dialect::Postgres => ("42704", "55000", "40001"),
        };
        let answer = match self.state {
            State::Committed | State::RolledBack => Err(Some(not_found)),
            State::Committing(_) => {
                self.paths.busy += 1;
                match self.dialect {
                    // The branch is attached to the committing session: gone from the
                    // server's detached branches (XAER_NOTA), still listed by XA RECOVER.
                    Dialect::MariaDb if self.rng.random_bool(0.9) => Err(Some(not_found)),
                    _ => Err(Some(busy)),
                }
            }
            State::Prepared => {
                let r: f64 = if self.faulty() { self.rng.random() } else { 1.0 };
                let f = self.fault;
                if r < f * 0.25 {
                    Err(Some(transient))
                } else if r < f * 0.5 {
                    self.state = State::Committed;
                    Err(None) // applied, the answer lost
                } else if r < f * 0.75 {
                    self.state = State::Committing(self.step + self.rng.random_range(1..40));
                    Err(None) // still running on the server; the client gave up
                } else if r < f && self.dialect == Dialect::MariaDb {
                    Err(Some(not_found)) // the preparing session still detaching
                } else {
                    self.state = State::Committed;
                    Ok(())
                }
            }
        };
        self.note(format!("commit: {answer:?}"));
        answer
    }

    /// Whether the listing shows it (`None`: the listing failed).
    fn list(&mut self) -> Option<bool> {
        self.tick();
        if self.chance(self.fault * 0.3) {
            self.note("list: failed".into());
            return None;
        }
        let listed = matches!(self.state, State::Prepared | State::Committing(_));
        self.note(format!("list: {listed}"));
        Some(listed)
    }

    /// Whether its progress record is visible (`None`: the read failed).
    fn record(&mut self) -> Option<bool> {
        self.tick();
        if self.chance(self.fault * 0.3) {
            self.note("record: failed".into());
            return None;
        }
        let present = self.state == State::Committed;
        self.note(format!("record: {present}"));
        Some(present)
    }
}

/// The world as the sinks' driver ([`settle`]) sees it: each step one tick of the model.
impl Settle for World {
    type Error = &'static str;
    fn commit(&mut self) -> impl std::future::Future<Output = CommitAnswer> + Send {
        let answer = World::commit(self);
        std::future::ready(classify(self.dialect, answer))
    }
    fn listed(&mut self) -> impl std::future::Future<Output = Result<bool, &'static str>> + Send {
        std::future::ready(self.list().ok_or("listing failed"))
    }
    fn recorded(&mut self) -> impl std::future::Future<Output = Result<bool, &'static str>> + Send {
        let present = self.record();
        if let Some(present) = present {
            self.by_record = present;
        }
        std::future::ready(present.ok_or("reading the record failed"))
    }
    fn pause(&mut self) -> impl std::future::Future<Output = ()> + Send {
        self.tick();
        std::future::ready(())
    }
}

/// One try, as a sink runs it (the sinks' own driver, [`settle`]): the decision, or `Retry`.
fn one_try(w: &mut World) -> Next {
    w.by_record = false;
    let max_checks = match w.dialect {
        Dialect::MariaDb => 10,
        Dialect::Postgres => 1,
    };
    // Every step of the model is ready at once: one poll runs the whole try.
    let mut run = std::pin::pin!(settle(w, max_checks));
    match run
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(Ok(decided)) => decided,
        std::task::Poll::Ready(Err(why)) => Next::Retry(why.into()),
        std::task::Poll::Pending => unreachable!("the model's steps never wait"),
    }
}

fn classify(dialect: Dialect, answer: Result<(), Option<&'static str>>) -> CommitAnswer {
    match (answer, dialect) {
        (Ok(()), _) => CommitAnswer::Committed,
        (Err(code), Dialect::MariaDb) => mysql_answer(code.and_then(|c| c.parse().ok()), format!("{code:?}")),
        (Err(code), Dialect::Postgres) => postgres_answer(code, format!("{code:?}")),
    }
}

/// Runs seed `seed`: the trace's hash and the paths taken, or the violation with the trace.
pub(crate) fn run_paths(seed: u64) -> Result<(u64, Paths), String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dialect = if rng.random_bool(0.5) {
        Dialect::MariaDb
    } else {
        Dialect::Postgres
    };
    let mut w = World {
        dialect,
        step: 0,
        state: State::Prepared,
        faults_until: rng.random_range(0..60),
        fault: [0.2, 0.5, 0.9][rng.random_range(0..3)],
        rng,
        trace: DefaultHasher::new(),
        lines: Vec::new(),
        paths: Paths::default(),
        by_record: false,
    };
    let fail = |w: &World, why: String| {
        format!(
            "seed {seed} ({:?}): {why}\n(replay: scripts/simulate --databases --first {seed} --seeds 1)\n{}",
            w.dialect,
            w.lines.join("\n")
        )
    };
    for tries in 1..=200 {
        let decided = one_try(&mut w);
        w.note(format!("try {tries}: {decided:?}"));
        match decided {
            Next::Committed => {
                if w.state != State::Committed {
                    return Err(fail(
                        &w,
                        format!("reported committed, but the model's transaction is {:?}", w.state),
                    ));
                }
                if w.by_record {
                    w.paths.committed_recorded += 1;
                } else {
                    w.paths.committed_answered += 1;
                }
                return Ok((
                    w.trace.finish(),
                    Paths {
                        steps: w.step,
                        ..w.paths
                    },
                ));
            }
            Next::Lost(why) => {
                if w.state != State::RolledBack {
                    return Err(fail(
                        &w,
                        format!(
                            "reported lost (DATA LOST: {why}), but the model's transaction is {:?}",
                            w.state
                        ),
                    ));
                }
                w.paths.lost += 1;
                return Ok((
                    w.trace.finish(),
                    Paths {
                        steps: w.step,
                        ..w.paths
                    },
                ));
            }
            Next::Fatal(why) => {
                return Err(fail(
                    &w,
                    format!("stopped (fatal: {why}) though the server refused nothing"),
                ))
            }
            Next::Retry(_) => {
                w.paths.retried += 1;
                if !w.faulty() && w.step > w.faults_until + 400 {
                    return Err(fail(&w, "no decision long after faults stopped".into()));
                }
                for _ in 0..w.rng.random_range(1..4) {
                    w.tick(); // the driver's backoff
                }
            }
            Next::CommitAgain | Next::List | Next::ReadRecord => unreachable!("a try ends decided or to be retried"),
        }
    }
    Err(fail(&w, "no decision in 200 tries".into()))
}

/// The trace hash of `seed`, or its violation.
pub(crate) fn run(seed: u64) -> Result<u64, String> {
    run_paths(seed).map(|(h, _)| h)
}

/// Runs `seeds` seeds from `first` with `m` active on this thread: the first violation and the
/// seeds that took each path.
pub(crate) fn run_seeds(first: u64, seeds: u64, m: Mutant) -> (Option<String>, Paths) {
    MUTANT.with(|c| c.set(m));
    let mut seen = Paths::default();
    let found = (first..first + seeds).find_map(|s| match run_paths(s) {
        Err(v) => Some(v),
        Ok((_, p)) => {
            for (sum, n) in [
                (&mut seen.committed_answered, p.committed_answered),
                (&mut seen.committed_recorded, p.committed_recorded),
                (&mut seen.lost, p.lost),
                (&mut seen.busy, p.busy),
                (&mut seen.landed, p.landed),
                (&mut seen.retried, p.retried),
            ] {
                *sum += u64::from(n > 0);
            }
            seen.steps += p.steps;
            None
        }
    });
    MUTANT.with(|c| c.set(Mutant::None));
    (found, seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget() -> (u64, u64) {
        let n = std::env::var("EXACTLY_SIM_SEEDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(50_000);
        let first = std::env::var("EXACTLY_SIM_FIRST")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        (first, n)
    }

    #[test]
    fn a_prepared_commit_is_settled_truly_for_every_seed() {
        let (first, n) = budget();
        let started = std::time::Instant::now();
        let (found, seen) = run_seeds(first, n, Mutant::None);
        if let Some(v) = found {
            panic!("{v}");
        }
        eprintln!(
            "{n} seeds in {:.2} s ({:.0} seeds/s), {:.1} statements per seed; seeds per path: {seen:?}",
            started.elapsed().as_secs_f64(),
            n as f64 / started.elapsed().as_secs_f64(),
            seen.steps as f64 / n as f64
        );
        if n >= 50_000 {
            for (path, seeds) in [
                ("committed, answered", seen.committed_answered),
                ("committed, seen by its record", seen.committed_recorded),
                ("lost (rolled back)", seen.lost),
                ("busy in another session", seen.busy),
                ("a running commit ended", seen.landed),
                ("tried again", seen.retried),
            ] {
                assert!(seeds >= 10, "only {seeds} seeds took the path {path:?}: {seen:?}");
            }
        }
    }

    #[test]
    fn a_seed_replays_the_same_trace() {
        for seed in [5, 500, 5_000] {
            assert_eq!(run(seed), run(seed), "seed {seed}");
        }
        assert_ne!(run(5), run(6));
    }

    #[test]
    fn each_known_bug_put_back_is_caught_within_the_budget() {
        for (m, by) in [
            (Mutant::RecordBeforeList, "reported lost"),
            (Mutant::NotFoundIsCommitted, "reported committed"),
            (Mutant::BusyRefused, "stopped (fatal"),
            (Mutant::FailedListingIsNotListed, "reported lost"),
        ] {
            let (found, _) = run_seeds(0, 100_000, m);
            let found = found.unwrap_or_else(|| panic!("{m:?} was not caught in 100 000 seeds"));
            let first = found.lines().next().unwrap_or_default();
            assert!(first.contains(by), "{m:?} caught by another check: {first}");
            eprintln!("{m:?} caught: {first}");
        }
    }
}
