//! The request path: route by the body's `model`, pick endpoints, forward with bounded retries,
//! and stream the answer back.
//!
//! Per request the gateway reads the body once (bounded by `limits.maxRequestBodyBytes`), parses
//! it with the same [`parse_request`] and [`ModelRouter`](infergate_openai::ModelRouter) as the
//! ext_proc body-based router, takes one pick from the model's pool and forwards the unchanged
//! bytes. Retries go to the pick's next fallback endpoint (once those are spent, to the model's
//! other endpoints not known to be down) and only happen while nothing has been sent to the
//! client: on a connect failure, a connection closed before the response headers (inference
//! requests are treated as safe to repeat until then), or a 5xx status (whose body is then
//! discarded). A request written on a pooled connection that the server's keep-alive timer may
//! have closed under it goes out once more on a new connection to the same endpoint first. Once
//! response headers are forwarded the request is committed to that endpoint.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::uri::{PathAndQuery, Uri};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use infergate_metrics::ClientTls;
use infergate_openai::{
    ApiError, ApiKind, ModelRewriter, Route, check_content_encoding, check_transfer_encoding,
    parse_request,
};
use infergate_pool::hop::strip_hop_by_hop;
use infergate_pool::lifecycle::{self, Segments};
use infergate_pool::quota::QuotaTicket;
use infergate_scheduler::Priority;
use tokio::time::Instant;

use crate::access_log::{Note, Outcome};
use crate::auth::{Identity, ModelAccess};
use crate::backend::Inflight;
use crate::body::{ResponseBody, Tracked, Upstream};
use crate::config::CONCURRENCY_RETRY_AFTER;
use crate::limits::{BodyRead, BufferCharge, Counters, RequestSlot, read_body};
use crate::state::{Model, Permit, Slots, State};
use crate::telemetry::Telemetry;
use crate::upstream::{Lease, Pooled, SendError, Upstreams};

/// Response header naming the endpoint that served the request.
pub const ENDPOINT_HEADER: &str = "x-infergate-endpoint";
pub use crate::request_id::REQUEST_ID_HEADER;
/// Request header asking for the routing decision (`1`), and response header carrying it
/// (when `explainHeader` is on).
pub const EXPLAIN_HEADER: &str = "x-infergate-explain";

static X_INFERGATE_ENDPOINT: HeaderName = HeaderName::from_static(ENDPOINT_HEADER);
/// [`infergate_openai::OVERLOADED_HEADER`], parsed once.
static X_INFERGATE_OVERLOADED: HeaderName =
    HeaderName::from_static(infergate_openai::OVERLOADED_HEADER);
static X_REQUEST_ID: HeaderName = HeaderName::from_static(REQUEST_ID_HEADER);
static X_INFERGATE_EXPLAIN: HeaderName = HeaderName::from_static(EXPLAIN_HEADER);

/// What every connection shares.
pub(crate) struct Shared {
    pub(crate) state: arc_swap::ArcSwap<State>,
    pub(crate) telemetry: Telemetry,
    seed: u64,
}

impl Shared {
    pub(crate) fn new(state: State, telemetry: Telemetry, seed: u64) -> Self {
        Shared {
            state: arc_swap::ArcSwap::from_pointee(state),
            telemetry,
            seed,
        }
    }
}

/// What one worker's connections share: the gateway's state and the worker's own upstream
/// connections.
pub(crate) struct Worker {
    pub(crate) shared: Arc<Shared>,
    pub(crate) upstreams: Arc<Upstreams>,
    /// Each worker numbers its own requests: no counter shared between threads.
    ids: crate::request_id::RequestIds,
}

impl Worker {
    /// Worker `index` (distinct per worker, so that their request ids never collide).
    pub(crate) fn new(shared: Arc<Shared>, index: usize) -> Self {
        let ids = crate::request_id::RequestIds::new(shared.seed, index);
        Worker {
            shared,
            upstreams: Arc::new(Upstreams::default()),
            ids,
        }
    }
}

