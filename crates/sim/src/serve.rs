//! The live emulator: each pod of a [`FleetSpec`] served over HTTP/1.1 or h2c on 127.0.0.1.
//!
//! [`serve_fleet`] binds one listener per pod (port 0 unless the fleet fixes one) and returns the
//! addresses and a [`PodHandle`] per pod for fault injection. A driver task per pod runs the pod's
//! [`Engine`] in single steps on tokio time: it plans a step, sleeps until its end, applies it
//! and streams the tokens it produced. Step boundaries are kept on the engine's own timeline (the
//! planned end, not the timer's wake-up), so the timings match the discrete-event fleet exactly
//! under tokio's paused clock and to within timer resolution on a real one.
//!
//! Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (JSON or SSE with
//! `stream_options.include_usage`), `GET /v1/models`, `GET /health`, `GET /metrics` (the pod's
//! engine flavour, see [`page`]). vLLM pods also serve the Responses API, `POST /v1/responses`
//! (JSON or vLLM's named events, see `responses`), and what other routers call on vLLM (`peer`):
//! `POST /tokenize`, `POST /detokenize`, `POST /v1/chat/completions/render`,
//! `POST /v1/completions/render`, `GET /load` and `GET /get_load`. Errors use the OpenAI JSON
//! shape. Every response carries [`POD_HEADER`] naming the pod.
//!
//! Prompts are tokenized by the stand-in of [`crate::tokens`], or, given the model's own
//! tokenizer ([`ServeOptions::tokenizer`], `infergate sim --tokenizer`), as vLLM tokenizes them:
//! the chat template applied to chat messages, a completions prompt encoded with the
//! tokenizer's special tokens. Those ids are then what a pod counts, caches block by block,
//! publishes in its KV-cache events and answers `/tokenize` with, so a router tokenizing with the
//! same files (precise prefix routing) matches them exactly.

mod http;
pub mod kv;
pub mod page;
mod peer;
mod responses;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use infergate_tokenizer::ModelTokenizer;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

use crate::engine::{Completion, Engine, EngineView, Sink};
use crate::spec::{EngineKind, Faults, FleetSpec, PodSpec};
use crate::tokens::chain_seed;
use crate::{Profile, SimError};

/// Response header that names the pod that answered.
pub const POD_HEADER: &str = "x-infergate-pod";

/// What the driver tells a waiting handler.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TokenEvent {
    /// Output token `index` (1-based) was produced.
    Token { index: u32 },
    /// The request finished.
    Done(Completion),
}

/// Per-page state that outlives a render.
#[derive(Debug, Default)]
pub(crate) struct PageState {
    frozen: Option<String>,
    lora_series: Vec<(String, String, f64)>,
    http: Vec<(&'static str, &'static str, u64)>,
}

