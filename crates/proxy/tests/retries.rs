//! Retries of requests whose upstream connection closed before any response byte: the
//! keep-alive race (a pooled connection the model server closes as the request goes out), a
//! fresh connection accepted and closed without an answer, and a ranked list shorter than the
//! model's endpoints. A gateway on one worker (so that consecutive requests share its pooled
//! connections) in front of raw HTTP/1.1 model servers that script exactly when a connection
//! closes.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/upstream.rs"]
mod upstream;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use infergate_proxy::{Gateway, GatewayConfig, Listeners, serve};
use infergate_testkit::json_lines;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use upstream::{Behaviour, Upstream, get, refused_addr, send};

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// Longer than the idle time past which the gateway sends a request again on a new connection
/// when its pooled one closed under it (the keep-alive race, `upstream::RACE_IDLE`, 1 s).
const PAST_RACE_IDLE: Duration = Duration::from_millis(1_200);

/// How a [`Scripted`] server ends a connection instead of answering.
#[derive(Clone, Copy, Debug)]
enum Close {
    /// A FIN, as a server whose keep-alive timer fired.
    Fin,
    /// A reset (`SO_LINGER` 0), as a process that died with the request unread.
    Reset,
}

/// A model server speaking raw HTTP/1.1: on each connection it answers the first `answered`
/// model requests (keep-alive), then reads the next one whole and closes the connection without
/// a byte. `/metrics` is answered on every connection, which then closes.
struct Scripted {
    addr: SocketAddr,
    /// Model requests read (answered or not).
    requests: Arc<AtomicUsize>,
    /// Connections that carried a model request.
    connections: Arc<AtomicUsize>,
}

impl Scripted {
    async fn start(answered: usize, close: Close) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let (r, c) = (Arc::clone(&requests), Arc::clone(&connections));
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (r, c) = (Arc::clone(&r), Arc::clone(&c));
                tokio::spawn(serve_scripted(stream, answered, close, r, c));
            }
        });
        Scripted {
            addr,
            requests,
            connections,
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn serve_scripted(
    mut s: TcpStream,
    answered: usize,
    close: Close,
    requests: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
) {
    let mut buf = Vec::new();
    let mut served = 0;
    loop {
        let Some(path) = read_request(&mut s, &mut buf).await else {
            return;
        };
        if path == "/metrics" {
            let page = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n\
                        # TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 0\n\
                        # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.1\n";
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                page.len()
            );
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.write_all(page.as_bytes()).await;
            return;
        }
        if served == 0 {
            connections.fetch_add(1, Ordering::SeqCst);
        }
        requests.fetch_add(1, Ordering::SeqCst);
        if served == answered {
            if let Close::Reset = close {
                s.set_zero_linger().unwrap();
            }
            return;
        }
        served += 1;
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            upstream::CHAT_JSON.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(upstream::CHAT_JSON.as_bytes()).await.unwrap();
    }
}

/// Reads one request (head and `content-length` body) from `s`, keeping what follows it in
/// `buf`; its path, or `None` when the connection ended first.
async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let path = head.split(' ').nth(1)?.to_owned();
    let length = infergate_testkit::content_length(&head);
    while buf.len() < end + length {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    buf.drain(..end + length);
    Some(path)
}

struct Running {
    gw: Gateway,
    _stop: oneshot::Sender<()>,
    _dir: tempfile::TempDir,
    log: std::path::PathBuf,
}

/// The gateway on one accept loop (one worker: one pool of upstream connections), with an
/// access log, in front of `endpoints` under round-robin.
async fn start(max_attempts: u8, scheduler: &str, endpoints: &[SocketAddr]) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let eps: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
    let yaml = format!(
        "auth: none\nreloadIntervalMs: 0\nretries: {{ maxAttempts: {max_attempts} }}\n\
         timeouts: {{ connectMs: 500, firstByteMs: 5000 }}\naccessLog: {{ path: {} }}\n\
         models:\n  - name: m\n    scheduler: {{ {scheduler} }}\n    endpoints: [{}]\n",
        log.display(),
        eps.join(", ")
    );
    let config = GatewayConfig::from_yaml(&yaml).unwrap();
    let listeners = Listeners {
        http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        admin: Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
    };
    let (stop, rx) = oneshot::channel::<()>();
    let gw = serve(config, listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    Running {
        gw,
        _stop: stop,
        _dir: dir,
        log,
    }
}

