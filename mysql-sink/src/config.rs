//! Configuration of the MySQL sink.

use serde::{Deserialize, Serialize};

use crate::error::{MysqlSinkError, Result};
use crate::mapping::Mapping;

/// How rows reach the table exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// XA two-phase commit: one branch per subtask per checkpoint, committed when it completes.
    Xa,
    /// Idempotent: each checkpoint's rows are upserted (INSERT ... ON DUPLICATE KEY UPDATE) with
    /// the progress row in one ordinary transaction; replays overwrite identical rows.
    Upsert,
}

/// How a record's row is written (Kafka Connect's `insert.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InsertMode {
    /// Plain INSERT: each record adds a row (one whose key is taken fails). Mode `xa`'s default.
    Insert,
    /// INSERT … ON DUPLICATE KEY UPDATE: a record replaces its key's row and a tombstone deletes
    /// it (a change stream). Mode `upsert` always writes this way; in mode `xa` the changes of a
    /// checkpoint go into its XA branch.
    Upsert,
}

/// What happens to a record that does not fit the mapping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum OnError {
    /// Stop the job (fatal: a restart would meet the same record).
    #[default]
    Fail,
    /// Skip it, logged with its origin.
    Skip,
    /// Store it in `table` (created if missing) with its origin and the reason.
    DeadLetter {
        /// The dead-letter table.
        table: String,
    },
}

/// The MySQL sink's configuration. `Debug` hides the URL's password.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MysqlSinkConfig {
    /// `mysql://user:password@host:port/database[?ssl-mode=verify_identity&ssl-ca=ca.pem]`;
    /// `${NAME}` parts come from the environment (write `mysql://app:${MYSQL_PASSWORD}@db/x`).
    /// TLS follows `ssl-mode`: `required` never falls back to plaintext, `verify_ca` and
    /// `verify_identity` check the server's certificate against `ssl-ca`.
    #[serde(deserialize_with = "exactly_sql_sink::config::expand_url")]
    pub url: String,
    /// A file holding the password (e.g. a mounted Kubernetes Secret); overrides the URL's.
    #[serde(default)]
    pub password_file: Option<std::path::PathBuf>,
    /// Target table.
    pub table: String,
    /// XA or upsert.
    pub mode: Mode,
    /// `insert` (mode `xa`'s default) or `upsert` (mode `upsert` always); see [`InsertMode`].
    #[serde(default)]
    pub insert_mode: Option<InsertMode>,
    /// Identifies the job in xids and the progress table; keep it across restarts.
    pub job_id: String,
    /// Identifies this sink within the job.
    #[serde(default = "default_sink_id")]
    pub sink_id: String,
    /// Records to columns.
    pub mapping: Mapping,
    /// Rows per INSERT statement.
    #[serde(default = "exactly_sql_sink::config::default_batch_size")]
    pub batch_size: usize,
    /// Create the table from the mapping when it does not exist.
    #[serde(default)]
    pub create_table: bool,
    /// Table recording, per subtask and checkpoint, what was committed.
    #[serde(default = "exactly_sql_sink::config::default_progress_table")]
    pub progress_table: String,
    /// Records that do not fit.
    #[serde(default)]
    pub on_error: OnError,
}

impl std::fmt::Debug for MysqlSinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlSinkConfig")
            .field("url", &redact_url(&self.url))
            .field("password_file", &self.password_file)
            .field("table", &self.table)
            .field("mode", &self.mode)
            .field("insert_mode", &self.insert_mode)
            .field("job_id", &self.job_id)
            .field("sink_id", &self.sink_id)
            .field("mapping", &self.mapping)
            .field("batch_size", &self.batch_size)
            .field("create_table", &self.create_table)
            .field("progress_table", &self.progress_table)
            .field("on_error", &self.on_error)
            .finish()
    }
}

/// The URL with its password replaced by `***`.
pub(crate) use exactly_core::secret::redact_url;

fn default_sink_id() -> String {
    "mysql".into()
}