/// State shared by a pod's driver, handlers and handle.
#[derive(Debug)]
pub(crate) struct PodShared {
    pub(crate) name: Arc<str>,
    pub(crate) model: Arc<str>,
    pub(crate) kind: EngineKind,
    pub(crate) profile: Arc<Profile>,
    pub(crate) adapters: Vec<Arc<str>>,
    pub(crate) engine: Mutex<Engine>,
    pub(crate) wake: Notify,
    pub(crate) anchor: tokio::time::Instant,
    pub(crate) start_unix: f64,
    pub(crate) faults: watch::Sender<Faults>,
    pub(crate) streams: Mutex<HashMap<u64, mpsc::UnboundedSender<TokenEvent>>>,
    pub(crate) next_id: AtomicU64,
    pub(crate) rng: Mutex<SmallRng>,
    pub(crate) pages: Mutex<PageState>,
    /// The pod's KV-event publisher, when the fleet publishes them ([`kv`]).
    pub(crate) kv: Option<kv::Feed>,
    /// The model's own tokenizer; `None`: the stand-in of [`crate::tokens`].
    pub(crate) tokenizer: Option<Arc<ModelTokenizer>>,
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it (the state is still
/// consistent: every critical section here is a handful of plain field updates).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl PodShared {
    /// Engine time now: seconds since the pod started, on tokio's clock.
    pub(crate) fn now(&self) -> f64 {
        self.anchor.elapsed().as_secs_f64()
    }

    /// Renders the pod's `/metrics` page now.
    pub(crate) fn render_page(&self) -> String {
        let (view, stats) = {
            let e = lock(&self.engine);
            (e.view(self.now()), e.stats().clone())
        };
        let now_unix = unix_now();
        let mut pages = lock(&self.pages);
        let running = view.running_loras.join(",");
        let mut any: Vec<&str> = view.running_loras.iter().map(|a| &**a).collect();
        for a in &view.waiting_loras {
            if !any.contains(&&**a) {
                any.push(a);
            }
        }
        let waiting = any.join(",");
        match pages
            .lora_series
            .iter_mut()
            .find(|(r, w, _)| *r == running && *w == waiting)
        {
            Some(s) => s.2 = now_unix,
            None => pages.lora_series.push((running, waiting, now_unix)),
        }
        let input = page::PageInput {
            model: &self.model,
            profile: &self.profile,
            view: &view,
            stats: &stats,
            start_unix: self.start_unix,
            now_unix,
            lora_series: &pages.lora_series,
            http: &pages.http,
        };
        match self.kind {
            EngineKind::Vllm => page::vllm(&input),
            EngineKind::Sglang => page::sglang(&input),
            EngineKind::Tgi => page::tgi(&input),
        }
    }

    pub(crate) fn count_http(&self, handler: &'static str, status: u16) {
        let class = match status {
            200..=299 => "2xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        let mut pages = lock(&self.pages);
        match pages
            .http
            .iter_mut()
            .find(|(h, c, _)| *h == handler && *c == class)
        {
            Some(e) => e.2 += 1,
            None => pages.http.push((handler, class, 1)),
        }
    }
}

/// Controls one served pod at runtime.
#[derive(Debug, Clone)]
pub struct PodHandle {
    shared: Arc<PodShared>,
}

impl PodHandle {
    /// The pod's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Current faults.
    pub fn faults(&self) -> Faults {
        *self.shared.faults.borrow()
    }

    /// Replaces the faults (takes effect for the next request, step or scrape).
    pub fn set_faults(&self, faults: Faults) {
        self.shared.faults.send_replace(faults);
        if faults.metrics != crate::MetricsFault::Frozen {
            lock(&self.shared.pages).frozen = None;
        }
    }

    /// The engine state a scraper would read now.
    pub fn view(&self) -> EngineView {
        lock(&self.shared.engine).view(self.shared.now())
    }

    /// Inference requests this pod has ended so far: finished, or aborted when the client went
    /// away (whoever sent them: a benchmark counts per-pod load with it behind any front).
    pub fn requests_ended(&self) -> u64 {
        let e = lock(&self.shared.engine);
        let s = e.stats();
        s.requests_finished + s.requests_aborted
    }
}

/// One served pod.
#[derive(Debug, Clone)]
pub struct ServedPod {
    /// Pod name.
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Runtime control.
    pub handle: PodHandle,
    /// Its KV-event publisher's `PUB` and replay addresses, when the fleet publishes them.
    pub kv_events: Option<(SocketAddr, Option<SocketAddr>)>,
}

/// A running fleet of emulated pods.
#[derive(Debug)]
pub struct ServedFleet {
    /// The pods, in fleet order.
    pub pods: Vec<ServedPod>,
    tasks: Vec<JoinHandle<()>>,
}

impl ServedFleet {
    /// `(name, address)` of every pod.
    pub fn addrs(&self) -> Vec<(String, SocketAddr)> {
        self.pods.iter().map(|p| (p.name.clone(), p.addr)).collect()
    }

    /// Handle of the pod with this name.
    pub fn handle(&self, name: &str) -> Option<&PodHandle> {
        self.pods.iter().find(|p| p.name == name).map(|p| &p.handle)
    }

    /// Waits until every pod has stopped (after the shutdown future completed).
    pub async fn wait(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Serves every pod of `spec` until `shutdown` completes. Returns once all listeners are bound.
pub async fn serve_fleet<F>(spec: &FleetSpec, shutdown: F) -> Result<ServedFleet, SimError>
where
    F: Future<Output = ()> + Send + 'static,
{
    serve_fleet_at(
        spec,
        |pod| SocketAddr::from(([127, 0, 0, 1], pod.port)),
        shutdown,
    )
    .await
}

/// Like [`serve_fleet`], with each pod bound where `addr` says: several pods can then share a
/// port on their own loopback addresses, as pods of a Kubernetes Service share a target port on
/// their own IPs.
pub async fn serve_fleet_at<F>(
    spec: &FleetSpec,
    addr: impl Fn(&PodSpec) -> SocketAddr,
    shutdown: F,
) -> Result<ServedFleet, SimError>
where
    F: Future<Output = ()> + Send + 'static,
{
    serve_fleet_with(spec, addr, None, shutdown).await
}

/// Like [`serve_fleet_at`]; with `kv_events`, every vLLM pod also publishes vLLM's KV-cache
/// events ([`kv`]) on its own address at the port `kv_events` gives it.
pub async fn serve_fleet_with<F>(
    spec: &FleetSpec,
    addr: impl Fn(&PodSpec) -> SocketAddr,
    kv_events: Option<&kv::KvEventsOptions>,
    shutdown: F,
) -> Result<ServedFleet, SimError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let options = ServeOptions {
        kv_events: kv_events.cloned(),
        tokenizer: None,
    };
    serve_fleet_opts(spec, addr, &options, shutdown).await
}

/// How a fleet is served beyond what its spec says.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// Every vLLM pod publishes vLLM's KV-cache events ([`kv`]) at the ports these give it.
    pub kv_events: Option<kv::KvEventsOptions>,
    /// The model's own tokenizer: every pod tokenizes prompts with it, as vLLM does, instead of
    /// the stand-in of [`crate::tokens`] (one tokenizer for the whole fleet: give it a fleet
    /// whose pods serve that model).
    pub tokenizer: Option<Arc<ModelTokenizer>>,
}

/// Like [`serve_fleet_with`], with every option of [`ServeOptions`].
pub async fn serve_fleet_opts<F>(
    spec: &FleetSpec,
    addr: impl Fn(&PodSpec) -> SocketAddr,
    options: &ServeOptions,
    shutdown: F,
) -> Result<ServedFleet, SimError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let kv_events = options.kv_events.as_ref();
    // Every pod's KV-event ports are in range before any socket is bound.
    if let Some(o) = kv_events {
        for (i, pod) in spec.pods.iter().enumerate() {
            if pod.engine == EngineKind::Vllm {
                o.ports(i, &pod.name)?;
            }
        }
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut pods = Vec::with_capacity(spec.pods.len());
    for pod in &spec.pods {
        let at = addr(pod);
        let listener = TcpListener::bind(at)
            .await
            .map_err(|source| SimError::Bind {
                pod: pod.name.clone(),
                addr: at,
                source,
            })?;
        let addr = listener.local_addr()?;
        let index = pods.len();
        // Only vLLM pods publish vLLM's events; pod `index` keeps its ports either way.
        let feed = match kv_events {
            Some(o) if pod.engine == EngineKind::Vllm => Some(
                kv::Feed::bind(o, addr.ip(), index, &pod.name)
                    .await?
                    .with_block_size(pod.profile.block_size),
            ),
            _ => None,
        };
        let kv_addrs = feed.as_ref().map(|f| (f.addr(), f.replay_addr()));
        let shared = Arc::new(new_shared(pod, feed, options.tokenizer.clone()));
        tasks.push(tokio::spawn(drive(shared.clone(), stop_rx.clone())));
        tasks.push(tokio::spawn(http::accept_loop(
            listener,
            shared.clone(),
            stop_rx.clone(),
        )));
        if !pod.fault_script.is_empty() {
            tasks.push(tokio::spawn(run_fault_script(
                pod.clone(),
                shared.clone(),
                stop_rx.clone(),
            )));
        }
        tracing::info!(pod = %pod.name, %addr, engine = pod.engine.as_str(), profile = %pod.profile.id, "emulated pod listening");
        pods.push(ServedPod {
            name: pod.name.clone(),
            addr,
            handle: PodHandle { shared },
            kv_events: kv_addrs,
        });
    }
    tasks.push(tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    }));
    Ok(ServedFleet { pods, tasks })
}

