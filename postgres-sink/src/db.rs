//! Statements both modes share: connecting, tables, rows from records, the progress table.

use std::collections::BTreeMap;

use sqlx::postgres::{PgConnectOptions, PgConnection, Postgres};
use sqlx::{ConnectOptions, Connection};
use tracing::warn;

use crate::config::{OnError, PostgresSinkConfig};
use crate::error::{PostgresSinkError, Result};
use crate::PgRecord;

pub(crate) use exactly_sql_sink::BoxFut;
use exactly_sql_sink::{Arg, Dialect, Progress, Set, Statement};

/// Runs simple-protocol SQL (transaction control: `PREPARE TRANSACTION` takes no parameters).
pub(crate) fn exec<'a>(conn: &'a mut PgConnection, sql: String) -> BoxFut<'a, Result<(), sqlx::Error>> {
    Box::pin(async move { sqlx::Executor::execute(conn, sql.as_str()).await.map(|_| ()) })
}

/// Connects to the server of the configured URL (its TLS settings included), with the password
/// of `password_file` when given; errors name the server, never the credentials.
pub(crate) fn connect(config: &PostgresSinkConfig) -> BoxFut<'_, Result<PgConnection>> {
    Box::pin(connect_url(&config.url, config.password_file.as_deref()))
}

/// Connects to the server of `url` (`postgres://…`, TLS as its `sslmode` says), with the password
/// of `password_file` when given; errors name the server, never the credentials. For tools that
/// read a sink's table (`exactly verify`).
pub async fn connect_url(url: &str, password_file: Option<&std::path::Path>) -> Result<PgConnection> {
    let options: PgConnectOptions = url
        .parse()
        .map_err(|e| PostgresSinkError::Config(format!("url does not parse: {e}")))?;
    let mut options = crate::tls::verified_by_default(url, options);
    if let Some(f) = password_file {
        let secret = exactly_core::secret::Secret::from_file(f).map_err(PostgresSinkError::Config)?;
        options = options.password(secret.expose());
    }
    let address = exactly_core::net::url_address(url).unwrap_or_else(|| "the server".into());
    match options.connect().await {
        Ok(c) => Ok(c),
        Err(e @ (sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut)) => {
            let probe = address.clone();
            let why = tokio::task::spawn_blocking(move || exactly_core::net::diagnose(&probe))
                .await
                .unwrap_or_default();
            Err(PostgresSinkError::db(format!("connecting to {address} ({why})"), e))
        }
        Err(e) => Err(PostgresSinkError::db(format!("connecting to {address}"), e)),
    }
}

/// Closes a connection, ignoring errors (the server may already be gone).
pub(crate) fn close(conn: PgConnection) -> BoxFut<'static, ()> {
    Box::pin(async move {
        let _ = conn.close().await;
    })
}

/// Creates the progress tables and (if asked) the target table.
pub(crate) fn ensure_tables<'a>(conn: &'a mut PgConnection, c: &'a PostgresSinkConfig) -> BoxFut<'a, Result<()>> {
    Box::pin(async move {
        progress_tables(c).create(&PgDialect, conn).await?;
        if c.create_table {
            let mut cols: Vec<String> = c
                .columns
                .iter()
                .map(|col| {
                    let not_null = if col.key { " NOT NULL" } else { "" };
                    format!("\"{}\" {}{not_null}", col.name, col.sql_type)
                })
                .collect();
            let keys: Vec<String> = c
                .columns
                .iter()
                .filter(|k| k.key)
                .map(|k| format!("\"{}\"", k.name))
                .collect();
            if !keys.is_empty() {
                cols.push(format!("PRIMARY KEY ({})", keys.join(", ")));
            }
            exec(
                conn,
                format!("CREATE TABLE IF NOT EXISTS {} ({})", c.quoted_table(), cols.join(", ")),
            )
            .await
            .map_err(|e| PostgresSinkError::db(format!("creating table {}", c.table), e))?;
        }
        Ok(())
    })
}

