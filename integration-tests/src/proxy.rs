//! A TCP proxy between a job and the broker, to cut and restore the network in fault tests.
//!
//! The broker's `PROXIED` listener (see `scripts/services`) advertises the proxy's address, so a
//! client that bootstraps through the proxy reaches the broker only through it. Two faults:
//! - [`Proxy::partition`]: bytes stop flowing both ways on every connection, old and new (new
//!   ones are accepted and held), as when a network drops packets; [`Proxy::heal`] lets what was
//!   held through, as when the partition heals before TCP gives up.
//! - [`Proxy::reset`]: every connection is closed at once (the client sees a reset), and new
//!   ones are refused until [`Proxy::heal`].
//!
//! And one of the broker's answers: [`Proxy::coordinator_moving`] answers every OffsetFetch, for a
//! while, as a broker whose group coordinator is still loading, not available or elsewhere
//! (as right after a broker restart): the proxy reads the Kafka frames both ways and rewrites the
//! broker's real answer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, OffsetFetchRequest, OffsetFetchResponse, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The error codes [`Proxy::coordinator_moving`] answers with, in turn:
/// COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR.
const COORDINATOR_ERRORS: [i16; 3] = [14, 15, 16];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    Partitioned,
    Reset,
}

/// Answers the proxy rewrites: until when OffsetFetch is answered with a coordinator error, and
/// how many answers it rewrote.
#[derive(Default)]
struct Answers {
    /// Until when, and for the groups whose names start with what.
    coordinator_moving: Mutex<Option<(Instant, String)>>,
    rewritten: AtomicU64,
}

impl Answers {
    /// Whether the answer to the OffsetFetch request `message` (at `version`) is rewritten.
    fn rewriting(&self, message: &[u8], version: i16) -> bool {
        let Some((until, prefix)) = self.coordinator_moving.lock().expect("proxy answers").clone() else {
            return false;
        };
        Instant::now() < until
            && offset_fetch_groups(message, version)
                .expect("reading an OffsetFetch request")
                .iter()
                .any(|g| g.starts_with(&prefix))
    }
}

/// The consumer groups an OffsetFetch request (`message`, at `version`) asks about.
fn offset_fetch_groups(message: &[u8], version: i16) -> Result<Vec<String>> {
    let mut buf = Bytes::copy_from_slice(message);
    RequestHeader::decode(&mut buf, ApiKey::OffsetFetch.request_header_version(version))
        .context("OffsetFetch request header")?;
    let request = OffsetFetchRequest::decode(&mut buf, version).context("OffsetFetch request")?;
    Ok(if version >= 8 {
        request.groups.iter().map(|g| g.group_id.to_string()).collect()
    } else {
        vec![request.group_id.to_string()]
    })
}

/// A running proxy; stops (closing every connection) when dropped.
pub struct Proxy {
    state: watch::Sender<State>,
    answers: Arc<Answers>,
    /// Accepts and forwards; None once [`Proxy::stop`] took it.
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Binds `listen`. A proxy dropped just before (a test that failed, on another runtime) closes
/// its listener only when its runtime next runs its task: an address in use is tried again for a
/// while before it is an error.
async fn bind(listen: &str) -> Result<TcpListener> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match TcpListener::bind(listen).await {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                return Err(e).with_context(|| {
                    format!("binding the test proxy to {listen} (in use for 30 s: is another program listening there?)")
                })
            }
            Err(e) => return Err(e).with_context(|| format!("binding the test proxy to {listen}")),
        }
    }
}

impl Proxy {
    /// Listens on `listen` and forwards every connection's bytes to `upstream` as they come.
    pub async fn start(listen: &str, upstream: &str) -> Result<Self> {
        Self::start_with(listen, upstream, false).await
    }

    /// Listens on `listen` and forwards every connection to the Kafka broker at `upstream`, a
    /// Kafka frame at a time (so that [`Proxy::coordinator_moving`] can rewrite answers).
    pub async fn start_kafka(listen: &str, upstream: &str) -> Result<Self> {
        Self::start_with(listen, upstream, true).await
    }

    async fn start_with(listen: &str, upstream: &str, kafka: bool) -> Result<Self> {
        let listener = bind(listen).await?;
        let upstream: SocketAddr = upstream.parse().context("upstream address")?;
        let (state, watch) = watch::channel(State::Open);
        let answers = Arc::new(Answers::default());
        let shared = answers.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let watch = watch.clone();
                let answers = shared.clone();
                if *watch.borrow() == State::Reset {
                    drop(client);
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    // The requests whose answers are rewritten, by correlation id: their version.
                    let asked = Arc::new(Mutex::new(HashMap::new()));
                    let (requests, responses) = if kafka {
                        (
                            Frames::Requests(asked.clone(), answers.clone()),
                            Frames::Responses(asked, answers),
                        )
                    } else {
                        (Frames::Bytes, Frames::Bytes)
                    };
                    // Either direction ending (or a reset) ends both.
                    tokio::select! {
                        _ = pump(cr, sw, watch.clone(), requests) => {}
                        _ = pump(sr, cw, watch, responses) => {}
                    }
                });
            }
        });
        Ok(Proxy {
            state,
            answers,
            task: Some(task),
        })
    }

    /// For `length` from now, every OffsetFetch (a consumer group's committed offsets) of a group
    /// whose name starts with `groups` is answered with COORDINATOR_LOAD_IN_PROGRESS,
    /// COORDINATOR_NOT_AVAILABLE and NOT_COORDINATOR in turn, as by a broker just restarted, whose
    /// group coordinator is still loading or moving.
    pub fn coordinator_moving(&self, length: Duration, groups: &str) {
        *self.answers.coordinator_moving.lock().expect("proxy answers") =
            Some((Instant::now() + length, groups.to_owned()));
    }

    /// How many of the broker's answers the proxy rewrote so far.
    pub fn rewritten(&self) -> u64 {
        self.answers.rewritten.load(Ordering::Relaxed)
    }

    /// Stops forwarding bytes (connections stay open, data is held).
    pub fn partition(&self) {
        self.state.send_replace(State::Partitioned);
    }

    /// Closes every connection and refuses new ones.
    pub fn reset(&self) {
        self.state.send_replace(State::Reset);
    }

    /// Forwards again (what a partition held goes through).
    pub fn heal(&self) {
        self.state.send_replace(State::Open);
    }
}

