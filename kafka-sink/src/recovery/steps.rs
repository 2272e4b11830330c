//! The decisions of the commit after restart: a state machine fed with the coordinator's answers
//! (DescribeTransactions, EndTxn) that says what to do next, so tests drive every branch without
//! a broker. [`super::commit_recovered`] sends the requests and feeds the answers.
//!
//! With transaction version 1 an EndTxn names a producer id and epoch, not a transaction: it ends
//! whatever transaction that producer has open *when the coordinator applies it*, and a zombie
//! of the crashed process may by then have opened a later one under the same id, producer id and
//! epoch. So:
//! - an EndTxn is sent only right after a description that shows *our* transaction (same
//!   producer id, epoch and start time: [`KafkaCommittable::is_same_transaction`]) still Ongoing;
//! - after an answer of success the id is described again: it must still show ours (committing
//!   or committed); anything else may mean the EndTxn committed another producer's transaction,
//!   a fatal error, never a success;
//! - an answer that the coordinator moved or is loading (NOT_COORDINATOR,
//!   COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS), another retriable one (a timeout)
//!   or none at all can follow a transaction-log append that was written: the EndTxn is in doubt,
//!   and the id is described again before anything else — committing or committed: done; still
//!   ours and Ongoing: sent again; a later transaction of our producer id (a zombie's, under our
//!   epoch or one a timeout bumped since): a stop, as that EndTxn may have committed it; otherwise
//!   the probe record tells how ours ended;
//! - an EndTxn the coordinator refuses (invalid state, fenced) leaves the probe to decide.

use crate::committable::KafkaCommittable;
use crate::protocol::{code, TxnDescription};

/// The most EndTxn one commit sends; then it hands back to the two-phase driver's retry, which
/// starts again with a description after its back-off.
pub(crate) const MAX_END_TXNS: u32 = 5;

/// What the commit after restart does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Describe the id (DescribeTransactions); the answer goes to [`CommitSteps::described`].
    Describe,
    /// Send EndTxn(commit) with the committable's producer id and epoch; the answer goes to
    /// [`CommitSteps::end_txn_answered`].
    EndTxn {
        /// An earlier EndTxn of this commit was in doubt: pause before this one.
        again: bool,
    },
    /// Committed, or its commit decided and written in the transaction log (PrepareCommit: the
    /// coordinator writes the markers, also after a failover).
    Done(Done),
    /// Our transaction is no longer the id's: its probe record tells how it ended.
    Probe,
    /// The coordinator aborted our transaction: the records of its checkpoint are lost (why).
    Lost(String),
    /// An EndTxn answered success, but the id no longer shows our transaction: it may have
    /// committed a zombie's instead (what the coordinator shows now, and what to do).
    Fatal(String),
    /// Nothing decided within this commit (why): the driver's retry starts again with a
    /// description.
    Retry(String),
}

/// How a commit after restart ended well (for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Done {
    /// Committing or committed before this commit sent anything (the crashed process's commit
    /// went through, or an earlier attempt's).
    Already,
    /// Our EndTxn answered success and the id still shows our transaction.
    Committed,
    /// Our EndTxn's answer was unclear (coordinator moving, timed out, lost), and the id shows
    /// our transaction committing or committed: that EndTxn was applied.
    AfterUnclearAnswer,
}

/// What an EndTxn came back with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EndTxnAnswer {
    /// The coordinator answered this error code (0: success).
    Code(i16),
    /// No answer (the request may have left: a timeout, a connection lost, no coordinator found
    /// within the failover); what happened.
    NoAnswer(String),
}

/// What the EndTxn sent last did, as far as the next description is concerned. Kept across the
/// tries of one commit (the two-phase driver's retries), so that a try after an EndTxn in doubt
/// still knows it ([`CommitSteps::resume`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Sent {
    /// None sent yet.
    #[default]
    Nothing,
    /// Answered success: the next description must show our transaction.
    Succeeded,
    /// Answered unclearly (the answer): it may or may not have been applied.
    InDoubt(String),
}

