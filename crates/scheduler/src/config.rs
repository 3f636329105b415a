//! Scheduler configuration: serde types, named presets and validation.
//!
//! A configuration starts from a preset (`preset: infergate` by default) and overrides any part
//! of it. `weights`, when given, replace the preset's weights as a whole: a scorer left out of an
//! explicit `weights` map has weight 0.
//!
//! ```
//! use infergate_scheduler::{Policy, Preset, SchedulerConfig};
//! let cfg: SchedulerConfig = serde_yaml::from_str("preset: gie-default\nreturnedEndpoints: 2\n").unwrap();
//! assert_eq!(cfg.preset, Preset::GieDefault);
//! assert_eq!(cfg.weights.prefix, 3.0);
//! assert_eq!(cfg.returned_endpoints, 2);
//! cfg.validate().unwrap();
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::decision::MAX_RETURNED;
use crate::error::{ConfigError, UnknownPresetError};
use crate::outlier::OutlierDetection;

/// A named starting point for a configuration.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// infergate's default: learned-rate estimated wait first, with prefix, LoRA, KV and queue
    /// scorers, freshness filtering, in-flight accounting and priority shedding.
    #[default]
    Infergate,
    /// The Gateway API Inference Extension default scorer set: queue 2, kv-cache 2, prefix 3, with
    /// the reference formulas, scoring on scraped metrics only (no in-flight accounting), stale pods
    /// kept as candidates.
    GieDefault,
    /// Baseline: next endpoint in turn.
    RoundRobin,
    /// Baseline: uniformly random endpoint (seeded).
    Random,
    /// Baseline: fewest requests in flight from this gateway.
    LeastRequest,
}

impl Preset {
    /// Every preset, in a stable order.
    pub const ALL: [Preset; 5] = [
        Preset::Infergate,
        Preset::GieDefault,
        Preset::RoundRobin,
        Preset::Random,
        Preset::LeastRequest,
    ];

    /// The name used in configuration and reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            Preset::Infergate => "infergate",
            Preset::GieDefault => "gie-default",
            Preset::RoundRobin => "round-robin",
            Preset::Random => "random",
            Preset::LeastRequest => "least-request",
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Preset {
    type Err = UnknownPresetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Preset::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownPresetError(s.to_owned()))
    }
}

/// How the final choice is made.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Filters, then Σ weight·score, then the highest total (seeded random tie-breaks).
    Scored,
    /// Next endpoint in turn; ignores scorers.
    RoundRobin,
    /// Uniformly random; ignores scorers.
    Random,
    /// Fewest gateway in-flight requests (seeded random tie-breaks); ignores scorers.
    LeastRequest,
}

impl Policy {
    /// The name used in configuration and explanations.
    pub const fn as_str(self) -> &'static str {
        match self {
            Policy::Scored => "scored",
            Policy::RoundRobin => "round-robin",
            Policy::Random => "random",
            Policy::LeastRequest => "least-request",
        }
    }
}

/// Weight of each scorer in Σ weight·score. 0 removes a scorer (it is not even evaluated).
#[derive(Copy, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Weights {
    /// Queue depth, min-max over candidates.
    pub queue: f64,
    /// KV-cache headroom, 1 − use.
    pub kv_cache: f64,
    /// Prefix affinity, matched blocks / prompt blocks.
    pub prefix: f64,
    /// LoRA affinity: 1.0 running, 0.8 free slot, 0.6 waiting, 0 otherwise.
    pub lora_affinity: f64,
    /// Running requests, min-max over candidates.
    pub running_requests: f64,
    /// Estimated tokens in flight from this gateway, min-max over candidates.
    pub inflight_tokens: f64,
    /// Estimated time to first token from learned per-pod rates, best / own.
    pub estimated_wait: f64,
}

impl Weights {
    /// The weights as (YAML field path, value) pairs, in scorer order.
    pub fn fields(&self) -> [(&'static str, f64); 7] {
        [
            ("weights.queue", self.queue),
            ("weights.kvCache", self.kv_cache),
            ("weights.prefix", self.prefix),
            ("weights.loraAffinity", self.lora_affinity),
            ("weights.runningRequests", self.running_requests),
            ("weights.inflightTokens", self.inflight_tokens),
            ("weights.estimatedWait", self.estimated_wait),
        ]
    }
}

/// What to do when the filters leave no candidate.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllFilteredAction {
    /// Reject with [`Rejection::NoEndpoints`](crate::Rejection::NoEndpoints) (HTTP 503).
    Reject,
    /// Relax the LoRA filter and score every endpoint with fresh metrics (still within the subset
    /// hint, which is never relaxed). Freshness is never relaxed either: when no candidate has
    /// fresh metrics the pick is [`Rejection::Unavailable`](crate::Rejection::Unavailable) (503
    /// with `Retry-After`) whatever this setting, because a pod whose scrapes fail is most likely
    /// down and routing to it turns an outage into upstream errors.
    AllReady,
}

