//! Every error a client of infergate can see, in one place.
//!
//! Each variant maps to exactly one HTTP status ([`ApiError::status`]), one metric label
//! ([`ApiError::metric_label`]) and an OpenAI-style JSON body ([`ApiError::to_json`]):
//!
//! ```json
//! {"error":{"message":"...","type":"invalid_request_error","param":"model","code":"model_not_found"}}
//! ```
//!
//! The ext_proc server sends these as `ImmediateResponse`s and the standalone gateway as HTTP
//! responses, so a client sees the same error whichever path its request took.

use std::time::Duration;

use serde::Serialize;

/// An error answered to the client instead of a model response.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not valid JSON, or not a JSON object.
    #[error("the request body is not valid JSON: {source}")]
    InvalidJson {
        /// What the JSON parser reported.
        #[source]
        source: serde_json::Error,
    },
    /// A field has the wrong type or an impossible value.
    #[error("invalid value for `{}`: expected {expected}", Echo(field))]
    InvalidField {
        /// The JSON field, e.g. `messages[2].content`.
        field: String,
        /// What a valid value looks like.
        expected: &'static str,
    },
    /// The body has no `model` field, or (`empty`) one that is empty or blank.
    #[error(
        "{}: set `model` to the name of a served model",
        if *empty { "the request's `model` is empty" } else { "the request has no `model` field" }
    )]
    MissingModel {
        /// The field is there, empty or blank.
        empty: bool,
    },
    /// No pool serves the requested model.
    #[error(
        "the model `{}` does not exist here: {} one of the served models ({known})",
        Echo(model),
        if *retrieve { "ask for" } else { "set the request's `model` field to" }
    )]
    UnknownModel {
        /// The model the request asked for.
        model: String,
        /// The served model names, comma-separated (possibly shortened).
        known: String,
        /// Asked for by `GET /v1/models/{model}`, which has no body and no `model` field
        /// ([`ApiError::for_retrieve`]).
        retrieve: bool,
    },
    /// The body is larger than the configured limit.
    #[error("the request body is larger than the limit of {limit} bytes")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The request body is compressed (a `Content-Encoding` other than `identity`): the body is
    /// read as JSON to route it, and model servers take it as sent.
    #[error(
        "the request body has Content-Encoding `{}`: send the JSON uncompressed, without Content-Encoding",
        Echo(encoding)
    )]
    UnsupportedEncoding {
        /// The header's value.
        encoding: String,
    },
    /// The request body has a transfer coding other than `chunked` (`Transfer-Encoding: gzip,
    /// chunked`): HTTP/1.1 servers are not required to decode them, and this one does not
    /// (RFC 9112, section 6.1, suggests 501).
    #[error(
        "the request has Transfer-Encoding `{}`: only `chunked` is supported; send the JSON uncompressed",
        Echo(coding)
    )]
    UnsupportedTransferEncoding {
        /// The header's value.
        coding: String,
    },
    /// The path is not an API this gateway serves.
    #[error(
        "no route for `{}`: the gateway serves /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings and /v1/models",
        Echo(path)
    )]
    NotFound {
        /// The requested path.
        path: String,
    },
    /// The method is not allowed on this path (a path the gateway serves with another method).
    #[error(
        "method {} is not allowed on this path, which takes {allowed}",
        Echo(method)
    )]
    MethodNotAllowed {
        /// The request's method.
        method: String,
        /// The methods the path takes (`POST, OPTIONS` for the APIs, `GET, HEAD, OPTIONS` for
        /// the model list and a model): the response's `Allow` header, which lists every method
        /// the target supports (RFC 9110 §15.5.6), `OPTIONS` included since the front doors
        /// answer it ([`crate::Route::Options`]).
        allowed: &'static str,
    },
    /// Admission control shed the request because the pool is saturated.
    #[error("the model `{model}` is overloaded: retry after {} s", retry_after_secs(*retry_after))]
    Overloaded {
        /// The model whose pool is saturated.
        model: String,
        /// How long until the pool is expected to have drained enough.
        retry_after: Duration,
    },
    /// The model already has as many requests in flight as its configured limit allows.
    #[error(
        "the model `{model}` is at its limit of {limit} concurrent requests: retry after {} s",
        retry_after_secs(*retry_after)
    )]
    ConcurrencyLimit {
        /// The model whose limit is reached.
        model: String,
        /// The configured limit (`limits.maxConcurrentRequests`).
        limit: usize,
        /// When to try again.
        retry_after: Duration,
    },
    /// No endpoint of the model's pool is ready (of those the request's subset hint names, when
    /// it has one).
    #[error("no ready endpoint serves the model `{model}`{}", InSubset(*subset))]
    NoEndpoints {
        /// The requested model.
        model: String,
        /// Whether the request named the endpoints it may go to (Envoy's subset hint,
        /// `x-gateway-destination-endpoint-subset`): none of those was ready, whatever the rest
        /// of the pool.
        subset: bool,
    },
    /// The model's pool has endpoints but none has fresh metrics: every pod is stale or
    /// unreachable. Answered instead of routing to pods that are most likely down.
    #[error(
        "no endpoint serving the model `{model}` has answered its metrics scrape recently (every pod is stale or unreachable): retry after {} s",
        retry_after_secs(*retry_after)
    )]
    NoFreshEndpoints {
        /// The requested model.
        model: String,
        /// When to try again (a pod is readmitted on its first good scrape).
        retry_after: Duration,
    },
    /// Every upstream endpoint tried failed before sending a response.
    #[error("the model server could not be reached: {reason}")]
    UpstreamUnavailable {
        /// What failed (connect error, reset, 5xx before the first byte): at the gateway, for
        /// each endpoint tried, in order; at the global router, for the last cluster tried.
        reason: String,
    },
    /// No endpoint tried accepted a connection (refused, or not within the connect timeout):
    /// nothing reached a model server, so the request can be sent again as it is. Refused
    /// endpoints are out of the pool's candidates by then, so a retry is routed elsewhere or
    /// answered 503 `no_fresh_endpoints`.
    #[error(
        "no model server accepted a connection ({reason}); nothing was sent: retry after {} s",
        retry_after_secs(*retry_after)
    )]
    UpstreamRefused {
        /// What failed, for each endpoint tried, in order.
        reason: String,
        /// When to try again (the pool's `retryAfterMinMs`).
        retry_after: Duration,
    },
    /// The upstream endpoint did not answer in time.
    #[error("the model server did not answer within {} ms", timeout.as_millis())]
    UpstreamTimeout {
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The global router: a cluster sent no response headers within its first-byte timeout
    /// (`timeouts.firstByteMs`). Not retried elsewhere: the cluster may be working on it.
    #[error(
        "cluster `{cluster}` sent no response headers within {} ms (timeouts.firstByteMs); the request was not retried on another cluster, since `{cluster}` may still be working on it",
        timeout.as_millis()
    )]
    ClusterTimeout {
        /// The cluster's configured name.
        cluster: String,
        /// The timeout that elapsed.
        timeout: Duration,
    },
    /// The global router: no cluster has reported the requested model yet — none has listed
    /// any model since the start, or a cluster that may serve it cannot be read now (its
    /// discovery or heartbeat failing, or under way). A 503 to retry, not the 404 of a model
    /// the clusters do not serve.
    #[error("no cluster has reported the model `{}` yet: {why}", Echo(model))]
    NoClusterReported {
        /// The requested model.
        model: String,
        /// What the router knows of its clusters' discovery, naming those whose `/v1/models`
        /// or heartbeat failed and why.
        why: String,
        /// When the next read of those clusters is due (`Retry-After`).
        retry_after: Duration,
    },
    /// The client did not send the whole request body in time (`limits.bodyReadTimeoutMs`).
    #[error(
        "the request body did not arrive within {} ms: send the whole body at once",
        timeout.as_millis()
    )]
    RequestTimeout {
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The gateway already serves as many requests as `limits.maxRequestsInFlight` allows.
    #[error(
        "the gateway is at its limit of {limit} requests in flight: retry after {} s",
        retry_after_secs(*retry_after)
    )]
    GatewayBusy {
        /// The configured limit.
        limit: usize,
        /// When to try again.
        retry_after: Duration,
    },
    /// Taking this request's body would exceed `limits.maxBufferedRequestBytes`, the bytes of
    /// request bodies the gateway holds at once across all connections.
    #[error(
        "the gateway is holding as many request bodies as its memory budget allows: retry after {} s",
        retry_after_secs(*retry_after)
    )]
    BufferBudget {
        /// When to try again.
        retry_after: Duration,
    },
    /// The request carries no credential, or one the gateway does not accept. The reason is one
    /// of a fixed set of phrases: the message never repeats the token or key.
    #[error("authentication failed: {reason}; send `Authorization: Bearer <token or API key>`")]
    Unauthorized {
        /// Why, e.g. `the token has expired` (never the credential itself).
        reason: &'static str,
    },
    /// JWT authentication is configured, but the gateway has no key set to check a token's
    /// signature against: none could be fetched from the identity provider yet (unreachable, an
    /// error status, not a JWKS document). The client's token is not at fault, so this is a 503
    /// with `Retry-After`, not a 401; a token whose key id a fetched set lacks is still a 401.
    /// The message does not name the key set's address.
    #[error(
        "the gateway cannot verify tokens yet (its signing key set could not be fetched from the identity provider): retry after {} s",
        retry_after_secs(*retry_after)
    )]
    AuthUnavailable {
        /// When the key set is fetched again.
        retry_after: Duration,
    },
    /// The tenant has used its quota of requests or tokens for the window
    /// (`quotas:`); `Retry-After` is when enough counted use leaves the window. A request whose
    /// own token estimate is above the whole token limit is charged the limit, so it runs only
    /// once the window holds none of the tenant's tokens: the message says so rather than
    /// blaming the tenant's earlier use.
    #[error(
        "{}",
        QuotaRefusal {
            tenant,
            kind,
            limit: *limit,
            window: *window,
            request_tokens: *request_tokens,
            retry_after: *retry_after,
        }
    )]
    QuotaExceeded {
        /// The tenant.
        tenant: String,
        /// Which quota: `requests` or `tokens`.
        kind: &'static str,
        /// The limit per window.
        limit: u64,
        /// The window the limit counts over.
        window: Duration,
        /// The request's own estimated tokens (prompt plus `max_tokens`, or the default output),
        /// when they alone exceed the token limit; `None` otherwise.
        request_tokens: Option<u64>,
        /// When the request would fit.
        retry_after: Duration,
    },
    /// Flow control: the request waited in its priority band's queue for as long as
    /// `flowControl.requestTtlMs` allows without being sent: no pod got headroom, or the
    /// model's `maxConcurrentRequests` stayed taken.
    #[error(
        "the model `{model}` is saturated (its pods, or its maxConcurrentRequests) and the request waited {} ms in its queue without being sent: retry after {} s",
        waited.as_millis(),
        retry_after_secs(*retry_after)
    )]
    QueueTtlExpired {
        /// The requested model.
        model: String,
        /// How long it waited.
        waited: Duration,
        /// When to try again (the pool's estimated drain time).
        retry_after: Duration,
    },
    /// Flow control: the pool is saturated and the request's band (or the whole queue) is at its
    /// `flowControl` limit of requests or bytes. The message says which of the two is full.
    #[error(
        "the model `{model}` is saturated and {}: retry after {} s",
        limit.describe(priority),
        retry_after_secs(*retry_after)
    )]
    QueueFull {
        /// The requested model.
        model: String,
        /// The request's priority band.
        priority: &'static str,
        /// Which limit refused it: the band's or the whole queue's.
        limit: QueueLimit,
        /// When to try again (the pool's estimated drain time).
        retry_after: Duration,
    },
    /// Flow control: a Sheddable request was taken out of the queue to make room for a
    /// Critical or Standard one.
    #[error(
        "the model `{model}` is saturated and this sheddable request was evicted from its queue for a higher-priority one: retry after {} s",
        retry_after_secs(*retry_after)
    )]
    QueueEvicted {
        /// The requested model.
        model: String,
        /// When to try again (the pool's estimated drain time).
        retry_after: Duration,
    },
    /// Flow control: the pool had no endpoint for a request at admission, or lost its last one
    /// while the request waited.
    #[error(
        "no ready endpoint serves the model `{model}`{}{}",
        InSubset(*subset),
        LeftQueue(*waited)
    )]
    QueueNoEndpoints {
        /// The requested model.
        model: String,
        /// Whether the request named the endpoints it may go to (as in
        /// [`ApiError::NoEndpoints`]).
        subset: bool,
        /// How long the request had waited in its queue; `None`: refused at admission.
        waited: Option<Duration>,
    },
    /// The caller is authenticated but may not call this model.
    #[error("tenant `{}` may not call the model `{}`", Echo(tenant), Echo(model))]
    Forbidden {
        /// The authenticated tenant.
        tenant: String,
        /// The model the request asked for.
        model: String,
    },
}

