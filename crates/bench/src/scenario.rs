//! Scenario files: the fleet, the workload, the seeds and the policies to compare.
//!
//! Scenarios are data (`benches/scenarios/*.yaml`). Every key is checked: an unknown key, a wrong
//! type or an out-of-range value is a [`BenchError`] naming the field's path
//! (`workload.arrival.rate`), never a panic.
//!
//! ```yaml
//! name: mixed-llama-8b
//! description: Two H100s and six A10Gs serving Llama-3.1-8B, steady Poisson load.
//! study: { ttft_p95_pct: -97, ttft_p99_pct: -97, throughput_pct: 8 }
//! targets: { ttft_p95_reduction: 0.97, ttft_p99_reduction: 0.97, throughput_not_lower: true }
//! fleet:
//!   - { name: h100, profile: llama-3.1-8b/h100, replicas: 2 }
//!   - { name: a10g, profile: llama-3.1-8b/a10g, engine: vllm, replicas: 6 }
//! workload:
//!   duration_s: 300
//!   arrival: { kind: poisson, rate: 12 }
//!   prompt_tokens: { dist: lognormal, median: 600, sigma: 0.7, min: 32, max: 6000 }
//!   output_tokens: { dist: uniform, min: 32, max: 256 }
//! seeds: [1, 2, 3]
//! policies: [round-robin, random, least-request, gie-default, infergate]
//! ```
//!
//! A policy may also be an entry with a name of its own and the gateway's `outlierDetection:`
//! settings (see [`crate::policy`]); `retries: { maxAttempts: 3 }` is the gateway's retry
//! policy, which the simulated runner follows when a pod fails a request; a pod group's
//! `faults:` make its pods fail requests (`error_rate`) or slow down (`slowdown`), from the
//! start or at `at_s` seconds of virtual time (see [`PodGroup::faults`]):
//!
//! ```yaml
//! fleet:
//!   - { name: h100, profile: llama-3.1-8b/h100, replicas: 3 }
//!   - { name: bad, profile: llama-3.1-8b/h100, faults: [{ at_s: 0, error_rate: 1.0 }] }
//! retries: { maxAttempts: 3 }
//! policies:
//!   - infergate                     # the preset's outlier detection: on
//!   - { name: infergate-no-od, preset: infergate, outlierDetection: null }
//!   - { name: infergate-od3, preset: infergate, outlierDetection: { consecutive5xx: 3 } }
//! ```
//!
//! `infergate-precise` may be listed too (simulated mode, no `flow` section): the
//! `infergate` preset fed each pod's KV-cache events, seen `kv_events.lag_ms` after the pod
//! publishes them, and with `kv_events.provisional: true` also counting each routed request's
//! prompt on its pod until the request completes (see [`crate::policy`]).

use std::path::Path;

use infergate_scheduler::flow::FlowConfig;
use infergate_scheduler::{Preset, Priority, Thresholds};
use infergate_sim::spec::FaultStep;
use infergate_sim::{Catalog, EngineKind, Faults, FleetSpec, PodSpec};
use serde::{Deserialize, Serialize};

use crate::BenchError;
use crate::policy::RoutePolicy;

mod replicas;
pub use replicas::{Exchange, ReplicaBench, Sharing, Spread};

/// One benchmark scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name, used in report file names.
    pub name: String,
    /// What the scenario stands for.
    #[serde(default)]
    pub description: String,
    /// The published figures this scenario reproduces, for the report's context column.
    #[serde(default)]
    pub study: Option<StudyClaim>,
    /// The routing-quality targets the `infergate` policy is held to.
    #[serde(default)]
    pub targets: Targets,
    /// The pods, in order.
    pub fleet: Vec<PodGroup>,
    /// The requests.
    pub workload: Workload,
    /// How the simulated scraper samples pods.
    #[serde(default)]
    pub scrape: Scrape,
    /// Seeds; every policy runs once per seed on the same arrivals.
    #[serde(default = "default_seeds")]
    pub seeds: Vec<u64>,
    /// Policies compared (scheduler presets, `infergate-precise`, or entries with outlier
    /// detection). Round-robin is the baseline of the report.
    #[serde(default = "default_policies")]
    pub policies: Vec<RoutePolicy>,
    /// The gateway's retry policy: how many pods a request is tried on when they fail it.
    #[serde(default, skip_serializing_if = "Retries::is_default")]
    pub retries: Retries,
    /// How the pods' KV-cache events reach the `infergate-precise` policy.
    #[serde(default, skip_serializing_if = "KvEvents::is_default")]
    pub kv_events: KvEvents,
    /// Windows of virtual time in which the pool's metric snapshots stop refreshing while the
    /// pods keep serving (scrapes connect and hang), e.g. `[{ from_s: 20, to_s: 50 }]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stale: Vec<StaleWindow>,
    /// Flow control compared (scenarios with tenants): each router preset of `policies` runs
    /// once per flow-control policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<FlowBench>,
    /// Active-active picker replicas compared (see [`ReplicaBench`]): each policy runs once per
    /// replica count and sharing mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicaBench>,
}

