//! The ext_proc server's own Prometheus metrics.
//!
//! Label values are few and bounded: the pool is fixed per process, pods are the pool's own,
//! outcomes and reasons are fixed strings, and models — named by clients — are capped at
//! [`MAX_MODEL_LABELS`] per pool, later names counting as [`OTHER_MODEL`].
//!
//! Counting a finished request is on the per-request path, so the picker does not go through
//! [`Family::get_or_create`] for it (which builds an owned label set, hashes it and takes the
//! family's lock on every call): [`PoolTelemetry`] keeps, per model and per serving endpoint, the
//! counter handles it has already created, and counting is then a map lookup by `&str` and
//! `SocketAddr` under a shared read lock plus an atomic add. The first request of a new
//! (model, endpoint) pair creates its series in the family as before, so the exported text is
//! the same.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{OnceLock, PoisonError, RwLock};

use infergate_pool::histogram::AtomicHistogram;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::registry::Registry;

/// Labels of `requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The pool.
    pub pool: String,
    /// The model the request named.
    pub model: String,
    /// The endpoint that served it (`ip:port`), empty when none did.
    pub pod: String,
    /// `success`, `error` (5xx from the model server), `cancelled` or `rejected`.
    pub outcome: &'static str,
}

/// Labels of the picker's `rejections_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolReasonLabels {
    /// The pool.
    pub pool: String,
    /// The client-visible error's metric label (e.g. `shed`, `no_endpoints`, `invalid_json`).
    pub reason: &'static str,
}

/// Labels of the body-based router's `rejections_total` (it serves no pool).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The client-visible error's metric label (e.g. `invalid_json`, `unknown_model`).
    pub reason: &'static str,
}

/// Labels of `tokens_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// The pool.
    pub pool: String,
    /// The model the request named.
    pub model: String,
    /// `input`, `output` or `cached`.
    pub kind: &'static str,
}

/// Labels of the per-pool histograms.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// The pool.
    pub pool: String,
}

/// A family of lock-free histograms (recording is atomic adds only).
pub type HistogramFamily = Family<PoolLabels, AtomicHistogram, fn() -> AtomicHistogram>;

fn ttft_histogram() -> AtomicHistogram {
    // 0.5 ms .. ~16 s, as the gateway's `infergate_gateway_ttft_seconds`.
    AtomicHistogram::new(exponential_buckets(0.000_5, 2.0, 16))
}

fn pick_histogram() -> AtomicHistogram {
    // 1 µs … ~16 ms: the answer is microseconds; milliseconds would be worth seeing.
    AtomicHistogram::new(exponential_buckets(1e-6, 2.0, 15))
}

fn duration_histogram() -> AtomicHistogram {
    // 1 ms .. ~65 s, as the gateway's `infergate_gateway_request_duration_seconds`.
    AtomicHistogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Labels of the pod gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodStateLabels {
    /// The pool.
    pub pool: String,
    /// `ready` (fresh metrics) or `stale`.
    pub state: &'static str,
}

/// Every metric the ext_proc server exports. Cheap to clone (handles share their values).
#[derive(Clone, Debug)]
pub struct Telemetry {
    /// Requests by pool, model, pod and outcome.
    pub requests: Family<RequestLabels, Counter>,
    /// Time from the end of the request body to the routing answer (pick included), by pool.
    pub pick_seconds: HistogramFamily,
    /// Requests answered with an error instead of a route, by pool and reason.
    pub rejections: Family<PoolReasonLabels, Counter>,
    /// Tokens reported by model servers, by pool, model and kind.
    pub tokens: Family<TokenLabels, Counter>,
    /// Pods by pool and state.
    pub pods: Family<PodStateLabels, Gauge>,
    /// Routing answer to the first streamed token, by pool.
    pub ttft: HistogramFamily,
    /// Routing answer to the end of the response (or its cancellation), by pool.
    pub duration: HistogramFamily,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            requests: Family::default(),
            pick_seconds: Family::new_with_constructor(pick_histogram),
            rejections: Family::default(),
            tokens: Family::default(),
            pods: Family::default(),
            ttft: Family::new_with_constructor(ttft_histogram),
            duration: Family::new_with_constructor(duration_histogram),
        }
    }
}

