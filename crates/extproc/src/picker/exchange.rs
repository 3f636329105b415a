//! One request's ext_proc conversation, as a synchronous state machine.
//!
//! Protocol (Gateway API Inference Extension, proposal 004, on Envoy's ext_proc API):
//! - `FULL_DUPLEX_STREAMED`: request headers are held unanswered while body chunks are buffered
//!   to end-of-stream; then one headers response (destination header, corrected
//!   `content-length`, `clear_route_cache`, `envoy.lb` dynamic metadata) followed by the body
//!   re-sent as streamed body responses of at most 62,000 bytes.
//! - `BUFFERED`: headers are answered at once with no change; the single body message is answered
//!   with the header mutations, `clear_route_cache` and the metadata.
//! - headers with `end_of_stream` (no body): routed on the headers alone.
//! - the response path passes through unchanged while usage, the first token and the served
//!   endpoint are read from it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, processing_response,
};
use infergate_openai::{ApiError, ApiKind, parse_request};
use infergate_pool::lifecycle::{self, Ending, ResponseWatch, Segments, pick, rejection_error};
use infergate_scheduler::RequestContext;

use super::Shared;
use crate::pool::{EndpointPool, InflightGuard};
use crate::rewrite::ModelRewriter;
use crate::stream::{Exchange, Flow};
use crate::telemetry::Outcome;
use crate::wire::{self, BodyMode};

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for request headers.
    Headers,
    /// Buffering the request body.
    Body,
    /// Routed: waiting for (or reading) the response.
    Routed,
    /// The response ended (or the request was answered locally).
    Done,
}

/// The routed request's in-flight entry and what the response path needs.
struct Routed<G> {
    inflight: Option<G>,
    /// The endpoint serving the request: the first choice, or the one the proxy reports having
    /// used.
    pod: SocketAddr,
    model: String,
    status: u16,
    /// What the response is read for (first token, usage).
    watch: ResponseWatch,
    /// The first token was reported: a second response headers message starts a new watch,
    /// which must not report (and time) the first token again.
    first_token_seen: bool,
    rewriter: Option<ModelRewriter>,
    /// The decision's summary, for the `x-infergate-explain` response header.
    explanation: Option<String>,
    /// When the routing answer was made (the start of TTFT and duration).
    routed_at: Instant,
}

/// Per-stream state. Dropping it (stream end, reset) drops the in-flight guard, which cancels.
pub(crate) struct PickerExchange<P: EndpointPool> {
    shared: Arc<Shared<P>>,
    request_mode: BodyMode,
    response_mode: BodyMode,
    phase: Phase,
    kind: Option<ApiKind>,
    body: Vec<u8>,
    subset: Option<Vec<SocketAddr>>,
    model_hint: Option<String>,
    base_hint: Option<String>,
    routed: Option<Routed<P::Inflight>>,
    scratch: String,
    /// The request asked for its routing decision (and the picker allows it).
    explain: bool,
    /// The decision's summary, until it is answered.
    explanation: Option<String>,
}

impl<P: EndpointPool> PickerExchange<P> {
    pub(crate) fn new(shared: Arc<Shared<P>>) -> Self {
        PickerExchange {
            request_mode: shared.config.request_body_mode,
            response_mode: shared.config.response_body_mode,
            shared,
            phase: Phase::Headers,
            kind: None,
            body: Vec::new(),
            subset: None,
            model_hint: None,
            base_hint: None,
            routed: None,
            scratch: String::new(),
            explain: false,
            explanation: None,
        }
    }

