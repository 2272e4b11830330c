//! The admin HTTP endpoint of a running job: `GET /` (a live page: charts of the status, the
//! latest checkpoints, savepoint and stop buttons; served from the binary, no CDN),
//! `GET /metrics` (OpenMetrics), `GET /status` (JSON), `GET /checkpoints` (the latest checkpoints
//! with offsets and pending transactions, JSON), `GET /job` (the job file, secrets masked),
//! `GET /healthz` (always open: for probes),
//! `POST /savepoint[?dir=DIR]`, `POST /stop[?savepoint=DIR]`.
//!
//! Who may use it: with a token configured (`job.admin_token` / `admin_token_file`), every POST
//! needs `Authorization: Bearer TOKEN`, and so does every request when the endpoint listens on a
//! non-loopback address; such an address without a token is refused at start. Requests a browser
//! sends from a page of another origin are refused (`Origin` / `Sec-Fetch-Site`), so a web page
//! cannot drive a job on localhost. Savepoints are written only under the job's savepoint root
//! (`<checkpoints.dir>/savepoints`): a `dir` is taken relative to it, and a path that leaves it is
//! refused. A process running a range of a split job writes into `DIR/subtasks-A-B-of-P`, so the
//! savepoints of every range under one `DIR` form one job-level savepoint that `exactly run --from
//! DIR` restores in any layout.
//!
//! With `job.admin_tls_cert` and `job.admin_tls_key` the endpoint speaks HTTPS only (TLS 1.2 and
//! 1.3, rustls): a token sent to it is not readable on the network. The `exactly` commands reach it
//! with `--admin https://HOST:PORT`, trusting the CA in `$EXACTLY_ADMIN_CA` (a PEM file) or else the
//! system's store. With `job.admin_tls_client_ca` too, clients authenticate with certificates
//! (mutual TLS): a certificate that CA did not sign ends the handshake, and a connection without
//! one gets only `GET /healthz` (probes present none); the commands present the certificate and
//! key in `$EXACTLY_ADMIN_CLIENT_CERT` and `$EXACTLY_ADMIN_CLIENT_KEY`. The token, when one is
//! configured, is required as well; a non-loopback address needs a token or client certificates.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use axum::extract::{Query, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{self, post};
use axum::{Json, Router};
use exactly_core::runtime::JobControl;
use exactly_core::secret::Secret;
use serde::Deserialize;
use serde_json::json;
use tracing::{info, warn};

use crate::metrics::{prometheus, Registry};

mod serve;

pub use crate::jobfile::{check_token, MIN_TOKEN_BYTES};
pub use exactly_jobs::admin_tls::{server_tls, ClientAuth};

struct AdminState {
    registry: Arc<Registry>,
    control: JobControl,
    /// Where savepoints go, and the only place they may go.
    savepoint_dir: Option<SavepointDir>,
    /// This process's checkpoint directory (the latest checkpoints are shown on the page).
    checkpoints_dir: Option<PathBuf>,
    /// The job file as it was started, secrets masked.
    job_file: String,
    token: Option<Secret>,
    /// Host names clients may name beside addresses and localhost (`job.admin_allowed_hosts`).
    allowed_hosts: Vec<String>,
    /// Listening on a loopback address only.
    loopback: bool,
    /// Clients must present a certificate the client CA verified (mutual TLS).
    client_certs: bool,
}

/// Where a job's savepoints go.
#[derive(Debug, Clone)]
pub struct SavepointDir {
    /// The root (`<checkpoints.dir>/savepoints`): requests name directories under it.
    pub root: PathBuf,
    /// The range of a split job (`subtasks-A-B-of-P`), written under the directory asked for.
    pub range: Option<String>,
}

/// Who may use the endpoint.
#[derive(Debug, Clone, Default)]
pub struct AdminAccess {
    /// The bearer token requests must carry (see the module's documentation).
    pub token: Option<Secret>,
    /// Serve HTTPS with this configuration ([`server_tls`]).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// `tls` asks clients for certificates (`server_tls` with a client CA).
    pub client_certs: bool,
    /// Host names clients may name beside addresses and localhost (`job.admin_allowed_hosts`).
    pub allowed_hosts: Vec<String>,
}