/// The gateway's `retries:` section (its keys and default): a request a pod fails (a 5xx) is
/// tried on the next pod of the pick's ranked list, up to `maxAttempts` attempts in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "camelCase")]
pub struct Retries {
    /// Attempts per request including the first (1 = no retry; the gateway's default is 3).
    pub max_attempts: u8,
}

impl Default for Retries {
    fn default() -> Self {
        Retries { max_attempts: 3 }
    }
}

impl Retries {
    fn is_default(&self) -> bool {
        *self == Retries::default()
    }
}

/// How the pods' KV-cache events reach a precise router (simulated).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEvents {
    /// Milliseconds between a pod publishing an engine step's events (at the step's end) and the
    /// router applying them: vLLM's ZMQ transport and the subscriber's indexing.
    #[serde(default = "default_kv_lag_ms")]
    pub lag_ms: f64,
    /// Whether the router also counts a request's prompt on the pod it sent it to, from the pick
    /// until the request completes (the events show blocks only once they are computed, so a
    /// queued request's prefix is otherwise on no pod). Off: the events alone.
    #[serde(default)]
    pub provisional: bool,
}

impl Default for KvEvents {
    fn default() -> Self {
        KvEvents {
            lag_ms: default_kv_lag_ms(),
            provisional: false,
        }
    }
}

impl KvEvents {
    fn is_default(&self) -> bool {
        *self == KvEvents::default()
    }
}

fn default_kv_lag_ms() -> f64 {
    5.0
}

/// A window in which no scrape returns a page.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaleWindow {
    /// Start (s of virtual time).
    pub from_s: f64,
    /// End (s); the first scrape at or after it returns a page again.
    pub to_s: f64,
}

impl StaleWindow {
    /// Whether `t` is in the window.
    pub fn contains(&self, t: f64) -> bool {
        (self.from_s..self.to_s).contains(&t)
    }
}

/// A flow-control policy of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FlowPolicy {
    /// No queue: every request is picked (routed or shed) the moment it arrives, as today.
    None,
    /// Like the reference picker's defaults: one global-strict FCFS queue per band, dispatch
    /// while the saturation detector (queue depth 5, KV cache 80% on scraped metrics, no
    /// in-flight accounting) finds a pod with headroom, and a pool whose metrics are older than
    /// 200 ms counts as saturated (fail-closed: dispatch stops).
    Reference,
    /// infergate's: `flow.config` (fairness between tenants, priorities, TTL, bounds), queueing
    /// when the scheduler finds every candidate saturated (its thresholds, with in-flight
    /// accounting); stale metrics handled by the scheduler's `staleMetrics` (fail-open).
    Infergate,
}

impl FlowPolicy {
    /// The name used in scenario files and reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            FlowPolicy::None => "none",
            FlowPolicy::Reference => "reference",
            FlowPolicy::Infergate => "infergate",
        }
    }
}

/// The flow-control comparison of a scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlowBench {
    /// Policies compared, in table order.
    pub policies: Vec<FlowPolicy>,
    /// infergate's queues: the gateway's `flowControl:` section (camelCase keys, as in the
    /// gateway file; `enabled` is implied). The reference-like policy uses the same TTL and
    /// bounds with global-strict fairness and FCFS.
    pub config: FlowConfig,
    /// The router's saturation thresholds in this scenario (default: the preset's): where
    /// infergate's flow control starts queueing, and its admission starts shedding.
    pub saturation: Option<Thresholds>,
    /// The reference-like saturation detector.
    pub reference: ReferenceGate,
    /// What the `infergate` flow policy is held to.
    pub targets: FlowTargets,
}

impl Default for FlowBench {
    fn default() -> Self {
        FlowBench {
            policies: vec![
                FlowPolicy::None,
                FlowPolicy::Reference,
                FlowPolicy::Infergate,
            ],
            config: FlowConfig {
                enabled: true,
                ..FlowConfig::default()
            },
            saturation: None,
            reference: ReferenceGate::default(),
            targets: FlowTargets::default(),
        }
    }
}

/// The reference picker's saturation detector, as modelled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReferenceGate {
    /// A pod is saturated at this many waiting requests (scraped).
    pub queue_depth: u32,
    /// ... or at this KV-cache use.
    pub kv_cache: f64,
    /// Metrics older than this (ms) make a pod count as saturated.
    pub staleness_ms: f64,
}

impl Default for ReferenceGate {
    fn default() -> Self {
        ReferenceGate {
            queue_depth: 5,
            kv_cache: 0.8,
            staleness_ms: 200.0,
        }
    }
}

/// Targets of a flow-control scenario (for the `infergate` flow policy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct FlowTargets {
    /// This tenant's TTFT P99 at most `max_ratio` × its P99 with the other tenants absent.
    pub isolation: Option<IsolationTarget>,
    /// Critical TTFT P99 at most this multiple of its value with only Critical traffic.
    pub critical_vs_unloaded: Option<f64>,
    /// Sheddable rejected before (and more than) Standard, Standard before Critical.
    pub shed_order: bool,
    /// Queue lengths and waits within the configured limits and TTL, every request answered.
    pub bounded: bool,
    /// Dispatch continues while metrics are stale, with the TTFT P99 of requests arriving in
    /// the stale windows at most this multiple of the direct path's (round-robin, no gateway
    /// logic) on the same arrivals.
    pub stale_vs_direct: Option<f64>,
}

