//! How exactly reaches Kafka. One [`KafkaSecurity`] — written with Kafka's own property names as
//! TOML dotted keys (`security.protocol`, `sasl.mechanism`, `ssl.ca.location`, ...) — reaches every
//! client the product opens: [`client_config`] starts every librdkafka configuration (consumers,
//! transactional and plain producers, admin and metadata clients), and [`wire::connect`] opens the
//! connections of the wire-protocol client (DescribeTransactions, EndTxn, ListTransactions) with
//! the same TLS and SASL.
//!
//! ```toml
//! [kafka]
//! security.protocol = "SASL_SSL"
//! sasl.mechanism = "SCRAM-SHA-512"
//! sasl.username = "exactly"
//! sasl.password = "${KAFKA_PASSWORD}"        # or sasl.password_file = "/run/secrets/kafka"
//! ssl.ca.location = "/etc/exactly/ca.pem"
//! # mutual TLS: ssl.certificate.location, ssl.key.location (and ssl.key.password)
//! ```
//!
//! Mechanisms: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512. (OAUTHBEARER and GSSAPI are not offered: the
//! wire client would need token refresh and Kerberos, which the recovery path must not depend on
//! half-done.)

pub mod wire;

use std::path::PathBuf;
use std::time::Duration;

use exactly_core::secret::Secret;
use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};

/// `security.protocol`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SecurityProtocol {
    /// No encryption, no authentication.
    #[default]
    Plaintext,
    /// TLS (server verification; mutual TLS with a client certificate).
    Ssl,
    /// SASL over plaintext.
    SaslPlaintext,
    /// SASL over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Kafka's name for it.
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }
    /// Whether connections use TLS.
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }
    /// Whether connections authenticate with SASL.
    pub fn sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }
}

/// `sasl.mechanism`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SaslMechanism {
    /// Username and password in the clear (use it over TLS only).
    #[serde(rename = "PLAIN")]
    Plain,
    /// SCRAM with SHA-256.
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    /// SCRAM with SHA-512.
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    /// The mechanism's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// The `security.*` keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecuritySection {
    /// `security.protocol`.
    #[serde(default)]
    pub protocol: SecurityProtocol,
}

/// The `sasl.*` keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaslSection {
    /// `sasl.mechanism`.
    #[serde(default)]
    pub mechanism: Option<SaslMechanism>,
    /// `sasl.username`.
    #[serde(default)]
    pub username: Option<String>,
    /// `sasl.password` (write `"${ENV_VAR}"`, not the password).
    #[serde(default)]
    pub password: Option<Secret>,
    /// A file holding the password (e.g. a mounted Kubernetes Secret).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
}

/// A `*.location` key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Location {
    /// A PEM file.
    pub location: PathBuf,
}

/// The `ssl.key.*` keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySection {
    /// `ssl.key.location`: the client's private key (PEM).
    pub location: PathBuf,
    /// `ssl.key.password`, for an encrypted key (librdkafka only; the wire client needs an
    /// unencrypted PKCS#8 or RSA key).
    #[serde(default)]
    pub password: Option<Secret>,
}

/// `ssl.endpoint.identification.algorithm`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSection {
    /// `identification.algorithm`.
    pub identification: IdentificationSection,
}

/// `identification.algorithm`: `https` (verify the broker's host name, the default) or `none`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentificationSection {
    /// `https` or `none`.
    pub algorithm: String,
}

/// The `ssl.*` keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SslSection {
    /// `ssl.ca.location`: CA certificates (PEM) that sign the brokers' certificates; without it,
    /// the system's trust store.
    #[serde(default)]
    pub ca: Option<Location>,
    /// `ssl.certificate.location`: the client certificate (PEM), for mutual TLS.
    #[serde(default)]
    pub certificate: Option<Location>,
    /// `ssl.key.*`: the client certificate's key.
    #[serde(default)]
    pub key: Option<KeySection>,
    /// `ssl.endpoint.identification.algorithm`.
    #[serde(default)]
    pub endpoint: Option<EndpointSection>,
}

/// How every Kafka client of a job connects and authenticates. The default is plaintext.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSecurity {
    /// `security.*`.
    #[serde(default)]
    pub security: SecuritySection,
    /// `sasl.*`.
    #[serde(default)]
    pub sasl: SaslSection,
    /// `ssl.*`.
    #[serde(default)]
    pub ssl: SslSection,
}

impl KafkaSecurity {
    /// Plaintext.
    pub fn plaintext() -> Self {
        Self::default()
    }

    /// The protocol.
    pub fn protocol(&self) -> SecurityProtocol {
        self.security.protocol
    }