impl Telemetry {
    /// Creates the metrics and registers them under the `infergate_extproc_` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let t = Telemetry::default();
        let r = registry.sub_registry_with_prefix("infergate_extproc");
        r.register(
            "requests",
            "Requests by pool, model, serving pod and outcome",
            t.requests.clone(),
        );
        r.register(
            "pick_duration_seconds",
            "Time from the complete request body to the routing answer, by pool",
            t.pick_seconds.clone(),
        );
        r.register(
            "rejections",
            "Requests answered with an error, by pool and reason",
            t.rejections.clone(),
        );
        r.register(
            "tokens",
            "Tokens reported by model servers, by pool, model and kind (input, output, cached)",
            t.tokens.clone(),
        );
        r.register(
            "pods",
            "Pool pods by state (ready, stale), by pool",
            t.pods.clone(),
        );
        r.register(
            "ttft_seconds",
            "Time from the routing answer to the first generated token of a streamed response, by pool",
            t.ttft.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from the routing answer to the end of the response (or its cancellation), by pool",
            t.duration.clone(),
        );
        t
    }

    /// Counts one finished request.
    pub fn request(&self, pool: &str, model: &str, pod: &str, outcome: &'static str) {
        self.requests
            .get_or_create(&RequestLabels {
                pool: pool.to_owned(),
                model: model.to_owned(),
                pod: pod.to_owned(),
                outcome,
            })
            .inc();
    }

    /// Adds reported usage.
    pub fn usage(&self, pool: &str, model: &str, usage: &infergate_openai::Usage) {
        for (kind, n) in token_kinds(usage) {
            if n > 0 {
                self.tokens
                    .get_or_create(&TokenLabels {
                        pool: pool.to_owned(),
                        model: model.to_owned(),
                        kind,
                    })
                    .inc_by(n);
            }
        }
    }

    /// The request and token counters of pool `pool`, with cached handles (see the module
    /// documentation). Build it once per pool and keep it.
    pub fn for_pool(&self, pool: &str) -> PoolTelemetry {
        PoolTelemetry {
            pick: OnceLock::new(),
            ttft: OnceLock::new(),
            duration: OnceLock::new(),
            telemetry: self.clone(),
            pool: pool.to_owned(),
            models: RwLock::default(),
        }
    }
}

/// Labels of the body-based router's `bbr_routed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoutedLabels {
    /// The served name the request's `model` named (a base model or a LoRA adapter).
    pub model: String,
    /// The base model serving it (the `x-gateway-base-model-name` the router set).
    pub base_model: String,
}

/// What the body-based router exports, under `infergate_extproc_bbr_`: the requests it routed by
/// model (`bbr_routed_total`), the time from the complete body to its answer
/// (`bbr_route_duration_seconds`) and the requests it answered with an error
/// (`bbr_rejections_total{reason}`: the picker's `rejections_total` also names its pool, and the
/// router serves none). It registers none of the picker's families. Cheap to clone.
#[derive(Clone, Debug)]
pub struct BbrTelemetry {
    /// Routed requests by served name and base model.
    pub routed: Family<RoutedLabels, Counter>,
    /// Complete request body to the routing answer (parse and lookup).
    pub route_seconds: AtomicHistogram,
    /// Requests answered with an error instead of a route, by reason.
    pub rejections: Family<ReasonLabels, Counter>,
}

impl Default for BbrTelemetry {
    fn default() -> Self {
        BbrTelemetry {
            routed: Family::default(),
            route_seconds: pick_histogram(),
            rejections: Family::default(),
        }
    }
}

