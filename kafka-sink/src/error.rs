//! Errors of the Kafka sink.

use exactly_core::{CoreError, ErrorClass};

/// Errors of the Kafka sink.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// Invalid configuration; the message says what to change.
    #[error("kafka sink configuration: {0}")]
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
    /// A Kafka protocol request failed (transport or an error code).
    #[error("kafka protocol: {0}")]
    Protocol(String),
    /// A record could not be delivered.
    #[error("delivery to {topic} failed: {reason}")]
    Delivery {
        /// Topic.
        topic: String,
        /// The broker's or client's reason.
        reason: String,
    },
    /// No bootstrap address accepts connections (each named, with what is wrong with it).
    #[error("kafka: cannot reach any of bootstrap_servers: {0}")]
    Unreachable(String),
    /// The producer was fenced by a newer one with the same transactional id.
    #[error(
        "producer {0} was fenced by a newer instance (another job or a zombie uses this transactional id prefix?)"
    )]
    Fenced(String),
}

impl SinkError {
    pub(crate) fn kafka(context: impl Into<String>, source: rdkafka::error::KafkaError) -> Self {
        SinkError::Kafka {
            context: context.into(),
            source,
        }
    }

    fn class(&self) -> ErrorClass {
        match self {
            SinkError::Config(_) => ErrorClass::Fatal,
            SinkError::Kafka { source, .. } if authorization(source) => ErrorClass::Fatal,
            // The cluster cannot be reached now: an outage, for a job that ran before.
            SinkError::Kafka { source, .. } if exactly_kafka_client::unreachable(source) => ErrorClass::Retriable,
            SinkError::Unreachable(_) => ErrorClass::Retriable,
            _ => ErrorClass::Restart,
        }
    }
}

/// A missing ACL or refused credentials: a restart cannot fix it (the message carries the broker's
/// error name, e.g. TransactionalIdAuthorizationFailed, and the context says for what).
fn authorization(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        exactly_kafka_client::error_code(e),
        Some(
            C::TopicAuthorizationFailed
                | C::GroupAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::TransactionalIdAuthorizationFailed
                | C::SaslAuthenticationFailed
                | C::Authentication
        )
    )
}

impl From<SinkError> for CoreError {
    fn from(e: SinkError) -> Self {
        let class = e.class();
        CoreError::operator("kafka sink", class, e)
    }
}

/// Result of the Kafka sink.
pub type Result<T, E = SinkError> = std::result::Result<T, E>;
