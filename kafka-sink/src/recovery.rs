//! Commit after restart, and the read_committed probe that settles ambiguous answers.
//!
//! With librdkafka's transaction version 1 the producer epoch is stable across the transactions
//! of one `init_transactions`, so EndTxn(id, producer id, epoch) names the *current* transaction
//! of an id, not a particular one. Before committing a restored committable we therefore check
//! with DescribeTransactions that the transaction open under that id is the one we pre-committed
//! (same producer id, epoch and start time), and after the EndTxn that it still is. If it is not
//! (or the coordinator no longer knows the id), ours already ended: one of its records tells how.
//! Seen by a read_committed reader: committed (success). In the log but skipped by read_committed
//! readers: aborted (data lost). Gone from the log (retention, compaction): unknown — the job
//! stops rather than guess, unless the operator accepted unknown outcomes up to that checkpoint.

use std::time::{Duration, Instant};

use exactly_kafka_client::leader::asking_again;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Message, Offset, TopicPartitionList};
use tracing::{error, info, warn};

use crate::committable::{KafkaCommittable, Probe};
use crate::error::SinkError;
use crate::protocol::{code, Wire};
use exactly_twophase::CommitError;

/// Commits a restored committable through the protocol. Already committed is success. An
/// outcome nobody can tell any more is a fatal error, unless `accept_unknown_up_to` covers the
/// committable's checkpoint (the operator checked its output).
pub(crate) async fn commit_recovered(
    wire: &Wire,
    c: &KafkaCommittable,
    accept_unknown_up_to: Option<u64>,
) -> Result<(), CommitError> {
    let retriable = |e: SinkError| CommitError::Retriable(e.into());
    // An id the coordinator does not know (expired after `transactional.id.expiration.ms`, e.g.
    // a week-old savepoint) has no open transaction: ours ended, the probe tells how.
    let desc = wire.describe_known(&c.transactional_id).await.map_err(retriable)?;
    let ours = desc
        .as_ref()
        .filter(|d| c.is_same_transaction(d.producer_id, d.producer_epoch, d.start_time_ms));
    if let Some(d) = ours {
        match d.state.as_str() {
            "Ongoing" | "PrepareCommit" => {
                let result = wire
                    .end_txn(&c.transactional_id, c.producer_id, c.producer_epoch, true)
                    .await
                    .map_err(retriable)?;
                if result == code::NONE {
                    return confirm_committed(wire, c).await;
                }
                if code::retriable(result) {
                    return Err(CommitError::Retriable(
                        format!("EndTxn of {c}: error code {result}").into(),
                    ));
                }
                warn!(committable = %c, error_code = result, "EndTxn refused; checking whether the transaction committed.");
            }
            "CompleteCommit" => return Ok(()),
            "PrepareAbort" | "CompleteAbort" => {
                return Err(CommitError::Lost {
                    what: c.to_string(),
                    source: format!("the coordinator reports it {}", d.state).into(),
                })
            }
            _ => {}
        }
    }
    let now = match &desc {
        Some(d) => format!(
            "state {}, producer {}, epoch {}",
            d.state, d.producer_id, d.producer_epoch
        ),
        None => "the coordinator no longer knows the id".into(),
    };
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

/// After an EndTxn that answered success: the id must still show *our* transaction (committing
/// or committed). If another transaction of the same producer and epoch replaced it between the
/// describe and the EndTxn (a zombie of the crashed process), the EndTxn committed that one, and
/// this must not pass as success.
async fn confirm_committed(wire: &Wire, c: &KafkaCommittable) -> Result<(), CommitError> {
    let after = wire
        .describe_known(&c.transactional_id)
        .await
        .map_err(|e| CommitError::Retriable(e.into()))?;
    match after {
        Some(d) if c.is_same_transaction(d.producer_id, d.producer_epoch, d.start_time_ms) => {
            info!(committable = %c, state = %d.state, "Committed a restored transaction.");
            Ok(())
        }
        other => {
            let now = other.map_or("unknown to the coordinator".to_owned(), |d| {
                format!(
                    "{} with producer {}, epoch {}, started at {} (ours started at {})",
                    d.state, d.producer_id, d.producer_epoch, d.start_time_ms, c.txn_start_ms
                )
            });
            error!(committable = %c, now = %now, "The transaction id changed under the recovery commit: another producer (a zombie of the crashed process?) used it.");
            Err(CommitError::Fatal(
                format!(
                    "EndTxn for {c} answered success, but the id's transaction is now {now}: another producer with the same id and epoch (a zombie of the crashed process?) may have had its transaction committed instead. Stop every other process using this transactional id prefix, then check the output of checkpoint {}",
                    c.checkpoint_id
                )
                .into(),
            ))
        }
    }
}

/// What the log says about a probe record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProbeOutcome {
    /// A read_committed reader sees it: the transaction committed.
    Committed,
    /// It is in the log, but read_committed readers skip it: the transaction aborted.
    Aborted,
    /// It is gone from the log (retention or compaction): nobody can tell any more.
    Unknown(String),
}

