//! Commit after restart, and the read_committed probe that settles ambiguous answers.
//!
//! With librdkafka's transaction version 1 the producer epoch is stable across the transactions
//! of one `init_transactions`, so EndTxn(id, producer id, epoch) names the *current* transaction
//! of an id, not a particular one. Before committing a restored committable we therefore check
//! with DescribeTransactions that the transaction open under that id is the one we pre-committed
//! (same producer id, epoch and start time), and after the EndTxn that it still is; an EndTxn
//! whose answer leaves it unclear whether it was applied (coordinator moving or loading, timed
//! out, no answer) is followed by a description, never sent again blind ([`steps`]). If ours is
//! no longer the id's transaction (or the coordinator no longer knows the id), it already ended:
//! one of its records tells how ([`probe`]). Seen by a read_committed reader: committed (success).
//! In the log but skipped by read_committed readers: aborted (data lost). Gone from the log
//! (retention, compaction): unknown — the job stops rather than guess, unless the operator
//! accepted unknown outcomes up to that checkpoint.
//!
//! # Design notes
//!
//! Why this part is built as it is, with the measurements and failures that shaped it.
//!
//! `recovery.rs`: commit after restart with EndTxn (version 3: transaction version 1, as librdkafka
//! speaks) — only after DescribeTransactions shows the open transaction *is* the recorded one
//! (`KafkaCommittable::is_same_transaction`: producer id, epoch and start time, the one definition
//! used by recovery, lingering clean-up and `exactly txn`), and describing again after the EndTxn
//! (a zombie's transaction committed in its place is a loud fatal error, not a success). The
//! decisions are a state machine fed with the answers (`recovery/steps.rs`): an EndTxn answered
//! NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS, timed out or lost may
//! have been applied, so the id is described before anything else (committing or committed: done;
//! still ours and Ongoing: sent again, at most 5 times; a later transaction of our producer id,
//! under our epoch or one a timeout bumped since: a stop, as that EndTxn may have committed a
//! zombie's transaction); never resent blind. Otherwise
//! (another transaction, or an id the coordinator no longer knows: expired) one of its records
//! decides (`recovery/probe.rs`), from evidence only: seen by a read_committed reader → committed;
//! a record delivered past its offset, or the reader's position past it, without it → skipped, and
//! then in the log for a read_uncommitted reader → aborted (DATA LOST) — reaching the end of the
//! partition decides nothing (a watermark asked afterwards may show a later stable offset the
//! reader never read: a committed transaction taken for aborted); gone from the log (retention,
//! compaction; the probe consumers use `auto.offset.reset=error`) → unknown: a fatal error naming the checkpoint, the record and the
//! setting that accepts it (`delivery.accept_unknown_outcome_up_to`: the operator checked the
//! output of checkpoints up to N; those pass as committed with a warning, later ones are checked).

mod probe;
#[cfg(test)]
mod sim;
mod steps;
#[cfg(test)]
mod wiring_tests;

use std::time::Duration;

use tracing::{error, info, warn};

use crate::committable::KafkaCommittable;
use crate::error::Result;
use crate::error::SinkError;
use crate::protocol::{code, TxnDescription, Wire};
use exactly_kafka_client::Cluster;
use exactly_twophase::CommitError;
use probe::{probe_outcome, ProbeOutcome};
use std::future::Future;
pub(crate) use steps::Sent;
use steps::{CommitSteps, Done, EndTxnAnswer, Next};

/// The pause before an EndTxn sent again (after an unclear answer and a description showing the
/// transaction still open), doubled up to [`MAX_RESEND_PAUSE`].
const FIRST_RESEND_PAUSE: Duration = Duration::from_millis(200);
/// The longest pause before an EndTxn sent again.
const MAX_RESEND_PAUSE: Duration = Duration::from_secs(2);

/// The requests the commit after restart sends to the transaction coordinator: the wire client
/// sends them; a test may stand between (to let another producer act between two requests).
pub(crate) trait Coordinator: Sync {
    /// DescribeTransactions of one id (`None`: the coordinator does not know it).
    fn describe_known(&self, transactional_id: &str) -> impl Future<Output = Result<Option<TxnDescription>>> + Send;
    /// EndTxn(commit) for that producer id and epoch: the answer's error code.
    fn end_txn_commit(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
    ) -> impl Future<Output = Result<i16>> + Send;
    /// The cluster, for the probe's reader.
    fn cluster(&self) -> &Cluster;
}

impl Coordinator for Wire {
    fn describe_known(&self, transactional_id: &str) -> impl Future<Output = Result<Option<TxnDescription>>> + Send {
        Wire::describe_known(self, transactional_id)
    }

    fn end_txn_commit(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
    ) -> impl Future<Output = Result<i16>> + Send {
        self.end_txn(transactional_id, producer_id, epoch, true)
    }

    fn cluster(&self) -> &Cluster {
        Wire::cluster(self)
    }
}

