//! One request's lifecycle, shared by both front doors.
//!
//! The ext_proc picker (`infergate-extproc`) and the standalone gateway (`infergate-proxy`) speak
//! different protocols, but route a request the same way, and this module is that way, written
//! once:
//!
//! 1. **Context**: from the parsed OpenAI request, the resolved model and LoRA adapter and an
//!    optional subset of endpoints, the scheduler's [`RequestContext`] ([`context`]; the prompt's
//!    segments are kept on the stack by [`Segments`]).
//! 2. **Pick**: [`pick`] on an [`EndpointPool`], with the decision's one-line summary when the
//!    request asked for it (`x-infergate-explain`).
//! 3. **Rejection**: every way a pick can fail becomes one client error ([`rejection_error`]);
//!    [`ApiError::status`] and [`ApiError::retry_after_secs`] are the one table from those errors
//!    to an HTTP status, a code and a `Retry-After`. Every status the product answers is an
//!    [`ApiError`] variant.
//! 4. **Response**: a [`ResponseWatch`] reads the answer on the side (the first token and usage
//!    of an SSE stream, or the `usage` of a JSON answer up to a cap), and [`finish`] releases the
//!    in-flight entry by one rule: a broken answer or a 5xx fails it, another non-2xx answer
//!    teaches nothing and cancels it, a 2xx completes it with the usage the server reported
//!    ([`scheduler_usage`]). A guard dropped before any of these cancels itself.
//!
//! 5. **Quota**: [`admit_quota`] charges the tenant's quota before the pick (refused → the 429
//!    of [`ApiError::QuotaExceeded`]), and [`settle_quota`] corrects the token estimate to the
//!    reported usage when the answer completes (`crate::quota`).
//!
//! 6. **Flow control**: [`admit`] instead of [`pick`] when the pool has a
//!    [`FlowController`]: a request that finds every pod saturated waits in its priority band
//!    ([`Admission::Queued`]) and [`poll_queued`] (or [`route`], its async form) routes it when
//!    its turn comes, or answers the queue's rejection (TTL, full, evicted, no endpoints). The
//!    attained-service charge is settled with the reported usage by [`settle_flow`].
//!
//! Each shell keeps only its protocol: the ext_proc stream (`picker/exchange.rs`) and the HTTP
//! connection (`proxy.rs`, `body.rs`). Authentication, tenancy and flow control plug in here.

use std::net::SocketAddr;

use bytes::Bytes;
use infergate_openai::{ApiError, ParsedRequest, QueueLimit, SseScanner, Usage, extract_usage};
use infergate_scheduler::flow::Refusal;
use infergate_scheduler::{Rejection, RequestContext};

use crate::flow::{FlowCharge, FlowController, QueueRefused, Queued, Turn};
use crate::quota::{QuotaTicket, Quotas};
use crate::{Inflight, LivePool};

/// Candidates listed, best first, in an explained decision.
pub const EXPLAIN_CANDIDATES: usize = 8;

/// The largest non-streamed response kept to read its `usage`; a larger one is passed through
/// all the same, without usage accounting.
pub const MAX_USAGE_BODY: usize = 1 << 20;

/// Prompt segments kept on the stack while picking (more go to a heap list).
const INLINE_SEGMENTS: usize = 16;

/// A pool of endpoints that can route one request: [`LivePool`] in production; the ext_proc
/// conformance harness implements it with a scripted pool to assert exact endpoint lists.
pub trait EndpointPool: Clone + Send + Sync + 'static {
    /// The in-flight guard a pick returns.
    type Inflight: InflightGuard;

    /// Chooses endpoints for a request, or says why not.
    fn pick(&self, cx: &RequestContext<'_>) -> Result<Self::Inflight, Rejection>;

    /// Whether the pool can route (discovery synced, at least one endpoint with fresh metrics).
    fn is_ready(&self) -> bool;

    /// As [`EndpointPool::pick`], with the decision explained on one line of printable ASCII
    /// (`None` when the pool keeps no decision record).
    fn pick_explained(
        &self,
        cx: &RequestContext<'_>,
    ) -> (Result<Self::Inflight, Rejection>, Option<String>) {
        (self.pick(cx), None)
    }

    /// Raised whenever room may have freed up (an in-flight request ended, a metrics page
    /// arrived): flow control gives its queue's head a turn then. `None`: the pool says nothing.
    fn changes(&self) -> Option<std::sync::Arc<crate::Changes>> {
        None
    }

    /// Precise prefix routing (the tokenizer and the KV-event index), when the pool has it.
    fn precise(&self) -> Option<&crate::precise::Precise> {
        None
    }
}

