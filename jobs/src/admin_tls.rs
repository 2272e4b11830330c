//! The admin endpoint's HTTPS: its certificate and the client CA and CRLs, read again when their
//! files change (the endpoint itself, with its connections, is the `exactly` command's).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Result};
use tracing::{info, warn};

/// Who may present which client certificates to the admin endpoint (mutual TLS).
#[derive(Debug, Clone, Copy)]
pub struct ClientAuth<'a> {
    /// CA certificates (PEM): a client certificate must chain to one of them.
    pub ca: &'a Path,
    /// Certificate revocation lists (PEM) of those CAs, if any.
    pub crl: Option<&'a Path>,
}

/// The admin endpoint's TLS configuration from a PEM certificate chain and its private key, and
/// with `client` asking clients for a certificate its CA signed and its CRL does not revoke; the
/// error names the file and what is wrong with it. The files are read again when they change
/// ([`Reloading`]: the certificate and [`ReloadingClientVerifier`]), so a renewed certificate (cert-manager, a
/// mounted Secret), a new CA bundle or a new CRL take effect without a restart.
pub fn server_tls(cert: &Path, key: &Path, client: Option<ClientAuth<'_>>) -> Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver = reloading_cert(cert, key, provider.clone())?;
    let builder =
        rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = match client {
        None => builder.with_no_client_auth(),
        Some(client) => builder.with_client_cert_verifier(Arc::new(ReloadingClientVerifier::new(client, provider)?)),
    };
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The certificate chain and key of `cert` and `key`, checked against each other.
fn certified_key(
    cert: &Path,
    key: &Path,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<Arc<rustls::sign::CertifiedKey>> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::PrivateKeyDer;
    let chain = exactly_kafka_client::https::pem_certificates(cert, "admin_tls_cert").map_err(anyhow::Error::msg)?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        anyhow::anyhow!(
            "admin_tls_key {}: {e} (expected an unencrypted PKCS#8, PKCS#1 or SEC1 key in PEM)",
            key.display()
        )
    })?;
    let certified = rustls::sign::CertifiedKey::from_der(chain, key_der, provider).map_err(|e| {
        anyhow::anyhow!(
            "admin_tls_cert {} with admin_tls_key {}: {e}",
            cert.display(),
            key.display()
        )
    })?;
    Ok(Arc::new(certified))
}

/// How often a handshake looks whether the certificate files changed.
const CERT_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The files' (modification time, size), followed through symbolic links as Kubernetes swaps a
/// mounted Secret's; `None` while one is missing.
fn file_stamps(files: &[PathBuf]) -> Option<Vec<(std::time::SystemTime, u64)>> {
    files
        .iter()
        .map(|f| {
            let m = std::fs::metadata(f).ok()?;
            Some((m.modified().ok()?, m.len()))
        })
        .collect()
}

/// A value loaded from files and loaded again when one of them changes (its modification time or
/// size): looked at when the value is asked for, during a handshake, at most once a second, and
/// not while a file is missing. Files that do not load (a half-written renewal, a key of another
/// certificate) are logged and the previous value kept; they are tried again at the next change.
struct Reloading<T> {
    files: Vec<PathBuf>,
    /// What the files hold, for the log ("certificate", "client CA or CRL").
    what: &'static str,
    load: Box<dyn Fn() -> Result<T> + Send + Sync>,
    state: std::sync::Mutex<ReloadState<T>>,
}

struct ReloadState<T> {
    current: T,
    /// The files' stamps when last read.
    seen: Option<Vec<(std::time::SystemTime, u64)>>,
    checked: std::time::Instant,
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading").field("files", &self.files).finish()
    }
}

impl<T: Clone> Reloading<T> {
    fn new(
        files: Vec<PathBuf>,
        what: &'static str,
        load: impl Fn() -> Result<T> + Send + Sync + 'static,
    ) -> Result<Self> {
        let seen = file_stamps(&files);
        let current = load()?;
        Ok(Reloading {
            files,
            what,
            load: Box::new(load),
            state: std::sync::Mutex::new(ReloadState {
                current,
                seen,
                checked: std::time::Instant::now(),
            }),
        })
    }

