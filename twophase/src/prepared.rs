//! Settling the commit of a prepared transaction (an XA branch of MySQL or MariaDB, a prepared
//! transaction of PostgreSQL) whose earlier commit may have been sent: the decisions, without the
//! I/O (sans-IO), so the database sinks and a simulation (`prepared_sim.rs`) drive the same code.
//!
//! A commit the server does not know (XAER_NOTA, 42704) proves nothing by itself: the transaction
//! may have been committed before (an answer lost, a crash), rolled back, or — MariaDB — its
//! preparing session may still be detaching from it. So the prepared transactions are listed
//! first: still listed, it is alive, and the commit is tried again. Only once it is no longer
//! listed is the progress record read, which is then decisive — the transaction has ended, and it
//! committed exactly when its record is visible. (Read in the other order, a commit still running
//! on the server, sent by a session whose answer was lost, could end between the two reads: no
//! record yet, no longer listed, and a committed transaction reported as rolled back.)

/// What the server answered to a commit of the prepared transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitAnswer {
    /// Committed.
    Committed,
    /// It does not know the transaction (XAER_NOTA, 42704).
    NotFound,
    /// An answer that tells nothing of it: none (a lost connection), a transient error, or the
    /// transaction busy in another session (a commit of it still running).
    Unclear(String),
    /// Refused for a reason that waiting will not change.
    Refused(String),
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Send the commit again, after a pause (the server may still be detaching the transaction).
    CommitAgain,
    /// List the prepared transactions, and answer with [`PreparedCommit::listed`].
    List,
    /// Read the transaction's progress record, and answer with [`PreparedCommit::recorded`].
    ReadRecord,
    /// Committed (now, or earlier).
    Committed,
    /// Rolled back: its records are lost.
    Lost(String),
    /// Not settled now: the commit is tried again later (the driver's retries, then a restart).
    Retry(String),
    /// A refusal: the job stops.
    Fatal(String),
}

/// The steps of one try of committing a prepared transaction. Begin by sending the commit and
/// passing its answer to [`Self::answered`].
#[derive(Debug, Clone)]
pub struct PreparedCommit {
    /// Commits answered "not found" so far.
    checks: u32,
    /// How many before "not listed, no record" is believed.
    max_checks: u32,
    /// The step whose answer is awaited.
    awaiting: Step,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Commit,
    List,
    Record,
    Done,
}

impl PreparedCommit {
    /// A try that believes "rolled back" after `max_checks` commits answered "not found" (at least
    /// one), each followed by a listing without it and no record.
    pub fn new(max_checks: u32) -> Self {
        PreparedCommit {
            checks: 0,
            max_checks: max_checks.max(1),
            awaiting: Step::Commit,
        }
    }

    fn expect(&mut self, step: Step, next: Step) {
        assert_eq!(self.awaiting, step, "the answer to a step that was not asked for");
        self.awaiting = next;
    }

    /// The server's answer to the commit.
    pub fn answered(&mut self, answer: CommitAnswer) -> Next {
        self.expect(Step::Commit, Step::Done);
        match answer {
            CommitAnswer::Committed => Next::Committed,
            CommitAnswer::NotFound => {
                self.checks += 1;
                #[cfg(test)]
                if crate::prepared_sim::mutant() == crate::prepared_sim::Mutant::NotFoundIsCommitted {
                    return Next::Committed;
                }
                #[cfg(test)]
                if crate::prepared_sim::mutant() == crate::prepared_sim::Mutant::RecordBeforeList {
                    self.awaiting = Step::Record;
                    return Next::ReadRecord;
                }
                self.awaiting = Step::List;
                Next::List
            }
            CommitAnswer::Unclear(why) => Next::Retry(why),
            CommitAnswer::Refused(why) => Next::Fatal(why),
        }
    }

    /// Whether the listing of prepared transactions shows it.
    pub fn listed(&mut self, prepared: bool) -> Next {
        #[cfg(test)]
        if crate::prepared_sim::mutant() == crate::prepared_sim::Mutant::RecordBeforeList {
            // The old order: the record was read first, and found absent.
            self.expect(Step::List, Step::Done);
            return match (prepared, self.checks < self.max_checks) {
                (true, true) | (false, true) => {
                    self.awaiting = Step::Commit;
                    Next::CommitAgain
                }
                (true, false) => Next::Retry("still prepared".into()),
                (false, false) => Next::Lost("not listed, no record".into()),
            };
        }
        self.expect(Step::List, Step::Done);
        if !prepared {
            self.awaiting = Step::Record;
            return Next::ReadRecord;
        }
        if self.checks < self.max_checks {
            self.awaiting = Step::Commit;
            return Next::CommitAgain;
        }
        Next::Retry(format!(
            "it is prepared, but the server answered {} commits of it that it does not know it",
            self.checks
        ))
    }

