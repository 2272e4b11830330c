//! Jobs against the broker's secured listeners (`scripts/services` makes the certificates and the
//! SCRAM users): a Kafka-to-Kafka exactly-once job over SASL_SSL with SCRAM-SHA-512 — its password
//! taken from the environment through `${...}` in the job file — SIGKILLed after a checkpoint
//! became durable and before its commits, so the restart commits through the secured wire-protocol
//! client; a job over SSL with a client certificate (mutual TLS); and a wrong password, an
//! untrusted CA and a missing client certificate, each failing at start with what is wrong and
//! where; `exactly datagen` writing and `exactly bench k2k` running over SASL_SSL. The test itself feeds and checks through
//! the plaintext listener of the same broker.

mod k2k;

use std::time::Duration;

use anyhow::{Context, Result};
use exactly_integration_tests::{create_topic, fails_at_start, read_committed, unique, ChildJob, TestEnv};
use k2k::{drain_and_verify, exactly, killed_before_its_commits, wait_for_more_output, Job};

struct Secured {
    sasl_ssl: String,
    ssl: String,
    tls: String,
    user: String,
}

fn secured() -> Result<Secured> {
    let var = |name: &str| {
        std::env::var(name).with_context(|| {
            format!(
                "{name} is not set: these tests need the broker's secured listeners, which `scripts/services up` \
                 configures (then `eval \"$(scripts/services env)\"`)"
            )
        })
    };
    Ok(Secured {
        sasl_ssl: var("EXACTLY_KAFKA_SASL_SSL")?,
        ssl: var("EXACTLY_KAFKA_SSL")?,
        tls: var("EXACTLY_KAFKA_TLS_DIR")?,
        user: var("EXACTLY_KAFKA_SCRAM_USER")?,
    })
}

fn scram(s: &Secured, password_var: &str, ca: &str) -> String {
    k2k::scram_settings(&s.user, password_var, &format!("{}/{ca}", s.tls))
}