/// The commit after restart of one restored committable, fed with the coordinator's answers.
/// Starts with [`Next::Describe`].
#[derive(Debug)]
pub(crate) struct CommitSteps<'a> {
    /// The transaction to commit.
    c: &'a KafkaCommittable,
    /// What the last EndTxn did.
    sent: Sent,
    /// EndTxn sent so far.
    end_txns: u32,
    /// The id's transaction as last described, for messages.
    now: String,
}

impl<'a> CommitSteps<'a> {
    /// The steps of committing `c`; the first is [`Next::Describe`].
    pub(crate) fn new(c: &'a KafkaCommittable) -> Self {
        CommitSteps {
            c,
            sent: Sent::Nothing,
            end_txns: 0,
            now: "not described yet".into(),
        }
    }

    /// The steps of committing `c` after an earlier try of the same commit ended with `sent`
    /// (e.g. an EndTxn in doubt, then a description that failed).
    pub(crate) fn resume(c: &'a KafkaCommittable, sent: Sent) -> Self {
        let mut s = Self::new(c);
        #[cfg(test)]
        if super::sim::mutant() == super::sim::Mutant::ForgetAcrossTries {
            return s;
        }
        s.sent = sent;
        s
    }

    /// What this commit's EndTxns did so far (for the next try).
    pub(crate) fn sent(&self) -> &Sent {
        &self.sent
    }

    /// The id's transaction as last described ("state …, producer …, epoch …", or that the
    /// coordinator no longer knows the id).
    pub(crate) fn now(&self) -> &str {
        &self.now
    }

    /// The coordinator described the id: `None` when it does not know it (expired).
    pub(crate) fn described(&mut self, d: Option<&TxnDescription>) -> Next {
        let c = self.c;
        self.now = d.map_or("the coordinator no longer knows the id".to_owned(), |d| {
            format!(
                "state {}, producer {}, epoch {}, started at {} (ours started at {})",
                d.state, d.producer_id, d.producer_epoch, d.start_time_ms, c.txn_start_ms
            )
        });
        let ours = d.filter(|d| c.is_same_transaction(d.producer_id, d.producer_epoch, d.start_time_ms));
        match ours.map(|d| d.state.as_str()) {
            Some("PrepareCommit" | "CompleteCommit") => Next::Done(match self.sent {
                Sent::Nothing => Done::Already,
                Sent::Succeeded => Done::Committed,
                Sent::InDoubt(_) => Done::AfterUnclearAnswer,
            }),
            Some(state @ ("PrepareAbort" | "CompleteAbort")) => {
                Next::Lost(format!("the coordinator reports it {state}"))
            }
            Some("Ongoing") => match &self.sent {
                // Contradicts the success (a node answering from an old view?): no EndTxn on
                // that, the driver's retry describes afresh.
                Sent::Succeeded => Next::Retry(format!(
                    "EndTxn of {c} answered success, but the coordinator still describes it Ongoing"
                )),
                Sent::InDoubt(answer) if self.end_txns >= MAX_END_TXNS => Next::Retry(format!(
                    "EndTxn of {c} sent {} times, the last answered {answer}; it is still open",
                    self.end_txns
                )),
                _ => Next::EndTxn {
                    again: self.end_txns > 0,
                },
            },
            // Ours, but ending otherwise (PrepareEpochFence: a producer initialised the id) or in
            // a state we do not expect: the log tells how it ended.
            Some(_) => Next::Probe,
            None => match self.sent {
                Sent::Succeeded => Next::Fatal(format!(
                    "EndTxn for {c} answered success, but the id's transaction is now: {}. Another producer with the same id and epoch (a zombie of the crashed process?) may have had its transaction committed instead. Stop every other process using this transactional id prefix, then check the output of checkpoint {}",
                    self.now, c.checkpoint_id
                )),
                // An EndTxn of ours may have been applied, and the id has moved on past ours: a
                // later transaction of the same producer id — only the crashed session, still
                // running (a zombie), begins those under our epoch, and our EndTxn may have
                // committed one (found by the simulation, seeds 308 and 2682) — also when a
                // timeout has aborted it since and the description shows the epoch it bumped
                // (seed 829 583), or the id initialised again (the zombie bumping its own epoch).
                // (Another process initialising the id meanwhile would be another copy of the
                // job: stopping is right then too.)
                Sent::InDoubt(_) if d.is_some_and(|d| self.moved_on_past_ours(d)) =>
                {
                    Next::Fatal(format!(
                        "an EndTxn for {c} answered unclearly, and the id now shows a later transaction of the same producer ({}): a zombie of the crashed process is still running, and that EndTxn may have committed its transaction. Stop every other process using this transactional id prefix, then check the output of checkpoint {}",
                        self.now, c.checkpoint_id
                    ))
                }
                // Ours ended before (it is not the id's transaction any more), or our in-doubt
                // EndTxn ended it and the id has moved on: the probe tells which way.
                Sent::Nothing | Sent::InDoubt(_) => Next::Probe,
            },
        }
    }

