//! Connections of the wire-protocol client, secured like librdkafka's: TCP, then TLS (rustls;
//! the CA of `ssl.ca.location` or the system's trust store; a client certificate for mutual TLS)
//! when the protocol says so, then SASL (SaslHandshake and SaslAuthenticate, the mechanism run by
//! the `rsasl` crate) when it says so. Requests are framed here; the `kafka-protocol` crate encodes
//! them.

use std::io::Cursor;
use std::pin::Pin;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use bytes::{Buf, BufMut, BytesMut};
use kafka_protocol::messages::{
    sasl_authenticate_request::SaslAuthenticateRequest, sasl_handshake_request::SaslHandshakeRequest, ApiKey,
    RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

pub use crate::error::WireError;
use crate::KafkaSecurity;
pub use metadata::{check, topic_access, TopicAccess, TopicIds};

mod metadata;

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One connection to one broker, authenticated as the security settings say.
pub struct Connection {
    addr: String,
    stream: Pin<Box<dyn Stream>>,
    correlation: AtomicI32,
    client_id: &'static str,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("addr", &self.addr).finish()
    }
}

/// Builds rustls' client configuration from the `ssl.*` settings.
fn tls_config(security: &KafkaSecurity) -> Result<rustls::ClientConfig, WireError> {
    let cfg = |e: String| WireError::Config(e);
    let mut roots = rustls::RootCertStore::empty();
    match &security.ssl.ca {
        Some(ca) => {
            let certs = CertificateDer::pem_file_iter(&ca.location)
                .map_err(|e| cfg(format!("ssl.ca.location {}: {e}", ca.location.display())))?;
            for cert in certs {
                let cert = cert.map_err(|e| cfg(format!("ssl.ca.location {}: {e}", ca.location.display())))?;
                roots
                    .add(cert)
                    .map_err(|e| cfg(format!("ssl.ca.location {}: {e}", ca.location.display())))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| cfg(e.to_string()))?;
    let builder = if security.verify_host_name() {
        builder.with_root_certificates(roots)
    } else {
        // ssl.endpoint.identification.algorithm = "none": the chain is verified, the host name
        // is not (as librdkafka does).
        let inner = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .map_err(|e| cfg(format!("ssl.ca.location: {e}")))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoHostName { inner }))
    };
    match (&security.ssl.certificate, &security.ssl.key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(&cert.location)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| cfg(format!("ssl.certificate.location {}: {e}", cert.location.display())))?;
            let key_der = PrivateKeyDer::from_pem_file(&key.location).map_err(|e| {
                cfg(format!(
                    "ssl.key.location {}: {e} (the recovery client needs an unencrypted PKCS#8, PKCS#1 or SEC1 key)",
                    key.location.display()
                ))
            })?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| cfg(format!("ssl.certificate.location / ssl.key.location: {e}")))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// Verifies the certificate chain but not the host name.
#[derive(Debug)]
struct NoHostName {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
}

impl rustls::client::danger::ServerCertVerifier for NoHostName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            other => other,
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Runs `f`, which blocks, inside `block_in_place` where the runtime allows it (a multi-thread
/// runtime), so that the worker's other tasks move to another thread meanwhile.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi_thread {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

/// Opens a connection to `addr` (`host:port`), with TLS and SASL as `security` says.
pub async fn connect(addr: &str, security: &KafkaSecurity, client_id: &'static str) -> Result<Connection, WireError> {
    match connect_once(addr, security, client_id).await {
        // The broker refused an OAUTHBEARER token (one kept from earlier may have been revoked,
        // or signed with a key the provider has since rotated out): it was forgotten, so one
        // more connection goes with a token fetched now before the refusal counts.
        Err(WireError::Authentication { addr: refused_by, .. })
            if security.sasl.mechanism == Some(crate::SaslMechanism::OauthBearer) && refused_by == addr =>
        {
            connect_once(addr, security, client_id).await
        }
        other => other,
    }
}

async fn connect_once(addr: &str, security: &KafkaSecurity, client_id: &'static str) -> Result<Connection, WireError> {
    let transport = |what: String| WireError::Transport {
        addr: addr.to_owned(),
        what,
    };
    let tcp = TcpStream::connect(addr).await.map_err(|e| transport(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let stream: Pin<Box<dyn Stream>> = if security.protocol().tls() {
        let config = tls_config(security)?;
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_owned()).map_err(|e| transport(format!("server name {host}: {e}")))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| io_error(addr, "TLS handshake", e))?;
        Box::pin(tls)
    } else {
        Box::pin(tcp)
    };
    let mut conn = Connection {
        addr: addr.to_owned(),
        stream,
        correlation: AtomicI32::new(1),
        client_id,
    };
    if security.protocol().sasl() {
        conn.authenticate(security).await?;
    }
    Ok(conn)
}

/// An I/O error of a TLS connection about certificates (ours refused, theirs untrusted) is a
/// [`WireError::Certificate`]; with TLS 1.3 the broker's refusal of a missing or unknown client
/// certificate arrives with the first response, so requests classify their errors too.
fn io_error(addr: &str, doing: &str, e: std::io::Error) -> WireError {
    let certificate = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|r| {
            matches!(
                r,
                rustls::Error::InvalidCertificate(_)
                    | rustls::Error::AlertReceived(
                        rustls::AlertDescription::BadCertificate
                            | rustls::AlertDescription::CertificateRequired
                            | rustls::AlertDescription::UnknownCA
                            | rustls::AlertDescription::CertificateUnknown
                    )
            )
        });
    if certificate {
        WireError::Certificate {
            addr: addr.to_owned(),
            what: format!(
                "{e} (is ssl.ca.location the CA that signed the broker's certificate? does the listener require a client certificate: ssl.certificate.location and ssl.key.location?)"
            ),
        }
    } else {
        WireError::Transport {
            addr: addr.to_owned(),
            what: format!("{doing}: {e}"),
        }
    }
}