/// Which flow-control limit refused a request ([`ApiError::QueueFull`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum QueueLimit {
    /// The request's own band is at `flowControl.bands.<band>.maxRequests` or `maxBytes`.
    Band,
    /// The whole queue, all bands together, is at `flowControl.maxRequests` or `maxBytes`, and
    /// no Sheddable request could make room (the request is Sheddable itself, or evicting every
    /// queued Sheddable one would not be enough).
    Queue,
}

/// Response header saying why a request was refused (e.g. `rejected-ttl-expired`,
/// `rejected-quota-tokens`), for the errors whose [`ApiError::reason`] is set. The name and the
/// flow-control values are the reference endpoint picker's (its flow control's
/// `x-llm-d-request-dropped-reason`), so clients written for it read ours.
pub const REASON_HEADER: &str = "x-llm-d-request-dropped-reason";

/// Response header on the refusals that say the gateway itself is full ([`ApiError::overloaded`]:
/// its in-flight slots or its request-body budget), valued with the error's code. A front in
/// front of several gateways (the global router) fails such a request over without counting it
/// against the cluster: the gateway is busy, not broken, and ejecting every busy cluster in turn
/// would move the overload around instead of serving it.
pub const OVERLOADED_HEADER: &str = "x-infergate-overloaded";

/// The longest client-supplied value echoed in an error message, in characters; longer values
/// are cut there and end in `…`, so an error body stays small whatever the request held.
pub const MAX_ECHO_CHARS: usize = 128;

