//! Small OpenAI-compatible model servers on 127.0.0.1 with scripted behaviour, and the client
//! calls the tests make (over `infergate_testkit`).
#![allow(dead_code, reason = "each test binary uses a different part")]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};

/// How an upstream answers model requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// A normal answer: JSON, or SSE when the request streams.
    Ok,
    /// `500` with a JSON error body.
    Fail500,
    /// `Fail500` for its 1st, 3rd, 5th... request, `Ok` for the others.
    FailEveryOther,
    /// `200` SSE headers and one event, then the connection breaks.
    AbortMidStream,
    /// SSE: one event, then one more every time `Upstream::step` is notified; never ends.
    Stepped,
    /// Reads the request and never answers.
    Hang,
    /// This status with no body (`content-length: 0`), as a proxy in front of a model server
    /// may answer.
    Empty(u16),
}

/// What an upstream saw.
#[derive(Default)]
pub struct Seen {
    pub requests: AtomicUsize,
    pub disconnected: AtomicBool,
    pub last_request_id: std::sync::Mutex<Option<String>>,
    pub last_path: std::sync::Mutex<Option<String>>,
    /// The last model request's headers.
    pub last_headers: std::sync::Mutex<Option<http::HeaderMap>>,
}

/// A running upstream.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    pub step: Arc<Notify>,
    pub waiting: Arc<AtomicU32>,
}

/// A body fed from a channel, so a test decides when each chunk leaves.
struct ChannelBody(mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data)))
    }
}

type Boxed = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

fn full(s: impl Into<Bytes>) -> Boxed {
    Full::new(s.into())
        .map_err(|n: Infallible| match n {})
        .boxed()
}

pub const CHAT_JSON: &str = r#"{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#;
pub const COMPLETION_JSON: &str = r#"{"id":"t1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"hello","finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}"#;

fn sse_event(text: &str) -> Bytes {
    Bytes::from(format!(
        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
    ))
}

const SSE_USAGE: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}}\n\n";

impl Upstream {
    pub async fn start(behaviour: Behaviour) -> Upstream {
        Upstream::start_with(behaviour, None).await
    }

