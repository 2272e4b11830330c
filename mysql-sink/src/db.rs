//! Statements shared by both modes.

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlRow};
use sqlx::{ConnectOptions, Connection, MySql, QueryBuilder};
use std::collections::BTreeMap;
use tracing::warn;

use crate::config::{MysqlSinkConfig, OnError};
use crate::error::{MysqlSinkError, Result};
use crate::mapping::SqlValue;
use crate::SinkRecord;

pub(crate) use exactly_sql_sink::BoxFut;
use exactly_sql_sink::{Arg, Dialect, Progress, Set, Statement};

/// Runs text-protocol SQL (XA statements need it).
pub(crate) fn exec<'a>(conn: &'a mut MySqlConnection, sql: String) -> BoxFut<'a, Result<(), sqlx::Error>> {
    Box::pin(async move { sqlx::Executor::execute(conn, sql.as_str()).await.map(|_| ()) })
}

/// Runs text-protocol SQL returning rows.
pub(crate) fn fetch<'a>(conn: &'a mut MySqlConnection, sql: String) -> BoxFut<'a, Result<Vec<MySqlRow>, sqlx::Error>> {
    Box::pin(async move { sqlx::Executor::fetch_all(conn, sql.as_str()).await })
}

/// Bind parameters per statement stay well below MySQL's 65 535.
const MAX_BINDS: usize = 30_000;

pub(crate) fn connect(config: &MysqlSinkConfig) -> BoxFut<'_, Result<MySqlConnection>> {
    Box::pin(connect_url(&config.url, config.password_file.as_deref()))
}

/// Connects to the server of `url` (its TLS settings included), with the password of
/// `password_file` when given; errors name the server (never the credentials) and say whether it
/// resolves and answers.
pub async fn connect_url(url: &str, password_file: Option<&std::path::Path>) -> Result<MySqlConnection> {
    let options: MySqlConnectOptions = url
        .parse()
        .map_err(|e| MysqlSinkError::Config(format!("url does not parse: {e}")))?;
    let mut options = crate::tls::verified_by_default(url, options);
    if let Some(f) = password_file {
        let secret = exactly_core::secret::Secret::from_file(f).map_err(MysqlSinkError::Config)?;
        options = options.password(secret.expose());
    }
    match options.connect().await {
        Ok(c) => Ok(c),
        Err(e @ (sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut)) => {
            let address = exactly_core::net::url_address(url).unwrap_or_else(|| "the server".into());
            let probe = address.clone();
            let why = tokio::task::spawn_blocking(move || exactly_core::net::diagnose(&probe))
                .await
                .unwrap_or_default();
            Err(MysqlSinkError::db(format!("connecting to {address} ({why})"), e))
        }
        Err(e) => {
            let address = exactly_core::net::url_address(url).unwrap_or_else(|| "the server".into());
            Err(MysqlSinkError::db(format!("connecting to {address}"), e))
        }
    }
}

/// Creates the progress table, the dead-letter table and (if asked) the target table.
pub(crate) fn ensure_tables<'a>(conn: &'a mut MySqlConnection, c: &'a MysqlSinkConfig) -> BoxFut<'a, Result<()>> {
    Box::pin(async move {
        progress_tables(c).create(&MySqlDialect, conn).await?;
        if let OnError::DeadLetter { table } = &c.on_error {
            let ddl = format!(
            "CREATE TABLE IF NOT EXISTS `{table}` (id BIGINT AUTO_INCREMENT PRIMARY KEY, origin VARCHAR(255) NOT NULL, \
             payload LONGBLOB NOT NULL, error TEXT NOT NULL, at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) ENGINE=InnoDB"
        );
            exec(conn, ddl)
                .await
                .map_err(|e| MysqlSinkError::db("creating the dead-letter table", e))?;
        }
        if c.create_table {
            let ddl = c.mapping.ddl(&c.table);
            exec(conn, ddl)
                .await
                .map_err(|e| MysqlSinkError::db("creating the table", e))?;
        }
        Ok(())
    })
}