/// What the EndTxns of restored commits did in tries that decided nothing, for the life of the
/// process, by committable: a task restarted after a commit's tries ran out (a coordinator
/// loading for long) has a new sink, and must still know that an EndTxn of that commit was in
/// doubt — or the id moving on meanwhile goes to the probe, which may find ours committed and
/// report success over a zombie's transaction that EndTxn committed. (A process that dies
/// forgets it: the hazard the one-owner rule and transaction version 2 bound.)
fn in_doubt() -> &'static std::sync::Mutex<std::collections::BTreeMap<String, Sent>> {
    static IN_DOUBT: std::sync::OnceLock<std::sync::Mutex<std::collections::BTreeMap<String, Sent>>> =
        std::sync::OnceLock::new();
    IN_DOUBT.get_or_init(Default::default)
}

/// [`commit_recovered`], knowing what the earlier tries of this commit in this process did.
pub(crate) async fn commit_recovered_in_process(
    wire: &impl Coordinator,
    c: &KafkaCommittable,
    accept_unknown_up_to: Option<u64>,
) -> Result<(), CommitError> {
    let key = format!("{c} started at {}", c.txn_start_ms);
    let remembered = || in_doubt().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut tried = remembered().get(&key).cloned().unwrap_or_default();
    let result = commit_recovered(wire, c, accept_unknown_up_to, &mut tried).await;
    if result.is_ok() {
        remembered().remove(&key);
    } else {
        remembered().insert(key, tried);
    }
    result
}

/// Commits a restored committable through the protocol. Already committed is success. An
/// outcome nobody can tell any more is a fatal error, unless `accept_unknown_up_to` covers the
/// committable's checkpoint (the operator checked its output). `tried` is what the EndTxns of the
/// earlier tries of this commit did, and is updated: a try after an EndTxn in doubt must still
/// treat a later transaction of the same producer as a zombie's it may have committed.
pub(crate) async fn commit_recovered(
    wire: &impl Coordinator,
    c: &KafkaCommittable,
    accept_unknown_up_to: Option<u64>,
    tried: &mut Sent,
) -> Result<(), CommitError> {
    let mut steps = CommitSteps::resume(c, tried.clone());
    let result = commit_with(wire, c, accept_unknown_up_to, &mut steps).await;
    *tried = steps.sent().clone();
    result
}

async fn commit_with(
    wire: &impl Coordinator,
    c: &KafkaCommittable,
    accept_unknown_up_to: Option<u64>,
    steps: &mut CommitSteps<'_>,
) -> Result<(), CommitError> {
    let retriable = |e: SinkError| CommitError::Retriable(e.into());
    let mut next = Next::Describe;
    let mut pause = FIRST_RESEND_PAUSE;
    loop {
        next = match next {
            // An id the coordinator does not know (expired after
            // `transactional.id.expiration.ms`, e.g. a week-old savepoint) has no open
            // transaction: ours ended, the probe tells how.
            Next::Describe => {
                let desc = wire.describe_known(&c.transactional_id).await.map_err(retriable)?;
                steps.described(desc.as_ref())
            }
            Next::EndTxn { again } => {
                if again {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_RESEND_PAUSE);
                }
                let answer = match wire
                    .end_txn_commit(&c.transactional_id, c.producer_id, c.producer_epoch)
                    .await
                {
                    Ok(error_code) => EndTxnAnswer::Code(error_code),
                    Err(SinkError::Protocol(e)) => EndTxnAnswer::NoAnswer(e),
                    Err(e) => return Err(retriable(e)),
                };
                let next = steps.end_txn_answered(answer.clone());
                match (&answer, &next) {
                    (EndTxnAnswer::Code(code::NONE), _) => {}
                    (_, Next::Describe) => {
                        warn!(committable = %c, answer = ?answer, "EndTxn of a restored transaction answered unclearly (coordinator moving, timed out, or no answer): it may have been applied; describing the transaction before anything else.")
                    }
                    _ => {
                        warn!(committable = %c, answer = ?answer, "EndTxn refused; checking whether the transaction committed.")
                    }
                }
                next
            }
            Next::Done(how) => {
                let how = match how {
                    Done::Already => "it was already committing or committed",
                    Done::Committed => "EndTxn answered success and the id still shows it",
                    Done::AfterUnclearAnswer => {
                        "an EndTxn answered unclearly, and the id shows it committing or committed"
                    }
                };
                info!(committable = %c, now = %steps.now(), how, "Committed a restored transaction.");
                return Ok(());
            }
            Next::Lost(why) => {
                return Err(CommitError::Lost {
                    what: c.to_string(),
                    source: why.into(),
                })
            }
            Next::Fatal(why) => {
                error!(committable = %c, now = %steps.now(), "The transaction id changed under the recovery commit: another producer (a zombie of the crashed process?) used it.");
                return Err(CommitError::Fatal(why.into()));
            }
            Next::Retry(why) => return Err(CommitError::Retriable(why.into())),
            Next::Probe => break,
        };
    }
    let now = steps.now();
    let Some(probe) = &c.probe else {
        return Err(CommitError::Lost {
            what: c.to_string(),
            source: format!("it is no longer the open transaction of its id ({now}) and has no record to check").into(),
        });
    };
    let cluster = wire.cluster().clone();
    let probe2 = probe.clone();
    let outcome = tokio::task::spawn_blocking(move || probe_outcome(&cluster, &probe2, Duration::from_secs(30)))
        .await
        .map_err(|e| CommitError::Retriable(e.to_string().into()))?
        .map_err(retriable)?;
    match outcome {
        ProbeOutcome::Committed => {
            info!(committable = %c, "Restored transaction was already committed.");
            Ok(())
        }
        ProbeOutcome::Aborted => Err(CommitError::Lost {
            what: c.to_string(),
            source: format!(
                "its record {}/{}@{} is in the log but not visible to read_committed readers: the transaction was aborted ({now})",
                probe.topic, probe.partition, probe.offset
            )
            .into(),
        }),
        ProbeOutcome::Unknown(why) => {
            let probe = format!("{}/{}@{}", probe.topic, probe.partition, probe.offset);
            if accept_unknown_up_to.is_some_and(|n| c.checkpoint_id <= n) {
                warn!(
                    committable = %c,
                    checkpoint_id = c.checkpoint_id,
                    %probe,
                    reason = %why,
                    "Cannot tell whether the restored transaction committed: it is no longer open ({now}) and its record is gone from the log. Continuing as if it committed: delivery.accept_unknown_outcome_up_to covers its checkpoint."
                );
                return Ok(());
            }
            Err(CommitError::Fatal(
                format!(
                    "cannot tell whether {c} committed: it is no longer the open transaction of its id ({now}) and its record {probe} is gone from the log ({why}). Stopping rather than guessing: if it was aborted, the records of checkpoint {} are missing from the output. Check the output (e.g. with `exactly verify`); to continue as if it committed, set the sink's delivery.accept_unknown_outcome_up_to = {} and start the job again",
                    c.checkpoint_id, c.checkpoint_id
                )
                .into(),
            ))
        }
    }
}