/// See [`FlowTargets::isolation`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IsolationTarget {
    /// The quiet tenant.
    pub tenant: String,
    /// Largest allowed ratio.
    pub max_ratio: f64,
}

/// Figures published by the study a scenario reproduces (percent change against round-robin).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StudyClaim {
    /// TTFT P95 change, percent (−97 = 97% lower).
    #[serde(default)]
    pub ttft_p95_pct: Option<f64>,
    /// TTFT P99 change, percent.
    #[serde(default)]
    pub ttft_p99_pct: Option<f64>,
    /// Throughput change, percent.
    #[serde(default)]
    pub throughput_pct: Option<f64>,
}

/// Targets for the `infergate` policy. Reductions are fractions (0.97 = 97% below round-robin).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Targets {
    /// TTFT P95 at least this fraction below round-robin.
    pub ttft_p95_reduction: Option<f64>,
    /// TTFT P99 at least this fraction below round-robin.
    pub ttft_p99_reduction: Option<f64>,
    /// Throughput (output tokens/s) not lower than round-robin's.
    pub throughput_not_lower: bool,
    /// TTFT P95/P99 not worse than round-robin beyond run-to-run noise (uniform fleets).
    pub not_worse_than_round_robin: bool,
    /// TTFT P99 better than `gie-default`'s.
    pub beat_gie_default: bool,
    /// TTFT P99 within this multiple of the clairvoyant floor's P99.
    pub floor_multiple: Option<f64>,
}

impl Default for Targets {
    fn default() -> Self {
        Targets {
            ttft_p95_reduction: None,
            ttft_p99_reduction: None,
            throughput_not_lower: false,
            not_worse_than_round_robin: false,
            beat_gie_default: true,
            floor_multiple: Some(1.5),
        }
    }
}

/// A group of identical pods.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodGroup {
    /// Name; with `replicas > 1` the pods are `name-0`, `name-1`, ...
    pub name: String,
    /// Simulator profile id, e.g. `llama-3.1-8b/h100`.
    pub profile: String,
    /// Which engine's metrics the pods expose.
    #[serde(default)]
    pub engine: EngineKind,
    /// How many pods.
    #[serde(default = "one")]
    pub replicas: u32,
    /// LoRA adapters the pods can serve.
    #[serde(default)]
    pub lora_adapters: Vec<String>,
    /// Resident LoRA slots (default: the profile's).
    #[serde(default)]
    pub max_loras: Option<u32>,
    /// Model name the pods serve (default: the profile's), so that e.g. a quantised build on
    /// smaller GPUs joins the same pool.
    #[serde(default)]
    pub served_model_name: Option<String>,
    /// The pods' faults, as in a simulator fleet file (`at_s` 0 for the start): `error_rate`
    /// (that fraction of the requests sent to a pod fail at once, like a model server answering
    /// 500 while its metrics look fine) and `slowdown` (a step-time multiplier). Live runs serve
    /// them from the emulated pods as well.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<FaultStep>,
}

/// The request stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Seconds of arrivals (the run continues until every admitted request finishes).
    pub duration_s: f64,
    /// Arrival process.
    pub arrival: ArrivalProcess,
    /// Prompt length; for a request in a shared-prefix group, the length after the shared prefix.
    pub prompt_tokens: LengthDist,
    /// Output length (the emulated servers generate exactly this many tokens).
    pub output_tokens: LengthDist,
    /// Shared-prefix groups (system prompts, few-shot examples, multi-turn history).
    #[serde(default)]
    pub prefix: Option<PrefixSpec>,
    /// LoRA adapter mix.
    #[serde(default)]
    pub lora: Option<LoraSpec>,
    /// Priority mix (the rest is Standard).
    #[serde(default)]
    pub priorities: Option<PriorityMix>,
    /// Tenants, each with its own arrivals, priorities and request shapes. Empty: one tenant
    /// (`default`) sends the whole workload, exactly as before tenants existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<TenantSpec>,
}

/// One tenant of a shared pool. Unset fields take the workload's.
///
/// ```yaml
/// tenants:
///   - { name: quiet, share: 0.5 }                  # half of workload.arrival's rate
///   - name: noisy
///     arrival: { kind: bursty, base_rate: 2, burst_rate: 20, burst_s: 10, period_s: 60 }
///     priority: sheddable
///     output_tokens: { dist: fixed, value: 64 }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    /// Name, as the gateway's tenant (an auth identity or the fairness-id header).
    pub name: String,
    /// Fraction of `workload.arrival`'s rates this tenant sends (ignored with `arrival`).
    #[serde(default = "one_f64")]
    pub share: f64,
    /// The tenant's own arrival process (absolute rates), instead of a share of the workload's.
    #[serde(default)]
    pub arrival: Option<ArrivalProcess>,
    /// Every request of the tenant has this priority (instead of a mix).
    #[serde(default)]
    pub priority: Option<Priority>,
    /// Priority mix of the tenant's requests (default: the workload's).
    #[serde(default)]
    pub priorities: Option<PriorityMix>,
    /// Prompt length (default: the workload's).
    #[serde(default)]
    pub prompt_tokens: Option<LengthDist>,
    /// Output length (default: the workload's).
    #[serde(default)]
    pub output_tokens: Option<LengthDist>,
}

