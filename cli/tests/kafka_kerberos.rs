//! Jobs authenticating with SASL/GSSAPI (Kerberos): a real MIT Kerberos KDC (realm EXACTLY.TEST,
//! started with the broker by `scripts/services up kafka`) and the broker's SASL_SSL listener,
//! whose principal is kafka/127.0.0.1. The job has a keytab: librdkafka's clients obtain tickets
//! with `kinit` themselves, the wire-protocol client (transaction recovery, the sources' topic-ID
//! checks) with the same command before it authenticates. A Kafka-to-Kafka exactly-once job
//! SIGKILLed after a checkpoint became durable and before its commits: its restart commits through
//! the wire client. A job running through several ticket lifetimes (the realm's tickets last 2
//! minutes) and re-authentications (the listener ends a session after 45 s) without a restart.
//! A job with a keytab and no `KRB5CCNAME`, which keeps its tickets out of the OS user's default
//! credential cache (in one of its own), as `exactly verify` and `exactly txn list` do. Then a stale keytab (a key the KDC replaced) and an
//! empty credential cache without a keytab, each failing at start naming what is wrong. The test feeds and checks through
//! the plaintext listener of the same broker.

mod k2k;

use std::time::Duration;

use anyhow::{Context, Result};
use exactly_integration_tests::{create_topic, fails_at_start_env, unique, TestEnv};
use k2k::{assert_no_restart, drain_and_verify, exactly, keeps_committing, killed_before_its_commits, Job, Running};

struct Kerberos {
    sasl_ssl: String,
    kafka_tls: String,
    principal: String,
    keytab: String,
    stale_keytab: String,
    kdc_log: std::path::PathBuf,
}

/// The realm's files and the listener; points the jobs (children of this process) at the realm
/// (`KRB5_CONFIG`) and at a credential cache of their own (`KRB5CCNAME`).
fn kerberos() -> Result<Kerberos> {
    let var = |name: &str| {
        std::env::var(name).with_context(|| {
            format!(
                "{name} is not set: these tests need the Kerberos KDC and the broker's SASL_SSL listener, \
                 which `scripts/services up kafka` starts (then `eval \"$(scripts/services env)\"`)"
            )
        })
    };
    let krb5_conf = var("EXACTLY_KAFKA_KRB5_CONFIG")?;
    let dir = std::path::Path::new(&krb5_conf)
        .parent()
        .context("the realm's directory")?
        .to_path_buf();
    let text = std::fs::read_to_string(&krb5_conf)
        .with_context(|| format!("{krb5_conf}: the realm is missing; start it with `scripts/services up kafka`"))?;
    let kdc = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("kdc = "))
        .context("no kdc in the realm's krb5.conf")?
        .to_owned();
    std::net::TcpStream::connect_timeout(&kdc.parse().context("the KDC's address")?, Duration::from_secs(5))
        .with_context(|| format!("the KDC does not answer at {kdc}: start it with `scripts/services up kafka`"))?;
    // Every job of this binary uses the same realm and cache, set once (the tests run at the same
    // time: a cache of each would be one variable overwritten by the other) and kept to the end.
    static CACHE_DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    CACHE_DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::env::set_var("KRB5_CONFIG", &krb5_conf);
        std::env::set_var("KRB5CCNAME", format!("FILE:{}", dir.path().join("cache").display()));
        dir
    });
    Ok(Kerberos {
        sasl_ssl: var("EXACTLY_KAFKA_SASL_SSL")?,
        kafka_tls: var("EXACTLY_KAFKA_TLS_DIR")?,
        principal: var("EXACTLY_KAFKA_KERBEROS_PRINCIPAL")?,
        keytab: var("EXACTLY_KAFKA_KEYTAB")?,
        stale_keytab: var("EXACTLY_KAFKA_STALE_KEYTAB")?,
        kdc_log: dir.join("kdc.log"),
    })
}

/// A `[kafka]` body for GSSAPI with `keytab` (none: tickets from the cache only).
fn settings(k: &Kerberos, keytab: Option<&str>) -> String {
    let mut s = format!(
        r#"security.protocol = "SASL_SSL"
ssl.ca.location = "{tls}/ca.pem"
sasl.mechanism = "GSSAPI"
sasl.kerberos.service.name = "kafka"
sasl.kerberos.principal = "{principal}"
"#,
        tls = k.kafka_tls,
        principal = k.principal,
    );
    if let Some(keytab) = keytab {
        s.push_str(&format!("sasl.kerberos.keytab = \"{keytab}\"\n"));
    }
    s
}

/// Fresh topics `NAME-in` and `NAME-out` of `partitions` and a k2k job file between them over
/// the GSSAPI listener with `kafka` settings: input, output, the job's directory and the
/// arguments of `exactly run`.
async fn krb_job(
    env: &TestEnv,
    k: &Kerberos,
    name: &str,
    partitions: i32,
    kafka: String,
) -> Result<(String, String, tempfile::TempDir, Vec<String>)> {
    let input = unique(&format!("{name}-in"));
    let output = unique(&format!("{name}-out"));
    create_topic(env, &input, partitions).await?;
    create_topic(env, &output, partitions).await?;
    let dir = tempfile::tempdir()?;
    let args = Job {
        bootstrap: Some(k.sasl_ssl.clone()),
        kafka: Some(kafka),
        ..Job::new(&input, &output)
    }
    .write(env, dir.path(), "k2k");
    Ok((input, output, dir, args))
}