/// Reads the probe's record as a read_committed reader and, if that does not see it, as a
/// read_uncommitted one: present for both = committed, only for the second = aborted, for
/// neither = removed (unknown). Fails (to be retried) while an open transaction pins the
/// partition's last stable offset below the record.
pub(crate) fn probe_outcome(
    cluster: &exactly_kafka_client::Cluster,
    probe: &Probe,
    timeout: Duration,
) -> Result<ProbeOutcome, SinkError> {
    let deadline = Instant::now() + timeout;
    match read_at(cluster, probe, true, deadline)? {
        Seen::Record => Ok(ProbeOutcome::Committed),
        Seen::Removed(why) => Ok(ProbeOutcome::Unknown(why)),
        Seen::Skipped => match read_at(cluster, probe, false, deadline)? {
            Seen::Record => Ok(ProbeOutcome::Aborted),
            Seen::Skipped => Ok(ProbeOutcome::Unknown(
                "the offset holds no record any more (removed by compaction)".into(),
            )),
            Seen::Removed(why) => Ok(ProbeOutcome::Unknown(why)),
        },
    }
}

enum Seen {
    /// The record at the probe's offset.
    Record,
    /// The reader went past the offset without it.
    Skipped,
    /// The offset is below the partition's start (retention or DeleteRecords removed it).
    Removed(String),
}

fn read_at(
    cluster: &exactly_kafka_client::Cluster,
    probe: &Probe,
    committed: bool,
    deadline: Instant,
) -> Result<Seen, SinkError> {
    let isolation = if committed {
        "read_committed"
    } else {
        "read_uncommitted"
    };
    let consumer: BaseConsumer = cluster
        .client_config()
        .map_err(SinkError::Config)?
        .set("group.id", "exactly-probe")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        // An offset out of range must be an error we see, never a silent jump to the end (which
        // would read as "absent", i.e. aborted).
        .set("auto.offset.reset", "error")
        .create()
        .map_err(|e| SinkError::kafka("creating the probe consumer", e))?;
    let watermarks = || {
        let what = format!("{}/{}", probe.topic, probe.partition);
        asking_again(&what, Duration::from_secs(10), || {
            consumer.fetch_watermarks(&probe.topic, probe.partition, Duration::from_secs(10))
        })
        .map_err(|e| SinkError::kafka("probe watermarks", e))
    };
    let (low, _) = watermarks()?;
    let removed = |low: i64| {
        Seen::Removed(format!(
            "{}/{}@{} is below the partition's first offset {low} (removed by retention)",
            probe.topic, probe.partition, probe.offset
        ))
    };
    if probe.offset < low {
        return Ok(removed(low));
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&probe.topic, probe.partition, Offset::Offset(probe.offset))
        .map_err(|e| SinkError::kafka("probe assignment", e))?;
    consumer
        .assign(&tpl)
        .map_err(|e| SinkError::kafka("probe assignment", e))?;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) if m.offset() == probe.offset => return Ok(Seen::Record),
            Some(Ok(m)) if m.offset() > probe.offset => return Ok(Seen::Skipped),
            Some(Ok(_)) | None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => {
                // At the end (for read_committed: the last stable offset) without the record:
                // skipped if the end is past it; otherwise an open transaction pins it: wait.
                let (_, end) = watermarks()?;
                if end > probe.offset {
                    return Ok(Seen::Skipped);
                }
            }
            Some(Err(KafkaError::MessageConsumption(
                RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange,
            ))) => {
                let (low, _) = watermarks()?;
                if probe.offset < low {
                    return Ok(removed(low));
                }
            }
            Some(Err(e)) => return Err(SinkError::kafka("probe read", e)),
        }
    }
    Err(SinkError::Protocol(format!(
        "could not decide before the deadline whether {}/{}@{} is committed (an open transaction holds the partition's last stable offset)",
        probe.topic, probe.partition, probe.offset
    )))
}
