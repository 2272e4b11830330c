//! TLS for the product's HTTPS clients (ureq on rustls with ring): the OAUTHBEARER token requests
//! of the wire client and the `exactly` commands' admin client trust the CA certificates of one
//! PEM file, or else the system's trust store; the admin client may present a certificate of its
//! own ([`client_identity`], for an endpoint that asks for one). [`pem_certificates`] also reads
//! the admin endpoint's certificate chain and the CA it verifies clients with.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// The certificates of a PEM file (`setting` names where it was given, for errors); none is an
/// error.
pub fn pem_certificates(path: &Path, setting: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{setting} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{setting} {}: no certificate in it (expected PEM)",
            path.display()
        ));
    }
    Ok(certs)
}

/// A client certificate chain and its private key (PEM files; `setting` names where they were
/// given, for errors), for a server that asks for one (mutual TLS).
pub fn client_identity(cert: &Path, key: &Path, setting: &str) -> Result<ureq::tls::ClientCert, String> {
    let chain: Vec<ureq::tls::Certificate<'static>> = pem_certificates(cert, setting)?
        .iter()
        .map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned())
        .collect();
    let pem = std::fs::read(key).map_err(|e| format!("{setting} {}: {e}", key.display()))?;
    let key = ureq::tls::PrivateKey::from_pem(&pem).map_err(|e| {
        format!(
            "{setting} {}: {e} (expected an unencrypted PKCS#8, PKCS#1 or SEC1 key in PEM)",
            key.display()
        )
    })?;
    Ok(ureq::tls::ClientCert::new_with_certs(&chain, key))
}

/// ureq's TLS settings trusting the certificates of `ca` (a PEM file; `setting` names where it
/// was given, for errors) or, without one, the system's store; presenting `identity` when the
/// server asks for a certificate.
pub fn client_tls(
    ca: Option<&Path>,
    setting: &str,
    identity: Option<ureq::tls::ClientCert>,
) -> Result<ureq::tls::TlsConfig, String> {
    let roots = match ca {
        Some(path) => pem_certificates(path, setting)?,
        None => rustls_native_certs::load_native_certs().certs,
    };
    let roots: Vec<ureq::tls::Certificate<'static>> = roots
        .iter()
        .map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned())
        .collect();
    Ok(ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .root_certs(ureq::tls::RootCerts::new_with_certs(&roots))
        .client_cert(identity)
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .build())
}
