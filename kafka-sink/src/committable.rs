//! What a pre-committed Kafka transaction leaves in the checkpoint.

use serde::{Deserialize, Serialize};

/// One record the transaction wrote, used after a restart to tell "already committed" from
/// "aborted" when the coordinator's answer is ambiguous (a read_committed reader sees it or not).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// A pre-committed transaction: enough to commit it from any process (the coordinator accepts
/// EndTxn from whoever knows id, producer id and epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaCommittable {
    /// Format version.
    pub version: u32,
    /// The transactional id.
    pub transactional_id: String,
    /// The producer id, as the broker reported it at pre-commit.
    pub producer_id: i64,
    /// The producer epoch, as the broker reported it at pre-commit.
    pub producer_epoch: i16,
    /// When the transaction started (the coordinator's clock, ms): tells this transaction from a
    /// later one of the same producer and epoch.
    pub txn_start_ms: i64,
    /// The checkpoint whose barrier closed the transaction.
    pub checkpoint_id: u64,
    /// A record of the transaction.
    pub probe: Option<Probe>,
}

/// Version written by this build.
pub const COMMITTABLE_VERSION: u32 = 1;

impl KafkaCommittable {
    /// Whether the transaction a coordinator reports under this id (producer id, epoch, start
    /// time) is this pre-committed one. With transaction version 1 the epoch is stable across
    /// the transactions of one producer session, so the start time is what tells them apart.
    /// The one definition of "the same transaction" (recovery, lingering clean-up, `exactly txn`).
    pub fn is_same_transaction(&self, producer_id: i64, producer_epoch: i16, start_time_ms: i64) -> bool {
        self.producer_id == producer_id && self.producer_epoch == producer_epoch && self.txn_start_ms == start_time_ms
    }
}

impl std::fmt::Display for KafkaCommittable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "transaction {} (producer {}, epoch {}) of checkpoint {}",
            self.transactional_id, self.producer_id, self.producer_epoch, self.checkpoint_id
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reads_the_version_1_fixture() {
        let c = KafkaCommittable {
            version: COMMITTABLE_VERSION,
            transactional_id: "job-0-1".into(),
            producer_id: 17,
            producer_epoch: 3,
            txn_start_ms: 1_700_000_000_000,
            checkpoint_id: 42,
            probe: Some(Probe {
                topic: "out".into(),
                partition: 2,
                offset: 99,
            }),
        };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<KafkaCommittable>(&json).unwrap(), c);
        let v1 = r#"{"version":1,"transactional_id":"job-0-1","producer_id":17,"producer_epoch":3,"txn_start_ms":1700000000000,"checkpoint_id":42,"probe":{"topic":"out","partition":2,"offset":99}}"#;
        assert_eq!(serde_json::from_str::<KafkaCommittable>(v1).unwrap(), c);
    }
}
