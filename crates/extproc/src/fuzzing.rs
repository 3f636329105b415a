//! Entry points for the fuzz targets in `fuzz/` (`extproc_picker`, `extproc_bbr`): the picker's
//! and the body-based router's per-stream state machines, fed Envoy's messages from memory
//! instead of a gRPC stream. The picker runs on a scripted pool that counts how every in-flight
//! entry ends, so a target can check that each one ends exactly once. Built only with
//! `--cfg fuzzing` (cargo-fuzz sets it).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub use envoy_types;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use infergate_openai::ModelRouter;
use infergate_scheduler::{Rejection, RequestContext, Usage};

use crate::bbr::{BbrConfig, BbrExchange, BodyRouter};
use crate::picker::{EndpointPicker, PickerConfig, PickerExchange};
use crate::pool::{EndpointPool, InflightGuard};
use crate::stream::{Exchange, Flow};
use crate::telemetry::{BbrTelemetry, Telemetry};
use crate::wire::BodyMode;

/// What the scripted pool answers to every pick.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Route to the pool's endpoints within the subset hint (503 when none is left).
    Route,
    /// Shed the request (429).
    Shed,
    /// No endpoint is eligible (503).
    NoEndpoints,
    /// Every endpoint is stale (503 with `Retry-After`).
    Stale,
}

/// How the pool's in-flight entries have ended so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Picks that returned an entry.
    pub picks: usize,
    /// Entries completed (the response ended normally).
    pub completed: usize,
    /// Entries failed.
    pub failed: usize,
    /// Entries dropped without an ending (cancelled).
    pub cancelled: usize,
    /// Entries still held.
    pub live: usize,
    /// The most first-token signals any one entry received.
    pub max_first_tokens: usize,
}

fn lock(stats: &Mutex<Stats>) -> MutexGuard<'_, Stats> {
    stats.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A pool that answers every pick the same way and counts how entries end.
#[derive(Clone, Debug)]
pub struct ScriptedPool {
    endpoints: Arc<[SocketAddr]>,
    behaviour: Behaviour,
    stats: Arc<Mutex<Stats>>,
}

/// An in-flight entry of [`ScriptedPool`].
#[derive(Debug)]
pub struct ScriptedInflight {
    endpoints: Vec<SocketAddr>,
    first_tokens: usize,
    done: bool,
    stats: Arc<Mutex<Stats>>,
}

impl ScriptedInflight {
    fn end(mut self, completed: bool) {
        self.done = true;
        let mut s = lock(&self.stats);
        s.live -= 1;
        if completed {
            s.completed += 1;
        } else {
            s.failed += 1;
        }
    }
}

impl Drop for ScriptedInflight {
    fn drop(&mut self) {
        if !self.done {
            let mut s = lock(&self.stats);
            s.live -= 1;
            s.cancelled += 1;
        }
    }
}

impl InflightGuard for ScriptedInflight {
    fn endpoints(&self) -> &[SocketAddr] {
        &self.endpoints
    }

    fn reassign(&mut self, _addr: SocketAddr) {}

    fn first_token(&mut self) {
        self.first_tokens += 1;
        let mut s = lock(&self.stats);
        s.max_first_tokens = s.max_first_tokens.max(self.first_tokens);
    }

    fn complete(self, _usage: Usage) {
        self.end(true);
    }

    fn fail(self) {
        self.end(false);
    }
}

impl EndpointPool for ScriptedPool {
    type Inflight = ScriptedInflight;

    fn pick(&self, cx: &RequestContext<'_>) -> Result<ScriptedInflight, Rejection> {
        let retry_after = Duration::from_secs(1);
        match self.behaviour {
            Behaviour::Route => {}
            Behaviour::Shed => return Err(Rejection::Shed { retry_after }),
            Behaviour::NoEndpoints => return Err(Rejection::NoEndpoints),
            Behaviour::Stale => return Err(Rejection::Unavailable { retry_after }),
        }
        let endpoints: Vec<SocketAddr> = self
            .endpoints
            .iter()
            .copied()
            .filter(|e| cx.subset.is_none_or(|s| s.contains(e)))
            .take(infergate_scheduler::MAX_RETURNED)
            .collect();
        if endpoints.is_empty() {
            return Err(Rejection::NoEndpoints);
        }
        let mut s = lock(&self.stats);
        s.picks += 1;
        s.live += 1;
        Ok(ScriptedInflight {
            endpoints,
            first_tokens: 0,
            done: false,
            stats: Arc::clone(&self.stats),
        })
    }