    /// Whether `d` (not ours: the caller checked) shows the id moved on past ours other than by
    /// ours being aborted: a later transaction (a zombie's, under our epoch or one a timeout bumped
    /// since), or the id initialised again (start time -1: the zombie bumping its own epoch after
    /// an abortable error, or another process). Within one commit nothing of this job initialises
    /// the id before the restored commits end, so after an EndTxn in doubt either means another
    /// producer used the id, and that EndTxn may have committed its transaction.
    fn moved_on_past_ours(&self, d: &TxnDescription) -> bool {
        let c = self.c;
        let same_epoch = d.producer_id == c.producer_id && d.producer_epoch == c.producer_epoch;
        #[cfg(test)]
        match super::sim::mutant() {
            super::sim::Mutant::InDoubtLaterToProbe => return false,
            super::sim::Mutant::InDoubtLaterSameEpochOnly => return same_epoch,
            _ => {}
        }
        // Ours, aborted since (a timeout bumps the epoch it shows): the probe tells.
        same_epoch || d.start_time_ms != c.txn_start_ms
    }

    /// An EndTxn sent after [`Next::EndTxn`] came back with `answer`.
    pub(crate) fn end_txn_answered(&mut self, answer: EndTxnAnswer) -> Next {
        self.end_txns += 1;
        #[cfg(test)]
        if let Some(next) = self.mutated(&answer) {
            return next;
        }
        match answer {
            EndTxnAnswer::Code(code::NONE) => {
                self.sent = Sent::Succeeded;
                Next::Describe
            }
            // Coordinator moving or loading, timed out, busy: possibly applied.
            EndTxnAnswer::Code(e) if code::retriable(e) => {
                self.sent = Sent::InDoubt(format!("error code {e}"));
                Next::Describe
            }
            EndTxnAnswer::NoAnswer(why) => {
                self.sent = Sent::InDoubt(format!("no answer ({why})"));
                Next::Describe
            }
            // Refused (invalid state, fenced) after an earlier EndTxn of this commit was in doubt:
            // the refusal may come from what that one did (it committed a zombie's transaction,
            // and the id moved on): the description decides, not the probe.
            EndTxnAnswer::Code(_) if matches!(self.sent, Sent::InDoubt(_)) => Next::Describe,
            // Refused (invalid state, fenced): the coordinator did not take it; the log tells
            // what became of ours.
            EndTxnAnswer::Code(_) => Next::Probe,
        }
    }
}

