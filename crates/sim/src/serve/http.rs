//! HTTP side of an emulated pod: routing, OpenAI request parsing, JSON and SSE responses.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use infergate_tokenizer::{ChatRequest, Error as TokenizerError, ModelTokenizer};
use rand::Rng;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use super::{POD_HEADER, PodShared, TokenEvent, lock, peer, responses};
use crate::engine::{Completion, EngineRequest};
use crate::spec::{EngineKind, MetricsFault};
use crate::tokens::Prompt;

/// Largest request body accepted (vLLM has no limit of its own; proxies usually cap far lower).
const MAX_BODY: usize = 32 * 1024 * 1024;
/// Output length when a chat request sets no limit.
pub(crate) const DEFAULT_CHAT_MAX_TOKENS: u32 = 256;
/// Output length when a completions request sets no limit (the OpenAI default).
const DEFAULT_COMPLETION_MAX_TOKENS: u32 = 16;

const WORDS: [&str; 16] = [
    " the",
    " model",
    " server",
    " answers",
    " with",
    " tokens",
    " from",
    " an",
    " emulated",
    " GPU",
    " and",
    " a",
    " simulated",
    " cache",
    " of",
    " blocks",
];

pub(crate) async fn accept_loop(
    listener: TcpListener,
    shared: Arc<PodShared>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let Ok((stream, _)) = accepted else { continue };
        let shared = shared.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(shared, req).await) }
            });
            // HTTP/1.1, or HTTP/2 with prior knowledge (h2c), as an Envoy upstream may speak.
            let builder = auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = stop.changed() => {}
            }
        });
    }
}

/// Response body: a whole buffer or a token stream.
pub(crate) enum SimBody {
    Full(Option<Bytes>),
    Sse(Box<SseStream>),
    /// The Responses API's named events ([`responses`]).
    Events(Box<responses::EventStream>),
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            SimBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            SimBody::Sse(s) => s.poll_next(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
            SimBody::Events(s) => s.poll_next(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    // A whole buffer has a known length, so HTTP/1.1 answers carry `content-length` (as a real
    // model server's do) instead of a chunked body.
    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            SimBody::Full(b) => {
                http_body::SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64))
            }
            SimBody::Sse(_) | SimBody::Events(_) => http_body::SizeHint::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Api {
    Chat,
    Completions,
}

impl Api {
    fn handler(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
        }
    }
}

/// Aborts the request in the engine if the response is dropped before the request finished
/// (client disconnect), as vLLM does.
pub(crate) struct AbortOnDrop {
    shared: Arc<PodShared>,
    id: u64,
    armed: bool,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if self.armed {
            lock(&self.shared.streams).remove(&self.id);
            lock(&self.shared.engine).abort(self.id);
        }
    }
}

/// What the engine produced next for an admitted request.
pub(crate) enum Fed {
    /// The text of the next output token.
    Word(&'static str),
    /// The request finished.
    Done(Completion),
    /// The engine went away before the request finished.
    Closed,
}

/// An admitted request's token events, as text; dropping it before [`Fed::Done`] aborts the
/// request in the engine.
pub(crate) struct TokenFeed {
    guard: AbortOnDrop,
    rx: mpsc::UnboundedReceiver<TokenEvent>,
    /// The engine request's id: it picks the words of the answer.
    pub(crate) id: u64,
}

impl TokenFeed {
    pub(crate) fn poll_fed(&mut self, cx: &mut Context<'_>) -> Poll<Fed> {
        self.rx.poll_recv(cx).map(|event| match event {
            Some(TokenEvent::Token { index }) => Fed::Word(word(self.id, index)),
            Some(TokenEvent::Done(c)) => {
                self.guard.armed = false;
                Fed::Done(c)
            }
            None => Fed::Closed,
        })
    }