    /// As [`Upstream::start`], serving HTTPS (API and `/metrics`) when `tls` is set.
    pub async fn start_with(
        behaviour: Behaviour,
        tls: Option<infergate_pool::tls::ServerTls>,
    ) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let step = Arc::new(Notify::new());
        let waiting = Arc::new(AtomicU32::new(0));
        let (s, st, w) = (Arc::clone(&seen), Arc::clone(&step), Arc::clone(&waiting));
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (seen, step, waiting) = (Arc::clone(&s), Arc::clone(&st), Arc::clone(&w));
                let tls = tls.clone();
                tokio::spawn(async move {
                    let Ok(stream) = infergate_pool::tls::accept_tls(tls.as_ref(), stream).await
                    else {
                        return;
                    };
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (seen, step, waiting) =
                            (Arc::clone(&seen), Arc::clone(&step), Arc::clone(&waiting));
                        async move {
                            Ok::<_, Infallible>(answer(req, behaviour, seen, step, waiting).await)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Upstream {
            addr,
            seen,
            step,
            waiting,
        }
    }

    pub fn requests(&self) -> usize {
        self.seen.requests.load(Ordering::SeqCst)
    }
}

async fn answer(
    req: Request<Incoming>,
    behaviour: Behaviour,
    seen: Arc<Seen>,
    step: Arc<Notify>,
    waiting: Arc<AtomicU32>,
) -> Response<Boxed> {
    if req.uri().path() == "/metrics" {
        let page = format!(
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name=\"m\"}} {}\n\
             # TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"m\"}} 0\n\
             # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{model_name=\"m\"}} 0.1\n",
            waiting.load(Ordering::SeqCst)
        );
        return Response::new(full(page));
    }
    let nth = seen.requests.fetch_add(1, Ordering::SeqCst) + 1;
    let behaviour = match behaviour {
        Behaviour::FailEveryOther if nth % 2 == 1 => Behaviour::Fail500,
        Behaviour::FailEveryOther => Behaviour::Ok,
        b => b,
    };
    *seen.last_request_id.lock().unwrap() = req
        .headers()
        .get("x-request-id")
        .map(|v| v.to_str().unwrap().to_owned());
    *seen.last_path.lock().unwrap() = Some(req.uri().path().to_owned());
    *seen.last_headers.lock().unwrap() = Some(req.headers().clone());
    let path = req.uri().path().to_owned();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let stream = v["stream"].as_bool().unwrap_or(false);
    match behaviour {
        Behaviour::Hang => std::future::pending().await,
        Behaviour::Empty(status) => {
            let mut r = Response::new(full(Bytes::new()));
            *r.status_mut() = StatusCode::from_u16(status).unwrap();
            r
        }
        Behaviour::Fail500 | Behaviour::FailEveryOther => {
            let mut r = Response::new(full(r#"{"error":{"message":"engine died"}}"#));
            *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            // A header only the gateway may send (its own overload), which it must not pass on.
            r.headers_mut().insert(
                "x-infergate-overloaded",
                http::HeaderValue::from_static("gateway_busy"),
            );
            r
        }
        Behaviour::Ok if !stream => Response::new(full(if path.ends_with("/chat/completions") {
            CHAT_JSON
        } else {
            COMPLETION_JSON
        })),
        Behaviour::Ok => {
            let (tx, rx) = mpsc::channel(8);
            tokio::spawn(async move {
                for t in ["hel", "lo"] {
                    let _ = tx.send(Ok(sse_event(t))).await;
                }
                let _ = tx.send(Ok(Bytes::from_static(SSE_USAGE.as_bytes()))).await;
                let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
            });
            sse(rx)
        }
        Behaviour::AbortMidStream => {
            let (tx, rx) = mpsc::channel(8);
            tokio::spawn(async move {
                let _ = tx.send(Ok(sse_event("partial"))).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = tx.send(Err(std::io::Error::other("engine crashed"))).await;
            });
            sse(rx)
        }
        Behaviour::Stepped => {
            let (tx, rx) = mpsc::channel(1);
            tokio::spawn(async move {
                let mut i = 0u32;
                loop {
                    if tx.send(Ok(sse_event(&format!("t{i}")))).await.is_err() {
                        seen.disconnected.store(true, Ordering::SeqCst);
                        return;
                    }
                    i += 1;
                    tokio::select! {
                        () = step.notified() => {}
                        () = tx.closed() => {
                            seen.disconnected.store(true, Ordering::SeqCst);
                            return;
                        }
                    }
                }
            });
            sse(rx)
        }
    }
}

fn sse(rx: mpsc::Receiver<Result<Bytes, std::io::Error>>) -> Response<Boxed> {
    let mut r = Response::new(ChannelBody(rx).boxed());
    r.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    r
}

/// An address nothing listens on: connecting to it is refused.
pub async fn refused_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

/// A plain HTTP/1.1 client.
pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// Opens a streamed chat request for `model` through the gateway at `gw` and reads its first
/// frame: against a `Stepped` upstream the request stays open (holding its concurrency slot)
/// until the returned body is dropped.
pub async fn open_stream(gw: SocketAddr, model: &str) -> Incoming {
    let chat = format!(
        r#"{{"model":"{model}","stream":true,"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let req = Request::post(format!("http://{gw}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat)))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    body
}

/// Sends a request (a JSON body, and `headers`) and returns status, headers and the whole body.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, Bytes) {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let request = b.body(Bytes::from(body.to_owned())).unwrap();
    let r = infergate_testkit::send(addr, request)
        .await
        .unwrap_or_else(|e| panic!("{method} {path} on {addr}: {e}"));
    (r.status, r.headers, r.body)
}

/// POSTs a JSON body.
pub async fn post(
    addr: SocketAddr,
    path: &str,
    body: &str,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let r = infergate_testkit::post(addr, path, "application/json", body).await;
    (r.status, r.headers, r.body)
}

/// GETs a path.
pub async fn get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let r = infergate_testkit::get(addr, path).await;
    (r.status, r.text())
}

/// Emulated pods (`infergate-sim`) from a fleet file's YAML, on free loopback ports; they stop
/// when the returned sender is dropped or sent to.
pub async fn serve_emulated(
    yaml: &str,
) -> (infergate_sim::ServedFleet, tokio::sync::oneshot::Sender<()>) {
    let spec = infergate_sim::FleetSpec::from_yaml(yaml).unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let fleet = infergate_sim::serve_fleet(&spec, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    (fleet, stop)
}

/// Waits (10 s at most) until the gateway's admin port answers `/readyz` with 200: every pod
/// scraped.
pub async fn wait_ready(admin: SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while get(admin, "/readyz").await.0 != 200 {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The gateway on two workers with an admin port, all on free loopback ports; it stops when the
/// returned sender is dropped or sent to.
pub async fn serve_gateway(
    config: infergate_proxy::GatewayConfig,
) -> (infergate_proxy::Gateway, tokio::sync::oneshot::Sender<()>) {
    let local = "127.0.0.1:0".parse().unwrap();
    let listeners = infergate_proxy::WorkerListeners::bind(local, Some(local), 2).unwrap();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let gw = infergate_proxy::serve_workers(config, listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    (gw, stop)
}
