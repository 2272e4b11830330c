//! What `exactly verify` is asked: the output named on the command line, and every setting.

use std::path::PathBuf;
use std::time::Duration;

use super::SourceRange;
use exactly_jobs::Job;

/// Where the output is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A Kafka topic (read with isolation.level=read_committed).
    Topic(String),
    /// A table of a database.
    Table(Database, String),
}

/// The database of a table output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Database {
    /// MySQL or MariaDB (`--mysql-url`, or the job's MySQL sink).
    Mysql,
    /// PostgreSQL (`--postgres-url`, or the job's PostgreSQL sink).
    Postgres,
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Output::Topic(t) => write!(f, "topic {t}"),
            Output::Table(Database::Mysql, t) => write!(f, "table {t}"),
            Output::Table(Database::Postgres, t) => write!(f, "postgres table {t}"),
        }
    }
}

/// Parses `topic:NAME`, `mysql:TABLE`, `postgres:TABLE` (or `postgres:SCHEMA.TABLE`) or a bare
/// topic name.
pub fn parse_output(s: &str) -> Result<Output, String> {
    let out = match s.split_once(':') {
        Some(("topic", t)) => Output::Topic(t.to_owned()),
        Some(("mysql", t)) => Output::Table(Database::Mysql, t.to_owned()),
        Some(("postgres", t)) => Output::Table(Database::Postgres, t.to_owned()),
        Some(_) => {
            return Err(format!(
                "{s:?}: expected topic:NAME, mysql:TABLE, postgres:TABLE or a topic name"
            ))
        }
        None => Output::Topic(s.to_owned()),
    };
    match &out {
        Output::Topic(t) | Output::Table(_, t) if t.is_empty() => Err(format!("{s:?}: the name is empty")),
        _ => Ok(out),
    }
}

/// What `exactly verify` is asked.
#[derive(Debug, Clone)]
pub struct VerifyArgs {
    /// Input topic and range.
    pub source: SourceRange,
    /// The output.
    pub output: Output,
    /// The id field (dots for nested fields; for a table, the column).
    pub id: String,
    /// Key field of the order check.
    pub key: Option<String>,
    /// Order field of the order check (numbers or strings, non-decreasing per key).
    pub order: Option<String>,
    /// Apply this job's transforms to the input to know which records should appear.
    pub job: Option<Job>,
    /// The job's sink the output belongs to (when the job has several).
    pub sink: Option<String>,
    /// Kafka bootstrap servers (default: the job's source).
    pub bootstrap: Option<String>,
    /// Kafka security settings (`--kafka-config`: a `[kafka]` table, or a job file's).
    pub kafka_config: Option<exactly_kafka_client::KafkaSecurity>,
    /// MySQL URL (default: the job's MySQL sink).
    pub mysql_url: Option<String>,
    /// PostgreSQL URL (default: the job's PostgreSQL sink).
    pub postgres_url: Option<String>,
    /// A file holding the password of `mysql_url` / `postgres_url` (so it is not on the command
    /// line, which `ps` shows); those URLs may also reference the environment (`${NAME}`).
    pub db_password_file: Option<PathBuf>,
    /// Examples per kind of problem.
    pub examples: usize,
    /// Where sorted runs are spilled (default: the system's temporary directory).
    pub spill_dir: Option<PathBuf>,
    /// Give up when a read makes no progress for this long.
    pub stall_timeout: Duration,
}