    /// The whole answer: its text and completion record, or the error when the engine stopped.
    pub(crate) async fn collect(
        mut self,
        shared: &PodShared,
    ) -> Result<(String, Completion), Response<SimBody>> {
        let mut text = String::new();
        loop {
            match std::future::poll_fn(|cx| self.poll_fed(cx)).await {
                Fed::Word(w) => text.push_str(w),
                Fed::Done(c) => return Ok((text, c)),
                Fed::Closed => {
                    return Err(error(
                        shared,
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the engine stopped",
                        None,
                    ));
                }
            }
        }
    }
}

/// Streams SSE chunks as the driver reports tokens.
pub(crate) struct SseStream {
    feed: TokenFeed,
    api: Api,
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    finish_reason: &'static str,
    started: bool,
    ended: bool,
}

impl SseStream {
    fn chunk(&self, delta_or_text: Value, finish: Option<&str>) -> Value {
        let choice = match self.api {
            Api::Chat => {
                json!({"index": 0, "delta": delta_or_text, "logprobs": null, "finish_reason": finish})
            }
            Api::Completions => {
                json!({"index": 0, "text": delta_or_text, "logprobs": null, "finish_reason": finish})
            }
        };
        let object = match self.api {
            Api::Chat => "chat.completion.chunk",
            Api::Completions => "text_completion",
        };
        let mut v = json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [choice]});
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if !self.started && self.api == Api::Chat {
            self.started = true;
            let c = self.chunk(json!({"role": "assistant", "content": ""}), None);
            return Poll::Ready(Some(sse(&c)));
        }
        self.started = true;
        match self.feed.poll_fed(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Fed::Closed) => {
                self.ended = true;
                Poll::Ready(Some(Bytes::from_static(b"data: [DONE]\n\n")))
            }
            Poll::Ready(Fed::Word(word)) => {
                let c = match self.api {
                    Api::Chat => self.chunk(json!({"content": word}), None),
                    Api::Completions => self.chunk(json!(word), None),
                };
                Poll::Ready(Some(sse(&c)))
            }
            Poll::Ready(Fed::Done(done)) => {
                self.ended = true;
                let mut out = Vec::new();
                let last = match self.api {
                    Api::Chat => self.chunk(json!({}), Some(self.finish_reason)),
                    Api::Completions => self.chunk(json!(""), Some(self.finish_reason)),
                };
                out.extend_from_slice(&sse(&last));
                if self.include_usage {
                    let mut u = self.chunk(Value::Null, None);
                    u["choices"] = json!([]);
                    u["usage"] = usage(&done);
                    out.extend_from_slice(&sse(&u));
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                Poll::Ready(Some(Bytes::from(out)))
            }
        }
    }
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn word(seed: u64, index: u32) -> &'static str {
    let i = (seed.wrapping_mul(31).wrapping_add(u64::from(index)) % WORDS.len() as u64) as usize;
    WORDS[i]
}

fn usage(c: &Completion) -> Value {
    json!({
        "prompt_tokens": c.prompt_tokens,
        "total_tokens": c.prompt_tokens + c.output_tokens,
        "completion_tokens": c.output_tokens,
        "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
    })
}

fn response(
    shared: &PodShared,
    status: StatusCode,
    content_type: &'static str,
    body: SimBody,
) -> Response<SimBody> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Ok(v) = HeaderValue::from_str(&shared.name) {
        r.headers_mut().insert(POD_HEADER, v);
    }
    r
}

/// A `200` server-sent event stream.
pub(crate) fn streaming(shared: &PodShared, body: SimBody) -> Response<SimBody> {
    response(shared, StatusCode::OK, "text/event-stream", body)
}

pub(crate) fn json_response(
    shared: &PodShared,
    status: StatusCode,
    v: &Value,
) -> Response<SimBody> {
    response(
        shared,
        status,
        "application/json",
        SimBody::Full(Some(Bytes::from(v.to_string()))),
    )
}

/// An OpenAI-style error.
pub(crate) fn error(
    shared: &PodShared,
    status: StatusCode,
    message: &str,
    param: Option<&str>,
) -> Response<SimBody> {
    let kind = match status {
        StatusCode::NOT_FOUND => "NotFoundError",
        StatusCode::PAYLOAD_TOO_LARGE => "RequestTooLargeError",
        s if s.is_server_error() => "InternalServerError",
        _ => "BadRequestError",
    };
    json_response(
        shared,
        status,
        &json!({"error": {"message": message, "type": kind, "param": param, "code": status.as_u16()}}),
    )
}

