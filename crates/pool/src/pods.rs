//! Per-pod gauges, read from the scheduler when `/metrics` is scraped.
//!
//! The series describe each endpoint as the pool sees it: the scraped load (queue, running batch,
//! KV-cache use, LoRA adapters), this gateway's own requests in flight, the learned rates, and how
//! old its metrics are. Nothing is recorded on the request path: the `PodCollector` is a
//! `prometheus_client` collector that, at each scrape of `/metrics`, takes the pool's lock once,
//! copies the few numbers per endpoint, releases it and encodes them. A scrape every few seconds
//! costs one short lock; a pick costs nothing extra.
//!
//! Cardinality is bounded by the pool: one series per endpoint per family, labelled `pod`
//! (`ip:port`, the value `infergate_extproc_requests_total` uses) and `name` (`namespace/pod`),
//! plus the labels of the registry the pool was started with (`model` on the gateway, `pool` on
//! the picker). Adapter names come from the model server's page, so at most
//! [`MAX_ADAPTER_SERIES`] per endpoint are exported by name.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use infergate_metrics::Clock;
use infergate_scheduler::outlier::AnswerCounts;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet};
use prometheus_client::metrics::MetricType;

use crate::{State, lock};

/// Adapters per endpoint and state exported by name in `infergate_pod_lora_adapter_info`.
pub const MAX_ADAPTER_SERIES: usize = 16;

/// Labels of every per-pod series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PodLabels {
    /// `ip:port`.
    pod: String,
    /// `namespace/pod`.
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    pod: String,
    name: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    pod: String,
    name: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdapterLabels {
    pod: String,
    name: String,
    adapter: String,
    state: &'static str,
}

/// What one endpoint's series show, copied under the lock.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSample {
    /// `ip:port`.
    pub addr: SocketAddr,
    /// `namespace/pod`.
    pub name: String,
    /// Seconds since the last good page (`None` before the first one).
    pub metrics_age: Option<Duration>,
    /// Whether the pod is not routed on: its scrapes failed, or its last good page is older
    /// than the staleness threshold with no late scrape in flight, or there is none.
    pub stale: bool,
    /// How its scrapes are going.
    pub scrape: infergate_metrics::ScrapeState,
    /// Whether outlier detection has it out of the candidates (its requests kept failing).
    pub ejected: bool,
    /// Scraped queue depth.
    pub waiting: Option<u32>,
    /// Scraped running batch.
    pub running: Option<u32>,
    /// Scraped KV-cache use, 0–1 (`None` when the engine has no such gauge).
    pub kv_cache_usage: Option<f64>,
    /// Distinct adapters with requests running, and their names (at most
    /// [`MAX_ADAPTER_SERIES`]).
    pub lora_running: Option<Vec<String>>,
    /// Distinct adapters waiting without running, and their names (at most
    /// [`MAX_ADAPTER_SERIES`]).
    pub lora_waiting: Option<Vec<String>>,
    /// `max_lora`.
    pub lora_max: Option<u32>,
    /// This gateway's requests in flight.
    pub inflight: u32,
    /// Of those, the ones waiting for their first token.
    pub awaiting_first_token: u32,
    /// Their estimated uncached prompt tokens (the heartbeat's queue in tokens).
    pub awaiting_first_token_tokens: u64,
    /// Learned prefill rate, tokens/s.
    pub prefill_tokens_per_sec: Option<f64>,
    /// Learned prefill rate on long prompts, tokens/s (from first tokens that waited for 256
    /// tokens of work or more), what a long prompt is extrapolated with.
    pub bulk_prefill_tokens_per_sec: Option<f64>,
    /// Learned fixed cost per request, seconds (from first tokens that waited for 64 tokens of
    /// work or fewer): what a short prompt's first token takes whatever its length.
    pub fixed_cost_secs: Option<f64>,
    /// Learned decode rate per request, tokens/s.
    pub decode_tokens_per_sec: Option<f64>,
    /// Its cold-start prefill rate, tokens/s: the scheduler's configured prior scaled by its GPU
    /// type (`EndpointInfo::cold_prefill_tokens_per_sec`).
    pub cold_prefill_tokens_per_sec: f64,
    /// Its cold-start per-request decode rate, tokens/s, the same way.
    pub cold_decode_tokens_per_sec: f64,
    /// The answers it gave this front door's requests, by verdict.
    pub answers: AnswerCounts,
    /// The failed share of its last `outlierDetection.failurePercentage` interval, percent.
    pub failure_percent: Option<f64>,
}

