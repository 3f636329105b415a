//! One pod's keep-alive HTTP/1 connection and the fetch of one page over it.

use std::net::SocketAddr;

use bytes::Bytes;
use http::header::{ACCEPT, HOST};
use http::{HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use std::pin::Pin;
use tokio::net::TcpStream;

use crate::error::ScrapeError;

/// A live connection: the request handle plus the connection state machine, which the scrape
/// polls itself (no task of its own, so a scrape wakes one task, not two). Dropping it closes the
/// socket.
pub(super) struct Conn {
    sender: SendRequest<Empty<Bytes>>,
    connection: Pin<Box<http1::Connection<TokioIo<TcpStream>, Empty<Bytes>>>>,
}

/// Where and how to fetch one target's page.
pub(super) struct Endpoint {
    pub(super) addr: SocketAddr,
    pub(super) uri: Uri,
    pub(super) host: HeaderValue,
}

impl Endpoint {
    fn request(&self) -> Result<Request<Empty<Bytes>>, ScrapeError> {
        Request::builder()
            .method(Method::GET)
            .uri(self.uri.clone())
            .header(HOST, self.host.clone())
            .header(ACCEPT, HeaderValue::from_static("text/plain"))
            .body(Empty::new())
            .map_err(ScrapeError::Request)
    }
}

async fn connect(addr: SocketAddr) -> Result<Conn, ScrapeError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(ScrapeError::Connect)?;
    // Small request, small response: waiting to coalesce only adds latency.
    stream.set_nodelay(true).map_err(ScrapeError::Connect)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(ScrapeError::Http)?;
    Ok(Conn {
        sender,
        connection: Box::pin(connection),
    })
}

/// Fetches the page into `buf` (cleared first), reusing `conn` when it is still open.
///
/// Any failure leaves `conn` empty, so the next scrape starts on a clean connection; a reused
/// connection that the server had already closed is retried once on a new one.
pub(super) async fn fetch(
    conn: &mut Option<Conn>,
    endpoint: &Endpoint,
    buf: &mut Vec<u8>,
    cap: usize,
) -> Result<(), ScrapeError> {
    let reused = conn.as_ref().is_some_and(|c| !c.sender.is_closed());
    // The connection is not polled between scrapes, so a close by the server shows up only now:
    // as a cancelled request or a connection that ends first. Either way, retry once on a new one.
    if !reused {
        *conn = None;
    }
    let result = fetch_on(conn, endpoint, buf, cap).await;
    match result {
        Err(ScrapeError::Closed) if reused => {
            *conn = None;
            fetch_on(conn, endpoint, buf, cap).await
        }
        Err(ScrapeError::Http(ref e))
            if reused && (e.is_canceled() || e.is_closed() || e.is_incomplete_message()) =>
        {
            *conn = None;
            fetch_on(conn, endpoint, buf, cap).await
        }
        other => other,
    }
}

async fn fetch_on(
    slot: &mut Option<Conn>,
    endpoint: &Endpoint,
    buf: &mut Vec<u8>,
    cap: usize,
) -> Result<(), ScrapeError> {
    let conn = match slot {
        Some(c) => c,
        None => slot.insert(connect(endpoint.addr).await?),
    };
    let outcome = exchange(conn, endpoint, buf, cap).await;
    if outcome.is_err() {
        *slot = None;
    }
    outcome
}

async fn exchange(
    conn: &mut Conn,
    endpoint: &Endpoint,
    buf: &mut Vec<u8>,
    cap: usize,
) -> Result<(), ScrapeError> {
    let Conn { sender, connection } = conn;
    let work = request(sender, endpoint, buf, cap);
    tokio::pin!(work);
    tokio::select! {
        biased;
        done = &mut work => done,
        ended = connection.as_mut() => Err(match ended {
            Err(e) => ScrapeError::Http(e),
            Ok(()) => ScrapeError::Closed,
        }),
    }
}

async fn request(
    sender: &mut SendRequest<Empty<Bytes>>,
    endpoint: &Endpoint,
    buf: &mut Vec<u8>,
    cap: usize,
) -> Result<(), ScrapeError> {
    sender.ready().await.map_err(ScrapeError::Http)?;
    let response = sender
        .send_request(endpoint.request()?)
        .await
        .map_err(ScrapeError::Http)?;
    let status = response.status();
    if !status.is_success() {
        return Err(ScrapeError::Status(status));
    }
    let declared = response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > cap) {
        return Err(ScrapeError::BodyTooLarge { limit: cap });
    }
    buf.clear();
    if let Some(len) = declared {
        buf.reserve(len);
    }
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(ScrapeError::Http)?;
        if let Ok(data) = frame.into_data() {
            if buf.len().saturating_add(data.len()) > cap {
                return Err(ScrapeError::BodyTooLarge { limit: cap });
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(())
}