/// A savepoint directory asked for by a request: relative to `root`, or absolute inside it; no
/// `..`. The error says why it is refused.
pub fn savepoint_target(root: &Path, asked: &Path) -> std::result::Result<PathBuf, String> {
    if asked.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(format!("{}: `..` is not allowed in a savepoint path", asked.display()));
    }
    let target = if asked.is_absolute() {
        asked.to_owned()
    } else {
        root.join(asked)
    };
    if !target.starts_with(root) {
        return Err(format!(
            "{}: savepoints are written only under {}",
            asked.display(),
            root.display()
        ));
    }
    Ok(target)
}

/// What `guard` knows of a connection: whether its client presented a certificate that the client
/// CA verified (the handshake refuses any other certificate).
#[derive(Debug, Clone, Copy)]
struct Peer {
    certified: bool,
}

/// Whether `host` (a `Host` header: name or address, with or without a port) names this endpoint
/// as a client may: an IP address, `localhost`, or one of `allowed`. A name a web page's origin
/// controls could be made to resolve to this endpoint (DNS rebinding): its requests name that
/// host, and are refused.
fn allowed_host(host: &str, allowed: &[String]) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [v6] or [v6]:port
        return rest
            .split_once(']')
            .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok());
    } else {
        host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                name
            } else {
                host
            }
        })
    };
    let name = name.trim_end_matches('.');
    !name.is_empty()
        && (name.parse::<std::net::Ipv4Addr>().is_ok()
            || name.eq_ignore_ascii_case("localhost")
            || allowed
                .iter()
                .any(|a| a.trim_end_matches('.').eq_ignore_ascii_case(name)))
}

/// Compares in time independent of where the first difference is.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Refuses cross-origin browser requests, requests without a client certificate where one is
/// needed and requests without the token where one is needed.
async fn guard(State(s): State<Arc<AdminState>>, req: Request, next: Next) -> Response {
    let probe = req.uri().path() == "/healthz" && req.method() == Method::GET;
    if s.client_certs && !probe {
        let certified = req
            .extensions()
            .get::<axum::extract::ConnectInfo<Peer>>()
            .is_some_and(|c| c.0.certified);
        if !certified {
            return failure(
                StatusCode::UNAUTHORIZED,
                "a client certificate is required (one signed by the CA of job.admin_tls_client_ca; `exactly` commands present $EXACTLY_ADMIN_CLIENT_CERT with $EXACTLY_ADMIN_CLIENT_KEY)".into(),
            );
        }
    }
    let headers = req.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    if !probe && !allowed_host(host, &s.allowed_hosts) {
        return failure(
            StatusCode::FORBIDDEN,
            format!(
                "requests for host {host:?} are refused: reach the endpoint by an IP address or localhost, or add the name to job.admin_allowed_hosts"
            ),
        );
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) {
        let origin_host = origin
            .split_once("://")
            .map_or(origin, |(_, h)| h)
            .trim_end_matches('/');
        if origin_host != host {
            return failure(
                StatusCode::FORBIDDEN,
                format!("requests from pages of another origin ({origin}) are refused"),
            );
        }
    }
    if headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == "cross-site")
    {
        return failure(StatusCode::FORBIDDEN, "cross-site requests are refused".into());
    }
    // `/healthz` says only that the process serves: probes (which cannot carry a Secret) use it.
    // `/` is the page itself, without data: its requests for data carry the token it asks for.
    let open = matches!(req.uri().path(), "/healthz" | "/") && req.method() == Method::GET;
    let needs_token = !open && (req.method() == Method::POST || !s.loopback);
    if needs_token {
        if let Some(token) = &s.token {
            // Never protection by a token too short to be one (refused at start too).
            if check_token(token).is_err() {
                return failure(
                    StatusCode::UNAUTHORIZED,
                    "the configured admin token is too short".into(),
                );
            }
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or("");
            if !same_secret(given.as_bytes(), token.expose().as_bytes()) {
                let mut r = failure(
                    StatusCode::UNAUTHORIZED,
                    "a bearer token is required (Authorization: Bearer ...; `exactly` commands send $EXACTLY_ADMIN_TOKEN)".into(),
                );
                r.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
                return r;
            }
        }
    }
    next.run(req).await
}

