//! Endpoint identity and the per-endpoint metrics snapshot.
//!
//! These types are the contract between the metrics scraper (which fills [`MetricsSnapshot`]) and
//! the scheduler (which reads it). They carry no behaviour beyond small helpers.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A point on a monotonic clock, in nanoseconds since an origin the shell chooses.
///
/// The scheduler never reads a clock: shells convert their `Instant`s (or a simulator's virtual
/// time) into `Timestamp`s and pass them in, which keeps every decision reproducible in tests.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The origin of the clock.
    pub const ZERO: Timestamp = Timestamp(0);

    /// A timestamp `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Timestamp(nanos)
    }

    /// A timestamp `millis` milliseconds after the origin.
    pub const fn from_millis(millis: u64) -> Self {
        Timestamp(millis.saturating_mul(1_000_000))
    }

    /// A timestamp `d` after the origin (saturating at `u64::MAX` nanoseconds, ~584 years).
    pub fn from_duration(d: Duration) -> Self {
        Timestamp(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub const fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// This timestamp moved forward by `d` (saturating).
    pub fn saturating_add(self, d: Duration) -> Timestamp {
        Timestamp(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

/// The model-server implementation behind an endpoint. It decides which metric names are read.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineType {
    /// vLLM (`vllm:*` metrics).
    Vllm,
    /// SGLang (`sglang:*` metrics).
    Sglang,
    /// Hugging Face Text Generation Inference (`tgi_*` metrics; no KV-cache gauge).
    Tgi,
}

impl EngineType {
    /// All engines, in a stable order.
    pub const ALL: [EngineType; 3] = [EngineType::Vllm, EngineType::Sglang, EngineType::Tgi];

    /// The lowercase name used in labels and configuration.
    pub const fn as_str(self) -> &'static str {
        match self {
            EngineType::Vllm => "vllm",
            EngineType::Sglang => "sglang",
            EngineType::Tgi => "tgi",
        }
    }
}

impl fmt::Display for EngineType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An engine name that infergate does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown engine type {0:?}: expected one of vllm, sglang, tgi")]
pub struct UnknownEngineError(pub String);

impl FromStr for EngineType {
    type Err = UnknownEngineError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EngineType::ALL
            .into_iter()
            .find(|e| e.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownEngineError(s.to_owned()))
    }
}

/// How a target's scrapes are going as the metrics scraper judges it (see `infergate-metrics`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScrapeState {
    /// The last good page is within the staleness threshold (also: no scraper reports states).
    #[default]
    Ok,
    /// No good page within the threshold, but a scrape is connected to a server that answered
    /// its last one: alive and slow.
    Late,
    /// A scrape failed, or nothing connected within the threshold.
    Failed,
}

impl ScrapeState {
    /// The three states, in a stable order.
    pub const ALL: [ScrapeState; 3] = [ScrapeState::Ok, ScrapeState::Late, ScrapeState::Failed];

    /// `ok`, `late` or `failed` (metric labels, logs).
    pub const fn as_str(self) -> &'static str {
        match self {
            ScrapeState::Ok => "ok",
            ScrapeState::Late => "late",
            ScrapeState::Failed => "failed",
        }
    }
}

/// Who an endpoint is: set when it joins the pool, unchanged while it stays.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointMeta {
    /// Kubernetes namespace (or a configured group name in standalone mode).
    pub namespace: String,
    /// Pod name (or a configured endpoint name in standalone mode).
    pub pod: String,
    /// Where requests and scrapes go.
    pub addr: SocketAddr,
    /// The model server behind it.
    pub engine: EngineType,
    /// GPU type, when known. The scheduler learns each endpoint's speed; until it has, the GPU
    /// type scales the pool's typical speed ([`crate::gpu`]). Read when the endpoint joins.
    pub gpu: Option<String>,
    /// Remaining pod labels, for selectors and explanations.
    pub labels: BTreeMap<String, String>,
}

/// LoRA residency as reported by the engine (vLLM `lora_requests_info`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoraState {
    /// How many adapters the engine can hold at once (`max_lora`).
    pub max_lora: u32,
    /// Adapters with requests running.
    pub running: Vec<String>,
    /// Adapters with requests waiting.
    pub waiting: Vec<String>,
}

/// The engine's KV-cache geometry, when it reports it (vLLM `cache_config_info`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheConfig {
    /// Tokens per KV block.
    pub block_size: u32,
    /// KV blocks on the device.
    pub num_blocks: u64,
}

impl CacheConfig {
    /// Total KV capacity in tokens.
    pub const fn capacity_tokens(&self) -> u64 {
        self.block_size as u64 * self.num_blocks
    }
}

/// One scrape of one endpoint's `/metrics`, normalised across engines.
///
/// `None` means "the engine does not report this" — scorers treat it as neutral, never as zero.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsSnapshot {
    /// When the page was read (shell clock).
    pub sampled_at: Timestamp,
    /// Requests waiting in the engine's queue.
    pub waiting: u32,
    /// Requests in the engine's running batch.
    pub running: u32,
    /// KV-cache use as a fraction in `[0, 1]`; `None` when the engine has no such gauge (TGI).
    pub kv_cache_usage: Option<f64>,
    /// LoRA residency, when the engine reports it.
    pub lora: Option<LoraState>,
    /// KV-cache geometry, when the engine reports it.
    pub cache: Option<CacheConfig>,
    /// Prefix-cache hit rate in `[0, 1]` over the last scrape interval, when reported.
    pub prefix_cache_hit_rate: Option<f64>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn engine_names_round_trip_and_unknown_is_an_error() {
        for e in EngineType::ALL {
            assert_eq!(e.as_str().parse::<EngineType>(), Ok(e));
        }
        assert_eq!("VLLM".parse::<EngineType>(), Ok(EngineType::Vllm));
        let err = "triton".parse::<EngineType>().unwrap_err();
        assert!(err.to_string().contains("triton"));
    }

    #[test]
    fn timestamps_saturate() {
        let a = Timestamp::from_millis(5);
        let b = Timestamp::from_millis(7);
        assert_eq!(b.saturating_since(a), Duration::from_millis(2));
        assert_eq!(a.saturating_since(b), Duration::ZERO);
        assert_eq!(
            a.saturating_add(Duration::from_millis(2)),
            Timestamp::from_millis(7)
        );
    }
}