/// Distinct names, at most [`MAX_ADAPTER_SERIES`], skipping those in `except`.
fn distinct(names: &[String], except: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        if out.len() == MAX_ADAPTER_SERIES {
            break;
        }
        if !n.is_empty() && !except.contains(n) && !out.contains(n) {
            out.push(n.clone());
        }
    }
    out
}

/// Reads every endpoint's sample under one short lock.
pub(crate) fn sample(state: &Mutex<State>, clock: Clock, stale_after: Duration) -> Vec<PodSample> {
    let now = clock.now();
    let st = lock(state);
    let addrs: Vec<SocketAddr> = st.scheduler.endpoints().map(|m| m.addr).collect();
    addrs
        .into_iter()
        .filter_map(|a| st.scheduler.endpoint(a))
        .map(|info| {
            let m = info.metrics.as_ref();
            let age = m.map(|m| now.saturating_since(m.sampled_at));
            let lora = m.and_then(|m| m.lora.as_ref());
            PodSample {
                addr: info.meta.addr,
                name: format!("{}/{}", info.meta.namespace, info.meta.pod),
                metrics_age: age,
                stale: crate::routable(&info, now, stale_after) != Some(true),
                scrape: info.scrape,
                ejected: info.ejected_until.is_some_and(|until| now < until),
                waiting: m.map(|m| m.waiting),
                running: m.map(|m| m.running),
                kv_cache_usage: m.and_then(|m| m.kv_cache_usage),
                lora_running: lora.map(|l| distinct(&l.running, &[])),
                lora_waiting: lora.map(|l| distinct(&l.waiting, &l.running)),
                lora_max: lora.map(|l| l.max_lora),
                inflight: info.inflight,
                awaiting_first_token: info.awaiting_first_token,
                awaiting_first_token_tokens: info.awaiting_first_token_tokens,
                prefill_tokens_per_sec: info.prefill_tokens_per_sec,
                bulk_prefill_tokens_per_sec: info.bulk_prefill_tokens_per_sec,
                fixed_cost_secs: info.fixed_cost_secs,
                decode_tokens_per_sec: info.decode_tokens_per_sec,
                cold_prefill_tokens_per_sec: info.cold_prefill_tokens_per_sec,
                cold_decode_tokens_per_sec: info.cold_decode_tokens_per_sec,
                answers: info.answers,
                failure_percent: info.failure_interval.map(|j| j.failure_percent()),
            }
        })
        .collect()
}

/// The per-pod series of one pool, as a `prometheus_client` collector.
#[derive(Debug)]
pub(crate) struct PodCollector {
    pub(crate) state: Arc<Mutex<State>>,
    pub(crate) clock: Clock,
    pub(crate) stale_after: Duration,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").finish_non_exhaustive()
    }
}

/// Encodes one gauge family from `samples`, skipping endpoints for which `value` is `None`.
fn gauge<V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    samples: &[(PodLabels, &PodSample)],
    value: impl Fn(&PodSample) -> Option<V>,
) -> Result<(), std::fmt::Error> {
    if samples.iter().all(|(_, s)| value(s).is_none()) {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, s) in samples {
        if let Some(v) = value(s) {
            family.encode_family(labels)?.encode_gauge(&v)?;
        }
    }
    Ok(())
}

