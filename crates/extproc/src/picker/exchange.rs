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
use infergate_openai::{ApiError, ApiKind, check_content_encoding, parse_request};
use infergate_pool::flow::{FlowCharge, Queued, Turn};
use infergate_pool::lifecycle::{
    self, Admission, Ending, ResponseWatch, Segments, admit_quota, pick, rejection_error,
    settle_quota,
};
use infergate_pool::precise;
use infergate_pool::quota::QuotaTicket;
use infergate_pool::tenant::DEFAULT_TENANT;
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
    /// The tenant's quota charge: committed when the answer starts, corrected to the reported
    /// usage when it ends; given back if the stream ends before any answer.
    quota: Option<QuotaTicket>,
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
    /// The tenant (`x-llm-d-inference-fairness-id`), for per-tenant model rewrites.
    tenant: Option<String>,
    /// The objective (`x-llm-d-inference-objective`): the request's priority, with flow control.
    objective: Option<String>,
    /// Flow control: the request waits in the queues; [`Exchange::poll_waiting`] routes it
    /// again on its turn.
    parked: Option<Parked>,
    /// The tenant's attained-service charge, settled with the reported usage.
    flow_charge: Option<FlowCharge>,
}

/// A request waiting in flow control's queues, and how to route it again on its turn.
struct Parked {
    queued: Option<Queued>,
    /// The model named in the rejection if it leaves the queue unrouted.
    model: String,
    /// Routing again: the body (with its end-of-stream flag) or the headers alone.
    body: Option<bool>,
    /// The quota charge taken before it was queued (not taken again on its turn).
    quota: Option<Option<QuotaTicket>>,
}

