//! A keyed, stateful exactly-once job in Rust: Kafka source → key_by → a running count per key
//! in RocksDB state → exactly-once Kafka sink.
//!
//! Every input record is an order keyed by its customer; the job writes `customer count` for each,
//! so customer c's outputs must be exactly `1, 2, …, n(c)` — a count repeated or skipped would show
//! a record processed twice or lost. The counting function fails once half-way, as a crash would:
//! the job restarts from its latest checkpoint (the counts and the input offsets restored together,
//! the output of the failed attempt's open transactions aborted). An independent read_committed
//! consumer then checks every customer's counts.
//!
//! Needs Kafka (`scripts/services up kafka`; `EXACTLY_KAFKA_BOOTSTRAP`, default 127.0.0.1:19092):
//!
//! ```sh
//! cargo run -p exactly-kafka-sink --example keyed_count
//! ```
//! (`cargo test` runs it too.)

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use exactly_core::coordinator::CheckpointConfig;
use exactly_core::restart::RestartStrategy;
use exactly_core::runtime::{
    CheckpointListener, CheckpointedFunction, Collector, JobBuilder, JobConfig, KeyedProcessFunction,
    StateBackendConfig,
};
use exactly_core::state::{KeyedContext, ValueState};
use exactly_core::{CoreError, ErrorClass};
use exactly_kafka_sink::{DeliveryGuarantee, KafkaSink, KafkaSinkConfig, ProducerRecord};
use exactly_kafka_source::{KafkaRecord, KafkaSource, KafkaSourceConfig, RawBytes};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

const ORDERS: u64 = 30_000;
const CUSTOMERS: u64 = 25;

/// The running count of the current key, in keyed state: checkpointed with the job, restored
/// with it, redistributed by key group when the parallelism changes.
struct CountPerCustomer {
    count: ValueState<u64>,
    crashed: Arc<AtomicBool>,
}

// Keyed state needs no snapshot code of its own; these hooks are for operator state and
// completion notices.
impl CheckpointedFunction for CountPerCustomer {}
impl CheckpointListener for CountPerCustomer {}

