//! TLS to the server, verified by default: a URL without `ssl-mode` to a server that is not this
//! machine's loopback address gets `VERIFY_IDENTITY` (the certificate chain, against the URL's
//! `ssl-ca` or the bundled web roots, and the host name), not sqlx's `PREFERRED` (TLS when the
//! server offers it, no certificate check, plaintext when it does not). A weaker `ssl-mode` to
//! such a server is the operator's explicit choice, said at start ([`tls_warning`]).

use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};

const KEYS: &[&str] = &["ssl-mode", "sslmode"];

/// The server is reached through a socket file or at a loopback address (as sqlx parsed the URL).
fn local(options: &MySqlConnectOptions) -> bool {
    options.get_socket().is_some() || exactly_core::net::host_is_loopback(options.get_host())
}

/// `options` (parsed from `url`) with the default above applied.
pub(crate) fn verified_by_default(url: &str, options: MySqlConnectOptions) -> MySqlConnectOptions {
    if exactly_core::net::url_query_last(url, KEYS).is_none() && !local(&options) {
        options.ssl_mode(MySqlSslMode::VerifyIdentity)
    } else {
        options
    }
}

/// The warning for a URL that asks for less than a verified connection to a server beyond this
/// machine, `None` otherwise (and for a URL that does not parse: that is an error elsewhere).
pub fn tls_warning(url: &str) -> Option<String> {
    let options: MySqlConnectOptions = url.parse().ok()?;
    let options = verified_by_default(url, options);
    if local(&options) {
        return None;
    }
    let (mode, what) = match options.get_ssl_mode() {
        MySqlSslMode::VerifyIdentity => return None,
        MySqlSslMode::VerifyCa => (
            "verify_ca",
            "checks the server's certificate chain but not its host name",
        ),
        MySqlSslMode::Required => (
            "required",
            "encrypts but checks no certificate (anyone on the path can pose as the server)",
        ),
        MySqlSslMode::Preferred => ("preferred", "may send the password and the rows in cleartext"),
        MySqlSslMode::Disabled => ("disabled", "sends the password and the rows in cleartext"),
    };
    Some(format!(
        "the MySQL URL's ssl-mode={mode} {what}; leave ssl-mode out (verified TLS) or set ssl-mode=verify_identity with ssl-ca"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_server_is_verified_unless_the_url_says_otherwise_and_weaker_is_warned_about() {
        let mode = |url: &str| {
            let o: MySqlConnectOptions = url.parse().unwrap();
            format!("{:?}", verified_by_default(url, o))
        };
        assert!(mode("mysql://u:p@db.example.com/d").contains("VerifyIdentity"));
        assert!(
            mode("mysql://u:p@127.0.0.1/d").contains("Preferred"),
            "loopback keeps sqlx's default"
        );
        assert!(mode("mysql://u:p@db.example.com/d?ssl-mode=required").contains("Required"));
        assert_eq!(tls_warning("mysql://u:p@db.example.com/d"), None);
        assert_eq!(
            tls_warning("mysql://u:p@db.example.com/d?ssl-mode=VERIFY_IDENTITY"),
            None
        );
        assert_eq!(tls_warning("mysql://u:p@127.0.0.1/d?ssl-mode=disabled"), None);
        assert_eq!(
            tls_warning("mysql://u:p@localhost/d?socket=/run/mysqld.sock&ssl-mode=disabled"),
            None
        );
        // Keys as sqlx reads them: exact, the last one counting.
        assert!(mode("mysql://u:p@db.example.com/d?SSL-MODE=disabled").contains("VerifyIdentity"));
        assert!(tls_warning("mysql://u:p@db.example.com/d?ssl-mode=verify_identity&ssl-mode=disabled").is_some());
        for weak in ["disabled", "preferred", "required", "verify_ca"] {
            let w = tls_warning(&format!("mysql://u:p@db.example.com/d?ssl-mode={weak}")).unwrap();
            assert!(w.contains(weak) && !w.contains(":p@"), "{w}");
        }
    }
}