impl ArrivalProcess {
    /// The process with every rate multiplied by `factor`.
    pub fn scaled(&self, factor: f64) -> ArrivalProcess {
        let mut p = self.clone();
        p.scale(factor);
        p
    }

    /// Multiplies every rate by `factor`.
    pub fn scale(&mut self, factor: f64) {
        match self {
            ArrivalProcess::Poisson { rate } => *rate *= factor,
            ArrivalProcess::Bursty {
                base_rate,
                burst_rate,
                ..
            } => {
                *base_rate *= factor;
                *burst_rate *= factor;
            }
            ArrivalProcess::Ramp { from_rate, to_rate } => {
                *from_rate *= factor;
                *to_rate *= factor;
            }
        }
    }
}

impl Workload {
    /// The longest prompt and output any request (of any tenant) can have.
    pub fn max_lengths(&self) -> (u32, u32) {
        let prefix = self.prefix.as_ref().map_or(0, |p| p.tokens);
        let mut prompt = self.prompt_tokens.max();
        let mut output = self.output_tokens.max();
        for t in &self.tenants {
            if let Some(d) = &t.prompt_tokens {
                prompt = prompt.max(d.max());
            }
            if let Some(d) = &t.output_tokens {
                output = output.max(d.max());
            }
        }
        (prompt.saturating_add(prefix), output)
    }

    /// Tenant names in order: the configured ones, or `default` alone.
    pub fn tenant_names(&self) -> Vec<String> {
        if self.tenants.is_empty() {
            vec!["default".to_owned()]
        } else {
            self.tenants.iter().map(|t| t.name.clone()).collect()
        }
    }
}

/// When requests arrive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ArrivalProcess {
    /// Poisson arrivals at `rate` requests per second.
    Poisson {
        /// Requests per second.
        rate: f64,
    },
    /// On/off traffic: `burst_rate` for the first `burst_s` of every `period_s`, else `base_rate`
    /// (Poisson within each phase).
    Bursty {
        /// Requests per second between bursts.
        base_rate: f64,
        /// Requests per second during a burst.
        burst_rate: f64,
        /// Burst length (s).
        burst_s: f64,
        /// Time from one burst's start to the next (s).
        period_s: f64,
    },
    /// A Poisson rate moving linearly from `from_rate` to `to_rate` over the duration.
    Ramp {
        /// Requests per second at the start.
        from_rate: f64,
        /// Requests per second at the end.
        to_rate: f64,
    },
}

/// A distribution of token counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "kebab-case", deny_unknown_fields)]
pub enum LengthDist {
    /// Always `value`.
    Fixed {
        /// The length.
        value: u32,
    },
    /// Uniform on `[min, max]`.
    Uniform {
        /// Smallest length.
        min: u32,
        /// Largest length.
        max: u32,
    },
    /// Log-normal with the given median and shape, clamped to `[min, max]`.
    Lognormal {
        /// Median length.
        median: f64,
        /// Standard deviation of the underlying normal.
        sigma: f64,
        /// Smallest length.
        min: u32,
        /// Largest length.
        max: u32,
    },
}

impl LengthDist {
    /// The largest value the distribution can produce.
    pub fn max(&self) -> u32 {
        match self {
            LengthDist::Fixed { value } => *value,
            LengthDist::Uniform { max, .. } | LengthDist::Lognormal { max, .. } => *max,
        }
    }
}

/// Shared-prefix groups.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixSpec {
    /// Number of distinct prefixes.
    pub groups: u32,
    /// Tokens in each shared prefix.
    pub tokens: u32,
    /// Fraction of requests that start with a shared prefix.
    pub fraction: f64,
    /// Zipf exponent of group popularity (0 = uniform).
    #[serde(default)]
    pub zipf: f64,
}

/// LoRA adapter mix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSpec {
    /// Adapters requested (each must be served by at least one pod).
    pub adapters: Vec<String>,
    /// Fraction of requests that name an adapter.
    pub fraction: f64,
    /// Zipf exponent of adapter popularity (0 = uniform).
    #[serde(default)]
    pub zipf: f64,
}

/// Priority mix; the remainder is Standard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct PriorityMix {
    /// Fraction of Critical requests.
    pub critical: f64,
    /// Fraction of Sheddable requests.
    pub sheddable: f64,
}

/// Simulated scraping.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scrape {
    /// Milliseconds between scrapes (upstream default 50).
    pub interval_ms: f64,
    /// Milliseconds between a scrape and the router seeing it.
    pub lag_ms: f64,
}

impl Default for Scrape {
    fn default() -> Self {
        Scrape {
            interval_ms: 50.0,
            lag_ms: 10.0,
        }
    }
}

