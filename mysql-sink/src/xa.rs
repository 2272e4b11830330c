//! Mode `xa`: one XA branch per subtask per checkpoint.
//!
//! The branch is prepared at the barrier (XA END, XA PREPARE) together with a progress row, and
//! the connection that prepared it is closed: MariaDB lets another connection finish a prepared
//! branch only once its preparing connection is gone. It is committed from a fresh connection
//! when the checkpoint completes. MariaDB answers XAER_NOTA (1397) both for "already committed"
//! and for "unknown": the progress row, written inside the branch, tells them apart.

use std::collections::BTreeMap;

use exactly_core::runtime::SubtaskInfo;
use exactly_core::CheckpointId;
use exactly_twophase::{CommitError, PreCommitted, RecoveryContext, TwoPhaseCommitSink};
use serde::{Deserialize, Serialize};
use sqlx::mysql::{MySqlConnection, MySqlDatabaseError};
use sqlx::Row;
use tracing::{info, warn};

use crate::config::MysqlSinkConfig;
use crate::db;
use crate::error::{MysqlSinkError, Result};
use crate::SinkRecord;

const XAER_NOTA: u16 = 1397;
const ACCESS_DENIED: u16 = 1227;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

/// A prepared branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XaCommittable {
    /// Format version.
    pub version: u32,
    /// Subtask that prepared it.
    pub subtask: u32,
    /// The checkpoint whose barrier closed it (its progress row carries this id).
    pub checkpoint_id: u64,
    /// Branch qualifier.
    pub bqual: String,
}

/// An open branch.
pub struct XaTransaction {
    conn: MySqlConnection,
    bqual: String,
    rows: u64,
    offsets: BTreeMap<String, i64>,
}

/// The XA sink, driven by `exactly_twophase::TwoPhaseSink`.
pub struct XaMysqlSink {
    config: MysqlSinkConfig,
    gtrid: String,
    info: Option<SubtaskInfo>,
}

fn code(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<MySqlDatabaseError>())
        .map(|d| d.number())
}

impl XaMysqlSink {
    /// An XA sink for `config`.
    pub fn new(config: MysqlSinkConfig) -> Result<Self> {
        config.validate()?;
        let gtrid = format!("exactly:{}:{}", config.job_id, config.sink_id);
        Ok(XaMysqlSink {
            config,
            gtrid,
            info: None,
        })
    }

    fn xid(&self, bqual: &str) -> String {
        format!("X'{}', X'{}', 1", hex(self.gtrid.as_bytes()), hex(bqual.as_bytes()))
    }

    fn subtask(&self) -> u32 {
        self.info.as_ref().map_or(0, |i| i.index)
    }

    fn xa<'a>(
        &self,
        conn: &'a mut MySqlConnection,
        statement: &str,
        bqual: &str,
    ) -> db::BoxFut<'a, Result<(), sqlx::Error>> {
        db::exec(conn, format!("{statement} {}", self.xid(bqual)))
    }
}

impl TwoPhaseCommitSink<SinkRecord> for XaMysqlSink {
    type Transaction = XaTransaction;
    type Committable = XaCommittable;

    async fn open(&mut self, info: &SubtaskInfo) -> exactly_core::Result<()> {
        self.info = Some(info.clone());
        let mut conn = db::connect(&self.config.url).await?;
        db::ensure_tables(&mut conn, &self.config).await?;
        db::close(conn).await;
        Ok(())
    }

    async fn begin(&mut self, checkpoint_id: CheckpointId) -> exactly_core::Result<XaTransaction> {
        let mut conn = db::connect(&self.config.url).await?;
        // Fewer gap locks: branches of consecutive checkpoints do not block each other.
        db::exec(
            &mut conn,
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".into(),
        )
        .await
        .map_err(|e| MysqlSinkError::db("setting the isolation level", e))?;
        let bqual = format!("{}:{checkpoint_id}", self.subtask());
        self.xa(&mut conn, "XA START", &bqual)
            .await
            .map_err(|e| MysqlSinkError::db("XA START", e))?;
        Ok(XaTransaction {
            conn,
            bqual,
            rows: 0,
            offsets: BTreeMap::new(),
        })
    }

    async fn write(&mut self, txn: &mut XaTransaction, records: Vec<SinkRecord>) -> exactly_core::Result<()> {
        let data = db::convert(&self.config, records, &mut txn.offsets)?;
        txn.rows += (data.rows.len() + data.dead.len()) as u64;
        // An error here loses the unprepared branch (the server rolls it back): fail the
        // attempt, the restart replays from the checkpoint.
        db::insert(&mut txn.conn, &self.config, data, false).await?;
        Ok(())
    }

