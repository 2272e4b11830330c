//! What the security settings mean for librdkafka: their checks (`validate`) and the client
//! properties each client of a job gets from them.

use exactly_core::secret::Secret;
use rdkafka::ClientConfig;

use crate::{kerberos, kerberos_principal, KafkaSecurity, SaslMechanism, SecurityProtocol, DEFAULT_KERBEROS_SERVICE};

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