fn one() -> u32 {
    1
}

fn one_f64() -> f64 {
    1.0
}

/// The index and value of the first item equal to an earlier one (lists of a few items).
fn first_repeat<T: PartialEq>(items: &[T]) -> Option<(usize, &T)> {
    items
        .iter()
        .enumerate()
        .find(|(i, x)| items[..*i].contains(x))
}

fn default_seeds() -> Vec<u64> {
    vec![1, 2, 3]
}

fn default_policies() -> Vec<RoutePolicy> {
    [
        Preset::RoundRobin,
        Preset::Random,
        Preset::LeastRequest,
        Preset::GieDefault,
        Preset::Infergate,
    ]
    .map(RoutePolicy::preset)
    .to_vec()
}

impl Scenario {
    /// Whether some pod of the fleet ever fails requests (an `error_rate` above 0, from the start
    /// or scripted): the runs then report their attempts.
    pub fn has_failing_pods(&self) -> bool {
        self.fleet
            .iter()
            .flat_map(|g| &g.faults)
            .any(|f| f.error_rate.is_some_and(|e| e > 0.0))
    }

    /// Whether a simulated run of it can keep per-request records
    /// ([`crate::simulate::RunOptions::requests`]): a scenario with a `flow:` or `replicas:`
    /// section has a runner of its own, which keeps its own figures only.
    pub fn keeps_request_records(&self) -> bool {
        self.flow.is_none() && self.replicas.is_none()
    }

