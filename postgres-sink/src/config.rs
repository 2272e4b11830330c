//! Configuration of the PostgreSQL sink (a job file's `[sink.postgres]`).

use serde::{Deserialize, Serialize};

use crate::error::{PostgresSinkError, Result};

/// How rows reach the table exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Two-phase commit: one prepared transaction per subtask per checkpoint
    /// (`PREPARE TRANSACTION`), committed when the checkpoint completes (`COMMIT PREPARED`),
    /// recovered from `pg_prepared_xacts` after any crash. Needs `max_prepared_transactions` > 0.
    TwoPhase,
    /// Idempotent: each checkpoint's rows are upserted (`INSERT … ON CONFLICT (keys) DO UPDATE`)
    /// with the progress row in one ordinary transaction; replays overwrite identical rows, so
    /// key columns are required. Tombstones delete the row of their key.
    Upsert,
}

/// How a record's row is written (Kafka Connect's `insert.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InsertMode {
    /// Plain INSERT: each record adds a row (one whose key is taken fails). Mode `two_phase`'s
    /// default.
    Insert,
    /// `INSERT … ON CONFLICT (keys) DO UPDATE`: a record replaces its key's row and a tombstone
    /// deletes it (a change stream). Mode `upsert` always writes this way; in mode `two_phase`
    /// the changes of a checkpoint go into its prepared transaction.
    Upsert,
}

/// What happens to a record that does not fit the columns (not a JSON object, a key column
/// missing, a tombstone in mode `two_phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Stop the job (fatal: a restart would meet the same record).
    #[default]
    Fail,
    /// Skip it, logged with its origin.
    Skip,
}

/// One column of the target table, filled from the JSON field of the same name (or `field`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Column {
    /// Column name.
    pub name: String,
    /// Its PostgreSQL type, used by `create_table` (`bigint`, `text`, `double precision`,
    /// `numeric(12,2)`, `timestamptz`, `jsonb`, …). Values are converted by PostgreSQL itself.
    #[serde(rename = "type")]
    pub sql_type: String,
    /// Part of the key (upsert's conflict target; the primary key `create_table` makes).
    #[serde(default)]
    pub key: bool,
    /// The JSON field to read, when it is not named as the column.
    #[serde(default)]
    pub field: Option<String>,
}

impl Column {
    /// The JSON field this column reads.
    pub fn field(&self) -> &str {
        self.field.as_deref().unwrap_or(&self.name)
    }
}

fn default_sink_id() -> String {
    "postgres-sink".into()
}

/// The PostgreSQL sink's configuration. `Debug` hides the URL's password.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSinkConfig {
    /// `postgres://user:password@host:port/database?sslmode=verify-full&sslrootcert=ca.pem`;
    /// `${NAME}` parts come from the environment. TLS follows `sslmode` (`require` never falls
    /// back to plaintext; `verify-ca` / `verify-full` check the server's certificate).
    #[serde(deserialize_with = "exactly_sql_sink::config::expand_url")]
    pub url: String,
    /// A file holding the password (e.g. a mounted Kubernetes Secret); overrides the URL's.
    #[serde(default)]
    pub password_file: Option<std::path::PathBuf>,
    /// Target table (optionally `schema.table`).
    pub table: String,
    /// `two_phase` or `upsert`.
    pub mode: Mode,
    /// `insert` (mode `two_phase`'s default) or `upsert` (mode `upsert` always); see
    /// [`InsertMode`].
    #[serde(default)]
    pub insert_mode: Option<InsertMode>,
    /// Identifies the job in transaction ids and the progress table; keep it across restarts.
    pub job_id: String,
    /// Identifies this sink within the job.
    #[serde(default = "default_sink_id")]
    pub sink_id: String,
    /// The table's columns, filled from the JSON object each record holds.
    pub columns: Vec<Column>,
    /// Rows per INSERT statement.
    #[serde(default = "exactly_sql_sink::config::default_batch_size")]
    pub batch_size: usize,
    /// Create the table from `columns` when it does not exist (with a primary key of the key
    /// columns, if any).
    #[serde(default)]
    pub create_table: bool,
    /// The progress table (created when missing), and `<name>_through` beside it.
    #[serde(default = "exactly_sql_sink::config::default_progress_table")]
    pub progress_table: String,
    /// Records that do not fit.
    #[serde(default)]
    pub on_error: OnError,
}

impl std::fmt::Debug for PostgresSinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresSinkConfig")
            .field("url", &exactly_core::secret::redact_url(&self.url))
            .field("table", &self.table)
            .field("mode", &self.mode)
            .field("insert_mode", &self.insert_mode)
            .field("job_id", &self.job_id)
            .field("sink_id", &self.sink_id)
            .field("columns", &self.columns)
            .field("batch_size", &self.batch_size)
            .field("create_table", &self.create_table)
            .field("progress_table", &self.progress_table)
            .field("on_error", &self.on_error)
            .finish_non_exhaustive()
    }
}

/// A plain SQL identifier (quoted where used): letters, digits, `_`, at most 63 bytes.
fn identifier(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(PostgresSinkError::Config(format!(
            "{what} {name:?} must be 1-63 letters, digits or underscores, not starting with a digit"
        )))
    }
}

