//! Configuration of the Kafka sink.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Result, SinkError};

fn default_pool_size() -> usize {
    3
}

/// Producers a subtask's pool may grow to while checkpoints fail (see `max_pool_size`).
pub const DEFAULT_MAX_POOL_SIZE: usize = 32;

fn default_max_pool_size() -> usize {
    DEFAULT_MAX_POOL_SIZE
}

fn default_transaction_timeout() -> Duration {
    Duration::from_secs(300)
}

fn default_flush_timeout() -> Duration {
    Duration::from_secs(60)
}

/// What the sink guarantees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum DeliveryGuarantee {
    /// Fire and forget: records may be lost or duplicated on failure.
    None,
    /// Flush at every checkpoint; a delivery error fails the checkpoint. Replays duplicate.
    AtLeastOnce,
    /// Kafka transactions committed when checkpoints complete; consumers must read
    /// `read_committed`.
    ExactlyOnce {
        /// Prefix of transactional ids: `{prefix}-{subtask}-{slot}`. Unique per job and sink;
        /// keep it across restarts (recovery and lingering-transaction cleanup use it).
        transactional_id_prefix: String,
        /// Transactional ids (producers) per subtask, reused round robin. At least 2: one open
        /// while another waits for its checkpoint to complete.
        #[serde(default = "default_pool_size")]
        pool_size: usize,
        /// How far the pool may grow while checkpoints fail (32 by default): a failed
        /// checkpoint's transaction stays prepared until the next checkpoint completes, so each
        /// failed checkpoint in a row holds one more producer (Flink's KafkaSink grows without a
        /// bound). Beyond this the sink declines, and the subtask restarts from the latest
        /// completed checkpoint. Extra producers are closed once their transactions commit.
        #[serde(default = "default_max_pool_size")]
        max_pool_size: usize,
        /// `transaction.timeout.ms`: must exceed checkpoint interval + checkpoint timeout (+ the
        /// time a restart takes) and not exceed the broker's `transaction.max.timeout.ms`.
        #[serde(default = "default_transaction_timeout", with = "humantime_serde")]
        transaction_timeout: Duration,
        /// After a restart, a restored transaction that is no longer open is settled by one of
        /// its records (seen by read_committed readers: committed; skipped: aborted, data lost).
        /// When retention or compaction has removed that record nobody can tell, and the sink
        /// stops the job rather than guess. After checking the output of the checkpoints the
        /// error names, set this to the highest of them to continue as if they committed;
        /// later checkpoints are still checked. Unset by default.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        accept_unknown_outcome_up_to: Option<u64>,
    },
}

/// How records are spread over partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PartitionerKind {
    /// Java client compatible murmur2 of the key (round robin for records without key).
    #[default]
    KeyHash,
    /// Subtask i writes partition i % partitions.
    Fixed,
    /// Partitions in turn.
    RoundRobin,
}

/// Keys the sink sets itself; refused in `client`.
pub const OWNED_KEYS: &[&str] = &[
    "bootstrap.servers",
    "transactional.id",
    "transaction.timeout.ms",
    "enable.idempotence",
];

/// The Kafka sink's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// Bootstrap servers.
    pub bootstrap_servers: String,
    /// The topic written to.
    pub topic: String,
    /// None, at-least-once or exactly-once.
    pub delivery: DeliveryGuarantee,
    /// Partition choice.
    #[serde(default)]
    pub partitioner: PartitionerKind,
    /// Longest wait for outstanding records at a checkpoint.
    #[serde(default = "default_flush_timeout", with = "humantime_serde")]
    pub flush_timeout: Duration,
    /// Further librdkafka producer properties (keys the sink owns are refused).
    #[serde(default)]
    pub client: BTreeMap<String, String>,
    /// TLS and SASL (Kafka's `security.protocol`, `sasl.*`, `ssl.*`): every client the sink
    /// opens uses them — producers, metadata and admin clients, the read_committed probe, and the
    /// wire-protocol client that commits after a restart. Plaintext by default.
    #[serde(default)]
    pub security: exactly_kafka_client::KafkaSecurity,
}

impl KafkaSinkConfig {
    /// Where and how the sink reaches Kafka.
    pub fn cluster(&self) -> exactly_kafka_client::Cluster {
        exactly_kafka_client::Cluster::new(self.bootstrap_servers.clone(), self.security.clone())
    }

    /// A sink writing to `topic` with `delivery`.
    pub fn new(bootstrap_servers: impl Into<String>, topic: impl Into<String>, delivery: DeliveryGuarantee) -> Self {
        KafkaSinkConfig {
            bootstrap_servers: bootstrap_servers.into(),
            topic: topic.into(),
            delivery,
            partitioner: PartitionerKind::default(),
            flush_timeout: default_flush_timeout(),
            client: BTreeMap::new(),
            security: exactly_kafka_client::KafkaSecurity::default(),
        }
    }