/// The in-flight entry of one routed request. Dropping it without [`InflightGuard::complete`] or
/// [`InflightGuard::fail`] must cancel the entry, so a reset stream never leaks accounting.
pub trait InflightGuard: Send + 'static {
    /// First choice, then fallbacks; never empty.
    fn endpoints(&self) -> &[SocketAddr];
    /// The proxy fell back to `addr`: move the entry there.
    fn reassign(&mut self, addr: SocketAddr);
    /// The first generated token passed by.
    fn first_token(&mut self);
    /// The response ended normally with this usage.
    fn complete(self, usage: infergate_scheduler::Usage);
    /// The response failed (5xx from the model server, or it broke off).
    fn fail(self);
    /// The endpoint the entry is on answered with `status` (its response headers): what
    /// outlier detection counts (the scheduler's `outlierDetection`). Nothing by default.
    fn answered(&mut self, status: u16) {
        let _ = status;
    }
}

impl EndpointPool for LivePool {
    type Inflight = Inflight;

    fn pick(&self, cx: &RequestContext<'_>) -> Result<Inflight, Rejection> {
        LivePool::pick(self, cx)
    }

    fn is_ready(&self) -> bool {
        LivePool::is_ready(self)
    }

    fn pick_explained(
        &self,
        cx: &RequestContext<'_>,
    ) -> (Result<Inflight, Rejection>, Option<String>) {
        let (picked, explanation) = LivePool::pick_explained(self, cx);
        (picked, Some(explanation.summary(EXPLAIN_CANDIDATES)))
    }

    fn changes(&self) -> Option<std::sync::Arc<crate::Changes>> {
        Some(LivePool::changes(self))
    }

    fn precise(&self) -> Option<&crate::precise::Precise> {
        LivePool::precise(self)
    }
}

impl InflightGuard for Inflight {
    fn endpoints(&self) -> &[SocketAddr] {
        Inflight::endpoints(self).as_slice()
    }

    fn reassign(&mut self, addr: SocketAddr) {
        Inflight::reassign(self, addr);
    }

    fn first_token(&mut self) {
        Inflight::first_token(self);
    }

    fn complete(self, usage: infergate_scheduler::Usage) {
        Inflight::complete(self, usage);
    }

    fn fail(self) {
        Inflight::fail(self);
    }

    fn answered(&mut self, status: u16) {
        Inflight::answered(self, status);
    }
}

/// A prompt's segments for the scheduler's prefix index: a chat has a handful, kept on the
/// stack; only a long conversation takes a heap list.
pub struct Segments<'a> {
    inline: [&'a str; INLINE_SEGMENTS],
    heap: Vec<&'a str>,
    len: usize,
}

impl<'a> Segments<'a> {
    /// Collects `segments`.
    pub fn new(segments: impl Iterator<Item = &'a str>) -> Self {
        let mut s = Segments {
            inline: [""; INLINE_SEGMENTS],
            heap: Vec::new(),
            len: 0,
        };
        for seg in segments {
            if s.len < INLINE_SEGMENTS {
                s.inline[s.len] = seg;
            } else {
                if s.heap.is_empty() {
                    s.heap.extend_from_slice(&s.inline);
                }
                s.heap.push(seg);
            }
            s.len += 1;
        }
        s
    }

