//! Client certificates where the admin endpoint asks for them: required, revoked by a new CRL,
//! refused under an expired CRL until a newer one replaces it.

use super::*;

/// `exactly status` against the endpoint on `port`, trusting `ca`, with these extra environment
/// variables: whether it succeeded, and what it said.
fn status_with(port: u16, ca: &std::path::Path, env: &[(&str, &std::path::Path)]) -> Result<(bool, String)> {
    let mut c = cmd();
    c.env_remove("EXACTLY_ADMIN_CLIENT_CERT")
        .env_remove("EXACTLY_ADMIN_CLIENT_KEY")
        .env("EXACTLY_ADMIN_CA", ca);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c
        .args(["status", "--admin", &format!("https://127.0.0.1:{port}")])
        .output()?;
    Ok((out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned()))
}

/// With `admin_tls_client_ca` the endpoint asks for client certificates (mutual TLS): a client
/// certificate of the local broker's test CA (`scripts/services` makes it for the broker's SSL
/// listener) gets status, a savepoint and a stop through the commands
/// (`$EXACTLY_ADMIN_CLIENT_CERT`, `$EXACTLY_ADMIN_CLIENT_KEY`); a client without a certificate gets
/// only `/healthz`; one whose certificate another CA signed (MariaDB's test CA) fails its
/// handshake; half the client settings, or a client CA without the endpoint's own certificate,
/// are refused naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_where_the_endpoint_asks_for_them() -> Result<()> {
    let env = TestEnv::get().await?;
    let tls = from_services("EXACTLY_KAFKA_TLS_DIR")?;
    let other_ca = from_services("EXACTLY_MYSQL_TLS_CA")?;
    let other = other_ca.parent().unwrap_or(&other_ca).to_owned();
    let (dir, file, port) = job_with_admin(env, "adm-mtls").await?;
    let with = job_lines(&file, port)?;
    let ca = tls.join("ca.pem");

    // A client CA without the endpoint's own certificate, or a file without a certificate.
    check_refuses(
        &file,
        &with(&format!("admin_tls_client_ca = \"{}\"", ca.display())),
        &["job.admin_tls_client_ca", "admin_tls_cert"],
    )?;
    let server = admin_tls_lines(&tls.join("broker.pem"), &tls.join("broker-pkcs8.key"));
    check_refuses(
        &file,
        &with(&format!(
            "{server}\nadmin_tls_client_ca = \"{}\"",
            tls.join("client.key").display()
        )),
        &["job.admin_tls_client_ca", "no certificate"],
    )?;

    std::fs::write(
        &file,
        with(&format!("{server}\nadmin_tls_client_ca = \"{}\"", ca.display())),
    )?;
    let mut job = spawn_run(&file, &[], "")?;
    let (client_cert, client_key) = (tls.join("client.pem"), tls.join("client.key"));
    let certified = [
        ("EXACTLY_ADMIN_CLIENT_CERT", client_cert.as_path()),
        ("EXACTLY_ADMIN_CLIENT_KEY", client_key.as_path()),
    ];
    until(&mut job, "status with the client certificate", |_| {
        Ok(status_with(port, &ca, &certified)?.0)
    })?;

    // Without a certificate: the probe's /healthz only.
    let (ok, said) = status_with(port, &ca, &[])?;
    assert!(!ok && said.contains("client certificate is required"), "{said}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .tls_config(
            exactly_kafka_client::https::client_tls(Some(&ca), "the test CA", None).map_err(anyhow::Error::msg)?,
        )
        .build()
        .into();
    let mut health = agent.get(&format!("https://127.0.0.1:{port}/healthz")).call()?;
    assert_eq!(health.status().as_u16(), 200, "{}", health.body_mut().read_to_string()?);
    let mut page = agent.get(&format!("https://127.0.0.1:{port}/")).call()?;
    assert_eq!(page.status().as_u16(), 401, "{}", page.body_mut().read_to_string()?);

    // A certificate of another CA, and half the client settings: refused.
    let (ok, said) = status_with(
        port,
        &ca,
        &[
            ("EXACTLY_ADMIN_CLIENT_CERT", other.join("server.pem").as_path()),
            ("EXACTLY_ADMIN_CLIENT_KEY", other.join("server.key").as_path()),
        ],
    )?;
    assert!(
        !ok && said.contains("TLS handshake") && said.contains("UnknownCA"),
        "another CA's client certificate: {said}"
    );
    let (ok, said) = status_with(port, &ca, &certified[..1])?;
    assert!(!ok && said.contains("EXACTLY_ADMIN_CLIENT_KEY"), "{said}");

    // With the certificate: a savepoint, then a stop.
    let out = cmd()
        .env("EXACTLY_ADMIN_CA", &ca)
        .envs(certified)
        .args(["savepoint", "--admin", &format!("https://127.0.0.1:{port}")])
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let saved = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        std::path::Path::new(&saved).starts_with(dir.path()),
        "savepoint at {saved:?}"
    );
    let out = cmd()
        .env("EXACTLY_ADMIN_CA", &ca)
        .envs(certified)
        .args(["stop", "--admin", &format!("https://127.0.0.1:{port}")])
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_exit(&mut job, Duration::from_secs(60))?;
    Ok(())
}