fn new_shared(
    pod: &PodSpec,
    kv: Option<kv::Feed>,
    tokenizer: Option<Arc<ModelTokenizer>>,
) -> PodShared {
    let mut engine = Engine::new(
        pod.profile.clone(),
        pod.lora_adapters.clone(),
        pod.max_loras,
        chain_seed(&pod.model),
        true,
    );
    engine.set_slowdown(pod.faults.slowdown);
    engine.record_kv_events(kv.is_some());
    PodShared {
        name: pod.name.as_str().into(),
        model: pod.model.clone(),
        kind: pod.engine,
        profile: pod.profile.clone(),
        adapters: pod.lora_adapters.clone(),
        engine: Mutex::new(engine),
        wake: Notify::new(),
        anchor: tokio::time::Instant::now(),
        start_unix: unix_now(),
        faults: watch::Sender::new(pod.faults),
        streams: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        rng: Mutex::new(SmallRng::seed_from_u64(pod.seed)),
        pages: Mutex::new(PageState::default()),
        kv,
        tokenizer,
    }
}

async fn run_fault_script(pod: PodSpec, shared: Arc<PodShared>, mut stop: watch::Receiver<bool>) {
    for step in &pod.fault_script {
        let at = shared.anchor + Duration::from_secs_f64(step.at_s.max(0.0));
        tokio::select! {
            _ = tokio::time::sleep_until(at) => {}
            _ = stop.changed() => return,
        }
        let mut f = *shared.faults.borrow();
        step.apply(&mut f);
        PodHandle {
            shared: shared.clone(),
        }
        .set_faults(f);
        tracing::info!(pod = %pod.name, faults = ?f, "scripted fault change");
    }
}