    /// The segments, in order.
    pub fn as_slice(&self) -> &[&'a str] {
        if self.len <= INLINE_SEGMENTS {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

/// The scheduler's view of a parsed request routed to `model` (the base model) with `lora`.
pub fn context<'a>(
    parsed: &'a ParsedRequest<'_>,
    model: &'a str,
    lora: Option<&'a str>,
    segments: &'a Segments<'a>,
    subset: Option<&'a [SocketAddr]>,
) -> RequestContext<'a> {
    RequestContext::new(model, parsed.estimated_prompt_tokens())
        .with_prompt(segments.as_slice())
        .with_lora(lora)
        .with_cache_salt(parsed.cache_salt.as_deref())
        .with_subset(subset)
        .with_output_tokens(
            parsed
                .max_output_tokens
                .unwrap_or(RequestContext::DEFAULT_OUTPUT_TOKENS),
        )
}

/// Picks on `pool`; with `explain`, also the decision's summary.
pub fn pick<P: EndpointPool>(
    pool: &P,
    explain: bool,
    cx: &RequestContext<'_>,
) -> (Result<P::Inflight, Rejection>, Option<String>) {
    if explain {
        pool.pick_explained(cx)
    } else {
        (pool.pick(cx), None)
    }
}

/// The client-visible error for a scheduler rejection of a request for `model` (`subset`: the
/// request named the endpoints it may go to).
pub fn rejection_error(rejection: Rejection, model: &str, subset: bool) -> ApiError {
    match rejection {
        Rejection::Shed { retry_after } => ApiError::Overloaded {
            model: model.to_owned(),
            retry_after,
        },
        Rejection::NoEndpoints => ApiError::NoEndpoints {
            model: model.to_owned(),
            subset,
        },
        Rejection::Unavailable { retry_after } => ApiError::NoFreshEndpoints {
            model: model.to_owned(),
            retry_after,
        },
    }
}

/// The scheduler's usage record from what the model server reported (counts saturate at
/// `u32::MAX`).
pub fn scheduler_usage(u: &Usage) -> infergate_scheduler::Usage {
    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    infergate_scheduler::Usage {
        prompt_tokens: clamp(u.prompt_tokens),
        cached_tokens: clamp(u.cached_tokens),
        output_tokens: clamp(u.completion_tokens),
    }
}

/// What a response is read for, on the side, while it passes through untouched.
pub enum ResponseWatch {
    /// An SSE stream: its first token and final usage.
    Sse(SseScanner),
    /// A JSON answer kept (up to its cap, in bytes) to read `usage` at the end. A body that
    /// arrives as one [`Bytes`] frame is kept by reference, without a copy.
    Json(Option<Bytes>, Vec<u8>, usize),
    /// Nothing to read: an error answer, or a JSON answer over the cap.
    Nothing,
}

impl ResponseWatch {
    /// The watch for an answer with this status whose body is SSE (`sse`) or JSON kept up to
    /// `json_cap` bytes ([`MAX_USAGE_BODY`] unless configured).
    pub fn new(status: u16, sse: bool, json_cap: usize) -> Self {
        if !(200..300).contains(&status) {
            ResponseWatch::Nothing
        } else if sse {
            ResponseWatch::Sse(SseScanner::new())
        } else {
            ResponseWatch::Json(None, Vec::new(), json_cap)
        }
    }

    /// Reads the next body chunk; `true` when it carried the first generated token.
    pub fn feed(&mut self, data: &[u8]) -> bool {
        match self {
            ResponseWatch::Sse(scanner) => scanner.feed(data),
            ResponseWatch::Json(first, buf, cap) => {
                let held = first.as_ref().map_or(0, Bytes::len) + buf.len();
                if held + data.len() > *cap {
                    *self = ResponseWatch::Nothing;
                } else {
                    if let Some(f) = first.take() {
                        buf.extend_from_slice(&f);
                    }
                    buf.extend_from_slice(data);
                }
                false
            }
            ResponseWatch::Nothing => false,
        }
    }