    /// Whether its progress record is visible (read after a listing without it).
    pub fn recorded(&mut self, present: bool) -> Next {
        #[cfg(test)]
        if crate::prepared_sim::mutant() == crate::prepared_sim::Mutant::RecordBeforeList {
            self.expect(Step::Record, Step::Done);
            if present {
                return Next::Committed;
            }
            self.awaiting = Step::List;
            return Next::List;
        }
        self.expect(Step::Record, Step::Done);
        if present {
            return Next::Committed; // committed earlier (before a crash, or its answer lost)
        }
        if self.checks < self.max_checks {
            self.awaiting = Step::Commit;
            return Next::CommitAgain;
        }
        Next::Lost(format!(
            "the server does not know it, does not list it as prepared, and its progress record is absent ({} checks): it was rolled back",
            self.checks
        ))
    }
}

/// What settling a commit asks of the database, one step per call: the sink's side of
/// [`settle`].
pub trait Settle: Send {
    /// A failed listing or reading of the record: the try ends undecided, and the sink returns it
    /// as a retriable error (the commit is tried again later), never as an answer.
    type Error: Send;
    /// Sends the commit of the prepared transaction; what the server answered.
    fn commit(&mut self) -> impl std::future::Future<Output = CommitAnswer> + Send;
    /// Whether the server lists the transaction as prepared.
    fn listed(&mut self) -> impl std::future::Future<Output = Result<bool, Self::Error>> + Send;
    /// Whether the transaction's progress record is visible (committed data only).
    fn recorded(&mut self) -> impl std::future::Future<Output = Result<bool, Self::Error>> + Send;
    /// Waits before the commit is sent again (the server may still be detaching the transaction).
    fn pause(&mut self) -> impl std::future::Future<Output = ()> + Send;
}

/// One try of committing a prepared transaction, driven through `db` with [`PreparedCommit`]'s
/// decisions (believing "rolled back" after `max_checks` commits the server did not know):
/// [`Next::Committed`], [`Next::Lost`], [`Next::Retry`] or [`Next::Fatal`]; or the error of a
/// listing or a record that could not be read.
pub async fn settle<S: Settle>(db: &mut S, max_checks: u32) -> Result<Next, S::Error> {
    let mut steps = PreparedCommit::new(max_checks);
    let mut next = steps.answered(db.commit().await);
    loop {
        next = match next {
            Next::CommitAgain => {
                db.pause().await;
                steps.answered(db.commit().await)
            }
            Next::List => match db.listed().await {
                Ok(listed) => steps.listed(listed),
                #[cfg(test)]
                Err(_) if crate::prepared_sim::mutant() == crate::prepared_sim::Mutant::FailedListingIsNotListed => {
                    steps.listed(false)
                }
                Err(e) => return Err(e),
            },
            Next::ReadRecord => steps.recorded(db.recorded().await?),
            decided => return Ok(decided),
        };
    }
}

/// The commit's result for the driver, from [`settle`]'s decision about `what` ("XA branch … of
/// checkpoint 42"): committed, retried later, fatal, or lost (DATA LOST).
pub fn commit_result(decided: Next, what: String) -> Result<(), crate::CommitError> {
    use crate::CommitError;
    match decided {
        Next::Committed => Ok(()),
        Next::Retry(why) => Err(CommitError::Retriable(format!("{what}: {why}").into())),
        Next::Fatal(why) => Err(CommitError::Fatal(format!("{what}: {why}").into())),
        Next::Lost(why) => Err(CommitError::Lost {
            what,
            source: why.into(),
        }),
        // Steps, not decisions (settle never ends on one): undecided, tried again later.
        step @ (Next::CommitAgain | Next::List | Next::ReadRecord) => Err(CommitError::Retriable(
            format!("{what}: the try ended undecided at {step:?}").into(),
        )),
    }
}

/// The answers of MySQL and MariaDB to `XA COMMIT`: `code` is the server's error number (`None`:
/// no answer, a lost connection), `error` the error as text.
pub fn mysql_answer(code: Option<u16>, error: String) -> CommitAnswer {
    const XAER_NOTA: u16 = 1397;
    match code {
        Some(XAER_NOTA) => CommitAnswer::NotFound,
        // Lock wait timeout, deadlock, a server read-only during a failover, XAER_RMFAIL (the
        // branch busy), too many connections, a killed or interrupted query, a server shutting
        // down: nothing about the branch.
        None | Some(1205 | 1213 | 1290 | 1836 | 1399 | 1040 | 1053 | 1317 | 1927 | 3098) => {
            CommitAnswer::Unclear(error)
        }
        Some(_) => CommitAnswer::Refused(error),
    }
}