    /// Reads and validates a scenario file.
    pub fn from_file(path: &Path) -> Result<Self, BenchError> {
        let text = std::fs::read_to_string(path).map_err(|source| BenchError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// Parses and validates a scenario; `origin` names it in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, BenchError> {
        let de = serde_yaml::Deserializer::from_str(text);
        let scenario: Scenario =
            serde_path_to_error::deserialize(de).map_err(|e| BenchError::Parse {
                origin: origin.to_owned(),
                field: match e.path().to_string().as_str() {
                    "." => "(top level)".to_owned(),
                    p => p.to_owned(),
                },
                source: e.into_inner(),
            })?;
        scenario.validate(origin)?;
        Ok(scenario)
    }

    /// Checks every value; the error names the field.
    pub fn validate(&self, origin: &str) -> Result<(), BenchError> {
        let bad = |field: &str, reason: String| {
            Err(BenchError::Invalid {
                origin: origin.to_owned(),
                field: field.to_owned(),
                reason,
            })
        };
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return bad(
                "name",
                "must be non-empty letters, digits, '-' or '_'".into(),
            );
        }
        if self.fleet.is_empty() {
            return bad("fleet", "must list at least one pod group".into());
        }
        for (i, g) in self.fleet.iter().enumerate() {
            if g.replicas == 0 {
                return bad(&format!("fleet[{i}].replicas"), "must be at least 1".into());
            }
            for (j, step) in g.faults.iter().enumerate() {
                let at = |f: &str| format!("fleet[{i}].faults[{j}].{f}");
                if let Some((field, why)) = step.invalid_field() {
                    return bad(&at(field), why);
                }
                // The simulation models no hanging pod or broken page; a scenario means the same
                // thing in both modes.
                if step.hang.is_some() {
                    return bad(
                        &at("hang"),
                        "is a fault of `infergate sim` fleets only; a scenario's faults are \
                         error_rate and slowdown"
                            .into(),
                    );
                }
                if step.metrics.is_some() {
                    return bad(
                        &at("metrics"),
                        "is a fault of `infergate sim` fleets only (for stale metrics in a \
                         scenario, see `stale:`)"
                            .into(),
                    );
                }
            }
            if !g.faults.is_empty() && (self.flow.is_some() || self.replicas.is_some()) {
                return bad(
                    &format!("fleet[{i}].faults"),
                    "run in scenarios without a `flow:` or `replicas:` section only".into(),
                );
            }
        }
        if self.retries.max_attempts == 0 {
            return bad(
                "retries.maxAttempts",
                "must be at least 1 (1 = no retry)".into(),
            );
        }
        let w = &self.workload;
        if !(w.duration_s.is_finite() && w.duration_s > 0.0 && w.duration_s <= 86_400.0) {
            return bad(
                "workload.duration_s",
                format!("must be in (0, 86400], got {}", w.duration_s),
            );
        }
        check_arrival(&w.arrival).or_else(|(f, r)| bad(&format!("workload.arrival{f}"), r))?;
        for (field, d) in [
            ("workload.prompt_tokens", &w.prompt_tokens),
            ("workload.output_tokens", &w.output_tokens),
        ] {
            check_dist(d).or_else(|(sub, reason)| bad(&format!("{field}.{sub}"), reason))?;
        }
        if let Some(p) = &w.prefix {
            if p.groups == 0 {
                return bad("workload.prefix.groups", "must be at least 1".into());
            }
            if p.tokens == 0 {
                return bad("workload.prefix.tokens", "must be at least 1".into());
            }
            fraction(p.fraction).or_else(|r| bad("workload.prefix.fraction", r))?;
            zipf(p.zipf).or_else(|r| bad("workload.prefix.zipf", r))?;
        }
        if let Some(l) = &w.lora {
            if l.adapters.is_empty() {
                return bad("workload.lora.adapters", "must name at least one".into());
            }
            fraction(l.fraction).or_else(|r| bad("workload.lora.fraction", r))?;
            zipf(l.zipf).or_else(|r| bad("workload.lora.zipf", r))?;
            for (i, a) in l.adapters.iter().enumerate() {
                if !self.fleet.iter().any(|g| g.lora_adapters.contains(a)) {
                    return bad(
                        &format!("workload.lora.adapters[{i}]"),
                        format!("names {a:?}, which no pod group serves"),
                    );
                }
            }
        }
        if let Some(p) = &w.priorities {
            check_mix(p).or_else(|(f, r)| bad(&format!("workload.priorities{f}"), r))?;
        }
        let mut names: Vec<&str> = Vec::new();
        for (i, t) in w.tenants.iter().enumerate() {
            let at = |f: &str| format!("workload.tenants[{i}].{f}");
            if t.name.is_empty() || names.contains(&t.name.as_str()) {
                return bad(
                    &at("name"),
                    format!("must be non-empty and unique, got {:?}", t.name),
                );
            }
            names.push(&t.name);
            if !(t.share.is_finite() && t.share > 0.0 && t.share <= 1e6) {
                return bad(
                    &at("share"),
                    format!("must be in (0, 1e6], got {}", t.share),
                );
            }
            if let Some(a) = &t.arrival {
                check_arrival(a).or_else(|(f, r)| bad(&format!("{}{f}", at("arrival")), r))?;
            }
            for (f, d) in [
                ("prompt_tokens", &t.prompt_tokens),
                ("output_tokens", &t.output_tokens),
            ] {
                if let Some(d) = d {
                    check_dist(d).or_else(|(sub, r)| bad(&format!("{}.{sub}", at(f)), r))?;
                }
            }
            if let Some(p) = &t.priorities {
                check_mix(p).or_else(|(f, r)| bad(&format!("{}{f}", at("priorities")), r))?;
                if t.priority.is_some() {
                    return bad(
                        &at("priorities"),
                        "give either priority or priorities".into(),
                    );
                }
            }
        }
        let s = &self.scrape;
        if !(s.interval_ms.is_finite() && s.interval_ms >= 1.0) {
            return bad(
                "scrape.interval_ms",
                format!("must be at least 1, got {}", s.interval_ms),
            );
        }
        if !(s.lag_ms.is_finite() && s.lag_ms >= 0.0) {
            return bad("scrape.lag_ms", format!("must be >= 0, got {}", s.lag_ms));
        }
        for (i, win) in self.stale.iter().enumerate() {
            if !(win.from_s.is_finite()
                && win.to_s.is_finite()
                && 0.0 <= win.from_s
                && win.from_s < win.to_s)
            {
                return bad(
                    &format!("stale[{i}]"),
                    format!(
                        "must have 0 <= from_s < to_s, got {} .. {}",
                        win.from_s, win.to_s
                    ),
                );
            }
        }
        if let Some(f) = &self.flow {
            if f.policies.is_empty() {
                return bad("flow.policies", "must list at least one policy".into());
            }
            if let Err(e) = f.config.validate() {
                // The scheduler names the gateway's `flowControl.…` keys; here they sit under
                // `flow.config`.
                let key = e.field.strip_prefix("flowControl.").unwrap_or(e.field);
                return bad(&format!("flow.config.{key}"), e.reason);
            }
            let r = &f.reference;
            if !(r.kv_cache > 0.0 && r.kv_cache <= 1.0) {
                return bad(
                    "flow.reference.kv_cache",
                    format!("must be in (0, 1], got {}", r.kv_cache),
                );
            }
            if !(r.staleness_ms.is_finite() && r.staleness_ms > 0.0) {
                return bad(
                    "flow.reference.staleness_ms",
                    format!("must be > 0, got {}", r.staleness_ms),
                );
            }
            if let Some(t) = f.saturation
                && !(t.kv_cache > 0.0 && t.kv_cache <= 1.0)
            {
                return bad(
                    "flow.saturation.kvCache",
                    format!("must be in (0, 1], got {}", t.kv_cache),
                );
            }
            let t = &f.targets;
            if let Some(iso) = &t.isolation {
                if !w.tenant_names().contains(&iso.tenant) {
                    return bad(
                        "flow.targets.isolation.tenant",
                        format!("names {:?}, which is not a tenant", iso.tenant),
                    );
                }
                if !(iso.max_ratio.is_finite() && iso.max_ratio >= 1.0) {
                    return bad(
                        "flow.targets.isolation.max_ratio",
                        format!("must be >= 1, got {}", iso.max_ratio),
                    );
                }
            }
            for (field, v) in [
                ("flow.targets.critical_vs_unloaded", t.critical_vs_unloaded),
                ("flow.targets.stale_vs_direct", t.stale_vs_direct),
            ] {
                if let Some(v) = v
                    && !(v.is_finite() && v >= 1.0)
                {
                    return bad(field, format!("must be >= 1, got {v}"));
                }
            }
            if t.stale_vs_direct.is_some() && !self.stale.iter().any(|s| s.from_s < w.duration_s) {
                return bad(
                    "flow.targets.stale_vs_direct",
                    "needs a stale window that starts before the workload ends".into(),
                );
            }
            let critical = |m: Option<&PriorityMix>| m.is_some_and(|m| m.critical > 0.0);
            let has_critical = if w.tenants.is_empty() {
                critical(w.priorities.as_ref())
            } else {
                w.tenants.iter().any(|t| match t.priority {
                    Some(p) => p == Priority::Critical,
                    None => critical(t.priorities.as_ref().or(w.priorities.as_ref())),
                })
            };
            if t.critical_vs_unloaded.is_some() && !has_critical {
                return bad(
                    "flow.targets.critical_vs_unloaded",
                    "needs Critical requests in the workload".into(),
                );
            }
        }
        if let Some(r) = &self.replicas {
            if self.flow.is_some() {
                return bad("replicas", "cannot be combined with `flow`".into());
            }
            if let Err((field, reason)) = r.validate() {
                return bad(field, reason);
            }
        }
        if self.seeds.is_empty() {
            return bad("seeds", "must list at least one seed".into());
        }
        if let Some((i, seed)) = first_repeat(&self.seeds) {
            return bad(
                &format!("seeds[{i}]"),
                format!(
                    "seed {seed} is listed twice: the same seed gives the same arrivals, and a \
                     repeat would weigh its run twice in the means"
                ),
            );
        }
        if self.policies.is_empty() {
            return bad("policies", "must list at least one policy".into());
        }
        let names: Vec<&str> = self.policies.iter().map(RoutePolicy::as_str).collect();
        if let Some((i, policy)) = first_repeat(&names) {
            return bad(
                &format!("policies[{i}]"),
                format!("policy {policy} is listed twice"),
            );
        }
        for (i, p) in self.policies.iter().enumerate() {
            if !p.is_entry() {
                continue;
            }
            let name = p.as_str();
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                // It names report rows and request files.
                return bad(
                    &format!("policies[{i}].name"),
                    format!("must be non-empty letters, digits, '-' or '_', got {name:?}"),
                );
            }
            if let Some(Some(o)) = &p.outlier_detection
                && let Err(e) = o.validate()
            {
                return bad(&format!("policies[{i}].{}", e.field), e.reason);
            }
            if self.flow.is_some() || self.replicas.is_some() {
                return bad(
                    &format!("policies[{i}]"),
                    "a policy entry runs in scenarios without a `flow:` or `replicas:` section \
                     only"
                        .into(),
                );
            }
        }
        if let Some(i) = self.policies.iter().position(|p| p.precise)
            && self.flow.is_some()
        {
            return bad(
                &format!("policies[{i}]"),
                "infergate-precise does not run in flow-control scenarios (no `flow` section)"
                    .into(),
            );
        }
        if !(self.kv_events.lag_ms.is_finite() && self.kv_events.lag_ms >= 0.0) {
            return bad(
                "kv_events.lag_ms",
                format!("must be >= 0, got {}", self.kv_events.lag_ms),
            );
        }
        for (f, v) in [
            (
                "targets.ttft_p95_reduction",
                self.targets.ttft_p95_reduction,
            ),
            (
                "targets.ttft_p99_reduction",
                self.targets.ttft_p99_reduction,
            ),
        ] {
            if let Some(v) = v
                && !(0.0..1.0).contains(&v)
            {
                return bad(f, format!("must be a fraction in [0, 1), got {v}"));
            }
        }
        if let Some(m) = self.targets.floor_multiple
            && !(m.is_finite() && m >= 1.0)
        {
            return bad("targets.floor_multiple", format!("must be >= 1, got {m}"));
        }
        Ok(())
    }

    /// Multiplies every arrival rate by `factor` (a load sweep on one scenario).
    pub fn scale_load(&mut self, factor: f64) {
        self.workload.arrival.scale(factor);
        for t in &mut self.workload.tenants {
            if let Some(a) = &mut t.arrival {
                a.scale(factor);
            }
        }
    }

    /// Resolves the fleet against the simulator's profile catalog.
    pub fn fleet_spec(&self, catalog: &Catalog, origin: &str) -> Result<FleetSpec, BenchError> {
        let mut pods = Vec::new();
        for (i, g) in self.fleet.iter().enumerate() {
            let profile = catalog
                .get(&g.profile)
                .map_err(|source| BenchError::Fleet {
                    origin: origin.to_owned(),
                    field: format!("fleet[{i}].profile"),
                    source,
                })?;
            for r in 0..g.replicas {
                let name = if g.replicas == 1 {
                    g.name.clone()
                } else {
                    format!("{}-{r}", g.name)
                };
                let mut pod = PodSpec::new(name, profile, g.engine);
                pod.lora_adapters = g.lora_adapters.iter().map(|a| a.as_str().into()).collect();
                pod.max_loras = g.max_loras.unwrap_or(profile.max_loras);
                if let Some(m) = &g.served_model_name {
                    pod.model = m.as_str().into();
                }
                (pod.faults, pod.fault_script) = Faults::scripted(&g.faults);
                pods.push(pod);
            }
        }
        let models: Vec<&str> = pods.iter().map(|p| &*p.model).collect();
        if let Some(other) = models.iter().find(|m| **m != models[0]) {
            return Err(BenchError::Invalid {
                origin: origin.to_owned(),
                field: "fleet".to_owned(),
                reason: format!(
                    "mixes models ({} and {other}); one scenario is one pool serving one base model",
                    models[0]
                ),
            });
        }
        let spec = FleetSpec { seed: 0, pods }
            .finish()
            .map_err(|source| BenchError::Fleet {
                origin: origin.to_owned(),
                field: "fleet".to_owned(),
                source,
            })?;
        let (max_prompt, max_output) = self.workload.max_lengths();
        for (i, g) in self.fleet.iter().enumerate() {
            if let Ok(p) = catalog.get(&g.profile) {
                let limit = p
                    .max_model_len
                    .min(u32::try_from(p.kv_capacity_tokens).unwrap_or(u32::MAX));
                if max_prompt.saturating_add(max_output) > limit {
                    return Err(BenchError::Invalid {
                        origin: origin.to_owned(),
                        field: format!("fleet[{i}].profile"),
                        reason: format!(
                            "{} holds at most {limit} tokens per request, but the workload's prompts and outputs reach {}",
                            g.profile,
                            max_prompt.saturating_add(max_output)
                        ),
                    });
                }
            }
        }
        Ok(spec)
    }
}