#[cfg(test)]
impl CommitSteps<'_> {
    /// What a known bug put back ([`super::sim::Mutant`]) does instead, on this thread.
    fn mutated(&mut self, answer: &EndTxnAnswer) -> Option<Next> {
        use super::sim::{mutant, Mutant};
        let unclear = match answer {
            EndTxnAnswer::Code(e) => *e != code::NONE && code::retriable(*e),
            EndTxnAnswer::NoAnswer(_) => true,
        };
        match mutant() {
            Mutant::ResendUnclearEndTxn if unclear => {
                self.sent = Sent::InDoubt("sent again blind".into());
                Some(Next::EndTxn { again: true })
            }
            Mutant::TrustEndTxnSuccess if *answer == EndTxnAnswer::Code(code::NONE) => {
                Some(Next::Done(Done::Committed))
            }
            Mutant::FatalOnUnclear if unclear => Some(Next::Fatal("unclear answer".into())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::committable::{Probe, COMMITTABLE_VERSION};

    /// When our transaction started (the coordinator's clock).
    const OURS: i64 = 1_700_000_000_000;
    /// A later transaction of the same producer id and epoch (a zombie's).
    const LATER: i64 = OURS + 5_000;
    const INVALID_TXN_STATE: i16 = 48;
    const PRODUCER_FENCED: i16 = 90;
    const MOVING: [i16; 3] = [
        code::NOT_COORDINATOR,
        code::COORDINATOR_NOT_AVAILABLE,
        code::COORDINATOR_LOAD_IN_PROGRESS,
    ];

    fn committable() -> KafkaCommittable {
        KafkaCommittable {
            version: COMMITTABLE_VERSION,
            transactional_id: "job-0-1".into(),
            producer_id: 17,
            producer_epoch: 3,
            txn_start_ms: OURS,
            checkpoint_id: 42,
            probe: Some(Probe {
                topic: "out".into(),
                partition: 2,
                offset: 99,
            }),
        }
    }

    /// The id's transaction as the coordinator describes it: producer 17, epoch 3.
    fn desc(state: &str, start_time_ms: i64) -> TxnDescription {
        TxnDescription {
            state: state.into(),
            producer_id: 17,
            producer_epoch: 3,
            timeout_ms: 60_000,
            start_time_ms,
            partitions: 1,
            topic_partitions: vec!["out-2".into()],
        }
    }

    /// Steps that described ours Ongoing and sent one EndTxn, answered `answer`: what next.
    fn after_one_end_txn(c: &KafkaCommittable, answer: EndTxnAnswer) -> (CommitSteps<'_>, Next) {
        let mut s = CommitSteps::new(c);
        assert_eq!(s.described(Some(&desc("Ongoing", OURS))), Next::EndTxn { again: false });
        let next = s.end_txn_answered(answer);
        (s, next)
    }

    /// The 2026-12-05 fact: an EndTxn answered NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE /
    /// COORDINATOR_LOAD_IN_PROGRESS may have been applied. The id is described before anything
    /// else, and EndTxn goes out again only while the description shows ours still Ongoing —
    /// never when the id shows a later transaction of the same producer id and epoch (a resend
    /// would commit the zombie's), nor when it shows another epoch.
    #[test]
    fn end_txn_answered_coordinator_moving_is_described_before_any_resend() {
        let c = committable();
        for e in MOVING {
            let (s, next) = after_one_end_txn(&c, EndTxnAnswer::Code(e));
            assert_eq!(next, Next::Describe, "after error code {e}");

            // Applied after all: done, nothing sent again.
            let mut applied = s;
            assert_eq!(
                applied.described(Some(&desc("PrepareCommit", OURS))),
                Next::Done(Done::AfterUnclearAnswer)
            );
            let (mut s, _) = after_one_end_txn(&c, EndTxnAnswer::Code(e));
            assert_eq!(
                s.described(Some(&desc("CompleteCommit", OURS))),
                Next::Done(Done::AfterUnclearAnswer)
            );

            // Not applied, ours still open: sent again (after a pause).
            let (mut s, _) = after_one_end_txn(&c, EndTxnAnswer::Code(e));
            assert_eq!(s.described(Some(&desc("Ongoing", OURS))), Next::EndTxn { again: true });

            // A zombie's later transaction under the same producer id and epoch, open or
            // committing: no EndTxn, and a stop — ours, in doubt, may have committed it.
            for state in ["Ongoing", "PrepareCommit", "CompleteCommit", "CompleteAbort"] {
                let (mut s, _) = after_one_end_txn(&c, EndTxnAnswer::Code(e));
                assert!(
                    matches!(s.described(Some(&desc(state, LATER))), Next::Fatal(why) if why.contains("zombie")),
                    "{state}"
                );
                assert!(s.now().contains(&LATER.to_string()), "{}", s.now());
            }

            // Our start time under another epoch (the id was initialised): not ours, no EndTxn.
            let (mut s, _) = after_one_end_txn(&c, EndTxnAnswer::Code(e));
            let fenced = TxnDescription {
                producer_epoch: 4,
                ..desc("Ongoing", OURS)
            };
            assert_eq!(s.described(Some(&fenced)), Next::Probe);

            // A zombie's later transaction that a timeout aborted since, bumping the epoch: a
            // stop as well (the simulation's seed 829 583).
            for state in ["PrepareAbort", "CompleteAbort"] {
                let (mut s, _) = after_one_end_txn(&c, EndTxnAnswer::Code(e));
                let timed_out = TxnDescription {
                    producer_epoch: 4,
                    ..desc(state, LATER)
                };
                assert!(
                    matches!(s.described(Some(&timed_out)), Next::Fatal(why) if why.contains("zombie")),
                    "{state}"
                );
            }
            // The id initialised since (start time -1; the zombie bumping its own epoch, or a new
            // producer id): a stop too — someone else used the id while ours was in doubt.
            for (pid, epoch) in [(17, 4), (18, 0)] {
                let (mut s, _) = after_one_end_txn(&c, EndTxnAnswer::Code(e));
                let empty = TxnDescription {
                    producer_id: pid,
                    producer_epoch: epoch,
                    ..desc("Empty", -1)
                };
                assert!(matches!(s.described(Some(&empty)), Next::Fatal(_)), "{pid}/{epoch}");
            }
            // A refusal after an EndTxn in doubt: described first (it may be what that one did).
            let (mut s, _) = after_one_end_txn(&c, EndTxnAnswer::Code(e));
            assert_eq!(s.described(Some(&desc("Ongoing", OURS))), Next::EndTxn { again: true });
            assert_eq!(s.end_txn_answered(EndTxnAnswer::Code(PRODUCER_FENCED)), Next::Describe);

            // Aborted meanwhile (transaction timeout): data lost, reported.
            let (mut s, _) = after_one_end_txn(&c, EndTxnAnswer::Code(e));
            assert!(matches!(
                s.described(Some(&desc("CompleteAbort", OURS))),
                Next::Lost(why) if why.contains("CompleteAbort")
            ));
        }
    }

    /// A lost answer and the other retriable answers are in doubt the same way.
    #[test]
    fn a_lost_answer_or_a_timeout_is_described_before_any_resend() {
        let c = committable();
        for answer in [
            EndTxnAnswer::NoAnswer("no answer within 10s".into()),
            EndTxnAnswer::Code(code::REQUEST_TIMED_OUT),
            EndTxnAnswer::Code(code::NETWORK_EXCEPTION),
            EndTxnAnswer::Code(code::CONCURRENT_TRANSACTIONS),
        ] {
            let (mut s, next) = after_one_end_txn(&c, answer.clone());
            assert_eq!(next, Next::Describe, "{answer:?}");
            assert_eq!(
                s.described(Some(&desc("PrepareCommit", OURS))),
                Next::Done(Done::AfterUnclearAnswer)
            );
        }
    }

    /// A coordinator that keeps answering that it moved: EndTxn at most [`MAX_END_TXNS`] times,
    /// each after a description showing ours Ongoing; then the driver's retry.
    #[test]
    fn end_txn_goes_out_a_bounded_number_of_times() {
        let c = committable();
        let mut s = CommitSteps::new(&c);
        let mut sent = 0;
        loop {
            match s.described(Some(&desc("Ongoing", OURS))) {
                Next::EndTxn { again } => {
                    assert_eq!(again, sent > 0);
                    sent += 1;
                    assert_eq!(
                        s.end_txn_answered(EndTxnAnswer::Code(code::NOT_COORDINATOR)),
                        Next::Describe
                    );
                }
                Next::Retry(why) => {
                    assert!(why.contains("error code 16"), "{why}");
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(sent, MAX_END_TXNS);
    }

    /// The check after an EndTxn that answered success (`confirm_committed` before): the id must
    /// still show ours; a later transaction of the same producer and epoch, or an id the
    /// coordinator no longer knows, is a fatal error naming the checkpoint, never a success.
    #[test]
    fn end_txn_success_is_confirmed_and_a_changed_id_is_fatal() {
        let c = committable();
        for state in ["PrepareCommit", "CompleteCommit"] {
            let (mut s, next) = after_one_end_txn(&c, EndTxnAnswer::Code(code::NONE));
            assert_eq!(next, Next::Describe);
            assert_eq!(s.described(Some(&desc(state, OURS))), Next::Done(Done::Committed));
        }
        for now in [Some(desc("Ongoing", LATER)), Some(desc("CompleteCommit", LATER)), None] {
            let (mut s, _) = after_one_end_txn(&c, EndTxnAnswer::Code(code::NONE));
            match s.described(now.as_ref()) {
                Next::Fatal(why) => {
                    assert!(why.contains("answered success"), "{why}");
                    assert!(why.contains("checkpoint 42"), "{why}");
                }
                other => panic!("{now:?}: {other:?}"),
            }
        }
        // Success, then still Ongoing (an old view?): no second EndTxn on that.
        let (mut s, _) = after_one_end_txn(&c, EndTxnAnswer::Code(code::NONE));
        assert!(matches!(s.described(Some(&desc("Ongoing", OURS))), Next::Retry(_)));
    }

    /// Before any EndTxn: ours committing or committed is done, ours aborting or aborted is data
    /// lost, anything else (another transaction, an unknown id, ours being fenced) goes to the
    /// probe; only ours Ongoing gets an EndTxn.
    #[test]
    fn the_first_description_decides_what_it_can() {
        let c = committable();
        let first = |d: Option<TxnDescription>| CommitSteps::new(&c).described(d.as_ref());
        assert_eq!(first(Some(desc("Ongoing", OURS))), Next::EndTxn { again: false });
        assert_eq!(first(Some(desc("PrepareCommit", OURS))), Next::Done(Done::Already));
        assert_eq!(first(Some(desc("CompleteCommit", OURS))), Next::Done(Done::Already));
        for state in ["PrepareAbort", "CompleteAbort"] {
            assert!(matches!(first(Some(desc(state, OURS))), Next::Lost(_)), "{state}");
        }
        assert_eq!(first(Some(desc("PrepareEpochFence", OURS))), Next::Probe);
        assert_eq!(first(Some(desc("Ongoing", LATER))), Next::Probe);
        assert_eq!(first(Some(desc("CompleteAbort", LATER))), Next::Probe);
        assert_eq!(first(None), Next::Probe);
    }

    /// An EndTxn the coordinator refuses leaves the decision to the probe record.
    #[test]
    fn a_refused_end_txn_goes_to_the_probe() {
        let c = committable();
        let (_, next) = after_one_end_txn(&c, EndTxnAnswer::Code(INVALID_TXN_STATE));
        assert_eq!(next, Next::Probe);
    }
}
