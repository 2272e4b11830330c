//! A TCP proxy between a job and the broker, to cut and restore the network in fault tests.
//!
//! The broker's `PROXIED` listener (see `scripts/services`) advertises the proxy's address, so a
//! client that bootstraps through the proxy reaches the broker only through it. Two faults:
//! - [`Proxy::partition`]: bytes stop flowing both ways on every connection, old and new (new
//!   ones are accepted and held), as when a network drops packets; [`Proxy::heal`] lets what was
//!   held through, as when the partition heals before TCP gives up.
//! - [`Proxy::reset`]: every connection is closed at once (the client sees a reset), and new
//!   ones are refused until [`Proxy::heal`].

use std::net::SocketAddr;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    Partitioned,
    Reset,
}

/// A running proxy; stops (closing every connection) when dropped.
pub struct Proxy {
    state: watch::Sender<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on `listen` and forwards every connection to `upstream`.
    pub async fn start(listen: &str, upstream: &str) -> Result<Self> {
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the test proxy to {listen}"))?;
        let upstream: SocketAddr = upstream.parse().context("upstream address")?;
        let (state, watch) = watch::channel(State::Open);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let watch = watch.clone();
                if *watch.borrow() == State::Reset {
                    drop(client);
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    // Either direction ending (or a reset) ends both.
                    tokio::select! {
                        _ = pump(cr, sw, watch.clone()) => {}
                        _ = pump(sr, cw, watch) => {}
                    }
                });
            }
        });
        Ok(Proxy { state, task })
    }

    /// Stops forwarding bytes (connections stay open, data is held).
    pub fn partition(&self) {
        self.state.send_replace(State::Partitioned);
    }

    /// Closes every connection and refuses new ones.
    pub fn reset(&self) {
        self.state.send_replace(State::Reset);
    }

    /// Forwards again (what a partition held goes through).
    pub fn heal(&self) {
        self.state.send_replace(State::Open);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.reset();
        self.task.abort();
    }
}

/// Copies `from` to `to` while the state allows; returns when either side closes or on reset.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: watch::Receiver<State>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Wait until forwarding is allowed (a partition holds here, a reset ends the copy).
        loop {
            let s = *state.borrow_and_update();
            match s {
                State::Open => break,
                State::Reset => return,
                State::Partitioned => {
                    if state.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = state.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        // Read while open; if a partition began meanwhile, hold the bytes until it heals.
        loop {
            let s = *state.borrow_and_update();
            match s {
                State::Open => break,
                State::Reset => return,
                State::Partitioned => {
                    if state.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn echo_server() -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8], within: Duration) -> Option<Vec<u8>> {
        s.write_all(msg).await.ok()?;
        let mut b = vec![0u8; msg.len()];
        match tokio::time::timeout(within, s.read_exact(&mut b)).await {
            Ok(Ok(_)) => Some(b),
            _ => None,
        }
    }

    #[tokio::test]
    async fn partition_holds_bytes_heal_delivers_them_reset_closes() {
        let upstream = echo_server().await;
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = format!("127.0.0.1:{port}");
        let proxy = Proxy::start(&listen, &upstream).await.unwrap();
        let mut c = TcpStream::connect(&listen).await.unwrap();
        assert_eq!(
            roundtrip(&mut c, b"one", Duration::from_secs(5)).await.as_deref(),
            Some(&b"one"[..])
        );

        proxy.partition();
        assert_eq!(
            roundtrip(&mut c, b"two", Duration::from_millis(300)).await,
            None,
            "held"
        );
        proxy.heal();
        let mut b = [0u8; 3];
        tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&b, b"two", "delivered after the heal");

        proxy.reset();
        let mut b = [0u8; 1];
        let r = tokio::time::timeout(Duration::from_secs(5), c.read(&mut b))
            .await
            .unwrap();
        assert!(matches!(r, Ok(0) | Err(_)), "closed: {r:?}");
        let mut fresh = TcpStream::connect(&listen).await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(5), fresh.read(&mut b))
            .await
            .unwrap();
        assert!(matches!(r, Ok(0) | Err(_)), "new connections refused: {r:?}");
        proxy.heal();
        let mut again = TcpStream::connect(&listen).await.unwrap();
        assert_eq!(
            roundtrip(&mut again, b"three", Duration::from_secs(5)).await.as_deref(),
            Some(&b"three"[..])
        );
    }
}
