//! Model-server `/metrics` ingestion for vLLM, SGLang and TGI.
//!
//! This crate keeps the scheduler's view of every pod fresh: it polls each model server's
//! Prometheus page, maps the engine's metric names onto the scheduler's [`MetricsSnapshot`], and
//! tracks freshness so that a pod whose page stops arriving is reported stale instead of being
//! routed to on old data.
//!
//! Layout:
//! - [`parse`] — the pure part: engine + page bytes (+ previous counters) → snapshot or
//!   [`ParseError`]; a streaming reader that looks only at the families each engine needs.
//! - [`scraper`] — the async shell: [`Scraper`] polls a changing set of targets over keep-alive
//!   HTTP/1 connections and hands snapshots and stale transitions to a caller's [`Sink`].
//! - [`telemetry`] — the crate's own Prometheus metrics ([`ScrapeMetrics`]).
//! - [`error`] — [`ParseError`], [`ScrapeError`] and the caller-facing [`Error`].
//!
//! [`MetricsSnapshot`]: infergate_scheduler::MetricsSnapshot

use std::collections::BTreeMap;

use infergate_scheduler::EngineType;

pub mod error;
pub mod parse;
pub mod scraper;
pub mod telemetry;

pub use error::{Error, ParseError, ScrapeError};
pub use parse::{ParsedPage, PrefixCounters, families, parse_page};
pub use scraper::{Clock, Scraper, ScraperConfig, Sink, Target, Update};
pub use telemetry::ScrapeMetrics;

/// The pod label that names a pod's engine (Gateway API Inference Extension convention).
pub const ENGINE_LABEL: &str = "inference.networking.k8s.io/engine-type";

/// The engine serving a pod: its [`ENGINE_LABEL`] label if set, else the configured default.
///
/// An unknown name in either place, or no engine at all, is a configuration error naming the pod.
pub fn engine_for(
    target: &str,
    labels: &BTreeMap<String, String>,
    configured: Option<&str>,
) -> Result<EngineType, Error> {
    let name = labels
        .get(ENGINE_LABEL)
        .map(String::as_str)
        .or(configured)
        .ok_or_else(|| Error::MissingEngine {
            target: target.to_owned(),
        })?;
    name.parse().map_err(|source| Error::UnknownEngine {
        target: target.to_owned(),
        source,
    })
}
