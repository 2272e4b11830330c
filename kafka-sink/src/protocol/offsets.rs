//! Offsets committed inside a transaction (what librdkafka's `send_offsets_to_transaction` does,
//! through this client so that a coordinator that stalls costs a bounded wait, as every other
//! request here): AddOffsetsToTxn at the transaction's coordinator adds the group's offsets
//! partition to the transaction, then TxnOffsetCommit at the group's coordinator writes the
//! offsets, pending until the transaction ends. AddOffsetsToTxn is sent again freely (adding a
//! group twice changes nothing); TxnOffsetCommit only after an answer that the coordinator moved
//! (a copy whose answer was lost could still land after the next checkpoint's offset and replace
//! it: the pre-commit fails instead).

use kafka_protocol::messages::{
    add_offsets_to_txn_request::AddOffsetsToTxnRequest,
    txn_offset_commit_request::{TxnOffsetCommitRequest, TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic},
    GroupId, ProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;

use super::{code, Coordinates, Resend, Wire};
use crate::error::{Result, SinkError};

/// Versions of transaction version 1 (the family librdkafka's producers speak: version 4 of
/// AddOffsetsToTxn and 5 of TxnOffsetCommit belong to transaction version 2).
pub(crate) const ADD_OFFSETS_TO_TXN_VERSION: i16 = 3;
pub(crate) const TXN_OFFSET_COMMIT_VERSION: i16 = 3;

/// The output topic may not be read (TxnOffsetCommit needs Read on it): no ACL.
const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
/// The group may not be read: no ACL.
const GROUP_AUTHORIZATION_FAILED: i16 = 30;
/// The transactional id may not be written: no ACL.
const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;

/// An offset to commit in a transaction.
pub(crate) struct TxnOffset<'a> {
    pub(crate) transactional_id: &'a str,
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    pub(crate) group: &'a str,
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
}

fn refused(what: &str, group: &str, error: i16) -> SinkError {
    if error == GROUP_AUTHORIZATION_FAILED {
        return SinkError::Config(format!(
            "{what}: the job's principal may not Read consumer group {group:?}, where the sink records what it committed: grant Read on groups prefixed with the transactional-id prefix and a dash (docs/security.md lists the ACLs)"
        ));
    }
    if error == TOPIC_AUTHORIZATION_FAILED || error == TRANSACTIONAL_ID_AUTHORIZATION_FAILED {
        return SinkError::Config(format!(
            "{what} for group {group:?}: the broker refused it for a missing ACL (error code {error}: Read on the output topic, or Write on the transactional-id prefix; docs/security.md lists the ACLs)"
        ));
    }
    SinkError::Protocol(format!("{what} for group {group}: error code {error}"))
}

impl Wire {
    /// Commits `o` in the open transaction of its producer (id and epoch): the offset becomes
    /// the group's when the transaction commits, and is dropped when it aborts.
    pub(crate) async fn commit_offset_in_transaction(&self, o: &TxnOffset<'_>) -> Result<()> {
        let add = AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(o.transactional_id.to_owned())))
            .with_producer_id(ProducerId(o.producer_id))
            .with_producer_epoch(o.producer_epoch)
            .with_group_id(GroupId(StrBytes::from_string(o.group.to_owned())));
        let added = self
            .at_coordinator_of(
                Coordinates::Transaction,
                o.transactional_id,
                "AddOffsetsToTxn",
                &add,
                ADD_OFFSETS_TO_TXN_VERSION,
                // Adding the group twice changes nothing.
                Resend::Always,
                |r| r.error_code,
            )
            .await?;
        if added.error_code != code::NONE {
            return Err(refused("AddOffsetsToTxn", o.group, added.error_code));
        }
        let partition = TxnOffsetCommitRequestPartition::default()
            .with_partition_index(o.partition)
            .with_committed_offset(o.offset)
            .with_committed_leader_epoch(-1)
            .with_committed_metadata(Some(StrBytes::from_static_str("exactly")));
        let commit = TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(o.transactional_id.to_owned())))
            .with_group_id(GroupId(StrBytes::from_string(o.group.to_owned())))
            .with_producer_id(ProducerId(o.producer_id))
            .with_producer_epoch(o.producer_epoch)
            // No member, no generation: a group nobody joins takes such commits.
            .with_generation_id(-1)
            .with_member_id(StrBytes::from_static_str(""))
            .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_string(o.topic.to_owned())))
                .with_partitions(vec![partition])]);
        let first_error = |r: &kafka_protocol::messages::TxnOffsetCommitResponse| {
            r.topics
                .iter()
                .flat_map(|t| t.partitions.iter())
                .map(|p| p.error_code)
                .find(|c| *c != code::NONE)
                .unwrap_or(code::NONE)
        };
        let written = self
            .at_coordinator_of(
                Coordinates::Group,
                o.group,
                "TxnOffsetCommit",
                &commit,
                TXN_OFFSET_COMMIT_VERSION,
                // Not after a lost answer: a copy landing late would replace a later offset.
                // The pre-commit fails instead, and the restart's producers fence this epoch.
                Resend::AfterRefusal,
                first_error,
            )
            .await?;
        match first_error(&written) {
            code::NONE if !written.topics.is_empty() => Ok(()),
            code::NONE => Err(SinkError::Protocol(format!(
                "TxnOffsetCommit for group {}: an empty answer",
                o.group
            ))),
            error => Err(refused("TxnOffsetCommit", o.group, error)),
        }
    }
}