    /// Handles one message from Envoy, appending the answers to `out`.
    pub(crate) fn on_message(
        &mut self,
        msg: ProcessingRequest,
        out: &mut Vec<ProcessingResponse>,
    ) -> Flow {
        if let Some(pc) = msg.protocol_config {
            // Envoy announces its body modes on the first message of a stream.
            self.request_mode = BodyMode::from_envoy(pc.request_body_mode);
            self.response_mode = BodyMode::from_envoy(pc.response_body_mode);
        }
        let metadata = msg.metadata_context;
        match msg.request {
            Some(Msg::RequestHeaders(h)) => self.on_request_headers(&h, metadata.as_ref(), out),
            Some(Msg::RequestBody(b)) => self.on_request_body(b, out),
            Some(Msg::RequestTrailers(_)) => {
                let flow = if self.phase == Phase::Body {
                    // Trailers end the body: the last re-sent chunk must not claim end-of-stream.
                    self.route_body(false, out)
                } else {
                    Flow::Continue
                };
                if flow == Flow::Continue {
                    out.push(wire::trailers_continue(true));
                }
                flow
            }
            Some(Msg::ResponseHeaders(h)) => {
                let rewriting = self.routed.as_ref().is_some_and(|r| r.rewriter.is_some());
                let explanation = self.routed.as_mut().and_then(|r| r.explanation.take());
                self.on_response_headers(&h, metadata.as_ref());
                let drop_length = rewriting && !h.end_of_stream;
                out.push(match explanation {
                    Some(e) => wire::response_headers_with(
                        vec![wire::set_header(wire::EXPLAIN_HEADER, e)],
                        drop_length,
                    ),
                    None if drop_length => wire::response_headers_drop_length(),
                    None => wire::response_headers_continue(),
                });
                Flow::Continue
            }
            Some(Msg::ResponseBody(b)) => {
                self.on_response_body(b, out);
                Flow::Continue
            }
            Some(Msg::ResponseTrailers(_)) => {
                // Bytes a model-name rewrite held back go out before the trailers.
                if self.response_mode == BodyMode::FullDuplex
                    && let Some(rw) = self.routed.as_mut().and_then(|r| r.rewriter.as_mut())
                {
                    let rest = rw.feed(&[], true);
                    if !rest.is_empty() {
                        out.push(wire::streamed_chunk(false, rest, false));
                    }
                }
                self.finish_response();
                out.push(wire::trailers_continue(false));
                Flow::Continue
            }
            None => Flow::Continue,
        }
    }

    fn on_request_headers(
        &mut self,
        h: &HttpHeaders,
        metadata: Option<&Metadata>,
        out: &mut Vec<ProcessingResponse>,
    ) -> Flow {
        let path = wire::find_header(h, ":path").unwrap_or_default();
        self.kind = std::str::from_utf8(path).ok().and_then(ApiKind::from_path);
        self.subset = wire::subset_hint(metadata);
        self.model_hint = wire::find_header(h, wire::MODEL_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_owned);
        self.base_hint = wire::find_header(h, wire::BASE_MODEL_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_owned);
        self.explain = self.shared.config.explain_header
            && wire::find_header(h, wire::EXPLAIN_HEADER) == Some(b"1");
        if h.end_of_stream || self.request_mode == BodyMode::HeadersOnly {
            return self.route_headers_only(out);
        }
        self.phase = Phase::Body;
        if self.request_mode == BodyMode::Buffered {
            // One answer per message in buffered mode; the route goes with the body answer.
            out.push(wire::request_headers(None));
        }
        Flow::Continue
    }

    fn on_request_body(&mut self, b: HttpBody, out: &mut Vec<ProcessingResponse>) -> Flow {
        if self.phase != Phase::Body {
            // Not expected (already routed); pass it on unchanged, in chunks the answer may carry.
            match self.request_mode {
                BodyMode::FullDuplex => wire::push_chunks(out, true, b.body, b.end_of_stream),
                _ => out.push(wire::buffered_body(true, Default::default(), None)),
            }
            return Flow::Continue;
        }
        let cap = self.shared.config.max_body_bytes;
        if self.body.len().saturating_add(b.body.len()) > cap {
            return self.reject(ApiError::BodyTooLarge { limit: cap }, out);
        }
        if self.body.is_empty() {
            // Take the first chunk's buffer as is: a one-chunk body is never copied.
            self.body = b.body;
        } else {
            self.body.extend_from_slice(&b.body);
        }
        if b.end_of_stream || self.request_mode != BodyMode::FullDuplex {
            self.route_body(true, out)
        } else {
            Flow::Continue
        }
    }

    /// Routes a request that has no body (or whose body Envoy does not send).
    fn route_headers_only(&mut self, out: &mut Vec<ProcessingResponse>) -> Flow {
        let model = self.model_hint.clone().unwrap_or_default();
        let (model_ref, lora) = split_adapter(&model, self.base_hint.as_deref());
        let cx = RequestContext::new(model_ref, 0)
            .with_lora(lora)
            .with_subset(self.subset.as_deref());
        let started = Instant::now();
        let (picked, explanation) = pick(&self.shared.pool, self.explain, &cx);
        self.explanation = explanation;
        match picked {
            Ok(inflight) => {
                let common = self.route_common(&inflight, None);
                let mut answer = wire::request_headers(Some(common));
                answer.dynamic_metadata = Some(wire::destination_metadata(&self.scratch));
                out.push(answer);
                self.record_pick(started);
                self.enter_routed(inflight, model, false, started);
                Flow::Continue
            }
            Err(rejection) => self.reject(rejection_error(rejection, &model), out),
        }
    }

