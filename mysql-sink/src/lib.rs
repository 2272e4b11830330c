//! `exactly-mysql-sink`: a MySQL/MariaDB sink, exactly once in one of two ways:
//! - `xa`: a true two-phase commit (an XA branch per subtask per checkpoint, prepared at the
//!   barrier, committed when the checkpoint completes, recovered after any crash);
//! - `upsert`: idempotent writes (rows and progress committed together at every barrier; replays
//!   overwrite identical rows, so key columns are required).
//!
//! Both write a progress row (job, sink, subtask, checkpoint id, source offsets) with the data.
//! Records map to rows from JSON fields or delimited text; records that do not fit fail the job,
//! are skipped, or go to a dead-letter table, with their Kafka coordinates in the log.

mod config;
mod db;
mod error;
mod mapping;
mod tls;
mod upsert;
mod xa;

use exactly_core::runtime::{InitContext, Sink, SnapshotContext};
use exactly_core::CheckpointId;
use exactly_twophase::TwoPhaseSink;

pub use config::{InsertMode, Mode, MysqlSinkConfig, OnError};
pub use db::connect_url;
pub use error::{MysqlSinkError, Result};
pub use mapping::{Column, ColumnType, Format, Mapping, SqlValue};
pub use tls::tls_warning;
pub use upsert::UpsertMysqlSink;
pub use xa::{XaCommittable, XaMysqlSink, XaTransaction};

/// Where a record came from (for the progress row and the logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// A record for the sink: a payload to map to a row, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkRecord {
    /// JSON or delimited text (empty for a tombstone).
    pub payload: Vec<u8>,
    /// The Kafka key; a tombstone's key names the row to delete.
    pub key: Option<Vec<u8>>,
    /// A Kafka tombstone (no value): mode `upsert` deletes the row of its key (the key columns'
    /// values: one column from a plain key, several from a JSON object key); mode `xa` applies
    /// `on_error` to it.
    pub tombstone: bool,
    /// Kafka coordinates, when it came from Kafka.
    pub origin: Option<Origin>,
}

impl SinkRecord {
    pub(crate) fn origin_text(&self) -> String {
        match &self.origin {
            Some(o) => format!("{}/{}@{}", o.topic, o.partition, o.offset),
            None => "(no origin)".into(),
        }
    }
}

/// The MySQL sink in the configured mode.
///
/// The configuration is what a job file's `[sink.mysql]` holds; from code, deserialize it (here
/// from JSON) or fill [`MysqlSinkConfig`]'s fields.
///
/// ```no_run
/// use exactly_core::runtime::{JobBuilder, JobConfig};
/// use exactly_kafka_source::{KafkaRecord, KafkaSource, KafkaSourceConfig, RawBytes};
/// use exactly_mysql_sink::{MysqlSink, MysqlSinkConfig, Origin, SinkRecord};
///
/// let config: MysqlSinkConfig = serde_json::from_value(serde_json::json!({
///     "url": "mysql://app:${MYSQL_PASSWORD}@127.0.0.1:3306/shop",
///     "table": "orders",
///     "mode": "xa",          // or "upsert" (idempotent; key columns required)
///     "job_id": "orders-to-mysql",
///     "create_table": true,
///     "mapping": {
///         "format": { "type": "json" },
///         "columns": [
///             { "name": "id", "type": "bigint", "key": true },
///             { "name": "amount", "type": "double" },
///         ],
///     },
/// }))
/// .expect("a valid configuration");
/// let source = KafkaSourceConfig::new("127.0.0.1:19092", vec!["orders".into()], "orders-to-mysql");
/// let mut job = JobBuilder::new(JobConfig::new("orders-to-mysql"));
/// job.source("orders", 1, move |_| KafkaSource::new(source.clone(), RawBytes))
///     .map(|r: KafkaRecord| SinkRecord {
///         tombstone: r.value.is_none(),
///         payload: r.value.unwrap_or_default(),
///         key: r.key,
///         // Named in errors and dead letters.
///         origin: Some(Origin {
///             topic: r.topic.to_string(),
///             partition: r.partition,
///             offset: r.offset,
///         }),
///     })
///     .sink("orders-table", move |_| MysqlSink::new(config.clone()).expect("a valid configuration"));
/// ```
pub enum MysqlSink {
    /// Mode `xa`.
    Xa(Box<TwoPhaseSink<SinkRecord, XaMysqlSink>>),
    /// Mode `upsert`.
    Upsert(Box<UpsertMysqlSink>),
}

impl MysqlSink {
    /// The sink `config` asks for.
    pub fn new(config: MysqlSinkConfig) -> Result<Self> {
        Ok(match config.mode {
            Mode::Xa => MysqlSink::Xa(Box::new(TwoPhaseSink::new(XaMysqlSink::new(config)?))),
            Mode::Upsert => MysqlSink::Upsert(Box::new(UpsertMysqlSink::new(config)?)),
        })
    }

    /// Transaction counters (mode `xa` only).
    pub fn two_phase_metrics(&self) -> Option<std::sync::Arc<exactly_twophase::TwoPhaseMetrics>> {
        match self {
            MysqlSink::Xa(s) => Some(s.metrics()),
            MysqlSink::Upsert(_) => None,
        }
    }
}

impl Sink<SinkRecord> for MysqlSink {
    fn can_prove_restores(&self) -> bool {
        match self {
            MysqlSink::Xa(s) => s.can_prove_restores(),
            MysqlSink::Upsert(s) => s.can_prove_restores(),
        }
    }
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        match self {
            MysqlSink::Xa(s) => s.initialize_state(ctx).await,
            MysqlSink::Upsert(s) => s.initialize_state(ctx).await,
        }
    }
    async fn write(&mut self, records: Vec<SinkRecord>) -> exactly_core::Result<()> {
        match self {
            MysqlSink::Xa(s) => s.write(records).await,
            MysqlSink::Upsert(s) => s.write(records).await,
        }
    }
    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        match self {
            MysqlSink::Xa(s) => s.snapshot_state(ctx).await,
            MysqlSink::Upsert(s) => s.snapshot_state(ctx).await,
        }
    }
    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> exactly_core::Result<()> {
        match self {
            MysqlSink::Xa(s) => s.notify_checkpoint_complete(id).await,
            MysqlSink::Upsert(s) => s.notify_checkpoint_complete(id).await,
        }
    }
    async fn notify_checkpoint_aborted(&mut self, id: CheckpointId) -> exactly_core::Result<()> {
        match self {
            MysqlSink::Xa(s) => s.notify_checkpoint_aborted(id).await,
            MysqlSink::Upsert(s) => s.notify_checkpoint_aborted(id).await,
        }
    }
    async fn finish(&mut self) -> exactly_core::Result<()> {
        match self {
            MysqlSink::Xa(s) => s.finish().await,
            MysqlSink::Upsert(s) => s.finish().await,
        }
    }
    async fn close(&mut self) -> exactly_core::Result<()> {
        match self {
            MysqlSink::Xa(s) => s.close().await,
            MysqlSink::Upsert(s) => s.close().await,
        }
    }
}
