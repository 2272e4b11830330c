use super::*;

#[test]
fn kafka_names_read_as_toml_dotted_keys() {
    std::env::set_var("EXACTLY_KAFKA_CLIENT_TEST_PW", "s3cret");
    let s: KafkaSecurity = toml::from_str(
        r#"
security.protocol = "SASL_SSL"
sasl.mechanism = "SCRAM-SHA-512"
sasl.username = "exactly"
sasl.password = "${EXACTLY_KAFKA_CLIENT_TEST_PW}"
ssl.endpoint.identification.algorithm = "none"
"#,
    )
    .unwrap();
    assert_eq!(s.protocol(), SecurityProtocol::SaslSsl);
    assert_eq!(s.sasl.mechanism, Some(SaslMechanism::ScramSha512));
    s.validate().unwrap();
    let c = client_config("b:9093", &s).unwrap();
    assert_eq!(c.get("sasl.password"), Some("s3cret"));
    assert_eq!(c.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
    assert_eq!(c.get("ssl.endpoint.identification.algorithm"), Some("none"));
    assert!(!format!("{s:?}").contains("s3cret"), "{s:?}");
}

#[test]
fn inconsistent_settings_name_the_key() {
    let e = |text: &str| {
        toml::from_str::<KafkaSecurity>(text)
            .map_err(|e| e.to_string())
            .and_then(|s| s.validate())
            .unwrap_err()
    };
    assert!(e(r#"security.protocol = "SASL_SSL""#).contains("needs sasl.mechanism"));
    assert!(e("security.protocol = \"SASL_SSL\"\nsasl.mechanism = \"PLAIN\"").contains("needs sasl.username"));
    assert!(
        e("security.protocol = \"SASL_SSL\"\nsasl.mechanism = \"PLAIN\"\nsasl.username = \"u\"")
            .contains("needs sasl.password")
    );
    assert!(e(r#"sasl.mechanism = "PLAIN""#).contains("security.protocol is PLAINTEXT"));
    assert!(e(r#"ssl.ca.location = "/nonexistent/ca.pem""#).contains("security.protocol is PLAINTEXT"));
    assert!(
        e("security.protocol = \"SSL\"\nssl.ca.location = \"/nonexistent/ca.pem\"")
            .contains("ssl.ca.location /nonexistent/ca.pem")
    );
    assert!(e(r#"security.protocol = "TLS""#).contains("unknown variant"));
    assert!(e(r#"sasl.mechanism = "KERBEROS""#).contains("unknown variant"));
}

const OAUTH: &str = r#"security.protocol = "SASL_SSL"
sasl.mechanism = "OAUTHBEARER"
sasl.oauthbearer.client.id = "job"
sasl.oauthbearer.client.secret = "${EXACTLY_KAFKA_CLIENT_TEST_SECRET}"
sasl.oauthbearer.token.endpoint.url = "https://idp.example/token"
"#;

#[test]
fn oauthbearer_reaches_librdkafka_as_oidc() {
    std::env::set_var("EXACTLY_KAFKA_CLIENT_TEST_SECRET", "cl13nt");
    let text = format!("{OAUTH}sasl.oauthbearer.scope = \"kafka\"\nsasl.oauthbearer.extensions = \"logicalCluster=lkc-1, identityPoolId=pool-2\"\n");
    let s: KafkaSecurity = toml::from_str(&text).unwrap();
    s.validate().unwrap();
    let c = client_config("b:9093", &s).unwrap();
    assert_eq!(c.get("sasl.mechanism"), Some("OAUTHBEARER"));
    assert_eq!(c.get("sasl.oauthbearer.method"), Some("oidc"));
    assert_eq!(c.get("sasl.oauthbearer.client.id"), Some("job"));
    assert_eq!(c.get("sasl.oauthbearer.client.secret"), Some("cl13nt"));
    assert_eq!(
        c.get("sasl.oauthbearer.token.endpoint.url"),
        Some("https://idp.example/token")
    );
    assert_eq!(c.get("sasl.oauthbearer.scope"), Some("kafka"));
    assert_eq!(
        c.get("sasl.oauthbearer.extensions"),
        Some("logicalCluster=lkc-1,identityPoolId=pool-2")
    );
    assert_eq!(c.get("sasl.username"), None);
    assert!(!format!("{s:?}").contains("cl13nt"), "{s:?}");
}

#[test]
fn oauthbearer_settings_that_do_not_fit_name_the_key() {
    std::env::set_var("EXACTLY_KAFKA_CLIENT_TEST_SECRET", "cl13nt");
    let e = |text: &str| {
        toml::from_str::<KafkaSecurity>(text)
            .map_err(|e| e.to_string())
            .and_then(|s| s.validate())
            .unwrap_err()
    };
    let without = |key: &str| {
        OAUTH
            .lines()
            .filter(|l| !l.starts_with(key))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(e(&without("sasl.oauthbearer.client.id")).contains("needs sasl.oauthbearer.client.id"));
    assert!(e(&without("sasl.oauthbearer.client.secret")).contains("needs sasl.oauthbearer.client.secret"));
    assert!(e(&without("sasl.oauthbearer.token")).contains("needs sasl.oauthbearer.token.endpoint.url"));
    assert!(e(&format!("{OAUTH}sasl.username = \"u\"\n")).contains("not sasl.username"));
    assert!(e(&format!("{OAUTH}sasl.oauthbearer.method = \"default\"\n")).contains("only \"oidc\""));
    assert!(e(&format!("{OAUTH}sasl.oauthbearer.extensions = \"a-b=1\"\n")).contains("letters only"));
    assert!(e(&format!("{OAUTH}sasl.oauthbearer.extensions = \"novalue\"\n")).contains("not key=value"));
    assert!(e(&format!("{OAUTH}https.ca.location = \"/nonexistent/idp.pem\"\n"))
        .contains("https.ca.location /nonexistent/idp.pem"));
    assert!(e(&OAUTH.replace("https://idp", "ftp://idp")).contains("expected an https://"));
    assert!(e(&OAUTH.replace("OAUTHBEARER", "PLAIN")).contains("are for sasl.mechanism OAUTHBEARER"));
    assert!(e("https.ca.location = \"/x.pem\"").contains("security.protocol is PLAINTEXT"));
}

/// Without the `kerberos` feature GSSAPI is refused when the settings are checked, naming
/// the feature (never a client that fails later, or a job that runs without it).
#[cfg(not(feature = "kerberos"))]
#[test]
fn gssapi_left_out_of_the_build_is_refused_naming_the_feature() {
    let s: KafkaSecurity = toml::from_str("security.protocol = \"SASL_SSL\"\nsasl.mechanism = \"GSSAPI\"\n").unwrap();
    let e = s.validate().unwrap_err();
    assert!(e.contains("`kerberos` feature"), "{e}");
    assert!(client_config("b:9093", &s).is_err());
}

#[cfg(feature = "kerberos")]
#[test]
fn gssapi_reaches_librdkafka_with_its_kerberos_names() {
    let keytab = std::env::temp_dir().join(format!("exactly-client-test-{}.keytab", std::process::id()));
    std::fs::write(&keytab, b"\x05\x02").unwrap();
    let text = format!(
        "security.protocol = \"SASL_PLAINTEXT\"\nsasl.mechanism = \"GSSAPI\"\nsasl.kerberos.principal = \"job@EXAMPLE.COM\"\nsasl.kerberos.keytab = \"{}\"\n",
        keytab.display()
    );
    let s: KafkaSecurity = toml::from_str(&text).unwrap();
    s.validate().unwrap();
    let c = client_config("b:9092", &s).unwrap();
    assert_eq!(c.get("sasl.mechanism"), Some("GSSAPI"));
    assert_eq!(c.get("sasl.kerberos.service.name"), Some("kafka"));
    assert_eq!(c.get("sasl.kerberos.principal"), Some("job@EXAMPLE.COM"));
    assert_eq!(c.get("sasl.kerberos.keytab"), keytab.to_str());
    assert_eq!(c.get("sasl.kerberos.min.time.before.relogin"), None);
    assert_eq!(s.kerberos_keytab(), Some((keytab.as_path(), "job@EXAMPLE.COM")));

    // Without a keytab: the tickets in the cache, and no kinit every minute.
    let s: KafkaSecurity = toml::from_str(
        "security.protocol = \"SASL_SSL\"\nsasl.mechanism = \"GSSAPI\"\nsasl.kerberos.service.name = \"kafka-prod\"\n",
    )
    .unwrap();
    s.validate().unwrap();
    let c = client_config("b:9093", &s).unwrap();
    assert_eq!(c.get("sasl.kerberos.service.name"), Some("kafka-prod"));
    assert_eq!(c.get("sasl.kerberos.min.time.before.relogin"), Some("0"));
    assert_eq!(c.get("sasl.kerberos.keytab"), None);
    assert_eq!(s.kerberos_keytab(), None);
    std::fs::remove_file(&keytab).unwrap();
}

#[cfg(feature = "kerberos")]
#[test]
fn gssapi_settings_that_do_not_fit_name_the_key() {
    let e = |text: &str| {
        toml::from_str::<KafkaSecurity>(text)
            .map_err(|e| e.to_string())
            .and_then(|s| s.validate())
            .unwrap_err()
    };
    const GSSAPI: &str = "security.protocol = \"SASL_SSL\"\nsasl.mechanism = \"GSSAPI\"\n";
    assert!(
        e(&format!("{GSSAPI}sasl.kerberos.keytab = \"/nonexistent/k.keytab\"\n"))
            .contains("sasl.kerberos.keytab needs sasl.kerberos.principal")
    );
    assert!(e(&format!(
        "{GSSAPI}sasl.kerberos.principal = \"a@B\"\nsasl.kerberos.keytab = \"/nonexistent/k.keytab\"\n"
    ))
    .contains("sasl.kerberos.keytab /nonexistent/k.keytab"));
    assert!(e(&format!("{GSSAPI}sasl.username = \"u\"\n")).contains("not sasl.username"));
    assert!(e(&format!("{GSSAPI}sasl.kerberos.service.name = \"kafka/host\"\n")).contains("service name alone"));
    assert!(e(&format!("{GSSAPI}sasl.kerberos.principal = \"\"\n")).contains("expected name@REALM"));
    // librdkafka's kinit runs through the shell: nothing a shell reads gets there.
    for principal in [
        "job@EXAMPLE.COM;touch${IFS}/tmp/pwned",
        "job$(id)@EXAMPLE.COM",
        "job`id`@EXAMPLE.COM",
        "job@EXAMPLE.COM|id",
        "-c/tmp/x@EXAMPLE.COM",
        "job",
        "@EXAMPLE.COM",
    ] {
        assert!(
            e(&format!("{GSSAPI}sasl.kerberos.principal = {principal:?}\n")).contains("expected name@REALM"),
            "{principal}"
        );
    }
    assert!(e(&format!(
        "{GSSAPI}sasl.kerberos.principal = \"a@B\"\nsasl.kerberos.keytab = \"/tmp/$(id).keytab\"\n"
    ))
    .contains("cannot be handed to kinit safely"));
    for good in [
        "job@EXAMPLE.COM",
        "kafka-client/host-1.example.com@EXAMPLE.COM",
        "a_b.c@R-1",
    ] {
        assert!(kerberos_principal(good), "{good}");
    }
    assert!(e(&format!("{GSSAPI}sasl.kerberos.realm = \"B\"\n")).contains("unknown field"));
    assert!(
        e("security.protocol = \"SASL_SSL\"\nsasl.mechanism = \"PLAIN\"\nsasl.kerberos.principal = \"a@B\"\n")
            .contains("sasl.kerberos.* is for sasl.mechanism GSSAPI")
    );
    assert!(e("sasl.kerberos.principal = \"a@B\"\n").contains("security.protocol is PLAINTEXT"));
}

/// A producer's or admin client's metadata request would create a missing topic on a broker
/// with `auto.create.topics.enable` (Kafka's default; the test brokers turn it off, so only the
/// setting can be checked here): every client the toolkit makes asks for no creation.
#[test]
fn no_client_asks_the_broker_to_create_topics() {
    let c = client_config("b:9092", &KafkaSecurity::default()).unwrap();
    assert_eq!(c.get("allow.auto.create.topics"), Some("false"));
}
