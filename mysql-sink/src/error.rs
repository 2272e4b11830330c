//! Errors of the MySQL sink.

use exactly_core::{CoreError, ErrorClass};

/// Errors of the MySQL sink.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MysqlSinkError {
    /// Invalid configuration; the message says what to change.
    #[error("mysql sink configuration: {0}")]
    Config(String),
    /// The database failed (connection, statement).
    #[error("mysql: {context}: {source}")]
    Database {
        /// What was being done.
        context: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// A record does not fit the mapping and the policy is to fail.
    #[error("record {origin} does not fit the mapping ({reason}); the policy is `fail`: fix the data or set on_error to `skip` or `dead_letter`")]
    BadRecord {
        /// Where it came from (topic/partition@offset).
        origin: String,
        /// What is wrong.
        reason: String,
    },
    /// XA RECOVER is not allowed for the configured user.
    #[error("XA RECOVER was refused ({0}); on MySQL 8 grant the XA_RECOVER_ADMIN privilege to the sink's user (MariaDB needs no grant)")]
    XaRecoverDenied(String),
}

impl From<exactly_sql_sink::DbError> for MysqlSinkError {
    fn from(e: exactly_sql_sink::DbError) -> Self {
        MysqlSinkError::db(e.context, e.source)
    }
}

impl MysqlSinkError {
    pub(crate) fn db(context: impl Into<String>, source: sqlx::Error) -> Self {
        MysqlSinkError::Database {
            context: context.into(),
            source,
        }
    }
}

/// Errors a restart cannot cure: the server refuses the user (1045 access denied, 1044 no access
/// to the database, 1142/1143 a privilege missing), or the database or table does not exist
/// (1049, 1146), or TLS failed (an untrusted certificate, a server without TLS under
/// `ssl-mode=required`). They stop the job with the server's message instead of restarting it
/// forever.
fn permanent(e: &sqlx::Error) -> bool {
    if matches!(e, sqlx::Error::Tls(_)) {
        return true;
    }
    let code = e
        .as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .map(|d| d.number());
    matches!(code, Some(1044 | 1045 | 1049 | 1142 | 1143 | 1146))
}

impl From<MysqlSinkError> for CoreError {
    fn from(e: MysqlSinkError) -> Self {
        let class = match &e {
            // Permanent, or the server cannot be reached now (an outage), or a restart.
            MysqlSinkError::Database { source, .. } => exactly_sql_sink::error::class(source, permanent),
            _ => ErrorClass::Fatal,
        };
        CoreError::operator("mysql sink", class, e)
    }
}

/// Result of the MySQL sink.
pub type Result<T, E = MysqlSinkError> = std::result::Result<T, E>;
