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
//! - [`scraper`] — the async shell: [`Scraper`] polls a changing set of targets, on a thread of its
//!   own by default, over keep-alive HTTP/1.1 connections (a small purpose-built client that reads
//!   each page straight into a reused buffer) and hands snapshots and stale transitions to a
//!   caller's [`Sink`].
//! - [`telemetry`] — the crate's own Prometheus metrics ([`ScrapeMetrics`]).
//! - [`tls`] — HTTPS to model servers ([`ClientTls`]), for the scraper and the gateway.
//! - [`error`] — [`ParseError`], [`ScrapeError`] (with [`HttpError`]) and the caller-facing
//!   [`Error`].
//!
//! [`MetricsSnapshot`]: infergate_scheduler::MetricsSnapshot

use std::collections::BTreeMap;

use infergate_scheduler::EngineType;

pub mod error;
pub mod parse;
pub mod scraper;
pub mod telemetry;
pub mod tls;

pub use error::{Error, ErrorChain, HttpError, ParseError, ScrapeError};
pub use parse::{ParsedPage, PrefixCounters, families, parse_page};
pub use scraper::{Clock, ScrapeState, Scraper, ScraperConfig, Sink, Target, Update};
pub use telemetry::ScrapeMetrics;
pub use tls::ClientTls;

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

    use super::*;

    #[test]
    fn engine_comes_from_the_label_then_the_configuration() {
        let mut labels = BTreeMap::new();
        assert!(matches!(
            engine_for("pod-a", &labels, None),
            Err(Error::MissingEngine { ref target }) if target == "pod-a"
        ));
        assert_eq!(
            engine_for("pod-a", &labels, Some("tgi")).unwrap(),
            EngineType::Tgi
        );
        labels.insert(ENGINE_LABEL.to_owned(), "SGLang".to_owned());
        assert_eq!(
            engine_for("pod-a", &labels, Some("tgi")).unwrap(),
            EngineType::Sglang
        );
        labels.insert(ENGINE_LABEL.to_owned(), "triton".to_owned());
        let err = engine_for("pod-a", &labels, Some("vllm")).unwrap_err();
        assert!(matches!(err, Error::UnknownEngine { .. }));
        assert!(err.to_string().contains("pod-a"));
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert!(cause.contains("triton"), "{cause}");
    }
}