/// What a pick does when no candidate has fresh metrics.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StaleMode {
    /// Reject with [`Rejection::Unavailable`](crate::Rejection::Unavailable) (503 with
    /// `Retry-After`), as the reference endpoint picker does.
    FailClosed,
    /// Keep dispatching to the pods that still answer (their scrapes reach the server but bring
    /// no usable page: a stalled, erroring or garbled `/metrics`) on this gateway's in-flight
    /// accounting alone — least in flight first, prefix and LoRA affinity breaking ties — with at
    /// most `maxInflightPerEndpoint` requests on each. Unreachable pods stay removed. Also
    /// when pods are fresh but every one would shed the request (a queueing request excepted).
    FailOpen,
}

/// Stale-metrics behaviour (`staleMetrics:`). Applies only with the freshness filter on
/// (`maxMetricsAgeMs` set): without it stale pods are routed on their last numbers anyway.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct StaleMetrics {
    /// `failOpen` (the `infergate` preset's default) or `failClosed`.
    pub mode: StaleMode,
    /// In fail-open, this gateway's requests in flight on one pod beyond which it takes no more:
    /// one more request than the pods can take is shed (429 with `Retry-After`). At least 1.
    pub max_inflight_per_endpoint: u32,
}

impl Default for StaleMetrics {
    fn default() -> Self {
        StaleMetrics {
            mode: StaleMode::FailOpen,
            max_inflight_per_endpoint: 32,
        }
    }
}

impl StaleMetrics {
    /// The per-pod cap when fail-open is on.
    pub fn fail_open_cap(&self) -> Option<u32> {
        (self.mode == StaleMode::FailOpen).then_some(self.max_inflight_per_endpoint)
    }
}

/// Load levels at which an endpoint counts as saturated or overloaded. An endpoint is at or over a
/// level when its queue depth reaches `queueDepth` or its KV-cache use reaches `kvCache`.
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Thresholds {
    /// Waiting requests (engine queue plus requests routed since the last scrape).
    pub queue_depth: u32,
    /// KV-cache use fraction in (0, 1].
    pub kv_cache: f64,
}

/// Approximate prefix index settings.
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct PrefixConfig {
    /// Bytes of prompt text per block (the reference uses 64 characters).
    pub block_chars: u32,
    /// Blocks hashed per request; text beyond `blockChars × maxBlocks` is ignored.
    pub max_blocks: u32,
    /// Upper bound on the index's memory, in bytes, across all endpoints.
    pub byte_budget: u64,
    /// Per-endpoint capacity in blocks when the engine does not report its cache size.
    pub default_endpoint_blocks: u32,
    /// Characters per token, used to turn the engine's KV capacity (tokens) into blocks.
    pub chars_per_token: f64,
}

impl Default for PrefixConfig {
    fn default() -> Self {
        PrefixConfig {
            block_chars: 64,
            max_blocks: 256,
            byte_budget: 64 << 20,
            default_endpoint_blocks: 31_250,
            chars_per_token: 4.0,
        }
    }
}

/// Priors and smoothing for the learned per-endpoint rates.
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RateConfig {
    /// Prefill rate assumed before anything is learned, in tokens per second.
    pub prefill_tokens_per_sec: f64,
    /// Per-request decode rate assumed before anything is learned, in tokens per second.
    pub decode_tokens_per_sec: f64,
    /// Floor of the EWMA weight of a new sample (early samples are averaged with weight 1/n).
    pub min_alpha: f64,
    /// Time a pod takes to load a requested LoRA adapter it does not hold (a free slot, or the
    /// adapter only waiting there), in milliseconds, added to its estimated wait. Without it, two
    /// idle pods differ only by a few milliseconds of learned prefill speed, and that noise
    /// outweighed adapter affinity: requests for an adapter running on one pod went to another
    /// that had to load it.
    pub lora_load_ms: f64,
}

impl Default for RateConfig {
    fn default() -> Self {
        RateConfig {
            prefill_tokens_per_sec: 4_000.0,
            decode_tokens_per_sec: 40.0,
            min_alpha: 0.1,
            lora_load_ms: 50.0,
        }
    }
}

