//! Mode `xa`: one XA branch per subtask per checkpoint.
//!
//! The branch is prepared at the barrier (XA END, XA PREPARE) together with a progress row, and
//! the connection that prepared it is closed: MariaDB lets another connection finish a prepared
//! branch only once its preparing connection is gone. It is committed from a fresh connection
//! when the checkpoint completes. MariaDB answers XAER_NOTA (1397) both for "already committed"
//! and for "unknown": the progress row, written inside the branch, tells them apart.

use std::collections::{BTreeMap, BTreeSet};

use exactly_core::runtime::SubtaskInfo;
use exactly_core::CheckpointId;
use exactly_twophase::prepared::{commit_result, mysql_answer, settle, CommitAnswer, Settle};
use exactly_twophase::{CommitError, PreCommitted, RecoveryContext, TwoPhaseCommitSink};
use serde::{Deserialize, Serialize};
use sqlx::mysql::{MySqlConnection, MySqlDatabaseError};
use sqlx::Row;
use tracing::{info, warn};

use crate::config::MysqlSinkConfig;
use crate::db;
use crate::error::{MysqlSinkError, Result};
use crate::SinkRecord;

#[cfg(test)]
const XAER_NOTA: u16 = 1397;
const ACCESS_DENIED: u16 = 1227;
const LOCK_WAIT_TIMEOUT: u16 = 1205;

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
    /// Changes (`insert_mode = "upsert"`) held back while an earlier branch of this sink is
    /// prepared and not committed: that branch keeps its rows locked until its commit, which
    /// this same subtask runs when it hears the checkpoint completed — a statement waiting for
    /// those locks would wait for itself. Written once the earlier branch is committed, at the
    /// latest before this one is prepared.
    held: db::Converted,
}

/// The XA sink, driven by `exactly_twophase::TwoPhaseSink`.
pub struct XaMysqlSink {
    config: MysqlSinkConfig,
    gtrid: String,
    info: Option<SubtaskInfo>,
    /// Branches this sink prepared that are not committed yet (their rows stay locked).
    uncommitted: BTreeSet<String>,
}

/// How long a branch's changes wait for rows an earlier branch still holds, when they must be
/// written before its checkpoint can complete (see [`XaTransaction::held`]).
const HELD_LOCK_WAIT_S: u32 = 10;

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
            uncommitted: BTreeSet::new(),
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

/// One prepared branch being settled on a connection ([`settle`]'s steps).
struct XaBranch<'a> {
    sink: &'a XaMysqlSink,
    conn: &'a mut MySqlConnection,
    c: &'a XaCommittable,
}

impl Settle for XaBranch<'_> {
    type Error = CommitError;

    async fn commit(&mut self) -> CommitAnswer {
        match self.sink.xa(self.conn, "XA COMMIT", &self.c.bqual).await {
            Ok(()) => CommitAnswer::Committed,
            Err(e) => mysql_answer(code(&e), e.to_string()),
        }
    }

    async fn listed(&mut self) -> Result<bool, CommitError> {
        let listed = self
            .sink
            .recover(self.conn)
            .await
            .map_err(|e| CommitError::Retriable(e.into()))?
            .contains(&self.c.bqual);
        if listed {
            warn!(bqual = %self.c.bqual, "XA COMMIT answered XAER_NOTA for a branch XA RECOVER lists; trying again.");
        }
        Ok(listed)
    }

    async fn recorded(&mut self) -> Result<bool, CommitError> {
        // Committed rows only, whatever the server's default isolation (a prepared branch's rows
        // are visible at READ UNCOMMITTED).
        db::read_committed(self.conn)
            .await
            .map_err(|e| CommitError::Retriable(e.into()))?;
        db::has_progress(self.conn, &self.sink.config, self.c.subtask, self.c.checkpoint_id)
            .await
            .map_err(|e| CommitError::Retriable(e.into()))
    }

    async fn pause(&mut self) {
        tokio::time::sleep(NOTA_PAUSE).await;
    }
}