/// vLLM's `POST /reset_prefix_cache`: drops every cached block (an `AllBlocksCleared` event
/// when the pod publishes them); refused while requests hold blocks.
fn reset_prefix_cache(shared: &Arc<PodShared>) -> Response<SimBody> {
    let now = shared.now();
    let mut e = lock(&shared.engine);
    if !e.reset_prefix_cache(now) {
        drop(e);
        return json_response(
            shared,
            StatusCode::CONFLICT,
            &json!({"detail": "requests in flight hold cached blocks; reset refused"}),
        );
    }
    if let Some(feed) = &shared.kv {
        let mut events = Vec::new();
        e.drain_kv_events(now, &mut events);
        drop(e);
        feed.publish(now + shared.start_unix, &mut events);
    }
    response(
        shared,
        StatusCode::OK,
        "application/json",
        SimBody::Full(None),
    )
}

async fn handle(shared: Arc<PodShared>, req: Request<Incoming>) -> Response<SimBody> {
    // A hung pod accepts the connection and never answers until the fault clears.
    let mut faults = shared.faults.subscribe();
    while faults.borrow_and_update().hang {
        if faults.changed().await.is_err() {
            break;
        }
    }
    let path = req.uri().path().to_owned();
    if path == "/metrics" {
        // A stalled `/metrics` (a busy server's event loop) answers nothing until the fault
        // clears, while inference keeps being served.
        while faults.borrow_and_update().metrics == MetricsFault::Stall {
            if faults.changed().await.is_err() {
                break;
            }
        }
    }
    match (req.method(), path.as_str()) {
        (&Method::GET, "/health") => response(
            &shared,
            StatusCode::OK,
            "application/json",
            SimBody::Full(None),
        ),
        (&Method::GET, "/metrics") => metrics(&shared),
        (&Method::GET, "/v1/models") => models(&shared),
        (&Method::POST, "/v1/chat/completions") => inference(shared, req, Api::Chat).await,
        (&Method::POST, "/v1/completions") => inference(shared, req, Api::Completions).await,
        (&Method::POST, "/v1/responses") if shared.kind == EngineKind::Vllm => {
            responses::handle(shared, req).await
        }
        (&Method::POST, "/reset_prefix_cache") if shared.kind == EngineKind::Vllm => {
            reset_prefix_cache(&shared)
        }
        (_, path) if shared.kind == EngineKind::Vllm && peer::serves(path) => {
            peer::handle(shared, path, req).await
        }
        (_, "/v1/chat/completions" | "/v1/completions" | "/v1/models" | "/health" | "/metrics") => {
            method_not_allowed(&shared)
        }
        (_, "/v1/responses") if shared.kind == EngineKind::Vllm => method_not_allowed(&shared),
        _ => json_response(
            &shared,
            StatusCode::NOT_FOUND,
            &json!({"detail": "Not Found"}),
        ),
    }
}

fn method_not_allowed(shared: &PodShared) -> Response<SimBody> {
    json_response(
        shared,
        StatusCode::METHOD_NOT_ALLOWED,
        &json!({"detail": "Method Not Allowed"}),
    )
}

fn metrics(shared: &PodShared) -> Response<SimBody> {
    let mode = shared.faults.borrow().metrics;
    let page = match mode {
        MetricsFault::Missing => {
            return json_response(
                shared,
                StatusCode::NOT_FOUND,
                &json!({"detail": "Not Found"}),
            );
        }
        MetricsFault::Frozen => {
            let frozen = lock(&shared.pages).frozen.clone();
            match frozen {
                Some(p) => p,
                None => {
                    let p = shared.render_page();
                    // Two scrapes may both have found no page and rendered one each: the first
                    // kept is the frozen page from then on, for both of them too.
                    lock(&shared.pages).frozen.get_or_insert(p).clone()
                }
            }
        }
        MetricsFault::Normal | MetricsFault::Stall => shared.render_page(),
    };
    response(
        shared,
        StatusCode::OK,
        "text/plain; version=0.0.4; charset=utf-8",
        SimBody::Full(Some(Bytes::from(page))),
    )
}