impl Running {
    async fn chat(&self, id: &str) -> (http::StatusCode, http::HeaderMap, Value) {
        let headers = [("x-request-id", id)];
        let (status, headers, body) = send(
            self.gw.http_addr(),
            "POST",
            "/v1/chat/completions",
            CHAT,
            &headers,
        )
        .await;
        let body = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body)));
        (status, headers, body)
    }

    async fn metric(&self, series: &str) -> Option<f64> {
        let (_, page) = get(self.gw.admin_addr().unwrap(), "/metrics").await;
        page.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    /// The access log's line of request `id` (the log holds `lines` lines by then).
    async fn logged(&self, lines: usize, id: &str) -> Value {
        let all = json_lines(Path::new(&self.log), lines).await;
        all.into_iter()
            .find(|l| l["request_id"] == id)
            .unwrap_or_else(|| panic!("no access-log line for {id}"))
    }
}

/// The keep-alive race on the only endpoint: the pooled connection, idle past the race window,
/// is closed by the model server upon the next request without an answer. The request goes out
/// once more on a new connection to the same endpoint and is answered; the resend is a retry in
/// the metrics and an attempt in the access log, and costs none of `maxAttempts`.
#[tokio::test]
async fn a_keep_alive_race_on_the_only_endpoint_is_sent_again_on_a_new_connection() {
    for close in [Close::Fin, Close::Reset] {
        let up = Scripted::start(1, close).await;
        let gw = start(1, "preset: round-robin", &[up.addr]).await;
        let (status, _, _) = gw.chat("first").await;
        assert_eq!(status, 200);
        tokio::time::sleep(PAST_RACE_IDLE).await;
        let (status, headers, body) = gw.chat("raced").await;
        assert_eq!(status, 200, "{close:?}: {body}");
        assert_eq!(
            headers["x-infergate-endpoint"],
            up.addr.to_string().as_str()
        );
        assert_eq!(body["choices"][0]["message"]["content"], "hello");
        // Read by the server on the pooled connection, then again on a new one.
        assert_eq!((up.requests(), up.connections()), (3, 2), "{close:?}");
        let line = gw.logged(2, "raced").await;
        assert_eq!(line["attempts"], 2, "{close:?}: {line}");
        assert_eq!(line["status"], 200);
        assert_eq!(
            gw.metric(r#"infergate_gateway_retries_total{model="m"}"#)
                .await,
            Some(1.0),
            "{close:?}"
        );
    }
}

/// A connection reused at once (idle well under the race window) that closes before answering is
/// a model server going away, not its keep-alive timer: the request is not sent there again,
/// and with no other endpoint the answer is 502 naming the endpoint and the attempts.
#[tokio::test]
async fn a_connection_reused_at_once_that_closes_is_not_sent_again_there() {
    let up = Scripted::start(1, Close::Fin).await;
    let gw = start(3, "preset: round-robin", &[up.addr]).await;
    let (status, _, _) = gw.chat("first").await;
    assert_eq!(status, 200);
    let (status, headers, body) = gw.chat("closed").await;
    assert_eq!(status, 502, "{body}");
    assert!(!headers.contains_key("x-infergate-endpoint"));
    assert_eq!(body["error"]["code"], "upstream_unavailable");
    // One attempt, said as such: the endpoint and what it did.
    assert_eq!(
        body["error"]["message"],
        format!(
            "the model server could not be reached: {} closed a reused connection before answering",
            up.addr
        )
    );
    assert_eq!(up.requests(), 2);
    assert_eq!(gw.logged(2, "closed").await["attempts"], 1);
}

/// The keep-alive race on the first choice with a fallback: answered either way, by the same
/// endpoint on a new connection when the pooled one sat idle past the race window, else by the
/// fallback.
#[tokio::test]
async fn a_keep_alive_race_with_a_fallback_is_answered() {
    let racer = Scripted::start(1, Close::Reset).await;
    let good = Upstream::start(Behaviour::Ok).await;
    let gw = start(2, "preset: round-robin", &[racer.addr, good.addr]).await;
    // Round-robin: racer first (answered on a new connection), good first, then racer first
    // again on the pooled connection, which it resets.
    for id in ["r1", "g1"] {
        assert_eq!(gw.chat(id).await.0, 200);
    }
    let (status, headers, _) = gw.chat("at-once").await;
    assert_eq!(status, 200);
    assert_eq!(
        headers["x-infergate-endpoint"],
        good.addr.to_string().as_str()
    );
    assert_eq!(gw.logged(3, "at-once").await["attempts"], 2);
    // Again past the race window: the racer answers on a new connection.
    for id in ["g2", "r2", "g3"] {
        assert_eq!(gw.chat(id).await.0, 200);
    }
    tokio::time::sleep(PAST_RACE_IDLE).await;
    let (status, headers, _) = gw.chat("idle").await;
    assert_eq!(status, 200);
    assert_eq!(
        headers["x-infergate-endpoint"],
        racer.addr.to_string().as_str()
    );
    assert_eq!(gw.logged(7, "idle").await["attempts"], 2);
    assert_eq!((racer.requests(), racer.connections()), (5, 3));
}

/// A ranked list of one (`returnedEndpoints: 1`) for a model of two, with `maxAttempts: 2`: a
/// first choice that accepts the connection and closes it without an answer, or refuses it, is
/// followed by the model's other endpoint; the answers are all 200.
#[tokio::test]
async fn an_exhausted_ranked_list_goes_on_to_the_models_other_endpoints() {
    let closer = Scripted::start(0, Close::Fin).await;
    let dead = refused_addr().await;
    for bad in [closer.addr, dead] {
        let good = Upstream::start(Behaviour::Ok).await;
        let gw = start(
            2,
            "preset: round-robin, returnedEndpoints: 1",
            &[bad, good.addr],
        )
        .await;
        for i in 0..4 {
            let (status, headers, body) = gw.chat(&format!("r{i}")).await;
            assert_eq!(status, 200, "{bad}: {body}");
            assert_eq!(
                headers["x-infergate-endpoint"],
                good.addr.to_string().as_str()
            );
        }
        assert_eq!(good.requests(), 4);
        // Round-robin puts the bad endpoint first on every other request.
        let line = gw.logged(4, "r0").await;
        assert_eq!(line["attempts"], 2, "{line}");
        assert_eq!(
            gw.metric(r#"infergate_gateway_retries_total{model="m"}"#)
                .await,
            Some(2.0)
        );
    }
    assert_eq!(closer.requests(), 2);
}

/// Beyond the ranked list only endpoints not known to refuse connections are tried, and never
/// more than `maxAttempts` in all: with `maxAttempts: 2` a request whose only ranked endpoint
/// failed gets one more.
#[tokio::test]
async fn endpoints_beyond_the_ranked_list_stop_at_max_attempts() {
    let closers = [
        Scripted::start(0, Close::Fin).await,
        Scripted::start(0, Close::Fin).await,
        Scripted::start(0, Close::Fin).await,
    ];
    let addrs: Vec<SocketAddr> = closers.iter().map(|c| c.addr).collect();
    let gw = start(2, "preset: round-robin, returnedEndpoints: 1", &addrs).await;
    let (status, _, body) = gw.chat("all-closed").await;
    assert_eq!(status, 502, "{body}");
    // Each attempt is named in the message, in order.
    let message = body["error"]["message"].as_str().unwrap();
    assert_eq!(
        message
            .matches("closed the connection before answering")
            .count(),
        2,
        "{message}"
    );
    assert_eq!(closers.iter().map(Scripted::requests).sum::<usize>(), 2);
    assert_eq!(gw.logged(1, "all-closed").await["attempts"], 2);
}

/// Beyond the ranked list an endpoint found unreachable (its connection or scrape refused) is
/// skipped: with one ranked endpoint of three, a first choice that closes its connections is
/// followed by the good endpoint alone once the dead one is known to refuse.
#[tokio::test]
async fn endpoints_beyond_the_ranked_list_skip_those_that_refuse() {
    let closer = Scripted::start(0, Close::Fin).await;
    let dead = refused_addr().await;
    let good = Upstream::start(Behaviour::Ok).await;
    let gw = start(
        3,
        "preset: round-robin, returnedEndpoints: 1",
        &[closer.addr, dead, good.addr],
    )
    .await;
    // Round-robin: closer, dead, good first in turn; the dead one is refused (and known as
    // such) by the second request at the latest.
    for i in 0..4 {
        let (status, headers, body) = gw.chat(&format!("r{i}")).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            headers["x-infergate-endpoint"],
            good.addr.to_string().as_str()
        );
    }
    // The closer first again: then straight to the good one.
    assert_eq!(gw.logged(4, "r3").await["attempts"], 2);
}