    /// Parses the buffered body, picks, and answers with the route and the body.
    fn route_body(&mut self, end_of_stream: bool, out: &mut Vec<ProcessingResponse>) -> Flow {
        let started = Instant::now();
        let mut body = std::mem::take(&mut self.body);
        let mut rewriter = None;
        let (picked, model, stream) = match self.kind {
            Some(kind) => {
                let parsed = match parse_request(kind, &body) {
                    Ok(p) => p,
                    Err(e) => return self.reject(e, out),
                };
                let rewrite = self.shared.config.model_rewrites.get(parsed.model.as_ref());
                let rewritten = rewrite.map(|served| parsed.rewrite_model(&body, served));
                let routed_model = rewrite.map_or(parsed.model.as_ref(), String::as_str);
                let segments = Segments::new(parsed.segments());
                let (model, lora) = split_adapter(routed_model, self.base_hint.as_deref());
                let cx =
                    lifecycle::context(&parsed, model, lora, &segments, self.subset.as_deref());
                let (picked, explanation) = pick(&self.shared.pool, self.explain, &cx);
                self.explanation = explanation;
                let (requested, stream) = (parsed.model.clone().into_owned(), parsed.stream);
                drop(parsed);
                if let (Some(served), Some(new_body)) = (rewrite, rewritten) {
                    rewriter = Some(ModelRewriter::new(served, &requested));
                    body = new_body;
                }
                (picked, requested, stream)
            }
            None => {
                // A path the picker does not parse: route on the headers' hints, body untouched.
                let model = self.model_hint.clone().unwrap_or_default();
                let (m, lora) = split_adapter(&model, self.base_hint.as_deref());
                let cx = RequestContext::new(m, 0)
                    .with_lora(lora)
                    .with_subset(self.subset.as_deref());
                let (picked, explanation) = pick(&self.shared.pool, self.explain, &cx);
                self.explanation = explanation;
                (picked, model, false)
            }
        };
        let inflight = match picked {
            Ok(i) => i,
            Err(rejection) => return self.reject(rejection_error(rejection, &model), out),
        };
        let common = self.route_common(&inflight, Some(body.len()));
        let metadata = wire::destination_metadata(&self.scratch);
        match self.request_mode {
            BodyMode::FullDuplex => {
                let mut answer = wire::request_headers(Some(common));
                answer.dynamic_metadata = Some(metadata);
                out.push(answer);
                wire::push_chunks(out, true, body, end_of_stream);
            }
            BodyMode::Buffered | BodyMode::HeadersOnly => {
                // The whole body is replaced only when its model was rewritten.
                let replaced = rewriter.is_some().then_some(body);
                let mut answer = wire::buffered_body(true, common, replaced);
                answer.dynamic_metadata = Some(metadata);
                out.push(answer);
            }
        }
        self.record_pick(started);
        self.enter_routed(inflight, model, stream, started);
        if let Some(r) = self.routed.as_mut() {
            r.rewriter = rewriter;
        }
        Flow::Continue
    }

    /// The header mutations of a routing answer; leaves the endpoint list in `self.scratch`.
    fn route_common(
        &mut self,
        inflight: &P::Inflight,
        content_length: Option<usize>,
    ) -> envoy_types::pb::envoy::service::ext_proc::v3::CommonResponse {
        wire::write_endpoints(&mut self.scratch, inflight.endpoints());
        let mut set = Vec::with_capacity(2);
        set.push(wire::set_header(
            wire::DESTINATION_HEADER,
            self.scratch.as_bytes(),
        ));
        if let Some(n) = content_length {
            set.push(wire::set_header("content-length", n.to_string()));
        }
        wire::common(set, true)
    }

    fn record_pick(&self, started: Instant) {
        self.shared
            .telemetry
            .pick_seconds
            .observe(started.elapsed().as_secs_f64());
    }

    fn enter_routed(
        &mut self,
        inflight: P::Inflight,
        model: String,
        stream: bool,
        routed_at: Instant,
    ) {
        self.phase = Phase::Routed;
        // The pool never returns an empty list; the unspecified address stands in regardless.
        let pod = inflight
            .endpoints()
            .first()
            .copied()
            .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
        self.routed = Some(Routed {
            inflight: Some(inflight),
            pod,
            model,
            status: 200,
            watch: ResponseWatch::new(200, stream, self.shared.config.max_response_scan_bytes),
            first_token_seen: false,
            rewriter: None,
            explanation: self.explanation.take(),
            routed_at,
        });
    }