impl Proxy {
    /// Stops: closes every connection and the listener, which is closed when this returns (so
    /// that the next proxy can listen on the same address at once).
    pub async fn stop(mut self) {
        self.reset();
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.reset();
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// What one direction of a connection carries, for the answers the proxy rewrites.
enum Frames {
    /// Bytes as they come (not Kafka's).
    Bytes,
    /// The client's requests: the OffsetFetch ones asked while answers are rewritten are noted.
    Requests(Arc<Mutex<HashMap<i32, i16>>>, Arc<Answers>),
    /// The broker's responses: those to noted requests are rewritten.
    Responses(Arc<Mutex<HashMap<i32, i16>>>, Arc<Answers>),
}

impl Frames {
    /// Takes the complete Kafka frames (a 4-byte size, then the message) off `pending` and returns
    /// what to forward for them: as they were, but answers to noted requests.
    fn forward(&self, pending: &mut BytesMut) -> Vec<u8> {
        if let Frames::Bytes = self {
            return pending.split().to_vec();
        }
        let mut out = Vec::new();
        while pending.len() >= 4 {
            let size = i32::from_be_bytes([pending[0], pending[1], pending[2], pending[3]]);
            let size = usize::try_from(size).unwrap_or(0);
            if pending.len() < 4 + size {
                break;
            }
            let frame = pending.split_to(4 + size).freeze();
            match self.rewrite(&frame[4..]) {
                Some(message) => {
                    out.put_i32(message.len() as i32);
                    out.extend_from_slice(&message);
                }
                None => out.extend_from_slice(&frame),
            }
        }
        out
    }

    /// The message to send instead of `message`, if it is rewritten.
    fn rewrite(&self, message: &[u8]) -> Option<Vec<u8>> {
        match self {
            Frames::Bytes => None,
            Frames::Requests(asked, answers) => {
                // Request header: api key, api version, correlation id.
                if message.len() >= 8 {
                    let key = i16::from_be_bytes([message[0], message[1]]);
                    let version = i16::from_be_bytes([message[2], message[3]]);
                    let id = i32::from_be_bytes([message[4], message[5], message[6], message[7]]);
                    if key == ApiKey::OffsetFetch as i16 && answers.rewriting(message, version) {
                        asked.lock().expect("proxy requests").insert(id, version);
                    }
                }
                None
            }
            Frames::Responses(asked, answers) => {
                let id = i32::from_be_bytes(message.get(..4)?.try_into().ok()?);
                let version = asked.lock().expect("proxy requests").remove(&id)?;
                let n = answers.rewritten.fetch_add(1, Ordering::Relaxed);
                let code = COORDINATOR_ERRORS[(n % COORDINATOR_ERRORS.len() as u64) as usize];
                Some(offset_fetch_failed(message, version, code).expect("rewriting an OffsetFetch answer"))
            }
        }
    }
}

/// The broker's OffsetFetch answer `message` (at `version`) as the group's coordinator failing with
/// `code`: the error where this version carries it (the group's, the response's, or each
/// partition's), and no offsets.
fn offset_fetch_failed(message: &[u8], version: i16, code: i16) -> Result<Vec<u8>> {
    let header_version = ApiKey::OffsetFetch.response_header_version(version);
    let mut buf = Bytes::copy_from_slice(message);
    let header = ResponseHeader::decode(&mut buf, header_version).context("OffsetFetch response header")?;
    let mut response = OffsetFetchResponse::decode(&mut buf, version).context("OffsetFetch response")?;
    anyhow::ensure!(!buf.has_remaining(), "OffsetFetch response: bytes left over");
    if version >= 8 {
        for group in &mut response.groups {
            group.error_code = code;
            group.topics.clear();
        }
    } else if version >= 2 {
        response.error_code = code;
        response.topics.clear();
    } else {
        for partition in response.topics.iter_mut().flat_map(|t| t.partitions.iter_mut()) {
            partition.error_code = code;
            partition.committed_offset = -1;
        }
    }
    let mut out = BytesMut::new();
    header
        .encode(&mut out, header_version)
        .context("OffsetFetch response header")?;
    response.encode(&mut out, version).context("OffsetFetch response")?;
    Ok(out.to_vec())
}

/// Copies `from` to `to`, frame by frame, while the state allows; returns when either side closes
/// or on reset.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: watch::Receiver<State>,
    frames: Frames,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending = BytesMut::new();
    loop {
        // Wait until forwarding is allowed (a partition holds here, a reset ends the copy).
        loop {
            let s = *state.borrow_and_update();
            match s {
                State::Open => break,
                State::Reset => return,
                State::Partitioned => {
                    if state.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = state.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        // Read while open; if a partition began meanwhile, hold the bytes until it heals.
        loop {
            let s = *state.borrow_and_update();
            match s {
                State::Open => break,
                State::Reset => return,
                State::Partitioned => {
                    if state.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        pending.extend_from_slice(&buf[..n]);
        let out = frames.forward(&mut pending);
        if !out.is_empty() && to.write_all(&out).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;
