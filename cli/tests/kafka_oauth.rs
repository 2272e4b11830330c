//! Jobs authenticating with SASL/OAUTHBEARER: tokens from a real OpenID Connect provider
//! (Keycloak, `scripts/services up keycloak`, over HTTPS with a test CA) for the broker's SASL_SSL
//! listener, which checks them against the provider's signing key. A Kafka-to-Kafka exactly-once
//! job SIGKILLed after a checkpoint became durable and before its commits: its restart commits
//! through the wire-protocol client (which fetches its own token), its sources check topic IDs
//! through it at every snapshot, and librdkafka's clients (consumer, transactional producers)
//! authenticate with tokens librdkafka fetched itself. A job running through several token
//! lifetimes, the broker ending each session with its token, without a restart. Then a wrong
//! client secret, an untrusted token endpoint and a token the broker refuses, each failing at
//! start with what is wrong and where. The test feeds and checks
//! through the plaintext listener of the same broker.

mod k2k;

use std::time::Duration;

use anyhow::{Context, Result};
use exactly_integration_tests::{create_topic, fails_at_start, unique, TestEnv};
use k2k::{assert_no_restart, drain_and_verify, exactly, keeps_committing, killed_before_its_commits, Job, Running};

struct OAuth {
    sasl_ssl: String,
    kafka_tls: String,
    token_url: String,
    /// A realm whose tokens are signed with keys the broker does not trust.
    untrusted_token_url: String,
    idp_ca: String,
    client: String,
}

fn oauth() -> Result<OAuth> {
    let var = |name: &str| {
        std::env::var(name).with_context(|| {
            format!(
                "{name} is not set: these tests need Keycloak and the broker's SASL_SSL listener, which \
                 `scripts/services up kafka keycloak` start (then `eval \"$(scripts/services env)\"`)"
            )
        })
    };
    let o = OAuth {
        sasl_ssl: var("EXACTLY_KAFKA_SASL_SSL")?,
        kafka_tls: var("EXACTLY_KAFKA_TLS_DIR")?,
        token_url: var("EXACTLY_OAUTH_TOKEN_URL")?,
        untrusted_token_url: var("EXACTLY_OAUTH_UNTRUSTED_TOKEN_URL")?,
        idp_ca: var("EXACTLY_OAUTH_TLS_CA")?,
        client: var("EXACTLY_OAUTH_CLIENT_ID")?,
    };
    // Keycloak must be serving: without it every job here would fail at start, which a failure
    // test could mistake for its own.
    std::fs::metadata(&o.idp_ca).with_context(|| {
        format!(
            "{}: Keycloak's test CA is missing; start it with `scripts/services up keycloak`",
            o.idp_ca
        )
    })?;
    let token_host = o.token_url.split('/').nth(2).unwrap_or_default().to_owned();
    std::net::TcpStream::connect_timeout(
        &token_host
            .parse()
            .with_context(|| format!("token endpoint address {token_host}"))?,
        Duration::from_secs(5),
    )
    .with_context(|| {
        format!("Keycloak does not answer at {token_host}: start it with `scripts/services up keycloak`")
    })?;
    Ok(o)
}

/// A `[kafka]` body for OAUTHBEARER, the client secret referenced from `secret_var`.
fn settings(o: &OAuth, secret_var: &str, idp_ca: Option<&str>) -> String {
    let mut s = format!(
        r#"security.protocol = "SASL_SSL"
ssl.ca.location = "{tls}/ca.pem"
sasl.mechanism = "OAUTHBEARER"
sasl.oauthbearer.client.id = "{client}"
sasl.oauthbearer.client.secret = "${{{secret_var}}}"
sasl.oauthbearer.token.endpoint.url = "{url}"
"#,
        tls = o.kafka_tls,
        client = o.client,
        url = o.token_url,
    );
    if let Some(ca) = idp_ca {
        s.push_str(&format!("https.ca.location = \"{ca}\"\n"));
    }
    s
}

