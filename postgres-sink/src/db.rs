//! Statements both modes share: connecting, tables, rows from records, the progress table.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tracing::warn;

use crate::config::{OnError, PostgresSinkConfig};
use crate::error::{PostgresSinkError, Result};
use crate::PgRecord;

/// A boxed, `Send` future: sqlx's executor bounds trip the compiler's `Send` inference of
/// futures in trait methods otherwise.
pub(crate) type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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

fn through_table(c: &PostgresSinkConfig) -> String {
    format!("\"{}_through\"", c.progress_table)
}

fn progress_table(c: &PostgresSinkConfig) -> String {
    format!("\"{}\"", c.progress_table)
}

/// Creates the progress tables and (if asked) the target table.
pub(crate) fn ensure_tables<'a>(conn: &'a mut PgConnection, c: &'a PostgresSinkConfig) -> BoxFut<'a, Result<()>> {
    Box::pin(async move {
        let ddl = [
            format!(
                "CREATE TABLE IF NOT EXISTS {} (job text NOT NULL, sink text NOT NULL, subtask integer NOT NULL, \
                 checkpoint_id bigint NOT NULL, offsets jsonb NOT NULL, rows_written bigint NOT NULL, \
                 committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job, sink, subtask, checkpoint_id))",
                progress_table(c)
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (job text NOT NULL, sink text NOT NULL, subtask integer NOT NULL, \
                 committed_through bigint NOT NULL, PRIMARY KEY (job, sink, subtask))",
                through_table(c)
            ),
        ];
        for sql in ddl {
            exec(conn, sql)
                .await
                .map_err(|e| PostgresSinkError::db("creating the progress tables", e))?;
        }
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
            offsets.insert(format!("{}:{}", o.topic, o.partition), o.offset + 1);
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
        let offsets = serde_json::to_string(offsets).expect("a map of strings to numbers serializes");
        sqlx::query(&format!(
            "INSERT INTO {} (job, sink, subtask, checkpoint_id, offsets, rows_written) VALUES ($1, $2, $3, $4, $5::jsonb, $6) \
             ON CONFLICT (job, sink, subtask, checkpoint_id) DO UPDATE SET offsets = EXCLUDED.offsets, \
             rows_written = EXCLUDED.rows_written, committed_at = now()",
            progress_table(c)
        ))
        .bind(&c.job_id)
        .bind(&c.sink_id)
        .bind(subtask as i32)
        .bind(id as i64)
        .bind(offsets)
        .bind(rows as i64)
        .execute(&mut *conn)
        .await
        .map_err(|e| PostgresSinkError::db("writing the progress row", e))?;
        Ok(())
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
    Box::pin(async move {
        let found: bool = sqlx::query_scalar(&format!(
            "SELECT EXISTS (SELECT 1 FROM {} WHERE job = $1 AND sink = $2 AND subtask = $3 AND checkpoint_id = $4) \
             OR EXISTS (SELECT 1 FROM {} WHERE job = $1 AND sink = $2 AND subtask = $3 AND committed_through >= $4)",
            progress_table(c),
            through_table(c)
        ))
        .bind(&c.job_id)
        .bind(&c.sink_id)
        .bind(subtask as i32)
        .bind(id as i64)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| PostgresSinkError::db("reading the progress table", e))?;
        Ok(found)
    })
}

/// The newest checkpoint `subtask` of this sink committed (for subtask 0, also subtasks at or
/// above `parallelism`: a job rescaled down), by its progress rows and summaries; `None` when
/// there are none. Per subtask: the ranges of a job split over processes keep checkpoint ids of
/// their own.
pub(crate) fn committed_through<'a>(
    conn: &'a mut PgConnection,
    c: &'a PostgresSinkConfig,
    subtask: u32,
    parallelism: u32,
) -> BoxFut<'a, Result<Option<u64>>> {
    Box::pin(async move {
        let newest: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT GREATEST((SELECT MAX(checkpoint_id) FROM {} WHERE job = $1 AND sink = $2 AND (subtask = $3 OR subtask >= $4)), \
             (SELECT MAX(committed_through) FROM {} WHERE job = $1 AND sink = $2 AND (subtask = $3 OR subtask >= $4)))",
            progress_table(c),
            through_table(c)
        ))
        .bind(&c.job_id)
        .bind(&c.sink_id)
        .bind(subtask as i32)
        .bind(if subtask == 0 { parallelism as i64 } else { i64::MAX })
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| PostgresSinkError::db("reading the progress table", e))?;
        Ok(newest.filter(|n| *n > 0).map(|n| n as u64))
    })
}

/// Forgets the commits of checkpoints after `id` of `subtask` (and, for subtask 0, of subtasks
/// at or above `parallelism`: a job rescaled down): their progress rows go and the summaries
/// come back to `id`.
pub(crate) fn forget_after<'a>(
    conn: &'a mut PgConnection,
    c: &'a PostgresSinkConfig,
    subtask: u32,
    parallelism: u32,
    id: u64,
) -> BoxFut<'a, Result<()>> {
    Box::pin(async move {
        let beyond = if subtask == 0 { parallelism as i64 } else { i64::MAX };
        sqlx::query(&format!(
            "DELETE FROM {} WHERE job = $1 AND sink = $2 AND (subtask = $3 OR subtask >= $4) AND checkpoint_id > $5",
            progress_table(c)
        ))
        .bind(&c.job_id)
        .bind(&c.sink_id)
        .bind(subtask as i32)
        .bind(beyond)
        .bind(id as i64)
        .execute(&mut *conn)
        .await
        .map_err(|e| PostgresSinkError::db("forgetting progress rows", e))?;
        sqlx::query(&format!(
            "UPDATE {} SET committed_through = $5 WHERE job = $1 AND sink = $2 AND (subtask = $3 OR subtask >= $4) AND committed_through > $5",
            through_table(c)
        ))
        .bind(&c.job_id)
        .bind(&c.sink_id)
        .bind(subtask as i32)
        .bind(beyond)
        .bind(id as i64)
        .execute(&mut *conn)
        .await
        .map_err(|e| PostgresSinkError::db("forgetting the progress summary", e))?;
        Ok(())
    })
}

/// After checkpoint `id` of `subtask` committed: every transaction of the subtask through `id`
/// has committed (the driver commits in checkpoint order, and a lost one stops the job), so the
/// summary row moves to `id` and the per-checkpoint rows before it go.
pub(crate) fn summarise_progress<'a>(
    conn: &'a mut PgConnection,
    c: &'a PostgresSinkConfig,
    subtask: u32,
    id: u64,
) -> BoxFut<'a, Result<()>> {
    Box::pin(async move {
        sqlx::query(&format!(
            "INSERT INTO {} (job, sink, subtask, committed_through) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (job, sink, subtask) DO UPDATE SET committed_through = GREATEST({0}.committed_through, EXCLUDED.committed_through)",
            through_table(c)
        ))
        .bind(&c.job_id)
        .bind(&c.sink_id)
        .bind(subtask as i32)
        .bind(id as i64)
        .execute(&mut *conn)
        .await
        .map_err(|e| PostgresSinkError::db("writing the progress summary", e))?;
        sqlx::query(&format!(
            "DELETE FROM {} WHERE job = $1 AND sink = $2 AND subtask = $3 AND checkpoint_id < $4",
            progress_table(c)
        ))
        .bind(&c.job_id)
        .bind(&c.sink_id)
        .bind(subtask as i32)
        .bind(id as i64)
        .execute(&mut *conn)
        .await
        .map_err(|e| PostgresSinkError::db("pruning the progress table", e))?;
        Ok(())
    })
}