/// One statement's worth of a record, in input order.
pub(crate) enum Op {
    /// A row to insert (or upsert).
    Row(Vec<SqlValue>),
    /// The key columns' values of a row to delete (a tombstone, mode upsert).
    Delete(Vec<SqlValue>),
}

/// What one batch of records became.
#[derive(Default)]
pub(crate) struct Converted {
    pub(crate) ops: Vec<Op>,
    pub(crate) dead: Vec<(String, Vec<u8>, String)>,
}

impl Converted {
    /// Records that became a statement or a dead letter.
    pub(crate) fn len(&self) -> usize {
        self.ops.len() + self.dead.len()
    }

    /// `later`'s statements after these.
    pub(crate) fn append(&mut self, mut later: Converted) {
        self.ops.append(&mut later.ops);
        self.dead.append(&mut later.dead);
    }
}

/// Rows of the records, applying the error policy; also advances `offsets` (next offset per
/// topic partition) for the progress row.
pub(crate) fn convert(
    c: &MysqlSinkConfig,
    records: Vec<SinkRecord>,
    offsets: &mut BTreeMap<String, i64>,
) -> Result<Converted> {
    let mut out = Converted::default();
    for r in records {
        if let Some(o) = &r.origin {
            exactly_sql_sink::config::note_offset(offsets, &o.topic, o.partition, o.offset);
        }
        let op = match (&r.tombstone, c.upserts()) {
            (false, _) => c.mapping.row(&r.payload).map(Op::Row),
            // Kafka Connect's JDBC sink with delete.enabled: a tombstone deletes its key's row.
            (true, true) => match &r.key {
                Some(key) => c.mapping.key_values(key).map(Op::Delete),
                None => Err("a tombstone without a key cannot say which row to delete".into()),
            },
            (true, false) => Err(
                "a tombstone (a record without a value) has no row to insert; insert_mode `upsert` (or mode `upsert`) deletes its key's row".into(),
            ),
        };
        match op {
            Ok(op) => out.ops.push(op),
            Err(reason) => {
                let origin = r.origin_text();
                match &c.on_error {
                    OnError::Fail => return Err(MysqlSinkError::BadRecord { origin, reason }),
                    OnError::Skip => warn!(%origin, %reason, "Skipping a record that does not fit the mapping."),
                    OnError::DeadLetter { .. } => {
                        warn!(%origin, %reason, "A record that does not fit the mapping goes to the dead-letter table.");
                        out.dead.push((origin, r.payload, reason));
                    }
                }
            }
        }
    }
    Ok(out)
}

fn bind<'q>(
    q: sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments>,
    v: &SqlValue,
) -> sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments> {
    match v {
        SqlValue::Null => q.bind(Option::<i64>::None),
        SqlValue::Int(i) => q.bind(*i),
        SqlValue::Float(f) => q.bind(*f),
        SqlValue::Bool(x) => q.bind(*x),
        SqlValue::Text(s) => q.bind(s.clone()),
    }
}

