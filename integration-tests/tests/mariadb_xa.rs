//! Proves the database under test keeps XA prepared branches across a disconnect, lists them in
//! XA RECOVER, and lets another connection commit them: the facts the MySQL sink's recovery rests on.

use anyhow::{Context, Result};
use exactly_integration_tests::{connect_mysql, query_i64, unique, TestEnv};
use sqlx::{Connection, Row};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn prepared_branch_survives_disconnect_and_commits_from_another_connection() -> Result<()> {
    let env = TestEnv::get().await?;
    let table = unique("xa_smoke").replace('-', "_");
    let gtrid = unique("exactly-xa-smoke");
    let xid = format!("X'{}', X'{}', 1", hex(gtrid.as_bytes()), hex(b"b0"));

    let mut setup = connect_mysql(env).await?;
    sqlx::raw_sql(&format!(
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY, v VARCHAR(32)) ENGINE=InnoDB"
    ))
    .execute(&mut setup)
    .await?;

    let mut owner = connect_mysql(env).await?;
    sqlx::raw_sql(&format!(
        "XA START {xid}; INSERT INTO {table} VALUES (1, 'one'), (2, 'two'); XA END {xid}; XA PREPARE {xid}"
    ))
    .execute(&mut owner)
    .await
    .context("XA START .. PREPARE")?;
    owner.close().await?;

    let mut other = connect_mysql(env).await?;
    let recovered = sqlx::raw_sql("XA RECOVER").fetch_all(&mut other).await?;
    let listed = recovered.iter().any(|row| {
        row.try_get::<Vec<u8>, _>("data")
            .map(|d| d.starts_with(gtrid.as_bytes()))
            .unwrap_or(false)
    });
    assert!(listed, "XA RECOVER must list the prepared branch {gtrid}");
    let visible = query_i64(&mut other, &format!("SELECT COUNT(*) FROM {table}")).await?;
    assert_eq!(visible, 0, "prepared rows are invisible before commit");

    sqlx::raw_sql(&format!("XA COMMIT {xid}"))
        .execute(&mut other)
        .await
        .context("XA COMMIT")?;
    let visible = query_i64(&mut other, &format!("SELECT COUNT(*) FROM {table}")).await?;
    assert_eq!(visible, 2, "rows are visible after XA COMMIT from another connection");

    // A second commit of the same xid is indistinguishable from an unknown xid (XAER_NOTA, 1397).
    let again = sqlx::raw_sql(&format!("XA COMMIT {xid}")).execute(&mut other).await;
    let code = again
        .expect_err("committing twice must fail")
        .as_database_error()
        .and_then(|e| e.code().map(|c| c.into_owned()));
    assert_eq!(code.as_deref(), Some("XAE04"), "XAER_NOTA's SQLSTATE");

    sqlx::raw_sql(&format!("DROP TABLE {table}"))
        .execute(&mut other)
        .await?;
    Ok(())
}
