use super::*;

#[test]
fn a_non_loopback_address_needs_a_token_or_client_certificates() {
    let open = AdminAccess::default();
    let err = check_access("0.0.0.0:9249", &open).unwrap_err().to_string();
    assert!(
        err.contains("without a token") && err.contains("admin_tls_client_ca"),
        "{err}"
    );
    assert!(check_access("127.0.0.1:9249", &open).unwrap());
    let token = AdminAccess {
        token: Some(Secret::new("a-token-of-16-bytes-or-more")),
        ..AdminAccess::default()
    };
    assert!(!check_access("0.0.0.0:9249", &token).unwrap());
    // An empty or short token protects nothing: refused, on any address.
    for short in ["", "   ", "short"] {
        let weak = AdminAccess {
            token: Some(Secret::new(short)),
            ..AdminAccess::default()
        };
        for addr in ["0.0.0.0:9249", "127.0.0.1:9249"] {
            let err = check_access(addr, &weak).unwrap_err().to_string();
            assert!(err.contains("at least 16 bytes"), "{short:?} on {addr}: {err}");
        }
    }
    let certs = AdminAccess {
        client_certs: true,
        ..AdminAccess::default()
    };
    assert!(!check_access("0.0.0.0:9249", &certs).unwrap());
    assert!(check_access("localhost:9249", &open).is_err(), "an address is ip:port");
}

#[test]
fn a_token_sent_in_cleartext_beyond_this_machine_is_warned_about() {
    let token = AdminAccess {
        token: Some(Secret::new("a-token-of-16-bytes-or-more")),
        ..AdminAccess::default()
    };
    assert!(cleartext_token(false, &token).is_some_and(|w| w.contains("cleartext")));
    assert_eq!(cleartext_token(true, &token), None, "loopback");
    assert_eq!(
        cleartext_token(false, &AdminAccess::default()),
        None,
        "no token to leak"
    );
}

#[test]
fn only_addresses_localhost_and_allowed_names_may_be_named_in_host() {
    let allowed = vec!["orders-job-admin".to_owned()];
    for ok in [
        "127.0.0.1:9249",
        "127.0.0.1",
        "10.1.2.3:9249",
        "[::1]:9249",
        "[::1]",
        "localhost:9249",
        "LOCALHOST",
        "orders-job-admin:9249",
        "orders-job-admin.",
    ] {
        assert!(allowed_host(ok, &allowed), "{ok}");
    }
    for refused in [
        "",
        ":9249",
        "evil.example:9249",
        "127.0.0.1.evil.example",
        "localhost.evil.example",
        "orders-job-admin.evil.example:9249",
        "[not-an-address]:9249",
        "attacker-rebound:9249",
    ] {
        assert!(!allowed_host(refused, &allowed), "{refused}");
    }
}
