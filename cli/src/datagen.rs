//! `exactly datagen orders`: sample input for trying jobs out — JSON orders with ids 0..N, keyed
//! by id, written with an idempotent producer (each id once, unless the command is run again).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use exactly_kafka_client::Cluster;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;
use serde_json::json;
use tracing::info;

/// Order `id` as the generator writes it: every third order is still open, the rest are paid.
pub fn order(id: u64) -> serde_json::Value {
    json!({
        "id": id,
        "customer": format!("c{}", id % 50),
        "amount": ((id * 7919) % 100_000) as f64 / 100.0,
        "currency": "EUR",
        "status": if id.is_multiple_of(3) { "open" } else { "paid" },
    })
}

/// A librdkafka configuration for `cluster` (its TLS and SASL settings included).
fn config(cluster: &Cluster) -> Result<ClientConfig> {
    cluster.client_config().map_err(|e| anyhow::anyhow!(e))
}

/// Creates `topic` with `partitions` if it does not exist.
pub async fn ensure_topic(cluster: &Cluster, topic: &str, partitions: i32) -> Result<()> {
    let bootstrap = &cluster.bootstrap;
    let admin: AdminClient<DefaultClientContext> =
        config(cluster)?.create().context("creating a Kafka admin client")?;
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .with_context(|| format!("creating topic {topic} at {bootstrap}"))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => anyhow::bail!("creating topic {t}: {e}"),
        }
    }
    Ok(())
}

/// Writes orders `first..first+count` to `topic` (created with `partitions` if missing), at most
/// `rate` per second when given.
pub async fn orders(
    cluster: &Cluster,
    topic: &str,
    partitions: i32,
    first: u64,
    count: u64,
    rate: Option<u64>,
) -> Result<()> {
    ensure_topic(cluster, topic, partitions).await?;
    let producer: FutureProducer = config(cluster)?
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .context("creating a producer")?;
    let start = Instant::now();
    let mut inflight = Vec::new();
    for id in first..first + count {
        if let Some(r) = rate {
            let due = start + Duration::from_secs_f64((id - first) as f64 / r.max(1) as f64);
            tokio::time::sleep_until(due.into()).await;
        }
        let key = id.to_string();
        let value = order(id).to_string();
        let f = producer
            .send_result(FutureRecord::to(topic).key(&key).payload(&value))
            .map_err(|(e, _)| anyhow::anyhow!("queueing order {id}: {e}"))?;
        inflight.push(f);
        if inflight.len() >= 10_000 {
            for f in inflight.drain(..) {
                f.await?.map_err(|(e, _)| anyhow::anyhow!("writing an order: {e}"))?;
            }
        }
    }
    for f in inflight {
        f.await?.map_err(|(e, _)| anyhow::anyhow!("writing an order: {e}"))?;
    }
    producer.flush(Duration::from_secs(60))?;
    info!(topic, first, count, "Orders written.");
    Ok(())
}