/// What the pick (or flow control) decided for this request.
enum Decided<G> {
    Routed(G),
    /// Queued: the request waits for its turn (nothing answered yet).
    Wait,
    Refused(ApiError),
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
            tenant: None,
            objective: None,
            parked: None,
            flow_charge: None,
        }
    }

    /// Picks for `cx` (the request for `model`), through flow control when the picker has it:
    /// on the request's turn, a pick on its behalf; else admission, which may queue it.
    fn decide(
        &mut self,
        cx: &RequestContext<'_>,
        model: &str,
        bytes: usize,
    ) -> Decided<P::Inflight> {
        let shared = Arc::clone(&self.shared);
        let Some(flow) = shared.config.flow.as_ref() else {
            let (picked, explanation) = pick(&shared.pool, self.explain, cx);
            self.explanation = explanation;
            return match picked {
                Ok(g) => Decided::Routed(g),
                Err(r) => Decided::Refused(rejection_error(r, model, cx.subset.is_some())),
            };
        };
        let tp = flow
            .tenancy()
            .picker(self.tenant.as_deref(), self.objective.as_deref());
        let cx = cx.with_priority(tp.priority);
        if let Some(parked) = self.parked.as_mut() {
            return match lifecycle::try_turn(&shared.pool, &mut parked.queued, &cx, model) {
                None => Decided::Wait,
                Some(routed) => {
                    self.parked = None;
                    match routed {
                        Ok((g, charge)) => {
                            self.flow_charge = charge;
                            Decided::Routed(g)
                        }
                        Err(e) => Decided::Refused(e),
                    }
                }
            };
        }
        let part = lifecycle::FlowPart {
            flow,
            tenant: &tp.tenant,
            bytes: bytes as u64,
        };
        let (admission, explanation) =
            lifecycle::admit(&shared.pool, self.explain, &cx, Some(part), model);
        self.explanation = explanation;
        match admission {
            Admission::Routed(g, charge) => {
                self.flow_charge = charge;
                Decided::Routed(g)
            }
            Admission::Queued(q) => {
                self.parked = Some(Parked {
                    queued: Some(q),
                    model: model.to_owned(),
                    body: None,
                    quota: None,
                });
                Decided::Wait
            }
            Admission::Refused(e) => Decided::Refused(e),
        }
    }

    /// Waits for a queued request's turn and routes it then (see [`Exchange::poll_waiting`]).
    fn poll_parked(
        &mut self,
        task: &mut std::task::Context<'_>,
        out: &mut Vec<ProcessingResponse>,
    ) -> std::task::Poll<Flow> {
        use std::task::Poll;
        loop {
            let Some(parked) = self.parked.as_mut() else {
                return Poll::Ready(Flow::Continue);
            };
            let Some(q) = parked.queued.as_mut() else {
                self.parked = None;
                return Poll::Ready(Flow::Continue);
            };
            let turn = match q.poll_turn(task) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(t) => t,
            };
            let retry_after = q.retry_after();
            let model = parked.model.clone();
            let flow = match turn {
                Turn::Try => match parked.body {
                    Some(end_of_stream) => self.route_body(end_of_stream, out),
                    None => self.route_headers_only(out),
                },
                Turn::Expired(waited) => {
                    self.parked = None;
                    let e = ApiError::QueueTtlExpired {
                        model,
                        waited,
                        retry_after,
                    };
                    return Poll::Ready(self.reject(e, out));
                }
                Turn::Evicted(_) => {
                    self.parked = None;
                    let e = ApiError::QueueEvicted { model, retry_after };
                    return Poll::Ready(self.reject(e, out));
                }
            };
            if self.parked.is_none() || !out.is_empty() {
                return Poll::Ready(flow);
            }
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
        // The last value: the operator's Gateway removes a client's own tenant header and has
        // Envoy write the token's, which Envoy appends, so if the removal is not in force (a
        // conflicting ClientTrafficPolicy) a client's value still comes first and is not used.
        self.tenant = wire::find_last_header(h, crate::canary::FAIRNESS_ID_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_owned);
        if self.shared.config.flow.is_some() {
            self.objective = wire::find_header(h, infergate_pool::tenant::OBJECTIVE_HEADER)
                .and_then(|v| std::str::from_utf8(v).ok())
                .map(str::to_owned);
        }
        if h.end_of_stream || self.request_mode == BodyMode::HeadersOnly {
            return self.route_headers_only(out);
        }
        // A compressed API body cannot be read for routing (nor by a model server): 415 now.
        if self.kind.is_some()
            && let Err(e) = check_content_encoding(wire::find_header(h, "content-encoding"))
        {
            return self.reject(e, out);
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
        // Out of `self` while deciding (the decision needs `&mut self`), back after.
        let (base, subset) = (self.base_hint.take(), self.subset.take());
        let (model_ref, lora) = split_adapter(&model, base.as_deref());
        let cx = RequestContext::new(model_ref, 0)
            .with_lora(lora)
            .with_subset(subset.as_deref());
        let started = Instant::now();
        let decided = self.decide(&cx, &model, 0);
        (self.base_hint, self.subset) = (base, subset);
        match decided {
            Decided::Wait => Flow::Continue,
            Decided::Routed(inflight) => {
                let common = self.route_common(&inflight, None);
                let mut answer = wire::request_headers(Some(common));
                answer.dynamic_metadata = Some(wire::destination_metadata(&self.scratch));
                out.push(answer);
                self.record_pick(started);
                self.enter_routed(inflight, model, false, started);
                Flow::Continue
            }
            Decided::Refused(e) => self.reject(e, out),
        }
    }

    /// Parses the buffered body, picks, and answers with the route and the body.
    fn route_body(&mut self, end_of_stream: bool, out: &mut Vec<ProcessingResponse>) -> Flow {
        let started = Instant::now();
        let mut body = std::mem::take(&mut self.body);
        let mut rewriter = None;
        let (picked, model, stream, quota) = match self.kind {
            Some(kind) => {
                let parsed = match parse_request(kind, &body) {
                    Ok(p) => p,
                    Err(e) => return self.reject(e, out),
                };
                // Before the pick: a tenant over its quota costs the pool nothing.
                let tenant = self.tenant.as_deref().unwrap_or(DEFAULT_TENANT);
                // A request queued by flow control was charged before it was queued.
                let held = self.parked.as_mut().and_then(|p| p.quota.take());
                let quota = match held {
                    Some(q) => q,
                    None => {
                        match admit_quota(self.shared.config.quotas.as_ref(), tenant, &parsed) {
                            Ok(q) => q,
                            Err(e) => return self.reject(e, out),
                        }
                    }
                };
                // A rewrite rule (alias or canary split), then a `--model-rewrite` alias. (The
                // shared state is held apart from `self`: the decision below needs `&mut self`.)
                let shared = Arc::clone(&self.shared);
                let table = shared.config.rewrites.load();
                let asked: &str = parsed.model.as_ref();
                let rewrite = table
                    .choose(asked, self.tenant.as_deref())
                    .or_else(|| shared.config.model_rewrites.get(asked).map(String::as_str))
                    .filter(|served| *served != asked);
                let rewritten = rewrite.map(|served| parsed.rewrite_model(&body, served));
                let routed_model = rewrite.unwrap_or(asked);
                let segments = Segments::new(parsed.segments());
                // Out of `self` while deciding (the decision needs `&mut self`), back after.
                let (base, subset) = (self.base_hint.take(), self.subset.take());
                let (model, lora) = split_adapter(routed_model, base.as_deref());
                let cx = lifecycle::context(&parsed, model, lora, &segments, subset.as_deref());
                let mut cached = Vec::new();
                let cx = precise::refine(cx, shared.pool.precise(), &parsed, &body, &mut cached);
                let decided = self.decide(&cx, parsed.model.as_ref(), body.len());
                (self.base_hint, self.subset) = (base, subset);
                let picked = match decided {
                    Decided::Routed(g) => Ok(g),
                    Decided::Refused(e) => Err(e),
                    Decided::Wait => {
                        drop(parsed);
                        // Queued: keep the body (and the quota charge) for the next turn.
                        self.body = body;
                        if let Some(p) = self.parked.as_mut() {
                            p.body = Some(end_of_stream);
                            p.quota = Some(quota);
                        }
                        return Flow::Continue;
                    }
                };
                let (requested, stream) = (parsed.model.clone().into_owned(), parsed.stream);
                drop(parsed);
                if let (Some(served), Some(new_body)) = (rewrite, rewritten) {
                    rewriter = Some(ModelRewriter::new(served, &requested));
                    body = new_body;
                }
                (picked, requested, stream, quota)
            }
            None => {
                // A path the picker does not parse: route on the headers' hints, body untouched.
                let model = self.model_hint.clone().unwrap_or_default();
                let (base, subset) = (self.base_hint.take(), self.subset.take());
                let (m, lora) = split_adapter(&model, base.as_deref());
                let cx = RequestContext::new(m, 0)
                    .with_lora(lora)
                    .with_subset(subset.as_deref());
                let decided = self.decide(&cx, &model, body.len());
                (self.base_hint, self.subset) = (base, subset);
                let picked = match decided {
                    Decided::Routed(g) => Ok(g),
                    Decided::Refused(e) => Err(e),
                    Decided::Wait => {
                        self.body = body;
                        if let Some(p) = self.parked.as_mut() {
                            p.body = Some(end_of_stream);
                        }
                        return Flow::Continue;
                    }
                };
                (picked, model, false, None)
            }
        };
        let inflight = match picked {
            Ok(i) => i,
            Err(e) => return self.reject(e, out),
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
            r.quota = quota;
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
            .counters
            .observe_pick(started.elapsed().as_secs_f64());
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
            quota: None,
        });
    }

    fn reject(&mut self, err: ApiError, out: &mut Vec<ProcessingResponse>) -> Flow {
        tracing::debug!(error = %err, status = err.status(), "request answered locally");
        self.shared.counters.reject(err.metric_label());
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
        // An answer is on its way: the request counts against the quota from here.
        r.quota = r.quota.take().map(QuotaTicket::commit);
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
        // Outlier detection's evidence, on the endpoint that answered.
        if let Some(inflight) = r.inflight.as_mut() {
            inflight.answered(r.status);
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
        let (ending, usage) = lifecycle::finish(inflight, r.status, true, &mut r.watch);
        settle_quota(r.quota.take(), ending, &usage);
        lifecycle::settle_flow(self.flow_charge.take(), ending, &usage);
        match (ending, usage) {
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

    fn poll_waiting(
        &mut self,
        cx: &mut std::task::Context<'_>,
        out: &mut Vec<ProcessingResponse>,
    ) -> std::task::Poll<Flow> {
        self.poll_parked(cx, out)
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
