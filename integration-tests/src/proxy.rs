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
mod tests {
    use super::*;
    use std::time::Duration;

    async fn echo_server() -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8], within: Duration) -> Option<Vec<u8>> {
        s.write_all(msg).await.ok()?;
        let mut b = vec![0u8; msg.len()];
        match tokio::time::timeout(within, s.read_exact(&mut b)).await {
            Ok(Ok(_)) => Some(b),
            _ => None,
        }
    }

    /// A Kafka frame: the size, then `message`.
    fn frame(message: &[u8]) -> Vec<u8> {
        let mut f = (message.len() as i32).to_be_bytes().to_vec();
        f.extend_from_slice(message);
        f
    }

    /// An OffsetFetch request of `group` and the broker's answer to it: offset 42 of t/0.
    fn offset_fetch(version: i16, id: i32, group: &'static str) -> (Vec<u8>, Vec<u8>) {
        use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
        use kafka_protocol::messages::offset_fetch_response::{
            OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
            OffsetFetchResponseTopic, OffsetFetchResponseTopics,
        };
        use kafka_protocol::messages::{GroupId, TopicName};
        use kafka_protocol::protocol::StrBytes;
        let group_id = GroupId(StrBytes::from_static_str(group));
        let mut request = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(ApiKey::OffsetFetch as i16)
            .with_request_api_version(version)
            .with_correlation_id(id)
            .encode(&mut request, ApiKey::OffsetFetch.request_header_version(version))
            .unwrap();
        let mut asking = OffsetFetchRequest::default();
        if version >= 8 {
            asking.groups = vec![OffsetFetchRequestGroup::default().with_group_id(group_id.clone())];
        } else {
            asking.group_id = group_id.clone();
        }
        asking.encode(&mut request, version).unwrap();
        let mut response = OffsetFetchResponse::default();
        let topic = TopicName(StrBytes::from_static_str("t"));
        if version >= 8 {
            response.groups = vec![OffsetFetchResponseGroup::default()
                .with_group_id(group_id)
                .with_topics(vec![OffsetFetchResponseTopics::default()
                    .with_name(topic)
                    .with_partitions(vec![
                        OffsetFetchResponsePartitions::default().with_committed_offset(42)
                    ])])];
        } else {
            response.topics = vec![OffsetFetchResponseTopic::default()
                .with_name(topic)
                .with_partitions(vec![OffsetFetchResponsePartition::default().with_committed_offset(42)])];
        }
        let header_version = ApiKey::OffsetFetch.response_header_version(version);
        let mut answer = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(id)
            .encode(&mut answer, header_version)
            .unwrap();
        response.encode(&mut answer, version).unwrap();
        (frame(&request), frame(&answer))
    }

    /// The error an OffsetFetch answer carries, and whether it still carries an offset.
    fn offset_fetch_error(frame: &[u8], version: i16) -> (i16, bool) {
        let mut buf = Bytes::copy_from_slice(&frame[4..]);
        ResponseHeader::decode(&mut buf, ApiKey::OffsetFetch.response_header_version(version)).unwrap();
        let r = OffsetFetchResponse::decode(&mut buf, version).unwrap();
        let offsets = r
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|p| (p.error_code, p.committed_offset))
            .chain(
                r.groups
                    .iter()
                    .flat_map(|g| &g.topics)
                    .flat_map(|t| &t.partitions)
                    .map(|p| (p.error_code, p.committed_offset)),
            )
            .collect::<Vec<_>>();
        let error = match version {
            8.. => r.groups[0].error_code,
            2.. => r.error_code,
            _ => offsets[0].0,
        };
        (error, offsets.iter().any(|&(_, o)| o == 42))
    }

    #[test]
    fn answers_to_offset_fetches_asked_while_rewriting_carry_the_coordinator_errors_in_turn() {
        let answers = Arc::new(Answers::default());
        let asked = Arc::new(Mutex::new(HashMap::new()));
        let requests = Frames::Requests(asked.clone(), answers.clone());
        let responses = Frames::Responses(asked, answers.clone());
        // Not rewriting yet: frames go through as they were, whole or in pieces.
        let (request, answer) = offset_fetch(7, 1, "g-1");
        let mut pending = BytesMut::from(&request[..5]);
        assert!(requests.forward(&mut pending).is_empty(), "half a frame is held");
        pending.extend_from_slice(&request[5..]);
        assert_eq!(requests.forward(&mut pending), request);
        assert_eq!(responses.forward(&mut BytesMut::from(&answer[..])), answer);

        *answers.coordinator_moving.lock().unwrap() = Some((Instant::now() + Duration::from_secs(60), "g-".into()));
        // Another group's answers are not rewritten.
        for version in [5, 9] {
            let (request, answer) = offset_fetch(version, 10 + i32::from(version), "h-1");
            requests.forward(&mut BytesMut::from(&request[..]));
            assert_eq!(responses.forward(&mut BytesMut::from(&answer[..])), answer);
        }
        let mut seen = Vec::new();
        for (id, version) in [(2, 1), (3, 5), (4, 7), (5, 8), (6, 9)] {
            let (request, answer) = offset_fetch(version, id, "g-1");
            // Another request in the same read is forwarded as it was.
            let mut other = request.clone();
            other[5] = 1; // api key 1 (Fetch)
            let mut both = BytesMut::from(&request[..]);
            both.extend_from_slice(&other);
            let forwarded = requests.forward(&mut both);
            assert_eq!(forwarded, [request.clone(), other].concat());
            let rewritten = responses.forward(&mut BytesMut::from(&answer[..]));
            let (error, offset) = offset_fetch_error(&rewritten, version);
            assert!(!offset, "v{version}: no offset in a failed answer");
            seen.push(error);
        }
        assert_eq!(seen, [14, 15, 16, 14, 15]);
        assert_eq!(answers.rewritten.load(Ordering::Relaxed), 5);

        // An answer to a request asked before the rewriting ended is still rewritten; later ones
        // are not.
        let (request, answer) = offset_fetch(8, 7, "g-1");
        requests.forward(&mut BytesMut::from(&request[..]));
        *answers.coordinator_moving.lock().unwrap() = Some((Instant::now(), "g-".into()));
        assert_eq!(
            offset_fetch_error(&responses.forward(&mut BytesMut::from(&answer[..])), 8).0,
            16
        );
        let (request, answer) = offset_fetch(8, 8, "g-1");
        requests.forward(&mut BytesMut::from(&request[..]));
        assert_eq!(responses.forward(&mut BytesMut::from(&answer[..])), answer);
    }

    #[tokio::test]
    async fn partition_holds_bytes_heal_delivers_them_reset_closes() {
        let upstream = echo_server().await;
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let proxy = Proxy::start(&listen, &upstream).await.unwrap();
        let mut c = TcpStream::connect(&listen).await.unwrap();
        assert_eq!(
            roundtrip(&mut c, b"one", Duration::from_secs(5)).await.as_deref(),
            Some(&b"one"[..])
        );

        proxy.partition();
        assert_eq!(
            roundtrip(&mut c, b"two", Duration::from_millis(300)).await,
            None,
            "held"
        );
        proxy.heal();
        let mut b = [0u8; 3];
        tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&b, b"two", "delivered after the heal");

        proxy.reset();
        let mut b = [0u8; 1];
        let r = tokio::time::timeout(Duration::from_secs(5), c.read(&mut b))
            .await
            .unwrap();
        assert!(matches!(r, Ok(0) | Err(_)), "closed: {r:?}");
        let mut fresh = TcpStream::connect(&listen).await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(5), fresh.read(&mut b))
            .await
            .unwrap();
        assert!(matches!(r, Ok(0) | Err(_)), "new connections refused: {r:?}");
        proxy.heal();
        let mut again = TcpStream::connect(&listen).await.unwrap();
        assert_eq!(
            roundtrip(&mut again, b"three", Duration::from_secs(5)).await.as_deref(),
            Some(&b"three"[..])
        );
    }

    /// The broker's proxied listener advertises one address, so a test starts its proxy where the
    /// one before it listened, right after that one was dropped (a test that failed) or stopped.
    /// Dropping a proxy closes its listener only when the runtime next runs its task; the next
    /// proxy waits for that instead of failing with "address already in use". (A current-thread
    /// runtime runs nothing else until the test yields, so without the wait this fails every time.)
    #[tokio::test(flavor = "current_thread")]
    async fn a_proxy_starts_where_the_one_dropped_just_before_it_listened() {
        let upstream = echo_server().await;
        let listen = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let first = Proxy::start(&listen, &upstream).await.unwrap();
        drop(first);
        let second = Proxy::start(&listen, &upstream).await.unwrap();
        let mut s = TcpStream::connect(&listen).await.unwrap();
        assert_eq!(
            roundtrip(&mut s, b"again", Duration::from_secs(5)).await.as_deref(),
            Some(&b"again"[..])
        );
        second.stop().await;
        let third = Proxy::start(&listen, &upstream).await.unwrap();
        drop(third);
    }
}
