//! A test client that plays Envoy's side of the ext_proc stream, and a scripted pool.
//!
//! `Envoy` opens one bidirectional `Process` stream per HTTP request, sends the messages a real
//! Envoy sends (headers, body chunks, trailers, response messages, metadata, protocol
//! configuration), and reads the answers. `ScriptedPool` routes to a fixed ranked list (honouring
//! the subset hint) and records every outcome the picker reports, so tests assert exact values.
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the harness"
)]

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    CommonResponse, HttpBody, HttpHeaders, HttpTrailers, ImmediateResponse, ProcessingRequest,
    ProcessingResponse, ProtocolConfiguration, body_mutation,
};
use envoy_types::pb::google::protobuf::value;
use hyper_util::rt::{TokioExecutor, TokioIo};
use infergate_extproc::pool::{EndpointPool, InflightGuard};
use infergate_extproc::server::serve_ext_proc;
use infergate_extproc::wire;
use infergate_scheduler::{Rejection, RequestContext, Usage};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// How long a test waits for an answer before failing (a hang is a failure, not a pass).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// Envoy's default HTTP/2 stream and connection windows (256 MiB), which its gRPC client uses.
pub const ENVOY_WINDOW: u32 = 256 << 20;

/// A running ext_proc server on 127.0.0.1.
pub struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Serves `service` on 127.0.0.1 port 0.
pub async fn serve<S: ExternalProcessor>(service: S) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        serve_ext_proc(listener, service, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Server {
        addr,
        stop: Some(stop),
    }
}

/// Envoy's side: a gRPC client that opens one stream per HTTP request.
#[derive(Clone)]
pub struct Envoy {
    client: ExternalProcessorClient<Direct>,
}

impl Envoy {
    /// One HTTP/2 connection to `addr` (TCP_NODELAY, Envoy's default windows), as Envoy keeps
    /// to an ext_proc cluster.
    pub async fn connect(addr: SocketAddr) -> Envoy {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Envoy::over(stream, format!("http://{addr}")).await
    }

    /// One HTTP/2 connection over TLS to `addr`, accepting any certificate and offering ALPN
    /// `h2`: what Envoy AI Gateway's cluster for an endpoint picker does (TLS with an empty
    /// validation context).
    pub async fn connect_tls(addr: SocketAddr) -> Envoy {
        let config = infergate_testkit::tls::accept_any_config(&[b"h2"]);
        let stream = infergate_testkit::tls::connect(addr, "localhost", config)
            .await
            .expect("TLS handshake with the ext_proc server");
        assert_eq!(
            stream.get_ref().1.alpn_protocol(),
            Some(&b"h2"[..]),
            "the ext_proc server must choose h2 by ALPN"
        );
        Envoy::over(stream, format!("https://{addr}")).await
    }

    /// One HTTP/2 connection over `stream`, already open (and through its TLS handshake, if
    /// any) to the server at `origin`: for a client configured otherwise than the above, such as
    /// one presenting a client certificate.
    pub async fn over<T>(stream: T, origin: String) -> Envoy
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(ENVOY_WINDOW)
            .initial_connection_window_size(ENVOY_WINDOW)
            .handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let origin = origin.parse().unwrap();
        Envoy {
            client: ExternalProcessorClient::with_origin(Direct(send), origin),
        }
    }

    /// Opens the stream for one HTTP request. Like Envoy, it does not wait for the server's
    /// response headers before sending messages (the picker sends them with its first answer).
    pub async fn open(&self) -> Exchange {
        let (tx, rx) = mpsc::channel(64);
        let mut client = self.client.clone();
        let mut call: Call = Box::pin(async move {
            client
                .process(ReceiverStream::new(rx))
                .await
                .map(tonic::Response::into_inner)
        });
        // One poll starts the call (the request headers go to the connection); the rest of it is
        // polled by whoever reads the first answer, so no extra task sits between the response
        // and its reader.
        let answers = match std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await {
            Poll::Ready(r) => Answers::Open(Box::new(r.expect("the server refused the stream"))),
            Poll::Pending => Answers::Opening(call),
        };
        Exchange {
            tx: Some(tx),
            answers,
        }
    }
}

type Call =
    Pin<Box<dyn Future<Output = Result<Streaming<ProcessingResponse>, tonic::Status>> + Send>>;

/// The answer side of a stream: the call in flight until the response headers arrive.
enum Answers {
    Opening(Call),
    Open(Box<Streaming<ProcessingResponse>>),
}

