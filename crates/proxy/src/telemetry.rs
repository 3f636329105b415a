//! The gateway's Prometheus metrics, served on the admin port.
//!
//! All series live under `infergate_gateway_`, but for flow control's, which keep the pool crate's
//! `infergate_flow_` (the picker's queues have the same names). Label sets per model and per
//! endpoint are resolved once, when a configuration is loaded ([`ModelMetrics`]), so recording on
//! the request path is a few atomic operations with no lookup, lock or allocation. Only
//! rejections, which are not the hot path, look their series up per event.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;
type StaticLabels = [(&'static str, &'static str); 1];
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    // 1 ms .. ~65 s: from a cached short answer to a long generation.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

fn ttft_histogram() -> Histogram {
    // 0.5 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.000_5, 2.0, 16))
}

/// Every series the gateway exports. Cloning shares them.
#[derive(Clone)]
pub(crate) struct Telemetry {
    requests: Family<Labels, Counter>,
    duration: HistogramFamily,
    ttft: HistogramFamily,
    tokens: Family<Labels, Counter>,
    picks: Family<Labels, Counter>,
    retries: Family<Labels, Counter>,
    rejections: Family<StaticLabels, Counter>,
    reloads: Family<StaticLabels, Counter>,
    /// The counters behind `limits:` (they are exported as they are).
    pub(crate) limits: crate::limits::Counters,
    /// Flow control's queue gauges, wait histogram and outcomes (`flowControl:`), per model.
    pub(crate) flow: infergate_pool::flow::FlowMetrics,
    /// The access log's lines and reopens, by result (`accessLog:`).
    pub(crate) access_log: crate::access_log::LineCounters,
}

impl Telemetry {
    /// Creates the series and registers them in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let t = Telemetry {
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            ttft: Family::new_with_constructor(ttft_histogram),
            tokens: Family::default(),
            picks: Family::default(),
            retries: Family::default(),
            rejections: Family::default(),
            reloads: Family::default(),
            limits: crate::limits::Counters::default(),
            flow: infergate_pool::flow::FlowMetrics::default(),
            access_log: crate::access_log::LineCounters::default(),
        };
        // Flow control's series are `infergate_flow_*`, as at the picker: the pool's own
        // families, not the gateway's.
        let t = Telemetry {
            flow: infergate_pool::flow::FlowMetrics::register(registry),
            ..t
        };
        let r = registry.sub_registry_with_prefix("infergate_gateway");
        r.register(
            "requests",
            "Model requests answered by an upstream, by model and status class",
            t.requests.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from the request's arrival to the last response byte, by model",
            t.duration.clone(),
        );
        r.register(
            "ttft_seconds",
            "Time from the request's arrival to the first generated token of a streamed response",
            t.ttft.clone(),
        );
        r.register(
            "tokens",
            "Tokens reported by model servers in `usage`, by model and direction (in, out)",
            t.tokens.clone(),
        );
        r.register(
            "picks",
            "Requests sent to each endpoint (retries included), by model and endpoint",
            t.picks.clone(),
        );
        r.register(
            "retries",
            "Requests sent again before any response byte reached the client: on another endpoint after a connect failure, a connection closed before answering or a 5xx, or on a new connection after a keep-alive race",
            t.retries.clone(),
        );
        r.register(
            "rejections",
            "Requests answered by the gateway itself with an error, by reason",
            t.rejections.clone(),
        );
        // Both results exported from the start, at 0 (an alert on errors has a series to read).
        for result in ["ok", "error"] {
            let _ = t.reloads.get_or_create(&[("result", result)]);
        }
        r.register(
            "config_reloads",
            "Configuration reloads, by result (ok, error)",
            t.reloads.clone(),
        );
        r.register(
            "connections_open",
            "Open client connections, all workers together (limits.maxConnections)",
            t.limits.connections.clone(),
        );
        r.register(
            "connections_refused",
            "Client connections accepted and closed at once because limits.maxConnections were open",
            t.limits.connections_refused.clone(),
        );
        r.register(
            "header_timeouts",
            "Client connections closed because no request head arrived within limits.headerReadTimeoutMs",
            t.limits.header_timeouts.clone(),
        );
        r.register(
            "requests_in_flight",
            "Requests between their complete head and their last response byte (limits.maxRequestsInFlight)",
            t.limits.in_flight.clone(),
        );
        r.register(
            "requests_in_flight_taken_over",
            "Requests above Sheddable admitted at limits.maxRequestsInFlight by evicting a queued Sheddable request (flow control), whose slot they took",
            t.limits.slots_taken_over.clone(),
        );
        t.access_log.register(r, "access_log");
        r.register(
            "buffered_request_bytes",
            "Request body bytes held, charged to limits.maxBufferedRequestBytes",
            t.limits.buffered.clone(),
        );
        t
    }

    /// Resolves one model's series.
    pub(crate) fn model(&self, model: &str, endpoints: &[SocketAddr]) -> ModelMetrics {
        let model = label_value(model);
        let m = || vec![("model", model.to_owned())];
        let class = |c: &str| {
            self.requests
                .get_or_create(&vec![("model", model.to_owned()), ("code", c.to_owned())])
                .clone()
        };
        let tokens = |d: &str| {
            self.tokens
                .get_or_create(&vec![
                    ("model", model.to_owned()),
                    ("direction", d.to_owned()),
                ])
                .clone()
        };
        ModelMetrics {
            requests: [
                class("1xx"),
                class("2xx"),
                class("3xx"),
                class("4xx"),
                class("5xx"),
            ],
            duration: self.duration.get_or_create(&m()).clone(),
            ttft: self.ttft.get_or_create(&m()).clone(),
            tokens_in: tokens("in"),
            tokens_out: tokens("out"),
            retries: self.retries.get_or_create(&m()).clone(),
            picks: endpoints
                .iter()
                .map(|a| {
                    let c = self
                        .picks
                        .get_or_create(&vec![
                            ("model", model.to_owned()),
                            ("endpoint", a.to_string()),
                        ])
                        .clone();
                    (*a, c)
                })
                .collect(),
        }
    }

    /// Counts a request the gateway answered itself.
    pub(crate) fn rejected(&self, reason: &'static str) {
        self.rejections.get_or_create(&[("reason", reason)]).inc();
    }

    /// Counts a configuration reload.
    pub(crate) fn reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reloads.get_or_create(&[("result", result)]).inc();
    }
}