/// What the KDC's log counts so far for `principal`: service tickets issued for the broker, and
/// ticket-granting tickets asked for with a TGT (what a client delegating its credentials asks
/// for — a forwardable TGT to hand to the broker — whether the realm grants it or not).
fn kdc_counts(k: &Kerberos) -> Result<(usize, usize)> {
    let log = std::fs::read_to_string(&k.kdc_log).with_context(|| format!("{}", k.kdc_log.display()))?;
    let service = format!("{} for kafka/127.0.0.1@", k.principal);
    let tgt = format!("{} for krbtgt/", k.principal);
    let tgs = || log.lines().filter(|l| l.contains("TGS_REQ"));
    Ok((
        tgs().filter(|l| l.contains("ISSUE") && l.contains(&service)).count(),
        tgs().filter(|l| l.contains(&tgt)).count(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gssapi_job_is_exactly_once_across_a_sigkill_before_its_commits() -> Result<()> {
    let env = TestEnv::get().await?;
    let k = kerberos()?;
    let (tickets_before, delegations_before) = kdc_counts(&k)?;
    let (input, output, _dir, args) = krb_job(env, &k, "krb", 2, settings(&k, Some(&k.keytab))).await?;

    let (next, _) = killed_before_its_commits(env, &input, &args)?;
    // The restart commits what the killed job pre-committed (over SASL_SSL with a Kerberos
    // service ticket, by the wire client), then drains the input.
    let out = drain_and_verify(env, &args, &output, &next).await?;
    let (tickets, delegations) = kdc_counts(&k)?;
    let tickets = tickets - tickets_before;
    assert!(
        tickets > 0,
        "the KDC's log shows no service ticket for the broker issued to {}",
        k.principal
    );
    // Nothing delegated: no client asked for a TGT to forward to the brokers (rsasl's GSSAPI
    // client asked at every connection).
    assert_eq!(
        delegations - delegations_before,
        0,
        "the KDC's log shows {} asking for ticket-granting tickets to delegate",
        k.principal
    );
    eprintln!("{out} records over SASL_SSL/GSSAPI, 0 duplicates, 0 missing ({tickets} service tickets issued)");
    Ok(())
}

/// The realm's tickets last 2 minutes and the listener ends a Kerberos session after 45 s
/// (`connections.max.reauth.ms`, KIP-368), so a job running 150 s must obtain new tickets (kinit
/// from its keytab, librdkafka's every minute and the wire client's before it reconnects) and
/// re-authenticate with them — librdkafka re-authenticating its connections, the wire client
/// reconnecting for its per-snapshot topic-ID checks and its transaction requests — without a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_outlives_its_tickets_without_a_restart() -> Result<()> {
    let env = TestEnv::get().await?;
    let k = kerberos()?;
    let (input, output, _dir, args) = krb_job(env, &k, "krb3", 2, settings(&k, Some(&k.keytab))).await?;
    let mut run = Running::spawn(env, &input, &output, args, &[]).await?;
    keeps_committing(env, &output, &mut run.job, run.committed, 15, Duration::from_secs(10)).await?;
    assert_no_restart(&run.job);
    let (_, out, _) = run.finish(env).await?;
    eprintln!(
        "{out} records over 150 s of 2-minute tickets and 45-second sessions, no restart, 0 duplicates, 0 missing"
    );
    Ok(())
}

/// A job with a keytab, started without `KRB5CCNAME`, keeps its tickets in a credential cache of
/// its own: the OS user's default cache (here the realm's `default_ccache_name`, a file the test
/// watches) is never written, so two jobs of one user cannot replace each other's tickets, nor a
/// job the operator's; the job's own cache is gone once it has stopped (SIGTERM). The same for
/// the short commands: `verify` with the job file, `txn list` with it as `--kafka-config`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_with_a_keytab_keeps_its_tickets_in_a_cache_of_its_own() -> Result<()> {
    let env = TestEnv::get().await?;
    let k = kerberos()?;
    let (input, output, _dir, args) = krb_job(env, &k, "krb4", 1, settings(&k, Some(&k.keytab))).await?;
    let realm = tempfile::tempdir()?;
    let default_cache = realm.path().join("default-cache");
    let krb5_conf = realm.path().join("krb5.conf");
    let text =
        std::fs::read_to_string(std::env::var("EXACTLY_KAFKA_KRB5_CONFIG").context("EXACTLY_KAFKA_KRB5_CONFIG")?)?;
    assert!(
        text.contains("[libdefaults]\n"),
        "no [libdefaults] in the realm's krb5.conf:\n{text}"
    );
    std::fs::write(
        &krb5_conf,
        text.replacen(
            "[libdefaults]\n",
            &format!(
                "[libdefaults]\n  default_ccache_name = FILE:{}\n",
                default_cache.display()
            ),
            1,
        ),
    )?;
    let krb5_conf = krb5_conf.display().to_string();
    let job_env = [("KRB5_CONFIG", Some(krb5_conf.as_str())), ("KRB5CCNAME", None)];
    let job_file = args[1].clone();
    // Committed: its clients authenticated with tickets kinit obtained from the keytab.
    let run = Running::spawn(env, &input, &output, args, &job_env).await?;
    let log = run.job.tail(100_000);
    assert!(
        log.contains("a credential cache of this process's own"),
        "the job did not say where its tickets go:\n{log}"
    );
    assert!(
        !default_cache.exists(),
        "the job wrote the OS user's default credential cache {}",
        default_cache.display()
    );
    assert_no_restart(&run.job);
    // Removed when the job ends.
    let own = own_cache_dir(&log).with_context(|| format!("the job's log names no cache:\n{log}"))?;
    assert!(own.exists(), "{} is not there while the job runs", own.display());
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&own)?.permissions());
    assert_eq!(mode & 0o077, 0, "{} is open to others: {mode:o}", own.display());
    let (_, out) = run.stop(env).await?;
    assert!(!own.exists(), "{} is still there after the job ended", own.display());
    // The short commands as well: `verify` with the job file, `txn list` with it as
    // --kafka-config, each authenticating with tickets from the keytab.
    let topic = format!("topic:{output}");
    let commands: [(&str, &[&str]); 2] = [
        (
            "verify",
            &[
                "verify", "--source", &input, "--output", &topic, "--job", &job_file, "--id", "@value",
            ],
        ),
        (
            "txn list",
            &[
                "txn",
                "list",
                "--prefix",
                "k2k",
                "--bootstrap",
                &k.sasl_ssl,
                "--kafka-config",
                &job_file,
            ],
        ),
    ];
    for (name, command) in commands {
        let mut c = std::process::Command::new(exactly());
        c.args(command).env("KRB5_CONFIG", &krb5_conf).env_remove("KRB5CCNAME");
        let done = c.output()?;
        let stderr = String::from_utf8_lossy(&done.stderr);
        let stdout = String::from_utf8_lossy(&done.stdout);
        assert!(
            done.status.success(),
            "exactly {name} failed ({}):\n{stdout}\n{stderr}",
            done.status
        );
        assert!(
            !default_cache.exists(),
            "exactly {name} wrote the OS user's default credential cache {}",
            default_cache.display()
        );
        let own =
            own_cache_dir(&stderr).with_context(|| format!("exactly {name} names no cache of its own:\n{stderr}"))?;
        assert!(
            !own.exists(),
            "{} is still there after exactly {name} ended",
            own.display()
        );
    }
    eprintln!(
        "{out} records with tickets in a cache of the job's own, 0 duplicates, 0 missing; verify and txn list too"
    );
    Ok(())
}