    /// The value of the files as they are now (read again if they changed).
    fn current(&self) -> T {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.checked.elapsed() >= CERT_CHECK_INTERVAL {
            state.checked = std::time::Instant::now();
            let now = file_stamps(&self.files);
            if now.is_some() && now != state.seen {
                state.seen = now;
                match (self.load)() {
                    Ok(v) => {
                        info!(file = %self.files[0].display(), "The admin endpoint's {} changed on disk; using the new one.", self.what);
                        state.current = v;
                    }
                    Err(e) => warn!(
                        error = %format!("{e:#}"),
                        "The admin endpoint's {} files changed but do not load; using the previous one until they change again.",
                        self.what
                    ),
                }
            }
        }
        state.current.clone()
    }
}

/// Serves the certificate of two PEM files, renewed on disk without a restart.
fn reloading_cert(
    cert: &Path,
    key: &Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Reloading<Arc<rustls::sign::CertifiedKey>>> {
    let (c, k) = (cert.to_owned(), key.to_owned());
    Reloading::new(vec![cert.to_owned(), key.to_owned()], "certificate", move || {
        certified_key(&c, &k, &provider)
    })
}

impl rustls::server::ResolvesServerCert for Reloading<Arc<rustls::sign::CertifiedKey>> {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.current())
    }
}

/// Checks client certificates against the CA certificates and CRLs of two files, read again when
/// either changes ([`Reloading`], looked at during a handshake that presents a certificate). A
/// client without a certificate completes the handshake (a probe's `GET /healthz`) and `guard`
/// refuses it everything else; a certificate the CA did not sign, or one its CRL revokes, ends
/// the handshake.
///
/// A CRL is trusted until its `nextUpdate` only, as OpenSSL, Java's PKIX and nginx trust one: a
/// CRL that has expired at start is refused (naming the file and the time); one that expires while
/// the endpoint runs ends every handshake that presents a certificate of its CA (logged, naming
/// the file) until a newer CRL replaces the file. A revocation published after an expired CRL is
/// unknown, so passing those certificates would be a guess.
#[derive(Debug)]
struct ReloadingClientVerifier {
    verifier: Reloading<ClientChecks>,
    crl: Option<PathBuf>,
    provider: Arc<rustls::crypto::CryptoProvider>,
    /// When a refusal for an expired CRL was last logged (at most one line a minute).
    expired_logged: std::sync::Mutex<Option<std::time::Instant>>,
}

/// The client-certificate verifier of one reading of the files, and when its CRLs expire.
#[derive(Clone)]
struct ClientChecks {
    verifier: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    /// The earliest `nextUpdate` of the CRLs (none without CRLs).
    crl_expires: Option<std::time::SystemTime>,
}

