use anyhow::{Context, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{ConnectOptions, Row};

use crate::TestEnv;

/// A fresh connection to the test database (not pooled: XA statements bind to their connection).
pub async fn connect_mysql(env: &TestEnv) -> Result<MySqlConnection> {
    let options: MySqlConnectOptions = env.mysql_url.parse().context("parsing EXACTLY_MYSQL_URL")?;
    let conn = options.connect().await.with_context(|| {
        format!(
            "connecting to MySQL ({})\n{}",
            redact(&env.mysql_url),
            crate::HOW_TO_START
        )
    })?;
    Ok(conn)
}

/// Runs a query returning one integer (e.g. `SELECT COUNT(*) ...`).
pub async fn query_i64(conn: &mut MySqlConnection, sql: &str) -> Result<i64> {
    let row = sqlx::query(sql)
        .fetch_one(&mut *conn)
        .await
        .with_context(|| sql.to_owned())?;
    Ok(row.try_get::<i64, _>(0)?)
}

/// Runs a query returning rows of two integers (e.g. `SELECT id, COUNT(*) ... GROUP BY id`).
pub async fn query_pairs(conn: &mut MySqlConnection, sql: &str) -> Result<Vec<(i64, i64)>> {
    let rows = sqlx::query(sql)
        .fetch_all(&mut *conn)
        .await
        .with_context(|| sql.to_owned())?;
    rows.iter()
        .map(|r| Ok((r.try_get::<i64, _>(0)?, r.try_get::<i64, _>(1)?)))
        .collect()
}

/// Runs a statement that returns no rows (e.g. `CREATE TABLE ...`).
pub async fn execute(conn: &mut MySqlConnection, sql: &str) -> Result<()> {
    sqlx::query(sql)
        .execute(&mut *conn)
        .await
        .with_context(|| sql.to_owned())?;
    Ok(())
}

fn redact(url: &str) -> String {
    match url.split_once('@') {
        Some((auth, rest)) => {
            let user = auth.rsplit_once(':').map_or(auth, |(u, _)| u);
            format!("{user}:***@{rest}")
        }
        None => url.to_owned(),
    }
}
