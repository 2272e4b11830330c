//! TLS to the server, verified by default: a URL without `sslmode` (and no `PGSSLMODE` in the
//! environment) to a server that is not this machine's loopback address gets `verify-full` (the
//! certificate chain, against the URL's `sslrootcert` or the bundled web roots, and the host
//! name), not sqlx's `prefer` (TLS when the server offers it, no certificate check, plaintext
//! when it does not). A weaker `sslmode` to such a server is the operator's explicit choice, said
//! at start ([`tls_warning`]).

use sqlx::postgres::{PgConnectOptions, PgSslMode};

const KEYS: &[&str] = &["sslmode", "ssl-mode"];

/// The mode the URL (or `PGSSLMODE`) names, as sqlx reads them.
fn explicit(url: &str) -> Option<String> {
    exactly_core::net::url_query_last(url, KEYS).or_else(|| {
        // sqlx ignores a value it cannot parse (and keeps `prefer`): so does this.
        std::env::var("PGSSLMODE")
            .ok()
            .filter(|v| v.parse::<PgSslMode>().is_ok())
    })
}

/// The server is reached through a socket file or at a loopback address — as sqlx parsed the URL,
/// whose host may also come from `host=`/`hostaddr=` or `PGHOST`.
fn local(options: &PgConnectOptions) -> bool {
    // A host that is a directory is a socket's (from PGHOST, or a URL without a host).
    options.get_socket().is_some()
        || options.get_host().starts_with('/')
        || exactly_core::net::host_is_loopback(options.get_host())
}

/// `options` (parsed from `url`) with the default above applied.
pub(crate) fn verified_by_default(url: &str, options: PgConnectOptions) -> PgConnectOptions {
    if explicit(url).is_none() && !local(&options) {
        options.ssl_mode(PgSslMode::VerifyFull)
    } else {
        options
    }
}

/// The warning for a URL that asks for less than a verified connection to a server beyond this
/// machine, `None` otherwise (and for a URL that does not parse: that is an error elsewhere).
pub fn tls_warning(url: &str) -> Option<String> {
    let options: PgConnectOptions = url.parse().ok()?;
    let options = verified_by_default(url, options);
    if local(&options) {
        return None;
    }
    let (mode, what) = match options.get_ssl_mode() {
        PgSslMode::VerifyFull => return None,
        PgSslMode::VerifyCa => (
            "verify-ca",
            "checks the server's certificate chain but not its host name",
        ),
        PgSslMode::Require => (
            "require",
            "encrypts but checks no certificate (anyone on the path can pose as the server)",
        ),
        PgSslMode::Prefer | PgSslMode::Allow => ("prefer", "may send the password and the rows in cleartext"),
        PgSslMode::Disable => ("disable", "sends the password and the rows in cleartext"),
    };
    Some(format!(
        "the PostgreSQL URL's sslmode={mode} {what}; leave sslmode out (verified TLS) or set sslmode=verify-full with sslrootcert"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_server_is_verified_unless_the_url_says_otherwise_and_weaker_is_warned_about() {
        if std::env::var_os("PGSSLMODE").is_some() || std::env::var_os("PGHOST").is_some() {
            panic!("PGSSLMODE or PGHOST is set in the environment of this test: unset it");
        }
        let mode = |url: &str| {
            let o: PgConnectOptions = url.parse().unwrap();
            format!("{:?}", verified_by_default(url, o))
        };
        assert!(mode("postgres://u:p@db.example.com/d").contains("VerifyFull"));
        assert!(
            mode("postgres://u:p@localhost/d").contains("Prefer"),
            "loopback keeps sqlx's default"
        );
        assert!(mode("postgres://u:p@db.example.com/d?sslmode=require").contains("Require"));
        assert_eq!(tls_warning("postgres://u:p@db.example.com/d"), None);
        assert_eq!(tls_warning("postgres://u:p@db.example.com/d?sslmode=verify-full"), None);
        assert_eq!(tls_warning("postgres://u:p@[::1]/d?sslmode=disable"), None);
        // The host as sqlx reads it: from host= or hostaddr= too.
        assert!(mode("postgres:///orders?host=db.internal").contains("VerifyFull"));
        assert!(mode("postgres://app@localhost/orders?hostaddr=10.0.0.5").contains("VerifyFull"));
        assert!(
            mode("postgres:///orders?host=/run/postgresql").contains("Prefer"),
            "a socket"
        );
        assert!(
            mode("postgres://u@%2Frun%2Fpostgresql/d").contains("Prefer"),
            "a socket as the host"
        );
        // Keys as sqlx reads them: exact, the last one counting.
        assert!(mode("postgres://u:p@db.example.com/d?SSLMODE=disable").contains("VerifyFull"));
        assert!(tls_warning("postgres://u:p@db.example.com/d?sslmode=verify-full&sslmode=disable").is_some());
        for weak in ["disable", "allow", "prefer", "require", "verify-ca"] {
            let w = tls_warning(&format!("postgres://u:p@db.example.com/d?sslmode={weak}")).unwrap();
            assert!(
                w.contains(weak.replace("allow", "prefer").as_str()) && !w.contains(":p@"),
                "{w}"
            );
        }
    }
}