impl Collector for PodCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let samples = sample(&self.state, self.clock, self.stale_after);
        let labelled: Vec<(PodLabels, &PodSample)> = samples
            .iter()
            .map(|s| {
                (
                    PodLabels {
                        pod: s.addr.to_string(),
                        name: s.name.clone(),
                    },
                    s,
                )
            })
            .collect();
        let e = &mut encoder;
        gauge(
            e,
            "infergate_pod_kv_cache_usage_ratio",
            "KV-cache use from the pod's last good metrics page, 0-1 (absent for engines without a KV gauge)",
            &labelled,
            |s| s.kv_cache_usage,
        )?;
        gauge(
            e,
            "infergate_pod_waiting_requests",
            "Requests waiting in the pod's queue, from its last good metrics page",
            &labelled,
            |s| s.waiting,
        )?;
        gauge(
            e,
            "infergate_pod_running_requests",
            "Requests in the pod's running batch, from its last good metrics page",
            &labelled,
            |s| s.running,
        )?;
        gauge(
            e,
            "infergate_pod_inflight_requests",
            "This gateway's requests in flight on the pod (routed and not yet finished)",
            &labelled,
            |s| Some(s.inflight),
        )?;
        gauge(
            e,
            "infergate_pod_awaiting_first_token_requests",
            "This gateway's requests on the pod that have not produced a first token",
            &labelled,
            |s| Some(s.awaiting_first_token),
        )?;
        if labelled.iter().any(|(_, s)| s.lora_running.is_some()) {
            let mut family = e.encode_descriptor(
                "infergate_pod_lora_adapters",
                "Distinct LoRA adapters on the pod by state (running: with requests running; waiting: waiting without running)",
                None,
                MetricType::Gauge,
            )?;
            for (l, s) in &labelled {
                for (state, list) in [("running", &s.lora_running), ("waiting", &s.lora_waiting)] {
                    if let Some(list) = list {
                        let labels = StateLabels {
                            pod: l.pod.clone(),
                            name: l.name.clone(),
                            state,
                        };
                        family
                            .encode_family(&labels)?
                            .encode_gauge(&(list.len() as u64))?;
                    }
                }
            }
            let mut family = e.encode_descriptor(
                "infergate_pod_lora_adapter_info",
                "1 for each LoRA adapter the pod reports, by state (at most 16 per pod and state)",
                None,
                MetricType::Gauge,
            )?;
            for (l, s) in &labelled {
                for (state, list) in [("running", &s.lora_running), ("waiting", &s.lora_waiting)] {
                    for adapter in list.iter().flatten() {
                        let labels = AdapterLabels {
                            pod: l.pod.clone(),
                            name: l.name.clone(),
                            adapter: adapter.clone(),
                            state,
                        };
                        family.encode_family(&labels)?.encode_gauge(&1u64)?;
                    }
                }
            }
        }
        gauge(
            e,
            "infergate_pod_lora_max_adapters",
            "Adapters the pod can hold at once (max_lora)",
            &labelled,
            |s| s.lora_max,
        )?;
        gauge(
            e,
            "infergate_pod_metrics_age_seconds",
            "Seconds since the pod's last good metrics page (absent before the first)",
            &labelled,
            |s| s.metrics_age.map(|a| a.as_secs_f64()),
        )?;
        gauge(
            e,
            "infergate_pod_stale",
            "1 when the pod is not routed on (a scheduler with freshness on): its scrapes failed, or its last good metrics page is older than the staleness threshold with no late scrape, or there is none; else 0",
            &labelled,
            |s| Some(u64::from(s.stale)),
        )?;
        gauge(
            e,
            "infergate_pod_ejected",
            "1 while outlier detection has the pod out of the candidates (its requests failed outlierDetection.consecutive5xx times in a row, or at least failurePercentage.threshold of them over an interval, while its metrics looked fine), else 0",
            &labelled,
            |s| Some(u64::from(s.ejected)),
        )?;
        gauge(
            e,
            "infergate_pod_failure_percent",
            "The failed share of the pod's answers in its last interval judged by outlierDetection.failurePercentage, percent (absent without it, and before its first interval closed)",
            &labelled,
            |s| s.failure_percent,
        )?;
        if !labelled.is_empty() {
            let mut family = e.encode_descriptor(
                "infergate_pod_answers",
                "Answers the pod gave to requests routed there, by result: success (2xx), failure (500, 502, 503, 504, or no response headers: what outlier detection counts), other (any other status); since the pod joined the pool",
                None,
                MetricType::Counter,
            )?;
            for (l, s) in &labelled {
                for (result, n) in [
                    ("success", s.answers.success),
                    ("failure", s.answers.failure),
                    ("other", s.answers.neutral),
                ] {
                    let labels = ResultLabels {
                        pod: l.pod.clone(),
                        name: l.name.clone(),
                        result,
                    };
                    family
                        .encode_family(&labels)?
                        .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(
                            &n, None,
                        )?;
                }
            }
        }
        if !labelled.is_empty() {
            let mut family = e.encode_descriptor(
                "infergate_pod_scrape_state",
                "1 for the state the pod's scrapes are in: ok (fresh page), late (connected, no page within the staleness threshold: routed on its last page), failed (refused, reset, an HTTP or parse error: not routed on)",
                None,
                MetricType::Gauge,
            )?;
            for (l, s) in &labelled {
                for state in infergate_metrics::ScrapeState::ALL {
                    let labels = StateLabels {
                        pod: l.pod.clone(),
                        name: l.name.clone(),
                        state: state.as_str(),
                    };
                    family
                        .encode_family(&labels)?
                        .encode_gauge(&u64::from(s.scrape == state))?;
                }
            }
        }
        gauge(
            e,
            "infergate_pod_prefill_tokens_per_second",
            "Prefill rate the scheduler learned for the pod (absent until a streamed request completed)",
            &labelled,
            |s| s.prefill_tokens_per_sec,
        )?;
        gauge(
            e,
            "infergate_pod_decode_tokens_per_second",
            "Per-request decode rate the scheduler learned for the pod",
            &labelled,
            |s| s.decode_tokens_per_sec,
        )?;
        Ok(())
    }
}
