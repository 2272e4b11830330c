//! Transaction inspection for operators and tests (the `exactly txn` tool builds on this).

use std::time::Duration;

pub use exactly_kafka_client::Cluster;
use rdkafka::consumer::DefaultConsumerContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, Producer};

use crate::error::{Result, SinkError};
use crate::protocol::{TxnDescription, Wire};

/// A transaction as its coordinator reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionInfo {
    /// The transactional id.
    pub transactional_id: String,
    /// Coordinator state: Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort, ...
    pub state: String,
    /// Producer id.
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// Start of the current transaction (ms since the Unix epoch; -1 when none).
    pub start_time_ms: i64,
    /// Transaction timeout (ms).
    pub timeout_ms: i32,
    /// Partitions the current transaction touches.
    pub partitions: usize,
    /// The partitions the current transaction touches, as "topic-partition".
    pub topic_partitions: Vec<String>,
}

/// Describes one transactional id (an id the coordinator does not know is an error).
pub async fn describe_transaction(cluster: &Cluster, transactional_id: &str) -> Result<TransactionInfo> {
    let d = Wire::new(cluster.clone(), Duration::from_secs(30))
        .describe(transactional_id)
        .await?;
    Ok(info(transactional_id, d))
}

fn info(transactional_id: &str, d: TxnDescription) -> TransactionInfo {
    TransactionInfo {
        transactional_id: transactional_id.to_owned(),
        state: d.state,
        producer_id: d.producer_id,
        producer_epoch: d.producer_epoch,
        start_time_ms: d.start_time_ms,
        timeout_ms: d.timeout_ms,
        partitions: d.partitions,
        topic_partitions: d.topic_partitions,
    }
}

/// Aborts whatever transaction `transactional_id` has open, and fences its current producer: a
/// producer initialised with the id bumps the epoch, which makes the coordinator abort the open
/// transaction. The caller decides whether the transaction may be aborted (a checkpoint may still
/// have to commit it).
pub async fn abort_transaction(cluster: &Cluster, transactional_id: &str, timeout: Duration) -> Result<()> {
    let producer: BaseProducer = cluster
        .client_config()
        .map_err(SinkError::Config)?
        .set("transactional.id", transactional_id)
        .create()
        .map_err(|e| SinkError::kafka("creating a producer", e))?;
    tokio::task::block_in_place(|| producer.init_transactions(timeout))
        .map_err(|e| SinkError::kafka(format!("init_transactions for {transactional_id}"), e))
}

/// Every transactional id of `prefix` (`{prefix}-{subtask}-{slot}`, parsed, so prefix `orders`
/// does not take `orders-eu-0-0`) that the brokers know, described.
pub async fn list_transactions(cluster: &Cluster, prefix: &str) -> Result<Vec<TransactionInfo>> {
    let consumer: BaseConsumer<DefaultConsumerContext> =
        cluster
            .client_config()
            .map_err(SinkError::Config)?
            .create()
            .map_err(|e| SinkError::kafka("creating a metadata client", e))?;
    let md = tokio::task::block_in_place(|| {
        consumer.fetch_metadata(None, Duration::from_secs(30)).map_err(|e| {
            let why = exactly_core::net::diagnose(&cluster.bootstrap);
            SinkError::kafka(format!("fetching metadata from {} ({why})", cluster.bootstrap), e)
        })
    })?;
    let brokers: Vec<String> = md
        .brokers()
        .iter()
        .map(|b| format!("{}:{}", b.host(), b.port()))
        .collect();
    let wire = Wire::new(cluster.clone(), Duration::from_secs(30));
    let mut out = Vec::new();
    for t in wire.list(&brokers).await? {
        if crate::transactional_id::parse(prefix, &t.transactional_id).is_none() {
            continue;
        }
        // An id that expired since the listing is simply gone.
        if let Some(d) = wire.describe_known(&t.transactional_id).await? {
            out.push(info(&t.transactional_id, d));
        }
    }
    out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
    Ok(out)
}
