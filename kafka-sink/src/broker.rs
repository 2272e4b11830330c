//! What the sink asks the broker before it writes: the topic's partitions and the broker's
//! transaction timeout limit; fails at once, naming the address, while the job is starting.

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use tracing::info;

use crate::config::{KafkaSinkConfig, PartitionerKind};
use crate::error::{Result, SinkError};
use crate::partitioner::{FixedPartitioner, KeyHashPartitioner, Partitioner, RoundRobinPartitioner};

pub(crate) const TIMEOUT: Duration = Duration::from_secs(30);
/// How long one broker may take to describe its configuration before the next is asked (the
/// last one asked gets [`TIMEOUT`], as the only one of a single-broker cluster always did).
const DESCRIBE_CONFIG_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the output topic may be missing from the metadata before the sink calls it missing.
const TOPIC_PROPAGATION: Duration = Duration::from_secs(10);
/// How often the metadata is asked again meanwhile.
const TOPIC_RETRY: Duration = Duration::from_millis(500);

pub(crate) fn partitioner_for(kind: PartitionerKind) -> Box<dyn Partitioner> {
    match kind {
        PartitionerKind::KeyHash => Box::new(KeyHashPartitioner::default()),
        PartitionerKind::Fixed => Box::new(FixedPartitioner::default()),
        PartitionerKind::RoundRobin => Box::new(RoundRobinPartitioner::default()),
    }
}

/// What the broker says about the topic and its limits.
pub(crate) struct BrokerFacts {
    pub(crate) partitions: Vec<i32>,
    pub(crate) brokers: Vec<String>,
    pub(crate) max_transaction_timeout: Option<Duration>,
}

/// A missing ACL is found at start, by name, not from a transaction the broker aborts later.
async fn check_access(config: &KafkaSinkConfig) -> Result<()> {
    let cluster = config.cluster();
    let access = exactly_kafka_client::wire::topic_access(&cluster, &config.topic)
        .await
        .map_err(crate::protocol::wire_error)?;
    if !access.allows(4) || !access.allows(8) {
        return Err(SinkError::Config(format!(
            "the job's principal may not Write (and Describe) topic {:?} at {}: grant it the ACLs docs/security.md lists (Write, Describe, Read on the topic; Write, Describe on the transactional-id prefix; Read on groups under it)",
            config.topic, cluster.bootstrap
        )));
    }
    Ok(())
}

/// What the broker says. While the job is `starting`, an unreachable bootstrap list fails at
/// once, naming each address (see `exactly_core::net::reachable`), and so do wrong credentials
/// and untrusted certificates, with what the broker or TLS said (`wire::check`). A topic not in
/// the metadata is asked for again for up to [`TOPIC_PROPAGATION`] before it is called missing.
pub(crate) async fn broker_facts(config: &KafkaSinkConfig, starting: bool) -> Result<BrokerFacts> {
    if starting {
        let cluster = config.cluster();
        tokio::task::block_in_place(|| exactly_core::net::reachable(&cluster.bootstrap))
            .map_err(SinkError::Unreachable)?;
        exactly_kafka_client::wire::check(&cluster, TIMEOUT)
            .await
            .map_err(crate::protocol::wire_error)?;
        check_access(config).await?;
    }
    let admin: AdminClient<DefaultClientContext> = config
        .cluster()
        .client_config()
        .map_err(SinkError::Config)?
        .create()
        .map_err(|e| SinkError::kafka("creating an admin client", e))?;
    // A topic created just before the job started may not be in every broker's metadata yet;
    // like librdkafka's `topic.metadata.propagation.max.ms`, wait a little before calling it
    // missing.
    let waiting_since = Instant::now();
    let mut told = false;
    let (md, partitions) = loop {
        let md = tokio::task::block_in_place(|| {
            admin.inner().fetch_metadata(Some(&config.topic), TIMEOUT).map_err(|e| {
                let bootstrap = &config.bootstrap_servers;
                let why = exactly_core::net::diagnose(bootstrap);
                SinkError::kafka(format!("fetching metadata from {bootstrap} ({why})"), e)
            })
        })?;
        let topic = md.topics().iter().find(|t| t.name() == config.topic);
        // Only a topic the broker does not know (yet) is waited for: one the principal may not
        // Describe is refused at once, by name.
        let refused = topic
            .and_then(|t| t.error())
            .map(rdkafka::types::RDKafkaErrorCode::from);
        if refused == Some(rdkafka::types::RDKafkaErrorCode::TopicAuthorizationFailed) {
            return Err(SinkError::Config(format!(
                "the job's principal may not Describe topic {:?} at {}: grant it the ACLs docs/security.md lists (Write, Describe, Read on the topic; Write, Describe on the transactional-id prefix; Read on groups under it)",
                config.topic, config.bootstrap_servers
            )));
        }
        let partitions: Vec<i32> = topic
            .map(|t| t.partitions().iter().map(|p| p.id()).collect())
            .unwrap_or_default();
        if !partitions.is_empty() {
            break (md, partitions);
        }
        let waited = waiting_since.elapsed();
        if waited >= TOPIC_PROPAGATION {
            return Err(SinkError::Config(format!(
                "topic {:?} does not exist or has no partitions (not in the metadata of {} after {} s; the sink does not create topics)",
                config.topic,
                config.bootstrap_servers,
                waited.as_secs()
            )));
        }
        if !told {
            told = true;
            info!(
                topic = %config.topic,
                "the output topic is not in the broker's metadata yet; waiting up to {} s for it (a topic just created takes a moment to reach every broker)",
                TOPIC_PROPAGATION.as_secs()
            );
        }
        tokio::time::sleep(TOPIC_RETRY).await;
    };
    if starting && told {
        // Asked while the topic was missing, the authorizer had nothing to say about it.
        check_access(config).await?;
    }
    let brokers: Vec<String> = md
        .brokers()
        .iter()
        .map(|b| format!("{}:{}", b.host(), b.port()))
        .collect();
    // From the first broker that answers (one that just died may still be listed: a failover).
    let mut max_transaction_timeout = None;
    let mut failures = Vec::new();
    let ids: Vec<i32> = md.brokers().iter().map(|b| b.id()).collect();
    let last = ids.len().saturating_sub(1);
    for (i, id) in ids.into_iter().enumerate() {
        let timeout = if i == last { TIMEOUT } else { DESCRIBE_CONFIG_TIMEOUT };
        let results = admin
            .describe_configs(
                &[ResourceSpecifier::Broker(id)],
                &AdminOptions::new().request_timeout(Some(timeout)),
            )
            .await;
        match results.as_deref() {
            Ok([Ok(resource), ..]) => {
                max_transaction_timeout = resource
                    .get("transaction.max.timeout.ms")
                    .and_then(|e| e.value.as_deref())
                    .and_then(|v| v.parse::<u64>().ok())
                    .map(Duration::from_millis);
                failures.clear();
                break;
            }
            // Refused (no DescribeConfigs right on the cluster): the limit stays unknown, as the
            // broker's own check of the transaction timeout remains.
            Ok(_) => {
                failures.clear();
                break;
            }
            Err(e) => failures.push(format!("broker {id}: {e}")),
        }
    }
    if !failures.is_empty() {
        return Err(SinkError::Protocol(format!(
            "describing the brokers' configuration (transaction.max.timeout.ms): {}",
            failures.join("; ")
        )));
    }
    Ok(BrokerFacts {
        partitions,
        brokers,
        max_transaction_timeout,
    })
}