/// Serves one request in three steps, each in a function of its own: [`admit`] (method, path,
/// body within its limit), [`route`] (parse, model, concurrency slot, pick — the shared request
/// lifecycle, `infergate_pool::lifecycle`), and [`forward`] (the retry loop over the ranked
/// endpoints). Never fails: every problem becomes an OpenAI-style error response, except a
/// request body that breaks off, which closes the connection. With `accessLog:` the request's
/// [`Note`] is logged here when the gateway answered itself, else by the response body.
pub(crate) async fn handle(
    worker: Arc<Worker>,
    req: Request<Incoming>,
    client: SocketAddr,
) -> Result<Response<ResponseBody>, hyper::Error> {
    let started = Instant::now();
    let request_id = worker.ids.of(req.headers());
    let state = worker.shared.state.load_full();
    let mut note = state
        .access_log
        .as_ref()
        .map(|log| Note::new(log, client, req.method(), req.uri(), &request_id));
    let answer = respond(&worker, &state, req, request_id, started, &mut note).await;
    // Still here: the gateway answered itself, or the client's body broke off.
    if let Some(mut note) = note {
        match &answer {
            Ok(r) => note.status = Some(r.status().as_u16()),
            Err(_) => note.outcome = Outcome::Cancelled,
        }
        note.done(started.elapsed());
    }
    answer
}

async fn respond(
    worker: &Worker,
    state: &State,
    req: Request<Incoming>,
    request_id: HeaderValue,
    started: Instant,
    note: &mut Option<Box<Note>>,
) -> Result<Response<ResponseBody>, hyper::Error> {
    let telemetry = &worker.shared.telemetry;
    // Before authentication: a browser's CORS preflight carries no credentials, and the answer
    // depends on the path alone (`Route::Options`), so it tells an anonymous caller nothing. An
    // `OPTIONS` on a path the gateway does not serve goes on as any other request (authenticated,
    // then 404).
    if req.method() == http::Method::OPTIONS
        && let Ok(Route::Options { allow }) = Route::of(req.method().as_str(), req.uri().path())
    {
        return Ok(options_response(allow, request_id));
    }
    // Headers only, before any slot is taken or body byte read (`crate::auth`).
    let identity = match state.auth.authenticate(req.headers()).await {
        Ok(identity) => identity,
        Err(e) => return Ok(refuse(telemetry, &e, request_id, note)),
    };
    if let Some(n) = note.as_deref_mut() {
        n.tenant = Some(Arc::clone(&identity.tenant));
    }
    let admitted = match admit(state, &telemetry.limits, req, identity).await? {
        Admission::Admitted(a) => a,
        Admission::Models(identity, head) => {
            return Ok(models_response(state, &identity, request_id, head));
        }
        Admission::Model(identity, head, id) => {
            return Ok(match state.model_for(&identity.models, &id) {
                Ok(body) => json_response(body, request_id, head),
                Err(e) => refuse(telemetry, &e, request_id, note),
            });
        }
        Admission::Options(allow) => return Ok(options_response(allow, request_id)),
        Admission::Refused(e) => return Ok(refuse(telemetry, &e, request_id, note)),
    };
    let routed = match route(state, &admitted, note).await {
        Ok(r) => r,
        Err((e, explanation)) => {
            let r = refuse(telemetry, &e, request_id, note);
            return Ok(with_explanation(r, explanation.as_ref()));
        }
    };
    Ok(forward(worker, state, admitted, routed, request_id, started, note).await)
}

/// A request read and checked, ready to route.
struct Admitted {
    kind: ApiKind,
    parts: http::request::Parts,
    body: Bytes,
    /// The body's share of `limits.maxBufferedRequestBytes`, held while the body may be resent.
    charge: BufferCharge,
    /// The request's `limits.maxRequestsInFlight` slot, held to the last response byte.
    slot: RequestSlot,
    /// Who sent it (`crate::auth`): its tenant and the models it may call.
    identity: Identity,
}

