//! The sink's own record of what it committed: each transaction also commits, as a transactional
//! consumer-group offset, the id of its checkpoint — group `{prefix}-progress-{subtask}`,
//! partition 0 of the output topic, offset = checkpoint id (`sendOffsetsToTransaction`, as Kafka
//! Streams commits its input offsets; sent by the sink's own protocol client, `protocol/offsets.rs`,
//! at the background pre-commit). The offset becomes visible exactly when the transaction's
//! records do, and never when they are aborted, so the group's committed offset is the newest
//! checkpoint this subtask committed into this topic. (Of two committed offsets the broker keeps
//! the one whose commit was appended last; each is appended at its pre-commit, in checkpoint
//! order — a pre-commit waits for the previous one's — whatever order the transactions' markers
//! are written in.)
//!
//! A start reads it before it changes anything (`committed_through`): a restore behind it, or a
//! fresh start where it shows commits, would write again what readers already have, and is
//! refused; when the newest checkpoint cannot be read, it proves (or not) that none of that
//! checkpoint's transactions committed. Offsets of transactions whose commit is decided but whose
//! markers are still being written are not visible yet: the read waits until none of the
//! subtask's transactions is in a `Prepare…` state. Offsets of open transactions are pending,
//! not committed, and are read as what they are (read_uncommitted: no wait for them).
//!
//! The record lasts as long as the broker keeps a group's offsets after its last commit
//! (`offsets.retention.minutes`, 7 days by default), like the transactional ids themselves
//! (`transactional.id.expiration.ms`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use exactly_core::CheckpointId;
use exactly_kafka_client::leader::asking_the_coordinator_again;
use exactly_kafka_client::Cluster;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::error::{Result, SinkError};
use crate::protocol::{Wire, FAILOVER};
use crate::transactional_id::parse;

/// Where a sink's record lives and how to reach it.
pub(crate) struct Record<'a> {
    pub(crate) cluster: Cluster,
    pub(crate) wire: &'a Wire,
    pub(crate) brokers: &'a [String],
    pub(crate) prefix: &'a str,
    pub(crate) topic: &'a str,
    /// This subtask and the job's parallelism: subtask 0 also answers for subtasks at or above
    /// it (a job rescaled down).
    pub(crate) subtask: u32,
    pub(crate) parallelism: u32,
}

