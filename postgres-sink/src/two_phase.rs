//! Mode `two_phase`: one prepared transaction per subtask per checkpoint.
//!
//! Records go into an ordinary transaction on the subtask's write connection. At the barrier the
//! progress row is written into it and `PREPARE TRANSACTION 'gid'` detaches it from the session
//! (it survives a server crash and any disconnect); the session takes the next checkpoint's
//! transaction at once. When the checkpoint completes, `COMMIT PREPARED` (on a second connection:
//! it cannot run inside a transaction block) makes it visible. A commit of an unknown gid
//! (SQLSTATE 42704) is settled by the progress row written inside the transaction: present, it
//! committed earlier; absent and not in `pg_prepared_xacts`, it was rolled back — lost.

use std::collections::{BTreeMap, BTreeSet};

use exactly_core::runtime::SubtaskInfo;
use exactly_core::CheckpointId;
use exactly_twophase::prepared::{commit_result, postgres_answer, settle, CommitAnswer, Settle};
use exactly_twophase::{CommitError, PreCommitted, RecoveryContext, TwoPhaseCommitSink};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgConnection;
use tracing::{info, warn};

use crate::config::PostgresSinkConfig;
use crate::db;
use crate::error::{sqlstate, PostgresSinkError, Result};
use crate::PgRecord;

/// SQLSTATE of `COMMIT PREPARED` / `ROLLBACK PREPARED` for a gid the server does not have.
const UNDEFINED_OBJECT: &str = "42704";
/// SQLSTATE of a statement that gave up waiting for a lock (`lock_timeout`).
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// A prepared transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgCommittable {
    /// Format version.
    pub version: u32,
    /// Subtask that prepared it.
    pub subtask: u32,
    /// The checkpoint whose barrier closed it (its progress row carries this id).
    pub checkpoint_id: u64,
    /// Its global transaction id (`exactly:{job}:{sink}:{subtask}:{checkpoint}`).
    pub gid: String,
}

/// An open transaction on the write connection.
pub struct PgTransaction {
    conn: PgConnection,
    rows: u64,
    offsets: BTreeMap<String, i64>,
    /// Changes (`insert_mode = "upsert"`) held back while an earlier transaction of this sink is
    /// prepared and not committed: it keeps its rows locked until its commit, which this same
    /// subtask runs when it hears the checkpoint completed — a statement waiting for those locks
    /// would wait for itself. Written once the earlier one is committed, at the latest before
    /// this one is prepared.
    held: db::Rows,
}

impl std::fmt::Debug for PgTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTransaction")
            .field("rows", &self.rows)
            .field("offsets", &self.offsets)
            .finish_non_exhaustive()
    }
}

/// The two-phase PostgreSQL sink, driven by `exactly_twophase::TwoPhaseSink`.
pub struct TwoPhasePostgresSink {
    config: PostgresSinkConfig,
    info: Option<SubtaskInfo>,
    /// The write connection between transactions (a prepared transaction leaves it free).
    idle: Option<PgConnection>,
    /// Transactions this sink prepared that are not committed yet (their rows stay locked).
    uncommitted: BTreeSet<String>,
}

/// How long a transaction's changes wait for rows an earlier prepared transaction still holds,
/// when they must be written before its checkpoint can complete (see [`PgTransaction::held`]).
const HELD_LOCK_WAIT_S: u32 = 10;

