//! OAUTHBEARER tokens for the wire-protocol client. librdkafka's clients fetch their own (its
//! OIDC support); the wire client asks the same token endpoint the same way — OpenID Connect's
//! client-credentials grant, the client id and secret in an HTTP Basic header as librdkafka sends
//! them, the scope when one is set — and keeps the token for the process until 80 % of its
//! lifetime has passed (librdkafka's refresh point), so a job's many wire connections do not ask
//! the provider each time. A token the broker refuses is forgotten ([`forget`]): the next
//! connection asks for a new one.
//!
//! # Design notes
//!
//! Why this part is built as it is, with the measurements and failures that shaped it.
//!
//! OAUTHBEARER: librdkafka's clients get `sasl.oauthbearer.method = oidc` (librdkafka fetches and
//! refreshes their tokens on its background thread — its OIDC is built in only with libcurl, hence
//! rdkafka's `curl` feature and the system's libcurl — with curl-sys's bundled static curl
//! librdkafka's configure finds none and builds without OIDC; rdkafka's own token-refresh events
//! are not used); the wire client's tokens come from `oauth`: the same client-credentials request
//! with ureq (rustls; `https.ca.location` or the system store), kept per endpoint, client and scope
//! for the process until 80 % of their lifetime, forgotten when a broker refuses one. Its SASL
//! message is written by `oauth::initial_response` (RFC 7628), not `rsasl`: rsasl's OAUTHBEARER
//! client answers the broker's error challenge without the `%x01` the broker waits for. A token
//! endpoint that refuses the client (4xx but 429) is an `Authentication` error (permanent); one
//! that cannot be reached or answers 5xx is a `Transport` error (retried like a broker that does
//! not answer).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::error::WireError;
use crate::KafkaSecurity;

/// How long one token request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A token without `expires_in` is kept this long.
const UNKNOWN_LIFETIME: Duration = Duration::from_secs(60);

/// A token and when to stop handing it out.
#[derive(Clone)]
struct Cached {
    token: String,
    refresh_at: Instant,
}

/// Tokens by (token endpoint, client id, scope).
type Key = (String, String, Option<String>);

fn cache() -> &'static Mutex<HashMap<Key, Cached>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Cached>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

fn key(security: &KafkaSecurity) -> Result<Key, WireError> {
    let o = security
        .sasl
        .oauthbearer
        .as_ref()
        .ok_or_else(|| WireError::Config("sasl.oauthbearer.* is not set".into()))?;
    let url = security
        .token_endpoint()
        .ok_or_else(|| WireError::Config("sasl.oauthbearer.token.endpoint.url is not set".into()))?;
    Ok((url.to_owned(), o.client.id.clone().unwrap_or_default(), o.scope.clone()))
}

/// A bearer token for `security`'s client: the kept one while it is fresh, else a new one from
/// the token endpoint.
pub async fn token(security: &KafkaSecurity) -> Result<String, WireError> {
    let key = key(security)?;
    if let Some(c) = cache().lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        if Instant::now() < c.refresh_at {
            return Ok(c.token.clone());
        }
    }
    let secret = security.client_secret().map_err(WireError::Config)?;
    let ca = security.https.ca.as_ref().map(|l| l.location.clone());
    let k = key.clone();
    let fetched = tokio::task::spawn_blocking(move || fetch(&k, secret.expose(), ca.as_deref()))
        .await
        .map_err(|e| WireError::Config(format!("token request task: {e}")))??;
    cache()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, fetched.clone());
    Ok(fetched.token)
}

/// Forgets the kept token of `security`'s client (the broker refused it).
pub fn forget(security: &KafkaSecurity) {
    if let Ok(key) = key(security) {
        cache().lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
    }
}