    /// As [`ResponseWatch::feed`], keeping a JSON answer's first frame by reference.
    pub fn feed_bytes(&mut self, data: &Bytes) -> bool {
        match self {
            ResponseWatch::Json(first @ None, buf, cap) if buf.is_empty() && data.len() <= *cap => {
                *first = Some(data.clone());
                false
            }
            _ => self.feed(data),
        }
    }

    /// The usage the answer reported, once it has ended.
    pub fn usage(&mut self) -> Option<Usage> {
        match self {
            ResponseWatch::Sse(scanner) => {
                scanner.finish();
                scanner.usage()
            }
            ResponseWatch::Json(Some(first), _, _) => extract_usage(first),
            ResponseWatch::Json(None, buf, _) => extract_usage(buf),
            ResponseWatch::Nothing => None,
        }
    }
}

/// How a routed request ended, as [`finish`] reported it on the in-flight entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// A 2xx answer read to its end: completed with the reported usage.
    Completed,
    /// A 5xx, or an answer that broke off: the endpoint failed it.
    Failed,
    /// Another answer (a 4xx about the request itself): nothing to learn, cancelled.
    Refused,
}

/// Releases `inflight` for an answer with `status` that ended cleanly (`clean`) or broke off,
/// with the usage the watch read. Returns how it ended and the usage counted (zero when the
/// server reported none).
pub fn finish<G: InflightGuard>(
    inflight: G,
    status: u16,
    clean: bool,
    watch: &mut ResponseWatch,
) -> (Ending, Usage) {
    if !clean || status >= 500 {
        inflight.fail();
        return (Ending::Failed, Usage::default());
    }
    if !(200..300).contains(&status) {
        drop(inflight);
        return (Ending::Refused, Usage::default());
    }
    let usage = watch.usage().unwrap_or_default();
    inflight.complete(scheduler_usage(&usage));
    (Ending::Completed, usage)
}

/// The tokens a quota charges a request when it is admitted: the prompt's estimate plus the
/// output it may generate (`max_tokens`, else the scheduler's default; none for embeddings,
/// which generate nothing). [`settle_quota`] replaces it with what the response reported.
pub fn quota_estimate(parsed: &ParsedRequest<'_>) -> u64 {
    let output = match parsed.kind {
        infergate_openai::ApiKind::Embeddings => 0,
        _ => parsed
            .max_output_tokens
            .unwrap_or(RequestContext::DEFAULT_OUTPUT_TOKENS),
    };
    u64::from(parsed.estimated_prompt_tokens()) + u64::from(output)
}

/// Admits a request from `tenant` against its quota (before it is queued or picked), or
/// answers the 429 with `Retry-After`. `Ok(None)`: no quota applies.
pub fn admit_quota(
    quotas: Option<&Quotas>,
    tenant: &str,
    parsed: &ParsedRequest<'_>,
) -> Result<Option<QuotaTicket>, ApiError> {
    match quotas {
        Some(q) => q.admit(tenant, quota_estimate(parsed)),
        None => Ok(None),
    }
}

/// Corrects a quota's charge once the answer has ended as [`finish`] said: a completed answer
/// counts the input and output tokens it reported; any other ending, or a completed answer that
/// reported no usage, keeps the estimate.
pub fn settle_quota(ticket: Option<QuotaTicket>, ending: Ending, usage: &Usage) {
    if let (Some(t), Ending::Completed) = (ticket, ending)
        && reported(usage)
    {
        t.settle(usage);
    }
}

/// Whether [`finish`] read a usage from the answer: it gives zero when the server reported
/// none (a stream without `stream_options.include_usage`), and settling with that zero would
/// erase the request's estimate — every such request would count for nothing against a token
/// quota or a tenant's attained service.
fn reported(usage: &Usage) -> bool {
    *usage != Usage::default()
}

