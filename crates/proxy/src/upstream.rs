//! Upstream HTTP/1.1 connections, pooled per endpoint and driven by the request that uses them.
//!
//! A connection here is hyper's `client::conn::http1` pair: the request handle and the connection
//! state machine. The state machine has no task of its own: while a request waits for response
//! headers, the request's own future polls it ([`Upstreams::send`]); afterwards the response body
//! ([`Lease`], held by `body::Tracked`) polls it with every frame. So one upstream event wakes
//! exactly one task — the client connection's — instead of a pooled-connection task that then
//! wakes the client's, possibly on another thread.
//!
//! Idle connections wait in a per-endpoint stack (the most recently used is reused first, so the
//! warm ones stay warm and the old ones age out at the bottom). They are not polled while idle; a
//! connection the server closed meanwhile is noticed when it is used (hyper reads the close before
//! it writes the request, and hands the request back), and the request goes out once more on a new
//! connection. A close that crosses the request on the wire (the keep-alive race: the server's
//! idle timer fired as the request went out) is returned as [`SendError::Http`] with `reused`
//! set; whether to send the request again is the caller's decision (`crate::proxy`, with
//! [`Pooled::may_race`]), since only the caller can build it again. Each gateway worker has its
//! own [`Upstreams`], so the lock around the stacks is never contended in the thread-per-core
//! mode.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Context;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use infergate_metrics::ClientTls;
use infergate_metrics::tls::Stream;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Idle connections kept per endpoint and worker; more are closed when they come back.
const MAX_IDLE_PER_ENDPOINT: usize = 512;

/// A pooled connection idle at least this long may be closed by the server's keep-alive timer
/// just as a request goes out on it: see [`Pooled::may_race`]. One that died after a shorter
/// rest was closed by a server going away, not by its timer. The default `poolIdleMs`
/// ([`crate::config::DEFAULT_POOL_IDLE`], 4 s) retires connections before uvicorn's 5 s timer
/// (vLLM's and SGLang's API servers), so with it the race is left to servers with a shorter
/// timeout (gunicorn's 2 s) and to a `poolIdleMs` raised past the server's; it must stay below
/// that default, or no pooled connection would ever get the second send.
pub(crate) const RACE_IDLE: Duration = Duration::from_secs(1);

type Connection = http1::Connection<TokioIo<Stream>, Full<Bytes>>;

/// Why an upstream request failed before any response header arrived.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// The TCP connection could not be established.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The endpoint.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed (untrusted certificate, wrong name, no TLS on that port).
    #[error("TLS handshake with {addr} failed: {source}")]
    Tls {
        /// The endpoint.
        addr: SocketAddr,
        /// rustls' error, as an IO error.
        #[source]
        source: std::io::Error,
    },
    /// The connection (TCP and, with TLS, the handshake) was not established within the
    /// connect timeout.
    #[error("cannot connect to {addr} within {} ms", .timeout.as_millis())]
    ConnectTimeout {
        /// The endpoint.
        addr: SocketAddr,
        /// The timeout.
        timeout: Duration,
    },
    /// The connection failed or closed before the response headers.
    #[error("{addr} closed the connection before answering")]
    Http {
        /// The endpoint.
        addr: SocketAddr,
        /// hyper's error, when there is one (`None`: the connection simply ended).
        #[source]
        source: Option<hyper::Error>,
        /// The request went out on a pooled connection (one that had served earlier requests),
        /// not on one opened for it.
        reused: bool,
    },
}

impl SendError {
    /// Whether the endpoint refused the TCP connection: nothing listens at its address.
    pub(crate) fn is_refused(&self) -> bool {
        matches!(self, SendError::Connect { source, .. }
            if source.kind() == std::io::ErrorKind::ConnectionRefused)
    }

    /// Whether the request failed before any of it was sent (no TCP connection, refused or not
    /// within the connect timeout): a model server cannot have seen it.
    pub(crate) fn is_before_send(&self) -> bool {
        matches!(
            self,
            SendError::Connect { .. } | SendError::ConnectTimeout { .. }
        )
    }

    /// Whether the request was written on a pooled connection that then closed without an
    /// answer: the keep-alive race, when that connection [`Pooled::may_race`].
    pub(crate) fn on_reused(&self) -> bool {
        matches!(self, SendError::Http { reused: true, .. })
    }
}

/// A pooled connection taken for one request ([`Upstreams::checkout`]).
pub(crate) struct Pooled {
    conn: Conn,
    /// How long it sat in the pool.
    idle: Duration,
}

