//! Mode `upsert`: each checkpoint's rows and its progress row in one ordinary transaction,
//! committed at the barrier; a replay after a crash overwrites the same rows with the same values.

use std::collections::BTreeMap;

use exactly_core::runtime::{InitContext, Sink, SnapshotContext};
use sqlx::mysql::MySqlConnection;

use crate::config::MysqlSinkConfig;
use crate::db;
use crate::error::{MysqlSinkError, Result};
use crate::SinkRecord;

/// The idempotent sink.
pub struct UpsertMysqlSink {
    config: MysqlSinkConfig,
    subtask: u32,
    conn: Option<MySqlConnection>,
    in_transaction: bool,
    rows: u64,
    offsets: BTreeMap<String, i64>,
}

impl UpsertMysqlSink {
    /// An upsert sink for `config`.
    pub fn new(config: MysqlSinkConfig) -> Result<Self> {
        config.validate()?;
        Ok(UpsertMysqlSink {
            config,
            subtask: 0,
            conn: None,
            in_transaction: false,
            rows: 0,
            offsets: BTreeMap::new(),
        })
    }

    async fn conn(&mut self) -> Result<&mut MySqlConnection> {
        if self.conn.is_none() {
            self.conn = Some(db::connect(&self.config).await?);
        }
        Ok(self.conn.as_mut().expect("just connected"))
    }

    async fn begin_if_needed(&mut self) -> Result<()> {
        if !self.in_transaction {
            let conn = self.conn().await?;
            db::exec(conn, "START TRANSACTION".into())
                .await
                .map_err(|e| MysqlSinkError::db("BEGIN", e))?;
            self.in_transaction = true;
        }
        Ok(())
    }
}

impl Sink<SinkRecord> for UpsertMysqlSink {
    async fn initialize_state(&mut self, ctx: &InitContext<'_>) -> exactly_core::Result<()> {
        self.subtask = ctx.info.index;
        let config = self.config.clone();
        db::ensure_tables(self.conn().await?, &config).await?;
        Ok(())
    }

    async fn write(&mut self, records: Vec<SinkRecord>) -> exactly_core::Result<()> {
        let data = db::convert(&self.config, records, &mut self.offsets)?;
        self.rows += data.len() as u64;
        self.begin_if_needed().await?;
        let config = self.config.clone();
        let result = db::insert(self.conn().await?, &config, data, true).await;
        if result.is_err() {
            // The transaction is gone with the error; the restart replays from the checkpoint.
            self.conn = None;
            self.in_transaction = false;
        }
        Ok(result?)
    }

    async fn snapshot_state(&mut self, ctx: &mut SnapshotContext) -> exactly_core::Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        self.begin_if_needed().await?;
        let (config, subtask, offsets, rows) = (self.config.clone(), self.subtask, self.offsets.clone(), self.rows);
        let conn = self.conn().await?;
        let result = async {
            db::progress(conn, &config, subtask, ctx.checkpoint_id, &offsets, rows).await?;
            exactly_core::failpoint::hit("sink.before_pre_commit");
            db::exec(conn, "COMMIT".into())
                .await
                .map_err(|e| MysqlSinkError::db("COMMIT", e))?;
            exactly_core::failpoint::hit("sink.after_pre_commit");
            Ok::<(), MysqlSinkError>(())
        }
        .await;
        self.in_transaction = false;
        self.rows = 0;
        if result.is_err() {
            self.conn = None;
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