/// A client-supplied value as error messages echo it: at most [`MAX_ECHO_CHARS`] characters.
/// The one place echoed values are bounded.
struct Echo<'a>(&'a str);

impl std::fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.char_indices().nth(MAX_ECHO_CHARS) {
            None => f.write_str(self.0),
            Some((cut, _)) => {
                f.write_str(&self.0[..cut])?;
                f.write_str("…")
            }
        }
    }
}

impl QueueLimit {
    /// What is full, for the message: the band a `priority` request waits in, or the queue.
    fn describe(self, priority: &str) -> impl std::fmt::Display + '_ {
        struct Full<'a>(QueueLimit, &'a str);
        impl std::fmt::Display for Full<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self.0 {
                    QueueLimit::Band => write!(f, "the queue of its {} band is full", self.1),
                    QueueLimit::Queue => {
                        f.write_str("its whole queue (all priority bands together) is full")
                    }
                }
            }
        }
        Full(self, priority)
    }
}

/// `600 requests`, `1 request`: a count of a plural noun (`requests`, `tokens`).
struct Quantity<'a>(u64, &'a str);

impl std::fmt::Display for Quantity<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let noun = if self.0 == 1 {
            self.1.strip_suffix('s').unwrap_or(self.1)
        } else {
            self.1
        };
        write!(f, "{} {noun}", self.0)
    }
}

