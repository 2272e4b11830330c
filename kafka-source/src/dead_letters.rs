//! The dead-letter producer of the poison-record policy `dead_letter`.
//!
//! Every delivery report is checked: a dead letter the broker refuses (or that times out) fails
//! the next checkpoint's flush, so a checkpoint never completes past a record that went nowhere.
//! Dead letters are at-least-once: after a restart from an earlier checkpoint, records rejected
//! again are written again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use exactly_kafka_client::outage::{BrokerLog, ClientKind};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use crate::deser::KafkaRecord;
use crate::error::{Result, SourceError};

/// Counts failed deliveries and keeps the first error.
#[derive(Default)]
pub(crate) struct Reports {
    failed: AtomicU64,
    first: Mutex<Option<String>>,
}

const BROKER_LOG: BrokerLog = BrokerLog::new(ClientKind::DeadLetters);

impl ClientContext for Reports {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        BROKER_LOG.log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        BROKER_LOG.error(&error, reason);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        BROKER_LOG.statistics(statistics);
    }
}

impl ProducerContext for Reports {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((error, _)) = result {
            self.failed.fetch_add(1, Ordering::Relaxed);
            let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert_with(|| error.to_string());
        }
    }
}

/// The producer that writes rejected records to the dead-letter topic.
pub(crate) struct DeadLetters {
    producer: ThreadedProducer<Reports>,
}

impl DeadLetters {
    pub(crate) fn new(bootstrap_servers: &str, security: &exactly_kafka_client::KafkaSecurity) -> Result<Self> {
        let producer = exactly_kafka_client::client_config(bootstrap_servers, security)
            .map_err(SourceError::Config)?
            .set("enable.idempotence", "true")
            // The end of a broker outage for the log (parsed only during one).
            .set(
                "statistics.interval.ms",
                exactly_kafka_client::outage::STATISTICS_INTERVAL_MS,
            )
            .create_with_context(Reports::default())
            .map_err(|e| SourceError::kafka("creating the dead-letter producer", e))?;
        Ok(DeadLetters { producer })
    }

    /// Queues `record` for `topic` with headers naming where it came from and why.
    pub(crate) fn send(&self, topic: &str, record: &KafkaRecord, reason: &str) -> Result<()> {
        let headers = record
            .headers
            .iter()
            .fold(OwnedHeaders::new(), |h, (k, v)| {
                h.insert(Header {
                    key: k,
                    value: v.as_deref(),
                })
            })
            .insert(Header {
                key: "exactly.source.topic",
                value: Some(record.topic.as_bytes()),
            })
            .insert(Header {
                key: "exactly.source.partition",
                value: Some(record.partition.to_string().as_bytes()),
            })
            .insert(Header {
                key: "exactly.source.offset",
                value: Some(record.offset.to_string().as_bytes()),
            })
            .insert(Header {
                key: "exactly.error",
                value: Some(reason.as_bytes()),
            });
        let mut r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).headers(headers);
        if let Some(k) = &record.key {
            r = r.key(k.as_slice());
        }
        if let Some(v) = &record.value {
            r = r.payload(v.as_slice());
        }
        self.producer
            .send(r)
            .map_err(|(e, _)| SourceError::kafka("writing to the dead-letter topic", e))
    }

    /// Waits until every queued dead letter is delivered; fails if any delivery failed since the
    /// last call (the checkpoint must not complete without it).
    pub(crate) fn flush(&self, topic: &str, timeout: Duration) -> Result<()> {
        tokio::task::block_in_place(|| self.producer.flush(timeout))
            .map_err(|e| SourceError::kafka("flushing the dead-letter producer", e))?;
        let reports = self.producer.context();
        let failed = reports.failed.swap(0, Ordering::Relaxed);
        if failed > 0 {
            let first = reports
                .first
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .unwrap_or_default();
            return Err(SourceError::DeadLetter {
                topic: topic.to_owned(),
                failed,
                first,
            });
        }
        Ok(())
    }
}
