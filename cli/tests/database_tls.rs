//! The database sinks' connections (the sinks and `exactly verify` open them the same way) are
//! verified TLS by default to any server not named by this machine's loopback address: the
//! *client* refuses a certificate for another host name, one no trusted CA signed, and a server
//! that offers no TLS — each of which sqlx's default (`preferred`/`prefer`: TLS unverified, or
//! plaintext) took. The servers here listen on 127.0.0.1 with certificates for `127.0.0.1` and
//! `localhost`; the machine's host name (which resolves to 127.0.0.1 here) reaches them under a
//! name that is not loopback and that their certificates do not carry.

use std::io::{Read, Write};
use std::net::{TcpListener, ToSocketAddrs};

use anyhow::{bail, Context, Result};
use exactly_integration_tests::TestEnv;

/// The machine's host name, which must resolve to 127.0.0.1 (where the test servers listen).
fn remote_looking_name() -> Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading the host name")?
        .trim()
        .to_owned();
    let resolves_here = (name.as_str(), 1)
        .to_socket_addrs()
        .map(|mut a| a.any(|a| a.ip() == std::net::Ipv4Addr::LOCALHOST))
        .unwrap_or(false);
    if !resolves_here {
        bail!(
            "this test reaches the local database servers under the machine's host name, {name:?}, which must resolve to 127.0.0.1: add `127.0.0.1 {name}` to /etc/hosts"
        );
    }
    Ok(name)
}

/// `url` (scheme://user:pass@host:port/db?...) to `host` instead, without its query.
fn to_host(url: &str, host: &str) -> Result<String> {
    let address = exactly_core::net::url_address(url).context("the URL's address")?;
    let port = address.rsplit_once(':').context("a port")?.1;
    let base = url.split('?').next().unwrap_or(url);
    Ok(base.replacen(&address, &format!("{host}:{port}"), 1))
}

/// A server on 127.0.0.1 that speaks only the first words of its protocol, offering no TLS:
/// `greeting` is written at once (MySQL's handshake), and any request is answered `reply`
/// (PostgreSQL's answer to SSLRequest, "no"). Returns its port.
fn without_tls(greeting: Vec<u8>, reply: Vec<u8>) -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(4) {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.write_all(&greeting);
            let mut buf = [0u8; 512];
            if conn.read(&mut buf).is_ok_and(|n| n > 0) {
                let _ = conn.write_all(&reply);
                let _ = conn.read(&mut buf);
            }
        }
    });
    Ok(port)
}

/// MySQL's initial handshake (protocol 10) without the SSL capability.
fn mysql_handshake_without_tls() -> Vec<u8> {
    let mut p = vec![10u8];
    p.extend_from_slice(b"5.5.5-10.11.0-NoTLS\0");
    p.extend_from_slice(&7u32.to_le_bytes());
    p.extend_from_slice(b"abcdefgh\0");
    // PROTOCOL_41 | SECURE_CONNECTION (no SSL); PLUGIN_AUTH in the upper half.
    p.extend_from_slice(&0x8200u16.to_le_bytes());
    p.push(0x21);
    p.extend_from_slice(&2u16.to_le_bytes());
    p.extend_from_slice(&0x0008u16.to_le_bytes());
    p.push(21);
    p.extend_from_slice(&[0u8; 10]);
    p.extend_from_slice(b"ijklmnopqrst\0");
    p.extend_from_slice(b"mysql_native_password\0");
    let mut packet = (p.len() as u32).to_le_bytes()[..3].to_vec();
    packet.push(0);
    packet.extend(p);
    packet
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_connections_beyond_loopback_are_verified_unless_told_otherwise() -> Result<()> {
    let env = TestEnv::get().await?;
    let hint = "set by `scripts/services env` (MariaDB with TLS, started by `scripts/services up`)";
    let ca = std::env::var("EXACTLY_MYSQL_TLS_CA").with_context(|| format!("EXACTLY_MYSQL_TLS_CA: {hint}"))?;
    let name = remote_looking_name()?;
    let remote = to_host(&env.mysql_url, &name)?;

    // Signed by a trusted CA, but for other names: refused.
    let err = exactly_mysql_sink::connect_url(&format!("{remote}?ssl-ca={ca}"), None)
        .await
        .err()
        .context("a certificate for another host name was accepted")?;
    assert!(err.to_string().contains(&name), "{err}");
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
    // No CA given: the web roots did not sign it either.
    let err = exactly_mysql_sink::connect_url(&remote, None)
        .await
        .err()
        .context("a certificate no trusted CA signed was accepted")?;
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
    // A server that offers no TLS: refused before a word of the login.
    let port = without_tls(mysql_handshake_without_tls(), Vec::new())?;
    let err = exactly_mysql_sink::connect_url(&format!("mysql://u:secret@{name}:{port}/db"), None)
        .await
        .err()
        .context("a server without TLS was accepted")?;
    assert!(err.to_string().contains("does not support TLS"), "{err}");
    // What the operator asks for explicitly still goes: verified for the names on the
    // certificate, and (with a warning at start) unverified.
    let local = to_host(&env.mysql_url, "localhost")?;
    exactly_mysql_sink::connect_url(&format!("{local}?ssl-mode=verify_identity&ssl-ca={ca}"), None).await?;
    exactly_mysql_sink::connect_url(&format!("{remote}?ssl-mode=required"), None).await?;
    assert!(exactly_mysql_sink::tls_warning(&format!("{remote}?ssl-mode=required")).is_some());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_beyond_loopback_are_verified_unless_told_otherwise() -> Result<()> {
    let env = TestEnv::get().await?;
    let hint = "set by `scripts/services env` (PostgreSQL with TLS, started by `scripts/services up`)";
    let url = std::env::var("EXACTLY_POSTGRES_URL").with_context(|| format!("EXACTLY_POSTGRES_URL: {hint}"))?;
    let ca = std::env::var("EXACTLY_POSTGRES_TLS_CA").with_context(|| format!("EXACTLY_POSTGRES_TLS_CA: {hint}"))?;
    let _ = env;
    if std::env::var_os("PGSSLMODE").is_some() {
        bail!("PGSSLMODE is set: unset it for this test (it would choose the TLS mode)");
    }
    let name = remote_looking_name()?;
    let remote = to_host(&url, &name)?;

    let err = exactly_postgres_sink::connect_url(&format!("{remote}?sslrootcert={ca}"), None)
        .await
        .err()
        .context("a certificate for another host name was accepted")?;
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
    let err = exactly_postgres_sink::connect_url(&remote, None)
        .await
        .err()
        .context("a certificate no trusted CA signed was accepted")?;
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
    let port = without_tls(Vec::new(), b"N".to_vec())?;
    let err = exactly_postgres_sink::connect_url(&format!("postgres://u:secret@{name}:{port}/db"), None)
        .await
        .err()
        .context("a server without TLS was accepted")?;
    assert!(err.to_string().contains("does not support TLS"), "{err}");
    let local = to_host(&url, "localhost")?;
    exactly_postgres_sink::connect_url(&format!("{local}?sslmode=verify-full&sslrootcert={ca}"), None).await?;
    exactly_postgres_sink::connect_url(&format!("{remote}?sslmode=require"), None).await?;
    assert!(exactly_postgres_sink::tls_warning(&format!("{remote}?sslmode=require")).is_some());
    Ok(())
}
