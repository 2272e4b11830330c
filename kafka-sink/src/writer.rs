//! The sink for `none` and `at_least_once` (one idempotent producer), and [`KafkaSink`], which
//! picks it or the exactly-once one by the delivery guarantee.

use std::sync::Arc;

use exactly_core::runtime::{InitContext, Sink, SnapshotContext};
use exactly_core::CheckpointId;
use exactly_twophase::TwoPhaseSink;

use crate::broker::{broker_facts, partitioner_for};
use crate::config::{DeliveryGuarantee, KafkaSinkConfig};
use crate::error::Result;
use crate::exactly_once::TransactionalKafkaSink;
use crate::partitioner::Partitioner;
use crate::pool::{create_producer, flush, queue_cap, queue_partitions, send_all, Deliveries, Producer_};
use crate::ProducerRecord;

/// The sink for `none` and `at_least_once`: one idempotent producer.
pub struct KafkaWriter {
    config: KafkaSinkConfig,
    partitioner: Box<dyn Partitioner>,
    partitions: Vec<i32>,
    producer: Option<(Producer_, Arc<Deliveries>)>,
}

impl KafkaWriter {
    /// A writer for `config`.
    pub fn new(config: KafkaSinkConfig, partitioner: Box<dyn Partitioner>) -> Result<Self> {
        config.validate()?;
        Ok(KafkaWriter {
            config,
            partitioner,
            partitions: Vec::new(),
            producer: None,
        })
    }

    fn flush(&self) -> Result<()> {
        if let Some((p, d)) = &self.producer {
            flush(p, d, &self.config.topic, self.config.flush_timeout)?;
        }
        Ok(())
    }
}

impl Sink<ProducerRecord> for KafkaWriter {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        let facts = broker_facts(&self.config, ctx.info.starting).await?;
        self.partitions = facts.partitions;
        self.partitioner.open(ctx.info.index, ctx.info.parallelism);
        let n = self.partitions.len();
        let written = self.partitioner.partitions_written(n);
        let queue = queue_cap(&self.config.client, queue_partitions(written, n, ctx.info.parallelism));
        self.producer = Some(create_producer(
            &self.config.cluster(),
            &self.config.client,
            queue,
            None,
        )?);
        Ok(())
    }

    async fn write(&mut self, records: Vec<ProducerRecord>) -> exactly_core::Result<()> {
        let (p, _) = self.producer.as_ref().expect("initialized");
        send_all(
            p,
            &self.config.topic,
            &self.partitions,
            self.partitioner.as_ref(),
            records,
        )
        .await?;
        Ok(())
    }

    async fn snapshot_state(&mut self, _ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        if self.config.delivery == DeliveryGuarantee::AtLeastOnce {
            // Everything before the barrier is acknowledged by the broker before the checkpoint
            // can complete; an undelivered record fails the job (which replays from the last one).
            self.flush()?;
        }
        Ok(())
    }

    async fn finish(&mut self) -> exactly_core::Result<()> {
        Ok(self.flush()?)
    }
}

/// The Kafka sink for any delivery guarantee.
///
/// ```no_run
/// use std::time::Duration;
///
/// use exactly_core::runtime::{JobBuilder, JobConfig};
/// use exactly_kafka_sink::{DeliveryGuarantee, KafkaSink, KafkaSinkConfig, ProducerRecord};
/// use exactly_kafka_source::{KafkaRecord, KafkaSource, KafkaSourceConfig, RawBytes};
///
/// let source = KafkaSourceConfig::new("127.0.0.1:19092", vec!["orders".into()], "copy");
/// // Exactly once: the records of checkpoint N go into Kafka transactions, pre-committed at its
/// // barrier and committed when N is durable (after a crash, by the restart). Readers of
/// // `orders-copy` use isolation.level=read_committed.
/// let sink = KafkaSinkConfig::new(
///     "127.0.0.1:19092",
///     "orders-copy",
///     DeliveryGuarantee::ExactlyOnce {
///         transactional_id_prefix: "copy".into(), // unique per sink; keep it across restarts
///         pool_size: 3,
///         max_pool_size: 32, // while checkpoints fail, each holds a producer until one completes
///         transaction_timeout: Duration::from_secs(120),
///         accept_unknown_outcome_up_to: None,
///     },
/// );
/// let mut job = JobBuilder::new(JobConfig::new("copy")); // with checkpointing, in practice
/// job.source("orders", 1, move |_| KafkaSource::new(source.clone(), RawBytes))
///     .map(|r: KafkaRecord| ProducerRecord {
///         key: r.key,
///         value: r.value,
///         timestamp: r.timestamp,
///         headers: r.headers,
///     })
///     .sink("orders-copy", move |_| KafkaSink::new(sink.clone()).expect("a valid configuration"));
/// ```
pub enum KafkaSink {
    /// `none` or `at_least_once`.
    Plain(Box<KafkaWriter>),
    /// `exactly_once`.
    Transactional(Box<TwoPhaseSink<ProducerRecord, TransactionalKafkaSink>>),
}