/// The HTTP/2 connection as the gRPC transport: each call goes straight to the connection, as in
/// Envoy's in-thread gRPC client (tonic's `Channel` first queues it to a buffer task, a hop Envoy
/// does not have and that would count in the measured latency).
#[derive(Clone)]
pub struct Direct(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for Direct {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(req))
    }
}

/// One HTTP request's ext_proc stream, from Envoy's side.
pub struct Exchange {
    tx: Option<mpsc::Sender<ProcessingRequest>>,
    answers: Answers,
}

impl Exchange {
    pub async fn send(&mut self, msg: ProcessingRequest) {
        self.tx
            .as_ref()
            .expect("stream already closed")
            .send(msg)
            .await
            .unwrap();
    }

    /// The answer stream, once the server's response headers have arrived.
    async fn answers(&mut self) -> &mut Streaming<ProcessingResponse> {
        if let Answers::Opening(call) = &mut self.answers {
            let answers = tokio::time::timeout(ANSWER_TIMEOUT, call)
                .await
                .expect("no response headers in time")
                .expect("the server refused the stream");
            self.answers = Answers::Open(Box::new(answers));
        }
        match &mut self.answers {
            Answers::Open(a) => a,
            Answers::Opening(_) => unreachable!("opened above"),
        }
    }

    /// The next answer; panics on a timeout, an error or the end of the stream.
    pub async fn next(&mut self) -> ProcessingResponse {
        let answers = self.answers().await;
        match tokio::time::timeout(ANSWER_TIMEOUT, answers.message()).await {
            Ok(Ok(Some(m))) => m,
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    /// The end of the answer stream (the server closed it cleanly).
    pub async fn expect_end(&mut self) {
        let answers = self.answers().await;
        match tokio::time::timeout(ANSWER_TIMEOUT, answers.message()).await {
            Ok(Ok(None)) => {}
            other => panic!("expected the stream to end, got {other:?}"),
        }
    }

    /// Stops sending: Envoy half-closes after the response ends.
    pub fn close_send(&mut self) {
        self.tx = None;
    }

    /// Reads streamed request-body answers until one carries end-of-stream or `n` were read.
    pub async fn streamed_body(&mut self, request: bool, n: usize) -> Vec<(Vec<u8>, bool)> {
        let mut out = Vec::new();
        while out.len() < n {
            let a = self.next().await;
            let (b, eos) = streamed(&a, request);
            out.push((b.to_vec(), eos));
            if eos {
                break;
            }
        }
        out
    }
}

// ---- messages Envoy sends --------------------------------------------------------------------

pub fn header_map(headers: &[(&str, &str)]) -> HeaderMap {
    HeaderMap {
        headers: headers
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).to_owned(),
                value: String::new(),
                raw_value: v.as_bytes().to_vec(),
            })
            .collect(),
    }
}