struct LiveSink<'a> {
    tokens: &'a mut Vec<(u64, u32, f64)>,
    done: &'a mut Vec<Completion>,
}

impl Sink for LiveSink<'_> {
    fn token(&mut self, id: u64, index: u32, t: f64) {
        self.tokens.push((id, index, t));
    }
    fn completed(&mut self, completion: Completion) {
        self.done.push(completion);
    }
}

/// The pod's engine loop on tokio time.
async fn drive(shared: Arc<PodShared>, mut stop: watch::Receiver<bool>) {
    let mut start_at: Option<f64> = None;
    let mut tokens = Vec::new();
    let mut done = Vec::new();
    let mut kv_events = Vec::new();
    loop {
        if *stop.borrow() {
            return;
        }
        let end = {
            let mut e = lock(&shared.engine);
            e.set_slowdown(shared.faults.borrow().slowdown);
            let t = start_at.take().unwrap_or_else(|| shared.now());
            e.start_step(t, false)
        };
        let Some(end) = end else {
            tokio::select! {
                _ = shared.wake.notified() => {}
                _ = stop.changed() => return,
            }
            continue;
        };
        tokio::select! {
            _ = tokio::time::sleep_until(shared.anchor + Duration::from_secs_f64(end)) => {}
            _ = stop.changed() => return,
        }
        {
            let mut e = lock(&shared.engine);
            e.finish_step(&mut LiveSink {
                tokens: &mut tokens,
                done: &mut done,
            });
            if let Some(feed) = &shared.kv {
                e.drain_kv_events(end, &mut kv_events);
                drop(e);
                feed.publish(end + shared.start_unix, &mut kv_events);
            }
        }
        {
            let mut streams = lock(&shared.streams);
            for (id, index, _) in tokens.drain(..) {
                if let Some(tx) = streams.get(&id) {
                    let _ = tx.send(TokenEvent::Token { index });
                }
            }
            for c in done.drain(..) {
                if let Some(tx) = streams.remove(&c.id) {
                    let _ = tx.send(TokenEvent::Done(c));
                }
            }
        }
        start_at = Some(end);
    }
}