/// The longest label value exported, in bytes: a model name longer than this (names come from
/// the configuration) is cut at a character boundary, so no series name grows without bound.
pub(crate) const MAX_LABEL_BYTES: usize = 128;

/// `s` cut to at most [`MAX_LABEL_BYTES`], at a character boundary.
pub(crate) fn label_value(s: &str) -> &str {
    if s.len() <= MAX_LABEL_BYTES {
        return s;
    }
    let mut cut = MAX_LABEL_BYTES;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// One model's series, resolved when the configuration was loaded.
#[derive(Clone)]
pub(crate) struct ModelMetrics {
    requests: [Counter; 5],
    duration: Histogram,
    ttft: Histogram,
    tokens_in: Counter,
    tokens_out: Counter,
    retries: Counter,
    picks: HashMap<SocketAddr, Counter>,
}

impl ModelMetrics {
    pub(crate) fn response(&self, status: u16) {
        let ix = usize::from((status / 100).clamp(1, 5)) - 1;
        self.requests[ix].inc();
    }

    pub(crate) fn duration(&self, d: Duration) {
        self.duration.observe(d.as_secs_f64());
    }

    pub(crate) fn ttft(&self, d: Duration) {
        self.ttft.observe(d.as_secs_f64());
    }

    pub(crate) fn tokens(&self, usage: &infergate_openai::Usage) {
        self.tokens_in.inc_by(usage.prompt_tokens);
        self.tokens_out.inc_by(usage.completion_tokens);
    }

    pub(crate) fn retry(&self) {
        self.retries.inc();
    }

    pub(crate) fn pick(&self, addr: SocketAddr) {
        if let Some(c) = self.picks.get(&addr) {
            c.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_cut_at_a_character_boundary() {
        assert_eq!(label_value("llama"), "llama");
        let long = "a".repeat(1 << 20);
        assert_eq!(label_value(&long).len(), MAX_LABEL_BYTES);
        let wide = "é".repeat(100); // 200 bytes, 2 per character
        let cut = label_value(&wide);
        assert_eq!(cut.len(), MAX_LABEL_BYTES);
        assert!(cut.chars().all(|c| c == 'é'));
        let odd = format!("a{}", "é".repeat(100));
        assert_eq!(label_value(&odd).len(), MAX_LABEL_BYTES - 1);
    }
}
