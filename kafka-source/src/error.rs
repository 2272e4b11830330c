//! Errors of the Kafka source.

use exactly_core::{CoreError, ErrorClass};

/// Errors of the Kafka source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// Invalid configuration; the message says what to change.
    #[error("kafka source configuration: {0}")]
    Config(String),
    /// The Kafka client failed.
    #[error("kafka: {context}: {source}")]
    Kafka {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// A record could not be deserialized and the policy is to fail.
    #[error(
        "record at {topic}/{partition}@{offset} could not be deserialized ({reason}); the policy is \
         `fail`, so the job stops here rather than restart into the same record: fix the data or \
         set on_deserialization_error to `skip` or `dead_letter`"
    )]
    Poison {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
        /// The deserializer's message.
        reason: String,
    },
    /// A topic the source is configured to read does not exist.
    #[error("topic {0:?} does not exist (the source does not create topics)")]
    UnknownTopic(String),
    /// A partition's records did not arrive where the source reads them (the job restarts from
    /// its last checkpoint rather than read them out of order).
    #[error("kafka source: {0}")]
    Routing(String),
    /// Restored state could not be decoded.
    #[error("restored source state undecodable: {0}")]
    State(String),
}

impl SourceError {
    pub(crate) fn kafka(context: impl Into<String>, source: rdkafka::error::KafkaError) -> Self {
        SourceError::Kafka {
            context: context.into(),
            source,
        }
    }
}

impl From<SourceError> for CoreError {
    fn from(e: SourceError) -> Self {
        let class = match &e {
            SourceError::Kafka { .. } | SourceError::Routing(_) => ErrorClass::Restart,
            SourceError::Config(_)
            | SourceError::Poison { .. }
            | SourceError::UnknownTopic(_)
            | SourceError::State(_) => ErrorClass::Fatal,
        };
        CoreError::operator("kafka source", class, e)
    }
}

/// Result of the Kafka source.
pub type Result<T, E = SourceError> = std::result::Result<T, E>;
