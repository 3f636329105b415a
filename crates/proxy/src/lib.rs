//! The standalone gateway: an OpenAI-compatible HTTP front door that routes every request with
//! the same scheduler as the Envoy ext_proc endpoint picker, without Kubernetes.
//!
//! `infergate gateway --config gateway.yaml` runs it with [`serve_workers`]: one thread per core,
//! each with its own runtime, `SO_REUSEPORT` listener and upstream connections. Tests, the
//! benchmarks and embedders start it in-process the same way (or with [`serve`], one accept loop
//! on their own runtime); both take bound listeners and a shutdown future and return a running
//! [`Gateway`] with its addresses.
//!
//! A request's path through the gateway: the body is read (bounded), parsed and routed by its
//! `model` with `infergate_openai` — the same code as the ext_proc body-based router — then the
//! model's `infergate_pool::LivePool` picks a ranked list of endpoints. The gateway forwards to
//! the first, falls back to the next on a connect failure, a connection closed before the
//! response headers, or a 5xx before any byte reached the client, and streams the answer back
//! frame by frame while reading first-token time and usage on the side. Every error the gateway answers itself is an `infergate_openai::ApiError`.
//!
//! Layout:
//! - [`access_log`] — `accessLog:`, a JSON line per request written by a thread of its own (the
//!   writer is generic over the record, and shared with the global router).
//! - [`auth`] — who may call (JWT, API keys) and which models; 401 and 403.
//! - [`config`] — the configuration file: types, defaults, validation with field and line.
//! - `server` — [`serve_workers`] (thread per core, what `infergate gateway` runs), [`serve`]
//!   (one accept loop on the caller's runtime), [`Gateway`], [`Handle`] (reloads, file
//!   watching), accept loops, and [`check_files`] (`--check`: every named file loaded, nothing
//!   started).
//! - `proxy` — the per-request path: routing, picking, forwarding, retries, error answers.
//! - [`body`] — the response body: pass-through with first-token and usage tracking.
//! - `state` — a loaded configuration: model table, pools, prebuilt answers.
//! - `limits` — what bounds hostile clients at run time: connection slots, the head timeout of
//!   new connections, the gateway-wide request slot, the buffered-bytes budget and body timeout.
//! - `graceful` — one client connection served until it ends, finished gracefully at shutdown.
//! - `upstream` — each worker's pooled upstream HTTP/1.1 connections, driven by the requests.
//! - `backend` — one model's pool (`LivePool`), its metrics registry, and when a reload may keep
//!   it.
//! - `admin` — what the admin port (the shared `infergate_pool::admin` server) exports on
//!   `/metrics`: the gateway's series and those of every pool of the configuration in force.
//! - `telemetry` — the `infergate_gateway_*` Prometheus series.
//! - [`error`] — [`Error`] and [`ConfigError`].
//! - [`request_id`] — the `x-request-id` a request carries through (the client's, or made up).

pub mod access_log;
pub mod auth;
pub mod body;
pub mod config;
pub mod error;
pub mod request_id;

mod admin;
mod backend;
mod graceful;
mod limits;
mod proxy;
mod server;
mod state;
mod telemetry;
mod tls;
mod upstream;

pub use config::{
    EndpointConfig, GatewayConfig, Http2Limits, Limits, ModelConfig, ModelLimits, Retries, Scrape,
    Timeouts,
};
pub use error::{ConfigError, Error};
pub use limits::{BodyRead, BufferCharge, read_body};
pub use proxy::{ENDPOINT_HEADER, EXPLAIN_HEADER, REQUEST_ID_HEADER};
pub use server::{
    Gateway, Handle, Listeners, WorkerListeners, check_files, default_workers, serve, serve_workers,
};
