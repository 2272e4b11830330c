//! `exactly run` with its checkpoints in a real S3-compatible object store (SeaweedFS, started by
//! `scripts/services`), as on Kubernetes with S3: the Kafka-to-Kafka job SIGKILLed at every step
//! of the two-phase protocol and restarted from the checkpoints in the store; the read_committed
//! output ends exactly once, and `exactly checkpoints list` finds the checkpoints in the store;
//! and the store over HTTPS with a private CA (`AWS_CA_BUNDLE`).

mod k2k;

use std::sync::Arc;

use anyhow::Result;
use exactly_integration_tests::{create_topic, unique, ChildJob, TestEnv};
use k2k::{drain_and_verify, exactly, sigkill_at_every_step, Job, KEYS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_kafka_with_s3_checkpoints_is_exactly_once_across_sigkills() -> Result<()> {
    let env = TestEnv::get().await?;
    let s3 = env.s3()?;
    let input = unique("s3k-in");
    let output = unique("s3k-out");
    create_topic(env, &input, 3).await?;
    create_topic(env, &output, 3).await?;
    let dir = tempfile::tempdir()?;
    let location = s3.url(&unique("k2k-crash"));
    let args = Job {
        checkpoints: Some(location.clone()),
        ..Job::new(&input, &output)
    }
    .write(env, dir.path(), "k2k");
    let next = Arc::new(std::sync::Mutex::new(vec![0usize; KEYS]));

    let kills = sigkill_at_every_step(env, &args, &input, &next, 1)?;
    let out = drain_and_verify(env, &args, &output, &next).await?;
    assert!(
        !dir.path().join("checkpoints").exists(),
        "checkpoints went to the store, not the local directory"
    );
    let listed = std::process::Command::new(exactly())
        .args(["checkpoints", "list", &location])
        .output()?;
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains(&format!("{location}/chk-")),
        "exactly checkpoints list {location}:\n{listed}"
    );
    eprintln!("{kills} kills with checkpoints in {location}; {out} records out, 0 duplicates, 0 missing");
    Ok(())
}

/// The S3 store of `scripts/services` over HTTPS: its endpoint and the CA that signed its
/// certificate.
fn s3_over_https() -> Result<(String, String)> {
    let var = |name: &str| {
        std::env::var(name).map_err(|_| {
            anyhow::anyhow!(
                "{name} is not set: this test needs the S3 store's HTTPS port, which `scripts/services up` starts (then `eval \"$(scripts/services env)\"`)"
            )
        })
    };
    Ok((var("EXACTLY_S3_HTTPS_ENDPOINT")?, var("EXACTLY_S3_TLS_CA")?))
}

/// Checkpoints in S3 over HTTPS, the endpoint's certificate signed by a private CA (SeaweedFS's
/// HTTPS port; `scripts/services` made the CA): with `AWS_CA_BUNDLE` naming it the job checkpoints
/// there, and a restarted job restores from there; without it the certificate is refused — no
/// fallback to plain HTTP, and `AWS_ALLOW_INVALID_CERTIFICATES` refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_go_to_s3_over_https_trusting_the_ca_in_aws_ca_bundle() -> Result<()> {
    let env = TestEnv::get().await?;
    let s3 = env.s3()?;
    let (https, ca) = s3_over_https()?;
    let input = unique("s3tls-in");
    let output = unique("s3tls-out");
    create_topic(env, &input, 1).await?;
    create_topic(env, &output, 1).await?;
    let dir = tempfile::tempdir()?;
    let location = s3.url(&unique("k2k-https"));
    let args = Job {
        checkpoints: Some(location.clone()),
        parallelism: 1,
        ..Job::new(&input, &output)
    }
    .write(env, dir.path(), "k2k");
    let without_ca: [(&str, Option<&str>); 3] = [
        ("AWS_ENDPOINT", Some(&https)),
        ("AWS_ALLOW_HTTP", None),
        ("AWS_CA_BUNDLE", None),
    ];
    let with_ca: [(&str, Option<&str>); 3] = [
        ("AWS_ENDPOINT", Some(&https)),
        ("AWS_ALLOW_HTTP", None),
        ("AWS_CA_BUNDLE", Some(&ca)),
    ];
    let list = |env: &[(&str, Option<&str>)]| -> Result<std::process::Output> {
        let mut c = std::process::Command::new(exactly());
        c.args(["checkpoints", "list", &location]);
        for (k, v) in env {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        Ok(c.output()?)
    };

    let refused = list(&without_ca)?;
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.to_lowercase().contains("certificate"),
        "without the CA: {said}"
    );
    // Nor by turning the check off: the client's switch for it is refused.
    let unchecked: [(&str, Option<&str>); 4] = [
        ("AWS_ENDPOINT", Some(&https)),
        ("AWS_ALLOW_HTTP", None),
        ("AWS_CA_BUNDLE", None),
        ("AWS_ALLOW_INVALID_CERTIFICATES", Some("true")),
    ];
    let refused = list(&unchecked)?;
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("AWS_ALLOW_INVALID_CERTIFICATES=true would turn off"),
        "with the check turned off: {said}"
    );

    let mut job = ChildJob::spawn_env(exactly(), &args, "", &with_ca)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = list(&with_ca)?;
        if String::from_utf8_lossy(&out.stdout).contains(&format!("{location}/chk-")) {
            break;
        }
        assert!(job.running(), "the job exited:\n{}", job.tail(40));
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint listed over HTTPS in 60 s: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            job.tail(40)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    job.kill();
    // Started again, it restores the newest of those checkpoints from the store.
    let mut again = ChildJob::spawn_env(exactly(), &args, "", &with_ca)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !again.tail(10_000).contains("Restoring.") {
        assert!(again.running(), "the job exited:\n{}", again.tail(40));
        assert!(
            std::time::Instant::now() < deadline,
            "no restore in 60 s:\n{}",
            again.tail(40)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let restored = again
        .tail(10_000)
        .lines()
        .find(|l| l.contains("Restoring."))
        .map(str::to_owned);
    again.kill();
    assert!(
        restored
            .as_deref()
            .is_some_and(|l| l.contains("checkpoint_id=") && !l.contains("checkpoint_id=0 ")),
        "{restored:?}"
    );
    assert!(
        !dir.path().join("checkpoints").exists(),
        "checkpoints went to the store, not the local directory"
    );
    Ok(())
}
