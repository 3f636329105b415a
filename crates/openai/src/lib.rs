//! OpenAI wire formats, shared by every part of infergate that touches a request body.
//!
//! The body-based router and the endpoint picker (Envoy ext_proc), the standalone gateway and the
//! benchmarks all need the same few facts from an OpenAI-compatible request — which model, whether
//! it streams, what the prompt is (for prefix affinity), how long it is — and the same few facts
//! from the response — token usage and when the first token arrived. Doing that in one crate keeps
//! the answer identical whichever path a request takes.
//!
//! Layout:
//! - [`api`] — which OpenAI API a request path names, and what a front door does with a
//!   request by method and path ([`Route`]: 405 and 404 included, and the OPTIONS answer).
//! - [`request`] — parsing a request body into [`ParsedRequest`] without copying its strings, and
//!   rewriting its `model` field in place.
//! - [`rewrite`] — [`ModelRewriter`], the response-path model-name rewriter (chunk by chunk).
//! - [`routing`] — the body-based router's model table: served model name or LoRA adapter → target.
//! - [`usage`] — token usage from a JSON response or an SSE stream, and first-token detection.
//! - [`error`] — [`ApiError`], every error a client can see, mapped to one HTTP status and an
//!   OpenAI-style JSON body in one place.

pub mod api;
pub mod error;
pub mod request;
pub mod rewrite;
pub mod routing;
pub mod usage;

pub use api::{ApiKind, Route, check_content_encoding, check_transfer_encoding, model_id};
pub use error::{ApiError, OVERLOADED_HEADER, QueueLimit, REASON_HEADER};
pub use request::{ParsedRequest, parse_request};
pub use rewrite::ModelRewriter;
pub use routing::{ModelRouter, ModelRouterError, Resolved};
pub use usage::{SseScanner, Usage, extract_usage};
