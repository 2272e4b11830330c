use super::*;

#[test]
fn librdkafkas_failed_connections_name_the_broker_and_the_cause() {
    // As librdkafka wrote them while the broker was down.
    for (message, broker, cause) in [
        (
            "[thrd:127.0.0.1:19092/bootstrap]: 127.0.0.1:19092/bootstrap: Connect to ipv4#127.0.0.1:19092 failed: Connection refused (after 0ms in state CONNECT)",
            "127.0.0.1:19092",
            "Connection refused",
        ),
        (
            "127.0.0.1:19092/1: Connect to ipv4#127.0.0.1:19092 failed: Connection refused (after 0ms in state CONNECT, 2 identical error(s) suppressed)",
            "127.0.0.1:19092",
            "Connection refused",
        ),
        (
            "TxnCoordinator: 127.0.0.1:19092: Connect to ipv4#127.0.0.1:19092 failed: Connection refused (after 1ms in state CONNECT)",
            "127.0.0.1:19092",
            "Connection refused",
        ),
        (
            "[thrd:GroupCoordinator]: GroupCoordinator: kafka-1.example:9092: Connect to ipv4#10.0.0.5:9092 failed: Connection refused (after 0ms in state CONNECT)",
            "kafka-1.example:9092",
            "Connection refused",
        ),
        (
            "[::1]:9092/bootstrap: Connect to ipv6#[::1]:9092 failed: Connection refused (after 0ms in state CONNECT)",
            "[::1]:9092",
            "Connection refused",
        ),
        // Other protocols than plaintext prefix the name with theirs.
        (
            "[thrd:sasl_ssl://b-1.example:9093/1]: sasl_ssl://b-1.example:9093/1: Connect to ipv4#10.0.0.7:9093 failed: Connection refused (after 0ms in state CONNECT)",
            "b-1.example:9093",
            "Connection refused",
        ),
        (
            "TxnCoordinator: ssl://b-1.example:9093: Connect to ipv4#10.0.0.7:9093 failed: Connection refused (after 0ms in state CONNECT)",
            "b-1.example:9093",
            "Connection refused",
        ),
        (
            "sasl_plaintext://b-2:9094/2: Connection setup timed out in state CONNECT (after 30030ms in state CONNECT)",
            "b-2:9094",
            "Connection setup timed out in state CONNECT",
        ),
        // The canonical bootstrap lookup, named by its thread only: the address is quoted.
        (
            "[thrd:app]: Failed to resolve 'kafka.example:9092': Name or service not known",
            "kafka.example:9092",
            "Failed to resolve 'kafka.example:9092': Name or service not known",
        ),
        (
            "kafka.example:9092/bootstrap: Failed to resolve 'kafka.example:9092': Name or service not known (after 5ms in state CONNECT)",
            "kafka.example:9092",
            "Failed to resolve 'kafka.example:9092': Name or service not known",
        ),
    ] {
        assert_eq!(
            connection_failure(message),
            Some((broker.to_owned(), cause.to_owned())),
            "{message}"
        );
    }
    // Not a failed connection: an idle connection the broker closed, all brokers down
    // (names none), a refused login, a set-up that hangs after the TCP connection (all left
    // loud).
    for message in [
        "127.0.0.1:19092/1: Disconnected: connection reset by peer (after 5001ms in state UP)",
        "2/2 brokers are down",
        "127.0.0.1:19092/1: SASL authentication error: Authentication failed (after 3ms in state AUTH_REQ)",
        "sasl_ssl://b:9093/bootstrap: Connection setup timed out in state SSL_HANDSHAKE (after 30029ms in state SSL_HANDSHAKE)",
        "ssl://b:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed (after 5ms in state SSL_HANDSHAKE)",
    ] {
        assert_eq!(connection_failure(message), None, "{message}");
    }
}

