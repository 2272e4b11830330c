//! The command line without services: help, bad flags, bad job files, commands that must refuse.

use assert_cmd::Command;
use predicates::prelude::*;

fn exactly() -> Command {
    Command::cargo_bin("exactly").expect("binary built")
}

fn job_file(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
    let p = dir.join("job.toml");
    std::fs::write(&p, text).unwrap();
    p
}

const GOOD: &str = r#"[job]
name = "t"
parallelism = 2

[checkpoints]
dir = "/tmp/exactly-cli-args"
interval = "1s"
timeout = "30s"

[source]
bootstrap_servers = "127.0.0.1:19092"
topics = ["in"]
group_id = "g"

[sink.kafka]
bootstrap_servers = "127.0.0.1:19092"
topic = "out"
delivery = { type = "exactly_once", transactional_id_prefix = "t" }
"#;

#[test]
fn help_lists_every_command() {
    let out = exactly().arg("--help").assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    for c in [
        "run",
        "check",
        "savepoint",
        "stop",
        "status",
        "checkpoints",
        "txn",
        "datagen",
        "bench",
    ] {
        assert!(text.contains(c), "{c} missing from:\n{text}");
    }
    for sub in [
        vec!["run", "--help"],
        vec!["checkpoints", "list", "--help"],
        vec!["checkpoints", "inspect", "--help"],
        vec!["txn", "list", "--help"],
        vec!["txn", "abort", "--help"],
        vec!["bench", "--help"],
        vec!["savepoint", "--help"],
        vec!["stop", "--help"],
    ] {
        exactly()
            .args(&sub)
            .assert()
            .success()
            .stdout(predicate::str::contains("Usage"));
    }
}