    fn reject(&mut self, err: ApiError, out: &mut Vec<ProcessingResponse>) -> Flow {
        tracing::debug!(error = %err, status = err.status(), "request answered locally");
        self.shared.telemetry.reject(err.metric_label());
        let mut answer = wire::immediate_error(&err);
        if let Some(e) = self.explanation.take()
            && let Some(processing_response::Response::ImmediateResponse(i)) = &mut answer.response
            && let Some(h) = &mut i.headers
        {
            h.set_headers
                .push(wire::set_header(wire::EXPLAIN_HEADER, e));
        }
        out.push(answer);
        self.phase = Phase::Done;
        Flow::Close
    }

    fn on_response_headers(&mut self, h: &HttpHeaders, metadata: Option<&Metadata>) {
        let Some(r) = self.routed.as_mut() else {
            return;
        };
        if let Some(status) = wire::find_header(h, ":status")
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|s| s.parse().ok())
        {
            r.status = status;
        }
        if let (Some(served), Some(inflight)) = (wire::served_endpoint(metadata), &mut r.inflight) {
            inflight.reassign(served);
            r.pod = served;
        }
        let is_sse = wire::find_header(h, "content-type")
            .is_some_and(|v| v.starts_with(b"text/event-stream"));
        r.watch = ResponseWatch::new(r.status, is_sse, self.shared.config.max_response_scan_bytes);
        if h.end_of_stream {
            self.finish_response();
        }
    }

    fn on_response_body(&mut self, b: HttpBody, out: &mut Vec<ProcessingResponse>) {
        if let Some(r) = self.routed.as_mut()
            && r.watch.feed(&b.body)
            && !r.first_token_seen
            && let Some(i) = r.inflight.as_mut()
        {
            r.first_token_seen = true;
            i.first_token();
            self.shared
                .counters
                .observe_ttft(r.routed_at.elapsed().as_secs_f64());
        }
        let eos = b.end_of_stream;
        let rewriter = self.routed.as_mut().and_then(|r| r.rewriter.as_mut());
        match (self.response_mode, rewriter) {
            // Envoy's chunk, or its rewrite, may be larger than one answer may carry.
            (BodyMode::FullDuplex, None) => wire::push_chunks(out, false, b.body, eos),
            (BodyMode::FullDuplex, Some(rw)) => {
                wire::push_chunks(out, false, rw.feed(&b.body, eos), eos);
            }
            (BodyMode::Buffered | BodyMode::HeadersOnly, None) => {
                out.push(wire::buffered_body(false, Default::default(), None));
            }
            (BodyMode::Buffered | BodyMode::HeadersOnly, Some(rw)) => {
                let body = rw.feed(&b.body, true);
                out.push(wire::buffered_body(false, Default::default(), Some(body)));
            }
        }
        if eos || self.response_mode != BodyMode::FullDuplex {
            self.finish_response();
        }
    }

    /// The response is over: report usage (teaching the rate learner) or failure.
    fn finish_response(&mut self) {
        let Some(mut r) = self.routed.take() else {
            return;
        };
        self.phase = Phase::Done;
        let Some(inflight) = r.inflight.take() else {
            return;
        };
        let counters = &self.shared.counters;
        counters.observe_duration(r.routed_at.elapsed().as_secs_f64());
        match lifecycle::finish(inflight, r.status, true, &mut r.watch) {
            (Ending::Failed, _) => counters.finished(&r.model, Some(r.pod), Outcome::Error, None),
            (Ending::Completed | Ending::Refused, usage) => {
                counters.finished(&r.model, Some(r.pod), Outcome::Success, Some(&usage));
            }
        }
    }
}

impl<P: EndpointPool> Exchange for PickerExchange<P> {
    fn on_message(&mut self, msg: ProcessingRequest, out: &mut Vec<ProcessingResponse>) -> Flow {
        PickerExchange::on_message(self, msg, out)
    }
}

impl<P: EndpointPool> Drop for PickerExchange<P> {
    fn drop(&mut self) {
        if let Some(r) = self.routed.take()
            && let Some(inflight) = r.inflight
        {
            // Stream reset or closed before the response ended: the guard's drop cancels.
            drop(inflight);
            self.shared
                .counters
                .observe_duration(r.routed_at.elapsed().as_secs_f64());
            self.shared
                .counters
                .finished(&r.model, Some(r.pod), Outcome::Cancelled, None);
        }
    }
}

/// `(model, adapter)` for the scheduler: when the body-based router reported a base model that
/// differs from the requested name, the requested name is a LoRA adapter of that base.
fn split_adapter<'a>(model: &'a str, base: Option<&'a str>) -> (&'a str, Option<&'a str>) {
    match base {
        Some(b) if !b.is_empty() && b != model => (b, Some(model)),
        _ => (model, None),
    }
}
