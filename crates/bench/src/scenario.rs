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

use std::path::Path;

use infergate_scheduler::Preset;
use infergate_sim::{Catalog, EngineKind, FleetSpec, PodSpec};
use serde::{Deserialize, Serialize};

use crate::BenchError;

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
    /// Policies compared (scheduler presets). Round-robin is the baseline of the report.
    #[serde(default = "default_policies")]
    pub policies: Vec<Preset>,
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

fn default_seeds() -> Vec<u64> {
    vec![1, 2, 3]
}

fn default_policies() -> Vec<Preset> {
    vec![
        Preset::RoundRobin,
        Preset::Random,
        Preset::LeastRequest,
        Preset::GieDefault,
        Preset::Infergate,
    ]
}

impl Scenario {
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
        }
        let w = &self.workload;
        if !(w.duration_s.is_finite() && w.duration_s > 0.0 && w.duration_s <= 86_400.0) {
            return bad(
                "workload.duration_s",
                format!("must be in (0, 86400], got {}", w.duration_s),
            );
        }
        let rates: &[(&str, f64)] = match &w.arrival {
            ArrivalProcess::Poisson { rate } => &[("rate", *rate)],
            ArrivalProcess::Bursty {
                base_rate,
                burst_rate,
                burst_s,
                period_s,
            } => {
                if !(period_s.is_finite() && *period_s > 0.0) {
                    return bad(
                        "workload.arrival.period_s",
                        format!("must be > 0, got {period_s}"),
                    );
                }
                if !(burst_s.is_finite() && *burst_s > 0.0 && burst_s <= period_s) {
                    return bad(
                        "workload.arrival.burst_s",
                        format!("must be in (0, period_s], got {burst_s}"),
                    );
                }
                &[("base_rate", *base_rate), ("burst_rate", *burst_rate)]
            }
            ArrivalProcess::Ramp { from_rate, to_rate } => {
                &[("from_rate", *from_rate), ("to_rate", *to_rate)]
            }
        };
        for (f, r) in rates {
            if !(r.is_finite() && *r >= 0.0 && *r <= 1e6) {
                return bad(
                    &format!("workload.arrival.{f}"),
                    format!("must be a rate in [0, 1e6] requests/s, got {r}"),
                );
            }
        }
        if rates.iter().all(|(_, r)| *r == 0.0) {
            return bad("workload.arrival", "has no positive rate".into());
        }
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
            fraction(p.critical).or_else(|r| bad("workload.priorities.critical", r))?;
            fraction(p.sheddable).or_else(|r| bad("workload.priorities.sheddable", r))?;
            if p.critical + p.sheddable > 1.0 {
                return bad(
                    "workload.priorities",
                    "critical + sheddable must not exceed 1".into(),
                );
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
        if self.seeds.is_empty() {
            return bad("seeds", "must list at least one seed".into());
        }
        if self.policies.is_empty() {
            return bad("policies", "must list at least one policy".into());
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
        match &mut self.workload.arrival {
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
        let max_prompt = self.workload.prompt_tokens.max()
            + self.workload.prefix.as_ref().map_or(0, |p| p.tokens);
        for (i, g) in self.fleet.iter().enumerate() {
            if let Ok(p) = catalog.get(&g.profile) {
                let limit = p
                    .max_model_len
                    .min(u32::try_from(p.kv_capacity_tokens).unwrap_or(u32::MAX));
                if max_prompt.saturating_add(self.workload.output_tokens.max()) > limit {
                    return Err(BenchError::Invalid {
                        origin: origin.to_owned(),
                        field: format!("fleet[{i}].profile"),
                        reason: format!(
                            "{} holds at most {limit} tokens per request, but the workload's prompts and outputs reach {}",
                            g.profile,
                            max_prompt.saturating_add(self.workload.output_tokens.max())
                        ),
                    });
                }
            }
        }
        Ok(spec)
    }
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