impl KafkaSink {
    /// The sink `config` asks for, with the configured partitioner.
    pub fn new(config: KafkaSinkConfig) -> Result<Self> {
        let partitioner = partitioner_for(config.partitioner);
        Self::with_partitioner(config, partitioner)
    }

    /// The sink `config` asks for, with a custom partitioner.
    pub fn with_partitioner(config: KafkaSinkConfig, partitioner: Box<dyn Partitioner>) -> Result<Self> {
        Ok(match config.delivery {
            DeliveryGuarantee::ExactlyOnce { .. } => KafkaSink::Transactional(Box::new(TwoPhaseSink::new(
                TransactionalKafkaSink::new(config, partitioner)?,
            ))),
            _ => KafkaSink::Plain(Box::new(KafkaWriter::new(config, partitioner)?)),
        })
    }

    /// Transaction counters (exactly-once only).
    pub fn two_phase_metrics(&self) -> Option<std::sync::Arc<exactly_twophase::TwoPhaseMetrics>> {
        match self {
            KafkaSink::Plain(_) => None,
            KafkaSink::Transactional(s) => Some(s.metrics()),
        }
    }
}

impl Sink<ProducerRecord> for KafkaSink {
    fn can_prove_restores(&self) -> bool {
        match self {
            KafkaSink::Plain(s) => s.can_prove_restores(),
            KafkaSink::Transactional(s) => s.can_prove_restores(),
        }
    }
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        match self {
            KafkaSink::Plain(s) => s.initialize_state(ctx).await,
            KafkaSink::Transactional(s) => s.initialize_state(ctx).await,
        }
    }
    async fn write(&mut self, records: Vec<ProducerRecord>) -> exactly_core::Result<()> {
        match self {
            KafkaSink::Plain(s) => s.write(records).await,
            KafkaSink::Transactional(s) => s.write(records).await,
        }
    }
    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        match self {
            KafkaSink::Plain(s) => s.snapshot_state(ctx).await,
            KafkaSink::Transactional(s) => s.snapshot_state(ctx).await,
        }
    }
    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> exactly_core::Result<()> {
        match self {
            KafkaSink::Plain(s) => s.notify_checkpoint_complete(id).await,
            KafkaSink::Transactional(s) => s.notify_checkpoint_complete(id).await,
        }
    }
    async fn notify_checkpoint_aborted(&mut self, id: CheckpointId) -> exactly_core::Result<()> {
        match self {
            KafkaSink::Plain(s) => s.notify_checkpoint_aborted(id).await,
            KafkaSink::Transactional(s) => s.notify_checkpoint_aborted(id).await,
        }
    }
    async fn finish(&mut self) -> exactly_core::Result<()> {
        match self {
            KafkaSink::Plain(s) => s.finish().await,
            KafkaSink::Transactional(s) => s.finish().await,
        }
    }
    async fn close(&mut self) -> exactly_core::Result<()> {
        match self {
            KafkaSink::Plain(s) => s.close().await,
            KafkaSink::Transactional(s) => s.close().await,
        }
    }
}