/// The scheduler's complete configuration. Deserialise it from YAML/JSON (every key optional,
/// starting from `preset`), or start from [`SchedulerConfig::preset`] in code.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "ConfigSpec", into = "ConfigSpec")]
pub struct SchedulerConfig {
    /// The preset this configuration started from.
    pub preset: Preset,
    /// How the final choice is made.
    pub policy: Policy,
    /// Scorer weights (used by [`Policy::Scored`]).
    pub weights: Weights,
    /// Endpoints returned per pick: first choice plus fallbacks (1..=8; default 3).
    pub returned_endpoints: u8,
    /// Scored policy, pools of more than four times this many candidates: each pick scores a
    /// random sample of this many endpoints per GPU type, plus up to this many of the endpoints
    /// holding the prompt's prefix or the request's adapter (the best first), and falls back to
    /// all candidates when the sample cannot take the request, holds only saturated endpoints or
    /// has clear endpoints held back for the headroom reserve. 0 scores every candidate
    /// (default 16).
    pub candidate_sample: u32,
    /// Endpoints whose metrics are older than this are not candidates; `None` keeps stale pods.
    pub max_metrics_age: Option<Duration>,
    /// What happens when the filters leave no candidate.
    pub on_all_filtered: AllFilteredAction,
    /// What happens when no candidate has fresh metrics but some still answer (and when every
    /// fresh candidate would shed the request).
    pub stale_metrics: StaleMetrics,
    /// Passive outlier detection: endpoints whose answers keep failing leave the candidates for
    /// a while ([`crate::outlier`]); `None` is off. On with its defaults in the `infergate`
    /// preset, whose load-aware scores would otherwise send most requests to a pod that fails
    /// them at once (it looks idle); off in the baselines.
    pub outlier_detection: Option<OutlierDetection>,
    /// Whether the LoRA capability filter runs (requests naming an adapter only).
    pub lora_filter: bool,
    /// Load at which an endpoint is saturated: removed while unsaturated endpoints remain, and
    /// Sheddable requests are shed when every candidate is saturated.
    pub saturation: Thresholds,
    /// Load at which an endpoint is overloaded: Standard requests are shed when every candidate is.
    pub overload: Thresholds,
    /// Whether requests are ever shed (429). Critical requests never are.
    pub shedding: bool,
    /// Bounds of the `Retry-After` derived from the pool's estimated drain time.
    pub retry_after_min: Duration,
    /// See `retry_after_min`.
    pub retry_after_max: Duration,
    /// Whether scorers and the saturation check add this gateway's requests routed since the last
    /// scrape to the scraped numbers (so picks between two scrapes see each other).
    pub inflight_accounting: bool,
    /// Prefix index settings.
    pub prefix: PrefixConfig,
    /// Learned-rate settings.
    pub rates: RateConfig,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig::preset(Preset::Infergate)
    }
}

impl SchedulerConfig {
    /// The configuration a preset stands for.
    pub fn preset(preset: Preset) -> Self {
        let base = SchedulerConfig {
            preset,
            policy: Policy::Scored,
            weights: Weights {
                queue: 1.0,
                kv_cache: 1.0,
                prefix: 3.0,
                lora_affinity: 2.0,
                running_requests: 0.0,
                inflight_tokens: 0.0,
                estimated_wait: 6.0,
            },
            returned_endpoints: 3,
            candidate_sample: 16,
            max_metrics_age: Some(Duration::from_secs(2)),
            on_all_filtered: AllFilteredAction::AllReady,
            stale_metrics: StaleMetrics::default(),
            outlier_detection: Some(OutlierDetection::default()),
            lora_filter: true,
            saturation: Thresholds {
                queue_depth: 16,
                kv_cache: 0.95,
            },
            overload: Thresholds {
                queue_depth: 64,
                kv_cache: 0.99,
            },
            shedding: true,
            retry_after_min: Duration::from_secs(1),
            retry_after_max: Duration::from_secs(60),
            inflight_accounting: true,
            prefix: PrefixConfig::default(),
            rates: RateConfig::default(),
        };
        let baseline = |policy| SchedulerConfig {
            policy,
            weights: Weights::default(),
            max_metrics_age: None,
            outlier_detection: None,
            lora_filter: false,
            shedding: false,
            ..base.clone()
        };
        match preset {
            Preset::Infergate => base,
            Preset::GieDefault => SchedulerConfig {
                weights: Weights {
                    queue: 2.0,
                    kv_cache: 2.0,
                    prefix: 3.0,
                    ..Weights::default()
                },
                max_metrics_age: None,
                saturation: Thresholds {
                    queue_depth: 5,
                    kv_cache: 0.8,
                },
                overload: Thresholds {
                    queue_depth: 5,
                    kv_cache: 0.8,
                },
                shedding: false,
                inflight_accounting: false,
                outlier_detection: None,
                ..base
            },
            Preset::RoundRobin => baseline(Policy::RoundRobin),
            Preset::Random => baseline(Policy::Random),
            Preset::LeastRequest => baseline(Policy::LeastRequest),
        }
    }