/// Fresh two-partition topics `NAME-in` and `NAME-out` and a k2k job file between them over the
/// OAUTHBEARER listener (the real client secret, referenced): input, output, the job's directory
/// and the arguments of `exactly run`.
async fn oauth_job(env: &TestEnv, o: &OAuth, name: &str) -> Result<(String, String, tempfile::TempDir, Vec<String>)> {
    let input = unique(&format!("{name}-in"));
    let output = unique(&format!("{name}-out"));
    create_topic(env, &input, 2).await?;
    create_topic(env, &output, 2).await?;
    let dir = tempfile::tempdir()?;
    let args = Job {
        bootstrap: Some(o.sasl_ssl.clone()),
        kafka: Some(settings(o, "EXACTLY_OAUTH_CLIENT_SECRET", Some(&o.idp_ca))),
        ..Job::new(&input, &output)
    }
    .write(env, dir.path(), "k2k");
    Ok((input, output, dir, args))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauthbearer_job_is_exactly_once_across_a_sigkill_before_its_commits() -> Result<()> {
    let env = TestEnv::get().await?;
    let o = oauth()?;
    let secret = std::env::var("EXACTLY_OAUTH_CLIENT_SECRET").context("EXACTLY_OAUTH_CLIENT_SECRET")?;
    let (input, output, _dir, args) = oauth_job(env, &o, "oauth").await?;
    let job_file = std::fs::read_to_string(&args[1])?;
    assert!(
        !job_file.contains(&secret),
        "the job file references the secret, never holds it"
    );

    let (next, log) = killed_before_its_commits(env, &input, &args)?;
    assert!(!log.contains(&secret), "the log never shows the secret");
    // The restart commits what the killed job pre-committed (over SASL_SSL with a bearer token,
    // by the wire client), then drains the input.
    let out = drain_and_verify(env, &args, &output, &next).await?;
    eprintln!("{out} records over SASL_SSL/OAUTHBEARER, 0 duplicates, 0 missing");
    Ok(())
}

/// The test realm's tokens last 30 s and the listener ends a session when its token expires
/// (`connections.max.reauth.ms`, KIP-368), so a job running 80 s must get new tokens — librdkafka
/// re-authenticating its connections, the wire client reconnecting for its per-snapshot topic-ID
/// checks and its transaction requests — without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_outlives_its_tokens_without_a_restart() -> Result<()> {
    let env = TestEnv::get().await?;
    let o = oauth()?;
    let (input, output, _dir, args) = oauth_job(env, &o, "oauth3").await?;
    let mut run = Running::spawn(env, &input, &output, args, &[]).await?;
    keeps_committing(env, &output, &mut run.job, run.committed, 8, Duration::from_secs(10)).await?;
    assert_no_restart(&run.job);
    let (_, out, _) = run.finish(env).await?;
    eprintln!("{out} records over 80 s of 30-second tokens, no restart, 0 duplicates, 0 missing");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_an_untrusted_endpoint_or_a_refused_token_fails_at_start_naming_it() -> Result<()> {
    let env = TestEnv::get().await?;
    let o = oauth()?;
    let input = unique("oauth2-in");
    let output = unique("oauth2-out");
    create_topic(env, &input, 1).await?;
    create_topic(env, &output, 1).await?;
    let dir = tempfile::tempdir()?;
    let job = |kafka: String, file: &str| {
        Job {
            bootstrap: Some(o.sasl_ssl.clone()),
            kafka: Some(kafka),
            ..Job::new(&input, &output)
        }
        .write(env, dir.path(), file)
    };
    std::env::set_var("EXACTLY_TEST_WRONG_SECRET", "not-the-secret");
    let log = fails_at_start(
        exactly(),
        &job(
            settings(&o, "EXACTLY_TEST_WRONG_SECRET", Some(&o.idp_ca)),
            "wrong-secret",
        ),
        &[&o.token_url, "401", "unauthorized_client"],
    )?;
    assert!(!log.contains("not-the-secret"), "{log}");
    // The token endpoint's certificate is signed by Keycloak's test CA, which the system does
    // not trust: without https.ca.location the request fails naming the setting.
    fails_at_start(
        exactly(),
        &job(settings(&o, "EXACTLY_OAUTH_CLIENT_SECRET", None), "untrusted-idp"),
        &[&o.token_url, "https.ca.location"],
    )?;
    std::env::remove_var("EXACTLY_TEST_WRONG_SECRET");
    // A token the broker refuses (signed with a key it does not know): the wire client reads the
    // broker's error status and names the listener.
    fails_at_start(
        exactly(),
        &job(
            settings(&o, "EXACTLY_OAUTH_CLIENT_SECRET", Some(&o.idp_ca)).replace(&o.token_url, &o.untrusted_token_url),
            "refused-token",
        ),
        &[&o.sasl_ssl, "OAUTHBEARER", "invalid_token"],
    )?;
    Ok(())
}