/// The answers of PostgreSQL to `COMMIT PREPARED`: `sqlstate` is the error's code (`None`: not a
/// database error — no answer, a lost connection), `error` the error as text.
pub fn postgres_answer(sqlstate: Option<&str>, error: String) -> CommitAnswer {
    let Some(state) = sqlstate else {
        return CommitAnswer::Unclear(error);
    };
    // A prepared transaction another session is committing (a commit sent before, whose answer
    // was lost, still waiting for a synchronous standby or a slow disk) is busy until that commit
    // ends: "prepared transaction with identifier … is busy", 55000 (object not in prerequisite
    // state; the other cause on COMMIT PREPARED, prepared transactions disabled, is refused at
    // start). It stays listed in pg_prepared_xacts meanwhile.
    #[cfg(test)]
    if state == "55000" && crate::prepared_sim::mutant() == crate::prepared_sim::Mutant::BusyRefused {
        return CommitAnswer::Refused(error);
    }
    match state {
        "42704" => CommitAnswer::NotFound,
        // Serialization failure or deadlock (40), a resource shortage (53), an operator
        // intervention such as a shutdown (57), a system error (58), a lock not available, an
        // object in use, the transaction busy: nothing about the transaction.
        s if s.starts_with("40") || s.starts_with("53") || s.starts_with("57") || s.starts_with("58") => {
            CommitAnswer::Unclear(error)
        }
        "55P03" | "55006" | "55000" => CommitAnswer::Unclear(error),
        _ => CommitAnswer::Refused(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver hears what the decision was: committed is success, a retry retriable, a refusal
    /// fatal, a rollback DATA LOST naming the transaction; a step is never taken for a decision.
    #[test]
    fn each_decision_is_the_drivers_result_of_its_kind() {
        use crate::CommitError;
        let what = || "XA branch 0:7 of checkpoint 7".to_string();
        assert!(commit_result(Next::Committed, what()).is_ok());
        match commit_result(Next::Retry("busy".into()), what()) {
            Err(CommitError::Retriable(e)) => assert_eq!(e.to_string(), "XA branch 0:7 of checkpoint 7: busy"),
            other => panic!("{other:?}"),
        }
        match commit_result(Next::Fatal("refused".into()), what()) {
            Err(CommitError::Fatal(e)) => assert_eq!(e.to_string(), "XA branch 0:7 of checkpoint 7: refused"),
            other => panic!("{other:?}"),
        }
        match commit_result(Next::Lost("rolled back".into()), what()) {
            Err(CommitError::Lost { what, source }) => {
                assert_eq!(what, "XA branch 0:7 of checkpoint 7");
                assert_eq!(source.to_string(), "rolled back");
            }
            other => panic!("{other:?}"),
        }
        for step in [Next::CommitAgain, Next::List, Next::ReadRecord] {
            assert!(
                matches!(commit_result(step, what()), Err(CommitError::Retriable(_))),
                "a step is undecided"
            );
        }
    }

    #[test]
    fn not_found_is_settled_by_the_listing_then_the_record() {
        let mut s = PreparedCommit::new(1);
        assert_eq!(s.answered(CommitAnswer::NotFound), Next::List);
        assert_eq!(s.listed(false), Next::ReadRecord);
        assert_eq!(s.recorded(true), Next::Committed);

        let mut s = PreparedCommit::new(1);
        s.answered(CommitAnswer::NotFound);
        assert!(matches!(s.listed(true), Next::Retry(_)), "still prepared: alive");

        let mut s = PreparedCommit::new(2);
        s.answered(CommitAnswer::NotFound);
        s.listed(false);
        assert_eq!(s.recorded(false), Next::CommitAgain, "checked once more");
        s.answered(CommitAnswer::NotFound);
        s.listed(false);
        assert!(matches!(s.recorded(false), Next::Lost(_)));
    }

    #[test]
    fn the_servers_answers_are_classified() {
        assert_eq!(mysql_answer(Some(1397), String::new()), CommitAnswer::NotFound);
        assert!(matches!(mysql_answer(None, String::new()), CommitAnswer::Unclear(_)));
        assert!(matches!(
            mysql_answer(Some(1399), String::new()),
            CommitAnswer::Unclear(_)
        ));
        assert!(matches!(
            mysql_answer(Some(1064), String::new()),
            CommitAnswer::Refused(_)
        ));
        assert_eq!(postgres_answer(Some("42704"), String::new()), CommitAnswer::NotFound);
        for busy_or_transient in ["55000", "55006", "55P03", "40001", "57P01"] {
            assert!(matches!(
                postgres_answer(Some(busy_or_transient), String::new()),
                CommitAnswer::Unclear(_)
            ));
        }
        assert!(matches!(postgres_answer(None, String::new()), CommitAnswer::Unclear(_)));
        assert!(matches!(
            postgres_answer(Some("42501"), String::new()),
            CommitAnswer::Refused(_)
        ));
    }

    #[test]
    fn unclear_answers_are_tried_again_and_refusals_stop() {
        let mut s = PreparedCommit::new(3);
        assert_eq!(
            s.answered(CommitAnswer::Unclear("busy".into())),
            Next::Retry("busy".into())
        );
        let mut s = PreparedCommit::new(3);
        assert_eq!(s.answered(CommitAnswer::Refused("no".into())), Next::Fatal("no".into()));
    }
}