/// Refuses servers whose prepared XA branches do not survive a crash or a disconnect: MariaDB
/// before 10.5 and MySQL before 8.0.30 (their binary log and XA recovery disagree after a crash).
pub(crate) fn check_xa_safe(version: &str) -> Result<()> {
    let mariadb = version.to_ascii_lowercase().contains("mariadb");
    let triple = |s: &str| {
        let mut n = s
            .split(|c: char| !c.is_ascii_digit())
            .map(|n| n.parse::<u32>().unwrap_or(0));
        (n.next().unwrap_or(0), n.next().unwrap_or(0), n.next().unwrap_or(0))
    };
    // MariaDB's "5.5.5-10.x" compatibility prefix: the real version follows it.
    let v = match (mariadb, triple(version), version.split_once('-')) {
        (true, (5, 5, 5), Some((_, rest))) => triple(rest),
        (_, v, _) => v,
    };
    let (ok, need) = if mariadb {
        (v >= (10, 5, 0), "MariaDB 10.5")
    } else {
        (v >= (8, 0, 30), "MySQL 8.0.30")
    };
    if ok {
        Ok(())
    } else {
        Err(MysqlSinkError::Config(format!(
            "mode `xa` needs {need} or later, whose prepared XA transactions survive a server crash; the server is {version}. Upgrade it, or use mode `upsert`"
        )))
    }
}

/// XA COMMIT of a missing branch: how often XA RECOVER is consulted before "gone" is believed,
/// and how long apart (the preparing session may still be detaching from it).
const NOTA_CHECKS: u32 = 10;
const NOTA_PAUSE: std::time::Duration = std::time::Duration::from_millis(300);

impl XaMysqlSink {
    /// Commits `c` on `conn`; already committed is success. The decisions are
    /// [`exactly_twophase::prepared::PreparedCommit`]'s, driven by [`settle`] (shared with the PostgreSQL sink and simulated in `exactly-twophase`):
    /// XAER_NOTA is not proof of anything — while XA RECOVER lists the branch it is alive (its
    /// preparing session may still be detaching, or another session is committing it) and the
    /// commit is tried again; only a branch absent from XA RECOVER, and then without a progress
    /// row, after every check, was rolled back.
    async fn commit_on(&self, conn: &mut MySqlConnection, c: &XaCommittable) -> Result<(), CommitError> {
        let mut branch = XaBranch { sink: self, conn, c };
        let decided = settle(&mut branch, NOTA_CHECKS).await?;
        commit_result(
            decided,
            format!("XA branch {} of checkpoint {}", c.bqual, c.checkpoint_id),
        )
    }

    /// The branch qualifiers of this sink's prepared branches (XA RECOVER, filtered by gtrid).
    /// A row that cannot be read is an error, never skipped: it could be one of ours, and a
    /// branch missing from this list reads as rolled back (DATA LOST) to `commit_on`.
    async fn recover(&self, conn: &mut MySqlConnection) -> Result<Vec<String>, sqlx::Error> {
        let rows = db::fetch(conn, "XA RECOVER".into()).await?;
        let mut out = Vec::new();
        for row in rows {
            let data = row
                .try_get::<Vec<u8>, _>("data")
                .or_else(|_| row.try_get::<String, _>("data").map(String::into_bytes))?;
            let g = row.try_get::<i64, _>("gtrid_length")?;
            let b = row.try_get::<i64, _>("bqual_length")?;
            let (g, b) = (g as usize, b as usize);
            if data.len() < g + b || &data[..g] != self.gtrid.as_bytes() {
                continue;
            }
            out.push(String::from_utf8_lossy(&data[g..g + b]).into_owned());
        }
        Ok(out)
    }
}

impl TwoPhaseCommitSink<SinkRecord> for XaMysqlSink {
    type Transaction = XaTransaction;
    type Committable = XaCommittable;