/// How long before a CRL expires its loading is logged as a warning.
const CRL_EXPIRY_WARNING: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl ReloadingClientVerifier {
    fn new(client: ClientAuth<'_>, provider: Arc<rustls::crypto::CryptoProvider>) -> Result<Self> {
        let (ca, crl, p) = (client.ca.to_owned(), client.crl.map(Path::to_owned), provider.clone());
        let files = std::iter::once(ca.clone()).chain(crl.clone()).collect();
        let crl_file = crl.clone();
        let verifier = Reloading::new(files, "client CA or CRL", move || Self::load(&ca, crl.as_deref(), &p))?;
        if let (Some(file), Some(expires)) = (&crl_file, verifier.current().crl_expires) {
            if expires <= std::time::SystemTime::now() {
                bail!(
                    "admin_tls_client_crl {}: the certificate revocation list expired at {} (its nextUpdate); a CRL past its next update is not trusted: publish a newer one from the CA (replacing the file later takes effect without a restart)",
                    file.display(),
                    humantime::format_rfc3339_seconds(expires)
                );
            }
        }
        Ok(ReloadingClientVerifier {
            verifier,
            crl: crl_file,
            provider,
            expired_logged: std::sync::Mutex::new(None),
        })
    }

    fn load(ca: &Path, crl: Option<&Path>, provider: &Arc<rustls::crypto::CryptoProvider>) -> Result<ClientChecks> {
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for c in exactly_kafka_client::https::pem_certificates(ca, "admin_tls_client_ca").map_err(anyhow::Error::msg)? {
            roots
                .add(c)
                .map_err(|e| anyhow::anyhow!("admin_tls_client_ca {}: {e}", ca.display()))?;
        }
        let mut builder =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .allow_unauthenticated();
        let mut crl_expires = None;
        if let Some(crl) = crl {
            let lists = rustls_pki_types::CertificateRevocationListDer::pem_file_iter(crl)
                .and_then(|i| i.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| anyhow::anyhow!("admin_tls_client_crl {}: {e}", crl.display()))?;
            if lists.is_empty() {
                bail!(
                    "admin_tls_client_crl {}: no certificate revocation list in it (expected PEM: X509 CRL)",
                    crl.display()
                );
            }
            for list in &lists {
                let next = crl_next_update(list)
                    .map_err(|e| anyhow::anyhow!("admin_tls_client_crl {}: {e}", crl.display()))?;
                crl_expires = Some(crl_expires.map_or(next, |t: std::time::SystemTime| t.min(next)));
            }
            if let Some(expires) = crl_expires {
                let left = expires.duration_since(std::time::SystemTime::now());
                if left.is_ok_and(|left| left < CRL_EXPIRY_WARNING) {
                    warn!(
                        file = %crl.display(),
                        next_update = %humantime::format_rfc3339_seconds(expires),
                        "The admin endpoint's client CRL expires within a day; from then on every client certificate of its CA is refused until a newer CRL replaces the file."
                    );
                }
            }
            builder = builder.with_crls(lists).enforce_revocation_expiration();
        }
        let verifier = builder.build().map_err(|e| {
            let (setting, file) = match crl {
                Some(crl) if matches!(e, rustls::server::VerifierBuilderError::InvalidCrl(_)) => {
                    ("admin_tls_client_crl", crl)
                }
                _ => ("admin_tls_client_ca", ca),
            };
            anyhow::anyhow!("{setting} {}: {e}", file.display())
        })?;
        Ok(ClientChecks { verifier, crl_expires })
    }

    /// Logs (at most once a minute) that a handshake was refused because the CRL expired.
    fn log_expired(&self, error: &rustls::Error) {
        use rustls::CertificateError::{ExpiredRevocationList, ExpiredRevocationListContext};
        let next_update = match error {
            rustls::Error::InvalidCertificate(ExpiredRevocationListContext { next_update, .. }) => Some(
                humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(next_update.as_secs()),
                )
                .to_string(),
            ),
            rustls::Error::InvalidCertificate(ExpiredRevocationList) => None,
            _ => return,
        };
        let mut logged = self.expired_logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(60)) {
            return;
        }
        *logged = Some(std::time::Instant::now());
        warn!(
            file = %self.crl.as_deref().map(Path::display).map(|d| d.to_string()).unwrap_or_default(),
            next_update = next_update.as_deref().unwrap_or("unknown"),
            "Refused a client certificate of the admin endpoint: its CA's CRL has expired (past its nextUpdate), so a revocation since is unknown. Replace admin_tls_client_crl with a newer CRL from the CA; it takes effect without a restart."
        );
    }
}

/// The `nextUpdate` of a CRL (webpki requires one, and reads it, but does not tell it).
fn crl_next_update(crl: &rustls_pki_types::CertificateRevocationListDer<'_>) -> Result<std::time::SystemTime> {
    use x509_cert::der::Decode;
    let list = x509_cert::crl::CertificateList::from_der(crl.as_ref())
        .map_err(|e| anyhow::anyhow!("not a readable X.509 CRL: {e}"))?;
    let next = list
        .tbs_cert_list
        .next_update
        .ok_or_else(|| anyhow::anyhow!("the CRL has no nextUpdate (a CRL without one cannot tell when it is stale)"))?;
    Ok(std::time::UNIX_EPOCH + next.to_unix_duration())
}

impl rustls::server::danger::ClientCertVerifier for ReloadingClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    /// No hints: the CA may change while the endpoint runs (clients then offer any certificate
    /// they hold; `exactly` commands hold one).
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &rustls_pki_types::CertificateDer<'_>,
        intermediates: &[rustls_pki_types::CertificateDer<'_>],
        now: rustls_pki_types::UnixTime,
    ) -> std::result::Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        let verified = self
            .verifier
            .current()
            .verifier
            .verify_client_cert(end_entity, intermediates, now);
        if let Err(e) = &verified {
            self.log_expired(e);
        }
        verified
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
