//! Scripted clusters for the global router's tests: model servers that answer with a status the
//! test sets, a good heartbeat for them, and a cluster that holds a streamed answer open until
//! the test releases it.
#![allow(dead_code, reason = "each test binary uses part of the helpers")]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use infergate_testkit::pages::vllm_page;
use infergate_testkit::recorder::CHAT_JSON;
use infergate_testkit::scripted::scripted_server;
use tokio::sync::oneshot;

/// A model server answering every inference request with the status it holds (a chat completion
/// for 200, an OpenAI-style error otherwise), and `GET /metrics` with a healthy vLLM page, so
/// that a gateway in front of it keeps its pod ready. It counts the inference requests. Given a
/// token ([`Scripted::require_token`]) it answers 401 to an inference request without it, as a
/// cluster's gateway with API keys does.
pub struct Scripted {
    pub addr: SocketAddr,
    status: Arc<AtomicU16>,
    hits: Arc<AtomicUsize>,
    token: Arc<Mutex<Option<String>>>,
}

impl Scripted {
    pub async fn start(status: u16) -> Scripted {
        let status = Arc::new(AtomicU16::new(status));
        let hits = Arc::new(AtomicUsize::new(0));
        let token: Arc<Mutex<Option<String>>> = Arc::default();
        let (st, h, t) = (Arc::clone(&status), Arc::clone(&hits), Arc::clone(&token));
        let addr = scripted_server(Arc::new(move |head: &str| {
            if head.starts_with("GET /metrics") {
                return (200, "text/plain", vllm_page(0));
            }
            h.fetch_add(1, Ordering::Relaxed);
            if let Some(token) = t.lock().unwrap().as_deref() {
                let wanted = format!("\r\nauthorization: bearer {token}\r\n");
                if !format!("{}\r\n", head.to_ascii_lowercase()).contains(&wanted) {
                    return (
                        401,
                        "application/json",
                        r#"{"error":{"message":"authentication failed: the API key is not known","type":"authentication_error","param":null,"code":"unauthorized"}}"#.to_owned(),
                    );
                }
            }
            match st.load(Ordering::Relaxed) {
                200 => (200, "application/json", CHAT_JSON.to_owned()),
                code => (
                    code,
                    "application/json",
                    format!(
                        r#"{{"error":{{"message":"scripted {code}","type":"server_error","param":null,"code":"scripted"}}}}"#
                    ),
                ),
            }
        }))
        .await;
        Scripted {
            addr,
            status,
            hits,
            token,
        }
    }

    /// From now on, answers 401 to an inference request without `Authorization: Bearer
    /// <token>` (lowercase).
    pub fn require_token(&self, token: &str) {
        *self.token.lock().unwrap() = Some(token.to_ascii_lowercase());
    }

    pub fn set(&self, status: u16) {
        self.status.store(status, Ordering::Relaxed);
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::Relaxed)
    }
}

/// A good heartbeat for the model `m` (one ready pod), for the scripted clusters.
pub async fn heartbeat() -> SocketAddr {
    counted_heartbeat().await.0
}

/// [`heartbeat`], and the number of times it was fetched.
pub async fn counted_heartbeat() -> (SocketAddr, Arc<AtomicUsize>) {
    let fetched = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&fetched);
    let addr = infergate_testkit::pages::page_server(Arc::new(move || {
        count.fetch_add(1, Ordering::Relaxed);
        r#"{"schema":"infergate.heartbeat/v1","instance":"i","generation":1,"timestampMs":1,
            "models":[{"name":"m","pods":1,"readyPods":1,"saturation":0.0,"queue":0,"running":0,
            "inflight":0,"estimatedTtftMs":20.0,"prefillMs":20.0,"drainMs":0.0}]}"#
            .to_owned()
    }))
    .await;
    (addr, fetched)
}