impl Connection {
    /// The broker this connection reaches.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends `req` at `version` and reads its response.
    pub async fn request<R: Request>(&mut self, req: &R, version: i16) -> Result<R::Response, WireError> {
        let addr = self.addr.clone();
        let proto = |what: String| WireError::Protocol {
            addr: addr.clone(),
            what,
        };
        let io = |e: std::io::Error| io_error(&addr, "request", e);
        let api = ApiKey::try_from(R::KEY).map_err(|()| proto(format!("unknown api key {}", R::KEY)))?;
        let correlation_id = self.correlation.fetch_add(1, Ordering::Relaxed);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str(self.client_id)));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, api.request_header_version(version))
            .map_err(|e| proto(format!("encoding api {}: {e}", R::KEY)))?;
        req.encode(&mut body, version)
            .map_err(|e| proto(format!("encoding api {}: {e}", R::KEY)))?;
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_i32(body.len() as i32);
        frame.extend_from_slice(&body);
        self.stream.write_all(&frame).await.map_err(io)?;
        self.stream.flush().await.map_err(io)?;
        let len = self.stream.read_i32().await.map_err(io)?;
        if !(0..=64 * 1024 * 1024).contains(&len) {
            return Err(proto(format!("implausible response size {len}")));
        }
        let mut resp = vec![0u8; len as usize];
        self.stream.read_exact(&mut resp).await.map_err(io)?;
        let mut buf = bytes::Bytes::from(resp);
        let rh = ResponseHeader::decode(&mut buf, api.response_header_version(version))
            .map_err(|e| proto(format!("decoding api {}: {e}", R::KEY)))?;
        if rh.correlation_id != correlation_id {
            return Err(proto("correlation id mismatch".into()));
        }
        let decoded =
            R::Response::decode(&mut buf, version).map_err(|e| proto(format!("decoding api {}: {e}", R::KEY)))?;
        if buf.has_remaining() {
            tracing::debug!(api = R::KEY, left = buf.remaining(), "Response had trailing bytes.");
        }
        Ok(decoded)
    }

    /// SaslHandshake (v1), then SaslAuthenticate (v2) rounds driven by rsasl's mechanism.
    async fn authenticate(&mut self, security: &KafkaSecurity) -> Result<(), WireError> {
        let addr = self.addr.clone();
        let failed = |what: String| WireError::Authentication {
            addr: addr.clone(),
            what,
        };
        let mechanism = security
            .sasl
            .mechanism
            .ok_or_else(|| WireError::Config("sasl.mechanism is not set".into()))?;
        let handshake = self
            .request(
                &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism.name())),
                1,
            )
            .await?;
        if handshake.error_code != 0 {
            let enabled: Vec<String> = handshake.mechanisms.iter().map(|m| m.to_string()).collect();
            return Err(failed(format!(
                "the broker does not enable {} on this listener (enabled: {}; error code {})",
                mechanism.name(),
                enabled.join(", "),
                handshake.error_code
            )));
        }
        if mechanism == crate::SaslMechanism::OauthBearer {
            return self.authenticate_oauthbearer(security).await;
        }
        if mechanism == crate::SaslMechanism::Gssapi {
            return self.authenticate_gssapi(security).await;
        }
        let password = security.password().map_err(WireError::Config)?;
        let config = rsasl::prelude::SASLConfig::with_credentials(
            None,
            security.sasl.username.clone().unwrap_or_default(),
            password.expose().to_owned(),
        )
        .map_err(|e| WireError::Config(format!("SASL: {e}")))?;
        let name = rsasl::prelude::Mechname::parse(mechanism.name().as_bytes())
            .map_err(|e| WireError::Config(format!("SASL mechanism: {e}")))?;
        let mut session = rsasl::prelude::SASLClient::new(config)
            .start_suggested(&[name])
            .map_err(|e| WireError::Config(format!("SASL mechanism {}: {e}", mechanism.name())))?;
        let mut input: Option<Vec<u8>> = None;
        loop {
            let mut out = Cursor::new(Vec::new());
            let state = session
                .step(input.as_deref(), &mut out)
                .map_err(|e| failed(format!("{}: {e}", mechanism.name())))?;
            let finished = matches!(state, rsasl::prelude::State::Finished(_));
            let sent_nothing = matches!(state, rsasl::prelude::State::Finished(rsasl::prelude::MessageSent::No));
            if finished && sent_nothing {
                return Ok(());
            }
            let resp = self
                .request(
                    &SaslAuthenticateRequest::default().with_auth_bytes(bytes::Bytes::from(out.into_inner())),
                    2,
                )
                .await?;
            if resp.error_code != 0 {
                let msg = resp.error_message.map(|m| m.to_string()).unwrap_or_default();
                return Err(failed(format!("{msg} (error code {})", resp.error_code)));
            }
            if finished {
                return Ok(());
            }
            input = Some(resp.auth_bytes.to_vec());
        }
    }

    /// GSSAPI (RFC 4752): tickets from the keytab if one is configured ([`crate::kerberos`]),
    /// then the security context's tokens and the security-layer answer, each in a
    /// SaslAuthenticate round. The GSS-API calls block (the first asks the KDC for the broker's
    /// service ticket): off the async worker where the runtime allows it.
    ///
    /// A `kinit` that failed is not the end: tickets obtained before (by this client or by
    /// librdkafka's clients, into the same cache) may still be valid, as they are when a KDC is
    /// briefly down. Only when the context cannot be established either is it an error, naming
    /// both; one that says no KDC answered is a transport error (retried, as a broker that does
    /// not answer), any other an authentication error (the job stops).
    async fn authenticate_gssapi(&mut self, security: &KafkaSecurity) -> Result<(), WireError> {
        let addr = self.addr.clone();
        let kinit = crate::kerberos::ensure_tickets(security).await.err();
        if let Some(f) = &kinit {
            tracing::warn!(broker = %addr, error = %f.message, "Kerberos: kinit failed; trying the tickets in the credential cache.");
        }
        let failed = |what: String| {
            let (what, unreachable) = match &kinit {
                Some(f) => (format!("{}; with the cached tickets: {what}", f.message), f.unreachable),
                None => {
                    let unreachable = crate::kerberos::kdc_unreachable(&what);
                    (what, unreachable)
                }
            };
            if unreachable {
                WireError::Transport {
                    addr: addr.clone(),
                    what: format!("GSSAPI: {what}"),
                }
            } else {
                WireError::Authentication {
                    addr: addr.clone(),
                    what: format!("GSSAPI: {what}"),
                }
            }
        };
        let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let service = security.kerberos_service();
        let mut gss = blocking(|| crate::kerberos::Gssapi::new(service, host)).map_err(&failed)?;
        let mut challenge: Option<Vec<u8>> = None;
        loop {
            let (message, last) = blocking(|| gss.step(challenge.as_deref())).map_err(&failed)?;
            let resp = self
                .request(
                    &SaslAuthenticateRequest::default().with_auth_bytes(bytes::Bytes::from(message)),
                    2,
                )
                .await?;
            if resp.error_code != 0 {
                let msg = resp.error_message.map(|m| m.to_string()).unwrap_or_default();
                return Err(failed(format!("{msg} (error code {})", resp.error_code)));
            }
            if last {
                return Ok(());
            }
            challenge = Some(resp.auth_bytes.to_vec());
        }
    }

    /// OAUTHBEARER (RFC 7628, KIP-255): one message with a token from the provider
    /// ([`crate::oauth`]). rsasl's client is not used here: on the broker's error challenge it
    /// reports the exchange finished without sending the `%x01` the broker waits for. A refused
    /// token is forgotten, so the next connection asks the provider for a new one.
    async fn authenticate_oauthbearer(&mut self, security: &KafkaSecurity) -> Result<(), WireError> {
        let token = crate::oauth::token(security).await?;
        let extensions = security.oauth_extensions().map_err(WireError::Config)?;
        let first = crate::oauth::initial_response(&token, &extensions);
        let resp = self
            .request(
                &SaslAuthenticateRequest::default().with_auth_bytes(bytes::Bytes::from(first)),
                2,
            )
            .await?;
        let addr = self.addr.clone();
        let refused = |what: String| {
            crate::oauth::forget(security);
            Err(WireError::Authentication {
                addr: addr.clone(),
                what: format!("OAUTHBEARER: {what}"),
            })
        };
        if resp.error_code != 0 {
            let msg = resp.error_message.map(|m| m.to_string()).unwrap_or_default();
            return refused(format!("{msg} (error code {})", resp.error_code));
        }
        if resp.auth_bytes.is_empty() {
            return Ok(());
        }
        // The broker's error (a JSON status, RFC 7628 3.2.2); it answers %x01 with the failure.
        let challenge = String::from_utf8_lossy(&resp.auth_bytes).into_owned();
        let last = self
            .request(
                &SaslAuthenticateRequest::default().with_auth_bytes(bytes::Bytes::from_static(b"\x01")),
                2,
            )
            .await?;
        let msg = last.error_message.map(|m| m.to_string()).unwrap_or_default();
        let detail = if msg.is_empty() || msg == challenge {
            String::new()
        } else {
            format!(" {msg}")
        };
        refused(format!(
            "the broker refused the token: {challenge}{detail} (error code {})",
            last.error_code
        ))
    }
}