/// Runs `openssl` with `args` in `dir`, failing with what it said.
fn openssl(dir: &std::path::Path, args: &[&str]) -> Result<()> {
    let out = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .map_err(|e| anyhow::anyhow!("running openssl (scripts/setup installs it): {e}"))?;
    anyhow::ensure!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A CA database of a test's own for `openssl ca`, signing with the broker test CA's key: CRLs
/// of that CA, revoking its certificates.
struct TestCa {
    dir: std::path::PathBuf,
    ca: String,
    key: String,
}

impl TestCa {
    fn new(under: &std::path::Path, tls: &std::path::Path) -> Result<Self> {
        let dir = under.join("ca");
        std::fs::create_dir(&dir)?;
        std::fs::write(
            dir.join("openssl.cnf"),
            "[ca]\ndefault_ca = test\n[test]\ndatabase = index.txt\ncrlnumber = crlnumber\ndefault_md = sha256\ndefault_crl_days = 30\n",
        )?;
        std::fs::write(dir.join("index.txt"), "")?;
        std::fs::write(dir.join("crlnumber"), "01\n")?;
        Ok(TestCa {
            dir,
            ca: tls.join("ca.pem").display().to_string(),
            key: tls.join("ca.key").display().to_string(),
        })
    }

    /// A CRL of the certificates revoked so far into `out`, valid 30 days unless `extra` sets
    /// `-crl_lastupdate` / `-crl_nextupdate`.
    fn crl(&self, out: &std::path::Path, extra: &[&str]) -> Result<()> {
        let out = out.display().to_string();
        let mut args = vec![
            "ca",
            "-config",
            "openssl.cnf",
            "-gencrl",
            "-keyfile",
            &self.key,
            "-cert",
            &self.ca,
            "-out",
            &out,
        ];
        args.extend_from_slice(extra);
        openssl(&self.dir, &args)
    }

    fn revoke(&self, cert: &std::path::Path) -> Result<()> {
        let cert = cert.display().to_string();
        openssl(
            &self.dir,
            &[
                "ca",
                "-config",
                "openssl.cnf",
                "-revoke",
                &cert,
                "-keyfile",
                &self.key,
                "-cert",
                &self.ca,
            ],
        )
    }

    /// A CRL, written beside `file` and renamed over it, as a CRL distributor replaces one.
    fn replace_crl(&self, file: &std::path::Path, extra: &[&str]) -> Result<()> {
        let new = file.with_extension("new");
        self.crl(&new, extra)?;
        Ok(std::fs::rename(&new, file)?)
    }
}

/// `t` as `openssl ca` takes times (YYYYMMDDHHMMSSZ).
fn openssl_time(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == 'Z')
        .collect()
}

/// The broker test CA's client certificate and key, as `exactly` commands present them.
struct ClientCert {
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    ca: std::path::PathBuf,
}

impl ClientCert {
    fn of(tls: &std::path::Path) -> Self {
        ClientCert {
            cert: tls.join("client.pem"),
            key: tls.join("client.key"),
            ca: tls.join("ca.pem"),
        }
    }

    /// `exactly status` at `port` presenting the certificate: whether it succeeded, and stderr.
    fn status(&self, port: u16) -> Result<(bool, String)> {
        status_with(
            port,
            &self.ca,
            &[
                ("EXACTLY_ADMIN_CLIENT_CERT", self.cert.as_path()),
                ("EXACTLY_ADMIN_CLIENT_KEY", self.key.as_path()),
            ],
        )
    }

    /// Starts the job of `file` and waits until the certificate gets its status.
    fn run_until_served(&self, file: &std::path::Path, port: u16) -> Result<exactly_integration_tests::ChildJob> {
        let mut job = spawn_run(file, &[], "")?;
        until(&mut job, "status with the client certificate", |_| {
            Ok(self.status(port)?.0)
        })?;
        Ok(job)
    }
}

