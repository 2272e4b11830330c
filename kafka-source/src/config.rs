//! Configuration of the Kafka source.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Result, SourceError};
use crate::watermarks::WatermarkConfig;

/// Where a partition without restored offset starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum StartPosition {
    /// The earliest offset.
    #[default]
    Earliest,
    /// The end (only records produced after the start).
    Latest,
    /// The first offset whose timestamp is at or after `ms` (ms since the Unix epoch).
    Timestamp {
        /// The timestamp.
        ms: i64,
    },
    /// The group's committed offsets; `reset` where the group has none.
    GroupOffsets {
        /// Fallback for partitions without a committed offset.
        #[serde(default)]
        reset: ResetPosition,
    },
    /// Given offsets (keys "topic:partition"); `reset` for partitions not listed.
    Specific {
        /// Offsets by "topic:partition".
        offsets: BTreeMap<String, i64>,
        /// Fallback for partitions not listed.
        #[serde(default)]
        reset: ResetPosition,
    },
}

impl StartPosition {
    /// Whether a partition may start at the end of its log *as it is when resolved* (`latest`,
    /// a `latest` reset, a timestamp past the last record): a moment rather than a place, which
    /// the source has a checkpoint record before it reads
    /// (`Source::reads_after_first_checkpoint`).
    pub fn may_resolve_to_the_end(&self) -> bool {
        match self {
            StartPosition::Earliest => false,
            StartPosition::Latest | StartPosition::Timestamp { .. } => true,
            StartPosition::GroupOffsets { reset } | StartPosition::Specific { reset, .. } => {
                *reset == ResetPosition::Latest
            }
        }
    }
}

/// Fallback when a start position has no offset for a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ResetPosition {
    /// Earliest offset.
    #[default]
    Earliest,
    /// Latest offset.
    Latest,
    /// Fail: the partition must have an offset.
    None,
}

/// What a restored position beyond its partition's end is taken for when the checkpoint cannot
/// say: its offsets were recorded without the topic's ID (by a build before topic IDs were
/// recorded, or from a broker before Kafka 2.8). With IDs the source knows: another ID → the topic
/// was deleted and recreated (read from its first offset); the same ID → the log was truncated
/// (resume at its end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BeyondEnd {
    /// Stop the job, saying which partition and what to set (the default: either guess may
    /// duplicate or skip records).
    #[default]
    Fail,
    /// The log was truncated (unclean leader election): resume at its end.
    Truncated,
    /// The topic was deleted and recreated: read it from its first offset.
    Recreated,
}

/// Which records are delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum IsolationLevel {
    /// Only records of committed transactions (and non-transactional ones).
    #[default]
    ReadCommitted,
    /// Everything, including records of open and aborted transactions.
    ReadUncommitted,
}

/// When offsets are committed to the consumer group (for monitoring; the checkpoint is the truth).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum OffsetCommitMode {
    /// When a checkpoint completes, the offsets it recorded.
    #[default]
    OnCheckpoints,
    /// Every `interval` (jobs without checkpointing).
    Periodic {
        /// Interval.
        #[serde(with = "humantime_serde")]
        interval: Duration,
    },
    /// Never.
    Disabled,
}

/// What happens to a record the deserializer rejects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum PoisonPolicy {
    /// Stop the job (fatal: a restart would meet the same record).
    #[default]
    Fail,
    /// Skip it, counted and logged with its coordinates.
    Skip,
    /// Write the raw record to `topic`, with headers saying where it came from and why.
    DeadLetter {
        /// The dead-letter topic.
        topic: String,
    },
}

fn default_poll_batch() -> usize {
    1024
}

/// Keys the source sets itself; refused in `client`.
pub const OWNED_KEYS: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "isolation.level",
    "auto.offset.reset",
    "enable.partition.eof",
];