/// What a batch of records becomes.
#[derive(Debug, Default)]
pub(crate) struct Rows {
    /// Runs in record order: (delete?, JSON objects holding exactly the configured columns).
    pub(crate) runs: Vec<(bool, Vec<serde_json::Value>)>,
    pub(crate) count: u64,
}

impl Rows {
    /// `later`'s runs after these.
    pub(crate) fn append(&mut self, later: Rows) {
        self.count += later.count;
        for (delete, run) in later.runs {
            match self.runs.last_mut() {
                Some((d, last)) if *d == delete => last.extend(run),
                _ => self.runs.push((delete, run)),
            }
        }
    }
}

/// Maps records to rows (a JSON object per record, its configured fields), applying `on_error`
/// to those that do not fit; notes the next offset per topic partition for the progress row.
pub(crate) fn convert(
    c: &PostgresSinkConfig,
    records: Vec<PgRecord>,
    deletes_allowed: bool,
    offsets: &mut BTreeMap<String, i64>,
) -> Result<Rows> {
    let mut rows = Rows::default();
    for r in records {
        if let Some(o) = &r.origin {
            exactly_sql_sink::config::note_offset(offsets, &o.topic, o.partition, o.offset);
        }
        let delete = r.tombstone;
        let row = if delete && !deletes_allowed {
            Err("a tombstone (no value): insert_mode `insert` only inserts rows; insert_mode `upsert` (or mode `upsert`) deletes its key's row".to_string())
        } else if delete {
            key_row(c, r.key.as_deref())
        } else {
            value_row(c, &r.payload)
        };
        match row {
            Ok(row) => {
                match rows.runs.last_mut() {
                    Some((d, run)) if *d == delete => run.push(row),
                    _ => rows.runs.push((delete, vec![row])),
                }
                rows.count += 1;
            }
            Err(reason) => match c.on_error {
                OnError::Fail => {
                    return Err(PostgresSinkError::BadRecord {
                        origin: r.origin_text(),
                        reason,
                    })
                }
                OnError::Skip => {
                    warn!(origin = %r.origin_text(), %reason, "Skipping a record that does not fit the columns.")
                }
            },
        }
    }
    Ok(rows)
}

fn value_row(c: &PostgresSinkConfig, payload: &[u8]) -> std::result::Result<serde_json::Value, String> {
    let value: serde_json::Value = serde_json::from_slice(payload).map_err(|e| format!("not JSON: {e}"))?;
    let serde_json::Value::Object(mut fields) = value else {
        return Err("not a JSON object".into());
    };
    let mut row = serde_json::Map::new();
    for col in &c.columns {
        let v = fields.remove(col.field()).unwrap_or(serde_json::Value::Null);
        if col.key && v.is_null() {
            return Err(format!("key field {:?} is missing or null", col.field()));
        }
        row.insert(col.name.clone(), v);
    }
    Ok(serde_json::Value::Object(row))
}

/// The key columns' values of a tombstone's key: a JSON object with the key fields, or a plain
/// value for a single key column.
fn key_row(c: &PostgresSinkConfig, key: Option<&[u8]>) -> std::result::Result<serde_json::Value, String> {
    let key = key.ok_or("a tombstone without a key: nothing to delete")?;
    let keys: Vec<_> = c.columns.iter().filter(|k| k.key).collect();
    let parsed: Option<serde_json::Value> = serde_json::from_slice(key).ok();
    let mut row = serde_json::Map::new();
    match parsed {
        Some(serde_json::Value::Object(mut fields)) => {
            for k in keys {
                let v = fields.remove(k.field()).unwrap_or(serde_json::Value::Null);
                if v.is_null() {
                    return Err(format!("the tombstone's key lacks key field {:?}", k.field()));
                }
                row.insert(k.name.clone(), v);
            }
        }
        _ if keys.len() == 1 => {
            let text = String::from_utf8(key.to_vec()).map_err(|_| "the tombstone's key is not UTF-8".to_string())?;
            row.insert(keys[0].name.clone(), serde_json::Value::String(text));
        }
        _ => return Err("the tombstone's key must be a JSON object naming every key column".into()),
    }
    Ok(serde_json::Value::Object(row))
}

