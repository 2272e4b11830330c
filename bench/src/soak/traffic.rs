//! The soak's traffic: the feeder of the input at a steady rate, counting its deliveries, and the
//! read_committed reader of the output, keeping every key it read as a bit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Message};

use super::TOPIC_PARTITIONS;
use crate::kafka::{consumer, now_ms, producer_config};
use exactly_kafka_client::Cluster;

/// What the reader of the output has seen.
#[derive(Default)]
pub(super) struct Seen {
    /// Keys `s<i>` read, as bits.
    pub(super) keys: Vec<u64>,
    pub(super) distinct: u64,
    pub(super) duplicates: u64,
    /// Keys that are not the feeder's.
    pub(super) foreign: u64,
    /// Latencies (ms) since the last sample.
    pub(super) latencies: Vec<i64>,
    /// Errors the reader's consumer reported (it goes on).
    pub(super) errors: u64,
}

impl Seen {
    fn record(&mut self, key: &[u8], latency: i64) {
        self.latencies.push(latency);
        let Some(i) = std::str::from_utf8(key)
            .ok()
            .and_then(|k| k.strip_prefix('s'))
            .and_then(|i| i.parse::<u64>().ok())
        else {
            self.foreign += 1;
            return;
        };
        let (word, bit) = ((i / 64) as usize, 1u64 << (i % 64));
        if word >= self.keys.len() {
            self.keys.resize(word + 1 + word / 4, 0);
        }
        if self.keys[word] & bit != 0 {
            self.duplicates += 1;
        } else {
            self.keys[word] |= bit;
            self.distinct += 1;
        }
    }

    /// Keys below `n` never read.
    pub(super) fn missing(&self, n: u64) -> u64 {
        (0..n)
            .filter(|&i| {
                self.keys
                    .get((i / 64) as usize)
                    .is_none_or(|w| w & (1 << (i % 64)) == 0)
            })
            .count() as u64
    }
}

/// The feeder's deliveries: those that succeeded and those that failed.
#[derive(Default)]
pub(super) struct Deliveries {
    pub(super) delivered: AtomicU64,
    pub(super) failed: AtomicU64,
}

/// The feeder's producer's context: counts into [`Deliveries`].
struct Counting(Arc<Deliveries>);

impl ClientContext for Counting {}

impl ProducerContext for Counting {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        match r {
            Ok(_) => {
                self.0.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                if self.0.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("the feeder's producer could not deliver a record: {e}");
                }
            }
        }
    }
}

/// Feeds `rate` records/s of keys `s0`, `s1`, … until `stop` (or a record is not delivered);
/// returns how many it queued, all delivered by then.
pub(super) fn feed(
    cluster: &Cluster,
    topic: &str,
    rate: u64,
    size: usize,
    stop: &AtomicBool,
    d: Arc<Deliveries>,
) -> Result<u64> {
    let p: BaseProducer<Counting> = producer_config(cluster)?.create_with_context(Counting(d.clone()))?;
    let value = vec![b'x'; size];
    let start = Instant::now();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) && d.failed.load(Ordering::Relaxed) == 0 {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while i < due && !stop.load(Ordering::Relaxed) {
            let key = format!("s{i}");
            match p.send(
                BaseRecord::to(topic)
                    .key(key.as_bytes())
                    .payload(&value)
                    .timestamp(now_ms()),
            ) {
                Ok(()) => i += 1,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    p.poll(Duration::from_millis(5));
                }
                Err((e, _)) => bail!("the feeder could not queue record {i}: {e}"),
            }
        }
        p.poll(Duration::from_millis(5));
    }
    p.flush(Duration::from_secs(120))?;
    let failed = d.failed.load(Ordering::Relaxed);
    if failed > 0 {
        bail!("{failed} record(s) of the feeder were not delivered");
    }
    Ok(i)
}

/// Reads `topic` committed until `stop` and then until it has been idle for 10 s. The consumer's
/// errors are counted and it goes on (a broker's hiccup is not the job's fault; records that
/// never arrive are found at the end).
pub(super) fn read(cluster: &Cluster, topic: &str, stop: &AtomicBool, seen: &Mutex<Seen>) -> Result<()> {
    let c = consumer(cluster, topic, true)?;
    let mut idle_since: Option<Instant> = None;
    loop {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                idle_since = None;
                let latency = m.timestamp().to_millis().map_or(-1, |ts| now_ms() - ts);
                seen.lock().expect("seen").record(m.key().unwrap_or_default(), latency);
            }
            Some(Err(e)) => {
                let mut s = seen.lock().expect("seen");
                if s.errors == 0 {
                    eprintln!("the soak's reader: {e} (it goes on)");
                }
                s.errors += 1;
            }
            None => {
                if stop.load(Ordering::Relaxed)
                    && idle_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(10)
                {
                    return Ok(());
                }
            }
        }
    }
}

/// Records in `topic` (the sum of its partitions' high watermarks: a fresh topic).
pub(super) fn input_records(cluster: &Cluster, topic: &str) -> Result<u64> {
    let c = consumer(cluster, topic, false)?;
    let mut n = 0;
    for p in 0..TOPIC_PARTITIONS {
        n += c.fetch_watermarks(topic, p, Duration::from_secs(10))?.1.max(0) as u64;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_counted_once_and_the_missing_ones_found() {
        let mut s = Seen::default();
        for k in ["s0", "s2", "s2", "s130", "x7"] {
            s.record(k.as_bytes(), 5);
        }
        assert_eq!((s.distinct, s.duplicates, s.foreign), (3, 1, 1));
        // 0..131 less the three read.
        assert_eq!(s.missing(131), 128);
        assert_eq!(s.missing(1), 0);
        assert_eq!(s.latencies.len(), 5);
    }
}
