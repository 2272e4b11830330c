//! Settings that weaken a default check, seen by `exactly check` without services: switches that
//! would turn certificate checks off are refused; host names not checked, passwords or tokens in
//! cleartext and transactional-id prefixes that nest are warned about; a job that keeps every
//! default gets no warning.

use assert_cmd::Command;

fn exactly() -> Command {
    Command::cargo_bin("exactly").expect("binary built")
}

const HEAD: &str = r#"[job]
name = "t"
parallelism = 1

[checkpoints]
dir = "/tmp/exactly-security-defaults"
interval = "1s"
timeout = "30s"
"#;

const SOURCE: &str = r#"
[source]
bootstrap_servers = "127.0.0.1:19092"
topics = ["in"]
group_id = "g"
"#;

fn sink(prefix: &str) -> String {
    format!(
        r#"
[sink.kafka]
bootstrap_servers = "127.0.0.1:19092"
topic = "out"
delivery = {{ type = "exactly_once", transactional_id_prefix = "{prefix}" }}
"#
    )
}

/// `exactly check` of `text`: (exit code, stdout, stderr).
fn check(text: &str) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("job.toml");
    std::fs::write(&p, text).unwrap();
    let out = exactly()
        .env("KAFKA_PASSWORD", "a-password")
        .arg("check")
        .arg(&p)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_job_that_keeps_the_defaults_gets_no_warning() {
    let (code, _, err) = check(&format!("{HEAD}{SOURCE}{}", sink("t")));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn switches_that_turn_certificate_or_token_checks_off_are_refused() {
    for key in [
        "enable.ssl.certificate.verification",
        "enable.sasl.oauthbearer.unsecure.jwt",
    ] {
        let client = format!("client = {{ \"{key}\" = \"false\" }}\n");
        let in_source = format!("{HEAD}{SOURCE}{client}{}", sink("t"));
        let in_sink = format!("{HEAD}{SOURCE}{}{client}", sink("t"));
        for (place, text) in [("source", in_source), ("sink", in_sink)] {
            let (code, _, err) = check(&text);
            assert_eq!(code, 2, "{key} in the {place}: {err}");
            assert!(
                err.contains(&format!("client.{key}"))
                    && err.contains("cannot be set")
                    && err.contains("ssl.ca.location"),
                "{key} in the {place}: {err}"
            );
        }
    }
}

#[test]
fn host_names_unchecked_and_credentials_in_cleartext_are_warned_about() {
    let unchecked = r#"
[kafka]
security.protocol = "SASL_SSL"
sasl.mechanism = "SCRAM-SHA-512"
sasl.username = "exactly"
sasl.password = "${KAFKA_PASSWORD}"
ssl.endpoint.identification.algorithm = "none"
"#;
    let (code, _, err) = check(&format!("{HEAD}{unchecked}{SOURCE}{}", sink("t")));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: ") && err.contains("host names are not checked"),
        "{err}"
    );
    assert_eq!(err.matches("host names are not checked").count(), 1, "said once: {err}");

    let plain = r#"
[kafka]
security.protocol = "SASL_PLAINTEXT"
sasl.mechanism = "PLAIN"
sasl.username = "exactly"
sasl.password = "${KAFKA_PASSWORD}"
"#;
    let (code, _, err) = check(&format!("{HEAD}{plain}{SOURCE}{}", sink("t")));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("the password travels in cleartext"), "{err}");
    assert!(!err.contains("a-password"), "never the password itself: {err}");

    // SCRAM never sends the password: no warning.
    let scram = plain.replace("\"PLAIN\"", "\"SCRAM-SHA-512\"");
    let (code, _, err) = check(&format!("{HEAD}{scram}{SOURCE}{}", sink("t")));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn transactional_id_prefixes_that_nest_are_warned_about() {
    let sinks = |a: &str, b: &str| {
        format!(
            r#"
[[sink]]
name = "all"

[sink.kafka]
bootstrap_servers = "127.0.0.1:19092"
topic = "out"
delivery = {{ type = "exactly_once", transactional_id_prefix = "{a}" }}

[[sink]]
name = "eu"

[sink.kafka]
bootstrap_servers = "127.0.0.1:19092"
topic = "out-eu"
delivery = {{ type = "exactly_once", transactional_id_prefix = "{b}" }}
"#
        )
    };
    let (code, _, err) = check(&format!("{HEAD}{SOURCE}{}", sinks("orders", "orders-eu")));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("transactional_id_prefix \"orders\" begins") && err.contains("\"orders-eu\""),
        "{err}"
    );
    // Prefixes that share a start but not a dash-separated one do not nest.
    let (code, _, err) = check(&format!("{HEAD}{SOURCE}{}", sinks("orders", "orders_eu")));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn cleartext_to_other_machines_is_warned_about() {
    // Kafka's default PLAINTEXT to a broker beyond this machine.
    let remote = format!("{HEAD}{SOURCE}{}", sink("t")).replace("127.0.0.1:19092", "kafka-0.kafka:9092");
    let (code, _, err) = check(&remote);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("records travel unencrypted") && err.contains("kafka-0.kafka:9092"),
        "{err}"
    );
    assert_eq!(err.matches("records travel unencrypted").count(), 1, "said once: {err}");

    // A token endpoint over plain http:// to another host.
    let oauth = r#"
[kafka]
security.protocol = "SASL_SSL"
sasl.mechanism = "OAUTHBEARER"
sasl.oauthbearer.client.id = "job"
sasl.oauthbearer.client.secret = "${KAFKA_PASSWORD}"
sasl.oauthbearer.token.endpoint.url = "http://idp.example.com/token"
"#;
    let (code, _, err) = check(&format!("{HEAD}{oauth}{SOURCE}{}", sink("t")));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("plain http:// to another host"), "{err}");

    // The admin endpoint beyond loopback with a token and no TLS.
    let admin = HEAD.replace(
        "parallelism = 1",
        "parallelism = 1\nadmin = \"0.0.0.0:9249\"\nadmin_token = \"${KAFKA_PASSWORD}-and-more-bytes\"",
    );
    let (code, _, err) = check(&format!("{admin}{SOURCE}{}", sink("t")));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("admin token travels in cleartext"), "{err}");
}
