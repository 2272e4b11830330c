//! How the admin endpoint holds its connections: at most [`MAX_CONNECTIONS`] at once (more wait
//! in the kernel's queue, holding none of the job's file descriptors), a client that has not sent
//! a request's headers within [`HEADER_READ_TIMEOUT`] is disconnected (an idle connection
//! included), and TLS handshakes run on tasks of their own within [`HANDSHAKE_TIMEOUT`]. The job
//! shares its descriptors with Kafka, RocksDB and checkpoint writes: anyone who reaches the port
//! must not be able to take them.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::Peer;

/// Connections served at once.
pub(super) const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send a request's headers (and an idle connection may stay).
pub(super) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take over its TLS handshake.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` (HTTPS with `tls`) until the task is aborted.
pub(super) fn spawn(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
) -> tokio::task::JoinHandle<()> {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let permit = permits
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: wait, as axum does.
                    tracing::debug!(error = %e, "Accepting an admin connection failed.");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (app, tls) = (app.clone(), tls.clone());
            tokio::spawn(async move {
                let _permit = permit;
                match tls {
                    None => one(tcp, app, Peer { certified: false }).await,
                    Some(acceptor) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let certified = stream.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
                            one(stream, app, Peer { certified }).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake with an admin client failed."),
                        Err(_) => tracing::debug!(%peer, "TLS handshake with an admin client timed out."),
                    },
                }
            });
        }
    })
}

/// Serves one connection (HTTP/1.1) until it closes or idles past the header timeout.
async fn one<I>(io: I, app: Router, peer: Peer)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(app.layer(axum::Extension(ConnectInfo(peer))));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    if let Err(e) = http.serve_connection(TokioIo::new(io), service).await {
        tracing::debug!(error = %e, "An admin connection ended with an error.");
    }
}
