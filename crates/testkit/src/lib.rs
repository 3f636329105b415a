//! Helpers shared by infergate's test suites; a dev-dependency only, never shipped.
//!
//! Tests across the workspace talk to real servers on 127.0.0.1 (the admin port, the gateway,
//! the emulated model servers). They used to carry their own copies of a small HTTP/1.1 client;
//! this crate is the one copy. Each call opens one connection, sends one request, reads the whole
//! answer and closes, all within [`TIMEOUT`], so a server that never answers fails the test
//! instead of hanging it.
//!
//! - [`get`] and [`post`] — the usual calls; they panic on failure (a failed call is a failed
//!   test) with the address, method and path in the message;
//! - [`try_get`], [`try_post`] and [`send`] — the same, returning an [`Error`], for callers that
//!   expect a failure or do not care about the answer (background load);
//! - [`send_within`] — any request with a timeout of the caller's choosing;
//! - [`Response`] — status, headers and the whole body.
//! - [`tls`] — a private CA, client configurations and HTTP/1.1 over TLS.
//! - [`redis`] — a real `redis-server` on a free loopback port, to kill and restart.
//! - [`pages`] — a metrics server answering with a page the test computes.
//! - [`recorder`] — a model server recording the request heads it receives, answering with
//!   response headers the test chooses.
//! - [`eventually`] — waits, on wall-clock time, until a condition holds.
//! - [`metric`] — one sample's value from a Prometheus text page.
//! - [`content_length`] — a request or response head's `content-length` (0 when absent).
//! - [`json_lines`] — a JSON-lines file (an access log) once it holds enough lines.
//! - [`required_tool`] — whether a program from outside the Rust toolchain that a test needs is
//!   there: in CI its absence fails the test, elsewhere the test says it is skipped.
//! - [`CapturedLog`] — what the code under test logged, read back as text.
//! - [`example_configs`] — the `InferenceGatewayConfig` examples of `deploy/examples`.
//!
//! The timeout is measured on tokio's clock: on a paused clock (`start_paused`) it is paused
//! too, and only passes when the runtime has nothing else to do.
//!
//! Helpers that must misbehave on purpose (malformed bytes, a client that goes away mid-stream,
//! timing of each streamed event) stay next to their tests.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

pub mod pages;
pub mod recorder;
pub mod redis;
pub mod scripted;
pub mod tls;

/// How long [`get`], [`post`], [`try_get`], [`try_post`] and [`send`] wait for a whole answer,
/// connecting included. Long enough for any test's slowest server; a test waiting longer is hung.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// A whole HTTP answer.
#[derive(Clone, Debug)]
pub struct Response {
    /// The status code.
    pub status: StatusCode,
    /// The response headers.
    pub headers: HeaderMap,
    /// The body, de-chunked.
    pub body: Bytes,
}

/// Why a request got no whole answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The TCP connection could not be opened.
    #[error("connecting to {addr}")]
    Connect {
        /// Where.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed (reset, malformed answer, body cut short).
    #[error("HTTP/1.1 exchange with {addr}")]
    Http {
        /// Where.
        addr: SocketAddr,
        /// hyper's error.
        #[source]
        source: hyper::Error,
    },
    /// No whole answer within the timeout.
    #[error("no whole answer from {addr} within {timeout:?}")]
    TimedOut {
        /// Where.
        addr: SocketAddr,
        /// The timeout that passed.
        timeout: Duration,
    },
}

