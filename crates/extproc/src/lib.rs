//! Envoy ext_proc server: the endpoint picker (EPP) and the body-based router (BBR).
//!
//! In a cluster, Envoy Gateway carries the traffic and asks this server, over the
//! `envoy.service.ext_proc.v3.ExternalProcessor` gRPC stream, where each request goes. The picker
//! follows the Gateway API Inference Extension endpoint-picker protocol: it buffers the OpenAI
//! body, picks endpoints on the shared live pool ([`infergate_pool::LivePool`]), and answers with
//! `x-gateway-destination-endpoint` (header and `envoy.lb` metadata, first choice then
//! fallbacks). On the response path it reads usage and the first token and releases the
//! request's in-flight entry on every ending. The body-based router reads `model` and sets the
//! headers an HTTPRoute matches on. `docs/extproc.md` documents the protocol as implemented.
//!
//! Layout:
//! - [`args`] — the command lines of `infergate picker` and `infergate bbr`, shared with the
//!   operator that renders them;
//! - [`wire`] — building and reading Envoy's messages (pure);
//! - [`picker`] — the endpoint-picker service; `picker/exchange.rs` is the per-stream state
//!   machine;
//! - [`bbr`] — the body-based router service;
//! - [`canary`] — the picker's model rewrites and canary splits, reloaded from their file;
//! - [`pool`] — the [`EndpointPool`] seam and its implementation for the live pool;
//! - [`discovery`] — pool membership from a static file or from Kubernetes pods;
//! - [`rewrite`] — the response-path model-name rewriter;
//! - [`run`] — whole picker and body-based-router processes (every port), for the binary;
//! - [`server`] — serving functions for the ext_proc and gRPC health ports;
//! - `stream` — the per-request answer stream that runs a exchange inline (no task or
//!   channel per request);
//! - [`telemetry`] — the server's Prometheus metrics;
//! - [`error`] — [`Error`];
//! - `fuzzing` — with `--cfg fuzzing` only (cargo-fuzz sets it): the picker's and the router's
//!   state machines on a scripted pool, for the targets in `fuzz/`.

pub mod args;
pub mod bbr;
pub mod canary;
pub mod discovery;
pub mod error;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
pub mod picker;
pub mod pool;
pub mod rewrite;
pub mod run;
pub mod server;
mod stream;
pub mod telemetry;
pub mod wire;

pub use bbr::BodyRouter;
pub use error::Error;
pub use picker::{EndpointPicker, PickerConfig};
pub use pool::{EndpointPool, InflightGuard};
pub use telemetry::{BbrTelemetry, Telemetry};
pub use wire::BodyMode;