fn models(shared: &PodShared) -> Response<SimBody> {
    let created = shared.start_unix as u64;
    let max_len = shared.profile.max_model_len;
    let mut data = vec![json!({
        "id": &*shared.model, "object": "model", "created": created, "owned_by": shared.kind.as_str(),
        "root": &*shared.model, "parent": null, "max_model_len": max_len, "permission": [],
    })];
    for a in &shared.adapters {
        data.push(json!({
            "id": &**a, "object": "model", "created": created, "owned_by": shared.kind.as_str(),
            "root": &**a, "parent": &*shared.model, "max_model_len": max_len, "permission": [],
        }));
    }
    json_response(
        shared,
        StatusCode::OK,
        &json!({"object": "list", "data": data}),
    )
}

/// A parsed inference request.
pub(crate) struct Parsed {
    pub(crate) prompt: Prompt,
    /// The ids of a prompt sent as token ids (completions only).
    pub(crate) prompt_ids: Option<Vec<u32>>,
    pub(crate) max_tokens: u32,
    /// The request set the output length (so it ends at it: `finish_reason: "length"`).
    pub(crate) explicit_max: bool,
    pub(crate) lora: Option<u16>,
    /// The request's `cache_salt` ([`cache_salt`]).
    pub(crate) cache_salt: Option<Arc<str>>,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) model: String,
}

/// Why a request is refused: status, message, the offending field.
pub(crate) type Reject = (StatusCode, String, Option<&'static str>);

pub(crate) fn bad(msg: impl Into<String>, param: &'static str) -> Reject {
    (StatusCode::BAD_REQUEST, msg.into(), Some(param))
}

/// The body as a JSON object.
pub(crate) fn object(body: &[u8]) -> Result<serde_json::Map<String, Value>, Reject> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("request body is not valid JSON: {e}"),
            None,
        )
    })?;
    match v {
        Value::Object(obj) => Ok(obj),
        _ => Err((
            StatusCode::BAD_REQUEST,
            "request body must be a JSON object".to_owned(),
            None,
        )),
    }
}

/// The adapter slot a served model name stands for (`None` = the base model); unknown → 404.
pub(crate) fn resolve_model(shared: &PodShared, model: &str) -> Result<Option<u16>, Reject> {
    if model == &*shared.model {
        return Ok(None);
    }
    match shared
        .adapters
        .iter()
        .position(|a| **a == *model)
        .and_then(|i| u16::try_from(i).ok())
    {
        Some(i) => Ok(Some(i)),
        None => Err((
            StatusCode::NOT_FOUND,
            format!("The model `{model}` does not exist."),
            Some("model"),
        )),
    }
}

/// An optional boolean field (`null` = absent).
/// Whether a JSON value is true as Python tests it (`if value:`), as vLLM's validators do:
/// `null`, `false`, `0`, `""`, `[]` and `{}` are not.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

pub(crate) fn opt_bool(
    obj: &serde_json::Map<String, Value>,
    key: &'static str,
) -> Result<Option<bool>, Reject> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(bad(format!("{key} must be a boolean"), key)),
    }
}

/// A list of token ids (each within `u32`).
pub(crate) fn token_list(v: &Value, key: &'static str) -> Result<Vec<u32>, Reject> {
    let items = v
        .as_array()
        .ok_or_else(|| bad(format!("{key} must be a list of token ids"), key))?;
    items
        .iter()
        .map(|t| t.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| {
            bad(
                format!("{key} must hold integer token ids from 0 to {}", u32::MAX),
                key,
            )
        })
}

