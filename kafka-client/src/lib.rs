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

pub mod https;
mod kerberos;
pub mod leader;
pub mod oauth;
pub mod outage;
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
                    "security.protocol {} needs sasl.mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or GSSAPI)",
                    p.name()
                )
            })?;
            if self.sasl.kerberos.is_some() && m != SaslMechanism::Gssapi {
                return Err(format!(
                    "sasl.kerberos.* is for sasl.mechanism GSSAPI, not {}",
                    m.name()
                ));
            }
            if m == SaslMechanism::OauthBearer {
                self.validate_oauthbearer()?;
            } else if m == SaslMechanism::Gssapi {
                self.validate_gssapi()?;
            } else {
                if self.sasl.oauthbearer.is_some() || self.https.ca.is_some() {
                    return Err(format!(
                        "sasl.oauthbearer.* and https.* are for sasl.mechanism OAUTHBEARER, not {}",
                        m.name()
                    ));
                }
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
            }
        } else if self.sasl.mechanism.is_some()
            || self.sasl.username.is_some()
            || self.sasl.oauthbearer.is_some()
            || self.sasl.kerberos.is_some()
            || self.https.ca.is_some()
        {
            return Err(format!(
                "sasl.* (or https.*) is set but security.protocol is {} (use SASL_SSL or SASL_PLAINTEXT)",
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
            ("https.ca.location", self.https.ca.as_ref().map(|l| &l.location)),
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

    /// The GSSAPI settings: no username, password or OAUTHBEARER keys; a keytab that can be read,
    /// with the principal whose key it holds.
    fn validate_gssapi(&self) -> Result<(), String> {
        if !cfg!(feature = "kerberos") {
            return Err(kerberos::LEFT_OUT.into());
        }
        if self.sasl.username.is_some() || self.sasl.password.is_some() || self.sasl.password_file.is_some() {
            return Err("sasl.mechanism GSSAPI authenticates with Kerberos tickets (sasl.kerberos.principal and sasl.kerberos.keytab), not sasl.username / sasl.password".into());
        }
        if self.sasl.oauthbearer.is_some() || self.https.ca.is_some() {
            return Err("sasl.oauthbearer.* and https.* are for sasl.mechanism OAUTHBEARER, not GSSAPI".into());
        }
        let k = self.sasl.kerberos.clone().unwrap_or_default();
        if let Some(s) = &k.service {
            if s.name.trim().is_empty() || s.name.contains(['/', '@']) {
                return Err(format!(
                    "sasl.kerberos.service.name {:?}: expected the brokers' service name alone (e.g. \"kafka\")",
                    s.name
                ));
            }
        }
        if let Some(p) = &k.principal {
            // librdkafka runs its kinit command through the shell (`system()`), with the principal
            // in it: only the principal grammar, nothing the shell would read.
            if !kerberos_principal(p) {
                return Err(format!(
                    "sasl.kerberos.principal {p:?}: expected name@REALM (or name/instance@REALM) of letters, digits, '.', '_' and '-'"
                ));
            }
        }
        if let Some(keytab) = &k.keytab {
            // Inside double quotes in the same command: nothing the shell would expand there.
            let path = keytab.to_string_lossy();
            if path.contains(['"', '$', '`', '\\', '\n', '\r']) {
                return Err(format!(
                    "sasl.kerberos.keytab {path:?}: a path with '\"', '$', '`', '\\' or a line break cannot be handed to kinit safely"
                ));
            }
            if k.principal.is_none() {
                return Err(
                    "sasl.kerberos.keytab needs sasl.kerberos.principal (the principal whose key it holds)".into(),
                );
            }
            std::fs::File::open(keytab).map_err(|e| format!("sasl.kerberos.keytab {}: {e}", keytab.display()))?;
        }
        Ok(())
    }

    /// `sasl.kerberos.service.name`, or `kafka`.
    pub fn kerberos_service(&self) -> &str {
        self.sasl
            .kerberos
            .as_ref()
            .and_then(|k| k.service.as_ref())
            .map_or(DEFAULT_KERBEROS_SERVICE, |s| s.name.as_str())
    }

    /// `sasl.kerberos.keytab` with `sasl.kerberos.principal`, when both are set.
    pub fn kerberos_keytab(&self) -> Option<(&std::path::Path, &str)> {
        let k = self.sasl.kerberos.as_ref()?;
        Some((k.keytab.as_deref()?, k.principal.as_deref()?))
    }

    /// The OAUTHBEARER settings: a client id, one client secret, an http(s) token endpoint,
    /// extensions that parse; no username or password.
    fn validate_oauthbearer(&self) -> Result<(), String> {
        if self.sasl.username.is_some() || self.sasl.password.is_some() || self.sasl.password_file.is_some() {
            return Err("sasl.mechanism OAUTHBEARER authenticates with sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret, not sasl.username / sasl.password".into());
        }
        let o = self.sasl.oauthbearer.as_ref().ok_or(
            "sasl.mechanism OAUTHBEARER needs sasl.oauthbearer.client.id, sasl.oauthbearer.client.secret (or .client.secret_file) and sasl.oauthbearer.token.endpoint.url",
        )?;
        if let Some(m) = o.method.as_deref() {
            if m != "oidc" {
                return Err(format!(
                    "sasl.oauthbearer.method {m:?}: only \"oidc\" is offered (tokens from the provider's token endpoint, client-credentials grant)"
                ));
            }
        }
        if o.client.id.as_deref().unwrap_or("").is_empty() {
            return Err("sasl.mechanism OAUTHBEARER needs sasl.oauthbearer.client.id".into());
        }
        match (&o.client.secret, &o.client.secret_file) {
            (Some(_), Some(_)) => {
                return Err("give sasl.oauthbearer.client.secret or sasl.oauthbearer.client.secret_file, not both".into())
            }
            (None, None) => return Err("sasl.mechanism OAUTHBEARER needs sasl.oauthbearer.client.secret (e.g. \"${KAFKA_CLIENT_SECRET}\") or sasl.oauthbearer.client.secret_file".into()),
            _ => {}
        }
        self.client_secret()?;
        let url = self
            .token_endpoint()
            .ok_or("sasl.mechanism OAUTHBEARER needs sasl.oauthbearer.token.endpoint.url")?;
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err(format!(
                "sasl.oauthbearer.token.endpoint.url {url:?}: expected an https:// (or http://) URL"
            ));
        }
        self.oauth_extensions()?;
        Ok(())
    }

    /// The OAUTHBEARER client secret, from `sasl.oauthbearer.client.secret` or `.client.secret_file`.
    pub fn client_secret(&self) -> Result<Secret, String> {
        let c = self.sasl.oauthbearer.as_ref().map(|o| &o.client);
        match (
            c.and_then(|c| c.secret.as_ref()),
            c.and_then(|c| c.secret_file.as_ref()),
        ) {
            (Some(s), _) => Ok(s.clone()),
            (None, Some(f)) => Secret::from_file(f).map_err(|e| format!("sasl.oauthbearer.client.secret_file: {e}")),
            (None, None) => Err("no sasl.oauthbearer.client.secret or sasl.oauthbearer.client.secret_file".into()),
        }
    }

    /// `sasl.oauthbearer.token.endpoint.url`.
    pub fn token_endpoint(&self) -> Option<&str> {
        self.sasl
            .oauthbearer
            .as_ref()
            .and_then(|o| o.token.as_ref())
            .map(|t| t.endpoint.url.as_str())
    }

    /// `sasl.oauthbearer.extensions` as pairs (`key=value,...`; `auth` is the token's own key).
    pub fn oauth_extensions(&self) -> Result<Vec<(String, String)>, String> {
        let Some(text) = self.sasl.oauthbearer.as_ref().and_then(|o| o.extensions.as_deref()) else {
            return Ok(Vec::new());
        };
        let mut pairs = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("sasl.oauthbearer.extensions: {item:?} is not key=value"))?;
            // RFC 7628: keys are letters; values printable ASCII (no control characters).
            if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphabetic()) || k == "auth" {
                return Err(format!(
                    "sasl.oauthbearer.extensions: key {k:?} must be letters only, and not \"auth\""
                ));
            }
            if v.bytes().any(|b| b.is_ascii_control() || !b.is_ascii()) {
                return Err(format!(
                    "sasl.oauthbearer.extensions: the value of {k} must be printable ASCII"
                ));
            }
            pairs.push((k.to_owned(), v.to_owned()));
        }
        Ok(pairs)
    }

    /// The SASL password, from `sasl.password` or `sasl.password_file`.
    pub fn password(&self) -> Result<Secret, String> {
        match (&self.sasl.password, &self.sasl.password_file) {
            (Some(p), _) => Ok(p.clone()),
            (None, Some(f)) => Secret::from_file(f).map_err(|e| format!("sasl.password_file: {e}")),
            (None, None) => Err("no sasl.password or sasl.password_file".into()),
        }
    }

    /// What these settings leave weaker than the defaults, one sentence each (logged at start and
    /// by `exactly check`): host names not checked against the brokers' certificates, a password
    /// or token sent in cleartext.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let p = self.protocol();
        if p.tls() && !self.verify_host_name() {
            out.push(
                "ssl.endpoint.identification.algorithm = \"none\": the brokers' host names are not checked against their certificates (any certificate the CA signed passes for any broker)".to_owned(),
            );
        }
        if self.sasl.mechanism == Some(SaslMechanism::OauthBearer) {
            if let Some(parsed) = self.token_endpoint().and_then(|u| url::Url::parse(u).ok()) {
                if parsed.scheme() == "http" && !exactly_core::net::url_is_loopback(parsed.as_str()) {
                    // Named without any credentials or query it may carry.
                    let shown = format!("http://{}{}", parsed.host_str().unwrap_or_default(), parsed.path());
                    out.push(format!(
                        "sasl.oauthbearer.token.endpoint.url ({shown}) is plain http:// to another host: the client secret and the tokens cross the network readable; use https://"
                    ));
                }
            }
        }
        if p.sasl() && !p.tls() {
            match self.sasl.mechanism {
                Some(SaslMechanism::Plain) => out.push(
                    "security.protocol = \"SASL_PLAINTEXT\" with sasl.mechanism = \"PLAIN\": the password travels in cleartext; use SASL_SSL".to_owned(),
                ),
                Some(SaslMechanism::OauthBearer) => out.push(
                    "security.protocol = \"SASL_PLAINTEXT\" with sasl.mechanism = \"OAUTHBEARER\": the token travels in cleartext; use SASL_SSL".to_owned(),
                ),
                _ => {}
            }
        }
        out
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
            if m == SaslMechanism::OauthBearer {
                // librdkafka's own OIDC: it fetches the token and refreshes it (at 80 % of its
                // lifetime) on its background thread, whatever the application polls.
                let o = self.sasl.oauthbearer.as_ref().ok_or("sasl.oauthbearer.* is not set")?;
                c.set("sasl.oauthbearer.method", "oidc");
                c.set("sasl.oauthbearer.client.id", o.client.id.clone().unwrap_or_default());
                c.set("sasl.oauthbearer.client.secret", self.client_secret()?.expose());
                c.set(
                    "sasl.oauthbearer.token.endpoint.url",
                    self.token_endpoint()
                        .ok_or("sasl.oauthbearer.token.endpoint.url is not set")?,
                );
                if let Some(scope) = &o.scope {
                    c.set("sasl.oauthbearer.scope", scope);
                }
                let extensions = self.oauth_extensions()?;
                if !extensions.is_empty() {
                    let text: Vec<String> = extensions.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    c.set("sasl.oauthbearer.extensions", text.join(","));
                }
                if let Some(ca) = &self.https.ca {
                    c.set("https.ca.location", ca.location.display().to_string());
                }
            } else if m == SaslMechanism::Gssapi {
                if !cfg!(feature = "kerberos") {
                    return Err(kerberos::LEFT_OUT.into());
                }
                c.set("sasl.kerberos.service.name", self.kerberos_service());
                let k = self.sasl.kerberos.clone().unwrap_or_default();
                if let Some(p) = &k.principal {
                    c.set("sasl.kerberos.principal", p);
                }
                match &k.keytab {
                    // librdkafka's kinit command (`kinit -R -t KEYTAB -k PRINCIPAL || kinit -t
                    // KEYTAB -k PRINCIPAL`) at the client's start and every minute after.
                    Some(keytab) => {
                        c.set("sasl.kerberos.keytab", keytab.display().to_string());
                    }
                    // Tickets the operator obtained: librdkafka's kinit, which needs a keytab,
                    // would only fail every minute.
                    None => {
                        c.set("sasl.kerberos.min.time.before.relogin", "0");
                    }
                }
            } else {
                c.set("sasl.username", self.sasl.username.clone().unwrap_or_default());
                c.set("sasl.password", self.password()?.expose());
            }
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
    let code = match e {
        rdkafka::error::KafkaError::Transaction(t) => Some(t.code()),
        other => other.rdkafka_error_code(),
    };
    matches!(
        code,
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