impl BbrTelemetry {
    /// Creates the metrics and registers them under the `infergate_extproc_` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let t = BbrTelemetry::default();
        let r = registry.sub_registry_with_prefix("infergate_extproc");
        r.register(
            "bbr_routed",
            "Requests the body-based router routed, by the served name the body named and its base model",
            t.routed.clone(),
        );
        r.register(
            "bbr_route_duration_seconds",
            "Time from the complete request body to the body-based router's routing answer",
            t.route_seconds.clone(),
        );
        r.register(
            "bbr_rejections",
            "Requests the body-based router answered with an error, by reason",
            t.rejections.clone(),
        );
        t
    }

    /// Counts one rejection.
    pub fn reject(&self, reason: &'static str) {
        self.rejections
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}

/// How a routed request ended: the `outcome` label of `requests_total`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The response ended normally.
    Success,
    /// The model server answered 5xx.
    Error,
    /// The stream was reset or closed before the response ended.
    Cancelled,
}

impl Outcome {
    /// Every outcome, in index order.
    pub const ALL: [Outcome; 3] = [Outcome::Success, Outcome::Error, Outcome::Cancelled];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }

    fn index(self) -> usize {
        match self {
            Outcome::Success => 0,
            Outcome::Error => 1,
            Outcome::Cancelled => 2,
        }
    }
}