/// With `admin_tls_client_crl` a client certificate its CA revoked ends the handshake — from the
/// moment the CRL file is replaced, without a restart: the broker test CA's client certificate
/// gets status until a new CRL (made here by `openssl ca` with the test CA's key, in a database of
/// the test's own) revokes it, then `CertificateRevoked`. A CRL without its CA, or a file without
/// a CRL, is refused naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_revoked_by_a_new_crl_is_refused_without_a_restart() -> Result<()> {
    let env = TestEnv::get().await?;
    let tls = from_services("EXACTLY_KAFKA_TLS_DIR")?;
    let (dir, file, port) = job_with_admin(env, "adm-crl").await?;
    let test_ca = TestCa::new(dir.path(), &tls)?;
    let ca = &test_ca.ca;
    let crl = dir.path().join("client.crl");
    test_ca.crl(&crl, &[])?;

    let with = job_lines(&file, port)?;
    let server = admin_tls_lines(&tls.join("broker.pem"), &tls.join("broker-pkcs8.key"));
    // A CRL without the CA it belongs to, and a file without a CRL.
    check_refuses(
        &file,
        &with(&format!("{server}\nadmin_tls_client_crl = \"{}\"", crl.display())),
        &["job.admin_tls_client_crl", "admin_tls_client_ca"],
    )?;
    check_refuses(
        &file,
        &with(&format!(
            "{server}\nadmin_tls_client_ca = \"{ca}\"\nadmin_tls_client_crl = \"{ca}\""
        )),
        &["job.admin_tls_client_crl", "no certificate revocation list"],
    )?;

    std::fs::write(
        &file,
        with(&format!(
            "{server}\nadmin_tls_client_ca = \"{ca}\"\nadmin_tls_client_crl = \"{}\"",
            crl.display()
        )),
    )?;
    let client = ClientCert::of(&tls);
    let mut job = client.run_until_served(&file, port)?;

    // The certificate revoked: a new CRL renamed over the old one, as a CRL distributor would.
    test_ca.revoke(&client.cert)?;
    test_ca.replace_crl(&crl, &[])?;
    let mut said = String::new();
    until(&mut job, "the revoked certificate refused", |_| {
        let (ok, s) = client.status(port)?;
        said = s;
        Ok(!ok)
    })?;
    assert!(said.contains("CertificateRevoked"), "{said}");
    // Written by the job before it refused the handshake, but read from its stderr by another
    // thread of the test: it may arrive a moment after the refusal (seen once, in a full run).
    until(&mut job, "the log saying the client CA or CRL changed", |j| {
        Ok(j.tail(100_000).contains("client CA or CRL changed"))
    })?;
    job.kill();
    Ok(())
}

/// A CRL is trusted until its nextUpdate only: one already expired is refused at start naming the
/// file and the time; one that expires while the job runs ends the handshakes of its CA's client
/// certificates (the log says why) until a newer CRL replaces the file — without a restart. The
/// certificate is revoked by none of these CRLs: only their age refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_crl_refuses_client_certificates_until_a_newer_one_replaces_it() -> Result<()> {
    let env = TestEnv::get().await?;
    let tls = from_services("EXACTLY_KAFKA_TLS_DIR")?;
    let (dir, file, port) = job_with_admin(env, "adm-crl-exp").await?;
    let test_ca = TestCa::new(dir.path(), &tls)?;
    let ca = test_ca.ca.clone();
    let now = std::time::SystemTime::now();
    let at = |t: std::time::SystemTime| openssl_time(t);
    let (last, next) = (at(now - Duration::from_secs(7200)), at(now - Duration::from_secs(3600)));
    let expired = ["-crl_lastupdate", last.as_str(), "-crl_nextupdate", next.as_str()];
    let crl = dir.path().join("client.crl");
    test_ca.crl(&crl, &expired)?;

    let with = job_lines(&file, port)?;
    let server = admin_tls_lines(&tls.join("broker.pem"), &tls.join("broker-pkcs8.key"));
    let text = with(&format!(
        "{server}\nadmin_tls_client_ca = \"{ca}\"\nadmin_tls_client_crl = \"{}\"",
        crl.display()
    ));
    let next_rfc = humantime::format_rfc3339_seconds(now - Duration::from_secs(3600)).to_string();
    check_refuses(
        &file,
        &text,
        &[
            "job.admin_tls_client_crl",
            "expired at",
            &next_rfc,
            "publish a newer one",
        ],
    )?;

    // A CRL valid for another hour: the job starts, warning that it expires within a day.
    let hour = at(std::time::SystemTime::now() + Duration::from_secs(3600));
    test_ca.crl(&crl, &["-crl_nextupdate", hour.as_str()])?;
    std::fs::write(&file, &text)?;
    let client = ClientCert::of(&tls);
    let mut job = client.run_until_served(&file, port)?;
    until(&mut job, "the warning that the CRL expires within a day", |j| {
        Ok(j.tail(100_000).contains("expires within a day"))
    })?;

    // Replaced by one that expires two seconds on (a distributor that stopped renewing): from
    // then on the certificate is refused, and the log says why.
    let soon = at(std::time::SystemTime::now() + Duration::from_secs(2));
    test_ca.replace_crl(&crl, &["-crl_nextupdate", soon.as_str()])?;
    let mut said = String::new();
    until(&mut job, "the certificate refused under the expired CRL", |_| {
        let (ok, s) = client.status(port)?;
        said = s;
        Ok(!ok)
    })?;
    until(&mut job, "the expired CRL logged", |j| {
        Ok(j.tail(100_000).contains("its CA's CRL has expired"))
    })?;
    assert!(!said.is_empty(), "the refused client said nothing");

    // A newer CRL (30 days) renamed over the file: certificates pass again, same process.
    test_ca.replace_crl(&crl, &[])?;
    until(
        &mut job,
        "status with the client certificate after the newer CRL",
        |_| Ok(client.status(port)?.0),
    )?;
    job.kill();
    Ok(())
}
