//! ACLs on the local broker, for tests that run a job as a principal with only the ACLs it needs.
//! Created through the plaintext listener, whose principal (ANONYMOUS) is a super user there.

use anyhow::{bail, Result};
use kafka_protocol::messages::create_acls_request::{AclCreation, CreateAclsRequest};
use kafka_protocol::protocol::StrBytes;

use crate::TestEnv;

/// A Kafka resource type (the protocol's codes).
#[derive(Debug, Clone, Copy)]
pub enum Resource {
    /// A topic.
    Topic = 2,
    /// A consumer group.
    Group = 3,
    /// The cluster.
    Cluster = 4,
    /// A transactional id.
    TransactionalId = 5,
}

/// An operation (the protocol's codes).
#[derive(Debug, Clone, Copy)]
pub enum Operation {
    /// Read.
    Read = 3,
    /// Write.
    Write = 4,
    /// Describe.
    Describe = 8,
    /// IdempotentWrite.
    IdempotentWrite = 12,
}

/// One ACL to allow: `principal` may do `operation` on `resource` `name` (`prefixed`: every name
/// starting with it).
#[derive(Debug, Clone)]
pub struct Allow {
    /// The resource type.
    pub resource: Resource,
    /// Its name (or prefix).
    pub name: String,
    /// Whether `name` is a prefix.
    pub prefixed: bool,
    /// The operation.
    pub operation: Operation,
}

/// Allows `principal` (e.g. `User:alice`) the given operations.
pub async fn allow(env: &TestEnv, principal: &str, acls: &[Allow]) -> Result<()> {
    let creations: Vec<AclCreation> = acls
        .iter()
        .map(|a| {
            AclCreation::default()
                .with_resource_type(a.resource as i8)
                .with_resource_name(StrBytes::from_string(a.name.clone()))
                .with_resource_pattern_type(if a.prefixed { 4 } else { 3 })
                .with_principal(StrBytes::from_string(principal.to_owned()))
                .with_host(StrBytes::from_static_str("*"))
                .with_operation(a.operation as i8)
                .with_permission_type(3)
        })
        .collect();
    let first = env.kafka_bootstrap.split(',').next().unwrap_or_default().to_owned();
    let mut conn =
        exactly_kafka_client::wire::connect(&first, &exactly_kafka_client::KafkaSecurity::default(), "exactly-tests")
            .await?;
    let resp = conn
        .request(&CreateAclsRequest::default().with_creations(creations), 2)
        .await?;
    for r in resp.results {
        if r.error_code != 0 {
            bail!(
                "creating an ACL failed: error {} {:?} (does the broker run an authorizer? `scripts/services up` configures one)",
                r.error_code,
                r.error_message
            );
        }
    }
    Ok(())
}