/// The `kind` label and the count of each token kind in a usage report, in index order.
fn token_kinds(usage: &infergate_openai::Usage) -> [(&'static str, u64); 3] {
    [
        ("input", usage.prompt_tokens),
        ("output", usage.completion_tokens),
        ("cached", usage.cached_tokens),
    ]
}

/// Distinct `model` label values a pool counts before new names go to [`OTHER_MODEL`].
pub const MAX_MODEL_LABELS: usize = 256;

/// The longest `model` label value, in bytes: a longer name from a request is cut there (at a
/// character boundary), so a client's 1 MiB `model` cannot become a 1 MiB series.
pub const MAX_MODEL_LABEL_BYTES: usize = 128;

/// `model` cut to at most [`MAX_MODEL_LABEL_BYTES`], at a character boundary.
fn bounded_label(model: &str) -> &str {
    if model.len() <= MAX_MODEL_LABEL_BYTES {
        return model;
    }
    let mut cut = MAX_MODEL_LABEL_BYTES;
    while !model.is_char_boundary(cut) {
        cut -= 1;
    }
    &model[..cut]
}

/// The `model` label value of requests naming a model beyond the first [`MAX_MODEL_LABELS`].
pub const OTHER_MODEL: &str = "(other)";

/// One pool's request and token counters, with the handles of every label set already used
/// kept per model and endpoint. Made by [`Telemetry::for_pool`].
#[derive(Debug)]
pub struct PoolTelemetry {
    /// `pick_duration_seconds{pool}`, created on first use.
    pick: OnceLock<AtomicHistogram>,
    /// `ttft_seconds{pool}`, created on first use.
    ttft: OnceLock<AtomicHistogram>,
    /// `request_duration_seconds{pool}`, created on first use.
    duration: OnceLock<AtomicHistogram>,
    telemetry: Telemetry,
    pool: String,
    models: RwLock<HashMap<Box<str>, ModelCounters>>,
}

/// A model's cached handles. Each counter is created in its family on first use, so a series
/// appears in the export only once it has counted something.
#[derive(Debug, Default)]
struct ModelCounters {
    /// `tokens_total{model, kind}` by kind index (input, output, cached).
    tokens: [OnceLock<Counter>; 3],
    /// `requests_total{pool, model, pod, outcome}` by endpoint (`None`: no endpoint), then by
    /// outcome index.
    pods: RwLock<HashMap<Option<SocketAddr>, [OnceLock<Counter>; 3]>>,
}

impl PoolTelemetry {
    /// The pool label.
    pub fn pool(&self) -> &str {
        &self.pool
    }

    /// Records the time from the complete request body to the routing answer, in seconds.
    pub fn observe_pick(&self, secs: f64) {
        self.pick
            .get_or_init(|| {
                self.telemetry
                    .pick_seconds
                    .get_or_create(&self.labels())
                    .clone()
            })
            .observe(secs);
    }

    /// Counts one request answered with an error instead of a route (an error path: the
    /// series is looked up in the family).
    pub fn reject(&self, reason: &'static str) {
        self.telemetry
            .rejections
            .get_or_create(&PoolReasonLabels {
                pool: self.pool.clone(),
                reason,
            })
            .inc();
    }

    /// Sets the pool's pod gauges: pods with fresh metrics and stale ones.
    pub fn set_pods(&self, ready: i64, stale: i64) {
        for (state, n) in [("ready", ready), ("stale", stale)] {
            self.telemetry
                .pods
                .get_or_create(&PodStateLabels {
                    pool: self.pool.clone(),
                    state,
                })
                .set(n);
        }
    }

    /// Records a time to first token, in seconds.
    pub fn observe_ttft(&self, secs: f64) {
        self.ttft
            .get_or_init(|| self.telemetry.ttft.get_or_create(&self.labels()).clone())
            .observe(secs);
    }

    /// Records a request's duration (routing answer to the end of the response), in seconds.
    pub fn observe_duration(&self, secs: f64) {
        self.duration
            .get_or_init(|| {
                self.telemetry
                    .duration
                    .get_or_create(&self.labels())
                    .clone()
            })
            .observe(secs);
    }

    fn labels(&self) -> PoolLabels {
        PoolLabels {
            pool: self.pool.clone(),
        }
    }

    /// Counts one finished request of `model` served by `pod`, and its reported `usage`.
    pub fn finished(
        &self,
        model: &str,
        pod: Option<SocketAddr>,
        outcome: Outcome,
        usage: Option<&infergate_openai::Usage>,
    ) {
        self.with_model(model, |model, counters| {
            if let Some(usage) = usage {
                for (i, (kind, n)) in token_kinds(usage).into_iter().enumerate() {
                    if n > 0 {
                        counters.tokens[i]
                            .get_or_init(|| {
                                self.telemetry
                                    .tokens
                                    .get_or_create(&TokenLabels {
                                        pool: self.pool.clone(),
                                        model: model.to_owned(),
                                        kind,
                                    })
                                    .clone()
                            })
                            .inc_by(n);
                    }
                }
            }
            let count = |by_outcome: &[OnceLock<Counter>; 3]| {
                by_outcome[outcome.index()]
                    .get_or_init(|| {
                        self.telemetry
                            .requests
                            .get_or_create(&RequestLabels {
                                pool: self.pool.clone(),
                                model: model.to_owned(),
                                pod: pod.map(|p| p.to_string()).unwrap_or_default(),
                                outcome: outcome.as_str(),
                            })
                            .clone()
                    })
                    .inc();
            };
            let pods = counters.pods.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(by_outcome) = pods.get(&pod) {
                count(by_outcome);
                return;
            }
            drop(pods);
            let mut pods = counters
                .pods
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            count(pods.entry(pod).or_default());
        });
    }

    /// Runs `f` on the label value and cached handles for `model`, creating the entry on first
    /// use. The name comes from the client's request body, so once [`MAX_MODEL_LABELS`] models
    /// have been counted, new names are counted as [`OTHER_MODEL`]: a client cannot make the
    /// picker grow a series per made-up name.
    fn with_model<R>(&self, model: &str, f: impl FnOnce(&str, &ModelCounters) -> R) -> R {
        let model = bounded_label(model);
        // Poisoning cannot leave a half-made entry worth refusing: entries are inserted whole and
        // counters are atomics.
        let models = self.models.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(counters) = models.get(model) {
            return f(model, counters);
        }
        drop(models);
        let mut models = self.models.write().unwrap_or_else(PoisonError::into_inner);
        let label = if models.len() < MAX_MODEL_LABELS || models.contains_key(model) {
            model
        } else {
            OTHER_MODEL
        };
        f(label, models.entry(Box::from(label)).or_default())
    }
}

#[cfg(test)]
mod tests;