/// The prompt text of a chat request, with the emulator's stand-in chat template:
/// `<|role|>\n` before each message's text and `\n` after it, then `<|assistant|>\n` when the
/// model is to answer (`add_generation_prompt`, vLLM's default).
pub(crate) fn render_chat(
    obj: &serde_json::Map<String, Value>,
    add_generation_prompt: bool,
) -> Result<String, Reject> {
    let msgs = match obj.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => return Err(bad("messages must not be empty", "messages")),
        Some(_) => return Err(bad("messages must be a list", "messages")),
        None => return Err(bad("field required: messages", "messages")),
    };
    let mut text = String::new();
    for m in msgs {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("every message needs a string role", "messages"))?;
        push_message(&mut text, role, m.get("content"), "messages")?;
    }
    if add_generation_prompt {
        text.push_str(GENERATION_PROMPT);
    }
    Ok(text)
}

/// What the stand-in chat template appends for the model to answer.
pub(crate) const GENERATION_PROMPT: &str = "<|assistant|>\n";

/// Appends one message in the stand-in chat template; `content` is a string, a list of parts
/// (their `text`) or nothing. `param` names the request field the message came from.
pub(crate) fn push_message(
    text: &mut String,
    role: &str,
    content: Option<&Value>,
    param: &'static str,
) -> Result<(), Reject> {
    text.push_str("<|");
    text.push_str(role);
    text.push_str("|>\n");
    match content {
        Some(Value::String(s)) => text.push_str(s),
        Some(Value::Array(parts)) => {
            for p in parts {
                if let Some(t) = p.get("text").and_then(Value::as_str) {
                    text.push_str(t);
                }
            }
        }
        Some(Value::Null) | None => {}
        Some(_) => {
            return Err(bad(
                "message content must be a string or a list of parts",
                param,
            ));
        }
    }
    text.push('\n');
    Ok(())
}

/// A completions prompt: text for the stand-in, or the model tokenizer's ids (with its special
/// tokens unless the request's `add_special_tokens` is false, vLLM's default being true).
fn completion_prompt(
    tokenizer: Option<&ModelTokenizer>,
    obj: &serde_json::Map<String, Value>,
    text: &str,
) -> Result<Prompt, Reject> {
    let Some(t) = tokenizer else {
        return Ok(Prompt::Text(text.into()));
    };
    let add_special_tokens = opt_bool(obj, "add_special_tokens")?.unwrap_or(true);
    let mut ids = Vec::new();
    t.encode_completion(text, add_special_tokens, &mut ids)
        .map_err(|e| tokenizer_reject(&e, "prompt"))?;
    Ok(Prompt::Ids(ids.into()))
}

/// The token ids of a chat request (its whole body) with the model's tokenizer and chat
/// template, as vLLM computes them.
pub(crate) fn encode_chat(tokenizer: &ModelTokenizer, body: &[u8]) -> Result<Vec<u32>, Reject> {
    let mut ids = Vec::new();
    ChatRequest::from_json(body)
        .and_then(|request| tokenizer.encode_chat(&request, &mut ids))
        .map_err(|e| tokenizer_reject(&e, "messages"))?;
    Ok(ids)
}

/// What vLLM answers a request its tokenizer or chat template cannot handle: 400 with the reason
/// (its chat handler turns the template's and the tokenizer's `ValueError`, `TypeError` and
/// `TemplateError` into a `BadRequestError`; a model without a chat template gets its
/// "no default chat template" message). `param` names the field the text came from.
pub(crate) fn tokenizer_reject(e: &TokenizerError, param: &'static str) -> Reject {
    let message = match e {
        TokenizerError::NoChatTemplate => NO_CHAT_TEMPLATE.to_owned(),
        TokenizerError::TemplateRefused { message } => message.clone(),
        _ => {
            let mut m = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                m.push_str(": ");
                m.push_str(&c.to_string());
                cause = c.source();
            }
            m
        }
    };
    // A request-level field the tokenizer refuses (`tools`, `chat_template`, ...) is the one
    // to name; what it refuses inside a message stays the request's text field.
    let param = match e {
        TokenizerError::Unsupported { field, .. } if !field.starts_with("messages") => field,
        _ => param,
    };
    (StatusCode::BAD_REQUEST, message, Some(param))
}

