//! Mode `upsert`: each checkpoint's rows and its progress row in one ordinary transaction,
//! committed at the barrier; a replay after a crash overwrites the same rows with the same values
//! (and deletes what tombstones delete again).

use std::collections::BTreeMap;

use exactly_core::failpoint;
use exactly_core::runtime::{InitContext, Sink, SnapshotContext};
use sqlx::postgres::PgConnection;

use crate::config::PostgresSinkConfig;
use crate::db;
use crate::error::{PostgresSinkError, Result};
use crate::PgRecord;

/// The idempotent sink.
pub struct UpsertPostgresSink {
    config: PostgresSinkConfig,
    subtask: u32,
    uid: String,
    conn: Option<PgConnection>,
    in_transaction: bool,
    rows: u64,
    offsets: BTreeMap<String, i64>,
}

impl UpsertPostgresSink {
    /// An upsert sink for `config`.
    pub fn new(config: PostgresSinkConfig) -> Result<Self> {
        config.validate()?;
        Ok(UpsertPostgresSink {
            config,
            subtask: 0,
            uid: String::new(),
            conn: None,
            in_transaction: false,
            rows: 0,
            offsets: BTreeMap::new(),
        })
    }

    async fn begin_if_needed(&mut self) -> Result<()> {
        if self.conn.is_none() {
            self.conn = Some(db::connect(&self.config).await?);
        }
        if !self.in_transaction {
            let conn = self.conn.as_mut().expect("connected");
            db::exec(conn, "BEGIN ISOLATION LEVEL READ COMMITTED".into())
                .await
                .map_err(|e| PostgresSinkError::db("BEGIN", e))?;
            self.in_transaction = true;
        }
        Ok(())
    }

    /// The transaction is gone with an error: the restart replays from the checkpoint.
    fn forget_connection(&mut self) {
        self.conn = None;
        self.in_transaction = false;
    }
}

impl Sink<PgRecord> for UpsertPostgresSink {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        self.subtask = ctx.info.index;
        self.uid = ctx.info.uid.clone();
        let mut conn = db::connect(&self.config).await?;
        db::ensure_tables(&mut conn, &self.config).await?;
        self.conn = Some(conn);
        Ok(())
    }

    async fn write(&mut self, records: Vec<PgRecord>) -> exactly_core::Result<()> {
        let rows = db::convert(&self.config, records, true, &mut self.offsets)?;
        self.rows += rows.count;
        self.begin_if_needed().await?;
        let conn = self.conn.as_mut().expect("connected");
        let result = db::write(conn, &self.config, rows, true).await;
        if result.is_err() {
            self.forget_connection();
        }
        Ok(result?)
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        self.begin_if_needed().await?;
        let (subtask, rows, id) = (self.subtask, self.rows, ctx.checkpoint_id);
        let conn = self.conn.as_mut().expect("connected");
        let config = &self.config;
        let offsets = &self.offsets;
        let uid = &self.uid;
        let result = async {
            db::progress(conn, config, subtask, id, offsets, rows).await?;
            db::summarise_progress(conn, config, subtask, id).await?;
            failpoint::hit_in(uid, "sink.before_pre_commit");
            db::exec(conn, "COMMIT".into())
                .await
                .map_err(|e| PostgresSinkError::db("COMMIT", e))?;
            failpoint::hit_in(uid, "sink.after_pre_commit");
            Ok::<(), PostgresSinkError>(())
        }
        .await;
        self.in_transaction = false;
        self.rows = 0;
        if result.is_err() {
            self.forget_connection();
        }
        Ok(result?)
    }

    async fn close(&mut self) -> exactly_core::Result<()> {
        if let Some(conn) = self.conn.take() {
            // Rows after the last checkpoint were not committed: the transaction rolls back.
            db::close(conn).await;
        }
        Ok(())
    }
}
