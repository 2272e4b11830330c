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
//! Mechanisms: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, and OAUTHBEARER with OpenID Connect's
//! client-credentials grant (librdkafka's `sasl.oauthbearer.method = "oidc"`):
//!
//! ```toml
//! [kafka]
//! security.protocol = "SASL_SSL"
//! sasl.mechanism = "OAUTHBEARER"
//! sasl.oauthbearer.client.id = "exactly-orders"
//! sasl.oauthbearer.client.secret = "${KAFKA_CLIENT_SECRET}"   # or sasl.oauthbearer.client.secret_file
//! sasl.oauthbearer.token.endpoint.url = "https://idp.example.com/realms/kafka/protocol/openid-connect/token"
//! sasl.oauthbearer.scope = "kafka"                            # optional
//! sasl.oauthbearer.extensions = "logicalCluster=lkc-1"       # optional, key=value,...
//! https.ca.location = "/etc/exactly/idp-ca.pem"              # optional: the token endpoint's CA
//! ```
//!
//! librdkafka fetches and refreshes its clients' tokens itself (on its background thread); the
//! wire client fetches its own from the same endpoint ([`oauth`]), keeps it until 80 % of its
//! lifetime has passed (as librdkafka does) and fetches a new one when the broker refuses it.
//!
//! And GSSAPI (Kerberos), librdkafka's names:
//!
//! ```toml
//! [kafka]
//! security.protocol = "SASL_SSL"                              # or SASL_PLAINTEXT
//! sasl.mechanism = "GSSAPI"
//! sasl.kerberos.service.name = "kafka"                       # the brokers' service (default kafka)
//! sasl.kerberos.principal = "exactly@EXAMPLE.COM"
//! sasl.kerberos.keytab = "/etc/exactly/exactly.keytab"
//! ```
//!
//! With a keytab, tickets come from `kinit -k -t KEYTAB PRINCIPAL` (MIT Kerberos' `kinit`, which
//! librdkafka runs at every client's start and every minute after, and the wire client before it
//! authenticates, at most once a minute); without one they must already be in the credential cache
//! (`kinit` by the operator). The cache is Kerberos' default or `$KRB5CCNAME` (the `exactly`
//! commands set one of the process's own when a client has a keytab), the realm's KDCs in
//! `/etc/krb5.conf` or `$KRB5_CONFIG`. The brokers' principal is `SERVICE/HOST@REALM` for the host
//! name a client connects to (the bootstrap address, then the brokers' advertised ones).

mod error;
pub mod https;
mod kerberos;
pub mod leader;
pub mod oauth;
pub mod outage;
mod security;
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
    /// OAuth 2 bearer tokens (KIP-255) from an OpenID Connect token endpoint (`sasl.oauthbearer.*`).
    #[serde(rename = "OAUTHBEARER")]
    OauthBearer,
    /// Kerberos (`sasl.kerberos.*`).
    #[serde(rename = "GSSAPI")]
    Gssapi,
}

impl SaslMechanism {
    /// The mechanism's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
            SaslMechanism::OauthBearer => "OAUTHBEARER",
            SaslMechanism::Gssapi => "GSSAPI",
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
    /// `sasl.oauthbearer.*`, for `sasl.mechanism = "OAUTHBEARER"`.
    #[serde(default)]
    pub oauthbearer: Option<OauthBearerSection>,
    /// `sasl.kerberos.*`, for `sasl.mechanism = "GSSAPI"`.
    #[serde(default)]
    pub kerberos: Option<KerberosSection>,
}

/// The `sasl.kerberos.*` keys, librdkafka's names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KerberosSection {
    /// `sasl.kerberos.service.name`: the brokers' service name (`kafka` unless set).
    #[serde(default)]
    pub service: Option<ServiceSection>,
    /// `sasl.kerberos.principal`: this client's principal (`name@REALM`); needed with a keytab.
    #[serde(default)]
    pub principal: Option<String>,
    /// `sasl.kerberos.keytab`: a keytab with the principal's key, from which tickets are obtained
    /// (and renewed) with `kinit`; without it, from the credential cache as it is.
    #[serde(default)]
    pub keytab: Option<PathBuf>,
}

/// `sasl.kerberos.service.*`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSection {
    /// `service.name`.
    pub name: String,
}

/// The brokers' Kerberos service name unless `sasl.kerberos.service.name` says otherwise.
pub const DEFAULT_KERBEROS_SERVICE: &str = "kafka";

/// The `sasl.oauthbearer.*` keys: OpenID Connect's client-credentials grant, librdkafka's names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OauthBearerSection {
    /// `sasl.oauthbearer.method`: `oidc`, the only one offered (and the default here).
    #[serde(default)]
    pub method: Option<String>,
    /// `sasl.oauthbearer.client.*`.
    #[serde(default)]
    pub client: OauthClientSection,
    /// `sasl.oauthbearer.token.endpoint.url`.
    #[serde(default)]
    pub token: Option<TokenSection>,
    /// `sasl.oauthbearer.scope`: the scope asked for (space-separated), if the provider wants one.
    #[serde(default)]
    pub scope: Option<String>,
    /// `sasl.oauthbearer.extensions`: `key=value,...` sent to the broker with the token
    /// (SASL extensions, KIP-342; e.g. Confluent Cloud's `logicalCluster` and `identityPoolId`).
    #[serde(default)]
    pub extensions: Option<String>,
}