/// What [`admit`] decided.
#[allow(
    clippy::large_enum_variant,
    reason = "moved once per request; boxing would allocate on the request path"
)]
enum Admission {
    /// An API request, its body read within the limit.
    Admitted(Admitted),
    /// `GET /v1/models` (`HEAD` when `true`): answered from the configuration, listing what this
    /// caller may call.
    Models(Identity, bool),
    /// `GET /v1/models/{id}` (`HEAD` when `true`): that model's entry, when this caller may call
    /// it.
    Model(Identity, bool, String),
    /// `OPTIONS` on a path the gateway serves: 204 with this `Allow`. `respond` answers it before
    /// authentication, so it does not come this far; kept so that every route has its answer.
    Options(&'static str),
    /// Answered with this error.
    Refused(ApiError),
}

/// Checks method and path, takes the gateway-wide request slot (`limits.maxRequestsInFlight`)
/// and reads the body within its limits (`crate::limits::read_body`). Errors only when the
/// client's body breaks off.
async fn admit(
    state: &State,
    counters: &Counters,
    req: Request<Incoming>,
    identity: Identity,
) -> Result<Admission, hyper::Error> {
    let kind = match Route::of(req.method().as_str(), req.uri().path()) {
        Ok(Route::Api(kind)) => kind,
        Ok(Route::Models) => {
            let head = req.method() == http::Method::HEAD;
            return Ok(Admission::Models(identity, head));
        }
        Ok(Route::Model) => {
            let head = req.method() == http::Method::HEAD;
            let id = infergate_openai::model_id(req.uri().path()).unwrap_or_default();
            return Ok(Admission::Model(identity, head, id.into_owned()));
        }
        Ok(Route::Options { allow }) => return Ok(Admission::Options(allow)),
        Err(e) => return Ok(Admission::Refused(e)),
    };
    // A compressed body could be neither routed nor read by a model server: refused before
    // it is read.
    let encoding = req.headers().get(header::CONTENT_ENCODING);
    if let Err(e) = check_content_encoding(encoding.map(HeaderValue::as_bytes)) {
        return Ok(Admission::Refused(e));
    }
    let limits = &state.config.limits;
    // Before the body is read: the per-model limit needs the body's `model`, this one does not.
    let slot = match counters.start_request(limits.max_requests_in_flight) {
        Ok(slot) => slot,
        Err(e) => match slot_of_a_queued_sheddable(state, counters, &identity, req.headers()) {
            Some(slot) => slot,
            None => return Ok(Admission::Refused(e)),
        },
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // Without a length the body may be chunked under another coding, which is not decoded:
    // refused before it is read (a request with a length has no Transfer-Encoding left).
    if declared.is_none() {
        let coding = req.headers().get(header::TRANSFER_ENCODING);
        if let Err(e) = check_transfer_encoding(coding.map(HeaderValue::as_bytes)) {
            return Ok(Admission::Refused(e));
        }
    }
    // A client waiting for `100 Continue` has not sent the body yet: a declared length over the
    // limit is answered at once, where reading on to discard the body (`read_body`) would first
    // tell the client to send it.
    let limit = limits.max_request_body_bytes;
    if declared.is_some_and(|n| n > u64::try_from(limit).unwrap_or(u64::MAX))
        && req
            .headers()
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
    {
        return Ok(Admission::Refused(ApiError::BodyTooLarge { limit }));
    }
    let (parts, body) = req.into_parts();
    match read_body(&counters.buffered, limits, declared, body).await? {
        BodyRead::Read(body, charge) => Ok(Admission::Admitted(Admitted {
            kind,
            parts,
            body,
            charge,
            slot,
            identity,
        })),
        BodyRead::Refused(e) => Ok(Admission::Refused(e)),
    }
}

/// At `limits.maxRequestsInFlight`, a request above Sheddable (by its headers: `tenancy:`)
/// takes the slot of the newest queued Sheddable request, which is evicted (429
/// `evicted-priority`, as when a higher band needs room in the queue) and frees its slot as it
/// answers; meanwhile the new one holds a slot over the limit. Queued requests hold slots, so
/// without this a Sheddable flood that filled the queue and the slots would turn Critical
/// requests away at the door (503 `gateway_busy`) before their priority was read. The queue
/// with the most Sheddable requests gives one up, a queue a reload replaced included (its
/// requests still hold slots). Only on the refusal path.
fn slot_of_a_queued_sheddable(
    state: &State,
    counters: &Counters,
    identity: &Identity,
    headers: &http::HeaderMap,
) -> Option<RequestSlot> {
    let authenticated = state.auth.is_enabled().then_some(&identity.tenant);
    if state.tenancy.gateway(authenticated, headers).priority == Priority::Sheddable {
        return None;
    }
    let flow = state
        .queues()
        .map(|f| (f.queued_in(Priority::Sheddable), f))
        .filter(|(n, _)| *n > 0)
        .max_by_key(|(n, _)| *n)?
        .1;
    flow.evict_newest_sheddable()
        .then(|| counters.start_request_over_limit())
}

/// A routed request: its model, its concurrency slot, its in-flight entry.
struct Routed {
    model: Arc<Model>,
    permit: Option<Permit>,
    inflight: Inflight,
    streaming: bool,
    /// The decision's summary, when the request asked for it and the gateway allows it.
    explanation: Option<HeaderValue>,
    /// The tenant's quota charge, corrected to the reported usage when the answer ends.
    quota: Option<QuotaTicket>,
    /// The tenant's attained-service charge (flow control), settled with the reported usage.
    flow_charge: Option<infergate_pool::flow::FlowCharge>,
    /// The tenant sent upstream in the reference's fairness-id header (flow control on).
    fairness_id: Option<Arc<str>>,
    /// A `rewrites:` rule sent the request as another model: the body with its new `model`,
    /// and the rewriter that gives the response the client's name back.
    rewritten: Option<(Bytes, ModelRewriter)>,
}

/// Parses the body, resolves the model, takes its concurrency slot and picks (the shared
/// lifecycle). A refusal carries the decision's summary when one was asked for.
async fn route(
    state: &State,
    a: &Admitted,
    note: &mut Option<Box<Note>>,
) -> Result<Routed, (ApiError, Option<HeaderValue>)> {
    let parsed = parse_request(a.kind, &a.body).map_err(|e| (e, None))?;
    let requested: &str = &parsed.model;
    if let Some(n) = note.as_deref_mut() {
        n.stream = parsed.stream;
    }
    // A rewrite (alias or canary split) chooses the served name; the caller's permission is
    // checked on the name it asked for. Rewrites and quotas go by the authenticated tenant
    // (`anonymous` without authentication), never by `tenancy.tenantHeader`: a client must not
    // choose its own quota bucket. The configuration refuses, under `auth: none`, entries for
    // tenants no request can be.
    let served = state
        .rewrites
        .choose(requested, Some(&a.identity.tenant))
        .filter(|s| *s != requested);
    // An unknown name's 404 lists the served names; for a caller allowed only some, only those
    // (the others are no business of its own).
    let name = served.unwrap_or(requested);
    let resolved = match &a.identity.models {
        ModelAccess::All => state.router.resolve(name),
        only => state
            .router
            .resolve_visible(name, |n, base| only.allows(n, base)),
    };
    if let Some(n) = note.as_deref_mut() {
        // Most requests name a served model: its name is shared rather than copied.
        n.model = Some(match &resolved {
            Ok(r) if *r.target.name == *requested => Arc::clone(&r.target.name),
            _ => requested.into(),
        });
    }
    let resolved = resolved.map_err(|e| (e, None))?;
    a.identity
        .may_call(requested, resolved.base_model)
        .map_err(|e| (e, None))?;
    // Before any slot is taken: a tenant over its quota costs the pool nothing.
    let quota = lifecycle::admit_quota(state.quotas.as_ref(), &a.identity.tenant, &parsed)
        .map_err(|e| (e, None))?;
    let rewritten = served.map(|s| {
        (
            Bytes::from(parsed.rewrite_model(&a.body, s)),
            ModelRewriter::new(s, requested),
        )
    });
    let model = Arc::clone(resolved.target);
    if let Some(n) = note.as_deref_mut() {
        n.served_model = Some(Arc::clone(&model.name));
    }
    // With flow control the slot is taken when the request is dispatched (a request waiting
    // in the queue holds none, and a model at its limit queues rather than refuses); without,
    // here, before the pick.
    let mut permit = match &model.slots {
        Slots::BeforePick(c) => match c.try_acquire() {
            Some(p) => Some(p),
            None => {
                let e = ApiError::ConcurrencyLimit {
                    model: model.name.to_string(),
                    limit: c.max(),
                    retry_after: CONCURRENCY_RETRY_AFTER,
                };
                return Err((e, None));
            }
        },
        _ => None,
    };
    let segments = Segments::new(parsed.segments());
    let cx = lifecycle::context(
        &parsed,
        resolved.base_model,
        resolved.adapter,
        &segments,
        None,
    );
    let mut cached = Vec::new();
    let cx = infergate_pool::precise::refine(
        cx,
        model.backend.pool.precise(),
        &parsed,
        &a.body,
        &mut cached,
    );
    let explain = state.config.explain_header
        && a.parts
            .headers
            .get(&X_INFERGATE_EXPLAIN)
            .is_some_and(|v| v.as_bytes() == b"1");
    // Flow control's tenant and priority (`tenancy:`): the authenticated tenant, else the
    // configured header (fairness between clients that are not told apart otherwise).
    let authenticated = state.auth.is_enabled().then_some(&a.identity.tenant);
    let tp = state.tenancy.gateway(authenticated, &a.parts.headers);
    let cx = cx.with_priority(tp.priority);
    // Flow control (`flowControl:`): wait in the model's queue while every pod is saturated.
    let flow = model.flow.as_ref().map(|flow| lifecycle::FlowPart {
        flow,
        tenant: &tp.tenant,
        bytes: a.body.len() as u64,
    });
    let (picked, explanation) = match &model.slots {
        Slots::Unlimited | Slots::BeforePick(_) => {
            lifecycle::route(&model.backend.pool, explain, &cx, flow, &model.name).await
        }
        Slots::AtDispatch(gated) => {
            let (picked, explanation) =
                lifecycle::route(gated, explain, &cx, flow, &model.name).await;
            let picked = picked.map(|(g, charge)| {
                permit = Some(g.permit);
                (g.inflight, charge)
            });
            (picked, explanation)
        }
    };
    let explanation = explanation.and_then(|e| HeaderValue::try_from(e).ok());
    match picked {
        Ok((inflight, flow_charge)) => Ok(Routed {
            streaming: parsed.stream,
            fairness_id: model.flow.is_some().then_some(tp.tenant),
            flow_charge,
            model,
            permit,
            inflight,
            explanation,
            rewritten,
            quota,
        }),
        Err(e) => Err((e, explanation)),
    }
}

/// The path and query sent upstream: the client's, except that an API path the gateway took
/// with a trailing slash (`/v1/chat/completions/`, `ApiKind::from_path`) goes as the API's own
/// path. A model server has no route for the slashed path: vLLM (FastAPI) answers it with a
/// redirect to its own address, which would send the client around the gateway, and others 404.
fn upstream_path(kind: ApiKind, uri: &Uri) -> PathAndQuery {
    let client = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    if client.path() == kind.path() {
        return client;
    }
    let canonical = match client.query() {
        Some(q) => format!("{}?{q}", kind.path()),
        None => kind.path().to_owned(),
    };
    PathAndQuery::try_from(canonical).unwrap_or(client)
}

/// Sends the request to the pick's endpoints in rank order, then to the model's others, until
/// one answers ([`Plan`]): a connect failure, a connection that closed before the response
/// headers, or a 5xx while another attempt remains, moves on (nothing has reached the client
/// yet); the first other answer is streamed back through a [`Tracked`] body.
async fn forward(
    worker: &Worker,
    state: &State,
    admitted: Admitted,
    routed: Routed,
    request_id: HeaderValue,
    started: Instant,
    note: &mut Option<Box<Note>>,
) -> Response<ResponseBody> {
    let telemetry = &worker.shared.telemetry;
    // `_charge` lives to the end of this function: the body may be sent again until then.
    let Admitted {
        kind,
        parts,
        body,
        charge: _charge,
        slot,
        ..
    } = admitted;
    let Routed {
        model,
        permit,
        mut inflight,
        streaming,
        explanation,
        rewritten,
        quota,
        flow_charge,
        fairness_id,
    } = routed;
    let (body, mut rewriter) = match rewritten {
        Some((b, rw)) => (b, Some(rw)),
        None => (body, None),
    };
    let path_and_query = upstream_path(kind, &parts.uri);
    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    // Only the gateway says who the tenant is (`tenancy:`): a client's fairness id or
    // objective is never passed on.
    infergate_pool::tenant::strip_client_headers(&mut headers);
    if let Some(t) = &fairness_id
        && let Ok(v) = HeaderValue::from_str(t)
    {
        headers.insert(
            HeaderName::from_static(infergate_pool::tenant::FAIRNESS_ID_HEADER),
            v,
        );
    }
    if state.auth.is_enabled() {
        // The gateway's credential is not the model server's.
        crate::auth::strip_credentials(&mut headers);
    }
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(X_REQUEST_ID.clone(), request_id.clone());

    let timeouts = &state.config.timeouts;
    let tls = model.backend.tls.as_ref();
    let mut out = Outgoing {
        method: parts.method,
        path_and_query,
        headers,
        body,
    };
    let mut plan = Plan {
        max_attempts: usize::from(state.config.retries.max_attempts).min(model.endpoints.len()),
        made: 0,
        beyond: 0,
    };
    let mut tally = Tally {
        sends: 0,
        failures: String::new(),
        unsent: true,
    };
    let mut next = plan.next(&inflight);
    while let Some(addr) = next.take() {
        if plan.made > 1 {
            model.metrics.retry();
            inflight.reassign(addr);
        }
        let Some(ep) = model.endpoints.get(&addr) else {
            next = plan.next(&inflight);
            continue;
        };
        // No later attempt can follow: the headers go with this one rather than a copy.
        let last = plan.made == plan.max_attempts;
        let target = Target {
            addr,
            host: &ep.header,
            tls,
            connect: timeouts.connect,
            pool_idle: timeouts.pool_idle,
        };
        let sent = tokio::time::timeout(
            timeouts.first_byte,
            send(worker, &model, target, &mut out, last, &mut tally, note),
        )
        .await;
        let (resp, lease) = match sent {
            Err(_elapsed) => {
                tracing::debug!(endpoint = %addr, "no response headers within the first-byte timeout");
                inflight.no_answer();
                inflight.fail();
                let e = ApiError::UpstreamTimeout {
                    timeout: timeouts.first_byte,
                };
                let r = refuse(telemetry, &e, request_id, note);
                return with_explanation(r, explanation.as_ref());
            }
            Ok(Err(err)) => {
                tracing::debug!(endpoint = %addr, error = %err, "upstream request failed");
                if err.is_refused() {
                    // Nothing listens there: no later pick goes there until it answers again.
                    inflight.refused(addr);
                } else {
                    inflight.no_answer();
                }
                tally.failed(&err);
                next = plan.next(&inflight);
                continue;
            }
            Ok(Ok(sent)) => sent,
        };
        inflight.answered(resp.status().as_u16());
        if resp.status().is_server_error() && !last {
            next = plan.next(&inflight);
        }
        if next.is_some() {
            tracing::debug!(endpoint = %addr, status = %resp.status(), "retrying on the next endpoint");
            tally.unsent = false;
            tally.note(format_args!("{addr} answered {}", resp.status()));
            continue;
        }
        let status = resp.status();
        model.metrics.response(status.as_u16());
        let (mut rparts, rbody) = resp.into_parts();
        strip_hop_by_hop(&mut rparts.headers);
        // Only this gateway says it is overloaded: a model server's answer passed on is not.
        rparts.headers.remove(infergate_openai::OVERLOADED_HEADER);
        if rewriter.is_some() {
            // The client's name may differ in length from the served one.
            rparts.headers.remove(header::CONTENT_LENGTH);
        }
        rparts
            .headers
            .insert(X_INFERGATE_ENDPOINT.clone(), ep.header.clone());
        rparts.headers.insert(X_REQUEST_ID.clone(), request_id);
        let sse = streaming
            || rparts
                .headers
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        if let Some(n) = note.as_deref_mut() {
            n.status = Some(status.as_u16());
        }
        let tracked = Tracked::new(Upstream {
            body: rbody,
            lease,
            permit,
            slot,
            inflight,
            model,
            status,
            sse,
            started,
            idle: timeouts.idle,
            rewriter: rewriter.take(),
            quota,
            flow_charge,
            note: note.take(),
        });
        let r = Response::from_parts(rparts, ResponseBody::Stream(Box::new(tracked)));
        return with_explanation(r, explanation.as_ref());
    }
    inflight.fail();
    let e = tally.unanswered(&model);
    with_explanation(
        refuse(telemetry, &e, request_id, note),
        explanation.as_ref(),
    )
}

/// Which endpoints a request's attempts go to, counted against `retries.maxAttempts` (never
/// more than the model has): the pick's ranked ones, then, when they all failed, the model's
/// others ([`Inflight::next_untried`]: a lookup under the pool's lock, on the failure path only).
struct Plan {
    max_attempts: usize,
    /// Attempts started.
    made: usize,
    /// Where the lookup beyond the ranked list goes on from.
    beyond: usize,
}

impl Plan {
    /// The next attempt's endpoint, counted as made; `None` when no attempt is left.
    fn next(&mut self, inflight: &Inflight) -> Option<SocketAddr> {
        if self.made == self.max_attempts {
            return None;
        }
        let ranked = inflight.endpoints().as_slice();
        let addr = match ranked.get(self.made) {
            Some(addr) => *addr,
            None => inflight.next_untried(&mut self.beyond)?,
        };
        self.made += 1;
        Some(addr)
    }
}

/// What a request's sends did so far, across its attempts.
struct Tally {
    /// Requests sent (a keep-alive race's second send included): the access log's `attempts`.
    sends: usize,
    /// What each failed send did, `; ` between them, for the answer when none is left: built
    /// on the failure path only.
    failures: String,
    /// Whether every send so far failed before the request was written (no connection).
    unsent: bool,
}

impl Tally {
    /// Adds what one send did to the failures.
    fn note(&mut self, what: std::fmt::Arguments<'_>) {
        use std::fmt::Write as _;
        if !self.failures.is_empty() {
            self.failures.push_str("; ");
        }
        // Writing to a String cannot fail.
        let _ = self.failures.write_fmt(what);
    }

    /// A send failed with `err`.
    fn failed(&mut self, err: &SendError) {
        self.unsent &= err.is_before_send();
        self.note(format_args!("{}", Described(err)));
    }

    /// The answer when no endpoint tried gave one: 503 `upstream_refused` when nothing was sent
    /// (every attempt failed to connect: the request can be sent again as it is, and the
    /// refused endpoints are out of the candidates by then), else 502 `upstream_unavailable`;
    /// either says what each send did, in order.
    fn unanswered(self, model: &Model) -> ApiError {
        if self.failures.is_empty() {
            ApiError::UpstreamUnavailable {
                reason: "no endpoint of the model could be tried".into(),
            }
        } else if self.unsent {
            ApiError::UpstreamRefused {
                reason: self.failures,
                retry_after: model.backend.retry_after_min(),
            }
        } else {
            ApiError::UpstreamUnavailable {
                reason: self.failures,
            }
        }
    }
}

/// The request as it goes upstream, built again for each send.
struct Outgoing {
    method: http::Method,
    path_and_query: PathAndQuery,
    /// Taken by the last send ([`Outgoing::request`] with `keep` false), copied before.
    headers: http::HeaderMap,
    body: Bytes,
}

impl Outgoing {
    /// The request for the endpoint whose `Host` is `host`. With `keep`, the headers are copied
    /// for a later send; without, they go with this one.
    fn request(&mut self, host: &HeaderValue, keep: bool) -> Request<Full<Bytes>> {
        let mut up = Request::new(Full::new(self.body.clone()));
        *up.method_mut() = self.method.clone();
        // Origin form (`POST /v1/chat/completions HTTP/1.1`) with the endpoint as `Host`, as an
        // HTTP/1.1 client sends to a server (RFC 9112 §3.2): a strict server refuses a request
        // without `Host`.
        *up.uri_mut() = Uri::from(self.path_and_query.clone());
        *up.headers_mut() = if keep {
            self.headers.clone()
        } else {
            std::mem::take(&mut self.headers)
        };
        up.headers_mut().insert(header::HOST, host.clone());
        up
    }
}

/// Where one attempt goes, and how it connects.
#[derive(Clone, Copy)]
struct Target<'a> {
    addr: SocketAddr,
    /// Its `Host` header.
    host: &'a HeaderValue,
    tls: Option<&'a ClientTls>,
    /// `timeouts.connectMs`.
    connect: std::time::Duration,
    /// `timeouts.poolIdleMs`.
    pool_idle: std::time::Duration,
}

/// One attempt: sends the request to `to` on a pooled connection (or a new one) and, when a
/// pooled connection that may have met the server's keep-alive timer ([`Pooled::may_race`])
/// closed without an answer, once more on a new connection. Each send is a pick of the
/// endpoint in the metrics and an attempt in the access log; the second is also a retry. With
/// `last`, the request's headers go with the last send this attempt can make.
async fn send(
    worker: &Worker,
    model: &Model,
    to: Target<'_>,
    out: &mut Outgoing,
    last: bool,
    tally: &mut Tally,
    note: &mut Option<Box<Note>>,
) -> Result<(Response<Incoming>, Lease), SendError> {
    let mut pooled = worker.upstreams.checkout(to.addr, to.pool_idle, to.tls);
    let race = pooled.as_ref().is_some_and(Pooled::may_race);
    loop {
        tally.sends += 1;
        model.metrics.pick(to.addr);
        if let Some(n) = note.as_deref_mut() {
            n.endpoint = Some(to.addr);
            n.attempts = u8::try_from(tally.sends).unwrap_or(u8::MAX);
        }
        let again = race && pooled.is_some();
        let up = out.request(to.host, again || !last);
        let result = worker
            .upstreams
            .send(to.addr, to.tls, pooled.take(), up, to.connect)
            .await;
        match result {
            Err(e) if again && e.on_reused() => {
                tracing::debug!(endpoint = %to.addr, error = %e, "a connection idle in the pool closed without an answer: sending again on a new one");
                tally.failed(&e);
                model.metrics.retry();
            }
            r => return r,
        }
    }
}

/// [`error_response`] for a request whose note (if any) then names the error.
fn refuse(
    telemetry: &Telemetry,
    err: &ApiError,
    request_id: HeaderValue,
    note: &mut Option<Box<Note>>,
) -> Response<ResponseBody> {
    if let Some(n) = note.as_deref_mut() {
        n.error = Some(err.metric_label());
    }
    error_response(telemetry, err, request_id)
}

/// `r` with the decision's summary in `x-infergate-explain`, when there is one.
fn with_explanation(
    mut r: Response<ResponseBody>,
    explanation: Option<&HeaderValue>,
) -> Response<ResponseBody> {
    if let Some(v) = explanation {
        r.headers_mut()
            .insert(X_INFERGATE_EXPLAIN.clone(), v.clone());
    }
    r
}

/// A send's failure as the client's error message says it: the endpoint and what failed,
/// without the socket error's detail (in the debug log).
struct Described<'a>(&'a SendError);

