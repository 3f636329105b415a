//! The routing core of infergate.
//!
//! Pure and synchronous: no IO, no clock reads (time is passed in as a [`Timestamp`]), randomness
//! from a seeded generator passed in by the caller. The shells (ext_proc picker, standalone proxy,
//! benchmark simulator) feed it endpoint state and carry out its decisions.
//!
//! # How the shells use it
//!
//! 1. Build a [`Scheduler`] from a [`SchedulerConfig`] (a preset such as `infergate` or
//!    `gie-default`, or explicit weights) and keep it behind a `std::sync::Mutex`.
//! 2. Keep the pool current: [`Scheduler::upsert_endpoint`], [`Scheduler::remove_endpoint`],
//!    [`Scheduler::apply_metrics`] after every scrape.
//! 3. Per request: build a [`RequestContext`] borrowing from the parsed body and call
//!    [`Scheduler::pick`]. It returns a [`Decision`] (ranked distinct endpoints, first choice then
//!    fallbacks, and a [`Ticket`]) or a [`Rejection`] that knows its HTTP status (503 / 429 with
//!    `Retry-After`) and metric label.
//! 4. Report the outcome on the ticket: [`Scheduler::first_token`] when the first streamed token
//!    arrives, then exactly one of [`Scheduler::complete`] (with [`Usage`]), [`Scheduler::fail`] or
//!    [`Scheduler::cancel`]. If the proxy fell back to another endpoint, call
//!    [`Scheduler::reassign`] first. Completions teach the per-pod rate learner.
//! 5. For debugging, [`Scheduler::pick_explained`] returns the same decision plus an
//!    [`Explanation`]; a plain pick builds no record at all.
//!
//! # Layout
//!
//! Public:
//! - [`endpoint`] — endpoint identity, labels and the metrics snapshot the shells keep fresh.
//! - [`request`] — [`RequestContext`] and [`Priority`].
//! - [`config`] — [`SchedulerConfig`], presets, weights, validation.
//! - [`canary`] — model rewrites and weighted canary splits ([`Rewrites`]), per tenant.
//! - [`decision`] — [`Decision`], [`Ranked`], [`Ticket`], [`Rejection`], [`Usage`].
//! - [`explain`] — decision records.
//! - [`flow`] — flow control: bounded per-priority queues, fair order between tenants, TTL
//!   ([`FlowQueues`]).
//! - [`peers`] — active-active picker replicas: the per-endpoint load they exchange
//!   ([`PeerLoad`]) so each one's picks count the others' requests in flight.
//! - [`prefix`] — the approximate prefix index and the chained block hasher.
//! - [`quota`] — per-tenant request and token quotas in bucketed sliding windows that replicas
//!   share through a store (time passed in).
//! - `fixtures` — shared test fixtures, only under `cfg(test)` or the non-default `fixtures`
//!   feature (which the crate's dev-dependency on itself enables for `tests/` and `benches/`).
//!
//! Internal, one file per stage of a pick, in pipeline order:
//! - `scheduler` — the [`Scheduler`]: the public methods, and `pick` running the stages below.
//! - `table` — the endpoint table (slots, generations, the address index).
//! - `state` — one endpoint's hot and cold state. `inflight` — tickets: the in-flight table and
//!   how a request is charged to, and released from, its endpoint's counters.
//! - `view` — the candidate list and one load view per candidate (with the endpoint filters
//!   inlined into that pass).
//! - `filter` — `freshness`, `lora` (on endpoint state) and `saturation` (on views).
//! - `outlier` — passive outlier detection: failed answers in a row eject a pod for a while.
//! - `admission` — shedding by priority when no candidate has headroom, and `Retry-After`.
//! - `scorer` — the scorers and their combination (each formula is documented there and in
//!   `docs/scheduler.md`).
//! - `picker` — top-k with seeded ties, and the baseline policies.
//! - `stale` — fail-open on stale metrics: the candidates that still answer, ranked on
//!   in-flight accounting, within the per-pod cap.
//! - `lora` — the LoRA-adapter arithmetic shared by the filter, the state and the views the
//!   `lora-affinity` scorer reads.
//! - `rates` — the online learner of per-pod prefill and decode rates.
//! - [`error`] — the crate's error type.

pub mod canary;
pub mod config;
pub mod decision;
pub mod endpoint;
pub mod error;
pub mod explain;
pub mod flow;
pub mod gpu;
pub mod outlier;
pub mod peers;
pub mod prefix;
pub mod quota;
pub mod request;

#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;

mod admission;
mod filter;
mod inflight;
mod lora;
mod picker;
mod rates;
mod sample;
mod scheduler;
mod scorer;
mod stale;
mod state;
mod table;
mod view;

pub use canary::{RewriteError, RewriteRule, RewriteTarget, Rewrites};
pub use config::{
    AllFilteredAction, Policy, PrefixConfig, Preset, RateConfig, SchedulerConfig, StaleMetrics,
    StaleMode, Thresholds, Weights,
};
pub use decision::{Decision, MAX_RETURNED, Ranked, Rejection, Ticket, Usage};
pub use endpoint::{
    CacheConfig, EndpointMeta, EngineType, LoraState, MetricsSnapshot, ScrapeState, Timestamp,
    UnknownEngineError,
};
pub use error::{ConfigError, Error, UnknownPresetError};
pub use explain::{CandidateRecord, Explanation, FilteredOut, ScoreRecord};
pub use flow::{FlowConfig, FlowQueues, FlowRequest, FlowTicket};
pub use peers::{MAX_PEERS, MAX_RATE_SAMPLES, PeerError, PeerLoad, RateSample};
pub use prefix::{PrefixIndex, PrefixStats};
pub use request::{Priority, RequestContext};
pub use scheduler::{EndpointInfo, Scheduler};
