//! What the log says while a Kafka broker cannot be reached. librdkafka reports every failed
//! connection attempt of every client, on every retry, through its log and error callbacks — a
//! broker gone for 20 s wrote hundreds of ERROR lines ("Connect to ipv4#… failed: Connection
//! refused", "AllBrokersDown") from a job of a few clients. Here an outage is said once per kind
//! of client (the source's, the sink's, …) and broker, at WARN with the broker's address, again
//! every [`REMIND`] while it lasts, and its end once, at INFO, with how long it lasted; the full
//! stream stays at debug (target `librdkafka`: `RUST_LOG=librdkafka=debug` shows it).
//!
//! An outage starts with the first failed connection to a broker seen by a client of that kind
//! (in this process). It ends when a client of that kind reports a connection to it that came up
//! after the outage began (librdkafka's statistics, `statistics.interval.ms`: the broker's state
//! `UP`, emitted at `time` and up for `stateage`), or once no client of that kind has failed to
//! connect to it for [`QUIET`] (seen at the next statistics or failure; librdkafka repeats an
//! identical connection error at most every 30 s, and statistics showing the broker still being
//! connected to keep the outage going: a client that stopped failing has its connection, or no
//! longer needs one — a bootstrap address, an idle producer).
//!
//! # Design notes
//!
//! Why this part is built as it is, with the measurements and failures that shaped it.
//!
//! `outage` is what the log says while a broker cannot be reached: the source's, the sink's, the
//! dead-letter producer's and `exactly verify`'s contexts hand librdkafka's log and error callbacks
//! to a `BrokerLog` of their kind; a failed connection (parsed from librdkafka's text: the broker
//! named before "Connect to", "Failed to resolve", "Connection setup timed out") opens an outage
//! for that kind and broker in a process-wide table — WARN once, debug after, WARN again every 5
//! minutes — and a connection that came up after it began ends it (the statistics' broker `state`,
//! emission `time` and `stateage` against the outage's start on the wall clock, parsed only while
//! an outage is open; the clients set `statistics.interval.ms` to 5 s unless the job does), at INFO
//! with how long it lasted; [`QUIET`] without a failure ends it too (a bootstrap address nobody
//! reconnects to). Only the TCP connection counts (a set-up timeout in a later state, TLS and login
//! failures keep librdkafka's level); "all brokers down" names none and stays at debug. The
//! source's wire client (the topic-ID check) reports its TCP failures to the same table; the
//! source's consumer errors of transport kinds (BrokerTransportFailure, AllBrokersDown) go to
//! debug: librdkafka hands each to the error callback, which reported it, before the consumer sees
//! it. QUIET is 90 s: librdkafka reports an identical connection error at most every 30 s, and
//! statistics showing a connection still being tried keep an outage going. A broker that accepts
//! the TCP connection and then hangs (TLS handshake, ApiVersion) is not an outage here:
//! librdkafka's "Connection setup timed out in state …" stays at WARN on every retry.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use tracing::{debug, error, info, warn};

/// An outage with no failed connection for this long is over. librdkafka retries a connection at
/// least every `reconnect.backoff.max.ms` (1 s unless the job sets it) but reports an error
/// identical to the last one at most every 30 s: three of its windows.
pub const QUIET: Duration = Duration::from_secs(90);

/// While an outage lasts, it is said again this often.
pub const REMIND: Duration = Duration::from_secs(300);

/// After an outage ended, failures reported for a while are its own, served late (a consumer's
/// errors wait in its queue until it polls): at debug. One that goes on past this starts a new
/// outage.
pub const GRACE: Duration = Duration::from_secs(10);

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
    /// `since` on the wall clock (µs since the epoch), to compare with librdkafka's statistics.
    since_wall_us: i64,
    last_failure: Instant,
    last_said: Instant,
    failures: u64,
    cause: String,
    /// When it ended (kept for [`GRACE`] after).
    ended: Option<Instant>,
}

/// The outages open in this process, by client kind and broker (`host:port`); an outage that
/// ended is kept for [`GRACE`] with `ended` set.
static OUTAGES: Mutex<Option<HashMap<(ClientKind, String), Outage>>> = Mutex::new(None);
/// How many outages are open: statistics are parsed only while one is.
static OPEN: AtomicUsize = AtomicUsize::new(0);

fn with_outages<R>(f: impl FnOnce(&mut HashMap<(ClientKind, String), Outage>) -> R) -> R {
    let mut guard = OUTAGES.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    let r = f(map);
    let now = Instant::now();
    map.retain(|_, o| o.ended.is_none_or(|e| now.duration_since(e) < GRACE));
    OPEN.store(map.values().filter(|o| o.ended.is_none()).count(), Ordering::Relaxed);
    r
}

