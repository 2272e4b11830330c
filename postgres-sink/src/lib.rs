//! `exactly-postgres-sink`: a PostgreSQL sink, exactly once in one of two ways:
//! - `two_phase`: a true two-phase commit (`PREPARE TRANSACTION` per subtask per checkpoint at
//!   the barrier, `COMMIT PREPARED` when the checkpoint completes, `pg_prepared_xacts` to recover
//!   and to roll back what no checkpoint needs);
//! - `upsert`: idempotent writes (rows and progress committed together at every barrier; replays
//!   overwrite identical rows, so key columns are required).
//!
//! Both write a progress row (job, sink, subtask, checkpoint id, source offsets) with the data.
//! Each record holds a JSON object; its fields fill the configured columns, converted by
//! PostgreSQL to the columns' types.
//!
//! Written as a third party would write a connector: only against the public API of
//! `exactly-core` and `exactly-twophase` (see `docs/writing-a-connector.md`).

mod config;
mod db;
mod error;
mod tls;
mod two_phase;
mod upsert;

use exactly_core::runtime::{InitContext, Sink, SnapshotContext};
use exactly_core::CheckpointId;
use exactly_twophase::TwoPhaseSink;

pub use config::{Column, InsertMode, Mode, OnError, PostgresSinkConfig};
pub use db::connect_url;
pub use error::{PostgresSinkError, Result};
pub use tls::tls_warning;
pub use two_phase::{PgCommittable, PgTransaction, TwoPhasePostgresSink};
pub use upsert::UpsertPostgresSink;

/// Where a record came from (for the progress row and the logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOrigin {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// A record for the sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgRecord {
    /// A JSON object whose fields fill the columns (empty for a tombstone).
    pub payload: Vec<u8>,
    /// The Kafka key; a tombstone's key names the row to delete (mode `upsert`).
    pub key: Option<Vec<u8>>,
    /// A Kafka tombstone (no value).
    pub tombstone: bool,
    /// Kafka coordinates, when it came from Kafka.
    pub origin: Option<PgOrigin>,
}

impl PgRecord {
    /// A record holding `json`.
    pub fn json(json: impl Into<Vec<u8>>) -> Self {
        PgRecord {
            payload: json.into(),
            key: None,
            tombstone: false,
            origin: None,
        }
    }

    pub(crate) fn origin_text(&self) -> String {
        match &self.origin {
            Some(o) => format!("{}/{}@{}", o.topic, o.partition, o.offset),
            None => "(no origin)".into(),
        }
    }
}

/// The PostgreSQL sink in the configured mode.
///
/// ```no_run
/// use exactly_core::runtime::{JobBuilder, JobConfig, Stream};
/// use exactly_postgres_sink::{PgRecord, PostgresSink, PostgresSinkConfig};
///
/// let config: PostgresSinkConfig = serde_json::from_value(serde_json::json!({
///     "url": "postgres://app:${PG_PASSWORD}@127.0.0.1:5432/shop?sslmode=verify-full&sslrootcert=ca.pem",
///     "table": "orders",
///     "mode": "two_phase",   // or "upsert" (idempotent; key columns required)
///     "job_id": "orders-to-postgres",
///     "create_table": true,
///     "columns": [
///         { "name": "id", "type": "bigint" },
///         { "name": "amount", "type": "numeric(12,2)" },
///     ],
/// }))
/// .expect("a valid configuration");
/// # let mut job = JobBuilder::new(JobConfig::new("orders-to-postgres"));
/// # let stream: Stream<PgRecord> = unimplemented!();
/// stream.sink("orders-table", move |_| PostgresSink::new(config.clone()).expect("a valid configuration"));
/// ```
pub enum PostgresSink {
    /// Mode `two_phase`.
    TwoPhase(Box<TwoPhaseSink<PgRecord, TwoPhasePostgresSink>>),
    /// Mode `upsert`.
    Upsert(Box<UpsertPostgresSink>),
}

impl PostgresSink {
    /// The sink `config` asks for.
    pub fn new(config: PostgresSinkConfig) -> Result<Self> {
        Ok(match config.mode {
            Mode::TwoPhase => PostgresSink::TwoPhase(Box::new(TwoPhaseSink::new(TwoPhasePostgresSink::new(config)?))),
            Mode::Upsert => PostgresSink::Upsert(Box::new(UpsertPostgresSink::new(config)?)),
        })
    }

    /// Transaction counters (mode `two_phase` only).
    pub fn two_phase_metrics(&self) -> Option<std::sync::Arc<exactly_twophase::TwoPhaseMetrics>> {
        match self {
            PostgresSink::TwoPhase(s) => Some(s.metrics()),
            PostgresSink::Upsert(_) => None,
        }
    }
}

impl Sink<PgRecord> for PostgresSink {
    fn can_prove_restores(&self) -> bool {
        match self {
            PostgresSink::TwoPhase(s) => s.can_prove_restores(),
            PostgresSink::Upsert(s) => s.can_prove_restores(),
        }
    }
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        match self {
            PostgresSink::TwoPhase(s) => s.initialize_state(ctx).await,
            PostgresSink::Upsert(s) => s.initialize_state(ctx).await,
        }
    }
    async fn write(&mut self, records: Vec<PgRecord>) -> exactly_core::Result<()> {
        match self {
            PostgresSink::TwoPhase(s) => s.write(records).await,
            PostgresSink::Upsert(s) => s.write(records).await,
        }
    }
    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        match self {
            PostgresSink::TwoPhase(s) => s.snapshot_state(ctx).await,
            PostgresSink::Upsert(s) => s.snapshot_state(ctx).await,
        }
    }
    async fn notify_checkpoint_complete(&mut self, id: CheckpointId) -> exactly_core::Result<()> {
        match self {
            PostgresSink::TwoPhase(s) => s.notify_checkpoint_complete(id).await,
            PostgresSink::Upsert(s) => s.notify_checkpoint_complete(id).await,
        }
    }
    async fn notify_checkpoint_aborted(&mut self, id: CheckpointId) -> exactly_core::Result<()> {
        match self {
            PostgresSink::TwoPhase(s) => s.notify_checkpoint_aborted(id).await,
            PostgresSink::Upsert(s) => s.notify_checkpoint_aborted(id).await,
        }
    }
    async fn finish(&mut self) -> exactly_core::Result<()> {
        match self {
            PostgresSink::TwoPhase(s) => s.finish().await,
            PostgresSink::Upsert(s) => s.finish().await,
        }
    }
    async fn close(&mut self) -> exactly_core::Result<()> {
        match self {
            PostgresSink::TwoPhase(s) => s.close().await,
            PostgresSink::Upsert(s) => s.close().await,
        }
    }
}