    /// Checks that the settings fit together and that the files they name can be read; the
    /// error says which key to change.
    pub fn validate(&self) -> Result<(), String> {
        let p = self.protocol();
        if p.sasl() {
            let m = self.sasl.mechanism.ok_or_else(|| {
                format!(
                    "security.protocol {} needs sasl.mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)",
                    p.name()
                )
            })?;
            if self.sasl.username.as_deref().unwrap_or("").is_empty() {
                return Err(format!("sasl.mechanism {} needs sasl.username", m.name()));
            }
            match (&self.sasl.password, &self.sasl.password_file) {
                (Some(_), Some(_)) => return Err("give sasl.password or sasl.password_file, not both".into()),
                (None, None) => {
                    return Err(format!(
                        "sasl.mechanism {} needs sasl.password (e.g. \"${{KAFKA_PASSWORD}}\") or sasl.password_file",
                        m.name()
                    ))
                }
                _ => {}
            }
            self.password()?;
        } else if self.sasl.mechanism.is_some() || self.sasl.username.is_some() {
            return Err(format!(
                "sasl.* is set but security.protocol is {} (use SASL_SSL or SASL_PLAINTEXT)",
                p.name()
            ));
        }
        if !p.tls() && (self.ssl.ca.is_some() || self.ssl.certificate.is_some() || self.ssl.key.is_some()) {
            return Err(format!(
                "ssl.* is set but security.protocol is {} (use SSL or SASL_SSL)",
                p.name()
            ));
        }
        if self.ssl.certificate.is_some() != self.ssl.key.is_some() {
            return Err("mutual TLS needs both ssl.certificate.location and ssl.key.location".into());
        }
        for (key, path) in [
            ("ssl.ca.location", self.ssl.ca.as_ref().map(|l| &l.location)),
            (
                "ssl.certificate.location",
                self.ssl.certificate.as_ref().map(|l| &l.location),
            ),
            ("ssl.key.location", self.ssl.key.as_ref().map(|k| &k.location)),
        ] {
            if let Some(path) = path {
                std::fs::metadata(path).map_err(|e| format!("{key} {}: {e}", path.display()))?;
            }
        }
        if let Some(e) = &self.ssl.endpoint {
            let a = e.identification.algorithm.as_str();
            if a != "https" && a != "none" {
                return Err(format!(
                    "ssl.endpoint.identification.algorithm {a:?}: expected \"https\" or \"none\""
                ));
            }
        }
        Ok(())
    }

    /// The SASL password, from `sasl.password` or `sasl.password_file`.
    pub fn password(&self) -> Result<Secret, String> {
        match (&self.sasl.password, &self.sasl.password_file) {
            (Some(p), _) => Ok(p.clone()),
            (None, Some(f)) => Secret::from_file(f).map_err(|e| format!("sasl.password_file: {e}")),
            (None, None) => Err("no sasl.password or sasl.password_file".into()),
        }
    }

    /// Whether the broker's host name is verified against its certificate.
    pub fn verify_host_name(&self) -> bool {
        self.ssl
            .endpoint
            .as_ref()
            .is_none_or(|e| e.identification.algorithm != "none")
    }

    /// Sets librdkafka's properties on `c`.
    pub fn apply(&self, c: &mut ClientConfig) -> Result<(), String> {
        let p = self.protocol();
        c.set("security.protocol", p.name());
        if p.sasl() {
            let m = self.sasl.mechanism.ok_or("sasl.mechanism is not set")?;
            c.set("sasl.mechanism", m.name());
            c.set("sasl.username", self.sasl.username.clone().unwrap_or_default());
            c.set("sasl.password", self.password()?.expose());
        }
        if p.tls() {
            if let Some(ca) = &self.ssl.ca {
                c.set("ssl.ca.location", ca.location.display().to_string());
            }
            if let Some(cert) = &self.ssl.certificate {
                c.set("ssl.certificate.location", cert.location.display().to_string());
            }
            if let Some(key) = &self.ssl.key {
                c.set("ssl.key.location", key.location.display().to_string());
                if let Some(pw) = &key.password {
                    c.set("ssl.key.password", pw.expose());
                }
            }
            c.set(
                "ssl.endpoint.identification.algorithm",
                if self.verify_host_name() { "https" } else { "none" },
            );
        }
        Ok(())
    }
}

/// Whether a librdkafka property belongs to the security settings (and must be set there, so
/// that every client of the job gets it, the wire-protocol client included).
pub fn is_security_key(key: &str) -> bool {
    key == "security.protocol" || key.starts_with("sasl.") || key.starts_with("ssl.")
}

/// A Kafka cluster as the job reaches it: where, and how.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cluster {
    /// `host:port[,host:port]`.
    pub bootstrap: String,
    /// TLS and SASL.
    pub security: KafkaSecurity,
}

impl Cluster {
    /// `bootstrap` with `security`.
    pub fn new(bootstrap: impl Into<String>, security: KafkaSecurity) -> Self {
        Cluster {
            bootstrap: bootstrap.into(),
            security,
        }
    }

    /// A plaintext cluster.
    pub fn plaintext(bootstrap: impl Into<String>) -> Self {
        Self::new(bootstrap, KafkaSecurity::default())
    }

    /// The bootstrap addresses as `host:port` (a scheme such as `SASL_SSL://` dropped).
    pub fn addresses(&self) -> impl Iterator<Item = &str> {
        self.bootstrap
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(|a| a.split_once("://").map_or(a, |(_, b)| b))
    }

    /// [`client_config`] for this cluster.
    pub fn client_config(&self) -> Result<ClientConfig, String> {
        client_config(&self.bootstrap, &self.security)
    }
}

/// librdkafka waits up to 10 s between reconnection attempts by default; Kafka's Java clients 1 s.
/// The shorter wait lets commits resume within about a second of a broker or network coming back.
const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The start of every librdkafka client configuration: the bootstrap servers, the security
/// settings, and the reconnection backoff. Callers add what their client needs.
pub fn client_config(bootstrap_servers: &str, security: &KafkaSecurity) -> Result<ClientConfig, String> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap_servers);
    c.set(
        "reconnect.backoff.max.ms",
        RECONNECT_BACKOFF_MAX.as_millis().to_string(),
    );
    security.apply(&mut c)?;
    Ok(c)
}

#[cfg(test)]
mod tests {
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
        assert!(e(r#"sasl.mechanism = "GSSAPI""#).contains("unknown variant"));
    }
}