/// The Kafka source's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceConfig {
    /// Bootstrap servers, `host:port[,host:port]`.
    pub bootstrap_servers: String,
    /// Topics to read (or use `topic_pattern`).
    #[serde(default)]
    pub topics: Vec<String>,
    /// A regular expression; every matching topic is read (or use `topics`).
    #[serde(default)]
    pub topic_pattern: Option<String>,
    /// Consumer group that offsets are committed to.
    pub group_id: String,
    /// Where partitions without restored offsets start.
    #[serde(default)]
    pub start: StartPosition,
    /// What a restored position beyond its partition's end is taken for when the checkpoint
    /// holds no topic ID to tell (see [`BeyondEnd`]).
    #[serde(default)]
    pub position_beyond_end: BeyondEnd,
    /// Read committed (default) or uncommitted records.
    #[serde(default)]
    pub isolation_level: IsolationLevel,
    /// When offsets are committed to the group.
    #[serde(default)]
    pub offset_commit: OffsetCommitMode,
    /// How often new partitions and topics are looked for (off when absent).
    #[serde(default, with = "humantime_serde")]
    pub discovery_interval: Option<Duration>,
    /// What happens to records that fail to deserialize.
    #[serde(default)]
    pub on_deserialization_error: PoisonPolicy,
    /// Records handed on per poll at most.
    #[serde(default = "default_poll_batch")]
    pub poll_batch: usize,
    /// Event-time watermarks (off when absent).
    #[serde(default)]
    pub watermarks: Option<WatermarkConfig>,
    /// Further librdkafka consumer properties (keys the source owns are refused).
    #[serde(default)]
    pub client: BTreeMap<String, String>,
    /// TLS and SASL (Kafka's `security.protocol`, `sasl.*`, `ssl.*`): every client the source
    /// opens uses them (the consumer, the dead-letter producer). Plaintext by default.
    #[serde(default)]
    pub security: exactly_kafka_client::KafkaSecurity,
}

impl KafkaSourceConfig {
    /// A configuration reading `topics` from `bootstrap_servers`, committing to `group_id`.
    pub fn new(bootstrap_servers: impl Into<String>, topics: Vec<String>, group_id: impl Into<String>) -> Self {
        KafkaSourceConfig {
            bootstrap_servers: bootstrap_servers.into(),
            topics,
            topic_pattern: None,
            group_id: group_id.into(),
            start: StartPosition::default(),
            position_beyond_end: BeyondEnd::default(),
            isolation_level: IsolationLevel::default(),
            offset_commit: OffsetCommitMode::default(),
            discovery_interval: None,
            on_deserialization_error: PoisonPolicy::default(),
            poll_batch: default_poll_batch(),
            watermarks: None,
            client: BTreeMap::new(),
            security: exactly_kafka_client::KafkaSecurity::default(),
        }
    }

