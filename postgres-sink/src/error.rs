//! Errors of the PostgreSQL sink.

use exactly_core::{CoreError, ErrorClass};

/// Errors of the PostgreSQL sink.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresSinkError {
    /// Invalid configuration; the message says what to change.
    #[error("postgres sink configuration: {0}")]
    Config(String),
    /// The database failed (connection, statement).
    #[error("postgres: {context}: {source}")]
    Database {
        /// What was being done.
        context: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// A record does not fit the columns and the policy is to fail.
    #[error("record {origin} does not fit the columns ({reason}); the policy is `fail`: fix the data or set on_error to `skip`")]
    BadRecord {
        /// Where it came from (topic/partition@offset).
        origin: String,
        /// What is wrong.
        reason: String,
    },
}

impl From<exactly_sql_sink::DbError> for PostgresSinkError {
    fn from(e: exactly_sql_sink::DbError) -> Self {
        PostgresSinkError::db(e.context, e.source)
    }
}

impl PostgresSinkError {
    pub(crate) fn db(context: impl Into<String>, source: sqlx::Error) -> Self {
        PostgresSinkError::Database {
            context: context.into(),
            source,
        }
    }
}

/// The SQLSTATE of a database error.
pub(crate) fn sqlstate(e: &sqlx::Error) -> Option<String> {
    e.as_database_error().and_then(|d| d.code()).map(|c| c.into_owned())
}

/// Errors a restart cannot cure: authentication or authorisation (class 28, 42501), a missing
/// database, table or column (3D000, 42P01, 42703), data that does not fit a column's type
/// (class 22: the same records would fail again), TLS refused or unverifiable. They stop the job
/// with the server's message instead of restarting it forever.
fn permanent(e: &sqlx::Error) -> bool {
    if matches!(e, sqlx::Error::Tls(_)) {
        return true;
    }
    match sqlstate(e) {
        Some(s) => {
            s.starts_with("28") || s.starts_with("22") || matches!(s.as_str(), "42501" | "3D000" | "42P01" | "42703")
        }
        None => false,
    }
}

impl From<PostgresSinkError> for CoreError {
    fn from(e: PostgresSinkError) -> Self {
        let class = match &e {
            // Permanent, or the server cannot be reached now (an outage), or a restart.
            PostgresSinkError::Database { source, .. } => exactly_sql_sink::error::class(source, permanent),
            _ => ErrorClass::Fatal,
        };
        CoreError::operator("postgres sink", class, e)
    }
}

/// Result of the PostgreSQL sink.
pub type Result<T, E = PostgresSinkError> = std::result::Result<T, E>;
