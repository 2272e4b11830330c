//! The MySQL sink over TLS, against MariaDB with `require_secure_transport` as a user that is
//! also `REQUIRE SSL` (the scripts make the server's certificates): with `ssl-mode=verify_identity` and the test CA the
//! job writes its rows, its password taken from the environment through `${...}` in the job file;
//! without TLS (`ssl-mode=disabled`) and with a CA that did not sign the server's certificate, the
//! job fails at start with the server's address and the cause, instead of restarting.

mod k2m;

use std::time::Duration;

use anyhow::{Context, Result};
use exactly_integration_tests::{create_topic, fails_at_start, produce, ChildJob, TestEnv};
use k2m::{exactly, setup, wait_rows};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mysql_sink_writes_over_tls_and_refuses_plaintext_and_untrusted_servers() -> Result<()> {
    let env = TestEnv::get().await?;
    let hint = "set by `scripts/services env` (MariaDB with TLS, started by `scripts/services up`)";
    let user = std::env::var("EXACTLY_MYSQL_TLS_USER").with_context(|| format!("EXACTLY_MYSQL_TLS_USER: {hint}"))?;
    let ca = std::env::var("EXACTLY_MYSQL_TLS_CA").with_context(|| format!("EXACTLY_MYSQL_TLS_CA: {hint}"))?;
    let other_ca = format!(
        "{}/ca.pem",
        std::env::var("EXACTLY_KAFKA_TLS_DIR").with_context(|| format!("EXACTLY_KAFKA_TLS_DIR: {hint}"))?
    );
    let address = exactly_core::net::url_address(&env.mysql_url).context("the MySQL URL's address")?;
    let database = env.mysql_url.rsplit('/').next().unwrap_or("exactly").to_owned();
    // The TLS user's password (the scripts give it the same as the plaintext user's), referenced
    // from the environment; only the child processes read the variable.
    let password = env
        .mysql_url
        .split_once("://")
        .and_then(|(_, r)| r.split_once('@'))
        .and_then(|(u, _)| u.split_once(':'))
        .map(|(_, p)| p.to_owned())
        .context("the MySQL URL's password")?;
    std::env::set_var("EXACTLY_TEST_MYSQL_PASSWORD", &password);
    let dir = tempfile::tempdir()?;
    let s = setup(env, "upsert", dir.path());
    create_topic(env, &s.input, 2).await?;
    let with_url = |query: &str, file: &str| -> Result<Vec<String>> {
        let url = format!("mysql://{user}:${{EXACTLY_TEST_MYSQL_PASSWORD}}@{address}/{database}?{query}");
        let text = std::fs::read_to_string(&s.args[1])?
            .replace(&format!("url = \"{}\"", env.mysql_url), &format!("url = \"{url}\""));
        assert!(text.contains("${EXACTLY_TEST_MYSQL_PASSWORD}"), "{text}");
        let path = dir.path().join(format!("{file}.toml"));
        std::fs::write(&path, text)?;
        Ok(vec!["run".into(), path.display().to_string()])
    };

    let records: Vec<(String, String)> = (1..=40)
        .map(|id| (format!("k{}", id % 7), format!("{id},k{},{id}", id % 7)))
        .collect();
    produce(env, &s.input, &records)?;
    let mut job = ChildJob::spawn(
        exactly(),
        &with_url(&format!("ssl-mode=verify_identity&ssl-ca={ca}"), "tls")?,
        "",
    )?;
    wait_rows(env, &s, &mut job, 40, Duration::from_secs(60)).await?;
    job.kill();

    fails_at_start(
        exactly(),
        &with_url("ssl-mode=disabled", "plaintext")?,
        &[&address, "Access denied", &user],
    )?;
    fails_at_start(
        exactly(),
        &with_url(&format!("ssl-mode=verify_ca&ssl-ca={other_ca}"), "untrusted")?,
        &[&address, "certificate"],
    )?;
    Ok(())
}