impl Record<'_> {
    /// The subtasks whose records this one answers for: itself, and for subtask 0 those at or
    /// above the parallelism that the broker lists transactions of. Waits until none of their
    /// transactions is between its commit (or abort) decision and its markers: the offsets of a
    /// commit decided are visible only once its markers are written.
    async fn settled_subtasks(&self) -> Result<BTreeSet<u32>> {
        let deadline = Instant::now() + FAILOVER;
        loop {
            let mut subtasks = BTreeSet::from([self.subtask]);
            let mut completing = None;
            for t in self.wire.list(self.brokers).await? {
                let Some((subtask, _)) = parse(self.prefix, &t.transactional_id) else {
                    continue;
                };
                if subtask == self.subtask || (self.subtask == 0 && subtask >= self.parallelism) {
                    subtasks.insert(subtask);
                    if t.state.starts_with("Prepare") {
                        completing = Some(t.transactional_id);
                    }
                }
            }
            let Some(id) = completing else {
                return Ok(subtasks);
            };
            if Instant::now() > deadline {
                return Err(SinkError::Protocol(format!(
                    "transaction {id} is still completing after {FAILOVER:?}: the sink's record of commits cannot be read until it has"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The newest checkpoint the record shows committed (of this subtask, and for subtask 0 of
    /// those above the parallelism), `None` when none; and the groups that hold no record at all.
    /// A group without one may never have committed (an idle subtask), or committed under a
    /// version that kept no record, or had its offsets expire (`offsets.retention.minutes`) or
    /// deleted: it proves nothing.
    /// `strict`: a fallback relies on it — a failure to list the groups of removed subtasks fails
    /// the read instead of being logged.
    pub(crate) async fn committed_through(
        &self,
        timeout: Duration,
        strict: bool,
    ) -> Result<(Option<CheckpointId>, Vec<String>)> {
        let mut subtasks = self.settled_subtasks().await?;
        tokio::task::block_in_place(|| {
            if self.subtask == 0 {
                // Groups of removed subtasks whose transactional ids expired are found by name.
                match self.listed_groups(timeout) {
                    Ok(listed) => subtasks.extend(listed),
                    Err(e) if !strict => {
                        tracing::warn!(error = %e, "Could not list the consumer groups of the sink's record (the groups of removed subtasks are read only when their transactional ids are listed).")
                    }
                    Err(e) => return Err(e),
                }
            }
            let (mut newest, mut empty) = (None, Vec::new());
            for s in subtasks {
                let g = group(self.prefix, s);
                match committed(&self.cluster, &g, self.topic, timeout)? {
                    Some(through) => newest = newest.max(through),
                    None => empty.push(g),
                }
            }
            Ok((newest, empty))
        })
    }

    /// The subtasks at or above the parallelism that have a group of the record (blocking).
    fn listed_groups(&self, timeout: Duration) -> Result<Vec<u32>> {
        let consumer = consumer(&self.cluster, &group(self.prefix, self.subtask))?;
        let what = format!(
            "the consumer groups of the Kafka sink's record ({}-progress-*)",
            self.prefix
        );
        let deadline = Instant::now() + timeout;
        let list = asking_the_coordinator_again(&what, timeout, || {
            consumer.fetch_group_list(None, deadline.saturating_duration_since(Instant::now()))
        })
        .map_err(|e| SinkError::kafka("listing the consumer groups of the record", e))?;
        let under = format!("{}-progress-", self.prefix);
        Ok(list
            .groups()
            .iter()
            .filter_map(|g| g.name().strip_prefix(&under)?.parse::<u32>().ok())
            .filter(|s| *s >= self.parallelism)
            .collect())
    }

    /// Gives this subtask's group a record when it holds none (an idle subtask, a record expired
    /// or written by no earlier version): checkpoint `restored` (0 for a fresh start), outside
    /// any transaction. At a start that restores the newest complete checkpoint nothing of a
    /// later one can have committed, so it claims no more than the truth; a later fallback past
    /// an unreadable checkpoint can then rely on it. Called once every id of the subtask is fenced,
    /// and only if the group still holds nothing.
    /// `owner_check` runs between the read and the write (the read may wait for a coordinator).
    pub(crate) async fn start_record(
        &self,
        restored: CheckpointId,
        owner_check: impl std::future::Future<Output = exactly_core::Result<()>>,
    ) -> exactly_core::Result<()> {
        let g = group(self.prefix, self.subtask);
        if tokio::task::block_in_place(|| committed(&self.cluster, &g, self.topic, FAILOVER))?.is_some() {
            return Ok(());
        }
        owner_check.await?;
        tokio::task::block_in_place(|| forget_after(&self.cluster, &g, self.topic, restored))?;
        Ok(())
    }

    /// Sets the record back to checkpoint `id` (the operator accepted replay from it); after the
    /// subtask's lingering transactions are gone, and after `owner_check` (the wait for them may
    /// be long: a run that lost its checkpoint location meanwhile must not set back the new
    /// owner's record).
    pub(crate) async fn forget_after(
        &self,
        id: CheckpointId,
        owner_check: impl std::future::Future<Output = exactly_core::Result<()>>,
    ) -> exactly_core::Result<()> {
        let subtasks = self.settled_subtasks().await?;
        owner_check.await?;
        tokio::task::block_in_place(|| {
            for s in subtasks {
                forget_after(&self.cluster, &group(self.prefix, s), self.topic, id)?;
            }
            Ok::<_, crate::error::SinkError>(())
        })?;
        Ok(())
    }
}

/// The consumer group whose offset records the commits of `subtask` of the sink with this
/// transactional-id prefix (under the prefix: the ACL on the prefix covers it).
pub(crate) fn group(prefix: &str, subtask: u32) -> String {
    format!("{prefix}-progress-{subtask}")
}

/// The partition whose offset carries the record: partition 0 of the output topic (it exists,
/// and the sink may Describe it). A sink pointed at another topic starts a record of its own:
/// what it committed into the old one is no duplicate in the new one.
fn position(topic: &str, offset: Option<CheckpointId>) -> Result<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    let offset = match offset {
        Some(id) => Offset::Offset(
            i64::try_from(id).map_err(|_| SinkError::Protocol(format!("checkpoint id {id} out of range")))?,
        ),
        None => Offset::Invalid,
    };
    tpl.add_partition_offset(topic, 0, offset)
        .map_err(|e| SinkError::kafka("the progress record's partition", e))?;
    Ok(tpl)
}

/// A consumer of `group` that never joins it: commits and reads its offsets only. Reads
/// read_uncommitted, so that a read returns the committed offset at once instead of waiting for
/// an open transaction's pending one (librdkafka asks for stable offsets under read_committed).
fn consumer(cluster: &Cluster, group: &str) -> Result<BaseConsumer> {
    cluster
        .client_config()
        .map_err(SinkError::Config)?
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_uncommitted")
        .create()
        .map_err(|e| SinkError::kafka(format!("creating a consumer of the progress group {group}"), e))
}

/// A failure of reaching `group`; a refusal says which ACL is missing.
fn group_error(group: &str, doing: String, e: rdkafka::error::KafkaError) -> SinkError {
    use rdkafka::types::RDKafkaErrorCode as C;
    if exactly_kafka_client::error_code(&e) == Some(C::GroupAuthorizationFailed) {
        let prefix = group.rsplit_once("-progress-").map_or(group, |(p, _)| p);
        return SinkError::Config(format!(
            "{doing}: the job's principal may not Read consumer group {group:?}, where the sink records what it committed: grant Read on groups prefixed {:?} (docs/security.md lists the ACLs)",
            format!("{prefix}-")
        ));
    }
    SinkError::kafka(doing, e)
}

/// The newest checkpoint `group` shows committed into `topic` (blocking): `Some(None)` when its
/// record shows none (set back to 0), `None` when it holds no record. A refusal to find the
/// group's coordinator (no ACL on the group) reaches the client only as an event, while the read itself waits for a coordinator until it times out: the read is
/// asked in short tries, the events looked at between them, so a missing ACL fails at once,
/// saying which. A coordinator that is loading or moving (after a broker restart) is asked again
/// until `timeout`.
pub(crate) fn committed(
    cluster: &Cluster,
    group: &str,
    topic: &str,
    timeout: Duration,
) -> Result<Option<Option<CheckpointId>>> {
    use rdkafka::types::RDKafkaErrorCode as C;
    let doing = || format!("reading the progress group {group}");
    let consumer = consumer(cluster, group)?;
    let asked = position(topic, None)?;
    let deadline = Instant::now() + timeout;
    // A coordinator loading or moving (after a broker restart) is waited for, as long as a
    // coordinator not found at all.
    let what = format!("the Kafka sink's record of its commits (consumer group {group})");
    let offset = asking_the_coordinator_again(&what, timeout, || {
        let read = loop {
            match consumer.committed_offsets(asked.clone(), Duration::from_secs(1)) {
                Ok(read) => break read,
                Err(e) if e.rdkafka_error_code() == Some(C::OperationTimedOut) && Instant::now() < deadline => {
                    while let Some(event) = consumer.poll(Duration::ZERO) {
                        if let Err(e) = event {
                            if e.rdkafka_error_code() == Some(C::GroupAuthorizationFailed) {
                                return Err(e);
                            }
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        };
        // The partition's own error, asked again like the call's.
        read.find_partition(topic, 0)
            .map(|elem| elem.error().map(|()| elem.offset()))
            .transpose()
    })
    .map_err(|e| group_error(group, doing(), e))?
    .ok_or_else(|| SinkError::Protocol(format!("{}: no answer for {topic}/0", doing())))?;
    Ok(match offset {
        Offset::Offset(n) if n > 0 => Some(Some(n as CheckpointId)),
        Offset::Offset(_) => Some(None),
        _ => None,
    })
}

/// Sets `group`'s record back to checkpoint `id` (0: none committed), outside any transaction
/// (blocking). Only when none of the subtask's transactions is open. Tried once, right after the
/// caller's owner check (librdkafka itself waits for a coordinator that loads or moves).
pub(crate) fn forget_after(cluster: &Cluster, group: &str, topic: &str, id: CheckpointId) -> Result<()> {
    consumer(cluster, group)?
        .commit(&position(topic, Some(id))?, CommitMode::Sync)
        .map_err(|e| {
            group_error(
                group,
                format!("setting the progress group {group} back to checkpoint {id}"),
                e,
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_sits_under_the_prefix_and_names_the_subtask() {
        assert_eq!(group("job", 3), "job-progress-3");
        // The transactional ids' parser takes none of them for one of its ids.
        assert_eq!(crate::transactional_id::parse("job", &group("job", 3)), None);
    }
}