impl std::fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            SendError::Connect { addr, .. } | SendError::ConnectTimeout { addr, .. } => {
                write!(f, "cannot connect to {addr}")
            }
            SendError::Tls { addr, .. } => write!(f, "TLS handshake with {addr} failed"),
            SendError::Http {
                addr,
                reused: false,
                ..
            } => write!(f, "{addr} closed the connection before answering"),
            SendError::Http {
                addr, reused: true, ..
            } => write!(f, "{addr} closed a reused connection before answering"),
        }
    }
}

/// `GET /v1/models`: the served models and adapters the caller may call (every one without
/// authentication, from the prebuilt body). For `HEAD` (`head`), the same headers, its length
/// included, and no body: HTTP/2 leaves that to the server.
fn models_response(
    state: &State,
    identity: &Identity,
    request_id: HeaderValue,
    head: bool,
) -> Response<ResponseBody> {
    json_response(state.models_for(&identity.models), request_id, head)
}

/// `204 No Content` with `Allow`: the answer to `OPTIONS`. No CORS headers: the gateway has no
/// CORS setting, so a browser's preflight gets no `Access-Control-Allow-Origin` and the browser
/// keeps its page from calling the API (docs/gateway.md, OPTIONS and CORS).
fn options_response(allow: &'static str, request_id: HeaderValue) -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::Full(Full::new(Bytes::new())));
    *r.status_mut() = StatusCode::NO_CONTENT;
    let h = r.headers_mut();
    h.insert(header::ALLOW, HeaderValue::from_static(allow));
    h.insert(X_REQUEST_ID.clone(), request_id);
    r
}

