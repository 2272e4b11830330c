//! `exactly-kafka-sink`: a Kafka sink with none, at-least-once or exactly-once delivery.
//!
//! Exactly-once uses Kafka transactions from a small pool of transactional ids per subtask
//! (`{prefix}-{subtask}-{slot}`), driven by `exactly-twophase`:
//! - at barrier N the open transaction is flushed, and its producer id and epoch are read from
//!   the broker (DescribeTransactions) into the committable stored in checkpoint N;
//! - when N completes, the producer that holds it commits it; after a restart, the restored
//!   committables are committed through the Kafka protocol (EndTxn with the recorded producer id
//!   and epoch, after checking it is still that transaction) *before* any producer initialises
//!   those ids, because `init_transactions` would abort them;
//! - then transactions the sink owns and no checkpoint needs are aborted (found by listing, not
//!   probing), and every id of the pool is initialised, which fences zombies;
//! - a transaction the broker aborted before its commit is reported as data loss, never success;
//! - when every producer of the pool waits for a checkpoint, the next checkpoint is declined
//!   (backpressure) instead of failing the job;
//! - each transaction also commits its checkpoint's id as an offset of the consumer group
//!   `{prefix}-progress-{subtask}`: the sink's record of what it committed, read before a restore
//!   (a restore behind it is refused; an unreadable newest checkpoint is restored past only when
//!   it shows none of that checkpoint's transactions committed).
//!
//! Consumers of the output must read with `isolation.level=read_committed`.

pub mod admin;
mod broker;
mod committable;
mod config;
mod error;
mod exactly_once;
mod partitioner;
mod pool;
mod progress;
mod protocol;
mod recovery;
mod transactional_id;
mod writer;

pub use committable::{KafkaCommittable, Probe, COMMITTABLE_VERSION};
pub use config::{DeliveryGuarantee, KafkaSinkConfig, PartitionerKind, DEFAULT_MAX_POOL_SIZE, OWNED_KEYS};
pub use error::{Result, SinkError};
pub use exactly_once::{KafkaTransaction, TransactionalKafkaSink};
pub use partitioner::{murmur2, to_positive, FixedPartitioner, KeyHashPartitioner, Partitioner, RoundRobinPartitioner};
pub use protocol::{END_TXN_TV2_VERSION, END_TXN_VERSION};
pub use transactional_id::{parse as parse_transactional_id, transactional_id};
pub use writer::{KafkaSink, KafkaWriter};

/// A record to write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerRecord {
    /// Key bytes (partitioning uses them).
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Timestamp (ms since the Unix epoch); the producer's clock when absent.
    pub timestamp: Option<i64>,
    /// Headers, written through in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl ProducerRecord {
    /// A record with a value only.
    pub fn value(value: impl Into<Vec<u8>>) -> Self {
        ProducerRecord {
            value: Some(value.into()),
            ..Default::default()
        }
    }

    /// A record with key and value.
    pub fn keyed(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        ProducerRecord {
            key: Some(key.into()),
            value: Some(value.into()),
            ..Default::default()
        }
    }
}
