//! `exactly-kafka-source`: a Kafka source whose partition offsets live in checkpoints.
//!
//! Guarantees and invariants:
//! - the checkpoint holds the next offset to read for every partition (union list state); a
//!   restore resumes exactly there, whatever the configured start position;
//! - offsets are committed to the consumer group only after the checkpoint that recorded them
//!   completed, and only for monitoring: a failed commit is a warning and a metric;
//! - partitions are owned by a deterministic rule of (topic, partition, parallelism), so a restore
//!   with another parallelism redistributes them with nothing lost or read twice;
//! - records are read `read_committed` unless configured otherwise;
//! - a record that does not deserialize fails the job for good (`fail`: a restart would meet it
//!   again), or is skipped or dead-lettered with its coordinates.

mod assignment;
mod config;
mod dead_letters;
mod deser;
mod error;
mod fetch;
mod metrics;
mod offsets;
mod reader;
mod watermarks;

pub use assignment::subtask_for;
pub use config::{
    BeyondEnd, IsolationLevel, KafkaSourceConfig, OffsetCommitMode, PoisonPolicy, ResetPosition, StartPosition,
    OWNED_KEYS,
};
pub use deser::{Deserializer, Json, KafkaRecord, RawBytes, Utf8};
pub use error::{Result, SourceError};
pub use metrics::{KafkaSourceMetrics, PartitionMetrics};
pub use offsets::{PendingOffsets, TopicPartition, MAX_PENDING};
pub use reader::{KafkaSource, SourceContext};
pub use watermarks::WatermarkConfig;