/// The token endpoint's answer (RFC 6749 5.1).
#[derive(serde::Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// One client-credentials request.
fn fetch((url, client_id, scope): &Key, secret: &str, ca: Option<&std::path::Path>) -> Result<Cached, WireError> {
    let at = |what: String| WireError::Transport {
        addr: url.clone(),
        what,
    };
    let mut config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(REQUEST_TIMEOUT));
    if url.starts_with("https://") {
        config = config.tls_config(tls(ca)?);
    } else if !loopback(url) {
        tracing::warn!(
            endpoint = %url,
            "The OAUTHBEARER token endpoint is plain http:// on another host: the client secret and the tokens cross the network readable. Use https://."
        );
    }
    let agent: ureq::Agent = config.build().into();
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{client_id}:{secret}"));
    let mut form = vec![("grant_type", "client_credentials")];
    if let Some(s) = scope {
        form.push(("scope", s.as_str()));
    }
    let asked = Instant::now();
    let mut resp = agent
        .post(url)
        .header("Authorization", format!("Basic {basic}"))
        .header("Accept", "application/json")
        .send_form(form)
        .map_err(|e| {
            let certificate = match &e {
                ureq::Error::Rustls(_) => true,
                ureq::Error::Io(io) => io.get_ref().is_some_and(|i| i.is::<rustls::Error>()),
                _ => false,
            };
            if certificate {
                WireError::Certificate {
                    addr: url.clone(),
                    what: format!("token endpoint: {e} (is https.ca.location the CA that signed its certificate?)"),
                }
            } else {
                at(format!("token endpoint: {e}"))
            }
        })?;
    let status = resp.status();
    let body = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| at(format!("token endpoint: reading the answer: {e}")))?;
    if !status.is_success() {
        let body: String = body.chars().take(300).collect();
        let what = format!("the token endpoint answered {status}: {body}");
        // The provider refused this client (a wrong id or secret, a scope it may not have):
        // asking again cannot help. Anything else (5xx, a proxy's page) may pass.
        return Err(if status.is_client_error() && status.as_u16() != 429 {
            WireError::Authentication {
                addr: url.clone(),
                what,
            }
        } else {
            at(what)
        });
    }
    let parsed: TokenResponse =
        serde_json::from_str(&body).map_err(|e| at(format!("the token endpoint's answer has no access_token: {e}")))?;
    let lifetime = parsed.expires_in.map_or(UNKNOWN_LIFETIME, Duration::from_secs);
    Ok(Cached {
        token: parsed.access_token,
        refresh_at: asked + lifetime.mul_f64(0.8),
    })
}

/// Whether an `http://` URL names this machine (127.0.0.0/8, ::1, localhost).
fn loopback(url: &str) -> bool {
    exactly_core::net::url_is_loopback(url)
}

/// TLS for the token endpoint: the CA certificates of `https.ca.location`, else the system's.
fn tls(ca: Option<&std::path::Path>) -> Result<ureq::tls::TlsConfig, WireError> {
    crate::https::client_tls(ca, "https.ca.location", None).map_err(WireError::Config)
}

/// The client's first (and only) SASL message (RFC 7628 3.1): the GS2 header, the token, the
/// extensions.
pub(crate) fn initial_response(token: &str, extensions: &[(String, String)]) -> Vec<u8> {
    let mut m = format!("n,,\x01auth=Bearer {token}\x01");
    for (k, v) in extensions {
        m.push_str(&format!("{k}={v}\x01"));
    }
    m.push('\x01');
    m.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses_are_told_apart() {
        for u in [
            "http://127.0.0.1:8080/t",
            "http://localhost/t",
            "http://[::1]:80/t",
            "http://u:p@127.0.0.2/t",
        ] {
            assert!(loopback(u), "{u}");
        }
        for u in [
            "http://idp.example/t",
            "http://10.0.0.1:8080/t",
            "http://[2001:db8::1]/t",
            "http://localhost.example/t",
        ] {
            assert!(!loopback(u), "{u}");
        }
    }

    #[test]
    fn the_initial_response_is_rfc_7628s() {
        assert_eq!(initial_response("t0k", &[]), b"n,,\x01auth=Bearer t0k\x01\x01");
        assert_eq!(
            initial_response("t", &[("logicalCluster".into(), "lkc-1".into())]),
            b"n,,\x01auth=Bearer t\x01logicalCluster=lkc-1\x01\x01"
        );
    }
}