    /// Checks every value; the error names the offending field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, w) in self.weights.fields() {
            if !w.is_finite() || w < 0.0 {
                return Err(ConfigError::new(
                    field,
                    format!("must be a finite number >= 0, got {w}"),
                ));
            }
        }
        if self.policy == Policy::Scored && self.weights.fields().iter().all(|(_, w)| *w == 0.0) {
            return Err(ConfigError::new(
                "weights",
                "must give at least one scorer a weight above 0 for the scored policy",
            ));
        }
        if self.returned_endpoints == 0 || usize::from(self.returned_endpoints) > MAX_RETURNED {
            return Err(ConfigError::new(
                "returnedEndpoints",
                format!(
                    "must be between 1 and {MAX_RETURNED}, got {}",
                    self.returned_endpoints
                ),
            ));
        }
        if self.max_metrics_age == Some(Duration::ZERO) {
            return Err(ConfigError::new(
                "maxMetricsAgeMs",
                "must be above 0 (leave it out to keep stale endpoints)",
            ));
        }
        if let Some(o) = &self.outlier_detection {
            o.validate()?;
        }
        if self.stale_metrics.max_inflight_per_endpoint == 0 {
            return Err(ConfigError::new(
                "staleMetrics.maxInflightPerEndpoint",
                "must be at least 1 (set `mode: failClosed` to stop dispatching on stale metrics)",
            ));
        }
        check_thresholds(
            &self.saturation,
            "saturation.queueDepth",
            "saturation.kvCache",
        )?;
        check_thresholds(&self.overload, "overload.queueDepth", "overload.kvCache")?;
        if self.overload.queue_depth < self.saturation.queue_depth {
            return Err(ConfigError::new(
                "overload.queueDepth",
                "must be at least saturation.queueDepth",
            ));
        }
        if self.overload.kv_cache < self.saturation.kv_cache {
            return Err(ConfigError::new(
                "overload.kvCache",
                "must be at least saturation.kvCache",
            ));
        }
        if self.retry_after_min < Duration::from_secs(1) {
            return Err(ConfigError::new("retryAfterMinMs", "must be at least 1000"));
        }
        if self.retry_after_max < self.retry_after_min {
            return Err(ConfigError::new(
                "retryAfterMaxMs",
                "must be at least retryAfterMinMs",
            ));
        }
        let p = &self.prefix;
        if !(8..=4096).contains(&p.block_chars) {
            return Err(ConfigError::new(
                "prefix.blockChars",
                format!("must be between 8 and 4096, got {}", p.block_chars),
            ));
        }
        if !(1..=4096).contains(&p.max_blocks) {
            return Err(ConfigError::new(
                "prefix.maxBlocks",
                format!("must be between 1 and 4096, got {}", p.max_blocks),
            ));
        }
        if p.byte_budget < 4096 {
            return Err(ConfigError::new(
                "prefix.byteBudget",
                format!("must be at least 4096 bytes, got {}", p.byte_budget),
            ));
        }
        if p.default_endpoint_blocks == 0 {
            return Err(ConfigError::new(
                "prefix.defaultEndpointBlocks",
                "must be above 0",
            ));
        }
        if !p.chars_per_token.is_finite() || p.chars_per_token <= 0.0 {
            return Err(ConfigError::new(
                "prefix.charsPerToken",
                "must be a finite number above 0",
            ));
        }
        let r = &self.rates;
        for (field, v) in [
            ("rates.prefillTokensPerSec", r.prefill_tokens_per_sec),
            ("rates.decodeTokensPerSec", r.decode_tokens_per_sec),
        ] {
            if !v.is_finite() || v <= 0.0 {
                return Err(ConfigError::new(
                    field,
                    format!("must be a finite number above 0, got {v}"),
                ));
            }
        }
        if !r.lora_load_ms.is_finite() || r.lora_load_ms < 0.0 {
            return Err(ConfigError::new(
                "rates.loraLoadMs",
                format!(
                    "must be a finite number of at least 0, got {}",
                    r.lora_load_ms
                ),
            ));
        }
        if !(r.min_alpha > 0.0 && r.min_alpha <= 1.0) {
            return Err(ConfigError::new(
                "rates.minAlpha",
                format!("must be in (0, 1], got {}", r.min_alpha),
            ));
        }
        Ok(())
    }
}