    fn is_ready(&self) -> bool {
        !self.endpoints.is_empty()
    }

    fn pick_explained(
        &self,
        cx: &RequestContext<'_>,
    ) -> (Result<ScriptedInflight, Rejection>, Option<String>) {
        let picked = self.pick(cx);
        let summary = format!("model={} picked={}", cx.model, picked.is_ok());
        (picked, Some(summary))
    }
}

/// The picker's settings for one fuzzed stream.
#[derive(Clone, Debug)]
pub struct PickerOptions {
    /// How the pool answers.
    pub behaviour: Behaviour,
    /// The pool's endpoints, in rank order.
    pub endpoints: Vec<SocketAddr>,
    /// The request body cap.
    pub max_body_bytes: usize,
    /// Requested → served model names.
    pub model_rewrites: HashMap<String, String>,
    /// Whether `x-infergate-explain: 1` is honoured.
    pub explain_header: bool,
}

/// One picker stream: the real [`PickerExchange`] on a [`ScriptedPool`].
pub struct Picker {
    exchange: Option<PickerExchange<ScriptedPool>>,
    stats: Arc<Mutex<Stats>>,
}

impl Picker {
    /// A stream before Envoy's first message.
    pub fn new(o: PickerOptions) -> Self {
        let stats = Arc::new(Mutex::new(Stats::default()));
        let pool = ScriptedPool {
            endpoints: o.endpoints.into(),
            behaviour: o.behaviour,
            stats: Arc::clone(&stats),
        };
        let config = PickerConfig {
            pool_name: String::from("fuzz"),
            max_body_bytes: o.max_body_bytes,
            max_response_scan_bytes: 1 << 16,
            request_body_mode: BodyMode::FullDuplex,
            response_body_mode: BodyMode::FullDuplex,
            model_rewrites: o.model_rewrites,
            quotas: None,
            rewrites: crate::canary::RewriteTable::default(),
            explain_header: o.explain_header,
            flow_control: None,
            flow: None,
            precise: None,
        };
        let picker = EndpointPicker::new(config, pool, Telemetry::default());
        Picker {
            exchange: Some(PickerExchange::new(Arc::clone(&picker.shared))),
            stats,
        }
    }

    /// Feeds one message, appending the answers to `out`, as the answer stream does. Returns
    /// `true` once the stream is closed (an immediate response was sent); later messages are
    /// ignored, as the stream drops the exchange then.
    pub fn feed(&mut self, msg: ProcessingRequest, out: &mut Vec<ProcessingResponse>) -> bool {
        feed(&mut self.exchange, msg, out)
    }

    /// The pool's counts so far.
    pub fn stats(&self) -> Stats {
        lock(&self.stats).clone()
    }

    /// Ends the stream (the exchange is dropped, as when Envoy closes or resets it) and returns
    /// the pool's final counts.
    pub fn end(mut self) -> Stats {
        self.exchange = None;
        self.stats()
    }
}

/// One body-based-router stream: the real [`BbrExchange`].
pub struct Bbr {
    exchange: Option<BbrExchange>,
}

impl Bbr {
    /// A stream of a router over `router`'s models, with a body cap of `max_body_bytes`.
    pub fn new(router: ModelRouter<()>, max_body_bytes: usize) -> Self {
        let config = BbrConfig {
            max_body_bytes,
            request_body_mode: BodyMode::FullDuplex,
        };
        let bbr = BodyRouter::new(config, router, BbrTelemetry::default());
        Bbr {
            exchange: Some(BbrExchange::new(Arc::clone(&bbr.shared))),
        }
    }

    /// As [`Picker::feed`].
    pub fn feed(&mut self, msg: ProcessingRequest, out: &mut Vec<ProcessingResponse>) -> bool {
        feed(&mut self.exchange, msg, out)
    }
}

fn feed<E: Exchange>(
    exchange: &mut Option<E>,
    msg: ProcessingRequest,
    out: &mut Vec<ProcessingResponse>,
) -> bool {
    let Some(ex) = exchange.as_mut() else {
        return true;
    };
    if ex.on_message(msg, out) == Flow::Close {
        *exchange = None;
        return true;
    }
    false
}
