//! TLS for the product's HTTPS clients (ureq on rustls with ring): the OAUTHBEARER token requests
//! of the wire client and the `exactly` commands' admin client trust the CA certificates of one
//! PEM file, or else the system's trust store. [`pem_certificates`] also reads the admin
//! endpoint's certificate chain.

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

/// ureq's TLS settings trusting the certificates of `ca` (a PEM file; `setting` names where it
/// was given, for errors) or, without one, the system's store.
pub fn client_tls(ca: Option<&Path>, setting: &str) -> Result<ureq::tls::TlsConfig, String> {
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
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .build())
}