/// Batched multi-row INSERT (or upsert) of the rows and the deletes, in input order, and the
/// dead letters.
pub(crate) fn insert<'a>(
    conn: &'a mut MySqlConnection,
    c: &'a MysqlSinkConfig,
    data: Converted,
    upsert: bool,
) -> BoxFut<'a, Result<()>> {
    Box::pin(async move {
        let per_statement = (MAX_BINDS / c.mapping.columns.len()).min(c.batch_size).max(1);
        let update: String = c
            .mapping
            .columns
            .iter()
            .filter(|col| !col.key)
            .map(|col| format!("`{0}` = VALUES(`{0}`)", col.name))
            .collect::<Vec<_>>()
            .join(", ");
        let keys: Vec<&str> = c
            .mapping
            .columns
            .iter()
            .filter(|col| col.key)
            .map(|col| col.name.as_str())
            .collect();
        let mut ops = data.ops.into_iter().peekable();
        while ops.peek().is_some() {
            // Consecutive rows go in multi-row statements; a delete runs in its place in between.
            let mut rows = Vec::new();
            while rows.len() < per_statement {
                match ops.next_if(|op| matches!(op, Op::Row(_))) {
                    Some(Op::Row(row)) => rows.push(row),
                    _ => break,
                }
            }
            if rows.is_empty() {
                if let Some(Op::Delete(values)) = ops.next() {
                    let condition: Vec<String> = keys.iter().map(|k| format!("`{k}` = ?")).collect();
                    let sql = format!("DELETE FROM `{}` WHERE {}", c.table, condition.join(" AND "));
                    let mut q = sqlx::query(&sql);
                    for v in &values {
                        q = bind(q, v);
                    }
                    q.execute(&mut *conn)
                        .await
                        .map_err(|e| MysqlSinkError::db(format!("deleting from {}", c.table), e))?;
                }
                continue;
            }
            let mut qb: QueryBuilder<'_, MySql> =
                QueryBuilder::new(format!("INSERT INTO `{}` ({}) ", c.table, c.mapping.column_list()));
            qb.push_values(&rows, |mut b, row| {
                for v in row {
                    match v {
                        SqlValue::Null => b.push_bind(Option::<i64>::None),
                        SqlValue::Int(i) => b.push_bind(*i),
                        SqlValue::Float(f) => b.push_bind(*f),
                        SqlValue::Bool(x) => b.push_bind(*x),
                        SqlValue::Text(s) => b.push_bind(s.clone()),
                    };
                }
            });
            if upsert {
                if update.is_empty() {
                    let k = &c.mapping.columns[0].name;
                    qb.push(format!(" ON DUPLICATE KEY UPDATE `{k}` = `{k}`"));
                } else {
                    qb.push(format!(" ON DUPLICATE KEY UPDATE {update}"));
                }
            }
            qb.build()
                .execute(&mut *conn)
                .await
                .map_err(|e| MysqlSinkError::db(format!("inserting into {}", c.table), e))?;
        }
        if let crate::config::OnError::DeadLetter { table } = &c.on_error {
            for (origin, payload, reason) in data.dead {
                sqlx::query(&format!(
                    "INSERT INTO `{table}` (origin, payload, error) VALUES (?, ?, ?)"
                ))
                .bind(origin)
                .bind(payload)
                .bind(reason)
                .execute(&mut *conn)
                .await
                .map_err(|e| MysqlSinkError::db("writing a dead letter", e))?;
            }
        }
        Ok(())
    })
}

/// The progress tables of this sink (`exactly_sql_sink::progress`).
fn progress_tables(c: &MysqlSinkConfig) -> Progress<'_> {
    Progress {
        table: &c.progress_table,
        job: &c.job_id,
        sink: &c.sink_id,
    }
}

/// Records checkpoint `id` of `subtask` in the progress table (in the caller's transaction).
pub(crate) fn progress<'a>(
    conn: &'a mut MySqlConnection,
    c: &'a MysqlSinkConfig,
    subtask: u32,
    id: u64,
    offsets: &'a BTreeMap<String, i64>,
    rows: u64,
) -> BoxFut<'a, Result<()>> {
    Box::pin(async move {
        Ok(progress_tables(c)
            .record(&MySqlDialect, conn, subtask, id, offsets, rows)
            .await?)
    })
}

/// Whether checkpoint `id` of `subtask` committed: its progress row exists, or the subtask's
/// summary says every branch through a later checkpoint committed.
pub(crate) fn has_progress<'a>(
    conn: &'a mut MySqlConnection,
    c: &'a MysqlSinkConfig,
    subtask: u32,
    id: u64,
) -> BoxFut<'a, Result<bool>> {
    Box::pin(async move { Ok(progress_tables(c).committed(&MySqlDialect, conn, subtask, id).await?) })
}

/// After checkpoint `id` of `subtask` committed: the summary row moves to `id` and the
/// per-checkpoint rows before it go (`Progress::summarise`).
pub(crate) fn summarise_progress<'a>(
    conn: &'a mut MySqlConnection,
    c: &'a MysqlSinkConfig,
    subtask: u32,
    id: u64,
) -> BoxFut<'a, Result<()>> {
    Box::pin(async move { Ok(progress_tables(c).summarise(&MySqlDialect, conn, subtask, id).await?) })
}

