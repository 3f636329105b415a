//! Model-server emulator and discrete-event fleet simulator.
//!
//! infergate has to show that a routing policy that wins here wins on real GPU fleets, without
//! GPUs. This crate models the *servers* (never the router): one vLLM-like engine per pod with
//! continuous batching, chunked prefill, a finite block KV cache with prefix caching and LRU
//! eviction, preemption, and LoRA slots, priced by per-GPU [`Profile`]s that are data
//! (`profiles/*.yaml`, derivations in `docs/simulator.md`).
//!
//! The same [`Engine`] runs under two clocks:
//! - [`fleet::Fleet`]: a discrete-event simulation of many pods on a virtual clock, for benchmarks
//!   (requests in, [`Completion`] records and scraper-style [`EngineView`]s out);
//! - [`serve`]: live OpenAI-compatible HTTP pods on 127.0.0.1 driven by tokio time, with vLLM,
//!   SGLang or TGI `/metrics` pages and runtime fault injection.
//!
//! Layout: `profile` (cost model and tables), `tokens` (tokenizer stand-in, prefix hashes),
//! `engine` (the state machine; `engine/kv.rs` the block pool), `histogram`, `spec` (fleet files),
//! `fleet` (discrete-event driver), `serve` (HTTP emulator; `serve/http.rs` the OpenAI API,
//! `serve/page.rs` the metrics pages).

pub mod engine;
mod error;
pub mod fleet;
pub mod histogram;
pub mod profile;
pub mod serve;
pub mod spec;
pub mod tokens;

pub use engine::{Completion, Engine, EngineRequest, EngineView, Sink};
pub use error::SimError;
pub use fleet::{Fleet, Request, ScrapeConfig};
pub use profile::{Catalog, Profile, StepShape};
pub use serve::{POD_HEADER, PodHandle, ServedFleet, ServedPod, serve_fleet};
pub use spec::{EngineKind, Faults, FleetSpec, MetricsFault, PodSpec};
pub use tokens::Prompt;