/// Writes `rows` on `conn` (in the caller's transaction), `batch_size` rows per statement:
/// PostgreSQL converts each JSON field to its column's type (`json_populate_recordset`). With
/// `upsert`, rows replace those of the same key (later records of a batch win).
pub(crate) fn write<'a>(
    conn: &'a mut PgConnection,
    c: &'a PostgresSinkConfig,
    rows: Rows,
    upsert: bool,
) -> BoxFut<'a, Result<()>> {
    Box::pin(async move {
        let names: Vec<String> = c.columns.iter().map(|col| format!("\"{}\"", col.name)).collect();
        let keys: Vec<String> = c
            .columns
            .iter()
            .filter(|k| k.key)
            .map(|k| format!("\"{}\"", k.name))
            .collect();
        let table = c.quoted_table();
        let source = format!("json_populate_recordset(NULL::{table}, $1::json)");
        for (delete, run) in rows.runs {
            let run = if upsert { last_per_key(c, run) } else { run };
            for chunk in run.chunks(c.batch_size) {
                let sql = if delete {
                    format!(
                        "DELETE FROM {table} WHERE ({k}) IN (SELECT {k} FROM {source})",
                        k = keys.join(", ")
                    )
                } else if upsert {
                    let others: Vec<String> = c
                        .columns
                        .iter()
                        .filter(|col| !col.key)
                        .map(|col| format!("\"{0}\" = EXCLUDED.\"{0}\"", col.name))
                        .collect();
                    let action = if others.is_empty() {
                        "DO NOTHING".to_string()
                    } else {
                        format!("DO UPDATE SET {}", others.join(", "))
                    };
                    format!(
                        "INSERT INTO {table} ({n}) SELECT {n} FROM {source} ON CONFLICT ({k}) {action}",
                        n = names.join(", "),
                        k = keys.join(", ")
                    )
                } else {
                    format!(
                        "INSERT INTO {table} ({n}) SELECT {n} FROM {source}",
                        n = names.join(", ")
                    )
                };
                let batch = serde_json::Value::Array(chunk.to_vec()).to_string();
                sqlx::query(&sql)
                    .bind(batch)
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| PostgresSinkError::db(format!("writing {} rows into {}", chunk.len(), c.table), e))?;
            }
        }
        Ok(())
    })
}

/// One row per key, the last one (an upsert may not touch a row twice in one statement).
fn last_per_key(c: &PostgresSinkConfig, run: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    let key_of = |row: &serde_json::Value| -> String {
        c.columns
            .iter()
            .filter(|k| k.key)
            .map(|k| row.get(&k.name).map(|v| v.to_string()).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\u{1}")
    };
    let mut last: BTreeMap<String, usize> = BTreeMap::new();
    for (i, row) in run.iter().enumerate() {
        last.insert(key_of(row), i);
    }
    let mut keep: Vec<usize> = last.into_values().collect();
    keep.sort_unstable();
    let mut run: Vec<Option<serde_json::Value>> = run.into_iter().map(Some).collect();
    keep.into_iter().filter_map(|i| run[i].take()).collect()
}

/// The progress tables of this sink (`exactly_sql_sink::progress`).
fn progress_tables(c: &PostgresSinkConfig) -> Progress<'_> {
    Progress {
        table: &c.progress_table,
        job: &c.job_id,
        sink: &c.sink_id,
    }
}

/// Records checkpoint `id` of `subtask` in the progress table (in the caller's transaction).
pub(crate) fn progress<'a>(
    conn: &'a mut PgConnection,
    c: &'a PostgresSinkConfig,
    subtask: u32,
    id: u64,
    offsets: &'a BTreeMap<String, i64>,
    rows: u64,
) -> BoxFut<'a, Result<()>> {
    Box::pin(async move {
        Ok(progress_tables(c)
            .record(&PgDialect, conn, subtask, id, offsets, rows)
            .await?)
    })
}