    /// Checks the configuration; the error says what to change.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(SourceError::Config(m));
        if self.bootstrap_servers.trim().is_empty() {
            return bad("bootstrap_servers must not be empty".into());
        }
        match (self.topics.is_empty(), &self.topic_pattern) {
            (true, None) => return bad("set `topics` (a list) or `topic_pattern` (a regex)".into()),
            (false, Some(_)) => return bad("set either `topics` or `topic_pattern`, not both".into()),
            (_, Some(p)) => {
                if let Err(e) = regex::Regex::new(p) {
                    return bad(format!("topic_pattern {p:?} is not a valid regex: {e}"));
                }
            }
            _ => {}
        }
        if self.group_id.trim().is_empty() {
            return bad("group_id must not be empty".into());
        }
        if self.poll_batch == 0 {
            return bad("poll_batch must be at least 1".into());
        }
        if let StartPosition::Specific { offsets, .. } = &self.start {
            for (key, offset) in offsets {
                if parse_topic_partition(key).is_none() {
                    return bad(format!("start.offsets key {key:?} must look like \"topic:partition\""));
                }
                if *offset < 0 {
                    return bad(format!(
                        "start.offsets {key:?} = {offset}: an offset is 0 or more (for either end of a partition, leave it out and set start.reset)"
                    ));
                }
            }
        }
        if let OffsetCommitMode::Periodic { interval } = self.offset_commit {
            if interval.is_zero() {
                return bad("offset_commit.interval must be greater than 0".into());
            }
        }
        if let PoisonPolicy::DeadLetter { topic } = &self.on_deserialization_error {
            if topic.is_empty() {
                return bad("on_deserialization_error.topic must name the dead-letter topic".into());
            }
        }
        if let Some(w) = &self.watermarks {
            if w.idle_timeout.is_some_and(|t| t.is_zero()) {
                return bad("watermarks.idle_timeout must be greater than 0 (or left out)".into());
            }
        }
        for key in self.client.keys() {
            if OWNED_KEYS.contains(&key.as_str()) {
                return bad(format!(
                    "client.{key} is set by the source itself (use the dedicated setting or leave it out)"
                ));
            }
            if let Some(why) = exactly_kafka_client::refused_client_key(key) {
                return bad(why);
            }
        }
        self.security.validate().map_err(SourceError::Config)?;
        Ok(())
    }
}

/// Parses "topic:partition".
pub(crate) fn parse_topic_partition(key: &str) -> Option<(&str, i32)> {
    let (topic, p) = key.rsplit_once(':')?;
    Some((topic, p.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> KafkaSourceConfig {
        KafkaSourceConfig::new("127.0.0.1:9092", vec!["in".into()], "g")
    }

    #[test]
    fn owned_client_keys_are_refused_by_name() {
        let mut c = base();
        c.client.insert("enable.auto.commit".into(), "true".into());
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("client.enable.auto.commit"), "{err}");
    }

    #[test]
    fn topics_or_pattern_not_both() {
        let mut c = base();
        c.topic_pattern = Some("in-.*".into());
        assert!(c.validate().unwrap_err().to_string().contains("not both"));
        c.topics.clear();
        c.validate().unwrap();
        c.topic_pattern = Some("(".into());
        assert!(c.validate().unwrap_err().to_string().contains("not a valid regex"));
    }

    #[test]
    fn parses_from_toml_with_human_durations() {
        let c: KafkaSourceConfig = toml::from_str(
            r#"
            bootstrap_servers = "127.0.0.1:9092"
            topics = ["a", "b"]
            group_id = "g"
            discovery_interval = "10s"
            start = { type = "timestamp", ms = 1700000000000 }
            position_beyond_end = "recreated"
            on_deserialization_error = { type = "dead_letter", topic = "dlq" }
            "#,
        )
        .unwrap();
        assert_eq!(c.discovery_interval, Some(Duration::from_secs(10)));
        assert_eq!(c.start, StartPosition::Timestamp { ms: 1_700_000_000_000 });
        assert_eq!(c.position_beyond_end, BeyondEnd::Recreated);
        c.validate().unwrap();
        let err = toml::from_str::<KafkaSourceConfig>("bootstrap_servers = \"x\"\ngroup_id = \"g\"\ntopicz = []")
            .unwrap_err()
            .to_string();
        assert!(err.contains("topicz"), "{err}");
    }

    #[test]
    fn specific_offsets_keys_are_checked() {
        let mut c = base();
        c.start = StartPosition::Specific {
            offsets: [("in-0".to_owned(), 5)].into(),
            reset: ResetPosition::None,
        };
        assert!(c.validate().unwrap_err().to_string().contains("topic:partition"));
        c.start = StartPosition::Specific {
            offsets: [("in:0".to_owned(), -2)].into(),
            reset: ResetPosition::None,
        };
        assert!(c.validate().unwrap_err().to_string().contains("0 or more"));
        assert_eq!(parse_topic_partition("a:b:3"), Some(("a:b", 3)));
    }
}