/// vLLM's answer to a chat request for a model whose tokenizer has no chat template.
const NO_CHAT_TEMPLATE: &str = "As of transformers v4.44, default chat template is no longer \
     allowed, so you must provide a chat template if the tokenizer does not define one.";

/// The request's `cache_salt`, checked as vLLM's request models check it
/// (`check_cache_salt_support` in its chat, completions and responses requests): absent or
/// `null` is none; anything but a non-empty string is refused with vLLM's message.
pub(crate) fn cache_salt(obj: &serde_json::Map<String, Value>) -> Result<Option<Arc<str>>, Reject> {
    match obj.get("cache_salt") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.as_str().into())),
        Some(_) => Err(bad(
            "Parameter 'cache_salt' must be a non-empty string if provided.",
            "cache_salt",
        )),
    }
}

/// The request's `model`: the base model when it has none (or `null`), as vLLM serves it.
pub(crate) fn request_model(
    shared: &PodShared,
    obj: &serde_json::Map<String, Value>,
) -> Result<String, Reject> {
    match obj.get("model") {
        None | Some(Value::Null) => Ok(shared.model.to_string()),
        Some(Value::String(m)) => Ok(m.clone()),
        Some(_) => Err(bad("model must be a string", "model")),
    }
}

pub(crate) fn parse(shared: &PodShared, body: &[u8], api: Api) -> Result<Parsed, Reject> {
    let obj = object(body)?;
    let model = request_model(shared, &obj)?;
    let lora = resolve_model(shared, &model)?;
    let mut prompt_ids = None;
    let tokenizer = shared.tokenizer.as_deref();
    let prompt = match api {
        Api::Completions => match obj.get("prompt") {
            Some(Value::String(s)) => completion_prompt(tokenizer, &obj, s)?,
            Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
                completion_prompt(tokenizer, &obj, items[0].as_str().unwrap_or_default())?
            }
            Some(v @ Value::Array(items))
                if !items.is_empty() && items.iter().all(Value::is_u64) =>
            {
                let ids = token_list(v, "prompt")?;
                let n = u32::try_from(ids.len()).unwrap_or(u32::MAX);
                // With the model's tokenizer the ids are the model's: cached as they are.
                let prompt = match tokenizer {
                    Some(_) => Prompt::Ids(ids.as_slice().into()),
                    None => Prompt::tokens(n),
                };
                prompt_ids = Some(ids);
                prompt
            }
            Some(Value::Array(_)) => {
                return Err(bad(
                    "batched prompts are not supported; send one prompt per request",
                    "prompt",
                ));
            }
            Some(_) => {
                return Err(bad(
                    "prompt must be a string, a list of one string, or a list of token ids",
                    "prompt",
                ));
            }
            None => return Err(bad("field required: prompt", "prompt")),
        },
        Api::Chat => {
            let add_generation_prompt = opt_bool(&obj, "add_generation_prompt")?.unwrap_or(true);
            let text = render_chat(&obj, add_generation_prompt)?;
            match tokenizer {
                Some(t) => Prompt::Ids(encode_chat(t, body)?.into()),
                None => Prompt::Text(text.into()),
            }
        }
    };
    if let Some(n) = obj.get("n")
        && n.as_u64() != Some(1)
    {
        return Err(bad("only n = 1 is supported", "n"));
    }
    let max_field = match api {
        Api::Chat => obj
            .get("max_completion_tokens")
            .filter(|v| !v.is_null())
            .or_else(|| obj.get("max_tokens")),
        Api::Completions => obj.get("max_tokens"),
    };
    let prompt_tokens = prompt.token_count();
    let (max_tokens, explicit_max) = match max_field {
        None | Some(Value::Null) => {
            let room = shared
                .profile
                .max_model_len
                .saturating_sub(prompt_tokens)
                .max(1);
            let default = if api == Api::Chat {
                DEFAULT_CHAT_MAX_TOKENS
            } else {
                DEFAULT_COMPLETION_MAX_TOKENS
            };
            (default.min(room), false)
        }
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => (u32::try_from(n).unwrap_or(u32::MAX), true),
            _ => {
                return Err(bad(
                    "max_tokens must be an integer of at least 1",
                    "max_tokens",
                ));
            }
        },
    };
    let stream = opt_bool(&obj, "stream")?.unwrap_or(false);
    // vLLM's request models refuse stream options on a request that is not streamed (their
    // `check_stream_options`: a truthy `stream_options` without `stream`).
    if !stream && obj.get("stream_options").is_some_and(truthy) {
        return Err(bad(
            "Stream options can only be defined when `stream=True`.",
            "stream_options",
        ));
    }
    let include_usage = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(Parsed {
        prompt,
        prompt_ids,
        max_tokens,
        explicit_max,
        lora,
        cache_salt: cache_salt(&obj)?,
        stream,
        include_usage,
        model,
    })
}

