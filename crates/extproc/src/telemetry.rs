//! The ext_proc server's own Prometheus metrics.
//!
//! Label values are few and bounded: the pool is fixed per process, models and pods are the
//! pool's own, outcomes and reasons are fixed strings.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The pool (or `bbr` for the body-based router).
    pub pool: String,
    /// The model the request named.
    pub model: String,
    /// The endpoint that served it (`ip:port`), empty when none did.
    pub pod: String,
    /// `success`, `error` (5xx from the model server), `cancelled` or `rejected`.
    pub outcome: &'static str,
}

/// Labels of `rejections_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The client-visible error's metric label (e.g. `shed`, `no_endpoints`, `invalid_json`).
    pub reason: &'static str,
}

/// Labels of `tokens_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// The model the request named.
    pub model: String,
    /// `input`, `output` or `cached`.
    pub kind: &'static str,
}

/// Labels of the pod gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodStateLabels {
    /// `ready` (fresh metrics) or `stale`.
    pub state: &'static str,
}

/// Every metric the ext_proc server exports. Cheap to clone (handles share their values).
#[derive(Clone, Debug)]
pub struct Telemetry {
    /// Requests by pool, model, pod and outcome.
    pub requests: Family<RequestLabels, Counter>,
    /// Time from the end of the request body to the routing answer (pick included).
    pub pick_seconds: Histogram,
    /// Requests answered with an error instead of a route, by reason.
    pub rejections: Family<ReasonLabels, Counter>,
    /// Tokens reported by model servers, by model and kind.
    pub tokens: Family<TokenLabels, Counter>,
    /// Pods by state.
    pub pods: Family<PodStateLabels, Gauge>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            requests: Family::default(),
            // 1 µs … ~16 ms: the answer is microseconds; milliseconds would be worth seeing.
            pick_seconds: Histogram::new(exponential_buckets(1e-6, 2.0, 15)),
            rejections: Family::default(),
            tokens: Family::default(),
            pods: Family::default(),
        }
    }
}

impl Telemetry {
    /// Creates the metrics and registers them under the `extproc_` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let t = Telemetry::default();
        let r = registry.sub_registry_with_prefix("extproc");
        r.register(
            "requests",
            "Requests by pool, model, serving pod and outcome",
            t.requests.clone(),
        );
        r.register(
            "pick_duration_seconds",
            "Time from the complete request body to the routing answer",
            t.pick_seconds.clone(),
        );
        r.register(
            "rejections",
            "Requests answered with an error, by reason",
            t.rejections.clone(),
        );
        r.register(
            "tokens",
            "Tokens reported by model servers, by model and kind (input, output, cached)",
            t.tokens.clone(),
        );
        r.register("pods", "Pool pods by state (ready, stale)", t.pods.clone());
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

    /// Counts one rejection.
    pub fn reject(&self, reason: &'static str) {
        self.rejections
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Adds reported usage.
    pub fn usage(&self, model: &str, usage: &infergate_openai::Usage) {
        for (kind, n) in [
            ("input", usage.prompt_tokens),
            ("output", usage.completion_tokens),
            ("cached", usage.cached_tokens),
        ] {
            if n > 0 {
                self.tokens
                    .get_or_create(&TokenLabels {
                        model: model.to_owned(),
                        kind,
                    })
                    .inc_by(n);
            }
        }
    }
}