impl KeyedProcessFunction<KafkaRecord, ProducerRecord> for CountPerCustomer {
    fn process(
        &mut self,
        order: KafkaRecord,
        state: &mut KeyedContext<'_>,
        out: &mut Collector<'_, ProducerRecord>,
    ) -> exactly_core::Result<()> {
        let n = self.count.get(state)?.unwrap_or(0) + 1;
        if n == ORDERS / CUSTOMERS / 2 && !self.crashed.swap(true, Ordering::SeqCst) {
            return Err(CoreError::operator("count", ErrorClass::Restart, "injected failure"));
        }
        self.count.set(state, &n)?;
        let customer = String::from_utf8_lossy(order.key.as_deref().unwrap_or_default()).into_owned();
        out.emit(ProducerRecord {
            key: order.key,
            value: Some(format!("{customer} {n}").into_bytes()),
            timestamp: order.timestamp,
            headers: Vec::new(),
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let bootstrap = std::env::var("EXACTLY_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:19092".into());
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let (input, output) = (format!("example-orders-{run}"), format!("example-counts-{run}"));
    create_topics(&bootstrap, &[&input, &output]).await?;
    produce_orders(&bootstrap, &input)?;

    let dir = tempfile::tempdir()?;
    let mut checkpoints = CheckpointConfig::new(dir.path().join("checkpoints"));
    checkpoints.interval = Duration::from_millis(500);
    let mut config = JobConfig::new("keyed-count");
    config.checkpointing = Some(checkpoints);
    config.restart = RestartStrategy::FixedDelay {
        attempts: 3,
        delay: Duration::from_millis(500),
    };
    config.state_backend = StateBackendConfig::RocksDb {
        local_dir: Some(dir.path().join("rocksdb")),
        memory_mb: None,
    };

    let source = KafkaSourceConfig::new(&bootstrap, vec![input.clone()], format!("example-{run}"));
    let sink = KafkaSinkConfig::new(
        &bootstrap,
        &output,
        DeliveryGuarantee::ExactlyOnce {
            transactional_id_prefix: format!("example-{run}"),
            pool_size: 3,
            max_pool_size: exactly_kafka_sink::DEFAULT_MAX_POOL_SIZE,
            transaction_timeout: Duration::from_secs(60),
            accept_unknown_outcome_up_to: None,
        },
    );
    let crashed = Arc::new(AtomicBool::new(false));
    let mut job = JobBuilder::new(config);
    job.source("orders", 2, move |_| KafkaSource::new(source.clone(), RawBytes))
        .key_by(|order: &KafkaRecord| order.key.clone().unwrap_or_default())
        .process("count", 2, move |_| CountPerCustomer {
            count: ValueState::new("count"),
            crashed: crashed.clone(),
        })
        .sink("counts", move |_| {
            KafkaSink::new(sink.clone()).expect("a valid sink configuration")
        });
    let handle = job.build()?.start();

    // An independent reader that sees committed transactions only.
    let counts = tokio::task::spawn_blocking({
        let (bootstrap, output) = (bootstrap.clone(), output.clone());
        move || read_committed(&bootstrap, &output, ORDERS)
    })
    .await??;
    handle.cancel();
    let outcome = handle.join().await?;

    let total: usize = counts.values().map(Vec::len).sum();
    let mut wrong = Vec::new();
    for (customer, mut seen) in counts {
        seen.sort_unstable();
        let n = seen.len() as u64;
        if seen != (1..=n).collect::<Vec<_>>() {
            wrong.push(customer);
        }
    }
    println!(
        "{ORDERS} orders of {CUSTOMERS} customers counted into {output}: {} customer(s) with a count repeated or missing; {} checkpoints, {} restart(s)",
        wrong.len(),
        outcome.checkpoints,
        outcome.restarts
    );
    anyhow::ensure!(wrong.is_empty(), "counts repeated or missing for {wrong:?}");
    anyhow::ensure!(total as u64 == ORDERS, "{total} counts for {ORDERS} orders");
    anyhow::ensure!(outcome.restarts >= 1, "the injected failure restarts the job");
    Ok(())
}

async fn create_topics(bootstrap: &str, names: &[&str]) -> anyhow::Result<()> {
    let admin: AdminClient<_> = ClientConfig::new().set("bootstrap.servers", bootstrap).create()?;
    let topics: Vec<_> = names
        .iter()
        .map(|n| NewTopic::new(n, 3, TopicReplication::Fixed(1)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let created = tokio::time::timeout(Duration::from_secs(20), admin.create_topics(&topics, &options))
        .await
        .ok()
        .and_then(Result::ok);
    let Some(results) = created else {
        bail!("cannot reach Kafka at {bootstrap}: start it with `scripts/services up kafka` (and `eval \"$(scripts/services env)\"`), or set EXACTLY_KAFKA_BOOTSTRAP");
    };
    for r in results {
        r.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
    }
    Ok(())
}

fn produce_orders(bootstrap: &str, topic: &str) -> anyhow::Result<()> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .create()?;
    for i in 0..ORDERS {
        let key = format!("customer-{}", i % CUSTOMERS);
        let value = format!("{{\"id\":{i}}}");
        let mut record = BaseRecord::to(topic).key(&key).payload(&value);
        while let Err((e, back)) = producer.send(record) {
            record = back;
            if !matches!(
                e.rdkafka_error_code(),
                Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
            ) {
                bail!("producing to {topic}: {e}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}

/// Reads the committed records of `topic` (`n`, and any beyond); the counts per customer.
fn read_committed(bootstrap: &str, topic: &str, n: u64) -> anyhow::Result<BTreeMap<String, Vec<u64>>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{topic}-check"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut partitions = TopicPartitionList::new();
    for p in 0..3 {
        partitions.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&partitions)?;
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut counts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut read = 0;
    // Until all n arrived, then 3 s more: a duplicate written last would otherwise go unread.
    let mut quiet_until = None;
    while quiet_until.is_none_or(|t| Instant::now() < t) {
        if read >= n && quiet_until.is_none() {
            quiet_until = Some(Instant::now() + Duration::from_secs(3));
        }
        if Instant::now() > deadline {
            bail!("only {read} of {n} counts became visible in {topic} within 3 minutes");
        }
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m?;
            let text = std::str::from_utf8(m.payload().unwrap_or_default()).context("a count")?;
            let (customer, count) = text.rsplit_once(' ').context("`customer count`")?;
            counts.entry(customer.to_owned()).or_default().push(count.parse()?);
            read += 1;
        }
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs() {
        super::main().expect("the example holds");
    }
}