fn check_thresholds(
    t: &Thresholds,
    queue_field: &'static str,
    kv_field: &'static str,
) -> Result<(), ConfigError> {
    if t.queue_depth == 0 {
        return Err(ConfigError::new(queue_field, "must be at least 1"));
    }
    if !(t.kv_cache > 0.0 && t.kv_cache <= 1.0) {
        return Err(ConfigError::new(
            kv_field,
            format!("must be in (0, 1], got {}", t.kv_cache),
        ));
    }
    Ok(())
}

/// The on-disk shape: a preset plus optional overrides. Durations are in milliseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct ConfigSpec {
    preset: Preset,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<Policy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    weights: Option<Weights>,
    #[serde(skip_serializing_if = "Option::is_none")]
    returned_endpoints: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    candidate_sample: Option<u32>,
    /// `Some(None)` (explicit `null`) disables the freshness filter.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    max_metrics_age_ms: Option<Option<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    on_all_filtered: Option<AllFilteredAction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stale_metrics: Option<StaleMetrics>,
    /// `Some(None)` (explicit `null`) turns it off.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "double_option"
    )]
    outlier_detection: Option<Option<OutlierDetection>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lora_filter: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    saturation: Option<Thresholds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    overload: Option<Thresholds>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shedding: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_min_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_max_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inflight_accounting: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prefix: Option<PrefixConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rates: Option<RateConfig>,
}

/// A field whose explicit `null` means something (off) apart from its absence (the preset's):
/// `Option<Option<T>>` with `#[serde(default, skip_serializing_if = "Option::is_none", with =
/// "infergate_scheduler::config::double_option")]` reads a present `null` as `Some(None)` and
/// writes it back as `null`.
pub mod double_option {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    /// Writes `Some(None)` as `null`.
    pub fn serialize<S: Serializer, T: Serialize>(
        v: &Option<Option<T>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        v.as_ref().and_then(Option::as_ref).serialize(s)
    }

    /// Reads a present value, `null` included, as `Some`.
    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(d).map(Some)
    }
}

impl From<ConfigSpec> for SchedulerConfig {
    fn from(s: ConfigSpec) -> Self {
        let mut c = SchedulerConfig::preset(s.preset);
        if let Some(v) = s.policy {
            c.policy = v;
        }
        if let Some(v) = s.weights {
            c.weights = v;
        }
        if let Some(v) = s.returned_endpoints {
            c.returned_endpoints = v;
        }
        if let Some(v) = s.candidate_sample {
            c.candidate_sample = v;
        }
        if let Some(v) = s.max_metrics_age_ms {
            c.max_metrics_age = v.map(Duration::from_millis);
        }
        if let Some(v) = s.on_all_filtered {
            c.on_all_filtered = v;
        }
        if let Some(v) = s.stale_metrics {
            c.stale_metrics = v;
        }
        if let Some(v) = s.outlier_detection {
            c.outlier_detection = v;
        }
        if let Some(v) = s.lora_filter {
            c.lora_filter = v;
        }
        if let Some(v) = s.saturation {
            c.saturation = v;
        }
        if let Some(v) = s.overload {
            c.overload = v;
        }
        if let Some(v) = s.shedding {
            c.shedding = v;
        }
        if let Some(v) = s.retry_after_min_ms {
            c.retry_after_min = Duration::from_millis(v);
        }
        if let Some(v) = s.retry_after_max_ms {
            c.retry_after_max = Duration::from_millis(v);
        }
        if let Some(v) = s.inflight_accounting {
            c.inflight_accounting = v;
        }
        if let Some(v) = s.prefix {
            c.prefix = v;
        }
        if let Some(v) = s.rates {
            c.rates = v;
        }
        c
    }
}

impl From<SchedulerConfig> for ConfigSpec {
    fn from(c: SchedulerConfig) -> Self {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        ConfigSpec {
            preset: c.preset,
            policy: Some(c.policy),
            weights: Some(c.weights),
            returned_endpoints: Some(c.returned_endpoints),
            candidate_sample: Some(c.candidate_sample),
            max_metrics_age_ms: Some(c.max_metrics_age.map(ms)),
            on_all_filtered: Some(c.on_all_filtered),
            stale_metrics: Some(c.stale_metrics),
            outlier_detection: Some(c.outlier_detection),
            lora_filter: Some(c.lora_filter),
            saturation: Some(c.saturation),
            overload: Some(c.overload),
            shedding: Some(c.shedding),
            retry_after_min_ms: Some(ms(c.retry_after_min)),
            retry_after_max_ms: Some(ms(c.retry_after_max)),
            inflight_accounting: Some(c.inflight_accounting),
            prefix: Some(c.prefix),
            rates: Some(c.rates),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
