//! infergate's benchmark harness: "how much better than round-robin, on a fleet like mine?"
//!
//! A scenario file (`benches/scenarios/*.yaml`) names a fleet of emulated pods, a workload, the
//! seeds and the policies to compare. Each seed's arrivals are generated once and fed to every
//! policy; each policy is the real [`infergate_scheduler::Scheduler`] with one of its presets,
//! routing onto `infergate-sim`'s discrete-event fleet on a virtual clock and fed only what a
//! scraper and a gateway would see (simulated mode), or running inside the standalone gateway in
//! front of emulated pods on loopback (live mode). The result is a [`Report`]: TTFT, inter-token and end-to-end
//! latency percentiles, throughput, rejections, per-pod load, each policy's change against
//! round-robin, the clairvoyant floor, and verdicts against the scenario's targets, written as
//! markdown, JSON and SVG plots.
//!
//! Layout:
//! - [`scenario`] — the scenario file format and its validation (errors name the field);
//! - [`policy`] — the policies compared: scheduler presets, `infergate-precise` (picks fed the
//!   pods' KV-cache events), and entries of a preset with the gateway's `outlierDetection`;
//! - [`workload`] — seeded arrival processes, length distributions, prefix groups, LoRA mix;
//! - [`simulate`] — the simulated runner (with the gateway's retries and outlier reports when
//!   the scenario's pods fail requests) and the clairvoyant floor;
//! - [`live`] — the live runner: emulated pods on 127.0.0.1 behind the standalone gateway, driven
//!   over real HTTP with streaming requests;
//! - [`front`] — external fronts (another router or proxy started as a command) for live runs;
//! - [`prompt`] — live prompts sized in the model's own tokens (`--tokenizer`);
//! - [`report`] — results, summary over seeds, verdicts, markdown / JSON / SVG;
//! - `plan` — the runs of a bench in order, and what an interrupted one did not run (both
//!   runners);
//! - [`stats`] — percentiles and spreads; [`progress`] — the stderr progress bar;
//! - `error` — [`BenchError`].

mod error;
pub mod front;
pub mod live;
mod plan;
pub mod policy;
pub mod progress;
pub mod prompt;
pub mod report;
pub mod scenario;
pub mod simulate;
pub mod stats;
pub mod workload;

pub use error::BenchError;
pub use front::Front;
pub use policy::RoutePolicy;
pub use progress::{Progress, Silent, StderrBar};
pub use report::Report;
pub use scenario::Scenario;