/// Whether checkpoint `id` of `subtask` committed: its progress row exists, or the subtask's
/// summary says every transaction through a later checkpoint committed.
pub(crate) fn has_progress<'a>(
    conn: &'a mut PgConnection,
    c: &'a PostgresSinkConfig,
    subtask: u32,
    id: u64,
) -> BoxFut<'a, Result<bool>> {
    Box::pin(async move { Ok(progress_tables(c).committed(&PgDialect, conn, subtask, id).await?) })
}

/// The newest checkpoint `subtask` of this sink committed (`Progress::committed_through`).
pub(crate) fn committed_through<'a>(
    conn: &'a mut PgConnection,
    c: &'a PostgresSinkConfig,
    subtask: u32,
    parallelism: u32,
) -> BoxFut<'a, Result<Option<u64>>> {
    Box::pin(async move {
        Ok(progress_tables(c)
            .committed_through(&PgDialect, conn, subtask, parallelism)
            .await?)
    })
}

/// Forgets the commits of checkpoints after `id` of `subtask` (`Progress::forget_after`).
pub(crate) fn forget_after<'a>(
    conn: &'a mut PgConnection,
    c: &'a PostgresSinkConfig,
    subtask: u32,
    parallelism: u32,
    id: u64,
) -> BoxFut<'a, Result<()>> {
    Box::pin(async move {
        Ok(progress_tables(c)
            .forget_after(&PgDialect, conn, subtask, parallelism, id)
            .await?)
    })
}

/// After checkpoint `id` of `subtask` committed: the summary row moves to `id` and the
/// per-checkpoint rows before it go (`Progress::summarise`).
pub(crate) fn summarise_progress<'a>(
    conn: &'a mut PgConnection,
    c: &'a PostgresSinkConfig,
    subtask: u32,
    id: u64,
) -> BoxFut<'a, Result<()>> {
    Box::pin(async move { Ok(progress_tables(c).summarise(&PgDialect, conn, subtask, id).await?) })
}

/// PostgreSQL's SQL for what the SQL sinks share: double-quoted names, numbered placeholders
/// (JSON cast to `jsonb`), `ON CONFLICT … DO UPDATE`.
pub(crate) struct PgDialect;

impl Dialect for PgDialect {
    type Connection = PgConnection;

    fn quote(&self, name: &str) -> String {
        format!("\"{name}\"")
    }

    fn placeholder(&self, n: usize, arg: &Arg) -> String {
        match arg {
            Arg::Json(_) => format!("${n}::jsonb"),
            Arg::Text(_) | Arg::Int(_) => format!("${n}"),
        }
    }

    fn create_progress_tables(&self, progress: &str, through: &str) -> [String; 2] {
        [
            format!(
                "CREATE TABLE IF NOT EXISTS {progress} (job text NOT NULL, sink text NOT NULL, subtask integer NOT NULL, \
                 checkpoint_id bigint NOT NULL, offsets jsonb NOT NULL, rows_written bigint NOT NULL, \
                 committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job, sink, subtask, checkpoint_id))"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {through} (job text NOT NULL, sink text NOT NULL, subtask integer NOT NULL, \
                 committed_through bigint NOT NULL, PRIMARY KEY (job, sink, subtask))"
            ),
        ]
    }

    fn on_conflict(&self, table: &str, key: &[&str], set: &[(&str, Set)]) -> String {
        let set: Vec<String> = set
            .iter()
            .map(|(c, how)| match how {
                Set::New => format!("{c} = EXCLUDED.{c}"),
                Set::Greatest => format!("{c} = GREATEST({table}.{c}, EXCLUDED.{c})"),
                Set::Now => format!("{c} = now()"),
            })
            .collect();
        format!("ON CONFLICT ({}) DO UPDATE SET {}", key.join(", "), set.join(", "))
    }