    /// Checks the configuration on its own; the error says what to change.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(SinkError::Config(m));
        if self.bootstrap_servers.trim().is_empty() {
            return bad("bootstrap_servers must not be empty".into());
        }
        if self.topic.is_empty() {
            return bad("topic must not be empty".into());
        }
        for key in self.client.keys() {
            if OWNED_KEYS.contains(&key.as_str()) {
                return bad(format!(
                    "client.{key} is set by the sink itself (use the delivery settings)"
                ));
            }
            if let Some(why) = exactly_kafka_client::refused_client_key(key) {
                return bad(why);
            }
        }
        // Exactly-once holds as many records as the producer queues while a transaction flushes:
        // both must read the same number (librdkafka reads "0x10", "010" or "40_000" as 16, 8 and
        // 40, the sink would not). "0" is librdkafka's "no limit by count" (the sink then holds
        // nothing and waits for each flush).
        if let (Some(v), DeliveryGuarantee::ExactlyOnce { .. }) =
            (self.client.get(crate::pool::QUEUE_CAP_KEY), &self.delivery)
        {
            let v = v.trim();
            // No leading zero either: librdkafka would read "010" as octal.
            let plain = v == "0" || (!v.is_empty() && !v.starts_with('0') && v.bytes().all(|b| b.is_ascii_digit()));
            if !plain || v.parse::<i32>().is_err() {
                return bad(format!(
                    "client.{} must be a whole number of records from 0 (no limit) to {} (got {v:?})",
                    crate::pool::QUEUE_CAP_KEY,
                    i32::MAX
                ));
            }
        }
        // A record larger than the queue's bytes could never be queued: the sink would wait for
        // room forever.
        let bytes = |key: &str| self.client.get(key).and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(max) = bytes("message.max.bytes") {
            let queue = bytes(crate::pool::QUEUE_KBYTES_KEY).unwrap_or(crate::pool::QUEUE_KBYTES as u64) * 1024;
            if max > queue {
                return bad(format!(
                    "client.message.max.bytes ({max}) exceeds the producer queue's {queue} bytes: raise client.{} (KiB) to at least {}",
                    crate::pool::QUEUE_KBYTES_KEY,
                    max.div_ceil(1024)
                ));
            }
        }
        self.security.validate().map_err(SinkError::Config)?;
        if let DeliveryGuarantee::ExactlyOnce {
            transactional_id_prefix,
            pool_size,
            max_pool_size,
            transaction_timeout,
            ..
        } = &self.delivery
        {
            if max_pool_size < pool_size {
                return bad(format!(
                    "delivery.max_pool_size ({max_pool_size}) must be at least delivery.pool_size ({pool_size})"
                ));
            }
            if transactional_id_prefix.is_empty() {
                return bad("delivery.transactional_id_prefix must not be empty for exactly_once".into());
            }
            if *pool_size < 2 {
                return bad(format!(
                    "delivery.pool_size ({pool_size}) must be at least 2: one transaction open while another waits for its checkpoint"
                ));
            }
            if *transaction_timeout < Duration::from_secs(1) {
                return bad(format!(
                    "delivery.transaction_timeout ({}) must be at least 1s (librdkafka refuses less)",
                    humantime::format_duration(*transaction_timeout)
                ));
            }
        }
        Ok(())
    }

    /// Checks the transaction timeout against the job's checkpointing and restart strategy: a
    /// transaction opens at the start of a checkpoint interval and must outlive the checkpoint
    /// that commits it and, after a crash, the wait before the restart that commits it
    /// (`restart_delay`: `RestartStrategy::longest_delay`) plus that restart's start-up.
    pub fn validate_against_checkpoints(
        &self,
        interval: Duration,
        timeout: Duration,
        restart_delay: Duration,
    ) -> Result<()> {
        if let DeliveryGuarantee::ExactlyOnce {
            transaction_timeout, ..
        } = &self.delivery
        {
            let needed = interval + timeout + restart_delay + exactly_twophase::RESTART_ALLOWANCE;
            if *transaction_timeout <= needed {
                return Err(SinkError::Config(format!(
                    "delivery.transaction_timeout ({}) must exceed checkpoint interval + checkpoint timeout + the longest restart delay + {} for the restart itself ({} + {} + {} + {} = {}); raise it (it may not exceed the broker's transaction.max.timeout.ms, 15m by default), or lower the checkpoint timeout or the restart delay",
                    humantime::format_duration(*transaction_timeout),
                    humantime::format_duration(exactly_twophase::RESTART_ALLOWANCE),
                    humantime::format_duration(interval),
                    humantime::format_duration(timeout),
                    humantime::format_duration(restart_delay),
                    humantime::format_duration(exactly_twophase::RESTART_ALLOWANCE),
                    humantime::format_duration(needed),
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eo(timeout: Duration) -> KafkaSinkConfig {
        KafkaSinkConfig::new(
            "127.0.0.1:9092",
            "out",
            DeliveryGuarantee::ExactlyOnce {
                transactional_id_prefix: "job".into(),
                pool_size: 3,
                max_pool_size: DEFAULT_MAX_POOL_SIZE,
                transaction_timeout: timeout,
                accept_unknown_outcome_up_to: None,
            },
        )
    }

    /// An exactly-once configuration with `key` = `value` among its client properties.
    fn eo_with(key: &str, value: &str) -> KafkaSinkConfig {
        let mut c = eo(Duration::from_secs(60));
        c.client.insert(key.into(), value.into());
        c
    }

    #[test]
    fn timeout_must_exceed_checkpointing() {
        let c = eo(Duration::from_secs(60));
        c.validate().unwrap();
        let err = c
            .validate_against_checkpoints(Duration::from_secs(30), Duration::from_secs(30), Duration::ZERO)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("must exceed checkpoint interval + checkpoint timeout + the longest restart delay"),
            "{err}"
        );
        c.validate_against_checkpoints(Duration::from_secs(10), Duration::from_secs(30), Duration::from_secs(1))
            .unwrap();
        // The restart strategy's delay counts: a one-minute back-off outlives a one-minute timeout.
        assert!(c
            .validate_against_checkpoints(Duration::from_secs(1), Duration::from_secs(10), Duration::from_secs(60))
            .is_err());
    }

    #[test]
    fn a_timeout_librdkafka_refuses_is_refused_here() {
        let err = eo(Duration::from_millis(201)).validate().unwrap_err().to_string();
        assert!(err.contains("at least 1s"), "{err}");
        eo(Duration::from_secs(1)).validate().unwrap();
    }

    #[test]
    fn a_queue_size_librdkafka_would_read_otherwise_is_refused() {
        for bad in [
            "0x9c40",
            "010",
            "010x",
            "40_000",
            "100k",
            "-1",
            "",
            " ",
            "2147483648",
            "1e5",
            "00",
        ] {
            let err = eo_with("queue.buffering.max.messages", bad)
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("client.queue.buffering.max.messages must be a whole number"),
                "{bad:?}: {err}"
            );
        }
        for good in ["0", "1", "40000", " 40000 ", "2147483647"] {
            eo_with("queue.buffering.max.messages", good).validate().unwrap();
        }
        // Nothing is held without exactly-once: librdkafka's reading is the only one.
        let mut c = KafkaSinkConfig::new("b", "t", DeliveryGuarantee::AtLeastOnce);
        c.client.insert("queue.buffering.max.messages".into(), "0x9c40".into());
        c.validate().unwrap();
    }

    #[test]
    fn a_record_size_beyond_the_queues_bytes_is_refused() {
        let mut c = eo_with("message.max.bytes", "200000000");
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("raise client.queue.buffering.max.kbytes (KiB) to at least 195313"),
            "{err}"
        );
        c.client.insert("queue.buffering.max.kbytes".into(), "195313".into());
        c.validate().unwrap();
        eo_with("message.max.bytes", "1000000").validate().unwrap();
    }

    #[test]
    fn owned_keys_and_small_pools_are_refused() {
        let mut c = eo(Duration::from_secs(60));
        c.client.insert("transactional.id".into(), "x".into());
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("client.transactional.id"));
        let c = KafkaSinkConfig::new(
            "b",
            "t",
            DeliveryGuarantee::ExactlyOnce {
                transactional_id_prefix: "p".into(),
                pool_size: 1,
                max_pool_size: DEFAULT_MAX_POOL_SIZE,
                transaction_timeout: Duration::from_secs(60),
                accept_unknown_outcome_up_to: None,
            },
        );
        assert!(c.validate().unwrap_err().to_string().contains("pool_size"));
    }

    #[test]
    fn parses_from_toml() {
        let c: KafkaSinkConfig = toml::from_str(
            r#"
            bootstrap_servers = "127.0.0.1:9092"
            topic = "out"
            delivery = { type = "exactly_once", transactional_id_prefix = "orders", transaction_timeout = "2m" }
            "#,
        )
        .unwrap();
        assert!(matches!(
            c.delivery,
            DeliveryGuarantee::ExactlyOnce {
                pool_size: 3,
                max_pool_size: DEFAULT_MAX_POOL_SIZE,
                accept_unknown_outcome_up_to: None,
                ..
            }
        ));
        let c: KafkaSinkConfig = toml::from_str(
            r#"
            bootstrap_servers = "127.0.0.1:9092"
            topic = "out"
            delivery = { type = "exactly_once", transactional_id_prefix = "orders", accept_unknown_outcome_up_to = 42 }
            "#,
        )
        .unwrap();
        assert!(matches!(
            c.delivery,
            DeliveryGuarantee::ExactlyOnce {
                accept_unknown_outcome_up_to: Some(42),
                ..
            }
        ));
    }
}