fn wall_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// What a failed connection says (decided under the lock, logged after it).
enum Said {
    Started,
    Reminded { gone: Duration, failures: u64 },
    Again,
}

/// A failed connection to `broker` seen by a client of `kind`: said at WARN if it starts an
/// outage or the last WARN about it is [`REMIND`] old, at debug otherwise. Returns whether it
/// started one.
pub fn unreachable(kind: ClientKind, broker: &str, cause: &str) -> bool {
    let now = Instant::now();
    let mut quiet = Vec::new();
    let said = with_outages(|outages| {
        // An outage quiet for long enough ended before this failure: said so, never replaced.
        quiet = end_quiet(outages, now);
        failed(outages, kind, broker, cause, now)
    });
    say_quiet(quiet);
    say(kind, broker, cause, &said);
    matches!(said, Said::Started)
}

/// The table's side of [`unreachable`].
fn failed(
    outages: &mut HashMap<(ClientKind, String), Outage>,
    kind: ClientKind,
    broker: &str,
    cause: &str,
    now: Instant,
) -> Said {
    match outages.get_mut(&(kind, broker.to_owned())) {
        Some(o) if o.ended.is_some_and(|e| now.duration_since(e) < GRACE) => Said::Again,
        Some(o) if o.ended.is_none() && now.duration_since(o.last_failure) < QUIET => {
            o.last_failure = now;
            o.failures += 1;
            if cause != o.cause {
                o.cause = cause.to_owned();
            }
            if now.duration_since(o.last_said) >= REMIND {
                o.last_said = now;
                Said::Reminded {
                    gone: now.duration_since(o.since),
                    failures: o.failures,
                }
            } else {
                Said::Again
            }
        }
        _ => {
            outages.insert(
                (kind, broker.to_owned()),
                Outage {
                    since: now,
                    since_wall_us: wall_us(),
                    last_failure: now,
                    last_said: now,
                    failures: 1,
                    cause: cause.to_owned(),
                    ended: None,
                },
            );
            Said::Started
        }
    }
}

fn say(kind: ClientKind, broker: &str, cause: &str, said: &Said) {
    let then = match kind {
        // Its readers do not wait for a broker: the audit fails and says why.
        ClientKind::Verify => "",
        _ => " Its clients keep trying;",
    };
    match *said {
        Said::Started => warn!(
            client = %kind.as_str(),
            %broker,
            "{kind} cannot reach the Kafka broker {broker}: {cause}.{then} further connection errors \
             are logged at debug until the broker is back."
        ),
        Said::Reminded { gone, failures } => warn!(
            client = %kind.as_str(),
            %broker,
            gone_s = gone.as_secs(),
            failures,
            "{kind} still cannot reach the Kafka broker {broker}, for {} s now: {cause}.",
            gone.as_secs()
        ),
        Said::Again => debug!(client = %kind.as_str(), %broker, "{kind} still cannot reach {broker}: {cause}"),
    }
}

/// A client of `kind` reports `broker` connected since `up_since_us` (wall clock, µs since the
/// epoch): ends an outage that began before that. Also ends every outage [`QUIET`] for long
/// enough. Returns whether it ended the one of `broker`.
pub fn reached(kind: ClientKind, broker: &str, up_since_us: i64) -> bool {
    if OPEN.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let now = Instant::now();
    let (ended, quiet) = with_outages(|outages| {
        let key = (kind, broker.to_owned());
        // A connection that came up before the outage began is a report from before it
        // (statistics emitted before the failure, served after it).
        let ended = match outages.get_mut(&key) {
            // `time` is whole seconds: a second's margin.
            Some(o) if o.ended.is_none() && up_since_us > o.since_wall_us - 1_000_000 => {
                o.ended = Some(now);
                Some(now.duration_since(o.since))
            }
            _ => None,
        };
        (ended, end_quiet(outages, now))
    });
    if let Some(gone) = ended {
        info!(
            client = %kind.as_str(),
            %broker,
            gone_s = gone.as_secs(),
            "{kind} reaches the Kafka broker {broker} again after {} s.",
            gone.as_secs()
        );
    }
    say_quiet(quiet);
    ended.is_some()
}

/// Removes the outages no failure came for in [`QUIET`]: (kind, broker, how long since it began).
fn end_quiet(outages: &mut HashMap<(ClientKind, String), Outage>, now: Instant) -> Vec<(ClientKind, String, Duration)> {
    outages
        .iter_mut()
        .filter(|(_, o)| o.ended.is_none() && now.duration_since(o.last_failure) >= QUIET)
        .map(|(k, o)| {
            o.ended = Some(now);
            (k.0, k.1.clone(), o.last_failure.duration_since(o.since))
        })
        .collect()
}

