//! What the log says while a Kafka broker cannot be reached. librdkafka reports every failed
//! connection attempt of every client, on every retry, through its log and error callbacks — a
//! broker gone for 20 s wrote hundreds of ERROR lines ("Connect to ipv4#… failed: Connection
//! refused", "AllBrokersDown") from a job of a few clients. Here an outage is said once per kind
//! of client (the source's, the sink's, …) and broker, at WARN with the broker's address, and its
//! end once, at INFO, with how long it lasted; the full stream stays at debug (target
//! `librdkafka`: `RUST_LOG=librdkafka=debug` shows it).
//!
//! An outage starts with the first failed connection to a broker seen by a client of that kind
//! (in this process), and ends when a client of that kind reports a connection to it that came
//! up after the outage began — from librdkafka's statistics (`statistics.interval.ms`; a client
//! without statistics never reports one) or, for the wire-protocol client, an answer. An outage
//! whose end nobody reported is forgotten after [`FORGOTTEN`] without a failure, so the next
//! failure is said again.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use tracing::{debug, error, info, warn};

/// An outage nobody reported the end of is forgotten once no failure came for this long
/// (librdkafka retries a connection at least every `reconnect.backoff.max.ms`, 10 s here).
pub const FORGOTTEN: Duration = Duration::from_secs(60);

/// The statistics interval the clients that report outages set unless the job sets its own:
/// how soon after a broker is back the log says so.
pub const STATISTICS_INTERVAL_MS: &str = "5000";

/// Which part of the product a client belongs to: an outage is said once per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientKind {
    /// The Kafka source's consumers and its wire-protocol client.
    Source,
    /// The Kafka sink's transactional producers.
    Sink,
    /// The source's dead-letter producer.
    DeadLetters,
    /// `exactly verify`'s readers.
    Verify,
}

impl ClientKind {
    /// The name in the log's `client` field.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientKind::Source => "source",
            ClientKind::Sink => "sink",
            ClientKind::DeadLetters => "dead-letters",
            ClientKind::Verify => "verify",
        }
    }
}

impl fmt::Display for ClientKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClientKind::Source => "The Kafka source",
            ClientKind::Sink => "The Kafka sink",
            ClientKind::DeadLetters => "The dead-letter producer",
            ClientKind::Verify => "exactly verify",
        })
    }
}

struct Outage {
    since: Instant,
    last_failure: Instant,
}

/// The outages open in this process, by client kind and broker (`host:port`).
static OUTAGES: Mutex<Option<HashMap<(ClientKind, String), Outage>>> = Mutex::new(None);
/// How many outages are open: statistics are parsed only while one is.
static OPEN: AtomicUsize = AtomicUsize::new(0);

fn with_outages<R>(f: impl FnOnce(&mut HashMap<(ClientKind, String), Outage>) -> R) -> R {
    let mut guard = OUTAGES.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    let r = f(map);
    OPEN.store(map.len(), Ordering::Relaxed);
    r
}

/// A failed connection to `broker` seen by a client of `kind`: said at WARN if it starts an
/// outage, at debug otherwise. Returns whether it started one.
pub fn unreachable(kind: ClientKind, broker: &str, cause: &str) -> bool {
    let now = Instant::now();
    let started = with_outages(|outages| match outages.get_mut(&(kind, broker.to_owned())) {
        Some(o) if now.duration_since(o.last_failure) < FORGOTTEN => {
            o.last_failure = now;
            false
        }
        _ => {
            outages.insert(
                (kind, broker.to_owned()),
                Outage {
                    since: now,
                    last_failure: now,
                },
            );
            true
        }
    });
    if started {
        warn!(
            client = %kind.as_str(),
            %broker,
            "{kind} cannot reach the Kafka broker {broker}: {cause}. Its clients keep trying; \
             further connection errors are logged at debug until the broker is back."
        );
    } else {
        debug!(client = %kind.as_str(), %broker, "{kind} still cannot reach {broker}: {cause}");
    }
    started
}

/// A client of `kind` reached `broker` on a connection that came up `age` ago: ends an outage
/// that began before it. Returns whether it ended one.
pub fn reached(kind: ClientKind, broker: &str, age: Duration) -> bool {
    if OPEN.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let now = Instant::now();
    let ended = with_outages(|outages| {
        let key = (kind, broker.to_owned());
        let since = outages.get(&key)?.since;
        // A connection older than the outage is a report from before it (statistics emitted
        // before the failure and served after it).
        if now.duration_since(since) < age {
            return None;
        }
        outages.remove(&key);
        Some(now.duration_since(since))
    });
    match ended {
        Some(gone) => {
            info!(
                client = %kind.as_str(),
                %broker,
                gone_s = gone.as_secs(),
                "{kind} reaches the Kafka broker {broker} again after {} s.",
                gone.as_secs()
            );
            true
        }
        None => false,
    }
}

/// Whether any outage is open (a cheap check before parsing statistics).
pub fn any_open() -> bool {
    OPEN.load(Ordering::Relaxed) > 0
}

/// A failed connection in librdkafka's words: the broker (`host:port`) and the cause, or `None`
/// when `message` says something else. librdkafka names the broker before the event
/// (`127.0.0.1:9092/1: Connect to …`, `TxnCoordinator: 127.0.0.1:9092: Connect to …`, behind
/// `[thrd:…]: ` in its log lines).
pub fn connection_failure(message: &str) -> Option<(String, String)> {
    const EVENTS: [&str; 3] = ["Connect to ", "Failed to resolve ", "Connection setup timed out"];
    let at = EVENTS.iter().filter_map(|e| message.find(e)).min()?;
    let before = message[..at].trim_end().strip_suffix(':')?;
    let name = before.rsplit(": ").next()?.trim();
    let broker = match name.rsplit_once('/') {
        Some((host_port, _)) => host_port,
        None => name,
    };
    if broker.is_empty() || !broker.contains(':') {
        return None;
    }
    let event = &message[at..];
    let cause = match event.split_once("failed: ") {
        Some((_, rest)) => rest,
        None => event,
    };
    let cause = cause.split(" (after ").next().unwrap_or(cause).trim();
    Some((broker.to_owned(), cause.to_owned()))
}