/// Quotes a string literal (gids are checked to need no escaping, but never trust that here).
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl TwoPhasePostgresSink {
    /// A two-phase sink for `config`.
    pub fn new(config: PostgresSinkConfig) -> Result<Self> {
        config.validate()?;
        Ok(TwoPhasePostgresSink {
            config,
            info: None,
            idle: None,
            uncommitted: BTreeSet::new(),
        })
    }

    fn subtask(&self) -> u32 {
        self.info.as_ref().map_or(0, |i| i.index)
    }

    /// Every gid of this sink starts with this.
    fn gid_prefix(&self) -> String {
        format!("exactly:{}:{}:", self.config.job_id, self.config.sink_id)
    }

    /// This sink's prepared transactions in the configured database: (gid, subtask).
    async fn prepared(&self, conn: &mut PgConnection) -> Result<Vec<(String, u32)>, sqlx::Error> {
        let prefix = self.gid_prefix();
        let gids: Vec<String> = sqlx::query_scalar(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, $1)",
        )
        .bind(&prefix)
        .fetch_all(&mut *conn)
        .await?;
        Ok(gids
            .into_iter()
            .filter_map(|g| {
                let subtask = g[prefix.len()..].split(':').next()?.parse().ok()?;
                Some((g, subtask))
            })
            .collect())
    }

    /// Commits `c` on `conn`; already committed is success. The decisions are
    /// [`exactly_twophase::prepared::PreparedCommit`]'s, driven by [`settle`] (shared with the MySQL sink and simulated in `exactly-twophase`): a
    /// transaction COMMIT PREPARED does not know is settled by listing the prepared transactions
    /// (still there: alive, tried again), then by its progress row (present: committed earlier;
    /// absent: rolled back). One that another session is committing (busy, 55000) is tried again.
    async fn commit_on(&self, conn: &mut PgConnection, c: &PgCommittable) -> Result<(), CommitError> {
        let mut prepared = Prepared { sink: self, conn, c };
        let decided = settle(&mut prepared, 1).await?;
        commit_result(
            decided,
            format!("prepared transaction {} of checkpoint {}", c.gid, c.checkpoint_id),
        )
    }

    async fn write_connection(&mut self) -> Result<PgConnection> {
        match self.idle.take() {
            Some(c) => Ok(c),
            None => db::connect(&self.config).await,
        }
    }
}

impl TwoPhaseCommitSink<PgRecord> for TwoPhasePostgresSink {
    type Transaction = PgTransaction;
    type Committable = PgCommittable;

    async fn open(&mut self, info: &SubtaskInfo) -> exactly_core::Result<()> {
        self.info = Some(info.clone());
        let mut conn = db::connect(&self.config).await?;
        let max: String = sqlx::query_scalar("SELECT current_setting('max_prepared_transactions')")
            .fetch_one(&mut conn)
            .await
            .map_err(|e| PostgresSinkError::db("reading max_prepared_transactions", e))?;
        if max.trim() == "0" {
            return Err(PostgresSinkError::Config(
                "the server has max_prepared_transactions = 0, so PREPARE TRANSACTION is refused: set it (e.g. to max_connections) and restart PostgreSQL, or use mode `upsert`".into(),
            )
            .into());
        }
        self.prepared(&mut conn)
            .await
            .map_err(|e| PostgresSinkError::db("reading pg_prepared_xacts", e))?;
        db::ensure_tables(&mut conn, &self.config).await?;
        db::close(conn).await;
        Ok(())
    }

    async fn begin(&mut self, _checkpoint_id: CheckpointId) -> exactly_core::Result<PgTransaction> {
        let mut conn = self.write_connection().await?;
        db::exec(&mut conn, "BEGIN ISOLATION LEVEL READ COMMITTED".into())
            .await
            .map_err(|e| PostgresSinkError::db("BEGIN", e))?;
        Ok(PgTransaction {
            conn,
            rows: 0,
            offsets: BTreeMap::new(),
            held: db::Rows::default(),
        })
    }

    async fn write(&mut self, txn: &mut PgTransaction, records: Vec<PgRecord>) -> exactly_core::Result<()> {
        let upserts = self.config.upserts();
        let rows = db::convert(&self.config, records, upserts, &mut txn.offsets)?;
        txn.rows += rows.count;
        txn.held.append(rows);
        if upserts && !self.uncommitted.is_empty() {
            return Ok(());
        }
        // An error here loses the unprepared transaction (the server rolls it back): fail the
        // attempt, the restart replays from the checkpoint.
        let rows = std::mem::take(&mut txn.held);
        db::write(&mut txn.conn, &self.config, rows, upserts).await?;
        Ok(())
    }

