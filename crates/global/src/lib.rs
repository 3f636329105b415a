//! The global router: one OpenAI-compatible front door over several clusters' gateways
//! (infergate gateways or any OpenAI-compatible endpoint), run by
//! `infergate global --config global.yaml`.
//!
//! Each cluster's heartbeat (the JSON status an infergate gateway or picker serves on its admin
//! port, `infergate_pool::heartbeat`) is polled; a cluster whose heartbeat is stale, failing or
//! shows no ready pod is drained, and ramps back up over a window when it returns; one whose
//! routed requests keep failing at its gateway while its heartbeat looks good is ejected for a
//! while (passive outlier detection). Per request, the clusters serving the model are ordered —
//! the cheapest that meets the TTFT objective first — and a request that fails before its first
//! byte moves on to the next. Answers stream through untouched. Per-tenant rate limits (`quotas:`) are the gateway's quota service
//! (`infergate_pool::quota`), checked before a cluster is chosen and shared by the router's
//! replicas through Redis.
//!
//! Layout (pure logic apart from the IO):
//! - [`config`] — the file: types, defaults, validation;
//! - [`health`] — drain, stale and slow-start state per cluster and model (pure, time passed in);
//! - [`outlier`] — passive outlier detection: gateway failures in a row, ejections (pure, time
//!   passed in);
//! - [`route`] — the per-request order of clusters (pure);
//! - `cluster` — a cluster at run time and the task polling its heartbeat and models;
//! - `connect` — connections to a cluster: TCP, then TLS for `https://` URLs, and what a
//!   failed request says about the cluster;
//! - `correction` — the router's measured TTFT of a cluster, kept as a correction of the
//!   heartbeat-based estimate of each request (pure, time passed in);
//! - `rotation` — a cluster's token file, CA bundle and client certificate rotated on disk,
//!   noticed and applied without a reload, the cluster kept;
//! - `expiry` — when a cluster's client certificate and CA bundle expire: read at each load,
//!   exported, and a client certificate outside its validity warned of;
//! - `server` — [`serve`]: the front door, limits, authentication, quotas, retries; [`Handle`]:
//!   reloads of the file; [`check`]: what `infergate global --check` runs (the start's warnings,
//!   and its files read as the start reads them);
//! - `state` — the configuration in force, swapped whole by a reload, and what a reload keeps
//!   (unchanged clusters with their state, connections and pollers);
//! - `body` — the passed-through response body, read on the side for TTFT and usage;
//! - `access_log` — `accessLog:`, the router's record of a request, written by the gateway's
//!   access-log writer;
//! - `telemetry` — the `infergate_global_*` series;
//! - [`error`] — [`Error`], [`ConfigError`].

pub mod config;
pub mod error;
pub mod health;
pub mod outlier;
pub mod route;

mod access_log;
mod body;
mod cluster;
mod connect;
mod correction;
mod expiry;
mod rotation;
mod server;
mod state;
mod telemetry;

pub use config::GlobalConfig;
pub use error::{ConfigError, Error, OutlierError, OutlierField, TokenError};
pub use server::{CLUSTER_HEADER, Handle, Listeners, Router, check, check_files, serve};

/// The HTTP/1.1 client to a cluster (pooled keep-alive connections, plain or TLS).
type Client =
    hyper_util::client::legacy::Client<connect::Connector, http_body_util::Full<bytes::Bytes>>;

/// The current instant, on tokio's clock (paused in tests).
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}