/// The newest checkpoint `subtask` of this sink committed (`Progress::committed_through`).
pub(crate) fn committed_through<'a>(
    conn: &'a mut MySqlConnection,
    c: &'a MysqlSinkConfig,
    subtask: u32,
    parallelism: u32,
) -> BoxFut<'a, Result<Option<u64>>> {
    Box::pin(async move {
        Ok(progress_tables(c)
            .committed_through(&MySqlDialect, conn, subtask, parallelism)
            .await?)
    })
}

/// Forgets the commits of checkpoints after `id` of `subtask` (`Progress::forget_after`).
pub(crate) fn forget_after<'a>(
    conn: &'a mut MySqlConnection,
    c: &'a MysqlSinkConfig,
    subtask: u32,
    parallelism: u32,
    id: u64,
) -> BoxFut<'a, Result<()>> {
    Box::pin(async move {
        Ok(progress_tables(c)
            .forget_after(&MySqlDialect, conn, subtask, parallelism, id)
            .await?)
    })
}

/// MySQL's and MariaDB's SQL for what the SQL sinks share: backquoted names, `?` placeholders,
/// `ON DUPLICATE KEY UPDATE`, InnoDB tables.
pub(crate) struct MySqlDialect;

impl Dialect for MySqlDialect {
    type Connection = MySqlConnection;

    fn quote(&self, name: &str) -> String {
        format!("`{name}`")
    }

    fn placeholder(&self, _n: usize, _arg: &Arg) -> String {
        "?".into()
    }

    fn create_progress_tables(&self, progress: &str, through: &str) -> [String; 2] {
        [
            format!(
                "CREATE TABLE IF NOT EXISTS {progress} (job VARCHAR(64) NOT NULL, sink VARCHAR(64) NOT NULL, subtask INT NOT NULL, \
                 checkpoint_id BIGINT NOT NULL, offsets TEXT NOT NULL, rows_written BIGINT NOT NULL, \
                 committed_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), \
                 PRIMARY KEY (job, sink, subtask, checkpoint_id)) ENGINE=InnoDB"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {through} (job VARCHAR(64) NOT NULL, sink VARCHAR(64) NOT NULL, subtask INT NOT NULL, \
                 committed_through BIGINT NOT NULL, PRIMARY KEY (job, sink, subtask)) ENGINE=InnoDB"
            ),
        ]
    }

    fn on_conflict(&self, _table: &str, _key: &[&str], set: &[(&str, Set)]) -> String {
        let set: Vec<String> = set
            .iter()
            .map(|(c, how)| match how {
                Set::New => format!("{c} = VALUES({c})"),
                Set::Greatest => format!("{c} = GREATEST({c}, VALUES({c}))"),
                Set::Now => format!("{c} = CURRENT_TIMESTAMP(3)"),
            })
            .collect();
        format!("ON DUPLICATE KEY UPDATE {}", set.join(", "))
    }

    fn execute<'a>(
        &'a self,
        conn: &'a mut MySqlConnection,
        statement: &'a Statement,
    ) -> BoxFut<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let args = statement.arguments::<MySql>().map_err(sqlx::Error::Encode)?;
            let q = sqlx::query_with(&statement.sql, args);
            q.execute(conn).await.map(|_| ())
        })
    }

    fn fetch_int<'a>(
        &'a self,
        conn: &'a mut MySqlConnection,
        statement: &'a Statement,
    ) -> BoxFut<'a, Result<Option<i64>, sqlx::Error>> {
        Box::pin(async move {
            let args = statement.arguments::<MySql>().map_err(sqlx::Error::Encode)?;
            let q = sqlx::query_scalar_with::<_, Option<i64>, _>(&statement.sql, args);
            q.fetch_one(conn).await
        })
    }
}

/// Sets the session's isolation to READ COMMITTED: committed rows only, whatever the server's
/// default (prepared branches' rows are visible at READ UNCOMMITTED), and fewer gap locks.
pub(crate) fn read_committed(conn: &mut MySqlConnection) -> BoxFut<'_, Result<()>> {
    Box::pin(async move {
        exec(conn, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".into())
            .await
            .map_err(|e| MysqlSinkError::db("setting the isolation level", e))
    })
}