impl Pooled {
    /// Whether it sat idle long enough ([`RACE_IDLE`]) for the server's keep-alive timer to
    /// close it as the request goes out. A request written on such a connection that closes
    /// without an answer most likely never reached the server's application, and is sent once
    /// more on a new connection to the same endpoint.
    pub(crate) fn may_race(&self) -> bool {
        self.idle >= RACE_IDLE
    }
}

/// One keep-alive connection to a model server.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    // Boxed so that a connection moves between the pool, the request and the body as a pointer.
    connection: Pin<Box<Connection>>,
    /// When it was put back; idle connections older than the pool's idle timeout are closed.
    idle_since: Instant,
    /// The TLS it was opened with: reused only for requests asking for the same.
    tls: Option<ClientTls>,
}

impl Conn {
    async fn open(
        addr: SocketAddr,
        tls: Option<&ClientTls>,
        timeout: Duration,
    ) -> Result<Conn, SendError> {
        let connect = async {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|source| SendError::Connect { addr, source })?;
            // Requests and first answers are small: waiting to coalesce them only adds latency.
            stream
                .set_nodelay(true)
                .map_err(|source| SendError::Connect { addr, source })?;
            match tls {
                None => Ok(Stream::Plain(stream)),
                Some(tls) => tls
                    .connect(addr, stream)
                    .await
                    .map_err(|source| SendError::Tls { addr, source }),
            }
        };
        let stream = match tokio::time::timeout(timeout, connect).await {
            Err(_elapsed) => return Err(SendError::ConnectTimeout { addr, timeout }),
            Ok(r) => r?,
        };
        let (sender, connection) =
            http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| SendError::Http {
                    addr,
                    source: Some(e),
                    reused: false,
                })?;
        Ok(Conn {
            sender,
            connection: Box::pin(connection),
            idle_since: Instant::now(),
            tls: tls.cloned(),
        })
    }

    /// Whether a pooled connection may still be used as far as hyper already knows. A close by
    /// the server that hyper has not read yet is found by [`Conn::exchange`], which polls the
    /// connection before handing it the request and gets the request back if it is closed.
    fn usable(&self) -> bool {
        !self.sender.is_closed()
    }

    /// Sends `req` and waits for the response headers, driving the connection meanwhile. A
    /// request that was never written comes back with the error.
    async fn exchange(
        mut self,
        req: Request<Full<Bytes>>,
    ) -> Result<(Response<Incoming>, Option<Conn>), Failed> {
        // Until hyper has the request, a connection that turns out to be closed (the server
        // closed it while it sat in the pool) hands the request back for a new connection.
        let not_ready = tokio::select! {
            biased;
            r = self.sender.ready() => r.err().map(Some),
            ended = self.connection.as_mut() => Some(ended.err()),
        };
        if let Some(error) = not_ready {
            return Err(Failed {
                error,
                unsent: Some(req),
            });
        }
        // The response future does not borrow the sender; the connection is driven beside it.
        let work = self.sender.try_send_request(req);
        tokio::pin!(work);
        let ended = tokio::select! {
            biased;
            r = &mut work => return match r {
                Ok(resp) => Ok((resp, Some(self))),
                Err(mut e) => Err(Failed {
                    unsent: e.take_message(),
                    error: Some(e.into_error()),
                }),
            },
            ended = self.connection.as_mut() => ended,
        };
        // The connection ended first. Dropping it fails the request's callback, handing the
        // request back if hyper had not written it yet.
        drop(self);
        match work.await {
            // It answered and closed (`Connection: close`) in one go: the answer is whole.
            Ok(resp) => Ok((resp, None)),
            Err(mut e) => Err(Failed {
                unsent: e.take_message(),
                error: ended.err(),
            }),
        }
    }
}

/// A failed exchange: hyper's error (`None` when the connection simply ended) and the request,
/// if it was never written.
struct Failed {
    error: Option<hyper::Error>,
    unsent: Option<Request<Full<Bytes>>>,
}

/// A worker's upstream connections, by endpoint.
#[derive(Default)]
pub(crate) struct Upstreams {
    idle: Mutex<HashMap<SocketAddr, VecDeque<Conn>>>,
}

impl Upstreams {
    /// Takes the most recently used live connection to `addr` opened with `tls`, if any, for
    /// [`Upstreams::send`]. Taken before the request is built, so that the caller knows whether
    /// it [`Pooled::may_race`] (and keeps what it needs to build the request again).
    pub(crate) fn checkout(
        &self,
        addr: SocketAddr,
        pool_idle: Duration,
        tls: Option<&ClientTls>,
    ) -> Option<Pooled> {
        self.take(addr, pool_idle, tls)
            .map(|(conn, idle)| Pooled { conn, idle })
    }