/// `sasl.oauthbearer.client.*`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OauthClientSection {
    /// `sasl.oauthbearer.client.id`.
    #[serde(default)]
    pub id: Option<String>,
    /// `sasl.oauthbearer.client.secret` (write `"${ENV_VAR}"`, not the secret).
    #[serde(default)]
    pub secret: Option<Secret>,
    /// A file holding the client secret (e.g. a mounted Kubernetes Secret).
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
}

/// `sasl.oauthbearer.token.*`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSection {
    /// `token.endpoint.*`.
    pub endpoint: UrlSection,
}

/// `*.url`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UrlSection {
    /// An `http://` or `https://` URL.
    pub url: String,
}

/// The `https.*` keys: how HTTPS endpoints other than the brokers (the OAUTHBEARER token
/// endpoint) are trusted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpsSection {
    /// `https.ca.location`: CA certificates (PEM) that sign the token endpoint's certificate;
    /// without it, the system's trust store.
    #[serde(default)]
    pub ca: Option<Location>,
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
    /// `https.*`.
    #[serde(default)]
    pub https: HttpsSection,
}

/// Whether a librdkafka property belongs to the security settings (and must be set there, so
/// that every client of the job gets it, the wire-protocol client included).
pub fn is_security_key(key: &str) -> bool {
    key == "security.protocol" || key.starts_with("sasl.") || key.starts_with("ssl.") || key.starts_with("https.")
}

/// librdkafka properties that turn off a check the job's clients make: never set.
const INSECURE_KEYS: &[&str] = &[
    "enable.ssl.certificate.verification",
    "enable.sasl.oauthbearer.unsecure.jwt",
];

/// Why `key` may not be among a client's further librdkafka properties (`client.*` of a source
/// or sink), or `None` when it may: security settings go with the others (every client of the
/// job gets them, the wire-protocol client too), and a check no client may skip (the brokers'
/// certificates, signed tokens) has no switch.
pub fn refused_client_key(key: &str) -> Option<String> {
    if INSECURE_KEYS.contains(&key) {
        return Some(format!(
            "client.{key} would turn off a check the job's clients make (brokers' certificates, signed tokens): it cannot be set; trust a private CA with ssl.ca.location in the security settings (a job file's [kafka] section)"
        ));
    }
    if is_security_key(key) {
        return Some(format!(
            "client.{key} is a security setting: put it with the others (a job file's [kafka] section), so that every client gets it"
        ));
    }
    None
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

    /// `bootstrap` secured as `security` says (a `--kafka-config` file, say); plaintext without.
    pub fn with_security(bootstrap: impl Into<String>, security: Option<&KafkaSecurity>) -> Self {
        Self::new(bootstrap, security.cloned().unwrap_or_default())
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

/// Whether `p` is a Kerberos principal `name[/instance]@REALM` of letters, digits, '.', '_' and
/// '-' (what a shell command may carry unquoted).
fn kerberos_principal(p: &str) -> bool {
    let part = |s: &str| {
        !s.is_empty()
            && !s.starts_with('-')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    match p.split_once('@') {
        Some((name, realm)) => part(realm) && name.split('/').all(part),
        None => false,
    }
}

/// The broker's or librdkafka's error code of `e`, a transactional API's error included.
pub fn error_code(e: &rdkafka::error::KafkaError) -> Option<rdkafka::types::RDKafkaErrorCode> {
    match e {
        rdkafka::error::KafkaError::Transaction(t) => Some(t.code()),
        other => other.rdkafka_error_code(),
    }
}

/// Whether a Kafka client error says the cluster cannot be reached *now* — brokers down, a
/// connection refused or lost, a request timed out, a coordinator or leader moving — rather than
/// that something is wrong with the job (an address that does not resolve, refused credentials,
/// a missing topic, an invalid state): what a connector reports as `ErrorClass::Retriable`, so
/// that a job that ran before waits for the cluster instead of counting failed starts.
pub fn unreachable(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    if let rdkafka::error::KafkaError::Transaction(t) = e {
        if t.is_retriable() {
            return true;
        }
    }
    matches!(
        error_code(e),
        Some(
            C::AllBrokersDown
                | C::BrokerTransportFailure
                | C::BrokerNotAvailable
                | C::NetworkException
                | C::RequestTimedOut
                | C::OperationTimedOut
                | C::MessageTimedOut
                | C::TimedOutQueue
                | C::CoordinatorNotAvailable
                | C::NotCoordinator
                | C::CoordinatorLoadInProgress
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
                | C::NotEnoughReplicas
                | C::NotEnoughReplicasAfterAppend
        )
    )
}

/// The start of every librdkafka client configuration: the bootstrap servers, the security
/// settings, and the reconnection backoff. Callers add what their client needs.
pub fn client_config(bootstrap_servers: &str, security: &KafkaSecurity) -> Result<ClientConfig, String> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap_servers);
    c.set(
        "reconnect.backoff.max.ms",
        RECONNECT_BACKOFF_MAX.as_millis().to_string(),
    );
    // No client creates topics: librdkafka lets a producer's (and an admin client's) metadata
    // request create a missing topic on a broker with `auto.create.topics.enable` (Kafka's
    // default), so a misspelled output topic would be made with the broker's defaults and written.
    c.set("allow.auto.create.topics", "false");
    security.apply(&mut c)?;
    // librdkafka quotes the value of a property it refuses ("... not supported in this build:
    // ... sasl.oauthbearer.client.secret <the secret>"), and callers print the errors of the
    // clients they create: the security settings are tried here, where the message can leave
    // the value out.
    c.create_native_config().map_err(|e| match e {
        rdkafka::error::KafkaError::ClientConfig(_, desc, key, _) => format!("{key}: {desc}"),
        e => e.to_string(),
    })?;
    Ok(c)
}

#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;