#[derive(Deserialize)]
struct SavepointQuery {
    dir: Option<PathBuf>,
}

#[derive(Deserialize)]
struct StopQuery {
    savepoint: Option<PathBuf>,
}

fn failure(status: StatusCode, message: String) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

async fn metrics(State(s): State<Arc<AdminState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        prometheus(&s.registry.status()),
    )
        .into_response()
}

/// The live page: charts of `/status`, the latest checkpoints, savepoint and stop buttons.
async fn page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("../../assets/dashboard.html"),
    )
        .into_response()
}

/// The latest checkpoints of this process (at most 5, newest last) with their source offsets and
/// the transactions each would commit on restore.
async fn checkpoints(State(s): State<Arc<AdminState>>) -> Response {
    let Some(dir) = s.checkpoints_dir.clone() else {
        return Json(json!([])).into_response();
    };
    let listed = tokio::task::spawn_blocking(move || -> Result<Vec<crate::checkpoints::Inspected>> {
        let (all, _) = crate::checkpoints::list(&dir)?;
        let mut latest: Vec<_> = all.into_iter().filter(|l| l.kind == "checkpoint").collect();
        latest.sort_by_key(|l| l.id);
        let from = latest.len().saturating_sub(5);
        latest[from..]
            .iter()
            .map(|l| crate::checkpoints::inspect(&l.path))
            .collect()
    })
    .await;
    match listed {
        Ok(Ok(list)) => Json(list).into_response(),
        Ok(Err(e)) => failure(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The job file this process runs, its secrets masked.
async fn job(State(s): State<Arc<AdminState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        s.job_file.clone(),
    )
        .into_response()
}

async fn status(State(s): State<Arc<AdminState>>) -> Response {
    Json(s.registry.status()).into_response()
}

/// The directory a request may write a savepoint to.
fn target(s: &AdminState, asked: Option<PathBuf>) -> std::result::Result<PathBuf, String> {
    let Some(d) = &s.savepoint_dir else {
        return Err("this job has no checkpointing: savepoints need it".into());
    };
    let dir = match asked {
        None => d.root.clone(),
        Some(a) => savepoint_target(&d.root, &a)?,
    };
    Ok(match &d.range {
        Some(r) => dir.join(r),
        None => dir,
    })
}

async fn savepoint(State(s): State<Arc<AdminState>>, Query(q): Query<SavepointQuery>) -> Response {
    let dir = match target(&s, q.dir) {
        Ok(d) => d,
        Err(m) => return failure(StatusCode::BAD_REQUEST, m),
    };
    info!(dir = %dir.display(), "Savepoint requested.");
    match s.control.savepoint(dir).await {
        Ok(path) => Json(json!({ "path": path })).into_response(),
        Err(e) => failure(StatusCode::CONFLICT, e.to_string()),
    }
}

async fn stop(State(s): State<Arc<AdminState>>, Query(q): Query<StopQuery>) -> Response {
    let savepoint = match q.savepoint {
        Some(asked) => match target(&s, Some(asked)) {
            Ok(d) => Some(d),
            Err(m) => return failure(StatusCode::BAD_REQUEST, m),
        },
        None => None,
    };
    s.registry.set_stopping();
    let result = match savepoint {
        Some(dir) => {
            info!(dir = %dir.display(), "Stop with savepoint requested.");
            s.control.stop_with_savepoint(dir).await
        }
        None => {
            info!("Stop requested: final checkpoint, then commits.");
            s.control.stop().await
        }
    };
    match result {
        Ok(path) => Json(json!({ "path": path })).into_response(),
        Err(e) => failure(StatusCode::CONFLICT, e.to_string()),
    }
}

/// Refuses a non-loopback `addr` without a token or client certificates; returns whether `addr`
/// is a loopback address. `exactly run` calls it before the job starts.
pub fn check_access(addr: &str, access: &AdminAccess) -> Result<bool> {
    let parsed: std::net::SocketAddr = addr
        .parse()
        .with_context(|| format!("admin address {addr:?}: expected ip:port, e.g. 127.0.0.1:9249"))?;
    let loopback = parsed.ip().is_loopback();
    if let Some(t) = &access.token {
        check_token(t).map_err(anyhow::Error::msg)?;
    }
    if !loopback && access.token.is_none() && !access.client_certs {
        bail!(
            "refusing to serve the admin endpoint on {addr} without a token: anyone who reaches it could stop the job; set job.admin_token (e.g. \"${{EXACTLY_ADMIN_TOKEN}}\") or job.admin_token_file (or client certificates: job.admin_tls_client_ca), or listen on 127.0.0.1"
        );
    }
    if let Some(w) = cleartext_token(loopback, access) {
        warn!(address = addr, "{w}");
    }
    Ok(loopback)
}

/// The warning for a token that clients send in cleartext over the network: a non-loopback
/// address without TLS.
fn cleartext_token(loopback: bool, access: &AdminAccess) -> Option<&'static str> {
    (!loopback && access.token.is_some() && access.tls.is_none()).then_some(
        "The admin endpoint listens beyond this machine without TLS: its token travels in cleartext (anyone on the path can read it and stop the job); set job.admin_tls_cert and job.admin_tls_key, or listen on 127.0.0.1 behind a TLS proxy.",
    )
}

/// Binds `addr` and serves the endpoint until the returned task is aborted. A non-loopback
/// address without a token is refused.
pub async fn serve(
    addr: &str,
    registry: Arc<Registry>,
    control: JobControl,
    savepoint_dir: Option<SavepointDir>,
    checkpoints_dir: Option<PathBuf>,
    job_file: String,
    access: AdminAccess,
) -> Result<tokio::task::JoinHandle<()>> {
    let loopback = check_access(addr, &access)?;
    let state = Arc::new(AdminState {
        registry,
        control,
        savepoint_dir,
        checkpoints_dir,
        job_file,
        token: access.token,
        allowed_hosts: access.allowed_hosts,
        loopback,
        client_certs: access.client_certs && access.tls.is_some(),
    });
    let app = Router::new()
        .route("/", routing::get(page))
        .route("/checkpoints", routing::get(checkpoints))
        .route("/job", routing::get(job))
        .route("/metrics", routing::get(metrics))
        .route("/status", routing::get(status))
        .route("/healthz", routing::get(|| async { "ok" }))
        .route("/savepoint", post(savepoint))
        .route("/stop", post(stop))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the admin endpoint to {addr} (is another job using that port?)"))?;
    let local = listener.local_addr()?;
    let tls = access.tls.map(tokio_rustls::TlsAcceptor::from);
    let scheme = if tls.is_some() { "https" } else { "http" };
    info!(
        address = %format!("{scheme}://{local}"),
        max_connections = serve::MAX_CONNECTIONS,
        "Admin endpoint listening."
    );
    Ok(serve::spawn(listener, tls, app))
}

/// POSTs `path` to a running job's admin endpoint (`exactly savepoint`, `exactly stop`) and
/// returns the JSON answer, or an error carrying the job's message.
pub fn call(admin: &str, path: &str) -> Result<serde_json::Value> {
    json_answer(admin, path, true)
}

/// GETs JSON from `path` of a running job's admin endpoint.
pub fn get(admin: &str, path: &str) -> Result<serde_json::Value> {
    json_answer(admin, path, false)
}

/// GETs `path` of a running job's admin endpoint as text (e.g. `/metrics`).
pub fn get_text(admin: &str, path: &str) -> Result<String> {
    let (status, body, url) = request(admin, path, false)?;
    if !status.is_success() {
        anyhow::bail!("{url} answered {status}: {body}");
    }
    Ok(body)
}

fn json_answer(admin: &str, path: &str, post: bool) -> Result<serde_json::Value> {
    let (status, body, url) = request(admin, path, post)?;
    let value: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("unexpected answer from {url}: {body}"))?;
    if !status.is_success() {
        let message = value.get("error").and_then(|e| e.as_str()).unwrap_or(&body).to_owned();
        anyhow::bail!("the job refused: {message}");
    }
    Ok(value)
}