#[test]
fn bad_flags_are_usage_errors() {
    exactly()
        .args(["run"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("JOB"));
    exactly().args(["frobnicate"]).assert().code(2);
    exactly()
        .args(["run", "x.toml", "--subtasks", "3..1"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("first subtask must not be after the last"));
    exactly()
        .args(["run", "x.toml", "--subtasks", "a..b"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("expected FIRST..LAST"));
    exactly()
        .args(["bench", "everything"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("possible values"));
    exactly()
        .args(["txn", "list", "--bootstrap", "127.0.0.1:1"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--prefix"));
}

#[test]
fn a_good_job_file_and_the_examples_check_out() {
    let dir = tempfile::tempdir().unwrap();
    let p = job_file(dir.path(), GOOD);
    exactly()
        .arg("check")
        .arg(&p)
        .assert()
        .success()
        .stdout(predicate::str::contains("ok (in -> kafka topic out, parallelism 2)"));
    for e in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "toml") {
            exactly().arg("check").arg(&path).assert().success();
        }
    }
}

#[test]
fn bad_job_files_name_line_field_and_expectation() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str, &[&str]); 7] = [
        (
            "parallelism = 2",
            "parallelism = \"two\"",
            &["job.toml:3:", "invalid type: string \"two\", expected u32"],
        ),
        (
            "group_id = \"g\"",
            "group_id = \"g\"\ngroupid = \"g\"",
            &["job.toml:14:", "unknown field `groupid`"],
        ),
        (
            "parallelism = 2",
            "parallelism = 0",
            &["job.toml:3:", "job.parallelism: must be at least 1"],
        ),
        (
            "timeout = \"30s\"",
            "timeout = \"10m\"",
            &[
                "job.toml:18:",
                "sink.kafka.delivery.transaction_timeout",
                "must exceed checkpoint interval + checkpoint timeout",
            ],
        ),
        (
            "topics = [\"in\"]",
            "topics = [\"in\"]\ntopic_pattern = \"in.*\"",
            &["job.toml:10:", "source: ", "either `topics` or `topic_pattern`"],
        ),
        (
            "[sink.kafka]",
            "[sink.nowhere]\n[sink.kafka]",
            &["job.toml:15:", "unknown field `nowhere`"],
        ),
        (
            "name = \"t\"",
            "name = \"t\"\nadmin = \"localhost\"",
            &["job.toml:3:", "job.admin", "expected \"host-ip:port\""],
        ),
    ];
    for (from, to, expected) in cases {
        let p = job_file(dir.path(), &GOOD.replacen(from, to, 1));
        let out = exactly().arg("check").arg(&p).assert().code(2);
        let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        for e in expected {
            assert!(err.contains(e), "{to:?}: expected {e:?} in: {err}");
        }
        // `run` refuses the same file the same way, before touching any service.
        exactly()
            .arg("run")
            .arg(&p)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(expected[0]));
    }
    let without_checkpoints = GOOD.replace(
        "[checkpoints]\ndir = \"/tmp/exactly-cli-args\"\ninterval = \"1s\"\ntimeout = \"30s\"\n",
        "",
    );
    let p = job_file(dir.path(), &without_checkpoints);
    exactly()
        .arg("check")
        .arg(&p)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "exactly_once and at_least_once need checkpoints",
        ));
    exactly()
        .args(["check", "/nonexistent/job.toml"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cannot read the job file"));
}

#[test]
fn run_refuses_a_missing_restore_path_and_a_range_beyond_the_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let p = job_file(
        dir.path(),
        &GOOD.replace("/tmp/exactly-cli-args", &dir.path().join("chk").display().to_string()),
    );
    exactly()
        .arg("run")
        .arg(&p)
        .args(["--from", "/nonexistent/savepoint-3"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("not a checkpoint or savepoint directory"));
    exactly()
        .arg("run")
        .arg(&p)
        .args(["--subtasks", "1..2"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("must be below the parallelism (2)"));
}

#[test]
fn checkpoint_commands_explain_missing_or_empty_directories() {
    exactly()
        .args(["checkpoints", "list", "/nonexistent/dir"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("is not a directory"));
    let dir = tempfile::tempdir().unwrap();
    exactly()
        .args(["checkpoints", "list"])
        .arg(dir.path())
        .assert()
        .success()
        .stderr(predicate::str::contains("no checkpoint or savepoint under"));
    exactly()
        .args(["checkpoints", "inspect"])
        .arg(dir.path())
        .assert()
        .failure()
        .stderr(predicate::str::contains("no checkpoint under"));
    let bogus = dir.path().join("chk-1");
    std::fs::create_dir_all(&bogus).unwrap();
    std::fs::write(bogus.join("_metadata"), b"garbage").unwrap();
    exactly()
        .args(["checkpoints", "list"])
        .arg(dir.path())
        .assert()
        .success()
        .stdout(predicate::str::contains("unreadable"));
    exactly()
        .args(["checkpoints", "inspect"])
        .arg(&bogus)
        .assert()
        .failure()
        .stderr(predicate::str::contains("bad magic"));
}

#[test]
fn commands_for_running_jobs_say_when_nothing_answers() {
    for args in [
        vec!["savepoint", "--admin", "127.0.0.1:1"],
        vec!["stop", "--admin", "127.0.0.1:1"],
        vec!["status", "--admin", "127.0.0.1:1"],
    ] {
        exactly()
            .args(&args)
            .assert()
            .failure()
            .stderr(predicate::str::contains(
                "cannot reach the job's admin endpoint at http://127.0.0.1:1",
            ));
    }
}

#[test]
fn txn_abort_needs_checkpoints_or_force() {
    exactly()
        .args(["txn", "abort", "--prefix", "p", "--bootstrap", "127.0.0.1:1"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("give --checkpoints DIR"));
    exactly()
        .args(["txn", "list", "--prefix", "", "--bootstrap", "127.0.0.1:1"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("--prefix must not be empty"));
}

#[test]
fn bench_needs_services_it_measures() {
    exactly()
        .args(["bench", "k2k"])
        .env_remove("EXACTLY_KAFKA_BOOTSTRAP")
        .assert()
        .failure()
        .stderr(predicate::str::contains("needs --bootstrap"));
}

#[test]
fn bench_peers_needs_its_harnesses_built() {
    // Checked before any service is reached: nothing listens on port 1.
    let dir = tempfile::tempdir().unwrap();
    exactly()
        .args(["bench", "peers", "--systems", "exactly,flink", "--peers-dir"])
        .arg(dir.path())
        .env("EXACTLY_KAFKA_BOOTSTRAP", "127.0.0.1:1")
        .assert()
        .failure()
        .stderr(predicate::str::contains("is not built: run scripts/peers first"));
}

#[test]
fn bench_core_prints_both_rates_and_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let out = exactly()
        .args(["bench", "core", "--records", "20000", "--rounds", "1", "--json"])
        .arg(&json)
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        text.contains("checkpointing off:") && text.contains("ratio on/off:"),
        "{text}"
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let row = &report["rows"][0];
    assert_eq!(row["bench"], "core");
    let (on, off, ratio) = (
        row["figures"]["on_records_per_s"].as_f64().unwrap(),
        row["figures"]["off_records_per_s"].as_f64().unwrap(),
        row["figures"]["ratio"].as_f64().unwrap(),
    );
    assert!(on > 0.0 && off > 0.0 && (ratio - on / off).abs() < 1e-9, "{row}");
}

#[test]
fn a_job_that_cannot_start_gives_up_after_its_startup_attempts_naming_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // A restart strategy that would retry 1000 times: the start-up bound ends it first.
    let base = GOOD
        .replace("/tmp/exactly-cli-args", &dir.path().join("chk").display().to_string())
        .replace("parallelism = 2", "parallelism = 1\nstartup_attempts = 3")
        .replace(
            "[source]",
            "[restart]\ntype = \"fixed_delay\"\nattempts = 1000\ndelay = \"100ms\"\n\n[source]",
        );
    for (bootstrap, expected) in [
        (
            "nosuchhost.invalid:9092".to_owned(),
            "nosuchhost.invalid:9092 does not resolve".to_owned(),
        ),
        (
            format!("127.0.0.1:{closed_port}"),
            format!("127.0.0.1:{closed_port} refuses connections"),
        ),
    ] {
        let p = job_file(dir.path(), &base.replace("127.0.0.1:19092", &bootstrap));
        let out = exactly()
            .arg("run")
            .arg(&p)
            .timeout(std::time::Duration::from_secs(120))
            .assert()
            .failure()
            .code(1)
            .get_output()
            .stderr
            .clone();
        let err = String::from_utf8_lossy(&out);
        assert!(
            err.contains("the job did not start: 3 attempts failed before its first checkpoint"),
            "{err}"
        );
        assert!(err.contains(&expected), "{err}");
        assert!(!err.contains("restart=3"), "the third failure ends it:\n{err}");
    }
}

#[test]
fn secrets_in_job_files_are_referenced_and_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "pw-7c1d-never-printed";
    let with_kafka = |section: &str| format!("{GOOD}\n[kafka]\n{section}");
    let scram = "security.protocol = \"SASL_PLAINTEXT\"\nsasl.mechanism = \"SCRAM-SHA-512\"\nsasl.username = \"u\"\nsasl.password = \"${EXACTLY_TEST_SECRET_PW}\"\n";
    let p = job_file(dir.path(), &with_kafka(scram));
    let out = exactly()
        .env("EXACTLY_TEST_SECRET_PW", secret)
        .arg("check")
        .arg(&p)
        .assert()
        .success();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.get_output().stdout),
        String::from_utf8_lossy(&out.get_output().stderr)
    );
    assert!(!printed.contains(secret), "{printed}");

    // An unset variable is an error naming it and the line.
    exactly()
        .env_remove("EXACTLY_TEST_SECRET_PW")
        .arg("check")
        .arg(&p)
        .assert()
        .failure()
        .stderr(predicate::str::contains(
            "environment variable EXACTLY_TEST_SECRET_PW (referenced as ${EXACTLY_TEST_SECRET_PW}) is not set",
        ))
        .stderr(predicate::str::contains("job.toml:"));

    // A mistake next to the password: the error says what is wrong, not the password.
    let p = job_file(
        dir.path(),
        &with_kafka("security.protocol = \"SASL_PLAINTEXT\"\nsasl.username = \"u\"\nsasl.password = \"${EXACTLY_TEST_SECRET_PW}\"\n"),
    );
    let out = exactly()
        .env("EXACTLY_TEST_SECRET_PW", secret)
        .arg("check")
        .arg(&p)
        .assert()
        .failure()
        .stderr(predicate::str::contains("needs sasl.mechanism"));
    assert!(!String::from_utf8_lossy(&out.get_output().stderr).contains(secret));

    // Security settings belong in [kafka], not in a client map where only one client sees them.
    let p = job_file(
        dir.path(),
        &GOOD.replace(
            "group_id = \"g\"",
            "group_id = \"g\"\nclient = { \"sasl.password\" = \"x\" }",
        ),
    );
    exactly()
        .arg("check")
        .arg(&p)
        .assert()
        .failure()
        .stderr(predicate::str::contains("client.sasl.password is a security setting"));
}
