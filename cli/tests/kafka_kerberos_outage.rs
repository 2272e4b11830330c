//! A Kafka-to-Kafka exactly-once job authenticating with SASL/GSSAPI keeps running while the
//! Kerberos KDC is down for 75 s (`scripts/services kill-kdc`, then `start-kdc`): the tickets it
//! obtained before stay valid (the realm's last 2 minutes), so the `kinit` that fails meanwhile —
//! librdkafka's every minute, the wire client's before it reconnects — is logged, and the
//! connections opened during the outage (the wire client's, for the sources' topic-ID checks and
//! the sinks' transaction requests; the brokers end every Kerberos session after 45 s) use the
//! cached tickets. Nothing stops or restarts; output exactly once. (Before, the wire client took
//! a failed kinit for wrong credentials and stopped the job.) Its own binary: the outage would
//! fail the other Kerberos tests' jobs at start.

mod k2k;

use std::time::Duration;

use anyhow::{Context, Result};
use exactly_integration_tests::{create_topic, unique, TestEnv};
use k2k::{assert_no_restart, keeps_committing, Job, Running};

fn var(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| {
        format!(
            "{name} is not set: this test needs the Kerberos KDC and the broker's SASL_SSL listener, which \
             `scripts/services up kafka` starts (then `eval \"$(scripts/services env)\"`)"
        )
    })
}

fn services(command: &str) -> Result<()> {
    let script = var("EXACTLY_SERVICES")?;
    let status = std::process::Command::new(&script)
        .arg(command)
        .status()
        .with_context(|| format!("{script} {command}"))?;
    anyhow::ensure!(status.success(), "{script} {command}: {status}");
    Ok(())
}

/// Starts the KDC again when the test ends, however it ends.
struct KdcBack;

impl Drop for KdcBack {
    fn drop(&mut self) {
        if let Err(e) = services("start-kdc") {
            eprintln!("could not start the KDC again: {e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_through_a_kdc_outage_on_its_tickets() -> Result<()> {
    let env = TestEnv::get().await?;
    let krb5_conf = var("EXACTLY_KAFKA_KRB5_CONFIG")?;
    std::fs::metadata(&krb5_conf)
        .with_context(|| format!("{krb5_conf}: the realm is missing; start it with `scripts/services up kafka`"))?;
    let cache = tempfile::tempdir()?;
    let cache_name = format!("FILE:{}", cache.path().join("cache").display());
    let input = unique("krb-kdc-in");
    let output = unique("krb-kdc-out");
    create_topic(env, &input, 2).await?;
    create_topic(env, &output, 2).await?;
    let dir = tempfile::tempdir()?;
    let kafka = format!(
        "security.protocol = \"SASL_SSL\"\nssl.ca.location = \"{}/ca.pem\"\nsasl.mechanism = \"GSSAPI\"\n\
         sasl.kerberos.principal = \"{}\"\nsasl.kerberos.keytab = \"{}\"\n",
        var("EXACTLY_KAFKA_TLS_DIR")?,
        var("EXACTLY_KAFKA_KERBEROS_PRINCIPAL")?,
        var("EXACTLY_KAFKA_KEYTAB")?,
    );
    let args = Job {
        bootstrap: Some(var("EXACTLY_KAFKA_SASL_SSL")?),
        kafka: Some(kafka),
        ..Job::new(&input, &output)
    }
    .write(env, dir.path(), "k2k");
    let job_env = [
        ("KRB5_CONFIG", Some(krb5_conf.as_str())),
        ("KRB5CCNAME", Some(cache_name.as_str())),
    ];
    let mut run = Running::spawn(env, &input, &output, args, &job_env).await?;

    services("kill-kdc")?;
    let back = KdcBack;
    let committed = keeps_committing(env, &output, &mut run.job, run.committed, 5, Duration::from_secs(15)).await?;
    drop(back);
    keeps_committing(env, &output, &mut run.job, committed, 2, Duration::from_secs(10)).await?;
    let log = run.job.tail(100_000);
    assert!(
        log.contains("kinit failed"),
        "the job never ran kinit while the KDC was down:\n{log}"
    );
    assert_no_restart(&run.job);
    // The last run (drain_and_verify's) reads the realm from the environment too.
    std::env::set_var("KRB5_CONFIG", &krb5_conf);
    std::env::set_var("KRB5CCNAME", &cache_name);
    let (_, out, _) = run.finish(env).await?;
    eprintln!("{out} records through a 75 s KDC outage, no restart, 0 duplicates, 0 missing");
    Ok(())
}