/// A request's part in flow control: its pool's controller, its tenant and its size.
#[derive(Clone, Copy, Debug)]
pub struct FlowPart<'a> {
    /// The pool's controller.
    pub flow: &'a FlowController,
    /// The tenant (fairness id).
    pub tenant: &'a str,
    /// The request body's size, counted against the queues' byte limits.
    pub bytes: u64,
}

impl FlowPart<'_> {
    fn request<'b>(&'b self, cx: &RequestContext<'_>) -> infergate_scheduler::FlowRequest<'b> {
        infergate_scheduler::FlowRequest::new(self.tenant, cx.priority, self.bytes)
            .with_tokens(cx.prompt_tokens, cx.output_tokens)
    }
}

/// A routed request's guard and flow-control charge, or the error answered instead.
pub type Routed<G> = Result<(G, Option<FlowCharge>), ApiError>;

/// What [`admit`] decided.
#[derive(Debug)]
pub enum Admission<G> {
    /// Routed at once; the charge (with flow control) is settled by [`settle_flow`].
    Routed(G, Option<FlowCharge>),
    /// Waiting in the queues: drive it with [`poll_queued`].
    Queued(Queued),
    /// Answered with this error.
    Refused(ApiError),
}

/// Picks for a request, or, with flow control (`flow`), queues it when every candidate is
/// saturated (or when requests of its band or a higher one are already waiting). Without flow
/// control this is [`pick`] and [`rejection_error`], exactly.
pub fn admit<P: EndpointPool>(
    pool: &P,
    explain: bool,
    cx: &RequestContext<'_>,
    flow: Option<FlowPart<'_>>,
    model: &str,
) -> (Admission<P::Inflight>, Option<String>) {
    let Some(part) = flow else {
        let (picked, explanation) = pick(pool, explain, cx);
        let admission = match picked {
            Ok(g) => Admission::Routed(g, None),
            Err(r) => Admission::Refused(rejection_error(r, model, cx.subset.is_some())),
        };
        return (admission, explanation);
    };
    let req = part.request(cx);
    if part.flow.must_wait(cx.priority) {
        // Not picked: requests of its band or a higher one wait already, and it goes behind them.
        let explanation = explain.then(|| {
            format!(
                "chosen= policy=queued priority={} queued={} reason=behind-waiting-requests",
                cx.priority.as_str(),
                part.flow.queued()
            )
        });
        return (enqueue(part.flow, req, None, model), explanation);
    }
    let cx = cx
        .with_queueing(true)
        .with_reserved_endpoints(part.flow.reserve_for(&req));
    let (picked, explanation) = pick(pool, explain, &cx);
    let admission = match picked {
        Ok(g) => Admission::Routed(g, Some(part.flow.charge(&req))),
        Err(Rejection::Shed { retry_after }) => enqueue(part.flow, req, Some(retry_after), model),
        Err(Rejection::NoEndpoints) => Admission::Refused(ApiError::QueueNoEndpoints {
            model: model.to_owned(),
            subset: cx.subset.is_some(),
            waited: None,
        }),
        Err(r @ Rejection::Unavailable { .. }) => {
            Admission::Refused(rejection_error(r, model, cx.subset.is_some()))
        }
    };
    (admission, explanation)
}

fn enqueue<G>(
    flow: &FlowController,
    req: infergate_scheduler::FlowRequest<'_>,
    retry_after: Option<std::time::Duration>,
    model: &str,
) -> Admission<G> {
    match flow.enqueue(req, retry_after) {
        Ok(q) => Admission::Queued(q),
        Err(QueueRefused(refusal)) => Admission::Refused(ApiError::QueueFull {
            model: model.to_owned(),
            priority: req.priority.as_str(),
            limit: match refusal {
                Refusal::BandFull => QueueLimit::Band,
                Refusal::QueueFull => QueueLimit::Queue,
            },
            retry_after: flow.queue_retry_after(req.priority),
        }),
    }
}