/// Closes a connection, ignoring errors (the server may already be gone).
pub(crate) fn close(conn: MySqlConnection) -> BoxFut<'static, ()> {
    Box::pin(async move {
        let _ = conn.close().await;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Progress<'static> = Progress {
        table: "exactly_progress",
        job: "orders",
        sink: "db",
    };

    /// The statements MySQL runs for the progress tables, as the sink wrote them before they
    /// moved to exactly-sql-sink: `?` placeholders, one argument each in order.
    #[test]
    fn the_progress_statements_are_mysqls() {
        let d = MySqlDialect;
        let record = P.record_statement(&d, 1, 2, &BTreeMap::new(), 3);
        assert_eq!(
            record.sql,
            "INSERT INTO `exactly_progress` (job, sink, subtask, checkpoint_id, offsets, rows_written) VALUES (?, ?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE offsets = VALUES(offsets), rows_written = VALUES(rows_written), committed_at = CURRENT_TIMESTAMP(3)"
        );
        let [summary, prune] = P.summarise_statements(&d, 1, 2);
        assert_eq!(
            summary.sql,
            "INSERT INTO `exactly_progress_through` (job, sink, subtask, committed_through) VALUES (?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE committed_through = GREATEST(committed_through, VALUES(committed_through))"
        );
        assert_eq!(
            prune.sql,
            "DELETE FROM `exactly_progress` WHERE job = ? AND sink = ? AND subtask = ? AND checkpoint_id < ?"
        );
        let newest = P.committed_through_statement(&d, 0, 2);
        assert_eq!(
            newest.sql,
            "SELECT GREATEST(COALESCE((SELECT MAX(checkpoint_id) FROM `exactly_progress` WHERE job = ? AND sink = ? AND (subtask = ? OR subtask >= ?)), 0), \
             COALESCE((SELECT MAX(committed_through) FROM `exactly_progress_through` WHERE job = ? AND sink = ? AND (subtask = ? OR subtask >= ?)), 0))"
        );
        let committed = P.committed_statement(&d, 0, 2);
        assert_eq!(
            committed.sql,
            "SELECT (SELECT COUNT(*) FROM `exactly_progress` WHERE job = ? AND sink = ? AND subtask = ? AND checkpoint_id = ?) \
             + (SELECT COUNT(*) FROM `exactly_progress_through` WHERE job = ? AND sink = ? AND subtask = ? AND committed_through >= ?)"
        );
        let [forget, back] = P.forget_after_statements(&d, 0, 2, 5);
        assert_eq!(
            forget.sql,
            "DELETE FROM `exactly_progress` WHERE job = ? AND sink = ? AND (subtask = ? OR subtask >= ?) AND checkpoint_id > ?"
        );
        assert_eq!(
            back.sql,
            "UPDATE `exactly_progress_through` SET committed_through = ? WHERE job = ? AND sink = ? AND (subtask = ? OR subtask >= ?) AND committed_through > ?"
        );
        let of = |subtask, beyond| {
            vec![
                Arg::Text("orders".into()),
                Arg::Text("db".into()),
                Arg::Int(subtask),
                Arg::Int(beyond),
            ]
        };
        assert_eq!(forget.args, [of(0, 2), vec![Arg::Int(5)]].concat());
        assert_eq!(back.args, [vec![Arg::Int(5)], of(0, 2), vec![Arg::Int(5)]].concat());
        let [create, create_through] = P.create_statements(&d);
        assert!(create
            .sql
            .starts_with("CREATE TABLE IF NOT EXISTS `exactly_progress` ("));
        assert!(create_through
            .sql
            .starts_with("CREATE TABLE IF NOT EXISTS `exactly_progress_through` ("));
        for s in [&record, &summary, &prune, &newest, &committed, &forget, &back] {
            assert_eq!(s.sql.matches('?').count(), s.args.len(), "{}", s.sql);
        }
    }
}