/// A `--kafka-config` file in `dir`: a `[kafka]` table of [`scram`] settings, the password from
/// `EXACTLY_KAFKA_SCRAM_PASSWORD`.
fn kafka_config_file(s: &Secured, dir: &std::path::Path) -> Result<std::path::PathBuf> {
    let config = dir.join("kafka.toml");
    std::fs::write(
        &config,
        format!("[kafka]\n{}", scram(s, "EXACTLY_KAFKA_SCRAM_PASSWORD", "ca.pem")),
    )?;
    Ok(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_ssl_scram_sha_512_job_is_exactly_once_across_a_sigkill_before_its_commits() -> Result<()> {
    let env = TestEnv::get().await?;
    let s = secured()?;
    let password = std::env::var("EXACTLY_KAFKA_SCRAM_PASSWORD").context("EXACTLY_KAFKA_SCRAM_PASSWORD")?;
    let input = unique("sec-in");
    let output = unique("sec-out");
    create_topic(env, &input, 2).await?;
    create_topic(env, &output, 2).await?;
    let dir = tempfile::tempdir()?;
    let spec = Job {
        bootstrap: Some(s.sasl_ssl.clone()),
        kafka: Some(scram(&s, "EXACTLY_KAFKA_SCRAM_PASSWORD", "ca.pem")),
        ..Job::new(&input, &output)
    };
    let prefix = spec.prefix.clone();
    let args = spec.write(env, dir.path(), "k2k");
    let job_file = std::fs::read_to_string(&args[1])?;
    assert!(
        !job_file.contains(&password),
        "the job file references the password, never holds it"
    );

    let (next, log) = killed_before_its_commits(env, &input, &args)?;
    assert!(!log.contains(&password), "the log never shows the password");
    // The transaction tool reaches the secured listener with the job file's [kafka] settings and
    // sees the transactions the killed job left.
    let listed = std::process::Command::new(exactly())
        .args([
            "txn",
            "list",
            "--json",
            "--prefix",
            &prefix,
            "--bootstrap",
            &s.sasl_ssl,
            "--kafka-config",
        ])
        .arg(&args[1])
        .output()?;
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success() && text.contains(&format!("{prefix}-0-")),
        "{text}{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    // The restart commits what the killed job pre-committed (over SASL_SSL, by the wire client),
    // then drains the input.
    let out = drain_and_verify(env, &args, &output, &next).await?;
    eprintln!("{out} records over SASL_SSL/SCRAM-SHA-512, 0 duplicates, 0 missing");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_works_and_bad_credentials_or_certificates_fail_at_start_naming_them() -> Result<()> {
    let env = TestEnv::get().await?;
    let s = secured()?;
    let input = unique("sec2-in");
    let output = unique("sec2-out");
    create_topic(env, &input, 1).await?;
    create_topic(env, &output, 1).await?;
    let dir = tempfile::tempdir()?;
    let job = |bootstrap: &str, kafka: String, file: &str| {
        Job {
            bootstrap: Some(bootstrap.to_owned()),
            kafka: Some(kafka),
            ..Job::new(&input, &output)
        }
        .write(env, dir.path(), file)
    };

    // A wrong password, referenced like the real one; only the child processes read it.
    std::env::set_var("EXACTLY_TEST_WRONG_PASSWORD", "not-the-password");
    let log = fails_at_start(
        exactly(),
        &job(
            &s.sasl_ssl,
            scram(&s, "EXACTLY_TEST_WRONG_PASSWORD", "ca.pem"),
            "wrong-password",
        ),
        &[
            &s.sasl_ssl,
            "SASL authentication failed",
            "invalid credentials",
            "SCRAM-SHA-512",
        ],
    )?;
    assert!(!log.contains("not-the-password"), "{log}");
    fails_at_start(
        exactly(),
        &job(
            &s.sasl_ssl,
            scram(&s, "EXACTLY_KAFKA_SCRAM_PASSWORD", "untrusted-ca.pem"),
            "untrusted",
        ),
        &[&s.sasl_ssl, "invalid peer certificate", "ssl.ca.location"],
    )?;
    let tls_only = format!("security.protocol = \"SSL\"\nssl.ca.location = \"{}/ca.pem\"\n", s.tls);
    fails_at_start(
        exactly(),
        &job(&s.ssl, tls_only.clone(), "no-client-certificate"),
        &[&s.ssl, "TLS"],
    )?;
    std::env::remove_var("EXACTLY_TEST_WRONG_PASSWORD");

    // Mutual TLS: the client certificate the scripts made.
    let mtls = format!(
        "{tls_only}ssl.certificate.location = \"{tls}/client.pem\"\nssl.key.location = \"{tls}/client.key\"\n",
        tls = s.tls
    );
    exactly_integration_tests::produce(env, &input, &[("k".into(), "one".into()), ("k".into(), "two".into())])?;
    let mut running = ChildJob::spawn(exactly(), &job(&s.ssl, mtls, "mtls"), "")?;
    let (n, _) = wait_for_more_output(env, &output, 1, &mut running, Duration::from_secs(60)).await?;
    running.kill();
    assert_eq!(n, 2, "both records committed over mutual TLS");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_is_reported_as_missing_not_as_an_acl() -> Result<()> {
    let env = TestEnv::get().await?;
    let s = secured()?;
    let output = unique("sec3-out");
    create_topic(env, &output, 1).await?;
    let missing = unique("never-created");
    let dir = tempfile::tempdir()?;
    let args = Job {
        bootstrap: Some(s.sasl_ssl.clone()),
        kafka: Some(scram(&s, "EXACTLY_KAFKA_SCRAM_PASSWORD", "ca.pem")),
        ..Job::new(&missing, &output)
    }
    .write(env, dir.path(), "missing");
    let log = fails_at_start(exactly(), &args, &[&missing, "does not exist"])?;
    assert!(!log.contains("may not Read"), "{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_letter_producer_writes_over_sasl_ssl_too() -> Result<()> {
    let env = TestEnv::get().await?;
    let s = secured()?;
    let (input, output, dead) = (unique("sec4-in"), unique("sec4-out"), unique("sec4-dead"));
    for t in [&input, &output, &dead] {
        create_topic(env, t, 1).await?;
    }
    let dir = tempfile::tempdir()?;
    let args = Job {
        bootstrap: Some(s.sasl_ssl.clone()),
        kafka: Some(scram(&s, "EXACTLY_KAFKA_SCRAM_PASSWORD", "ca.pem")),
        ..Job::new(&input, &output)
    }
    .write(env, dir.path(), "dead-letters");
    // A transform needs JSON; a record that is not goes to the dead-letter topic.
    let text = std::fs::read_to_string(&args[1])?;
    let text = text.replacen(
        "\n[sink.kafka]",
        &format!(
            "on_deserialization_error = {{ type = \"dead_letter\", topic = \"{dead}\" }}\n\n[[transform]]\ntype = \"project\"\nfields = [\"id\"]\n\n[sink.kafka]"
        ),
        1,
    );
    std::fs::write(&args[1], text)?;
    exactly_integration_tests::produce(
        env,
        &input,
        &[("k".into(), "{\"id\": 1}".into()), ("k".into(), "not json".into())],
    )?;
    let mut job = ChildJob::spawn(exactly(), &args, "")?;
    wait_for_more_output(env, &output, 0, &mut job, Duration::from_secs(60)).await?;
    let letters = exactly_integration_tests::wait_for_committed(env, &dead, 1, Duration::from_secs(60))
        .map_err(|e| anyhow::anyhow!("{e}\n{}", job.tail(30)))?;
    job.kill();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].value_str(), "not json");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_scram_sha_256_work_too() -> Result<()> {
    let env = TestEnv::get().await?;
    let s = secured()?;
    for mechanism in ["PLAIN", "SCRAM-SHA-256"] {
        let (input, output) = (unique("sec5-in"), unique("sec5-out"));
        create_topic(env, &input, 1).await?;
        create_topic(env, &output, 1).await?;
        let dir = tempfile::tempdir()?;
        let kafka = scram(&s, "EXACTLY_KAFKA_SCRAM_PASSWORD", "ca.pem").replace("SCRAM-SHA-512", mechanism);
        let args = Job {
            bootstrap: Some(s.sasl_ssl.clone()),
            kafka: Some(kafka),
            ..Job::new(&input, &output)
        }
        .write(env, dir.path(), "mechanism");
        exactly_integration_tests::produce(env, &input, &[("k".into(), "one".into()), ("k".into(), "two".into())])?;
        let mut job = ChildJob::spawn(exactly(), &args, "")?;
        let (n, _) = wait_for_more_output(env, &output, 1, &mut job, Duration::from_secs(60))
            .await
            .with_context(|| mechanism.to_owned())?;
        job.kill();
        assert_eq!(n, 2, "{mechanism}");
    }
    Ok(())
}

/// `exactly datagen` reaches a secured listener with `--kafka-config` (here a file with a
/// `[kafka]` table, its password taken from the environment), as the job and the tools do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagen_writes_over_sasl_ssl_with_a_kafka_config() -> Result<()> {
    let env = TestEnv::get().await?;
    let s = secured()?;
    let topic = unique("sec-datagen");
    create_topic(env, &topic, 2).await?;
    let dir = tempfile::tempdir()?;
    let config = kafka_config_file(&s, dir.path())?;
    let run = std::process::Command::new(exactly())
        .args([
            "datagen",
            "--topic",
            &topic,
            "--count",
            "50",
            "--bootstrap",
            &s.sasl_ssl,
            "--kafka-config",
        ])
        .arg(&config)
        .output()?;
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    // Read back through the plaintext listener.
    let mut ids: Vec<u64> = read_committed(env, &topic, Duration::from_secs(30))?
        .iter()
        .map(|r| {
            let order: serde_json::Value = serde_json::from_str(&r.value_str()).expect("an order");
            order["id"].as_u64().expect("an id")
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..50).collect::<Vec<u64>>());
    Ok(())
}

/// `exactly bench k2k` against the SASL_SSL listener with `--kafka-config`: every client of the
/// run — topic admin, backlog producer, the plain loop, the job's source and transactional sink,
/// the readers and the stable-offset sampler — authenticates, or the run cannot finish (that
/// listener speaks nothing else).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_k2k_runs_over_sasl_ssl_with_a_kafka_config() -> Result<()> {
    TestEnv::get().await?;
    let s = secured()?;
    let dir = tempfile::tempdir()?;
    let config = kafka_config_file(&s, dir.path())?;
    let json = dir.path().join("bench.json");
    let run = std::process::Command::new(exactly())
        .args([
            "bench",
            "k2k",
            "--records",
            "3000",
            "--sizes",
            "100",
            "--intervals",
            "1s",
            "--rounds",
            "1",
            "--modes",
            "exactly-once",
            "--bootstrap",
            &s.sasl_ssl,
            "--kafka-config",
        ])
        .arg(&config)
        .arg("--json")
        .arg(&json)
        .env_remove("EXACTLY_KAFKA_BOOTSTRAP")
        .output()?;
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json)?)?;
    let rows = report["rows"].as_array().context("rows")?;
    for mode in ["plain loop", "exactly-once"] {
        let row = rows
            .iter()
            .find(|r| r["case"].as_str().is_some_and(|c| c.ends_with(mode)))
            .with_context(|| format!("no {mode} row in {report}"))?;
        for figure in ["written_records_per_s", "committed_records_per_s"] {
            let v = row["figures"][figure].as_f64().unwrap_or(0.0);
            assert!(v > 0.0, "{mode}: {figure} = {v} in {report}");
        }
    }
    // The peers' Java harnesses connect in plaintext: refused, not run against the wrong listener.
    let peers = std::process::Command::new(exactly())
        .args(["bench", "peers", "--bootstrap", &s.sasl_ssl, "--kafka-config"])
        .arg(&config)
        .output()?;
    let stderr = String::from_utf8_lossy(&peers.stderr);
    assert!(!peers.status.success() && stderr.contains("--kafka-config"), "{stderr}");
    Ok(())
}
