//! Commit after restart, and the read_committed probe that settles ambiguous answers.
//!
//! With librdkafka's transaction version 1 the producer epoch is stable across the transactions
//! of one `init_transactions`, so EndTxn(id, producer id, epoch) names the *current* transaction
//! of an id, not a particular one. Before committing a restored committable we therefore check
//! with DescribeTransactions that the transaction open under that id is the one we pre-committed
//! (same producer id, epoch and start time). If it is not, ours already ended: a read_committed
//! read of one of its records tells whether it was committed (success) or aborted (data lost).

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use tracing::{info, warn};

use crate::committable::{KafkaCommittable, Probe};
use crate::error::SinkError;
use crate::protocol::{code, Wire};
use exactly_twophase::CommitError;

/// Commits a restored committable through the protocol. Already committed is success.
pub(crate) async fn commit_recovered(wire: &Wire, bootstrap: &str, c: &KafkaCommittable) -> Result<(), CommitError> {
    let desc = wire
        .describe(&c.transactional_id)
        .await
        .map_err(|e| CommitError::Retriable(e.into()))?;
    let ours = desc.producer_id == c.producer_id
        && desc.producer_epoch == c.producer_epoch
        && desc.start_time_ms == c.txn_start_ms;
    if ours {
        match desc.state.as_str() {
            "Ongoing" | "PrepareCommit" => {
                let result = wire
                    .end_txn(&c.transactional_id, c.producer_id, c.producer_epoch, true)
                    .await
                    .map_err(|e| CommitError::Retriable(e.into()))?;
                if result == code::NONE {
                    info!(committable = %c, "Committed a restored transaction.");
                    return Ok(());
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
                    source: format!("the coordinator reports it {}", desc.state).into(),
                })
            }
            _ => {}
        }
    }
    let Some(probe) = &c.probe else {
        return Err(CommitError::Lost {
            what: c.to_string(),
            source: format!(
                "it is no longer the open transaction of its id (state {}, producer {}, epoch {}) and has no record to check",
                desc.state, desc.producer_id, desc.producer_epoch
            )
            .into(),
        });
    };
    let bootstrap = bootstrap.to_owned();
    let probe2 = probe.clone();
    let visible = tokio::task::spawn_blocking(move || probe_visible(&bootstrap, &probe2, Duration::from_secs(30)))
        .await
        .map_err(|e| CommitError::Retriable(e.to_string().into()))?
        .map_err(|e| CommitError::Retriable(e.into()))?;
    if visible {
        info!(committable = %c, "Restored transaction was already committed.");
        Ok(())
    } else {
        Err(CommitError::Lost {
            what: c.to_string(),
            source: format!(
                "its record {}/{}@{} is not visible to read_committed readers: the transaction was aborted",
                probe.topic, probe.partition, probe.offset
            )
            .into(),
        })
    }
}

/// Whether a read_committed reader sees the record at the probe's coordinates. Fails (to be
/// retried) while the partition's last stable offset has not passed it.
pub(crate) fn probe_visible(bootstrap: &str, probe: &Probe, timeout: Duration) -> Result<bool, SinkError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "exactly-probe")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .map_err(|e| SinkError::kafka("creating the probe consumer", e))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&probe.topic, probe.partition, Offset::Offset(probe.offset))
        .map_err(|e| SinkError::kafka("probe assignment", e))?;
    consumer
        .assign(&tpl)
        .map_err(|e| SinkError::kafka("probe assignment", e))?;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) if m.offset() == probe.offset => return Ok(true),
            Some(Ok(m)) if m.offset() > probe.offset => return Ok(false),
            Some(Ok(_)) | None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => {
                // At the last stable offset without seeing the record: aborted, if the stable
                // offset is past it; otherwise an open transaction pins it: wait.
                let (_, stable) = consumer
                    .fetch_watermarks(&probe.topic, probe.partition, Duration::from_secs(10))
                    .map_err(|e| SinkError::kafka("probe watermarks", e))?;
                if stable > probe.offset {
                    return Ok(false);
                }
            }
            Some(Err(e)) => return Err(SinkError::kafka("probe read", e)),
        }
    }
    Err(SinkError::Protocol(format!(
        "could not decide within {timeout:?} whether {}/{}@{} is committed (an open transaction holds the partition's last stable offset)",
        probe.topic, probe.partition, probe.offset
    )))
}