impl Response {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The value of header `name`, when present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Opens a chat request to the gateway on `addr` whose body never finishes (the head and one byte
/// of a 1,000-byte body): the gateway takes one of its in-flight slots for it at once and holds
/// it while the connection stays open, as a running request would. Dropping the stream frees it.
pub async fn hold_request_slot(addr: SocketAddr) -> TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let mut s = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{",
    )
    .await
    .unwrap_or_else(|e| panic!("writing to {addr}: {e}"));
    s
}

/// Sends `OPTIONS target` on `conn`, an HTTP/1.1 connection, as a browser's CORS preflight would
/// (`origin` and `access-control-request-method: POST`), the request target as is (`*`, the
/// asterisk form, included), and returns the answer's head lower-cased. For a 204, which has no
/// body, the head is the whole answer and the connection can carry the next request.
pub async fn options_preflight(conn: &mut TcpStream, target: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let request = format!(
        "OPTIONS {target} HTTP/1.1\r\nhost: infergate\r\norigin: https://app.example\r\n\
         access-control-request-method: POST\r\n\r\n"
    );
    conn.write_all(request.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("OPTIONS {target}: {e}"));
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        match conn.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            r => panic!(
                "OPTIONS {target}: {r:?} after {:?}",
                String::from_utf8_lossy(&head)
            ),
        }
    }
    String::from_utf8_lossy(&head).to_ascii_lowercase()
}

/// `GET path` on `addr`. Panics when there is no whole answer within [`TIMEOUT`].
pub async fn get(addr: SocketAddr, path: &str) -> Response {
    try_get(addr, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path} on {addr}: {}", chain(&e)))
}

/// `POST path` on `addr` with `body` as `content_type`. Panics when there is no whole answer
/// within [`TIMEOUT`].
pub async fn post(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    body: impl AsRef<[u8]>,
) -> Response {
    try_post(addr, path, content_type, body)
        .await
        .unwrap_or_else(|e| panic!("POST {path} on {addr}: {}", chain(&e)))
}

/// As [`get`], returning the failure.
pub async fn try_get(addr: SocketAddr, path: &str) -> Result<Response, Error> {
    send(addr, request(Method::GET, path, None, Bytes::new())).await
}

/// As [`post`], returning the failure.
pub async fn try_post(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    body: impl AsRef<[u8]>,
) -> Result<Response, Error> {
    let body = Bytes::copy_from_slice(body.as_ref());
    send(addr, request(Method::POST, path, Some(content_type), body)).await
}

/// Sends `request` (its URI a path, as a server sees it) to `addr` within [`TIMEOUT`].
pub async fn send(addr: SocketAddr, request: Request<Bytes>) -> Result<Response, Error> {
    send_within(addr, request, TIMEOUT).await
}

/// Sends `request` to `addr` on a fresh HTTP/1.1 connection and reads the whole answer within
/// `timeout`. A `host` header naming `addr` is added when the request has none.
pub async fn send_within(
    addr: SocketAddr,
    request: Request<Bytes>,
    timeout: Duration,
) -> Result<Response, Error> {
    exchange(
        addr,
        &addr.to_string(),
        TcpStream::connect(addr),
        request,
        timeout,
    )
    .await
}