/// The directory of the credential cache of its own that a command's log names.
fn own_cache_dir(log: &str) -> Option<std::path::PathBuf> {
    log.split("cache=FILE:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|cache| std::path::Path::new(cache).parent())
        .map(std::path::Path::to_path_buf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_keytab_or_no_tickets_fails_at_start_naming_it() -> Result<()> {
    let env = TestEnv::get().await?;
    let k = kerberos()?;
    let input = unique("krb2-in");
    let output = unique("krb2-out");
    create_topic(env, &input, 1).await?;
    create_topic(env, &output, 1).await?;
    let dir = tempfile::tempdir()?;
    let job = |kafka: String, file: &str| {
        Job {
            bootstrap: Some(k.sasl_ssl.clone()),
            kafka: Some(kafka),
            ..Job::new(&input, &output)
        }
        .write(env, dir.path(), file)
    };
    // Each job with a credential cache of its own, empty: tickets the other tests' jobs obtained
    // into the shared one would serve it (as a keytab's earlier tickets do until they expire).
    let fails_with_no_tickets = |args: &[String], expected: &[&str]| -> Result<()> {
        let empty = tempfile::tempdir()?;
        let cache = format!("FILE:{}", empty.path().join("none").display());
        fails_at_start_env(exactly(), args, &[("KRB5CCNAME", Some(cache.as_str()))], expected)?;
        Ok(())
    };
    // A key the KDC has since replaced: kinit is refused, and there are no tickets from before.
    fails_with_no_tickets(
        &job(settings(&k, Some(&k.stale_keytab)), "stale"),
        &[
            "kinit",
            &k.stale_keytab,
            "Password incorrect",
            "No Kerberos credentials",
        ],
    )?;
    // No keytab and nothing in the credential cache.
    fails_with_no_tickets(
        &job(settings(&k, None), "no-tickets"),
        &["GSSAPI", "No Kerberos credentials"],
    )?;
    Ok(())
}