/// A cluster that answers its first request with a stream: its headers and first event at
/// once, the rest when `release` fires. It counts the connections it accepts (the later ones are
/// held unanswered).
pub struct HeldStream {
    pub addr: SocketAddr,
    pub release: oneshot::Sender<()>,
    pub accepted: Arc<AtomicUsize>,
}

impl HeldStream {
    pub async fn start() -> HeldStream {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (release, held) = oneshot::channel::<()>();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            count.fetch_add(1, Ordering::Relaxed);
            // Later connections are counted and left unanswered.
            tokio::spawn(async move {
                let mut open = Vec::new();
                while let Ok((s, _)) = listener.accept().await {
                    count.fetch_add(1, Ordering::Relaxed);
                    open.push(s);
                }
            });
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                assert!(n > 0, "the router closed before sending its request");
                head.extend_from_slice(&buf[..n]);
            }
            let first = "data: {\"n\":1}\n\n";
            let rest = "data: {\"n\":2}\n\ndata: [DONE]\n\n";
            s.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n",
                    first.len()
                )
                .as_bytes(),
            )
            .await
            .unwrap();
            let _ = held.await;
            let _ = s
                .write_all(format!("{:x}\r\n{rest}\r\n0\r\n\r\n", rest.len()).as_bytes())
                .await;
            // Hold the socket until the router is done with it.
            let _ = s.read(&mut buf).await;
        });
        HeldStream {
            addr,
            release,
            accepted,
        }
    }
}

/// Sends a streamed chat request for `m` on a new connection and reads until the first event:
/// the connection, and what was read so far.
pub async fn open_stream(router: SocketAddr) -> (tokio::net::TcpStream, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut client = tokio::net::TcpStream::connect(router).await.unwrap();
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#;
    client
        .write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\"n\":1") {
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    (client, got)
}

/// Reads the rest of a held stream opened by [`open_stream`] (after its release) and checks it
/// ended whole: the last event, `[DONE]`, and the chunked body's end.
pub async fn finish_stream(client: &mut tokio::net::TcpStream, mut got: Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), client.read(&mut buf))
            .await
            .expect("the stream did not end")
            .unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if got.ends_with(b"0\r\n\r\n") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.contains("\"n\":2") && text.contains("[DONE]"),
        "{text}"
    );
    assert!(
        text.ends_with("0\r\n\r\n"),
        "the chunked answer was cut: {text}"
    );
}

/// A model server that answers `GET /metrics` with an idle vLLM page and every inference request
/// with a chat completion, except those whose body holds `HOLD`: it keeps those unanswered, a
/// queue that does not move while a test looks at it. Request bodies may come with a
/// `content-length` or chunked.
pub async fn holding_pod() -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf: Vec<u8> = Vec::new();
                let mut chunk = [0u8; 16 * 1024];
                loop {
                    // One whole request (head and body) in `buf`, then its answer.
                    let end = loop {
                        if let Some(end) = request_end(&buf) {
                            break end;
                        }
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let request: Vec<u8> = buf.drain(..end).collect();
                    let text = String::from_utf8_lossy(&request);
                    if text.contains("HOLD") {
                        std::future::pending::<()>().await;
                    }
                    let (content_type, body) = if text.starts_with("GET /metrics") {
                        ("text/plain", vllm_page(0))
                    } else {
                        ("application/json", CHAT_JSON.to_owned())
                    };
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    if s.write_all(head.as_bytes()).await.is_err()
                        || s.write_all(body.as_bytes()).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Where the first request in `buf` ends, once it is all there.
fn request_end(buf: &[u8]) -> Option<usize> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    if head.contains("transfer-encoding: chunked") {
        // The last chunk, its size 0, right after the head or after a chunk's closing CRLF.
        let from = head_end - 2;
        let last = buf[from..].windows(7).position(|w| w == b"\r\n0\r\n\r\n")?;
        return Some(from + last + 7);
    }
    let end = head_end + infergate_testkit::content_length(&head);
    (buf.len() >= end).then_some(end)
}