impl PostgresSinkConfig {
    /// Whether rows replace those of their key and tombstones delete (mode `upsert`, or mode
    /// `two_phase` with `insert_mode = "upsert"`).
    pub fn upserts(&self) -> bool {
        self.mode == Mode::Upsert || self.insert_mode == Some(InsertMode::Upsert)
    }

    /// Checks the values; the error says what to change.
    pub fn validate(&self) -> Result<()> {
        if !self.url.starts_with("postgres://") && !self.url.starts_with("postgresql://") {
            return Err(PostgresSinkError::Config(
                "url must start with postgres:// (e.g. postgres://app:${PG_PASSWORD}@db:5432/shop?sslmode=verify-full&sslrootcert=ca.pem)".into(),
            ));
        }
        match self.table.split_once('.') {
            Some((schema, table)) => {
                identifier("table's schema", schema)?;
                identifier("table", table)?;
            }
            None => identifier("table", &self.table)?,
        }
        identifier("progress_table", &self.progress_table)?;
        for (what, id) in [("job_id", &self.job_id), ("sink_id", &self.sink_id)] {
            let ok = !id.is_empty()
                && id.len() <= 64
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !ok {
                return Err(PostgresSinkError::Config(format!(
                    "{what} {id:?} must be 1-64 letters, digits, '_', '-' or '.' (it names transactions)"
                )));
            }
        }
        if self.columns.is_empty() {
            return Err(PostgresSinkError::Config("columns: name at least one column".into()));
        }
        let mut seen = std::collections::BTreeSet::new();
        for c in &self.columns {
            identifier("column", &c.name)?;
            if !seen.insert(c.name.as_str()) {
                return Err(PostgresSinkError::Config(format!("column {:?} is named twice", c.name)));
            }
            let ty_ok = !c.sql_type.trim().is_empty()
                && c.sql_type
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, ' ' | '(' | ')' | ',' | '_' | '[' | ']'));
            if !ty_ok {
                return Err(PostgresSinkError::Config(format!(
                    "column {:?}: type {:?} is not a PostgreSQL type name",
                    c.name, c.sql_type
                )));
            }
        }
        if self.mode == Mode::Upsert && self.insert_mode == Some(InsertMode::Insert) {
            return Err(PostgresSinkError::Config(
                "mode `upsert` always upserts (its replays overwrite rows by key): drop insert_mode, or use mode `two_phase` to insert".into(),
            ));
        }
        if self.mode == Mode::Upsert && !self.columns.iter().any(|c| c.key) {
            return Err(PostgresSinkError::Config(
                "mode `upsert` needs key columns (`key = true`): a replay must overwrite, not add, rows".into(),
            ));
        }
        if self.upserts() && !self.columns.iter().any(|c| c.key) {
            return Err(PostgresSinkError::Config(
                "insert_mode `upsert` needs key columns (`key = true`): a record replaces the row of its key".into(),
            ));
        }
        if self.batch_size == 0 {
            return Err(PostgresSinkError::Config("batch_size must be at least 1".into()));
        }
        Ok(())
    }

    /// The table, quoted.
    pub(crate) fn quoted_table(&self) -> String {
        match self.table.split_once('.') {
            Some((schema, table)) => format!("\"{schema}\".\"{table}\""),
            None => format!("\"{}\"", self.table),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> PostgresSinkConfig {
        serde_json::from_value(serde_json::json!({
            "url": "postgres://u:p@127.0.0.1:5432/d",
            "table": "orders",
            "mode": "upsert",
            "job_id": "j",
            "columns": [{ "name": "id", "type": "bigint", "key": true }, { "name": "amount", "type": "numeric(12,2)" }],
        }))
        .unwrap()
    }

    #[test]
    fn bad_configurations_say_what_to_change() {
        assert!(config().validate().is_ok());
        type Change = Box<dyn Fn(&mut PostgresSinkConfig)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|c| c.url = "mysql://x".into()), "postgres://"),
            (Box::new(|c| c.table = "or\"ders".into()), "table"),
            (Box::new(|c| c.columns[0].key = false), "needs key columns"),
            (Box::new(|c| c.insert_mode = Some(InsertMode::Insert)), "always upserts"),
            (
                Box::new(|c| {
                    c.mode = Mode::TwoPhase;
                    c.insert_mode = Some(InsertMode::Upsert);
                    c.columns[0].key = false;
                }),
                "insert_mode `upsert` needs key columns",
            ),
            (Box::new(|c| c.columns[1].name = "id".into()), "named twice"),
            (
                Box::new(|c| c.columns[1].sql_type = "text; DROP TABLE x".into()),
                "not a PostgreSQL type",
            ),
            (Box::new(|c| c.job_id = "a b".into()), "job_id"),
            (Box::new(|c| c.batch_size = 0), "batch_size"),
        ];
        for (change, expected) in cases {
            let mut c = config();
            change(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(expected), "{e}");
        }
    }

    #[test]
    fn debug_hides_the_password() {
        let text = format!("{:?}", config());
        assert!(!text.contains("u:p@"), "{text}");
    }
}