/// [`ApiError::QuotaExceeded`]'s message: the tenant's use so far, or the request alone.
struct QuotaRefusal<'a> {
    tenant: &'a str,
    kind: &'a str,
    limit: u64,
    window: Duration,
    request_tokens: Option<u64>,
    retry_after: Duration,
}

impl std::fmt::Display for QuotaRefusal<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (tenant, quota) = (Echo(self.tenant), Quantity(self.limit, self.kind));
        let (window, retry) = (self.window.as_secs(), retry_after_secs(self.retry_after));
        match self.request_tokens {
            Some(needs) if needs > self.limit => write!(
                f,
                "the request alone needs an estimated {} (prompt and output), more than \
                 tenant `{tenant}`'s whole quota of {quota} per {window} s: it can run only once \
                 the window holds none of the tenant's tokens: retry after {retry} s, or send a \
                 shorter prompt or a lower max_tokens",
                Quantity(needs, "tokens"),
            ),
            _ => write!(
                f,
                "tenant `{tenant}` has used its quota of {quota} per {window} s: retry after \
                 {retry} s"
            ),
        }
    }
}

/// The end of [`ApiError::NoEndpoints`]'s message: whether a subset hint limited the choice.
struct InSubset(bool);

impl std::fmt::Display for InSubset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 {
            f.write_str(
                " among the endpoints the request's subset hint names \
                 (x-gateway-destination-endpoint-subset): check the hint's addresses against the pool's",
            )
        } else {
            Ok(())
        }
    }
}

/// The end of [`ApiError::QueueNoEndpoints`]'s message: whether the request had waited.
struct LeftQueue(Option<Duration>);

impl std::fmt::Display for LeftQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            None => f.write_str(": the request was not queued"),
            Some(w) => write!(
                f,
                " any more: the request left its queue after waiting {} ms",
                w.as_millis()
            ),
        }
    }
}

/// Seconds for a `Retry-After` header: rounded up, at least one.
pub fn retry_after_secs(d: Duration) -> u64 {
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    secs.max(1)
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: &'static str,
}

impl ApiError {
    /// The HTTP status for this error. This is the only place statuses are chosen.
    pub fn status(&self) -> u16 {
        match self {
            ApiError::InvalidJson { .. }
            | ApiError::InvalidField { .. }
            | ApiError::MissingModel { .. } => 400,
            ApiError::Unauthorized { .. } => 401,
            ApiError::Forbidden { .. } => 403,
            ApiError::UnknownModel { .. } | ApiError::NotFound { .. } => 404,
            ApiError::MethodNotAllowed { .. } => 405,
            ApiError::RequestTimeout { .. } => 408,
            ApiError::BodyTooLarge { .. } => 413,
            ApiError::UnsupportedEncoding { .. } => 415,
            ApiError::UnsupportedTransferEncoding { .. } => 501,
            ApiError::Overloaded { .. }
            | ApiError::ConcurrencyLimit { .. }
            | ApiError::QuotaExceeded { .. }
            | ApiError::QueueTtlExpired { .. }
            | ApiError::QueueFull { .. }
            | ApiError::QueueEvicted { .. } => 429,
            ApiError::UpstreamUnavailable { .. } => 502,
            ApiError::NoEndpoints { .. }
            | ApiError::NoClusterReported { .. }
            | ApiError::QueueNoEndpoints { .. }
            | ApiError::NoFreshEndpoints { .. }
            | ApiError::UpstreamRefused { .. }
            | ApiError::GatewayBusy { .. }
            | ApiError::BufferBudget { .. }
            | ApiError::AuthUnavailable { .. } => 503,
            ApiError::UpstreamTimeout { .. } | ApiError::ClusterTimeout { .. } => 504,
        }
    }

