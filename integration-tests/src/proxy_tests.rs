//! The proxy's own tests: rewriting answers to offset fetches, holding and releasing bytes across a partition, and starting where another just listened.

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