/// How the `exactly` commands check an admin endpoint's certificate (`https://` addresses): against
/// the CA certificates in `$EXACTLY_ADMIN_CA` (a PEM file), or else the system's trust store; the
/// certificate they present when it asks for one is `$EXACTLY_ADMIN_CLIENT_CERT` with its key in
/// `$EXACTLY_ADMIN_CLIENT_KEY`.
fn client_tls() -> Result<ureq::tls::TlsConfig> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let ca = var("EXACTLY_ADMIN_CA");
    let identity = match (var("EXACTLY_ADMIN_CLIENT_CERT"), var("EXACTLY_ADMIN_CLIENT_KEY")) {
        (Some(cert), Some(key)) => Some(
            exactly_kafka_client::https::client_identity(
                Path::new(&cert),
                Path::new(&key),
                "EXACTLY_ADMIN_CLIENT_CERT/EXACTLY_ADMIN_CLIENT_KEY",
            )
            .map_err(anyhow::Error::msg)?,
        ),
        (None, None) => None,
        (Some(_), None) => bail!("EXACTLY_ADMIN_CLIENT_CERT is set but not EXACTLY_ADMIN_CLIENT_KEY (its private key)"),
        (None, Some(_)) => bail!("EXACTLY_ADMIN_CLIENT_KEY is set but not EXACTLY_ADMIN_CLIENT_CERT (the certificate)"),
    };
    exactly_kafka_client::https::client_tls(ca.as_deref().map(Path::new), "EXACTLY_ADMIN_CA", identity)
        .map_err(|e| anyhow::anyhow!(e))
}

