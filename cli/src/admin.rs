//! The admin HTTP endpoint of a running job: `GET /metrics` (Prometheus), `GET /status` (JSON),
//! `POST /savepoint[?dir=DIR]`, `POST /stop[?savepoint=DIR]`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, post};
use axum::{Json, Router};
use exactly_core::runtime::JobControl;
use serde::Deserialize;
use serde_json::json;
use tracing::info;

use crate::metrics::{prometheus, Registry};

struct AdminState {
    registry: Arc<Registry>,
    control: JobControl,
    savepoint_dir: Option<PathBuf>,
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
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        prometheus(&s.registry.status()),
    )
        .into_response()
}

async fn status(State(s): State<Arc<AdminState>>) -> Response {
    Json(s.registry.status()).into_response()
}

async fn savepoint(State(s): State<Arc<AdminState>>, Query(q): Query<SavepointQuery>) -> Response {
    let Some(dir) = q.dir.or_else(|| s.savepoint_dir.clone()) else {
        return failure(
            StatusCode::BAD_REQUEST,
            "this job has no checkpointing: savepoints need it".into(),
        );
    };
    info!(dir = %dir.display(), "Savepoint requested.");
    match s.control.savepoint(dir).await {
        Ok(path) => Json(json!({ "path": path })).into_response(),
        Err(e) => failure(StatusCode::CONFLICT, e.to_string()),
    }
}

async fn stop(State(s): State<Arc<AdminState>>, Query(q): Query<StopQuery>) -> Response {
    s.registry.set_stopping();
    let result = match q.savepoint {
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

/// Binds `addr` and serves the endpoint until the returned task is aborted.
pub async fn serve(
    addr: &str,
    registry: Arc<Registry>,
    control: JobControl,
    savepoint_dir: Option<PathBuf>,
) -> Result<tokio::task::JoinHandle<()>> {
    let state = Arc::new(AdminState {
        registry,
        control,
        savepoint_dir,
    });
    let app = Router::new()
        .route("/metrics", routing::get(metrics))
        .route("/status", routing::get(status))
        .route("/savepoint", post(savepoint))
        .route("/stop", post(stop))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the admin endpoint to {addr} (is another job using that port?)"))?;
    let local = listener.local_addr()?;
    info!(address = %format!("http://{local}"), "Admin endpoint listening.");
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "The admin endpoint stopped.");
        }
    }))
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

fn request(admin: &str, path: &str, post: bool) -> Result<(axum::http::StatusCode, String, String)> {
    let base = if admin.starts_with("http://") {
        admin.trim_end_matches('/').to_owned()
    } else {
        format!("http://{admin}")
    };
    let url = format!("{base}{path}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(600)))
        .build()
        .into();
    let sent = if post {
        agent.post(&url).send_empty()
    } else {
        agent.get(&url).call()
    };
    let mut resp = sent.with_context(|| {
        format!("cannot reach the job's admin endpoint at {base}: is the job running with `admin` set?")
    })?;
    let status = resp.status();
    let body = resp.body_mut().read_to_string().context("reading the answer")?;
    Ok((status, body, url))
}