/// Request headers for `POST path` (plus `extra`), optionally ending the stream.
pub fn request_headers(
    path: &str,
    extra: &[(&str, &str)],
    end_of_stream: bool,
) -> ProcessingRequest {
    let mut h = vec![
        (":method", if end_of_stream { "GET" } else { "POST" }),
        (":path", path),
        (":authority", "gateway.example"),
        ("content-type", "application/json"),
    ];
    h.extend_from_slice(extra);
    ProcessingRequest {
        request: Some(Msg::RequestHeaders(HttpHeaders {
            headers: Some(header_map(&h)),
            end_of_stream,
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

/// Adds Envoy's protocol announcement (first message of a stream).
pub fn with_modes(
    mut msg: ProcessingRequest,
    request: BodySendMode,
    response: BodySendMode,
) -> ProcessingRequest {
    msg.protocol_config = Some(ProtocolConfiguration {
        request_body_mode: request as i32,
        response_body_mode: response as i32,
        send_body_without_waiting_for_header_response: false,
    });
    msg
}

pub fn with_metadata(mut msg: ProcessingRequest, md: Metadata) -> ProcessingRequest {
    msg.metadata_context = Some(md);
    msg
}

pub fn request_body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Msg::RequestBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

pub fn request_trailers() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Msg::RequestTrailers(HttpTrailers {
            trailers: Some(header_map(&[("x-checksum", "abc")])),
        })),
        ..ProcessingRequest::default()
    }
}

pub fn response_headers(status: u16, content_type: &str, end_of_stream: bool) -> ProcessingRequest {
    let status = status.to_string();
    ProcessingRequest {
        request: Some(Msg::ResponseHeaders(HttpHeaders {
            headers: Some(header_map(&[
                (":status", &status),
                ("content-type", content_type),
            ])),
            end_of_stream,
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

pub fn response_body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Msg::ResponseBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

pub fn response_trailers() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Msg::ResponseTrailers(HttpTrailers::default())),
        ..ProcessingRequest::default()
    }
}

/// Splits `body` into chunks following `sizes` cyclically.
pub fn split<'a>(body: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = body;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes[i % sizes.len()].clamp(1, rest.len());
        let (a, b) = rest.split_at(n);
        out.push(a);
        rest = b;
        i += 1;
    }
    out
}

// ---- reading answers -------------------------------------------------------------------------

/// A routing answer (request headers or buffered body), decoded.
#[derive(Debug)]
pub struct Route {
    /// Header mutations set, in order.
    pub set: Vec<(String, String)>,
    pub removed: Vec<String>,
    pub clear_route_cache: bool,
    /// `envoy.lb` / `x-gateway-destination-endpoint` from dynamic metadata.
    pub metadata_destination: Option<String>,
    pub body_mutation: Option<body_mutation::Mutation>,
}

impl Route {
    pub fn header(&self, key: &str) -> Option<&str> {
        self.set
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn decode_common(c: Option<&CommonResponse>, a: &ProcessingResponse) -> Route {
    let c = c.cloned().unwrap_or_default();
    let (set, removed) = match c.header_mutation {
        Some(m) => (
            m.set_headers
                .into_iter()
                .filter_map(|o| o.header)
                .map(|h| {
                    let v = String::from_utf8(wire::header_value(&h).to_vec()).unwrap();
                    (h.key, v)
                })
                .collect(),
            m.remove_headers,
        ),
        None => (Vec::new(), Vec::new()),
    };
    let metadata_destination =
        a.dynamic_metadata
            .as_ref()
            .and_then(|s| match &s.fields.get(wire::LB_NAMESPACE)?.kind {
                Some(value::Kind::StructValue(ns)) => {
                    match &ns.fields.get(wire::DESTINATION_HEADER)?.kind {
                        Some(value::Kind::StringValue(v)) => Some(v.clone()),
                        _ => None,
                    }
                }
                _ => None,
            });
    Route {
        set,
        removed,
        clear_route_cache: c.clear_route_cache,
        metadata_destination,
        body_mutation: c.body_mutation.and_then(|b| b.mutation),
    }
}

/// Decodes a `request_headers` answer; panics on anything else.
pub fn headers_answer(a: &ProcessingResponse) -> Route {
    match &a.response {
        Some(Answer::RequestHeaders(h)) => decode_common(h.response.as_ref(), a),
        other => panic!("expected a request-headers answer, got {other:?}"),
    }
}

/// Decodes a buffered `request_body` answer; panics on anything else.
pub fn body_answer(a: &ProcessingResponse) -> Route {
    match &a.response {
        Some(Answer::RequestBody(b)) => decode_common(b.response.as_ref(), a),
        other => panic!("expected a request-body answer, got {other:?}"),
    }
}

/// The streamed chunk in a body answer (request or response path).
pub fn streamed(a: &ProcessingResponse, request: bool) -> (&[u8], bool) {
    let br = match (&a.response, request) {
        (Some(Answer::RequestBody(b)), true) | (Some(Answer::ResponseBody(b)), false) => b,
        other => panic!("expected a streamed body answer, got {other:?}"),
    };
    match br
        .response
        .as_ref()
        .and_then(|c| c.body_mutation.as_ref())
        .and_then(|m| m.mutation.as_ref())
    {
        Some(body_mutation::Mutation::StreamedResponse(s)) => (&s.body, s.end_of_stream),
        other => panic!("expected a streamed body mutation, got {other:?}"),
    }
}

/// The immediate response in an answer; panics on anything else.
pub fn immediate(a: &ProcessingResponse) -> &ImmediateResponse {
    match &a.response {
        Some(Answer::ImmediateResponse(i)) => i,
        other => panic!("expected an immediate response, got {other:?}"),
    }
}

/// Status, headers and parsed JSON body of an immediate response.
pub fn immediate_parts(
    a: &ProcessingResponse,
) -> (i32, HashMap<String, String>, serde_json::Value) {
    let i = immediate(a);
    let headers = i
        .headers
        .as_ref()
        .map(|m| {
            m.set_headers
                .iter()
                .filter_map(|o| o.header.as_ref())
                .map(|h| {
                    (
                        h.key.clone(),
                        String::from_utf8_lossy(wire::header_value(h)).into_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let body = serde_json::from_slice(&i.body).unwrap();
    (i.status.as_ref().map_or(0, |s| s.code), headers, body)
}

pub fn is_response_headers_continue(a: &ProcessingResponse) -> bool {
    matches!(&a.response, Some(Answer::ResponseHeaders(h)) if h.response.as_ref().is_none_or(|c| c.header_mutation.is_none() && c.body_mutation.is_none()))
}

pub fn is_trailers(a: &ProcessingResponse, request: bool) -> bool {
    matches!(
        (&a.response, request),
        (Some(Answer::RequestTrailers(_)), true) | (Some(Answer::ResponseTrailers(_)), false)
    )
}

// ---- scripted pool ---------------------------------------------------------------------------

/// What the picker reported for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Picked {
        model: String,
        lora: Option<String>,
        prompt: String,
        prompt_tokens: u32,
        output_tokens: u32,
        subset: Option<Vec<SocketAddr>>,
    },
    Reassigned(SocketAddr),
    FirstToken,
    Completed(Usage),
    Failed,
    Cancelled,
}

#[derive(Default)]
struct Script {
    events: Mutex<Vec<Event>>,
    inflight: AtomicUsize,
}

/// A pool that always ranks `endpoints` in order (filtered by the subset hint), or sheds.
#[derive(Clone)]
pub struct ScriptedPool {
    endpoints: Vec<SocketAddr>,
    shed: Option<Duration>,
    script: Arc<Script>,
}

impl ScriptedPool {
    pub fn new(endpoints: &[&str]) -> Self {
        ScriptedPool {
            endpoints: endpoints.iter().map(|e| e.parse().unwrap()).collect(),
            shed: None,
            script: Arc::default(),
        }
    }

    /// Every pick is shed with this `Retry-After`.
    pub fn shedding(mut self, retry_after: Duration) -> Self {
        self.shed = Some(retry_after);
        self
    }

    pub fn events(&self) -> Vec<Event> {
        self.script.events.lock().unwrap().clone()
    }

    pub fn inflight(&self) -> usize {
        self.script.inflight.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until in-flight reaches `n`: the server releases after its stream task
    /// notices the end, which is asynchronous to the client.
    pub async fn wait_inflight(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
        while self.inflight() != n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "in-flight stuck at {}",
                self.inflight()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

pub struct ScriptedInflight {
    endpoints: Vec<SocketAddr>,
    script: Arc<Script>,
    done: bool,
}

impl ScriptedInflight {
    fn record(&self, e: Event) {
        self.script.events.lock().unwrap().push(e);
    }

    fn finish(mut self, e: Event) {
        self.done = true;
        self.script.inflight.fetch_sub(1, Ordering::SeqCst);
        self.record(e);
    }
}

impl Drop for ScriptedInflight {
    fn drop(&mut self) {
        if !self.done {
            self.script.inflight.fetch_sub(1, Ordering::SeqCst);
            self.record(Event::Cancelled);
        }
    }
}

impl InflightGuard for ScriptedInflight {
    fn endpoints(&self) -> &[SocketAddr] {
        &self.endpoints
    }
    fn reassign(&mut self, addr: SocketAddr) {
        self.record(Event::Reassigned(addr));
    }
    fn first_token(&mut self) {
        self.record(Event::FirstToken);
    }
    fn complete(self, usage: Usage) {
        self.finish(Event::Completed(usage));
    }
    fn fail(self) {
        self.finish(Event::Failed);
    }
}

impl EndpointPool for ScriptedPool {
    type Inflight = ScriptedInflight;

    fn pick(&self, cx: &RequestContext<'_>) -> Result<ScriptedInflight, Rejection> {
        self.script.events.lock().unwrap().push(Event::Picked {
            model: cx.model.to_owned(),
            lora: cx.lora_adapter.map(str::to_owned),
            prompt: cx.prompt.concat(),
            prompt_tokens: cx.prompt_tokens,
            output_tokens: cx.output_tokens,
            subset: cx.subset.map(<[SocketAddr]>::to_vec),
        });
        if let Some(retry_after) = self.shed {
            return Err(Rejection::Shed { retry_after });
        }
        let endpoints: Vec<SocketAddr> = self
            .endpoints
            .iter()
            .copied()
            .filter(|e| cx.subset.is_none_or(|s| s.contains(e)))
            .collect();
        if endpoints.is_empty() {
            return Err(Rejection::NoEndpoints);
        }
        self.script.inflight.fetch_add(1, Ordering::SeqCst);
        Ok(ScriptedInflight {
            endpoints,
            script: Arc::clone(&self.script),
            done: false,
        })
    }

    fn is_ready(&self) -> bool {
        !self.endpoints.is_empty()
    }
}