fn request(admin: &str, path: &str, post: bool) -> Result<(axum::http::StatusCode, String, String)> {
    let base = if admin.starts_with("http://") || admin.starts_with("https://") {
        admin.trim_end_matches('/').to_owned()
    } else {
        format!("http://{admin}")
    };
    let url = format!("{base}{path}");
    let mut config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(600)));
    // The trusted roots are read only for an HTTPS endpoint.
    if base.starts_with("https://") {
        config = config.tls_config(client_tls()?);
    }
    let agent: ureq::Agent = config.build().into();
    // The token, when the job wants one, comes from the environment (never a flag: flags show
    // in process listings).
    let token = std::env::var("EXACTLY_ADMIN_TOKEN").ok().filter(|t| !t.is_empty());
    let auth = token.map(|t| format!("Bearer {t}"));
    let sent = if post {
        let mut r = agent.post(&url);
        if let Some(a) = &auth {
            r = r.header("Authorization", a);
        }
        r.send_empty()
    } else {
        let mut r = agent.get(&url);
        if let Some(a) = &auth {
            r = r.header("Authorization", a);
        }
        r.call()
    };
    let mut resp = sent.map_err(|e| {
        let said = e.to_string();
        // A refused handshake is about certificates, not about whether the job runs.
        if said.contains("alert") || said.to_lowercase().contains("certificate") {
            anyhow::Error::new(e).context(format!(
                "the TLS handshake with the job's admin endpoint at {base} failed: $EXACTLY_ADMIN_CA must hold the CA of its certificate, and where it asks for client certificates $EXACTLY_ADMIN_CLIENT_CERT and $EXACTLY_ADMIN_CLIENT_KEY must be one its admin_tls_client_ca signed"
            ))
        } else {
            anyhow::Error::new(e).context(format!(
                "cannot reach the job's admin endpoint at {base}: is the job running with `admin` set?"
            ))
        }
    })?;
    let status = resp.status();
    let body = resp.body_mut().read_to_string().context("reading the answer")?;
    Ok((status, body, url))
}

#[cfg(test)]
mod tests;
