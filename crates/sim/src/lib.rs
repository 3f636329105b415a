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
//!   SGLang or TGI `/metrics` pages and runtime fault injection; prompts tokenized by the
//!   stand-in of [`tokens`], or by the model's own tokenizer ([`ServeOptions::tokenizer`]).
//!
//! ```
//! use infergate_sim::{Catalog, EngineKind, Fleet, FleetSpec, PodSpec, Prompt, Request, ScrapeConfig};
//!
//! # fn main() -> Result<(), infergate_sim::SimError> {
//! let catalog = Catalog::builtin()?;
//! let spec = FleetSpec {
//!     seed: 1,
//!     pods: vec![
//!         PodSpec::new("h100-0", catalog.get("llama-3.1-8b/h100")?, EngineKind::Vllm),
//!         PodSpec::new("a10g-0", catalog.get("llama-3.1-8b/a10g")?, EngineKind::Vllm),
//!     ],
//! }
//! .finish()?;
//! let mut fleet = Fleet::new(&spec)?;
//! fleet.set_scrape(Some(ScrapeConfig { interval: 0.05, lag: 0.01 }));
//! fleet.advance_to(0.2);
//! let seen = fleet.scraped(1)?.clone(); // what a scraper holds for pod 1 at t = 0.2 s
//! assert_eq!(seen.running, 0);
//! let prompt = Prompt::Tokens { tokens: 900, prefix_group: 3, prefix_tokens: 512 };
//! fleet.submit(0, Request { id: 7, arrival: 0.2, prompt, max_tokens: 128, lora: None })?;
//! fleet.run_until_idle();
//! let mut done = Vec::new();
//! fleet.drain_completions(&mut done);
//! assert_eq!((done[0].id, done[0].pod, done[0].output_tokens), (7, 0, 128));
//! assert!(done[0].ttft() < 0.1);
//! # Ok(())
//! # }
//! ```
//!
//! Layout: `profile` (cost model and tables), `tokens` (tokenizer stand-in, prefix hashes),
//! `engine` (the state machine; `engine/kv.rs` the block pool and its KV-cache events),
//! `histogram`, `spec` (fleet files), `fleet` (discrete-event driver), `kv_view` (the router's
//! event-fed view of each pod's prefix cache), `serve` (HTTP emulator; `serve/http.rs` the
//! OpenAI API, `serve/page.rs` the metrics pages, `serve/peer.rs` what other routers call on
//! vLLM: tokenize, render, load).

pub mod engine;
mod error;
pub mod fleet;
pub mod histogram;
pub mod kv_view;
pub mod profile;
pub mod serve;
pub mod spec;
pub mod tokens;

pub use engine::{Completion, Engine, EngineRequest, EngineView, KvEvent, Sink};
pub use error::SimError;
pub use fleet::{FirstToken, Fleet, PodKvEvent, Request, ScrapeConfig};
pub use kv_view::KvView;
pub use profile::{Catalog, Profile, StepShape};
pub use serve::kv::KvEventsOptions;
pub use serve::{
    POD_HEADER, PodHandle, ServeOptions, ServedFleet, ServedPod, serve_fleet, serve_fleet_at,
    serve_fleet_opts, serve_fleet_with,
};
pub use spec::{EngineKind, Faults, FleetSpec, MetricsFault, PodSpec};
pub use tokens::Prompt;