fn identifier_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl MysqlSinkConfig {
    /// Whether rows replace those of their key and tombstones delete (mode `upsert`, or mode
    /// `xa` with `insert_mode = "upsert"`).
    pub fn upserts(&self) -> bool {
        self.mode == Mode::Upsert || self.insert_mode == Some(InsertMode::Upsert)
    }

    /// Checks the configuration; the error says what to change.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(MysqlSinkError::Config(m));
        if !self.url.starts_with("mysql://") && !self.url.starts_with("mariadb://") {
            return bad(format!(
                "url must start with mysql:// (got {:?})",
                self.url.split('@').next_back().unwrap_or("")
            ));
        }
        for (what, name) in [("table", &self.table), ("progress_table", &self.progress_table)] {
            if !identifier_ok(name) {
                return bad(format!("{what} {name:?} must be 1-64 letters, digits or underscores"));
            }
        }
        if self.progress_table.len() > 56 {
            return bad(format!(
                "progress_table {:?} must be 56 characters at most (its summary table adds `_through`)",
                self.progress_table
            ));
        }
        if let OnError::DeadLetter { table } = &self.on_error {
            if !identifier_ok(table) {
                return bad(format!(
                    "on_error.table {table:?} must be 1-64 letters, digits or underscores"
                ));
            }
        }
        if self.job_id.is_empty()
            || self.job_id.len() + self.sink_id.len() > 50
            || self.job_id.contains(':')
            || self.sink_id.contains(':')
        {
            return bad("job_id and sink_id must be non-empty, without ':', and 50 bytes together at most (they form XA gtrids)".into());
        }
        if self.batch_size == 0 {
            return bad("batch_size must be at least 1".into());
        }
        self.mapping.validate()?;
        if self.mode == Mode::Upsert && self.insert_mode == Some(InsertMode::Insert) {
            return bad(
                "mode `upsert` always upserts (its replays overwrite rows by key): drop insert_mode, or use mode `xa` to insert".into(),
            );
        }
        if self.mode == Mode::Upsert && !self.mapping.columns.iter().any(|c| c.key) {
            return bad(
                "mode `upsert` needs at least one key column (key = true): replays overwrite rows by key".into(),
            );
        }
        if self.upserts() && !self.mapping.columns.iter().any(|c| c.key) {
            return bad(
                "insert_mode `upsert` needs at least one key column (key = true): a record replaces the row of its key"
                    .into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::redact_url;

    #[test]
    fn the_password_never_shows() {
        assert_eq!(
            redact_url("mysql://app:s3cret@db:3306/x?ssl-mode=required"),
            "mysql://app:***@db:3306/x?ssl-mode=required"
        );
        assert_eq!(redact_url("mysql://app@db/x"), "mysql://app@db/x");
        assert_eq!(redact_url("mysql://db/x"), "mysql://db/x");
    }
}

#[cfg(test)]
mod insert_mode_tests {
    use super::*;

    fn config(mode: &str, insert_mode: Option<&str>, key: bool) -> MysqlSinkConfig {
        let mut v = serde_json::json!({
            "url": "mysql://u:p@127.0.0.1:3306/d",
            "table": "orders",
            "mode": mode,
            "job_id": "j",
            "mapping": { "format": { "type": "json" }, "columns": [
                { "name": "id", "type": "bigint", "key": key },
                { "name": "note", "type": "varchar", "length": 20 },
            ] },
        });
        if let Some(m) = insert_mode {
            v["insert_mode"] = m.into();
        }
        serde_json::from_value(v).expect("a configuration")
    }

    /// Mode `xa` inserts unless told to upsert; mode `upsert` always upserts; upserting needs a
    /// key.
    #[test]
    fn insert_mode_follows_the_mode_unless_set_and_upserts_need_a_key() {
        assert!(!config("xa", None, true).upserts());
        assert!(!config("xa", Some("insert"), false).upserts());
        assert!(config("xa", Some("upsert"), true).upserts());
        assert!(config("upsert", None, true).upserts());
        assert!(config("upsert", Some("upsert"), true).validate().is_ok());
        assert!(config("xa", Some("upsert"), true).validate().is_ok());
        let e = config("upsert", Some("insert"), true)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("always upserts"), "{e}");
        let e = config("xa", Some("upsert"), false).validate().unwrap_err().to_string();
        assert!(e.contains("insert_mode `upsert` needs at least one key column"), "{e}");
    }
}