/// Reports librdkafka's log lines and errors for the clients of one kind: failed connections
/// through the outage log, the rest at the level librdkafka gave it.
#[derive(Debug, Clone, Copy)]
pub struct BrokerLog {
    kind: ClientKind,
}

impl BrokerLog {
    /// For the clients of `kind`.
    pub const fn new(kind: ClientKind) -> Self {
        BrokerLog { kind }
    }

    /// For a context's `ClientContext::log`.
    pub fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        if let Some((broker, cause)) = connection_failure(message) {
            unreachable(self.kind, &broker, &cause);
            debug!(target: "librdkafka", client = %self.kind.as_str(), "{fac} {message}");
            return;
        }
        match level {
            RDKafkaLogLevel::Emerg | RDKafkaLogLevel::Alert | RDKafkaLogLevel::Critical | RDKafkaLogLevel::Error => {
                error!(target: "librdkafka", client = %self.kind.as_str(), "librdkafka: {fac} {message}")
            }
            RDKafkaLogLevel::Warning => warn!(target: "librdkafka", client = %self.kind.as_str(), "librdkafka: {fac} {message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                info!(target: "librdkafka", client = %self.kind.as_str(), "librdkafka: {fac} {message}")
            }
            RDKafkaLogLevel::Debug => debug!(target: "librdkafka", client = %self.kind.as_str(), "librdkafka: {fac} {message}"),
        }
    }

    /// For a context's `ClientContext::error`: a failed connection through the outage log, "all
    /// brokers down" (which names none; the failed connections before it did) at debug, the
    /// rest at ERROR.
    pub fn error(&self, error: &KafkaError, reason: &str) {
        if let Some((broker, cause)) = connection_failure(reason) {
            unreachable(self.kind, &broker, &cause);
        } else if error.rdkafka_error_code() != Some(RDKafkaErrorCode::AllBrokersDown) {
            error!(target: "librdkafka", client = %self.kind.as_str(), "librdkafka: {error}: {reason}");
            return;
        }
        debug!(target: "librdkafka", client = %self.kind.as_str(), "librdkafka: {error}: {reason}");
    }

    /// For a context's `ClientContext::stats_raw`: ends the outages of brokers the statistics
    /// show connected. Parses nothing while no outage is open.
    pub fn statistics(&self, json: &[u8]) {
        if !any_open() {
            return;
        }
        #[derive(serde::Deserialize)]
        struct Stats {
            #[serde(default)]
            brokers: HashMap<String, Broker>,
        }
        #[derive(serde::Deserialize)]
        struct Broker {
            nodename: String,
            state: String,
            stateage: i64,
        }
        match serde_json::from_slice::<Stats>(json) {
            Ok(stats) => self.brokers(
                stats
                    .brokers
                    .values()
                    .map(|b| (b.nodename.as_str(), b.state.as_str(), b.stateage)),
            ),
            Err(e) => debug!(error = %e, "librdkafka's statistics do not parse."),
        }
    }

    /// Brokers from parsed statistics: (`nodename`, `state`, `stateage` in µs).
    pub fn brokers<'a>(&self, brokers: impl IntoIterator<Item = (&'a str, &'a str, i64)>) {
        if !any_open() {
            return;
        }
        for (node, state, age_us) in brokers {
            if state == "UP" {
                reached(self.kind, node, Duration::from_micros(age_us.max(0) as u64));
            }
        }
    }
}

#[cfg(test)]
mod tests {
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
        // (names none), a refused login (must stay loud).
        for message in [
            "127.0.0.1:19092/1: Disconnected: connection reset by peer (after 5001ms in state UP)",
            "2/2 brokers are down",
            "127.0.0.1:19092/1: SASL authentication error: Authentication failed (after 3ms in state AUTH_REQ)",
        ] {
            assert_eq!(connection_failure(message), None, "{message}");
        }
    }

    #[test]
    fn an_outage_is_said_once_per_kind_and_ends_once() {
        let broker = "outage-test:1";
        assert!(unreachable(ClientKind::Verify, broker, "Connection refused"));
        assert!(!unreachable(ClientKind::Verify, broker, "Connection refused"));
        // Another kind says it too, once.
        assert!(unreachable(ClientKind::DeadLetters, broker, "Connection refused"));
        assert!(!unreachable(ClientKind::DeadLetters, broker, "Connection refused"));
        // A connection older than the outage does not end it (statistics from before it).
        std::thread::sleep(Duration::from_millis(20));
        assert!(!reached(ClientKind::Verify, broker, Duration::from_secs(3600)));
        assert!(reached(ClientKind::Verify, broker, Duration::ZERO));
        assert!(!reached(ClientKind::Verify, broker, Duration::ZERO), "ended once");
        // The other kind's outage goes on until one of its clients reaches the broker.
        assert!(!unreachable(ClientKind::DeadLetters, broker, "Connection refused"));
        assert!(reached(ClientKind::DeadLetters, broker, Duration::ZERO));
        // A new failure after the end is a new outage.
        assert!(unreachable(ClientKind::Verify, broker, "Connection refused"));
        assert!(reached(ClientKind::Verify, broker, Duration::ZERO));
    }
}