fn say_quiet(quiet: Vec<(ClientKind, String, Duration)>) {
    for (kind, broker, failing) in quiet {
        info!(
            client = %kind.as_str(),
            %broker,
            failing_s = failing.as_secs(),
            "{kind} has had no failed connection to the Kafka broker {broker} for {} s (it failed for {} s before).",
            QUIET.as_secs(),
            failing.as_secs()
        );
    }
}

/// A client of `kind` is still trying to connect to `broker`: an open outage of it goes on.
fn still_failing(kind: ClientKind, broker: &str) {
    if OPEN.load(Ordering::Relaxed) == 0 {
        return;
    }
    let now = Instant::now();
    with_outages(|outages| {
        if let Some(o) = outages.get_mut(&(kind, broker.to_owned())) {
            if o.ended.is_none() {
                o.last_failure = now;
            }
        }
    });
}

/// Ends the outages no failure came for in [`QUIET`] (called with each client's statistics).
pub fn end_quiet_outages() {
    if OPEN.load(Ordering::Relaxed) == 0 {
        return;
    }
    let now = Instant::now();
    say_quiet(with_outages(|outages| end_quiet(outages, now)));
}

/// Whether any outage is open (a cheap check before parsing statistics).
pub fn any_open() -> bool {
    OPEN.load(Ordering::Relaxed) > 0
}

/// A failed connection in librdkafka's words: the broker (`host:port`) and the cause, or `None`
/// when `message` says something else. librdkafka names the broker before the event
/// (`127.0.0.1:9092/1: Connect to …`, `TxnCoordinator: 127.0.0.1:9092: Connect to …`,
/// `sasl_ssl://host:9093/1: …` on other protocols than plaintext, behind `[thrd:…]: ` in its log
/// lines). Only the TCP connection itself counts: a timeout later in the set-up (TLS handshake,
/// authentication, the ApiVersion request) is a listener or credentials problem, left loud.
pub fn connection_failure(message: &str) -> Option<(String, String)> {
    const EVENTS: [&str; 3] = [
        "Connect to ",
        "Failed to resolve '",
        "Connection setup timed out in state CONNECT",
    ];
    let at = EVENTS.iter().filter_map(|e| message.find(e)).min()?;
    let event = &message[at..];
    if event.starts_with("Connect to ") && !event.contains(" failed") {
        return None;
    }
    let named = message[..at].trim_end().strip_suffix(':').map(|before| {
        let name = before.rsplit(": ").next().unwrap_or(before).trim();
        let name = name.split_once("://").map_or(name, |(_, rest)| rest);
        match name.rsplit_once('/') {
            Some((host_port, _)) => host_port,
            None => name,
        }
    });
    // "Failed to resolve 'host:port'" names the address itself (its broker may be named only by
    // its thread, `[thrd:app]`).
    let quoted = event
        .strip_prefix("Failed to resolve '")
        .and_then(|rest| rest.split_once('\'').map(|(address, _)| address));
    let broker = quoted
        .or(named)
        .filter(|b| !b.is_empty() && b.contains(':') && !b.starts_with("[thrd:"))?;
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
            RDKafkaLogLevel::Warning => {
                warn!(target: "librdkafka", client = %self.kind.as_str(), "librdkafka: {fac} {message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                info!(target: "librdkafka", client = %self.kind.as_str(), "librdkafka: {fac} {message}")
            }
            RDKafkaLogLevel::Debug => {
                debug!(target: "librdkafka", client = %self.kind.as_str(), "librdkafka: {fac} {message}")
            }
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
    /// show connected (and those quiet for long enough). Parses nothing while no outage is open.
    pub fn statistics(&self, json: &[u8]) {
        if !any_open() {
            return;
        }
        #[derive(serde::Deserialize)]
        struct Stats {
            time: i64,
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
                stats.time,
                stats
                    .brokers
                    .values()
                    .map(|b| (b.nodename.as_str(), b.state.as_str(), b.stateage)),
            ),
            Err(e) => debug!(error = %e, "librdkafka's statistics do not parse."),
        }
    }

    /// Brokers from statistics emitted at `time` (wall clock, seconds since the epoch):
    /// (`nodename`, `state`, `stateage` in µs).
    pub fn brokers<'a>(&self, time: i64, brokers: impl IntoIterator<Item = (&'a str, &'a str, i64)>) {
        if !any_open() {
            return;
        }
        for (node, state, age_us) in brokers {
            match state {
                // `time` is whole seconds: the connection came up no later than this.
                "UP" => drop(reached(
                    self.kind,
                    node,
                    time.saturating_mul(1_000_000).saturating_sub(age_us),
                )),
                // Still trying to connect: the outage goes on (between librdkafka's reports).
                "TRY_CONNECT" | "CONNECT" => still_failing(self.kind, node),
                _ => {}
            }
        }
        end_quiet_outages();
    }
}

#[cfg(test)]
#[path = "outage_tests.rs"]
mod tests;
