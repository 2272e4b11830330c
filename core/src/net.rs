//! Why a list of `host:port` addresses cannot be reached, for connectors' error messages: a
//! client library's "all brokers down" or "connection refused" names no address; this says which
//! address does not resolve, which refuses, which times out. Blocking (name resolution and a
//! short TCP connect per address): call it on an error path, off the async workers.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long one TCP connect is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// One line per address of the comma-separated `list` (a scheme such as `SASL_SSL://` is
/// ignored): "does not resolve (...)", "refuses connections (...)", or "accepts connections" —
/// in which case the problem is above TCP (TLS, authentication, the protocol).
pub fn diagnose(list: &str) -> String {
    list.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|address| {
            let bare = address.split_once("://").map_or(address, |(_, rest)| rest);
            let addrs = match bare.to_socket_addrs() {
                Ok(addrs) => addrs.collect::<Vec<_>>(),
                Err(e) => return format!("{address} does not resolve ({e})"),
            };
            if addrs.is_empty() {
                return format!("{address} does not resolve (no addresses)");
            }
            let mut last = None;
            for a in &addrs {
                match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
                    Ok(_) => return format!("{address} accepts connections"),
                    Err(e) => last = Some(e),
                }
            }
            let e = last.expect("at least one address tried");
            format!("{address} refuses connections ({e})")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `Ok` when at least one address of `list` accepts a TCP connection; otherwise what
/// [`diagnose`] says about each. A quick check before a client library's own (often long)
/// connection timeouts, for a job that is starting (`SubtaskInfo::starting`): a start with a
/// wrong address fails in seconds, naming it. (A running job's restart after an outage should
/// rather wait for the service, as the client library does: failing at once would spend the
/// restart strategy's attempts within seconds.)
pub fn reachable(list: &str) -> Result<(), String> {
    let d = diagnose(list);
    if d.split("; ").any(|part| part.ends_with(" accepts connections")) {
        Ok(())
    } else {
        Err(d)
    }
}

/// The `host:port` of a database URL such as `mysql://user:secret@host:3306/db` (without the
/// credentials), for messages and [`diagnose`]; `None` when it has no host.
pub fn url_address(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next()?;
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    (!host.is_empty()).then(|| host.to_owned())
}

/// Whether `host` names this machine by its loopback address, written as such (`localhost`,
/// `127.0.0.0/8`, `::1`, brackets allowed): traffic to it never leaves the machine. A name that
/// merely resolves there counts as remote (what a name resolves to can change).
pub fn host_is_loopback(host: &str) -> bool {
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether `url`'s host (as a URL parser reads it: after any userinfo, before any port, path,
/// query or fragment) names this machine by its loopback address ([`host_is_loopback`]). A URL
/// that does not parse or has no host is not.
pub fn url_is_loopback(url: &str) -> bool {
    url::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(host_is_loopback))
        .unwrap_or(false)
}

/// Whether `address` (`host:port`, `[v6]:port`, a `SCHEME://` before it allowed) names this
/// machine by its loopback address.
pub fn address_is_loopback(address: &str) -> bool {
    let address = address.trim();
    let address = address.split_once("://").map_or(address, |(_, a)| a);
    let host = match address.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => address.rsplit_once(':').map_or(address, |(h, _)| h),
    };
    host_is_loopback(host)
}

/// The value of the last of `keys` in `url`'s query, decoded, keys compared exactly — as sqlx
/// reads a database URL's parameters (a later one overrides an earlier one; `SSLMODE` is not
/// `sslmode`). `None` when the URL does not parse or names none of them.
pub fn url_query_last(url: &str, keys: &[&str]) -> Option<String> {
    let parsed = url::Url::parse(url).ok()?;
    parsed
        .query_pairs()
        .filter(|(k, _)| keys.contains(&k.as_ref()))
        .last()
        .map(|(_, v)| v.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_named_as_such_and_query_keys_read_as_sqlx_reads_them() {
        for local in ["127.0.0.1", "localhost", "LOCALHOST", "[::1]", "::1", "127.1.2.3"] {
            assert!(host_is_loopback(local), "{local}");
        }
        for remote in [
            "db.example.com",
            "10.0.0.5",
            "[2001:db8::1]",
            "localhost.evil.example",
            "vm",
            "",
        ] {
            assert!(!host_is_loopback(remote), "{remote}");
        }
        assert!(url_is_loopback("http://127.0.0.1:8080/token"));
        assert!(url_is_loopback("http://user:p@localhost/t"));
        assert!(!url_is_loopback("http://idp.example.com#@localhost/t"));
        assert!(!url_is_loopback("http://localhost@idp.example.com/t"));
        assert!(!url_is_loopback("not a url"));
        for local in [
            "127.0.0.1:9092",
            "SASL_SSL://localhost:9093",
            "[::1]:9092",
            " 127.0.0.1:19092",
        ] {
            assert!(address_is_loopback(local), "{local}");
        }
        for remote in ["kafka-0.kafka:9092", "SSL://10.0.0.1:9093", "[2001:db8::1]:9092"] {
            assert!(!address_is_loopback(remote), "{remote}");
        }
        let keys = &["ssl-mode", "sslmode"];
        assert_eq!(
            url_query_last("mysql://h/db?x=1&ssl-mode=required", keys).as_deref(),
            Some("required")
        );
        assert_eq!(
            url_query_last("mysql://h/db?SSL-MODE=required", keys),
            None,
            "keys are exact"
        );
        assert_eq!(
            url_query_last("postgres://h/db?sslmode=verify-full&sslmode=disable", keys).as_deref(),
            Some("disable"),
            "the last one counts"
        );
        assert_eq!(
            url_query_last("postgres://h/db#?sslmode=verify-full", keys),
            None,
            "a fragment is no query"
        );
        assert_eq!(
            url_query_last("mysql://h/db?ssl%2Dmode=disabled", keys).as_deref(),
            Some("disabled")
        );
        assert_eq!(url_query_last("mysql://h/db", keys), None);
    }

    #[test]
    fn names_each_address_and_what_is_wrong_with_it() {
        let open = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let open_port = open.local_addr().unwrap().port();
        let closed_port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let d = diagnose(&format!(
            "nosuchhost.invalid:9092, SASL_SSL://127.0.0.1:{closed_port},127.0.0.1:{open_port}"
        ));
        let parts: Vec<&str> = d.split("; ").collect();
        assert_eq!(parts.len(), 3, "{d}");
        assert!(parts[0].starts_with("nosuchhost.invalid:9092 does not resolve"), "{d}");
        assert!(
            parts[1].starts_with(&format!("SASL_SSL://127.0.0.1:{closed_port} refuses connections")),
            "{d}"
        );
        assert_eq!(parts[2], format!("127.0.0.1:{open_port} accepts connections"));
        assert!(reachable(&format!("nosuchhost.invalid:1,127.0.0.1:{open_port}")).is_ok());
        let e = reachable(&format!("127.0.0.1:{closed_port}")).unwrap_err();
        assert!(e.contains("refuses connections"), "{e}");
    }

    #[test]
    fn url_address_drops_credentials_and_database() {
        assert_eq!(
            url_address("mysql://u:p@ss@db.example:3306/x?ssl-mode=required").as_deref(),
            Some("db.example:3306")
        );
        assert_eq!(url_address("mysql://localhost/x").as_deref(), Some("localhost"));
        assert_eq!(url_address("mysql:///x"), None);
    }
}