async fn inference(shared: Arc<PodShared>, req: Request<Incoming>, api: Api) -> Response<SimBody> {
    let handler = api.handler();
    let r = inference_inner(&shared, req, api).await;
    shared.count_http(handler, r.status().as_u16());
    r
}

/// Reads a request body of at most [`MAX_BODY`] bytes; the error answer otherwise.
pub(crate) async fn read_body(
    shared: &PodShared,
    req: Request<Incoming>,
) -> Result<Bytes, Response<SimBody>> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) => Err(
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                error(
                    shared,
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request body too large",
                    None,
                )
            } else {
                error(
                    shared,
                    StatusCode::BAD_REQUEST,
                    "could not read the request body",
                    None,
                )
            },
        ),
    }
}

async fn inference_inner(
    shared: &Arc<PodShared>,
    req: Request<Incoming>,
    api: Api,
) -> Response<SimBody> {
    let body = match read_body(shared, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let p = match parse(shared, &body, api) {
        Ok(p) => p,
        Err((status, msg, param)) => return error(shared, status, &msg, param),
    };
    let feed = match admit(shared, &p) {
        Ok(f) => f,
        Err((status, msg, param)) => return error(shared, status, &msg, param),
    };
    let created = super::unix_now() as u64;
    let rid = match api {
        Api::Chat => format!("chatcmpl-{}-{}", shared.name, feed.id),
        Api::Completions => format!("cmpl-{}-{}", shared.name, feed.id),
    };
    let finish_reason = if p.explicit_max { "length" } else { "stop" };
    if p.stream {
        let s = SseStream {
            feed,
            api,
            id: rid,
            model: p.model,
            created,
            include_usage: p.include_usage,
            finish_reason,
            started: false,
            ended: false,
        };
        return streaming(shared, SimBody::Sse(Box::new(s)));
    }
    let (text, done) = match feed.collect(shared).await {
        Ok(answer) => answer,
        Err(r) => return r,
    };
    let body = match api {
        Api::Chat => json!({
            "id": rid, "object": "chat.completion", "created": created, "model": p.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish_reason}],
            "usage": usage(&done),
        }),
        Api::Completions => json!({
            "id": rid, "object": "text_completion", "created": created, "model": p.model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason}],
            "usage": usage(&done),
        }),
    };
    json_response(shared, StatusCode::OK, &body)
}