    fn execute<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        statement: &'a Statement,
    ) -> BoxFut<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let args = statement.arguments::<Postgres>().map_err(sqlx::Error::Encode)?;
            let q = sqlx::query_with(&statement.sql, args);
            q.execute(conn).await.map(|_| ())
        })
    }

    fn fetch_int<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        statement: &'a Statement,
    ) -> BoxFut<'a, Result<Option<i64>, sqlx::Error>> {
        Box::pin(async move {
            let args = statement.arguments::<Postgres>().map_err(sqlx::Error::Encode)?;
            let q = sqlx::query_scalar_with::<_, Option<i64>, _>(&statement.sql, args);
            q.fetch_one(conn).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Progress<'static> = Progress {
        table: "exactly_progress",
        job: "orders",
        sink: "db",
    };

    /// The statements PostgreSQL runs for the progress tables: as the sink wrote them before they
    /// moved to exactly-sql-sink, but for a commit's check (a sum of counts, where it was two
    /// EXISTS) and the newest checkpoint (each side COALESCEd to 0, which PostgreSQL's GREATEST,
    /// skipping NULLs, did not need); placeholders numbered in order.
    #[test]
    fn the_progress_statements_are_postgresqls() {
        let d = PgDialect;
        let record = P.record_statement(&d, 1, 2, &BTreeMap::new(), 3);
        assert_eq!(
            record.sql,
            "INSERT INTO \"exactly_progress\" (job, sink, subtask, checkpoint_id, offsets, rows_written) VALUES ($1, $2, $3, $4, $5::jsonb, $6) \
             ON CONFLICT (job, sink, subtask, checkpoint_id) DO UPDATE SET offsets = EXCLUDED.offsets, \
             rows_written = EXCLUDED.rows_written, committed_at = now()"
        );
        let [summary, prune] = P.summarise_statements(&d, 1, 2);
        assert_eq!(
            summary.sql,
            "INSERT INTO \"exactly_progress_through\" (job, sink, subtask, committed_through) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (job, sink, subtask) DO UPDATE SET committed_through = GREATEST(\"exactly_progress_through\".committed_through, EXCLUDED.committed_through)"
        );
        assert_eq!(
            prune.sql,
            "DELETE FROM \"exactly_progress\" WHERE job = $1 AND sink = $2 AND subtask = $3 AND checkpoint_id < $4"
        );
        let [forget, back] = P.forget_after_statements(&d, 0, 2, 5);
        assert_eq!(
            forget.sql,
            "DELETE FROM \"exactly_progress\" WHERE job = $1 AND sink = $2 AND (subtask = $3 OR subtask >= $4) AND checkpoint_id > $5"
        );
        assert_eq!(
            back.sql,
            "UPDATE \"exactly_progress_through\" SET committed_through = $1 WHERE job = $2 AND sink = $3 AND (subtask = $4 OR subtask >= $5) AND committed_through > $6"
        );
        assert_eq!(
            P.committed_statement(&d, 1, 2).sql,
            "SELECT (SELECT COUNT(*) FROM \"exactly_progress\" WHERE job = $1 AND sink = $2 AND subtask = $3 AND checkpoint_id = $4) \
             + (SELECT COUNT(*) FROM \"exactly_progress_through\" WHERE job = $5 AND sink = $6 AND subtask = $7 AND committed_through >= $8)"
        );
        assert_eq!(
            P.committed_through_statement(&d, 0, 2).sql,
            "SELECT GREATEST(COALESCE((SELECT MAX(checkpoint_id) FROM \"exactly_progress\" WHERE job = $1 AND sink = $2 AND (subtask = $3 OR subtask >= $4)), 0), \
             COALESCE((SELECT MAX(committed_through) FROM \"exactly_progress_through\" WHERE job = $5 AND sink = $6 AND (subtask = $7 OR subtask >= $8)), 0))"
        );
        let [create, create_through] = P.create_statements(&d);
        assert!(create
            .sql
            .starts_with("CREATE TABLE IF NOT EXISTS \"exactly_progress\" ("));
        assert!(create_through
            .sql
            .starts_with("CREATE TABLE IF NOT EXISTS \"exactly_progress_through\" ("));
    }
}