    async fn pre_commit(
        &mut self,
        mut txn: PgTransaction,
        checkpoint_id: CheckpointId,
    ) -> exactly_core::Result<PreCommitted<PgCommittable, PgTransaction>> {
        if txn.rows == 0 {
            db::exec(&mut txn.conn, "ROLLBACK".into())
                .await
                .map_err(|e| PostgresSinkError::db("ROLLBACK", e))?;
            self.idle = Some(txn.conn);
            return Ok(PreCommitted::Empty);
        }
        if txn.held.count > 0 && self.uncommitted.is_empty() {
            let rows = std::mem::take(&mut txn.held);
            db::write(&mut txn.conn, &self.config, rows, true).await?;
        } else if txn.held.count > 0 {
            let waiting_for: Vec<&String> = self.uncommitted.iter().collect();
            warn!(
                checkpoint_id,
                earlier = ?waiting_for,
                "An earlier checkpoint's prepared transaction is not committed (its checkpoint has not completed): this checkpoint's changes are written now and wait up to {HELD_LOCK_WAIT_S} s for rows it holds."
            );
            db::exec(&mut txn.conn, format!("SET LOCAL lock_timeout = '{HELD_LOCK_WAIT_S}s'"))
                .await
                .map_err(|e| PostgresSinkError::db("setting lock_timeout", e))?;
            let rows = std::mem::take(&mut txn.held);
            db::write(&mut txn.conn, &self.config, rows, true).await.map_err(|e| match e {
                // Restarts the job, which recovers from its last checkpoint.
                PostgresSinkError::Database { context, source } if sqlstate(&source).as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                    PostgresSinkError::db(
                        format!("{context}: checkpoint {checkpoint_id}'s changes, held back while the prepared transactions {waiting_for:?} of earlier checkpoints (not completed) hold their rows"),
                        source,
                    )
                }
                other => other,
            })?;
        }
        let subtask = self.subtask();
        db::progress(
            &mut txn.conn,
            &self.config,
            subtask,
            checkpoint_id,
            &txn.offsets,
            txn.rows,
        )
        .await?;
        let gid = format!("{}{subtask}:{checkpoint_id}", self.gid_prefix());
        db::exec(&mut txn.conn, format!("PREPARE TRANSACTION {}", literal(&gid)))
            .await
            .map_err(|e| PostgresSinkError::db("PREPARE TRANSACTION", e))?;
        // Detached from the session: durable, and any session can finish it.
        self.idle = Some(txn.conn);
        self.uncommitted.insert(gid.clone());
        Ok(PreCommitted::Committable(PgCommittable {
            version: 1,
            subtask,
            checkpoint_id,
            gid,
        }))
    }

    async fn commit(&mut self, c: &PgCommittable) -> Result<(), CommitError> {
        // Classified (a server that refuses or does not answer is an outage).
        let mut conn = db::connect(&self.config)
            .await
            .map_err(|e| CommitError::Retriable(exactly_core::CoreError::from(e).into()))?;
        let outcome = self.commit_on(&mut conn, c).await;
        if outcome.is_ok() {
            self.uncommitted.remove(&c.gid);
            // Bounded progress table; a failure here loses nothing (the rows stay a while longer).
            if let Err(e) = db::summarise_progress(&mut conn, &self.config, c.subtask, c.checkpoint_id).await {
                warn!(error = %e, "Could not summarise the progress table; retried at the next commit.");
            }
        }
        db::close(conn).await;
        outcome
    }

    async fn abort(&mut self, mut txn: PgTransaction) -> exactly_core::Result<()> {
        db::exec(&mut txn.conn, "ROLLBACK".into())
            .await
            .map_err(|e| PostgresSinkError::db("ROLLBACK", e))?;
        db::close(txn.conn).await;
        Ok(())
    }

    /// Its progress rows record every commit (written in the committed transaction).
    fn records_commits(&self) -> bool {
        true
    }

    async fn committed_through(
        &mut self,
        ctx: &RecoveryContext<'_, PgCommittable>,
    ) -> exactly_core::Result<Option<CheckpointId>> {
        let mut conn = db::connect(&self.config).await?;
        let newest = db::committed_through(&mut conn, &self.config, ctx.info.index, ctx.info.parallelism).await;
        db::close(conn).await;
        Ok(newest?)
    }

    async fn forget_commits_after(
        &mut self,
        ctx: &RecoveryContext<'_, PgCommittable>,
        id: CheckpointId,
    ) -> exactly_core::Result<()> {
        let mut conn = db::connect(&self.config).await?;
        let done = db::forget_after(&mut conn, &self.config, ctx.info.index, ctx.info.parallelism, id).await;
        db::close(conn).await;
        Ok(done?)
    }

    async fn abort_lingering(&mut self, ctx: &RecoveryContext<'_, PgCommittable>) -> exactly_core::Result<()> {
        let mut conn = db::connect(&self.config).await?;
        let listed = self
            .prepared(&mut conn)
            .await
            .map_err(|e| PostgresSinkError::db("reading pg_prepared_xacts", e))?;
        let pending: Vec<&str> = ctx.all_restored.iter().map(|(_, c)| c.gid.as_str()).collect();
        let me = ctx.info.index;
        let mut rolled_back = 0;
        for (gid, subtask) in listed {
            let mine = subtask == me || (me == 0 && subtask >= ctx.info.parallelism);
            if !mine || pending.contains(&gid.as_str()) {
                continue;
            }
            ctx.check_still_owner().await?;
            warn!(gid = %gid, "Rolling back a prepared transaction no checkpoint needs.");
            match db::exec(&mut conn, format!("ROLLBACK PREPARED {}", literal(&gid))).await {
                Ok(()) => rolled_back += 1,
                // Finished meanwhile by someone else: nothing left to do.
                Err(e) if sqlstate(&e).as_deref() == Some(UNDEFINED_OBJECT) => {}
                Err(e) => return Err(PostgresSinkError::db("ROLLBACK PREPARED", e).into()),
            }
        }
        if rolled_back > 0 {
            info!(rolled_back, "Lingering prepared transactions rolled back.");
        }
        db::close(conn).await;
        Ok(())
    }
}

