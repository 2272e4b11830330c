//! The producers of one subtask: one per transactional id of its pool, each with a delivery
//! tracker, and the state of the transaction it holds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext, Message};

use crate::committable::Probe;
use crate::error::{Result, SinkError};
use crate::partitioner::Partitioner;
use crate::ProducerRecord;

/// What the delivery callbacks of one producer saw since the last reset.
#[derive(Debug, Default)]
pub(crate) struct Deliveries {
    pub(crate) first_error: Option<String>,
    pub(crate) last: Option<Probe>,
    pub(crate) delivered: u64,
}

/// Collects delivery reports (runs on the producer's polling thread).
pub(crate) struct SinkContext {
    pub(crate) deliveries: Arc<Mutex<Deliveries>>,
}

impl ClientContext for SinkContext {}

impl ProducerContext for SinkContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let mut d = self.deliveries.lock().expect("not poisoned");
        match result {
            Ok(m) => {
                d.delivered += 1;
                d.last = Some(Probe {
                    topic: m.topic().to_owned(),
                    partition: m.partition(),
                    offset: m.offset(),
                });
            }
            Err((e, m)) => {
                d.first_error
                    .get_or_insert_with(|| format!("{}/{}: {e}", m.topic(), m.partition()));
            }
        }
    }
}

pub(crate) type Producer_ = ThreadedProducer<SinkContext>;

/// Creates a producer (transactional when `transactional_id` is given).
pub(crate) fn create_producer(
    bootstrap: &str,
    client: &std::collections::BTreeMap<String, String>,
    transactional: Option<(&str, Duration)>,
) -> Result<(Producer_, Arc<Mutex<Deliveries>>)> {
    let mut c = ClientConfig::new();
    c.set("linger.ms", "5");
    for (k, v) in client {
        c.set(k, v);
    }
    c.set("bootstrap.servers", bootstrap);
    match transactional {
        Some((id, timeout)) => {
            c.set("transactional.id", id)
                .set("transaction.timeout.ms", timeout.as_millis().to_string());
        }
        None => {
            c.set("enable.idempotence", "true");
        }
    }
    let deliveries = Arc::new(Mutex::new(Deliveries::default()));
    let producer = c
        .create_with_context(SinkContext {
            deliveries: deliveries.clone(),
        })
        .map_err(|e| SinkError::kafka("creating a producer", e))?;
    Ok((producer, deliveries))
}

/// Sends `records` to `topic`, waiting (not failing) while librdkafka's queue is full.
pub(crate) async fn send_all(
    producer: &Producer_,
    topic: &str,
    partitions: &[i32],
    partitioner: &dyn Partitioner,
    records: Vec<ProducerRecord>,
) -> Result<()> {
    for r in records {
        let partition = partitioner.partition(r.key.as_deref(), r.value.as_deref(), topic, partitions);
        let headers = (!r.headers.is_empty()).then(|| {
            r.headers
                .iter()
                .fold(OwnedHeaders::new_with_capacity(r.headers.len()), |h, (k, v)| {
                    h.insert(Header {
                        key: k,
                        value: v.as_deref(),
                    })
                })
        });
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).partition(partition);
        if let Some(k) = &r.key {
            record = record.key(k.as_slice());
        }
        if let Some(v) = &r.value {
            record = record.payload(v.as_slice());
        }
        if let Some(ts) = r.timestamp {
            record = record.timestamp(ts);
        }
        if let Some(h) = headers {
            record = record.headers(h);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err((e, _)) => return Err(SinkError::kafka(format!("producing to {topic}"), e)),
            }
        }
    }
    Ok(())
}

/// Fails if a record was reported undelivered since the last reset.
pub(crate) fn check_deliveries(deliveries: &Mutex<Deliveries>, topic: &str) -> Result<()> {
    match &deliveries.lock().expect("not poisoned").first_error {
        Some(reason) => Err(SinkError::Delivery {
            topic: topic.to_owned(),
            reason: reason.clone(),
        }),
        None => Ok(()),
    }
}

/// Waits for every outstanding record; fails if any was not delivered.
pub(crate) fn flush(
    producer: &Producer_,
    deliveries: &Mutex<Deliveries>,
    topic: &str,
    timeout: Duration,
) -> Result<()> {
    tokio::task::block_in_place(|| producer.flush(timeout)).map_err(|e| SinkError::kafka("flushing", e))?;
    check_deliveries(deliveries, topic)
}