    /// A stable label for metrics (`rejections_total{reason=...}`).
    pub fn metric_label(&self) -> &'static str {
        match self {
            ApiError::InvalidJson { .. } => "invalid_json",
            ApiError::InvalidField { .. } => "invalid_field",
            ApiError::MissingModel { .. } => "missing_model",
            ApiError::UnknownModel { .. } => "unknown_model",
            ApiError::BodyTooLarge { .. } => "body_too_large",
            ApiError::UnsupportedEncoding { .. } => "unsupported_content_encoding",
            ApiError::UnsupportedTransferEncoding { .. } => "unsupported_transfer_encoding",
            ApiError::NotFound { .. } => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Overloaded { .. } => "shed",
            ApiError::ConcurrencyLimit { .. } => "concurrency_limit",
            // The global router's, under the gateway's labels: the same condition, said of
            // clusters rather than endpoints.
            ApiError::NoEndpoints { .. } | ApiError::NoClusterReported { .. } => "no_endpoints",
            ApiError::NoFreshEndpoints { .. } => "no_fresh_endpoints",
            ApiError::UpstreamUnavailable { .. } => "upstream_unavailable",
            ApiError::UpstreamRefused { .. } => "upstream_refused",
            ApiError::UpstreamTimeout { .. } | ApiError::ClusterTimeout { .. } => {
                "upstream_timeout"
            }
            ApiError::RequestTimeout { .. } => "request_timeout",
            ApiError::GatewayBusy { .. } => "gateway_busy",
            ApiError::BufferBudget { .. } => "buffer_budget_exhausted",
            ApiError::Unauthorized { .. } => "unauthorized",
            ApiError::AuthUnavailable { .. } => "auth_unavailable",
            ApiError::Forbidden { .. } => "forbidden",
            ApiError::QuotaExceeded { .. } => "quota_exceeded",
            ApiError::QueueTtlExpired { .. } => "queue_ttl_expired",
            ApiError::QueueFull { .. } => "queue_full",
            ApiError::QueueEvicted { .. } => "queue_evicted",
            ApiError::QueueNoEndpoints { .. } => "queue_no_endpoints",
        }
    }

    /// The [`OVERLOADED_HEADER`] value of a refusal because the gateway itself is full (503
    /// `gateway_busy`, 503 `buffer_budget_exhausted`); `None` for every other error, a model
    /// server's failures included.
    pub fn overloaded(&self) -> Option<&'static str> {
        match self {
            ApiError::GatewayBusy { .. } | ApiError::BufferBudget { .. } => {
                Some(self.metric_label())
            }
            _ => None,
        }
    }

    /// The reason header's value ([`REASON_HEADER`]) for refusals that carry one.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            ApiError::QuotaExceeded { kind: "tokens", .. } => Some("rejected-quota-tokens"),
            ApiError::QuotaExceeded { .. } => Some("rejected-quota-requests"),
            ApiError::QueueTtlExpired { .. } => Some("rejected-ttl-expired"),
            ApiError::QueueFull { .. } => Some("rejected-saturated"),
            ApiError::QueueEvicted { .. } => Some("evicted-priority"),
            ApiError::QueueNoEndpoints { .. } => Some("rejected-no-endpoints"),
            _ => None,
        }
    }

    /// The OpenAI error `type`.
    fn error_type(&self) -> &'static str {
        match self.status() {
            400 | 404 | 405 | 408 | 413 | 415 | 501 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            429 => "rate_limit_error",
            _ => "server_error",
        }
    }

    /// This error as the answer to `GET /v1/models/{model}`: an unknown model's message says to
    /// ask for a served model, not to set a `model` field the retrieve has none of, and names no
    /// `param`. Other errors are unchanged.
    pub fn for_retrieve(self) -> ApiError {
        match self {
            ApiError::UnknownModel { model, known, .. } => ApiError::UnknownModel {
                model,
                known,
                retrieve: true,
            },
            other => other,
        }
    }

    /// The OpenAI error `param`: the request field at fault, if one is.
    fn param(&self) -> Option<&str> {
        match self {
            ApiError::InvalidField { field, .. } => Some(field),
            ApiError::UnknownModel { retrieve: true, .. } => None,
            ApiError::MissingModel { .. } | ApiError::UnknownModel { .. } => Some("model"),
            _ => None,
        }
    }

    /// The OpenAI error `code`.
    fn code(&self) -> &'static str {
        match self {
            ApiError::UnknownModel { .. } => "model_not_found",
            other => other.metric_label(),
        }
    }

    /// The `Retry-After` value in seconds, for errors that carry one.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            ApiError::Overloaded { retry_after, .. }
            | ApiError::ConcurrencyLimit { retry_after, .. }
            | ApiError::NoFreshEndpoints { retry_after, .. }
            | ApiError::UpstreamRefused { retry_after, .. }
            | ApiError::GatewayBusy { retry_after, .. }
            | ApiError::BufferBudget { retry_after }
            | ApiError::AuthUnavailable { retry_after }
            | ApiError::QuotaExceeded { retry_after, .. }
            | ApiError::QueueTtlExpired { retry_after, .. }
            | ApiError::QueueFull { retry_after, .. }
            | ApiError::QueueEvicted { retry_after, .. }
            | ApiError::NoClusterReported { retry_after, .. } => {
                Some(retry_after_secs(*retry_after))
            }
            _ => None,
        }
    }

    /// The `WWW-Authenticate` challenge (RFC 6750 §3), for errors that carry one: a 401.
    pub fn www_authenticate(&self) -> Option<&'static str> {
        match self {
            ApiError::Unauthorized { .. } => Some(r#"Bearer realm="infergate""#),
            _ => None,
        }
    }

    /// The `Allow` header's value (RFC 9110 §10.2.1), for errors that carry one: a 405.
    pub fn allow(&self) -> Option<&'static str> {
        match self {
            ApiError::MethodNotAllowed { allowed, .. } => Some(allowed),
            _ => None,
        }
    }

    /// The OpenAI-style JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        let message = self.to_string();
        let body = Body {
            error: Inner {
                message: &message,
                kind: self.error_type(),
                param: self.param(),
                code: self.code(),
            },
        };
        // Serialising plain strings into a Vec cannot fail; fall back to a fixed body regardless.
        serde_json::to_vec(&body).unwrap_or_else(|_| {
            br#"{"error":{"message":"internal error","type":"server_error","param":null,"code":"internal"}}"#
                .to_vec()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(e: &ApiError) -> serde_json::Value {
        serde_json::from_slice(&e.to_json()).unwrap()
    }

    #[test]
    fn every_error_has_a_status_and_an_openai_body() {
        let bad_json = serde_json::from_slice::<serde_json::Value>(b"{").unwrap_err();
        let cases = [
            (ApiError::InvalidJson { source: bad_json }, 400),
            (
                ApiError::InvalidField {
                    field: "stream".into(),
                    expected: "a boolean",
                },
                400,
            ),
            (ApiError::MissingModel { empty: false }, 400),
            (ApiError::MissingModel { empty: true }, 400),
            (
                ApiError::UnknownModel {
                    model: "x".into(),
                    known: "a, b".into(),
                    retrieve: false,
                },
                404,
            ),
            (ApiError::BodyTooLarge { limit: 10 }, 413),
            (
                ApiError::UnsupportedEncoding {
                    encoding: "gzip".into(),
                },
                415,
            ),
            (
                ApiError::UnsupportedTransferEncoding {
                    coding: "gzip, chunked".into(),
                },
                501,
            ),
            (ApiError::NotFound { path: "/x".into() }, 404),
            (
                ApiError::MethodNotAllowed {
                    method: "GET".into(),
                    allowed: "POST",
                },
                405,
            ),
            (
                ApiError::Overloaded {
                    model: "m".into(),
                    retry_after: Duration::from_millis(1500),
                },
                429,
            ),
            (
                ApiError::ConcurrencyLimit {
                    model: "m".into(),
                    limit: 8,
                    retry_after: Duration::from_secs(1),
                },
                429,
            ),
            (
                ApiError::NoEndpoints {
                    model: "m".into(),
                    subset: false,
                },
                503,
            ),
            (
                ApiError::NoFreshEndpoints {
                    model: "m".into(),
                    retry_after: Duration::from_secs(1),
                },
                503,
            ),
            (
                ApiError::UpstreamUnavailable {
                    reason: "refused".into(),
                },
                502,
            ),
            (
                ApiError::UpstreamRefused {
                    reason: "cannot connect to 10.0.0.1:8000".into(),
                    retry_after: Duration::from_secs(1),
                },
                503,
            ),
            (
                ApiError::UpstreamTimeout {
                    timeout: Duration::from_secs(1),
                },
                504,
            ),
            (
                ApiError::ClusterTimeout {
                    cluster: "east".into(),
                    timeout: Duration::from_secs(1),
                },
                504,
            ),
            (
                ApiError::NoClusterReported {
                    model: "m".into(),
                    why: "discovery is under way".into(),
                    retry_after: Duration::from_secs(1),
                },
                503,
            ),
            (
                ApiError::RequestTimeout {
                    timeout: Duration::from_secs(2),
                },
                408,
            ),
            (
                ApiError::GatewayBusy {
                    limit: 4,
                    retry_after: Duration::from_secs(1),
                },
                503,
            ),
            (
                ApiError::BufferBudget {
                    retry_after: Duration::from_secs(1),
                },
                503,
            ),
            (
                ApiError::Unauthorized {
                    reason: "the token has expired",
                },
                401,
            ),
            (
                ApiError::AuthUnavailable {
                    retry_after: Duration::from_secs(10),
                },
                503,
            ),
            (
                ApiError::Forbidden {
                    tenant: "team-a".into(),
                    model: "m".into(),
                },
                403,
            ),
            (
                ApiError::QuotaExceeded {
                    tenant: "team-a".into(),
                    kind: "tokens",
                    limit: 1000,
                    window: Duration::from_secs(60),
                    request_tokens: None,
                    retry_after: Duration::from_millis(1500),
                },
                429,
            ),
        ];
        for (err, status) in cases {
            assert_eq!(err.status(), status, "{err}");
            let v = json(&err);
            assert_eq!(v["error"]["message"], err.to_string());
            assert!(v["error"]["type"].is_string());
            assert!(v["error"]["code"].is_string());
        }
    }

    /// The global router's own wording keeps the gateway's codes (and metric labels) for the
    /// same conditions: a client or an alert reading `no_endpoints` or `upstream_timeout` reads
    /// them from either.
    #[test]
    fn the_global_routers_errors_keep_the_gateways_codes() {
        let e = ApiError::ClusterTimeout {
            cluster: "east".into(),
            timeout: Duration::from_millis(1500),
        };
        assert_eq!(json(&e)["error"]["code"], "upstream_timeout");
        let msg = e.to_string();
        assert!(
            msg.starts_with("cluster `east` sent no response headers within 1500 ms"),
            "{msg}"
        );
        let e = ApiError::NoClusterReported {
            model: "m".into(),
            why: "discovery failed for `east`".into(),
            retry_after: Duration::from_millis(10_500),
        };
        assert_eq!(json(&e)["error"]["code"], "no_endpoints");
        assert_eq!(e.retry_after_secs(), Some(11));
        assert_eq!(
            e.to_string(),
            "no cluster has reported the model `m` yet: discovery failed for `east`"
        );
    }

    #[test]
    fn unknown_model_says_to_set_the_model_field() {
        let e = ApiError::UnknownModel {
            model: "gpt-9".into(),
            known: "llama".into(),
            retrieve: false,
        };
        let v = json(&e);
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["code"], "model_not_found");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("gpt-9") && msg.contains("`model` field"),
            "{msg}"
        );
    }

    /// `GET /v1/models/{model}` has no body: its 404 says to ask for a served model and names
    /// no `param`, with the same status and code.
    #[test]
    fn an_unknown_model_retrieved_names_no_body_field() {
        let e = ApiError::UnknownModel {
            model: "gpt-9".into(),
            known: "llama".into(),
            retrieve: false,
        }
        .for_retrieve();
        assert_eq!(e.status(), 404);
        let v = json(&e);
        assert_eq!(v["error"]["param"], serde_json::Value::Null);
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(
            v["error"]["message"],
            "the model `gpt-9` does not exist here: ask for one of the served models (llama)"
        );
        // Other errors pass unchanged.
        let e = ApiError::MissingModel { empty: true }.for_retrieve();
        assert!(matches!(e, ApiError::MissingModel { empty: true }));
    }

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one_second() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
        let e = ApiError::Overloaded {
            model: "m".into(),
            retry_after: Duration::from_secs(4),
        };
        assert_eq!(e.retry_after_secs(), Some(4));
        assert_eq!(
            ApiError::MissingModel { empty: false }.retry_after_secs(),
            None
        );
        let e = ApiError::NoFreshEndpoints {
            model: "m".into(),
            retry_after: Duration::from_secs(1),
        };
        assert_eq!(e.retry_after_secs(), Some(1));
        assert_eq!(json(&e)["error"]["code"], "no_fresh_endpoints");
        assert_eq!(json(&e)["error"]["type"], "server_error");
        let e = ApiError::ConcurrencyLimit {
            model: "m".into(),
            limit: 2,
            retry_after: Duration::from_millis(300),
        };
        assert_eq!(e.retry_after_secs(), Some(1));
        let v = json(&e);
        assert_eq!(v["error"]["code"], "concurrency_limit");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("limit of 2 concurrent requests"),
            "{v}"
        );
    }

    #[test]
    fn a_key_set_never_fetched_is_a_503_to_retry_not_a_401() {
        let e = ApiError::AuthUnavailable {
            retry_after: Duration::from_millis(9_200),
        };
        assert_eq!(e.status(), 503);
        assert_eq!(e.retry_after_secs(), Some(10));
        assert_eq!(e.www_authenticate(), None);
        let v = json(&e);
        assert_eq!(v["error"]["code"], "auth_unavailable");
        assert_eq!(v["error"]["type"], "server_error");
        assert_eq!(
            v["error"]["message"],
            "the gateway cannot verify tokens yet (its signing key set could not be fetched from \
             the identity provider): retry after 10 s"
        );
        assert_eq!(e.metric_label(), "auth_unavailable");
    }

    #[test]
    fn a_quota_refusal_says_which_quota_and_when() {
        let e = ApiError::QuotaExceeded {
            tenant: "team-a".into(),
            kind: "requests",
            limit: 600,
            window: Duration::from_secs(60),
            request_tokens: None,
            retry_after: Duration::from_millis(12_300),
        };
        assert_eq!(e.status(), 429);
        assert_eq!(e.retry_after_secs(), Some(13));
        assert_eq!(e.reason(), Some("rejected-quota-requests"));
        let v = json(&e);
        assert_eq!(v["error"]["code"], "quota_exceeded");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(
            v["error"]["message"],
            "tenant `team-a` has used its quota of 600 requests per 60 s: retry after 13 s"
        );
        let e = ApiError::QuotaExceeded {
            tenant: "t".into(),
            kind: "tokens",
            limit: 1,
            window: Duration::from_secs(60),
            request_tokens: None,
            retry_after: Duration::from_secs(1),
        };
        assert_eq!(e.reason(), Some("rejected-quota-tokens"));
        // A limit of one (a small per-minute limit scaled to a short window) is singular.
        assert_eq!(
            e.to_string(),
            "tenant `t` has used its quota of 1 token per 60 s: retry after 1 s"
        );
        // A request that alone needs more than the whole token quota is told so, and that it runs
        // once the window is empty; an estimate within the limit keeps the usual message.
        let e = ApiError::QuotaExceeded {
            tenant: "t".into(),
            kind: "tokens",
            limit: 4000,
            window: Duration::from_secs(60),
            request_tokens: Some(9000),
            retry_after: Duration::from_millis(41_200),
        };
        assert_eq!(e.status(), 429);
        assert_eq!(e.retry_after_secs(), Some(42));
        assert_eq!(e.reason(), Some("rejected-quota-tokens"));
        assert_eq!(
            e.to_string(),
            "the request alone needs an estimated 9000 tokens (prompt and output), more than \
             tenant `t`'s whole quota of 4000 tokens per 60 s: it can run only once the window \
             holds none of the tenant's tokens: retry after 42 s, or send a shorter prompt or a \
             lower max_tokens"
        );
        let within = ApiError::QuotaExceeded {
            tenant: "t".into(),
            kind: "tokens",
            limit: 4000,
            window: Duration::from_secs(60),
            request_tokens: Some(4000),
            retry_after: Duration::from_millis(41_200),
        };
        assert_eq!(
            within.to_string(),
            "tenant `t` has used its quota of 4000 tokens per 60 s: retry after 42 s"
        );
        assert_eq!(ApiError::MissingModel { empty: false }.reason(), None);
    }

    #[test]
    fn every_flow_control_outcome_has_its_status_reason_and_retry_after() {
        let m = || "m".to_owned();
        let d = Duration::from_millis(2500);
        let cases = [
            (
                ApiError::QueueTtlExpired {
                    model: m(),
                    waited: Duration::from_secs(60),
                    retry_after: d,
                },
                429,
                "rejected-ttl-expired",
                Some(3),
            ),
            (
                ApiError::QueueFull {
                    model: m(),
                    priority: "standard",
                    limit: QueueLimit::Band,
                    retry_after: d,
                },
                429,
                "rejected-saturated",
                Some(3),
            ),
            (
                ApiError::QueueEvicted {
                    model: m(),
                    retry_after: d,
                },
                429,
                "evicted-priority",
                Some(3),
            ),
            (
                ApiError::QueueNoEndpoints {
                    model: m(),
                    subset: false,
                    waited: None,
                },
                503,
                "rejected-no-endpoints",
                None,
            ),
            (
                ApiError::QueueNoEndpoints {
                    model: m(),
                    subset: false,
                    waited: Some(d),
                },
                503,
                "rejected-no-endpoints",
                None,
            ),
        ];
        for (e, status, reason, retry) in cases {
            assert_eq!(e.status(), status, "{e}");
            assert_eq!(e.reason(), Some(reason), "{e}");
            assert_eq!(e.retry_after_secs(), retry, "{e}");
            assert_eq!(json(&e)["error"]["code"], e.metric_label());
        }
        assert_eq!(REASON_HEADER, "x-llm-d-request-dropped-reason");
        // A request that waited was queued: the message must not say otherwise.
        let at_admission = ApiError::QueueNoEndpoints {
            model: m(),
            subset: false,
            waited: None,
        };
        assert_eq!(
            at_admission.to_string(),
            "no ready endpoint serves the model `m`: the request was not queued"
        );
        let while_waiting = ApiError::QueueNoEndpoints {
            model: m(),
            subset: false,
            waited: Some(d),
        };
        assert_eq!(
            while_waiting.to_string(),
            "no ready endpoint serves the model `m` any more: the request left its queue after \
             waiting 2500 ms"
        );
    }

    #[test]
    fn a_huge_echoed_value_gives_a_small_body() {
        let model = "m".repeat(1 << 20);
        let e = ApiError::UnknownModel {
            model,
            known: "llama".into(),
            retrieve: false,
        };
        let body = e.to_json();
        assert!(body.len() < 2048, "{} bytes", body.len());
        let msg = json(&e)["error"]["message"].as_str().unwrap().to_owned();
        let echoed = format!("`{}…`", "m".repeat(MAX_ECHO_CHARS));
        assert!(msg.contains(&echoed), "{msg}");
        // Multi-byte characters are cut on a character boundary.
        let e = ApiError::NotFound {
            path: "é".repeat(10_000),
        };
        assert!(e.to_json().len() < 2048);
        assert!(
            e.to_string()
                .contains(&format!("`{}…`", "é".repeat(MAX_ECHO_CHARS)))
        );
        // A value at the limit is echoed whole.
        let e = ApiError::MethodNotAllowed {
            method: "X".repeat(MAX_ECHO_CHARS),
            allowed: "POST",
        };
        assert!(!e.to_string().contains('…'));
    }

    #[test]
    fn absurd_retry_after_values_saturate_instead_of_panicking() {
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
        let e = ApiError::Overloaded {
            model: "m".into(),
            retry_after: Duration::MAX,
        };
        assert_eq!(e.retry_after_secs(), Some(u64::MAX));
        assert!(e.to_string().contains(&u64::MAX.to_string()));
        let e = ApiError::RequestTimeout {
            timeout: Duration::MAX,
        };
        assert_eq!(e.status(), 408);
        assert_eq!(json(&e)["error"]["code"], "request_timeout");
    }
}
