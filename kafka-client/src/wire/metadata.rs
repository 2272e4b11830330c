//! What a bootstrap server says before a job starts: whether it can be reached and logged in
//! to (`check`), what the principal may do with a topic, and the topics' IDs.

use super::*;

/// Connects to the first bootstrap server that answers, as the job's clients will (TLS, SASL),
/// and asks for its API versions: a job starting with a wrong password, an untrusted CA or a
/// listener of another protocol fails here with what the broker or TLS said, instead of
/// librdkafka's "broker transport failure" after its timeout.
pub async fn check(cluster: &crate::Cluster, timeout: std::time::Duration) -> Result<(), WireError> {
    use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
    let mut last = WireError::Config(format!("no bootstrap server in {:?}", cluster.bootstrap));
    for addr in cluster.addresses() {
        let attempt = async {
            let mut conn = connect(addr, &cluster.security, "exactly").await?;
            let req = ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("exactly"))
                .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
            conn.request(&req, 3).await.map(drop)
        };
        let outcome = match tokio::time::timeout(timeout, attempt).await {
            Ok(r) => r,
            Err(_) => Err(WireError::Transport {
                addr: addr.to_owned(),
                what: format!(
                    "no answer within {timeout:?} (a listener of another security.protocol than {}?)",
                    cluster.security.protocol().name()
                ),
            }),
        };
        match outcome {
            Ok(()) => return Ok(()),
            Err(e) if e.is_permanent() => return Err(e),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// What the connection's principal may do with a topic, as the broker's authorizer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicAccess {
    /// The broker reports no authorized operations (no authorizer, or an old broker).
    Unknown,
    /// Not even Describe: the topic is invisible to the principal.
    Denied,
    /// The bit set of allowed operations (bit n: operation code n; 3 Read, 4 Write, 8 Describe).
    Allowed(i32),
}

impl TopicAccess {
    /// Whether `operation` (a protocol code: 3 Read, 4 Write) is allowed (or unknown).
    pub fn allows(self, operation: u8) -> bool {
        match self {
            TopicAccess::Unknown => true,
            TopicAccess::Denied => false,
            // Bit 2 (All) allows everything.
            TopicAccess::Allowed(bits) => bits & (1 << operation) != 0 || bits & (1 << 2) != 0,
        }
    }
}

/// Asks a bootstrap server (Metadata v10 with `include_topic_authorized_operations`) what the
/// principal may do with `topic`: a job lacking an ACL learns it at start, with the operation's
/// name, instead of from a transaction the broker aborts later.
pub async fn topic_access(cluster: &crate::Cluster, topic: &str) -> Result<TopicAccess, WireError> {
    use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
    use kafka_protocol::messages::TopicName;
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(topic.to_owned()))))
        ]))
        .with_allow_auto_topic_creation(false)
        .with_include_topic_authorized_operations(true);
    // The first bootstrap server that answers (the first one may be down: a failover).
    let mut last = WireError::Config("no bootstrap server".into());
    let mut answer = None;
    for addr in cluster.addresses() {
        let attempt = async {
            let mut conn = connect(addr, &cluster.security, "exactly").await?;
            conn.request(&req, 10).await
        };
        match attempt.await {
            Ok(resp) => {
                answer = Some(resp);
                break;
            }
            Err(e) if e.is_permanent() => return Err(e),
            Err(e) => last = e,
        }
    }
    let resp = answer.ok_or(last)?;
    let Some(t) = resp.topics.first() else {
        return Ok(TopicAccess::Unknown);
    };
    // 29: TOPIC_AUTHORIZATION_FAILED. Any other error (e.g. 3, the topic does not exist) is for
    // the caller's own metadata request to report.
    match t.error_code {
        0 => {}
        29 => return Ok(TopicAccess::Denied),
        _ => return Ok(TopicAccess::Unknown),
    }
    if t.topic_authorized_operations == i32::MIN {
        return Ok(TopicAccess::Unknown);
    }
    Ok(TopicAccess::Allowed(t.topic_authorized_operations))
}

/// Asks a bootstrap server for the IDs of topics (KIP-516, Metadata v10) over a connection it
/// keeps between requests (connecting again, to each address in turn, when a request fails): a
/// topic deleted and recreated under the same name has another ID, which a position recorded
/// with the old one can be checked against. One round trip per request on a kept connection.
#[derive(Debug, Default)]
pub struct TopicIds {
    conn: Option<Connection>,
}

impl TopicIds {
    /// The IDs of `topics`, by name. A topic that does not exist, or a broker without topic IDs
    /// (before Kafka 2.8), has none in the map. `timeout` bounds each attempt.
    pub async fn get(
        &mut self,
        cluster: &crate::Cluster,
        topics: &[String],
        timeout: std::time::Duration,
    ) -> Result<std::collections::BTreeMap<String, String>, WireError> {
        use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
        use kafka_protocol::messages::TopicName;
        if topics.is_empty() {
            return Ok(std::collections::BTreeMap::new());
        }
        let req = MetadataRequest::default()
            .with_topics(Some(
                topics
                    .iter()
                    .map(|t| {
                        MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(t.clone()))))
                    })
                    .collect(),
            ))
            .with_allow_auto_topic_creation(false);
        if let Some(conn) = self.conn.as_mut() {
            if let Ok(Ok(resp)) = tokio::time::timeout(timeout, conn.request(&req, 10)).await {
                return Ok(ids_of(resp));
            }
            // Broken, or left mid-request by the timeout: never used again.
            self.conn = None;
        }
        let mut last = WireError::Config(format!("no bootstrap server in {:?}", cluster.bootstrap));
        for addr in cluster.addresses() {
            let attempt = async {
                let mut conn = connect(addr, &cluster.security, "exactly").await?;
                let resp = conn.request(&req, 10).await?;
                Ok::<_, WireError>((conn, resp))
            };
            let outcome = match tokio::time::timeout(timeout, attempt).await {
                Ok(r) => r,
                Err(_) => Err(WireError::Transport {
                    addr: addr.to_owned(),
                    what: format!("no metadata within {timeout:?}"),
                }),
            };
            match outcome {
                Ok((conn, resp)) => {
                    self.conn = Some(conn);
                    return Ok(ids_of(resp));
                }
                Err(e) if e.is_permanent() => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

fn ids_of(resp: kafka_protocol::messages::MetadataResponse) -> std::collections::BTreeMap<String, String> {
    resp.topics
        .into_iter()
        .filter(|t| t.error_code == 0 && !t.topic_id.is_nil())
        .filter_map(|t| Some((t.name?.0.to_string(), t.topic_id.to_string())))
        .collect()
}
