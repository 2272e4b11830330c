//! PostgreSQL for the PostgreSQL sink's scenarios (`scripts/services up postgres`).

use anyhow::{bail, Context, Result};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Row};

/// How to start PostgreSQL, for the failure message of a scenario that needs it.
pub const HOW_TO_START_POSTGRES: &str =
    "Start PostgreSQL (Debian's package, no Docker needed) and export its settings:\n\
     \n    scripts/services up postgres && eval \"$(scripts/services env)\"\n\
     \nor run the whole suite with `scripts/test`, which does both.";

/// `EXACTLY_POSTGRES_URL` (TLS with certificate checks, as `scripts/services env` exports it);
/// fails saying how to start PostgreSQL when it is not set.
pub fn postgres_url() -> Result<String> {
    match std::env::var("EXACTLY_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Ok(url),
        _ => bail!("EXACTLY_POSTGRES_URL is not set: this scenario needs PostgreSQL.\n{HOW_TO_START_POSTGRES}"),
    }
}

/// A fresh connection to the test database; fails saying how to start PostgreSQL.
pub async fn connect_postgres() -> Result<PgConnection> {
    let url = postgres_url()?;
    let options: PgConnectOptions = url.parse().context("parsing EXACTLY_POSTGRES_URL")?;
    options
        .connect()
        .await
        .with_context(|| format!("connecting to PostgreSQL (EXACTLY_POSTGRES_URL)\n{HOW_TO_START_POSTGRES}"))
}

/// Runs a query returning one integer (`SELECT COUNT(*) …`; cast other integer types to bigint).
pub async fn pg_i64(conn: &mut PgConnection, sql: &str) -> Result<i64> {
    let row = sqlx::query(sql)
        .fetch_one(&mut *conn)
        .await
        .with_context(|| sql.to_owned())?;
    Ok(row.try_get::<i64, _>(0)?)
}

/// Runs a statement that returns no rows.
pub async fn pg_execute(conn: &mut PgConnection, sql: &str) -> Result<()> {
    sqlx::Executor::execute(&mut *conn, sql)
        .await
        .with_context(|| sql.to_owned())?;
    Ok(())
}