    /// Sends `req` to `addr` (over TLS when `tls` is set) on `pooled` (from
    /// [`Upstreams::checkout`] for the same endpoint and TLS), or on a new connection, and returns
    /// the response headers with the connection, which the caller drives while it reads the body.
    ///
    /// A pooled connection that fails before the request could be written (hyper reports it as
    /// cancelled) is replaced by a new connection once; any other failure is returned (on a
    /// pooled connection, as [`SendError::Http`] with `reused` set).
    pub(crate) async fn send(
        self: &Arc<Self>,
        addr: SocketAddr,
        tls: Option<&ClientTls>,
        pooled: Option<Pooled>,
        req: Request<Full<Bytes>>,
        connect_timeout: Duration,
    ) -> Result<(Response<Incoming>, Lease), SendError> {
        let mut req = req;
        if let Some(Pooled { conn, .. }) = pooled {
            match conn.exchange(req).await {
                Ok((resp, conn)) => return Ok((resp, self.lease(addr, conn))),
                // The server closed it while idle and hyper noticed only now: a new connection.
                Err(Failed {
                    unsent: Some(back), ..
                }) => req = back,
                Err(Failed { error, .. }) => {
                    return Err(SendError::Http {
                        addr,
                        source: error,
                        reused: true,
                    });
                }
            }
        }
        let conn = Conn::open(addr, tls, connect_timeout).await?;
        match conn.exchange(req).await {
            Ok((resp, conn)) => Ok((resp, self.lease(addr, conn))),
            Err(Failed { error, .. }) => Err(SendError::Http {
                addr,
                source: error,
                reused: false,
            }),
        }
    }

    fn lease(self: &Arc<Self>, addr: SocketAddr, conn: Option<Conn>) -> Lease {
        Lease {
            conn,
            home: Arc::clone(self),
            addr,
        }
    }

    /// Takes the most recently used live connection to `addr` opened with `tls`, with how long
    /// it was idle, closing stale ones on the way (and ones opened with other TLS settings: the
    /// model's changed).
    fn take(
        &self,
        addr: SocketAddr,
        pool_idle: Duration,
        tls: Option<&ClientTls>,
    ) -> Option<(Conn, Duration)> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let stack = idle.get_mut(&addr)?;
        let now = Instant::now();
        while let Some(conn) = stack.pop_back() {
            let rested = now.saturating_duration_since(conn.idle_since);
            if rested <= pool_idle && conn.usable() && conn.tls.as_ref() == tls {
                return Some((conn, rested));
            }
        }
        None
    }

    fn put(&self, addr: SocketAddr, mut conn: Conn) {
        conn.idle_since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let stack = idle.entry(addr).or_default();
        if stack.len() >= MAX_IDLE_PER_ENDPOINT {
            // The oldest goes: it is the likeliest to have been closed by the server already.
            stack.pop_front();
        }
        stack.push_back(conn);
    }

    /// Closes idle connections older than `pool_idle` and those the server already closed, and
    /// forgets endpoints left with none (an endpoint removed by a reload, say). The worker runs
    /// it periodically, so a quiet endpoint does not keep sockets open forever.
    pub(crate) fn sweep(&self, pool_idle: Duration) {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|_, stack| {
            // Oldest first: stop at the first one still young enough (the rest are younger).
            while stack.front().is_some_and(|c| {
                now.saturating_duration_since(c.idle_since) > pool_idle || !c.usable()
            }) {
                stack.pop_front();
            }
            !stack.is_empty()
        });
    }

    /// Idle connections to `addr` (tests).
    #[cfg(test)]
    pub(crate) fn idle(&self, addr: SocketAddr) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&addr)
            .map_or(0, VecDeque::len)
    }
}

/// An upstream connection lent to one response: the body drives it while it streams and gives
/// it back when the response ended cleanly. Dropped otherwise, which closes the socket (and so
/// cancels the model server's work when a client leaves mid-stream).
pub(crate) struct Lease {
    conn: Option<Conn>,
    home: Arc<Upstreams>,
    addr: SocketAddr,
}

impl Lease {
    /// Lets the connection make progress (read the next body bytes into hyper's channel). Call
    /// it before polling the body, with the body's context: then the body's task is the one woken
    /// when more bytes arrive.
    pub(crate) fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(conn) = &mut self.conn
            && conn.connection.as_mut().poll(cx).is_ready()
        {
            // Closed by the server, or failed (the body reports that itself). A finished
            // connection is never polled again, nor reused.
            self.conn = None;
        }
    }

    /// The response body was read to its end: the connection goes back to the pool.
    pub(crate) fn release(mut self) {
        if let Some(conn) = self.conn.take()
            && !conn.sender.is_closed()
        {
            self.home.put(self.addr, conn);
        }
    }
}

#[cfg(test)]
mod tests;