#[cfg(test)]
mod in_process_tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;
    use crate::committable::COMMITTABLE_VERSION;

    /// A coordinator that answers from a script.
    struct Scripted {
        describes: Mutex<VecDeque<Result<Option<TxnDescription>>>>,
        end_txns: Mutex<VecDeque<Result<i16>>>,
        cluster: Cluster,
    }

    impl Coordinator for Scripted {
        async fn describe_known(&self, _: &str) -> Result<Option<TxnDescription>> {
            self.describes
                .lock()
                .unwrap()
                .pop_front()
                .expect("a scripted description")
        }
        async fn end_txn_commit(&self, _: &str, _: i64, _: i16) -> Result<i16> {
            self.end_txns
                .lock()
                .unwrap()
                .pop_front()
                .expect("a scripted EndTxn answer")
        }
        fn cluster(&self) -> &Cluster {
            &self.cluster
        }
    }

    fn desc(state: &str, epoch: i16, start_time_ms: i64) -> TxnDescription {
        TxnDescription {
            state: state.into(),
            producer_id: 17,
            producer_epoch: epoch,
            timeout_ms: 60_000,
            start_time_ms,
            partitions: 1,
            topic_partitions: vec!["out-0".into()],
        }
    }

    /// An EndTxn in doubt, then a try that could not describe (the task restarts with a new
    /// sink): the next try in the process still knows, and a later transaction of the producer
    /// stops it instead of going to the probe.
    #[tokio::test]
    async fn an_end_txn_in_doubt_is_remembered_across_sinks_of_the_process() {
        let c = KafkaCommittable {
            version: COMMITTABLE_VERSION,
            transactional_id: "in-process-memory-0".into(),
            producer_id: 17,
            producer_epoch: 3,
            txn_start_ms: 1_000,
            checkpoint_id: 9,
            probe: Some(crate::committable::Probe {
                topic: "out".into(),
                partition: 0,
                offset: 5,
            }),
        };
        let first = Scripted {
            describes: Mutex::new(VecDeque::from([
                Ok(Some(desc("Ongoing", 3, 1_000))),
                Err(SinkError::Protocol("coordinator loading".into())),
            ])),
            end_txns: Mutex::new(VecDeque::from([Err(SinkError::Protocol("no answer".into()))])),
            cluster: Cluster::plaintext("127.0.0.1:9"),
        };
        let r = commit_recovered_in_process(&first, &c, None).await;
        assert!(matches!(r, Err(CommitError::Retriable(_))), "{r:?}");
        // A new sink of the same process: the zombie's later transaction, aborted by a timeout
        // since (epoch 4), is what the id shows now.
        let second = Scripted {
            describes: Mutex::new(VecDeque::from([Ok(Some(desc("CompleteAbort", 4, 2_000)))])),
            end_txns: Mutex::new(VecDeque::new()),
            cluster: Cluster::plaintext("127.0.0.1:9"),
        };
        let r = commit_recovered_in_process(&second, &c, None).await;
        assert!(
            matches!(&r, Err(CommitError::Fatal(why)) if why.to_string().contains("zombie")),
            "{r:?}"
        );
    }
}
