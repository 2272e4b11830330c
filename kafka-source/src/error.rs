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
    /// No bootstrap address accepts connections (each named, with what is wrong with it).
    #[error("kafka: cannot reach any of bootstrap_servers: {0}")]
    Unreachable(String),
    /// A topic the source is configured to read does not exist.
    #[error("topic {0:?} does not exist (the source does not create topics)")]
    UnknownTopic(String),
    /// A partition's records did not arrive where the source reads them (the job restarts from
    /// its last checkpoint rather than read them out of order).
    #[error("kafka source: {0}")]
    Routing(String),
    /// Fetching failed in a way retrying cannot cure (an unsupported codec, missing authorization
    /// or credentials): the job stops with it instead of stalling.
    #[error("kafka source: fetching {what} failed: {code} ({fix})")]
    Fetch {
        /// The partition ("topic/partition") or "the cluster".
        what: String,
        /// librdkafka's error.
        code: rdkafka::types::RDKafkaErrorCode,
        /// What to do about it.
        fix: &'static str,
    },
    /// A partition's position left the log's range while the source read it (retention deleted
    /// records it had not read yet, or the partition was truncated or recreated): the attempt
    /// restarts, and the restored offset is checked against the log's range, loudly.
    #[error("kafka source: the position {offset} of {what} is outside the partition's log (records deleted by retention before the job read them, or the partition truncated or recreated); restarting from the last checkpoint, whose restore checks the position against the log's range and the topic's ID and reports what it finds")]
    OutOfRange {
        /// "topic/partition".
        what: String,
        /// The position.
        offset: i64,
    },
    /// A restored position is beyond its partition's end and the checkpoint holds no topic ID to
    /// tell a truncated log (resume at its end) from a recreated topic (read it from its first
    /// offset); `position_beyond_end` is `fail`.
    #[error("kafka source: the restored position {offset} of {what} is beyond the partition's end {end}, and the checkpoint holds no topic ID to tell whether the log was truncated (unclean leader election: resume at the end) or the topic deleted and recreated (read it from its first offset). Check the topic, then set the source's position_beyond_end = \"truncated\" or \"recreated\" (checkpoints taken from now on record the topic's ID)")]
    BeyondEnd {
        /// "topic/partition".
        what: String,
        /// The restored position.
        offset: i64,
        /// The partition's end.
        end: i64,
    },
    /// A topic was deleted and recreated under the same name while the source read it: the
    /// attempt restarts from the last checkpoint (recorded with the old topic's ID), whose
    /// restore reads the new topic from its first offset; without checkpointing, from the start
    /// position.
    #[error("kafka source: topic {topic:?} was deleted and recreated while the job read it (topic ID {was}, now {now}); the Kafka client reads the new topic on from the old position, skipping its first records, so the attempt restarts from the last checkpoint, which reads the new topic from its first offset (without checkpointing: from the start position)")]
    Recreated {
        /// The topic.
        topic: String,
        /// Its ID when the source started reading it.
        was: String,
        /// Its ID now.
        now: String,
    },
    /// Dead letters could not be written: the checkpoint fails rather than complete past them.
    #[error("kafka source: {failed} dead letter(s) could not be written to {topic:?} (first error: {first}); the checkpoint fails and the job restarts from the previous one")]
    DeadLetter {
        /// The dead-letter topic.
        topic: String,
        /// How many failed since the last checkpoint.
        failed: u64,
        /// The first delivery error.
        first: String,
    },
    /// Restored state could not be decoded.
    #[error("restored source state undecodable: {0}")]
    State(String),
    /// A restored position beyond the end the first answer gave, and no majority of the brokers'
    /// own views on who leads the partition (a network partition, an election in progress).
    #[error("kafka source: the restored position {offset} of {what} is beyond the end the first broker asked gives, and the brokers' own views of who leads the partition disagree with no majority ({views}): a network partition or a leader election in progress; asked again at the next attempt rather than guessed")]
    ViewsDisagree {
        /// `topic/partition`.
        what: String,
        /// The restored position.
        offset: i64,
        /// Each broker's view: its address, the leader it names, the end it gives.
        views: String,
    },
}

impl SourceError {
    pub(crate) fn kafka(context: impl Into<String>, source: rdkafka::error::KafkaError) -> Self {
        SourceError::Kafka {
            context: context.into(),
            source,
        }
    }
}

/// A fetch or consumer error the client will not get past by retrying: `Some` with the error to
/// fail with, `None` for the transient ones (transport, leader changes, brokers down, and unknown
/// topic or partition, which a fetch right after a topic's creation can report and librdkafka
/// retries after refreshing its metadata), which librdkafka retries itself.
pub(crate) fn unretried(code: rdkafka::types::RDKafkaErrorCode, what: String) -> Option<SourceError> {
    use rdkafka::types::RDKafkaErrorCode as C;
    let fix = match code {
        C::NotImplemented | C::UnsupportedCompressionType | C::BadCompression => {
            "the input uses a compression codec this build cannot read; exactly reads gzip, snappy, lz4 and zstd"
        }
        C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed => {
            "grant the source's principal Read and Describe on the topic"
        }
        C::Authentication | C::SaslAuthenticationFailed => "check the source's credentials",
        _ => return None,
    };
    Some(SourceError::Fetch { what, code, fix })
}

impl From<SourceError> for CoreError {
    fn from(e: SourceError) -> Self {
        let class = match &e {
            // The cluster cannot be reached now: an outage, for a job that ran before.
            SourceError::Unreachable(_) | SourceError::ViewsDisagree { .. } => ErrorClass::Retriable,
            SourceError::Kafka { source, .. } if exactly_kafka_client::unreachable(source) => ErrorClass::Retriable,
            SourceError::Kafka { .. }
            | SourceError::Routing(_)
            | SourceError::OutOfRange { .. }
            | SourceError::Recreated { .. }
            | SourceError::DeadLetter { .. } => ErrorClass::Restart,
            SourceError::Config(_)
            | SourceError::Poison { .. }
            | SourceError::UnknownTopic(_)
            | SourceError::Fetch { .. }
            | SourceError::BeyondEnd { .. }
            | SourceError::State(_) => ErrorClass::Fatal,
        };
        CoreError::operator("kafka source", class, e)
    }
}

/// Result of the Kafka source.
pub type Result<T, E = SourceError> = std::result::Result<T, E>;