/// Checks an arrival process; the error's field is relative (`.rate`, `.burst_s`, or empty).
fn check_arrival(a: &ArrivalProcess) -> Result<(), (String, String)> {
    let rates: &[(&str, f64)] = match a {
        ArrivalProcess::Poisson { rate } => &[("rate", *rate)],
        ArrivalProcess::Bursty {
            base_rate,
            burst_rate,
            burst_s,
            period_s,
        } => {
            if !(period_s.is_finite() && *period_s > 0.0) {
                return Err((".period_s".into(), format!("must be > 0, got {period_s}")));
            }
            if !(burst_s.is_finite() && *burst_s > 0.0 && burst_s <= period_s) {
                return Err((
                    ".burst_s".into(),
                    format!("must be in (0, period_s], got {burst_s}"),
                ));
            }
            &[("base_rate", *base_rate), ("burst_rate", *burst_rate)]
        }
        ArrivalProcess::Ramp { from_rate, to_rate } => {
            &[("from_rate", *from_rate), ("to_rate", *to_rate)]
        }
    };
    for (f, r) in rates {
        if !(r.is_finite() && *r >= 0.0 && *r <= 1e6) {
            return Err((
                format!(".{f}"),
                format!("must be a rate in [0, 1e6] requests/s, got {r}"),
            ));
        }
    }
    if rates.iter().all(|(_, r)| *r == 0.0) {
        return Err((String::new(), "has no positive rate".into()));
    }
    Ok(())
}