/// One HTTP/1.1 exchange on the connection `connect` opens to `addr`, within `timeout`; a
/// `host` header naming `host` is added when the request has none. Plain and TLS senders share it.
pub(crate) async fn exchange<S>(
    addr: SocketAddr,
    host: &str,
    connect: impl Future<Output = std::io::Result<S>>,
    mut request: Request<Bytes>,
    timeout: Duration,
) -> Result<Response, Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if !request.headers().contains_key(header::HOST)
        && let Ok(host) = HeaderValue::from_str(host)
    {
        request.headers_mut().insert(header::HOST, host);
    }
    let exchange = async {
        let stream = connect
            .await
            .map_err(|source| Error::Connect { addr, source })?;
        let http = |source| Error::Http { addr, source };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        // The connection task ends with the exchange (or when the sender is dropped).
        tokio::spawn(conn);
        let response = sender
            .send_request(request.map(Full::new))
            .await
            .map_err(http)?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(http)?.to_bytes();
        Ok(Response {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or(Err(Error::TimedOut { addr, timeout }))
}

fn request(method: Method, path: &str, content_type: Option<&str>, body: Bytes) -> Request<Bytes> {
    let mut r = Request::new(body);
    *r.method_mut() = method;
    match path.parse() {
        Ok(uri) => *r.uri_mut() = uri,
        Err(e) => panic!("{path:?} is not a request path: {e}"),
    }
    if let Some(ct) = content_type {
        match HeaderValue::from_str(ct) {
            Ok(v) => {
                r.headers_mut().insert(header::CONTENT_TYPE, v);
            }
            Err(e) => panic!("{ct:?} is not a content type: {e}"),
        }
    }
    r
}

/// An error with its causes, for a panic message.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// The lines of the JSON-lines file `path`, each parsed, once it holds at least `n` (a writer
/// thread fills it).
///
/// # Panics
/// When a line is not JSON, or fewer than `n` are there after 10 s, with the file's text.
pub async fn json_lines(path: &std::path::Path, n: usize) -> Vec<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} lines: {text}",
            lines.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The value of the first sample of `family` on the Prometheus text page `text` whose labels
/// include every pair of `labels` (`None`: no such sample). A label is matched whole: `model`
/// is not found in `base_model="…"`.
pub fn metric(text: &str, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .find(|l| {
            labels.iter().all(|(k, v)| {
                let pair = format!("{k}=\"{v}\"");
                l.contains(&format!("{{{pair}")) || l.contains(&format!(",{pair}"))
            })
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Polls `f` every 5 ms until it holds, on wall-clock time (a real socket's peer does not follow
/// tokio's paused clock).
///
/// # Panics
/// When it still does not hold after 10 s, naming `what`: a failed wait is a failed test.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A log writer that keeps every byte in memory, for reading back what a test logged: install
/// [`Self::subscriber`] (or give a `tracing_subscriber::fmt()` of your own a clone as its
/// writer) and read [`Self::text`] afterwards.
#[derive(Clone, Default)]
pub struct CapturedLog(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl CapturedLog {
    /// A subscriber writing every event up to `level` into this log, as plain text (no
    /// colours): `let _log = tracing::subscriber::set_default(out.subscriber(Level::INFO));`.
    pub fn subscriber(&self, level: tracing::Level) -> impl tracing::Subscriber + Send + Sync {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish()
    }

    /// Everything written so far (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        let bytes = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Asserts that `text` (a [`CapturedLog`]'s) holds exactly one warning of a client refused for
/// its certificate on the TLS port named `port` (`front`, `router`, `admin`, ...), naming that
/// port and the client CA bundle `bundle`: what `infergate_pool::tls` logs once a minute at
/// most for a burst of refusals. Returns the line.
pub fn one_refusal_warning<'a>(text: &'a str, port: &str, bundle: &std::path::Path) -> &'a str {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("client refused"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    let line = lines[0];
    assert!(line.contains(" WARN "), "{text}");
    assert!(line.contains(&format!("{port} client refused: ")), "{text}");
    assert!(line.contains(&format!("port=\"{port}\"")), "{text}");
    assert!(line.contains(&bundle.display().to_string()), "{text}");
    line
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The `InferenceGatewayConfig` examples of `deploy/examples/<sub>` (`""` for the valid ones,
/// `"invalid"` for the broken ones), sorted; panics when the folder holds fewer than three, so a
/// test over them cannot pass on an empty or moved folder.
pub fn example_configs(sub: &str) -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/examples")
        .join(sub);
    let mut v: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    v.sort();
    assert!(v.len() >= 3, "examples in {}: {v:?}", dir.display());
    v
}

/// The `content-length` of an HTTP/1.1 head (`head` up to its blank line; the name in any case),
/// 0 when absent or not a number: how the raw test servers know where a body ends.
pub fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0)
}

/// Whether a program from outside the Rust toolchain that a test needs (a Debian package such as
/// `redis-server` or `nginx-light`) is `present`. In CI (`CI=true`, where `.ci/run` installs
/// every such program) a missing one fails the test, saying how to install it; elsewhere the test
/// prints that it is skipped and why and returns, so `cargo test --workspace` passes on a machine
/// with the toolchain alone. Call it first: `if !required_tool(..) { return; }`.
pub fn required_tool(present: bool, what: &str, install: &str) -> bool {
    if present {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{what} is not installed, and CI must run this test: {install} (.ci/run does)"
    );
    eprintln!("skipped: {what} is not installed ({install}; .ci/run does)");
    false
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A label is matched whole. `model="m"` was found inside `base_model="m"`, so a sample of
    /// another model could be read, depending on the order of the page's series.
    #[test]
    fn metric_matches_whole_labels() {
        let page =
            "f_total{model=\"a\",base_model=\"m\"} 1\nf_total{model=\"m\",base_model=\"m\"} 0\n";
        assert_eq!(metric(page, "f_total", &[("model", "m")]), Some(0.0));
        assert_eq!(metric(page, "f_total", &[("base_model", "m")]), Some(1.0));
        assert_eq!(metric(page, "f_total", &[("model", "a")]), Some(1.0));
        assert_eq!(metric(page, "f_total", &[("odel", "a")]), None);
        assert_eq!(metric(page, "f", &[("model", "a")]), None);
    }

    #[test]
    fn content_length_reads_the_header_in_any_case_and_defaults_to_zero() {
        let head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\nContent-Length:  42\r\n";
        assert_eq!(content_length(head), 42);
        assert_eq!(content_length("GET / HTTP/1.1\r\nhost: x"), 0);
        assert_eq!(content_length("GET / HTTP/1.1\r\ncontent-length: many"), 0);
    }

    /// Answers each connection with `answer` after reading its request head, and hands the
    /// request bytes back.
    async fn canned(answer: &'static [u8]) -> (SocketAddr, tokio::sync::mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            // Connections left unanswered stay open until the test ends.
            let mut held = Vec::new();
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0; 4096];
                let mut seen = 0;
                // Head, then as much body as content-length says.
                let text = loop {
                    let n = s.read(&mut buf[seen..]).await.unwrap();
                    seen += n;
                    let text = String::from_utf8_lossy(&buf[..seen]).into_owned();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .map_or(0, |v| v.parse().unwrap());
                        if body.len() >= len {
                            break text;
                        }
                    }
                    if n == 0 {
                        break text;
                    }
                };
                tx.send(text).await.unwrap();
                if !answer.is_empty() {
                    s.write_all(answer).await.unwrap();
                    s.shutdown().await.unwrap();
                } else {
                    held.push(s);
                }
            }
        });
        (addr, rx)
    }

    #[tokio::test]
    async fn get_returns_status_headers_and_the_dechunked_body() {
        let (addr, mut seen) = canned(
            b"HTTP/1.1 503 Service Unavailable\r\nx-why: busy\r\ntransfer-encoding: chunked\r\n\r\n\
              3\r\nnot\r\n7\r\n ready\n\r\n0\r\n\r\n",
        )
        .await;
        let r = get(addr, "/readyz?x=1").await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.header("x-why"), Some("busy"));
        assert_eq!(r.text(), "not ready\n");
        let request = seen.recv().await.unwrap();
        assert!(
            request.starts_with("GET /readyz?x=1 HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(request.contains(&format!("host: {addr}\r\n")), "{request}");
    }

    #[tokio::test]
    async fn post_sends_the_body_with_its_type_and_length() {
        let (addr, mut seen) = canned(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        let r = post(addr, "/v1/completions", "application/json", "{\"a\":1}").await;
        assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "ok"));
        let request = seen.recv().await.unwrap();
        assert!(
            request.starts_with("POST /v1/completions HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request.contains("content-type: application/json\r\n"),
            "{request}"
        );
        assert!(request.contains("content-length: 7\r\n"), "{request}");
        assert!(request.ends_with("\r\n\r\n{\"a\":1}"), "{request}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_server_that_never_answers_times_out() {
        let (addr, _seen) = canned(b"").await;
        let r = send_within(
            addr,
            request(Method::GET, "/", None, Bytes::new()),
            Duration::from_secs(1),
        )
        .await;
        assert!(matches!(r, Err(Error::TimedOut { .. })), "{r:?}");
    }

    #[tokio::test]
    async fn a_refused_connection_is_an_error() {
        let addr = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap()
        };
        let r = try_get(addr, "/").await;
        assert!(matches!(r, Err(Error::Connect { .. })), "{r:?}");
    }
}