/// A JSON answer of the gateway's own; for `HEAD` (`head`), the same headers, its length
/// included, and no body.
fn json_response(body: Bytes, request_id: HeaderValue, head: bool) -> Response<ResponseBody> {
    let length = HeaderValue::from(body.len());
    let body = if head { Bytes::new() } else { body };
    let mut r = Response::new(ResponseBody::Full(Full::new(body)));
    let h = r.headers_mut();
    h.insert(header::CONTENT_LENGTH, length);
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(X_REQUEST_ID.clone(), request_id);
    r
}

/// The one way the gateway answers an error itself: status, `Retry-After` and JSON body from
/// [`ApiError`].
pub(crate) fn error_response(
    telemetry: &Telemetry,
    err: &ApiError,
    request_id: HeaderValue,
) -> Response<ResponseBody> {
    telemetry.rejected(err.metric_label());
    let mut r = Response::new(ResponseBody::Full(Full::new(Bytes::from(err.to_json()))));
    *r.status_mut() =
        StatusCode::from_u16(err.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(secs) = err.retry_after_secs() {
        h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if let Some(reason) = err.reason() {
        h.insert(
            HeaderName::from_static(infergate_openai::REASON_HEADER),
            HeaderValue::from_static(reason),
        );
    }
    if let Some(code) = err.overloaded() {
        h.insert(
            X_INFERGATE_OVERLOADED.clone(),
            HeaderValue::from_static(code),
        );
    }
    if let Some(challenge) = err.www_authenticate() {
        h.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
    }
    if let Some(allow) = err.allow() {
        h.insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    h.insert(X_REQUEST_ID.clone(), request_id);
    r
}
