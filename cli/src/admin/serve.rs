//! How the admin endpoint holds its connections: at most [`MAX_CONNECTIONS`] at once and
//! [`MAX_CONNECTIONS_PER_CLIENT`] from one address (more wait in the kernel's queue, or are
//! closed, holding none of the job's file descriptors), a client that has not sent a request's
//! headers within [`HEADER_READ_TIMEOUT`] is disconnected (an idle connection included), a
//! connection is closed after [`MAX_CONNECTION_LIFETIME`] once its request is answered, and TLS
//! handshakes run on tasks of their own within [`HANDSHAKE_TIMEOUT`]. The job shares its
//! descriptors with Kafka, RocksDB and checkpoint writes: anyone who reaches the port must not be
//! able to take them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
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
/// Connections served at once to one client address: one client cannot take them all.
pub(super) const MAX_CONNECTIONS_PER_CLIENT: usize = 16;
/// How long a client may take to send a request's headers (and an idle connection may stay).
pub(super) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one connection is served: then it is closed once its request is answered (a client
/// keeping connections alive with requests cannot hold them for good).
pub(super) const MAX_CONNECTION_LIFETIME: Duration = Duration::from_secs(120);
/// How long a client may take over its TLS handshake.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Open connections per client address.
type Counts = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// Serves `app` on `listener` (HTTPS with `tls`) until the task is aborted.
pub(super) fn spawn(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
) -> tokio::task::JoinHandle<()> {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let counts: Counts = Arc::default();
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
            let Some(counted) = ClientCount::take(&counts, peer.ip()) else {
                tracing::debug!(%peer, "Too many admin connections from one client; closing this one.");
                continue; // dropped: closed, its permit returned
            };
            let (app, tls) = (app.clone(), tls.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let _counted = counted;
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

/// Serves one connection (HTTP/1.1) until it closes, idles past the header timeout, or outlives
/// [`MAX_CONNECTION_LIFETIME`] (then it closes once the request in progress is answered).
async fn one<I>(io: I, app: Router, peer: Peer)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(app.layer(axum::Extension(ConnectInfo(peer))));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    let conn = http.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let served = tokio::select! {
        r = conn.as_mut() => r,
        () = tokio::time::sleep(MAX_CONNECTION_LIFETIME) => {
            conn.as_mut().graceful_shutdown();
            // The request in progress gets the header timeout to finish; then it is dropped.
            match tokio::time::timeout(HEADER_READ_TIMEOUT, conn).await {
                Ok(r) => r,
                Err(_) => Ok(()),
            }
        }
    };
    if let Err(e) = served {
        tracing::debug!(error = %e, "An admin connection ended with an error.");
    }
}

/// One connection of a client address, counted until it ends.
struct ClientCount {
    counts: Counts,
    ip: IpAddr,
}

impl ClientCount {
    /// Counts a connection of `ip`, unless it has [`MAX_CONNECTIONS_PER_CLIENT`] already.
    fn take(counts: &Counts, ip: IpAddr) -> Option<ClientCount> {
        let mut map = counts.lock().expect("not poisoned");
        let n = map.entry(ip).or_default();
        if *n >= MAX_CONNECTIONS_PER_CLIENT {
            return None;
        }
        *n += 1;
        Some(ClientCount {
            counts: counts.clone(),
            ip,
        })
    }
}

impl Drop for ClientCount {
    fn drop(&mut self) {
        let mut map = self.counts.lock().expect("not poisoned");
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}