#[test]
fn an_outage_is_said_once_per_kind_and_ends_once() {
    let broker = "outage-test:1";
    let before = wall_us() - 1_000_000;
    assert!(unreachable(ClientKind::Verify, broker, "Connection refused"));
    assert!(!unreachable(ClientKind::Verify, broker, "Connection refused"));
    // Another kind says it too, once.
    assert!(unreachable(ClientKind::DeadLetters, broker, "Connection refused"));
    assert!(!unreachable(ClientKind::DeadLetters, broker, "Connection refused"));
    // A connection that came up before the outage does not end it (statistics from before).
    assert!(!reached(ClientKind::Verify, broker, before));
    std::thread::sleep(Duration::from_millis(5));
    assert!(reached(ClientKind::Verify, broker, wall_us()));
    assert!(!reached(ClientKind::Verify, broker, wall_us()), "ended once");
    // Failures served late, right after the end, are the outage's own.
    assert!(!unreachable(ClientKind::Verify, broker, "Connection refused"));
    // The other kind's outage goes on until one of its clients reaches the broker.
    assert!(!unreachable(ClientKind::DeadLetters, broker, "Connection refused"));
    assert!(reached(ClientKind::DeadLetters, broker, wall_us() + 1));
    // A failure once the grace has passed is a new outage.
    with_outages(|m| {
        let o = m.get_mut(&(ClientKind::Verify, broker.into())).unwrap();
        o.ended = Some(Instant::now().checked_sub(GRACE).unwrap());
    });
    assert!(unreachable(ClientKind::Verify, broker, "Connection refused"));
    assert!(reached(ClientKind::Verify, broker, wall_us() + 1));
}

#[test]
fn an_outage_nobody_fails_in_any_more_ends_and_a_long_one_is_said_again() {
    let broker = "outage-test:2";
    assert!(unreachable(ClientKind::Source, broker, "Connection refused"));
    // Made old by hand: the last failure QUIET ago ends it; a reminder is due after REMIND.
    let age = |o: &mut Outage, last_failure: Duration, last_said: Duration| {
        let now = Instant::now();
        o.last_failure = now.checked_sub(last_failure).unwrap();
        o.last_said = now.checked_sub(last_said).unwrap();
    };
    with_outages(|m| {
        age(
            m.get_mut(&(ClientKind::Source, broker.into())).unwrap(),
            Duration::ZERO,
            REMIND,
        )
    });
    assert!(
        !unreachable(ClientKind::Source, broker, "Connection refused"),
        "a reminder, not a new outage"
    );
    let reminded = with_outages(|m| m[&(ClientKind::Source, broker.into())].last_said.elapsed());
    assert!(reminded < REMIND, "the reminder was said");
    // librdkafka's 30 s between identical reports is no end.
    with_outages(|m| {
        age(
            m.get_mut(&(ClientKind::Source, broker.into())).unwrap(),
            Duration::from_secs(31),
            Duration::ZERO,
        )
    });
    end_quiet_outages();
    assert!(
        !unreachable(ClientKind::Source, broker, "Connection refused"),
        "31 s apart: the same outage"
    );
    // Statistics showing a connection being tried keep it going.
    with_outages(|m| {
        age(
            m.get_mut(&(ClientKind::Source, broker.into())).unwrap(),
            QUIET - Duration::from_secs(1),
            Duration::ZERO,
        )
    });
    still_failing(ClientKind::Source, broker);
    end_quiet_outages();
    assert!(with_outages(|m| m[&(ClientKind::Source, broker.into())]
        .ended
        .is_none()));
    with_outages(|m| {
        age(
            m.get_mut(&(ClientKind::Source, broker.into())).unwrap(),
            QUIET,
            Duration::ZERO,
        )
    });
    end_quiet_outages();
    assert!(
        with_outages(|m| m[&(ClientKind::Source, broker.into())].ended.is_some()),
        "quiet: over"
    );
    with_outages(|m| {
        let o = m.get_mut(&(ClientKind::Source, broker.into())).unwrap();
        o.ended = Some(Instant::now().checked_sub(GRACE).unwrap());
    });
    assert!(
        unreachable(ClientKind::Source, broker, "Connection refused"),
        "a new outage"
    );
    assert!(reached(ClientKind::Source, broker, wall_us() + 1));
}
