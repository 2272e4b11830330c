//! A job run as a principal that has only the ACLs docs/security.md lists — on a broker whose authorizer
//! denies what no ACL allows — is exactly once across a SIGKILL between a durable checkpoint and
//! its commits (the restart's DescribeTransactions, EndTxn and read_committed probe need those
//! ACLs too); without Write on its output topic it fails at start, naming what was refused.

mod k2k;

use anyhow::{Context, Result};
use exactly_integration_tests::acls::{allow, Allow, Operation, Resource};
use exactly_integration_tests::{create_topic, fails_at_start, unique, TestEnv};
use k2k::{drain_and_verify, exactly, killed_before_its_commits, Job};

fn acl(resource: Resource, name: &str, prefixed: bool, operation: Operation) -> Allow {
    Allow {
        resource,
        name: name.to_owned(),
        prefixed,
        operation,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_with_only_the_documented_acls_is_exactly_once_and_a_missing_one_fails_at_start() -> Result<()> {
    let env = TestEnv::get().await?;
    let var = |name: &str| {
        std::env::var(name).with_context(|| {
            format!("{name} is not set: this test needs the broker's authorizer and ACL user that `scripts/services up` configures")
        })
    };
    let (bootstrap, tls, user) = (
        var("EXACTLY_KAFKA_SASL_SSL")?,
        var("EXACTLY_KAFKA_TLS_DIR")?,
        var("EXACTLY_KAFKA_ACL_USER")?,
    );
    var("EXACTLY_KAFKA_ACL_PASSWORD")?;
    let kafka = format!(
        "security.protocol = \"SASL_SSL\"\nsasl.mechanism = \"SCRAM-SHA-512\"\nsasl.username = \"{user}\"\nsasl.password = \"${{EXACTLY_KAFKA_ACL_PASSWORD}}\"\nssl.ca.location = \"{tls}/ca.pem\"\n"
    );
    let principal = format!("User:{user}");
    let (input, output) = (unique("acl-in"), unique("acl-out"));
    create_topic(env, &input, 2).await?;
    create_topic(env, &output, 2).await?;
    let spec = Job {
        bootstrap: Some(bootstrap.clone()),
        kafka: Some(kafka.clone()),
        group: unique("acl-group"),
        prefix: unique("acl"),
        ..Job::new(&input, &output)
    };
    // docs/security.md's table, nothing more.
    allow(
        env,
        &principal,
        &[
            acl(Resource::Topic, &input, false, Operation::Read),
            acl(Resource::Topic, &input, false, Operation::Describe),
            acl(Resource::Group, &spec.group, false, Operation::Read),
            acl(Resource::Topic, &output, false, Operation::Write),
            acl(Resource::Topic, &output, false, Operation::Describe),
            acl(Resource::Topic, &output, false, Operation::Read),
            acl(Resource::Group, "exactly-probe", false, Operation::Read),
            acl(Resource::Group, &format!("{}-", spec.prefix), true, Operation::Read),
            acl(
                Resource::TransactionalId,
                &format!("{}-", spec.prefix),
                true,
                Operation::Write,
            ),
            acl(
                Resource::TransactionalId,
                &format!("{}-", spec.prefix),
                true,
                Operation::Describe,
            ),
        ],
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let args = spec.write(env, dir.path(), "k2k");
    let (next, _) = killed_before_its_commits(env, &input, &args)?;
    let out = drain_and_verify(env, &args, &output, &next).await?;
    eprintln!("{out} records as {principal} with only the documented ACLs, exactly once");

    // Without Write on the output topic: refused at start, saying so.
    let denied = unique("acl-denied");
    create_topic(env, &denied, 1).await?;
    allow(
        env,
        &principal,
        &[
            acl(Resource::Topic, &denied, false, Operation::Describe),
            acl(Resource::Topic, &denied, false, Operation::Read),
        ],
    )
    .await?;
    let spec = Job {
        bootstrap: Some(bootstrap),
        kafka: Some(kafka),
        group: unique("acl-group"),
        ..Job::new(&input, &denied)
    };
    allow(
        env,
        &principal,
        &[
            acl(Resource::Group, &spec.group, false, Operation::Read),
            acl(
                Resource::TransactionalId,
                &format!("{}-", spec.prefix),
                true,
                Operation::Write,
            ),
            acl(
                Resource::TransactionalId,
                &format!("{}-", spec.prefix),
                true,
                Operation::Describe,
            ),
        ],
    )
    .await?;
    let args = spec.write(env, dir.path(), "denied");
    exactly_integration_tests::produce(env, &input, &[("k".into(), "v".into())])?;
    fails_at_start(
        exactly(),
        &args,
        &[&format!("may not Write (and Describe) topic {denied:?}")],
    )?;

    // Without Read on the groups under the prefix (where the sink records its commits): refused
    // at start, naming the group and the ACL.
    let unrecorded = unique("acl-unrecorded");
    create_topic(env, &unrecorded, 1).await?;
    allow(
        env,
        &principal,
        &[
            acl(Resource::Topic, &unrecorded, false, Operation::Write),
            acl(Resource::Topic, &unrecorded, false, Operation::Describe),
            acl(Resource::Topic, &unrecorded, false, Operation::Read),
        ],
    )
    .await?;
    let spec = Job {
        output: &unrecorded,
        ..spec
    };
    let own = tempfile::tempdir()?;
    let args = spec.write(env, own.path(), "unrecorded");
    fails_at_start(
        exactly(),
        &args,
        &[
            &format!("may not Read consumer group \"{}-progress-", spec.prefix),
            &format!("grant Read on groups prefixed \"{}-\"", spec.prefix),
        ],
    )?;
    Ok(())
}