/// One prepared transaction being settled on a connection ([`settle`]'s steps).
struct Prepared<'a> {
    sink: &'a TwoPhasePostgresSink,
    conn: &'a mut PgConnection,
    c: &'a PgCommittable,
}

impl Settle for Prepared<'_> {
    type Error = CommitError;

    async fn commit(&mut self) -> CommitAnswer {
        match db::exec(self.conn, format!("COMMIT PREPARED {}", literal(&self.c.gid))).await {
            Ok(()) => CommitAnswer::Committed,
            Err(e) => postgres_answer(sqlstate(&e).as_deref(), e.to_string()),
        }
    }

    async fn listed(&mut self) -> Result<bool, CommitError> {
        let listed = self
            .sink
            .prepared(self.conn)
            .await
            .map_err(|e| CommitError::Retriable(e.into()))?;
        Ok(listed.iter().any(|(g, _)| *g == self.c.gid))
    }

    async fn recorded(&mut self) -> Result<bool, CommitError> {
        db::has_progress(self.conn, &self.sink.config, self.c.subtask, self.c.checkpoint_id)
            .await
            .map_err(|e| CommitError::Retriable(e.into()))
    }

    /// PostgreSQL settles a transaction at once (no session detaching from it): the one check
    /// allowed never pauses.
    async fn pause(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_quoted() {
        assert_eq!(literal("exactly:j:s:0:7"), "'exactly:j:s:0:7'");
        assert_eq!(literal("a'b"), "'a''b'");
    }
}
