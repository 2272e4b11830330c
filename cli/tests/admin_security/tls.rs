//! The admin endpoint over TLS: HTTPS only, and a renewed certificate served without a restart.

use super::*;

/// With `admin_tls_cert` and `admin_tls_key` (the local broker's certificate for 127.0.0.1, made by
/// `scripts/services` with its own CA) the endpoint speaks HTTPS only: the commands reach it with
/// `--admin https://…` and `$EXACTLY_ADMIN_CA`, a certificate from another CA is refused by them,
/// plain HTTP gets no answer, and the token is still required. A certificate without its key, or a
/// key file that holds no key, is refused by `exactly check`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_endpoint_with_tls_speaks_https_only() -> Result<()> {
    let env = TestEnv::get().await?;
    let tls = from_services("EXACTLY_KAFKA_TLS_DIR")?;
    let (_dir, file, port) = job_with_admin(env, "adm-tls").await?;
    let with = job_lines(&file, port)?;

    // Half a TLS setting, or a key file without a key: refused before anything runs.
    let cert = tls.join("broker.pem").display().to_string();
    let key = tls.join("broker-pkcs8.key").display().to_string();
    check_refuses(
        &file,
        &with(&format!("admin_tls_cert = \"{cert}\"")),
        &["job.admin_tls_cert", "admin_tls_key"],
    )?;
    check_refuses(
        &file,
        &with(&format!("admin_tls_cert = \"{cert}\"\nadmin_tls_key = \"{cert}\"")),
        &["admin_tls_key"],
    )?;

    std::fs::write(
        &file,
        with(&format!(
            "admin_token = \"${{EXACTLY_TEST_ADMIN_TOKEN}}\"\nadmin_tls_cert = \"{cert}\"\nadmin_tls_key = \"{key}\""
        )),
    )?;
    std::env::set_var("EXACTLY_TEST_ADMIN_TOKEN", TOKEN);
    let mut job = spawn_run(&file, &[], "")?;
    let https = format!("https://127.0.0.1:{port}");
    let ca = tls.join("ca.pem");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = cmd()
            .env("EXACTLY_ADMIN_CA", &ca)
            .args(["status", "--admin", &https])
            .output()?;
        if out.status.success() {
            let status: serde_json::Value = serde_json::from_slice(&out.stdout)?;
            if status["checkpoints"]["completed"].as_u64() >= Some(1) {
                break;
            }
        }
        assert!(job.running(), "the job exited:\n{}", job.tail(40));
        assert!(
            std::time::Instant::now() < deadline,
            "no status over HTTPS in 60 s: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            job.tail(40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Plain HTTP to it: no answer.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let answered = agent.get(&format!("http://127.0.0.1:{port}/healthz")).call();
    assert!(
        answered.is_err(),
        "plain HTTP was answered: {:?}",
        answered.map(|r| r.status())
    );
    // A certificate the client's CA did not sign: refused by the command.
    let out = cmd()
        .env("EXACTLY_ADMIN_CA", tls.join("untrusted-ca.pem"))
        .args(["status", "--admin", &https])
        .output()?;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.to_lowercase().contains("certificate"),
        "{said}"
    );
    // Over TLS the token is still required.
    let out = cmd()
        .env("EXACTLY_ADMIN_CA", &ca)
        .args(["savepoint", "--admin", &https])
        .output()?;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("bearer token is required"),
        "{said}"
    );
    let out = cmd()
        .env("EXACTLY_ADMIN_CA", &ca)
        .env("EXACTLY_ADMIN_TOKEN", TOKEN)
        .args(["stop", "--admin", &https])
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_exit(&mut job, Duration::from_secs(60))?;
    assert!(
        job.tail(100_000).contains(&format!("https://127.0.0.1:{port}")),
        "the log names the HTTPS address"
    );
    assert!(!job.tail(100_000).contains(TOKEN), "the log shows no token");
    Ok(())
}

/// `exactly status --admin https://…` trusting `ca`: whether it succeeded, and what it said.
fn https_status(port: u16, ca: &std::path::Path) -> Result<(bool, String)> {
    let out = cmd()
        .env("EXACTLY_ADMIN_CA", ca)
        .args(["status", "--admin", &format!("https://127.0.0.1:{port}")])
        .output()?;
    Ok((out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned()))
}

/// Replaces `to` by a copy of `from` the way certificate tools do (a new file renamed over it).
fn renew(from: &std::path::Path, to: &std::path::Path) -> Result<()> {
    let tmp = to.with_extension("renewing");
    std::fs::copy(from, &tmp)?;
    std::fs::rename(&tmp, to)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_admin_certificate_is_served_without_a_restart() -> Result<()> {
    let env = TestEnv::get().await?;
    // Two certificates for 127.0.0.1 from two test CAs: the broker's and MariaDB's.
    let first = from_services("EXACTLY_KAFKA_TLS_DIR")?;
    let mysql_ca = from_services("EXACTLY_MYSQL_TLS_CA")?;
    let second = mysql_ca.parent().unwrap_or(&mysql_ca).to_owned();
    let (dir, file, port) = job_with_admin(env, "adm-renew").await?;
    let (cert, key) = (dir.path().join("admin.pem"), dir.path().join("admin.key"));
    std::fs::copy(first.join("broker.pem"), &cert)?;
    std::fs::copy(first.join("broker-pkcs8.key"), &key)?;
    std::fs::write(&file, job_lines(&file, port)?(&admin_tls_lines(&cert, &key)))?;
    let mut job = spawn_run(&file, &[], "")?;
    until(&mut job, "status over HTTPS with the first certificate", |_| {
        Ok(https_status(port, &first.join("ca.pem"))?.0)
    })?;

    // Renewed by another CA, certificate first, then its key: served once both are in place.
    renew(&second.join("server.pem"), &cert)?;
    renew(&second.join("server.key"), &key)?;
    until(&mut job, "the renewed certificate", |_| {
        Ok(https_status(port, &second.join("ca.pem"))?.0)
    })?;
    let (ok, said) = https_status(port, &first.join("ca.pem"))?;
    assert!(
        !ok && said.to_lowercase().contains("certificate"),
        "the old CA still trusted: {said}"
    );

    // A renewal that does not load (a truncated certificate): logged at the next handshake a
    // second on, the served certificate kept.
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\ntruncated\n")?;
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..2 {
        let (ok, said) = https_status(port, &second.join("ca.pem"))?;
        assert!(ok, "a broken renewal stopped the endpoint: {said}\n{}", job.tail(40));
    }
    until(&mut job, "the warning about the broken files", |job| {
        Ok(job.tail(100_000).contains("do not load"))
    })?;
    job.kill();
    Ok(())
}