/// Puts a parsed request on the pod's engine (after the pod's injected error rate), the one way
/// in for every inference API; why not, if it is refused.
pub(crate) fn admit(shared: &Arc<PodShared>, p: &Parsed) -> Result<TokenFeed, Reject> {
    let error_rate = shared.faults.borrow().error_rate;
    if error_rate > 0.0 && lock(&shared.rng).random::<f64>() < error_rate {
        return Err((
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal server error (injected fault)".to_owned(),
            None,
        ));
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::unbounded_channel();
    lock(&shared.streams).insert(id, tx);
    if let Some(feed) = &shared.kv {
        let lora = p.lora.and_then(|i| {
            let name = shared.adapters.get(usize::from(i))?.clone();
            Some(super::kv::Adapter {
                id: u64::from(i) + 1,
                name,
            })
        });
        feed.note_prompt(
            &p.prompt,
            crate::tokens::chain_seed(&shared.model),
            lora,
            p.cache_salt.clone(),
        );
    }
    let submitted = {
        let mut e = lock(&shared.engine);
        e.submit(EngineRequest {
            id,
            arrival: shared.now(),
            prompt: p.prompt.clone(),
            max_tokens: p.max_tokens,
            lora: p.lora,
            cache_salt: p.cache_salt.clone(),
        })
    };
    if let Err(e) = submitted {
        lock(&shared.streams).remove(&id);
        // The engine's reason is the client's message, as vLLM words it (the error's own
        // `request rejected:` prefix is for the fleet's callers).
        let message = match e {
            crate::error::SimError::Rejected(reason) => reason,
            other => other.to_string(),
        };
        return Err((StatusCode::BAD_REQUEST, message, None));
    }
    shared.wake.notify_one();
    Ok(TokenFeed {
        guard: AbortOnDrop {
            shared: shared.clone(),
            id,
            armed: true,
        },
        rx,
        id,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::spec::PodSpec;
    use crate::{Catalog, EngineKind};

    /// A vLLM pod serving adapter `a`.
    pub(crate) fn shared() -> PodShared {
        let p = Catalog::builtin()
            .unwrap()
            .get("llama-3.1-8b/h100")
            .unwrap()
            .clone();
        let mut pod = PodSpec::new("p", &p, EngineKind::Vllm);
        pod.lora_adapters = vec!["a".into()];
        super::super::new_shared(&pod, None, None)
    }

    /// [`shared`] tokenizing with the tokenizer crate's tiny tokenizer (loaded once).
    pub(crate) fn shared_with_tokenizer() -> PodShared {
        static TINY: std::sync::OnceLock<Arc<ModelTokenizer>> = std::sync::OnceLock::new();
        let tiny = TINY.get_or_init(|| {
            let dir = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../tokenizer/tests/fixtures/tiny"
            );
            Arc::new(ModelTokenizer::from_dir(dir, Default::default()).unwrap())
        });
        let mut s = shared();
        s.tokenizer = Some(tiny.clone());
        s
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|n| json!(n)),
            "[a-z<|> ]{0,12}".prop_map(Value::String),
            Just(json!("meta-llama/Llama-3.1-8B-Instruct")),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(
                    (
                        prop_oneof![
                            Just("model".to_owned()),
                            Just("messages".to_owned()),
                            Just("prompt".to_owned()),
                            Just("max_tokens".to_owned()),
                            Just("stream".to_owned()),
                            Just("role".to_owned()),
                            Just("content".to_owned()),
                            Just("n".to_owned()),
                            Just("input".to_owned()),
                            Just("instructions".to_owned()),
                            Just("max_output_tokens".to_owned()),
                            "[a-z_]{1,8}",
                        ],
                        inner
                    ),
                    0..5
                )
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        // Seeded: a failure reproduces on every run.
        #![proptest_config(ProptestConfig {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed),
            ..ProptestConfig::default()
        })]

        #[test]
        fn any_body_parses_or_gets_a_typed_rejection(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            for s in [shared(), shared_with_tokenizer()] {
                let _ = parse(&s, &bytes, Api::Chat);
                let _ = parse(&s, &bytes, Api::Completions);
                let _ = responses::parse(&s, &bytes);
            }
        }

        #[test]
        fn any_json_parses_or_gets_a_client_error(v in json_value()) {
            let body = v.to_string();
            for s in [shared(), shared_with_tokenizer()] {
                for api in [Api::Chat, Api::Completions] {
                    if let Err((status, msg, _)) = parse(&s, body.as_bytes(), api) {
                        prop_assert!(status.is_client_error());
                        prop_assert!(!msg.is_empty());
                    }
                }
                if let Err((status, msg, _)) = responses::parse(&s, body.as_bytes()) {
                    prop_assert!(status.is_client_error());
                    prop_assert!(!msg.is_empty());
                }
            }
        }
    }
}