    async fn open(&mut self, info: &SubtaskInfo) -> exactly_core::Result<()> {
        self.info = Some(info.clone());
        let mut conn = db::connect(&self.config).await?;
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&mut conn)
            .await
            .map_err(|e| MysqlSinkError::db("reading the server version", e))?;
        check_xa_safe(&version)?;
        // MySQL 8 needs XA_RECOVER_ADMIN for recovery: find out now, not after a crash.
        if let Err(e) = self.recover(&mut conn).await {
            return Err(match code(&e) {
                Some(ACCESS_DENIED) => MysqlSinkError::XaRecoverDenied(e.to_string()),
                _ => MysqlSinkError::db("XA RECOVER", e),
            }
            .into());
        }
        db::ensure_tables(&mut conn, &self.config).await?;
        db::close(conn).await;
        Ok(())
    }

    async fn begin(&mut self, checkpoint_id: CheckpointId) -> exactly_core::Result<XaTransaction> {
        let mut conn = db::connect(&self.config).await?;
        // Fewer gap locks: branches of consecutive checkpoints do not block each other.
        db::read_committed(&mut conn).await?;
        let bqual = format!("{}:{checkpoint_id}", self.subtask());
        self.xa(&mut conn, "XA START", &bqual)
            .await
            .map_err(|e| MysqlSinkError::db("XA START", e))?;
        Ok(XaTransaction {
            conn,
            bqual,
            rows: 0,
            offsets: BTreeMap::new(),
            held: db::Converted::default(),
        })
    }

    async fn write(&mut self, txn: &mut XaTransaction, records: Vec<SinkRecord>) -> exactly_core::Result<()> {
        let data = db::convert(&self.config, records, &mut txn.offsets)?;
        txn.rows += data.len() as u64;
        txn.held.append(data);
        if self.config.upserts() && !self.uncommitted.is_empty() {
            return Ok(());
        }
        // An error here loses the unprepared branch (the server rolls it back): fail the
        // attempt, the restart replays from the checkpoint.
        let data = std::mem::take(&mut txn.held);
        db::insert(&mut txn.conn, &self.config, data, self.config.upserts()).await?;
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
        if txn.held.len() > 0 && self.uncommitted.is_empty() {
            let data = std::mem::take(&mut txn.held);
            db::insert(&mut txn.conn, &self.config, data, true).await?;
        } else if txn.held.len() > 0 {
            let waiting_for: Vec<&String> = self.uncommitted.iter().collect();
            warn!(
                checkpoint_id,
                earlier = ?waiting_for,
                "An earlier checkpoint's XA branch is not committed (its checkpoint has not completed): this checkpoint's changes are written now and wait up to {HELD_LOCK_WAIT_S} s for rows it holds."
            );
            db::exec(
                &mut txn.conn,
                format!("SET SESSION innodb_lock_wait_timeout = {HELD_LOCK_WAIT_S}"),
            )
            .await
            .map_err(|e| MysqlSinkError::db("setting innodb_lock_wait_timeout", e))?;
            let data = std::mem::take(&mut txn.held);
            db::insert(&mut txn.conn, &self.config, data, true).await.map_err(|e| match e {
                // Restarts the job, which recovers from its last checkpoint.
                MysqlSinkError::Database { context, source } if code(&source) == Some(LOCK_WAIT_TIMEOUT) => {
                    MysqlSinkError::db(
                        format!("{context}: checkpoint {checkpoint_id}'s changes, held back while the prepared XA branches {waiting_for:?} of earlier checkpoints (not completed) hold their rows"),
                        source,
                    )
                }
                other => other,
            })?;
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
        self.uncommitted.insert(txn.bqual.clone());
        Ok(PreCommitted::Committable(XaCommittable {
            version: 1,
            subtask: self.subtask(),
            checkpoint_id,
            bqual: txn.bqual,
        }))
    }

    async fn commit(&mut self, c: &XaCommittable) -> Result<(), CommitError> {
        // Classified (a server that refuses or does not answer is an outage).
        let mut conn = db::connect(&self.config)
            .await
            .map_err(|e| CommitError::Retriable(exactly_core::CoreError::from(e).into()))?;
        let outcome = self.commit_on(&mut conn, c).await;
        if outcome.is_ok() {
            self.uncommitted.remove(&c.bqual);
            // Bounded progress table; a failure here loses nothing (the rows stay a while longer).
            if let Err(e) = db::summarise_progress(&mut conn, &self.config, c.subtask, c.checkpoint_id).await {
                warn!(error = %e, "Could not summarise the progress table; retried at the next commit.");
            }
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

    /// Its progress rows record every commit (written in the committed transaction).
    fn records_commits(&self) -> bool {
        true
    }

    async fn committed_through(
        &mut self,
        ctx: &RecoveryContext<'_, XaCommittable>,
    ) -> exactly_core::Result<Option<CheckpointId>> {
        let mut conn = db::connect(&self.config).await?;
        // Committed rows only, whatever the server's default isolation (prepared branches'
        // rows are visible at READ UNCOMMITTED).
        db::read_committed(&mut conn).await?;
        let newest = db::committed_through(&mut conn, &self.config, ctx.info.index, ctx.info.parallelism).await;
        db::close(conn).await;
        Ok(newest?)
    }

    async fn forget_commits_after(
        &mut self,
        ctx: &RecoveryContext<'_, XaCommittable>,
        id: CheckpointId,
    ) -> exactly_core::Result<()> {
        let mut conn = db::connect(&self.config).await?;
        db::read_committed(&mut conn).await?;
        let done = db::forget_after(&mut conn, &self.config, ctx.info.index, ctx.info.parallelism, id).await;
        db::close(conn).await;
        Ok(done?)
    }

    async fn abort_lingering(&mut self, ctx: &RecoveryContext<'_, XaCommittable>) -> exactly_core::Result<()> {
        let mut conn = db::connect(&self.config).await?;
        let listed = match self.recover(&mut conn).await {
            Ok(listed) => listed,
            Err(e) if code(&e) == Some(ACCESS_DENIED) => {
                return Err(MysqlSinkError::XaRecoverDenied(e.to_string()).into())
            }
            Err(e) => return Err(MysqlSinkError::db("XA RECOVER", e).into()),
        };
        let pending: Vec<&str> = ctx.all_restored.iter().map(|(_, c)| c.bqual.as_str()).collect();
        let me = ctx.info.index;
        let mut rolled_back = 0;
        for bqual in listed {
            let Some(subtask) = bqual.split(':').next().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let mine = subtask == me || (me == 0 && subtask >= ctx.info.parallelism);
            if !mine || pending.contains(&bqual.as_str()) {
                continue;
            }
            ctx.check_still_owner().await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_whose_xa_is_not_crash_safe_are_refused() {
        for ok in [
            "10.11.6-MariaDB-0+deb12u1",
            "10.5.0-MariaDB",
            "5.5.5-10.6.12-MariaDB",
            "8.0.30",
            "8.4.2",
            "9.1.0",
        ] {
            assert!(check_xa_safe(ok).is_ok(), "{ok}");
        }
        for bad in [
            "10.4.32-MariaDB",
            "10.3.39-MariaDB-0+deb10u1",
            "5.5.5-10.4.1-MariaDB",
            "8.0.29",
            "5.7.44-log",
        ] {
            let err = check_xa_safe(bad).unwrap_err().to_string();
            assert!(err.contains(bad) && err.contains("upsert"), "{err}");
        }
    }

    #[test]
    fn only_errors_that_say_nothing_about_the_branch_are_tried_again() {
        for c in [1205, 1213, 1290, 1836, 1399, 1040] {
            assert!(
                matches!(mysql_answer(Some(c), String::new()), CommitAnswer::Unclear(_)),
                "{c}"
            );
        }
        assert_eq!(mysql_answer(Some(XAER_NOTA), String::new()), CommitAnswer::NotFound);
        for c in [ACCESS_DENIED, 1045, 1146] {
            assert!(
                matches!(mysql_answer(Some(c), String::new()), CommitAnswer::Refused(_)),
                "{c}"
            );
        }
    }
}