/// Drives a queued request (`queued`, taken when it leaves): on its turn, picks with `cx`;
/// ready with the route, or with the queue's rejection. Dropping `queued` removes the request.
pub fn poll_queued<P: EndpointPool>(
    pool: &P,
    queued: &mut Option<Queued>,
    cx: &RequestContext<'_>,
    model: &str,
    task: &mut std::task::Context<'_>,
) -> std::task::Poll<Routed<P::Inflight>> {
    use std::task::Poll;
    let cx = cx.with_queueing(true);
    loop {
        let Some(q) = queued.as_mut() else {
            return Poll::Ready(Err(ApiError::QueueNoEndpoints {
                model: model.to_owned(),
                subset: cx.subset.is_some(),
                waited: None,
            }));
        };
        let turn = match q.poll_turn(task) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(t) => t,
        };
        let retry_after = q.retry_after();
        match turn {
            Turn::Try => {
                if let Some(routed) = try_turn(pool, queued, &cx, model) {
                    return Poll::Ready(routed);
                }
            }
            Turn::Expired(waited) => {
                queued.take();
                return Poll::Ready(Err(ApiError::QueueTtlExpired {
                    model: model.to_owned(),
                    waited,
                    retry_after,
                }));
            }
            Turn::Evicted(_) => {
                queued.take();
                return Poll::Ready(Err(ApiError::QueueEvicted {
                    model: model.to_owned(),
                    retry_after,
                }));
            }
        }
    }
}

/// A queued request's turn ([`Turn::Try`]): picks with `cx`. `None`: the pool is still
/// saturated and the request keeps its place (`queued` stays); else the route, or the error
/// (the pool lost its endpoints), and `queued` is taken.
pub fn try_turn<P: EndpointPool>(
    pool: &P,
    queued: &mut Option<Queued>,
    cx: &RequestContext<'_>,
    model: &str,
) -> Option<Routed<P::Inflight>> {
    let reserve = queued.as_ref().map_or(0, Queued::reserve);
    let cx = cx.with_queueing(true).with_reserved_endpoints(reserve);
    match pool.pick(&cx) {
        Ok(g) => {
            let charge = queued.take().and_then(Queued::dispatched);
            Some(Ok((g, charge)))
        }
        Err(Rejection::Shed { retry_after }) => {
            if let Some(q) = queued.as_mut() {
                q.still_saturated(retry_after);
            }
            None
        }
        Err(r) => {
            let waited = queued.take().map(Queued::no_endpoints);
            Some(Err(match r {
                Rejection::NoEndpoints => ApiError::QueueNoEndpoints {
                    model: model.to_owned(),
                    subset: cx.subset.is_some(),
                    waited,
                },
                other => rejection_error(other, model, cx.subset.is_some()),
            }))
        }
    }
}

/// [`admit`], then waits in the queue when it said so: the async form for shells that can
/// await (the gateway). Dropping the future removes a queued request at once.
pub async fn route<P: EndpointPool>(
    pool: &P,
    explain: bool,
    cx: &RequestContext<'_>,
    flow: Option<FlowPart<'_>>,
    model: &str,
) -> (Routed<P::Inflight>, Option<String>) {
    let (admission, explanation) = admit(pool, explain, cx, flow, model);
    let routed = match admission {
        Admission::Routed(g, charge) => Ok((g, charge)),
        Admission::Refused(e) => Err(e),
        Admission::Queued(q) => {
            let mut queued = Some(q);
            std::future::poll_fn(|task| poll_queued(pool, &mut queued, cx, model, task)).await
        }
    };
    (routed, explanation)
}

/// Corrects a flow-control charge once the answer has ended as [`finish`] said: a completed
/// answer counts the tokens it reported; any other ending, or a completed answer that reported
/// no usage, keeps the estimate.
pub fn settle_flow(charge: Option<FlowCharge>, ending: Ending, usage: &Usage) {
    if let (Some(c), Ending::Completed) = (charge, ending)
        && reported(usage)
    {
        c.settle(&scheduler_usage(usage));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