/// Checks a priority mix; the error's field is relative.
fn check_mix(p: &PriorityMix) -> Result<(), (String, String)> {
    fraction(p.critical).map_err(|r| (".critical".to_owned(), r))?;
    fraction(p.sheddable).map_err(|r| (".sheddable".to_owned(), r))?;
    if p.critical + p.sheddable > 1.0 {
        return Err((
            String::new(),
            "critical + sheddable must not exceed 1".into(),
        ));
    }
    Ok(())
}

fn check_dist(d: &LengthDist) -> Result<(), (&'static str, String)> {
    match d {
        LengthDist::Fixed { value } => {
            if *value == 0 {
                return Err(("value", "must be at least 1".into()));
            }
        }
        LengthDist::Uniform { min, max } => {
            if *min == 0 {
                return Err(("min", "must be at least 1".into()));
            }
            if max < min {
                return Err(("max", format!("must be >= min ({min}), got {max}")));
            }
        }
        LengthDist::Lognormal {
            median,
            sigma,
            min,
            max,
        } => {
            if !(median.is_finite() && *median >= 1.0) {
                return Err(("median", format!("must be >= 1, got {median}")));
            }
            if !(sigma.is_finite() && *sigma >= 0.0 && *sigma <= 5.0) {
                return Err(("sigma", format!("must be in [0, 5], got {sigma}")));
            }
            if *min == 0 {
                return Err(("min", "must be at least 1".into()));
            }
            if max < min {
                return Err(("max", format!("must be >= min ({min}), got {max}")));
            }
        }
    }
    if d.max() > 1_000_000 {
        return Err(("max", "must be at most 1000000 tokens".into()));
    }
    Ok(())
}

fn fraction(v: f64) -> Result<(), String> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(format!("must be a fraction in [0, 1], got {v}"))
    }
}

fn zipf(v: f64) -> Result<(), String> {
    if v.is_finite() && (0.0..=4.0).contains(&v) {
        Ok(())
    } else {
        Err(format!("must be in [0, 4], got {v}"))
    }
}

#[cfg(test)]
mod tests;