    async fn pre_commit(
        &mut self,
        mut txn: XaTransaction,
        checkpoint_id: CheckpointId,
    ) -> exactly_core::Result<PreCommitted<XaCommittable, XaTransaction>> {
        if txn.rows == 0 {
            self.xa(&mut txn.conn, "XA END", &txn.bqual)
                .await
                .map_err(|e| MysqlSinkError::db("XA END", e))?;
            self.xa(&mut txn.conn, "XA ROLLBACK", &txn.bqual)
                .await
                .map_err(|e| MysqlSinkError::db("XA ROLLBACK", e))?;
            db::close(txn.conn).await;
            return Ok(PreCommitted::Empty);
        }
        db::progress(
            &mut txn.conn,
            &self.config,
            self.subtask(),
            checkpoint_id,
            &txn.offsets,
            txn.rows,
        )
        .await?;
        self.xa(&mut txn.conn, "XA END", &txn.bqual)
            .await
            .map_err(|e| MysqlSinkError::db("XA END", e))?;
        self.xa(&mut txn.conn, "XA PREPARE", &txn.bqual)
            .await
            .map_err(|e| MysqlSinkError::db("XA PREPARE", e))?;
        // Released, so that any connection (ours after a restart included) can finish it.
        db::close(txn.conn).await;
        Ok(PreCommitted::Committable(XaCommittable {
            version: 1,
            subtask: self.subtask(),
            checkpoint_id,
            bqual: txn.bqual,
        }))
    }

    async fn commit(&mut self, c: &XaCommittable) -> Result<(), CommitError> {
        let mut conn = db::connect(&self.config.url)
            .await
            .map_err(|e| CommitError::Retriable(e.into()))?;
        let result = self.xa(&mut conn, "XA COMMIT", &c.bqual).await;
        let outcome = match result {
            Ok(()) => Ok(()),
            Err(e) if code(&e) == Some(XAER_NOTA) => {
                match db::has_progress(&mut conn, &self.config, c.subtask, c.checkpoint_id).await {
                    Ok(true) => Ok(()), // committed earlier (before a crash or a lost answer)
                    Ok(false) => Err(CommitError::Lost {
                        what: format!("XA branch {} of checkpoint {}", c.bqual, c.checkpoint_id),
                        source: "the server no longer has it and its progress row is absent: it was rolled back".into(),
                    }),
                    Err(e) => Err(CommitError::Retriable(e.into())),
                }
            }
            Err(e) if e.as_database_error().is_none() => Err(CommitError::Retriable(e.into())),
            Err(e) => Err(CommitError::Fatal(e.into())),
        };
        if outcome.is_ok() {
            // Keep the progress table small: rows 100 checkpoints old are history.
            let _ = db::exec(
                &mut conn,
                format!(
                    "DELETE FROM `{}` WHERE job = '{}' AND sink = '{}' AND subtask = {} AND checkpoint_id < {}",
                    self.config.progress_table,
                    self.config.job_id,
                    self.config.sink_id,
                    c.subtask,
                    c.checkpoint_id.saturating_sub(100)
                ),
            )
            .await;
        }
        db::close(conn).await;
        outcome
    }

    async fn abort(&mut self, mut txn: XaTransaction) -> exactly_core::Result<()> {
        let _ = self.xa(&mut txn.conn, "XA END", &txn.bqual).await;
        self.xa(&mut txn.conn, "XA ROLLBACK", &txn.bqual)
            .await
            .map_err(|e| MysqlSinkError::db("XA ROLLBACK", e))?;
        db::close(txn.conn).await;
        Ok(())
    }

    async fn abort_lingering(&mut self, ctx: &RecoveryContext<'_, XaCommittable>) -> exactly_core::Result<()> {
        let mut conn = db::connect(&self.config.url).await?;
        let rows = match db::fetch(&mut conn, "XA RECOVER".into()).await {
            Ok(rows) => rows,
            Err(e) if code(&e) == Some(ACCESS_DENIED) => {
                return Err(MysqlSinkError::XaRecoverDenied(e.to_string()).into())
            }
            Err(e) => return Err(MysqlSinkError::db("XA RECOVER", e).into()),
        };
        let pending: Vec<&str> = ctx.all_restored.iter().map(|(_, c)| c.bqual.as_str()).collect();
        let me = ctx.info.index;
        let mut rolled_back = 0;
        for row in rows {
            let data = row
                .try_get::<Vec<u8>, _>("data")
                .or_else(|_| row.try_get::<String, _>("data").map(String::into_bytes));
            let (Ok(g), Ok(b), Ok(data)) = (
                row.try_get::<i64, _>("gtrid_length"),
                row.try_get::<i64, _>("bqual_length"),
                data,
            ) else {
                warn!("An XA RECOVER row could not be read; skipping it.");
                continue;
            };
            let (g, b) = (g as usize, b as usize);
            if data.len() < g + b || &data[..g] != self.gtrid.as_bytes() {
                continue;
            }
            let bqual = String::from_utf8_lossy(&data[g..g + b]).into_owned();
            let Some(subtask) = bqual.split(':').next().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let mine = subtask == me || (me == 0 && subtask >= ctx.info.parallelism);
            if !mine || pending.contains(&bqual.as_str()) {
                continue;
            }
            warn!(bqual = %bqual, "Rolling back a prepared XA branch no checkpoint needs.");
            self.xa(&mut conn, "XA ROLLBACK", &bqual)
                .await
                .map_err(|e| MysqlSinkError::db("XA ROLLBACK", e))?;
            rolled_back += 1;
        }
        if rolled_back > 0 {
            info!(rolled_back, "Lingering XA branches rolled back.");
        }
        db::close(conn).await;
        Ok(())
    }
}
