//! Live mode: the scenario's fleet served by `infergate-sim`'s HTTP emulator on 127.0.0.1, the
//! standalone gateway (`infergate_proxy::serve`) in front of it with each policy's scheduler
//! preset, and the workload sent as real streaming OpenAI chat requests on the wall clock.
//! External fronts ([`crate::front`]: another router or proxy started as a command) can run in
//! the gateway's place, on the same arrivals, into the same report.
//!
//! Each policy and each front gets a fresh fleet (cold caches, nothing learned), and the same
//! arrivals as every other. TTFT is measured at the client: from the moment the request is sent
//! to the first SSE event that carries text. Per-pod request counts come from the pods
//! themselves, so they do not depend on what a front passes back.
//!
//! A bench can be interrupted ([`run_until`]): the run in progress is stopped with everything
//! it started, and the report keeps the runs that completed, naming the others.
//!
//! Prompts are sized in the emulator's stand-in tokens (4 bytes a token), or, given the model's
//! tokenizer ([`Fronts::tokenizer`], `--tokenizer`), in its tokens ([`crate::prompt`]); the pods
//! then serve with that tokenizer, so their `usage.prompt_tokens` (summed per run,
//! [`RunResult::prompt_tokens`]) and prefill times are the model's.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use infergate_openai::SseScanner;
use infergate_proxy::{GatewayConfig, Listeners};
use infergate_sim::serve::kv::KvEventsOptions;
use infergate_sim::serve::{ServeOptions, ServedFleet};
use infergate_sim::{Catalog, FleetSpec};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::BenchError;
use crate::front::{Front, RunningFront};
use crate::plan::{Plan, Ran};
use crate::policy::RoutePolicy;
use crate::progress::Progress;
use crate::prompt::{self, ModelPrompts};
use crate::report::{FrontLog, LiveGateway, PodInfo, Report, RunResult};
use crate::scenario::{self, Scenario};
use crate::simulate::{LoadSeries, floor};
use crate::stats::{Percentiles, quantile};
use crate::workload::{self, Arrival};

const CDF_POINTS: usize = 200;

/// How one live request ended, as its client saw it ([`one_request`]).
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Answered 200 with generated text.
    Done {
        /// Seconds from sending the request to the first SSE event carrying text.
        ttft: f64,
        /// Seconds from sending it to the end of the answer.
        e2e: f64,
        /// Output tokens, from the final `usage` event (else the events that carried text).
        output_tokens: u32,
        /// Prompt tokens as the server counted them (the final `usage` event), if it said.
        prompt_tokens: Option<u32>,
        /// Seconds from the run's start to the end of the answer.
        finished: f64,
    },
    /// Answered 429 or 503: the front refused it.
    Rejected,
    /// Anything else.
    Failed(Failure),
}

/// Why a live request did not complete, as counted in [`RunResult::failures`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The request could not be built (never expected).
    Request,
    /// The request's task ended without an answer (never expected).
    Aborted,
    /// No connection, or the connection broke before a response head.
    Connect,
    /// The front answered with a status other than 200, 429 and 503.
    Status(u16),
    /// The response body broke off.
    Stream,
    /// A 200 answer whose body carried no generated text (not an OpenAI stream).
    NoText,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Request => f.write_str("request not built"),
            Failure::Aborted => f.write_str("request task aborted"),
            Failure::Connect => f.write_str("no connection or no response"),
            Failure::Status(code) => write!(f, "HTTP {code}"),
            Failure::Stream => f.write_str("response body broke off"),
            Failure::NoText => f.write_str("HTTP 200 without generated text"),
        }
    }
}

/// The `scrape:` settings a live run's gateway is started with, in milliseconds.
///
/// The scenario gives the interval only; the gateway refuses a staleness threshold below one
/// interval (and a `maxLate` below the timeout), so its default threshold (250 ms) would refuse
/// every interval above it. The threshold is the one the simulator applies instead: a pod's
/// metrics are overdue once two intervals and the scenario's lag have passed without a page
/// ([`crate::simulate`]), never below the gateway's default. The timeout (one scrape's time to
/// connect) and `maxLate` (a connected scrape's time to answer) do not depend on the interval
/// and keep the gateway's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayScrape {
    /// `intervalMs`: the scenario's `scrape.interval_ms`, rounded (at least 1).
    pub interval_ms: u64,
    /// `staleAfterMs`: two intervals plus `scrape.lag_ms`, at least the gateway's default.
    pub stale_after_ms: u64,
    /// `timeoutMs`: the gateway's default.
    pub timeout_ms: u64,
    /// `maxLateMs`: the gateway's default.
    pub max_late_ms: u64,
}

impl GatewayScrape {
    /// The settings for a scenario's `scrape:` section; the gateway accepts them for every
    /// interval the scenario's validation accepts.
    pub fn for_scenario(scrape: &scenario::Scrape) -> Self {
        // Saturating: an interval past u64::MAX ms is clamped by the gateway to its longest
        // duration, and the threshold with it.
        let ms = |v: f64| v.ceil().max(1.0) as u64;
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let defaults = infergate_proxy::config::Scrape::default();
        let interval_ms = (scrape.interval_ms.round().max(1.0)) as u64;
        let overdue_ms = ms(2.0 * scrape.interval_ms + scrape.lag_ms);
        let timeout_ms = millis(defaults.timeout);
        GatewayScrape {
            interval_ms,
            stale_after_ms: overdue_ms
                .max(millis(defaults.stale_after))
                .max(interval_ms),
            timeout_ms,
            max_late_ms: millis(defaults.max_late).max(timeout_ms),
        }
    }

    /// The bound on the age of an ok pod's metrics a policy's gateway runs with: its preset's
    /// `maxMetricsAge`, which the gateway raises to at least the staleness threshold plus one
    /// interval (`infergate_pool::LivePool::start`); `None` for a preset that keeps pods on
    /// metrics of any age.
    pub fn max_metrics_age_ms(&self, preset: infergate_scheduler::Preset) -> Option<u64> {
        let mut cfg = infergate_scheduler::SchedulerConfig::preset(preset);
        self.raise_max_metrics_age(&mut cfg);
        Some(u64::try_from(cfg.max_metrics_age?.as_millis()).unwrap_or(u64::MAX))
    }

    /// Raises `cfg`'s `maxMetricsAge` to the staleness threshold plus one interval, as the
    /// gateway does (`infergate_pool::LivePool::start`). The simulation applies it too, so that
    /// a scenario scraping every second or more does not drop healthy pods between two pages
    /// in simulation while the live gateway keeps them.
    pub fn raise_max_metrics_age(&self, cfg: &mut infergate_scheduler::SchedulerConfig) {
        let floor = Duration::from_millis(self.stale_after_ms.saturating_add(self.interval_ms));
        if let Some(age) = &mut cfg.max_metrics_age {
            *age = (*age).max(floor);
        }
    }
}

/// External fronts to run after the scenario's policies, on every seed, and how every live
/// run's prompts are sized.
#[derive(Debug, Clone, Default)]
pub struct Fronts {
    /// The fronts, in report order.
    pub list: Vec<Front>,
    /// Where each front's output goes ([`Fronts::log_path`]).
    pub log_dir: PathBuf,
    /// The model's tokenizer (`--tokenizer`): prompts are sized in its tokens and the pods
    /// serve with it; `None`, the emulator's stand-in (4 bytes a token).
    pub tokenizer: Option<Arc<ModelPrompts>>,
}

impl Fronts {
    /// Where the output of front `front` goes in scenario `scenario`:
    /// `LOG_DIR/SCENARIO-live-front-NAME.log`, beside the scenario's report
    /// (`SCENARIO-live.md`), so that a bench of several scenarios keeps each one's output.
    pub fn log_path(&self, scenario: &str, front: &str) -> PathBuf {
        self.log_dir
            .join(format!("{scenario}-live-front-{front}.log"))
    }
}

/// What a run sends its requests through.
#[derive(Debug, Clone, Copy)]
enum Target<'a> {
    /// The standalone gateway with this policy's scheduler (its preset, and its outlier
    /// detection when the entry sets it).
    Gateway(&'a RoutePolicy),
    /// An external front, and where its output goes.
    Front(&'a Front, &'a std::path::Path),
}

impl<'a> Target<'a> {
    fn name(&self) -> &'a str {
        match self {
            Target::Gateway(p) => p.as_str(),
            Target::Front(f, _) => &f.name,
        }
    }

    /// What did not start when this target's run did not: for a run passed over afterwards.
    fn what(&self) -> String {
        match self {
            Target::Gateway(p) => format!("the gateway for policy {p}"),
            Target::Front(f, _) => format!("front {}", f.name),
        }
    }
}

/// Runs every policy of `scenario` on every seed, live on loopback. Must run inside a
/// multi-threaded tokio runtime.
pub async fn run(
    scenario: &Scenario,
    origin: &str,
    progress: &mut dyn Progress,
) -> Result<Report, BenchError> {
    run_with_fronts(scenario, origin, &Fronts::default(), progress).await
}

/// Runs every policy of `scenario`, then every front of `fronts`, on every seed, live on
/// loopback. Must run inside a multi-threaded tokio runtime.
///
/// A front that does not start (its command cannot be run, exits, or never gets ready), or a
/// policy's gateway that does not (its configuration is refused, it cannot listen, or it never
/// gets ready), fails its own runs, not the call: they are in the report as
/// [`RunResult::not_started`], with the reason, and the other policies and fronts still run.
pub async fn run_with_fronts(
    scenario: &Scenario,
    origin: &str,
    fronts: &Fronts,
    progress: &mut dyn Progress,
) -> Result<Report, BenchError> {
    run_until(scenario, origin, fronts, progress, std::future::pending()).await
}

/// As [`run_with_fronts`], until `interrupt` resolves (the caller's Ctrl-C): then the run in
/// progress is stopped — its requests abandoned, its front, gateway and fleet stopped and
/// waited for — and the report of the runs that completed is returned, with
/// [`Report::interrupted`] naming the runs that did not (the stopped one first, said stopped
/// part-way only if it had begun sending its arrivals: not if the interrupt came between two
/// runs, or while its fleet, gateway or front was starting). `interrupt` is not polled again
/// once it has resolved.
pub async fn run_until(
    scenario: &Scenario,
    origin: &str,
    fronts: &Fronts,
    progress: &mut dyn Progress,
    interrupt: impl Future<Output = ()>,
) -> Result<Report, BenchError> {
    check(scenario, origin, fronts)?;
    let mut interrupt = std::pin::pin!(interrupt);
    let catalog = Catalog::builtin()?;
    let spec = scenario.fleet_spec(&catalog, origin)?;
    let mut runs = Vec::new();
    let mut floors = Vec::new();
    // Fronts and policies' gateways that did not start, and the seed they failed on: their
    // later seeds are recorded as not started instead of trying again what already failed.
    let mut unstarted: BTreeMap<&str, u64> = BTreeMap::new();
    let pods = spec.pods.len();
    let logs: Vec<FrontLog> = fronts
        .list
        .iter()
        .map(|f| FrontLog {
            front: f.name.clone(),
            log: fronts.log_path(&scenario.name, &f.name),
        })
        .collect();
    let targets: Vec<Target<'_>> = scenario
        .policies
        .iter()
        .map(Target::Gateway)
        .chain(
            fronts
                .list
                .iter()
                .zip(&logs)
                .map(|(f, l)| Target::Front(f, l.log.as_path())),
        )
        .collect();
    let mut plan = Plan::new(
        &scenario.seeds,
        targets.iter().map(|t| t.name().to_owned()).collect(),
    );
    'seeds: for (si, &seed) in scenario.seeds.iter().enumerate() {
        let arrivals = Arc::new(workload::generate(&scenario.workload, seed));
        floors.push(floor(&spec, &arrivals, seed));
        // Made once per seed, before any run: every target is sent the same text.
        let prompts: Arc<Vec<Arc<str>>> = Arc::new(
            arrivals
                .iter()
                .map(|a| prompt::text(fronts.tokenizer.as_deref(), a))
                .collect(),
        );
        for (ti, &target) in targets.iter().enumerate() {
            let name = target.name();
            let requests = arrivals.len() as u64;
            let label = format!(
                "{} live seed {seed} ({}/{}) {name}",
                scenario.name,
                si + 1,
                scenario.seeds.len(),
            );
            // An interrupt that came after the last run ended stops the bench before this
            // one: it is named as not run, not as stopped part-way.
            if resolved(interrupt.as_mut()).await {
                plan.stop(si, ti, false);
                break 'seeds;
            }
            progress.start(&label, requests);
            if let Some(failed_on) = unstarted.get(name) {
                let why = format!(
                    "not started: {} did not start on seed {failed_on}, so it was not tried again",
                    target.what()
                );
                progress.fail(&why);
                runs.push(RunResult::not_started(name, seed, requests, pods, why));
                continue;
            }
            let ran = run_one(
                scenario,
                &spec,
                target,
                &arrivals,
                &prompts,
                fronts.tokenizer.as_ref().map(|t| t.tokenizer().clone()),
                seed,
                si == 0,
                progress,
                interrupt.as_mut(),
            )
            .await;
            match ran {
                Ok(Ran::Done(r)) => {
                    progress.finish();
                    runs.push(*r);
                }
                Ok(ran @ (Ran::Interrupted | Ran::Unsent)) => {
                    // Everything the run had started is stopped.
                    progress.abort();
                    plan.stop(si, ti, matches!(ran, Ran::Interrupted));
                    break 'seeds;
                }
                // A front or gateway that cannot be started fails its own runs, not the bench:
                // the runs before it are kept and the ones after it still run.
                Err(e) if e.is_front_start() || e.is_gateway_start() => {
                    let why = format!("not started: {}", e.with_causes());
                    progress.fail(&why);
                    unstarted.insert(name, seed);
                    runs.push(RunResult::not_started(name, seed, requests, pods, why));
                }
                Err(e) => {
                    progress.abort();
                    return Err(e);
                }
            }
        }
    }
    let pods = PodInfo::list(&spec);
    let mut report = Report::new(scenario.clone(), "live", pods, runs, floors);
    report.front_logs = logs;
    report.gateway = live_gateway(scenario);
    report.tokenizer = fronts.tokenizer.as_ref().map(|t| t.dir().to_owned());
    plan.mark(&mut report);
    Ok(report)
}

/// Whether `scenario` can run live with `fronts`, checked without running a fleet, a gateway
/// or a front (a caller with several scenarios checks them all before the first run): live
/// mode has no KV-event subscriber (`infergate-precise`), no virtual time to freeze metrics in
/// (`stale:`), and no flow-control or replica runner (`flow:`, `replicas:`, simulated only);
/// fronts need names of their own, none a policy's, and commands that can start
/// ([`Front::check`]: valid `sh`, a program that is there).
pub fn check(scenario: &Scenario, origin: &str, fronts: &Fronts) -> Result<(), BenchError> {
    let invalid = |field: &str, reason: String| BenchError::Invalid {
        origin: origin.to_owned(),
        field: field.to_owned(),
        reason,
    };
    if let Some(f) = fronts
        .list
        .iter()
        .find(|f| scenario.policies.iter().any(|p| p.as_str() == f.name))
    {
        return Err(invalid(
            "policies",
            format!("names {}, which is also a front's name", f.name),
        ));
    }
    for (i, f) in fronts.list.iter().enumerate() {
        if fronts.list[..i].iter().any(|g| g.name == f.name) {
            // One row and one log per name: a second front would merge into the first's.
            return Err(BenchError::DuplicateFront(f.name.clone()));
        }
        // Before the first run, not after the policies: a front that cannot start at all.
        f.check()?;
    }
    if let Some(policy) = scenario.policies.iter().find(|p| p.precise) {
        // The live gateway has no KV-event subscriber to feed it.
        return Err(invalid(
            "policies",
            format!(
                "lists {policy}, which runs in simulated mode only (for a live run, name the policies with --policies)"
            ),
        ));
    }
    // These sections have runners in simulated mode only; a live run would quietly drop them.
    if scenario.flow.is_some() {
        return Err(invalid(
            "flow",
            "is run by the simulator only (drop --mode live)".to_owned(),
        ));
    }
    if scenario.replicas.is_some() {
        return Err(invalid(
            "replicas",
            "is run by the simulator only (drop --mode live, or --replicas)".to_owned(),
        ));
    }
    if !scenario.stale.is_empty() {
        return Err(invalid(
            "stale",
            "windows are in the simulator's virtual time only (drop --mode live)".to_owned(),
        ));
    }
    Ok(())
}

/// What the policies' gateways ran with, for the report; `None` when no policy ran (fronts
/// only).
fn live_gateway(scenario: &Scenario) -> Option<LiveGateway> {
    if scenario.policies.is_empty() {
        return None;
    }
    let scrape = GatewayScrape::for_scenario(&scenario.scrape);
    let max_metrics_age_ms = scenario
        .policies
        .iter()
        .filter_map(|p| {
            scrape
                .max_metrics_age_ms(p.preset)
                .map(|ms| (p.as_str().to_owned(), ms))
        })
        .collect();
    Some(LiveGateway {
        scrape,
        max_metrics_age_ms,
    })
}

/// The gateway's `endpoints:` for the pods `served` of `spec` (in the fleet's order): address,
/// name, GPU and engine, as live mode configures its gateway.
pub fn gateway_endpoints(
    spec: &FleetSpec,
    served: &[(String, std::net::SocketAddr)],
) -> Vec<serde_json::Value> {
    served
        .iter()
        .zip(&spec.pods)
        .map(|((name, addr), p)| {
            serde_json::json!({
                "address": addr.to_string(),
                "name": name,
                "gpu": p.profile.gpu_label(),
                "engine": p.engine.as_str(),
            })
        })
        .collect()
}

fn gateway_config(
    scenario: &Scenario,
    spec: &FleetSpec,
    served: &[(String, std::net::SocketAddr)],
    policy: &RoutePolicy,
    seed: u64,
) -> Result<GatewayConfig, BenchError> {
    let model = spec
        .pods
        .first()
        .map(|p| p.model.to_string())
        .unwrap_or_default();
    let adapters: Vec<String> = scenario
        .workload
        .lora
        .as_ref()
        .map(|l| l.adapters.clone())
        .unwrap_or_default();
    let scrape = GatewayScrape::for_scenario(&scenario.scrape);
    let endpoints = gateway_endpoints(spec, served);
    let config_error = |source| BenchError::GatewayConfig {
        policy: policy.as_str().to_owned(),
        source,
    };
    // The policy entry's outlier detection, as the gateway reads it: the scheduler's own
    // section, or `null` (off).
    let mut scheduler = serde_json::json!({ "preset": policy.preset.as_str() });
    if let Some(o) = policy.outlier_detection {
        scheduler["outlierDetection"] = serde_json::to_value(o).map_err(config_error)?;
    }
    let cfg = serde_json::json!({
        "listen": "127.0.0.1:0",
        "admin": "127.0.0.1:0",
        "seed": seed,
        "reloadIntervalMs": 0,
        // The benchmark's gateway listens on loopback for its own load generator only.
        "auth": "none",
        "scrape": {
            "intervalMs": scrape.interval_ms,
            "staleAfterMs": scrape.stale_after_ms,
            "timeoutMs": scrape.timeout_ms,
            "maxLateMs": scrape.max_late_ms,
        },
        "retries": { "maxAttempts": scenario.retries.max_attempts },
        "models": [{
            "name": model,
            "loraAdapters": adapters,
            "scheduler": scheduler,
            "endpoints": endpoints,
        }],
    });
    GatewayConfig::deserialize(cfg).map_err(config_error)
}

/// Starts the gateway for `policy` in front of the pods `served` and waits until it is ready
/// (some pod answered its scrapes), within 10 s. It stops once `stop` says so; one that never
/// gets ready is stopped, and waited for, before the error is returned.
async fn start_gateway(
    scenario: &Scenario,
    spec: &FleetSpec,
    served: &[(String, std::net::SocketAddr)],
    policy: &RoutePolicy,
    seed: u64,
    stop: &watch::Sender<bool>,
) -> Result<infergate_proxy::Gateway, BenchError> {
    let config = gateway_config(scenario, spec, served, policy, seed)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(BenchError::Bind)?;
    let mut rx = stop.subscribe();
    let gateway = infergate_proxy::serve(
        config,
        Listeners {
            http: listener,
            admin: None,
        },
        async move {
            let _ = rx.wait_for(|v| *v).await;
        },
    )
    .await
    .map_err(|source| BenchError::Gateway {
        policy: policy.as_str().to_owned(),
        source,
    })?;
    let handle = gateway.handle();
    let ready_by = Instant::now() + Duration::from_secs(10);
    while !handle.is_ready() {
        if Instant::now() > ready_by {
            let _ = stop.send(true);
            gateway.wait().await;
            return Err(BenchError::NotReady(policy.as_str().to_owned()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(gateway)
}

/// Whether `interrupt` has resolved already (polled once, without waiting).
async fn resolved(interrupt: Pin<&mut impl Future<Output = ()>>) -> bool {
    tokio::select! {
        biased;
        () = interrupt => true,
        () = std::future::ready(()) => false,
    }
}

/// One run of `target` on `seed`'s arrivals, on a fleet of its own; stopped at once, with
/// everything it started, when `interrupt` resolves first ([`Ran::Unsent`] before its first
/// arrival was due to be sent, [`Ran::Interrupted`] after).
#[allow(
    clippy::too_many_arguments,
    reason = "one run's inputs, passed down from the loop over seeds and targets"
)]
async fn run_one(
    scenario: &Scenario,
    spec: &FleetSpec,
    target: Target<'_>,
    arrivals: &Arc<Vec<Arrival>>,
    prompts: &Arc<Vec<Arc<str>>>,
    tokenizer: Option<Arc<infergate_tokenizer::ModelTokenizer>>,
    seed: u64,
    record_load: bool,
    progress: &mut dyn Progress,
    mut interrupt: Pin<&mut impl Future<Output = ()>>,
) -> Result<Ran, BenchError> {
    // The gateway and the load sampler stop on `stop_tx`, the fleet on `fleet_stop_tx`: after a
    // run the gateway goes first, so its scrapes never meet pods already gone.
    let (stop_tx, _stop_rx) = watch::channel(false);
    let (fleet_stop_tx, fleet_stop_rx) = watch::channel(false);
    let stop = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let kv_events = match target {
        Target::Front(f, _) if f.wants_kv_events() => Some(KvEventsOptions::default()),
        _ => None,
    };
    let options = ServeOptions {
        kv_events,
        tokenizer,
    };
    let fleet = infergate_sim::serve::serve_fleet_opts(
        spec,
        |pod| std::net::SocketAddr::from(([127, 0, 0, 1], pod.port)),
        &options,
        stop(fleet_stop_rx),
    )
    .await?;
    let served = fleet.addrs();
    let start = async {
        match target {
            Target::Gateway(policy) => {
                start_gateway(scenario, spec, &served, policy, seed, &stop_tx)
                    .await
                    .map(|gateway| (gateway.http_addr(), Some(gateway), None))
            }
            Target::Front(f, log) => {
                let pods: Vec<std::net::SocketAddr> = served.iter().map(|(_, a)| *a).collect();
                let feeds: Vec<_> = fleet.pods.iter().map(|p| p.kv_events).collect();
                let model = spec.pods.first().map_or("", |p| &*p.model);
                let run = crate::front::LogRun {
                    seed,
                    first: record_load,
                };
                f.start(&pods, &feeds, model, log, run)
                    .await
                    .map(|running| (running.addr(), None, Some(running)))
            }
        }
    };
    // A front can take minutes to get ready: an interrupt does not wait for it. Dropping its
    // start kills the front's process group; a gateway being started stops with the fleet.
    let started = tokio::select! {
        started = start => Some(started),
        () = interrupt.as_mut() => None,
    };
    let (front_addr, gateway, front) = match started {
        Some(Ok(started)) => started,
        other => {
            // The fleet is gone before the next run starts its own.
            stop_run(None, fleet, None, [&stop_tx, &fleet_stop_tx], None).await;
            return match other {
                Some(Err(e)) => Err(e),
                _ => Ok(Ran::Unsent),
            };
        }
    };
    // Let a few scrapes land so every policy starts from fresh metrics (and every front gets
    // the same head start). No arrival has been sent yet: an interrupt now leaves the run
    // unsent.
    let settled = tokio::select! {
        () = tokio::time::sleep(Duration::from_millis(200)) => true,
        () = interrupt.as_mut() => false,
    };
    if !settled {
        stop_run(front, fleet, gateway, [&stop_tx, &fleet_stop_tx], None).await;
        return Ok(Ran::Unsent);
    }

    let url: Arc<str> = format!("http://{front_addr}/v1/chat/completions").into();
    let model: Arc<str> = spec
        .pods
        .first()
        .map(|p| p.model.clone())
        .unwrap_or_default();
    let adapters: Arc<Vec<String>> = Arc::new(
        scenario
            .workload
            .lora
            .as_ref()
            .map(|l| l.adapters.clone())
            .unwrap_or_default(),
    );
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(connector);

    // Per-pod load sampler.
    let every_s = (scenario.workload.duration_s / 300.0).max(0.25);
    let load_task = record_load.then(|| {
        let handles: Vec<_> = fleet.pods.iter().map(|p| p.handle.clone()).collect();
        let mut rx = stop_tx.subscribe();
        tokio::spawn(async move {
            let mut series = vec![Vec::new(); handles.len()];
            let mut tick = tokio::time::interval(Duration::from_secs_f64(every_s));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        for (s, h) in series.iter_mut().zip(&handles) {
                            let v = h.view();
                            s.push(v.running + v.waiting);
                        }
                    }
                    _ = rx.wait_for(|v| *v) => break,
                }
            }
            series
        })
    });

    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let mut tasks = JoinSet::new();
    for (a, text) in arrivals.iter().zip(prompts.iter()) {
        let a = a.clone();
        let text = text.clone();
        let client = client.clone();
        let url = url.clone();
        let model = model.clone();
        let adapters = adapters.clone();
        tasks.spawn(async move {
            tokio::time::sleep_until(start + Duration::from_secs_f64(a.at)).await;
            let target = a
                .lora
                .and_then(|i| adapters.get(usize::from(i)).map(|s| s.as_str()))
                .unwrap_or(&model);
            send(&client, &url, target, &a, &text, start).await
        });
    }
    let mut outcomes = Vec::with_capacity(arrivals.len());
    let mut interrupted = false;
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                Some(joined) => {
                    outcomes.push(joined.unwrap_or(Outcome::Failed(Failure::Aborted)));
                    progress.advance(outcomes.len() as u64);
                }
                None => break,
            },
            () = interrupt.as_mut() => {
                interrupted = true;
                break;
            }
        }
    }
    // The requests not sent or not answered yet are abandoned; the front, the fleet and the
    // gateway are then stopped as after a complete run.
    tasks.shutdown().await;
    let (per_pod, load) =
        stop_run(front, fleet, gateway, [&stop_tx, &fleet_stop_tx], load_task).await;
    let load = load.map(|pods| LoadSeries { every_s, pods });
    if interrupted {
        return Ok(Ran::Interrupted);
    }

    let (mut ttft, mut itl, mut e2e) = (Vec::new(), Vec::new(), Vec::new());
    let (mut rejected, mut errors, mut out_tokens, mut last) = (0u64, 0u64, 0u64, 0.0f64);
    let mut prompt_tokens: Option<u64> = None;
    let mut failures = BTreeMap::new();
    for o in &outcomes {
        match o {
            Outcome::Done {
                ttft: t,
                e2e: e,
                output_tokens,
                prompt_tokens: counted,
                finished,
            } => {
                if let Some(n) = counted {
                    *prompt_tokens.get_or_insert(0) += u64::from(*n);
                }
                ttft.push(*t);
                e2e.push(*e);
                if *output_tokens > 1 {
                    itl.push((e - t) / f64::from(output_tokens - 1));
                }
                out_tokens += u64::from(*output_tokens);
                last = last.max(*finished);
            }
            Outcome::Rejected => rejected += 1,
            Outcome::Failed(why) => {
                errors += 1;
                *failures.entry(why.to_string()).or_insert(0u64) += 1;
            }
        }
    }
    let completed = ttft.len() as u64;
    let span = (last - arrivals.first().map_or(0.0, |a| a.at)).max(1e-9);
    let ttft_p = Percentiles::of(&mut ttft);
    let cdf = (1..=CDF_POINTS)
        .map(|i| quantile(&ttft, i as f64 / CDF_POINTS as f64))
        .collect();
    Ok(Ran::Done(Box::new(RunResult {
        policy: target.name().to_owned(),
        seed,
        requests: arrivals.len() as u64,
        completed,
        rejected,
        errors,
        ttft: ttft_p,
        itl: Percentiles::of(&mut itl),
        e2e: Percentiles::of(&mut e2e),
        requests_per_s: completed as f64 / span,
        output_tokens_per_s: out_tokens as f64 / span,
        per_pod_requests: per_pod,
        ttft_cdf: cdf,
        load,
        flow: None,
        prefix_hit_rate: None,
        records: None,
        failures,
        attempts: None,
        prompt_tokens,
    })))
}

/// Stops what a run started and waits for it: its front first (the pods still answering it),
/// then, through `stop[0]`, the gateway and the load sampler `load`, and last, through
/// `stop[1]`, the fleet, so that no scrape of the gateway's finds a pod gone (it logged "metrics
/// target failed" at the end of runs). Returns the requests each pod ended, counted once no
/// front sends more, and `load`'s series.
async fn stop_run(
    front: Option<RunningFront>,
    fleet: ServedFleet,
    gateway: Option<infergate_proxy::Gateway>,
    [stop, fleet_stop]: [&watch::Sender<bool>; 2],
    load: Option<JoinHandle<Vec<Vec<u32>>>>,
) -> (Vec<u64>, Option<Vec<Vec<u32>>>) {
    if let Some(front) = front {
        front.stop().await;
    }
    let per_pod: Vec<u64> = fleet
        .pods
        .iter()
        .map(|p| p.handle.requests_ended())
        .collect();
    let _ = stop.send(true);
    let load = match load {
        Some(t) => t.await.ok(),
        None => None,
    };
    if let Some(gateway) = gateway {
        gateway.wait().await;
    }
    let _ = fleet_stop.send(true);
    fleet.wait().await;
    (per_pod, load)
}

/// Sends arrival `a` to `url` (an OpenAI chat completions URL) as a streamed chat request for
/// `model`, its prompt the stand-in's text ([`workload::prompt_text`]), and reads the answer to
/// its end; `start` is the run's start, for [`Outcome::Done`]'s `finished`. A load generator of
/// its own (`crates/bench/examples/outlier.rs`) sends its arrivals with it; live mode sends
/// each with its prompt made for the run ([`crate::prompt::text`]).
pub async fn one_request(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    model: &str,
    a: &Arrival,
    start: tokio::time::Instant,
) -> Outcome {
    send(client, url, model, a, &workload::prompt_text(a), start).await
}

/// [`one_request`] with the prompt `text`.
async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    model: &str,
    a: &Arrival,
    text: &str,
    start: tokio::time::Instant,
) -> Outcome {
    let body = serde_json::json!({
        "model": model,
        "messages": [{ "role": "user", "content": text }],
        "max_tokens": a.output_tokens,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    let Ok(body) = serde_json::to_vec(&body) else {
        return Outcome::Failed(Failure::Request);
    };
    let Ok(req) = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
    else {
        return Outcome::Failed(Failure::Request);
    };
    let sent = tokio::time::Instant::now();
    let Ok(resp) = client.request(req).await else {
        return Outcome::Failed(Failure::Connect);
    };
    let status = resp.status().as_u16();
    if status == 429 || status == 503 {
        return Outcome::Rejected;
    }
    if status != 200 {
        return Outcome::Failed(Failure::Status(status));
    }
    let mut body = resp.into_body();
    let mut scanner = SseScanner::counting_text();
    let mut first = None;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Outcome::Failed(Failure::Stream);
        };
        if let Some(data) = frame.data_ref()
            && scanner.feed(data)
            && first.is_none()
        {
            first = Some(sent.elapsed().as_secs_f64());
        }
    }
    let e2e = sent.elapsed().as_secs_f64();
    scanner.finish();
    // A 200 whose body carried no text produced nothing: counting it as completed (with the
    // requested output tokens) would credit a front that answers everything with an error body.
    let Some(ttft) = first.or_else(|| scanner.saw_first_token().then_some(e2e)) else {
        return Outcome::Failed(Failure::NoText);
    };
    let usage = scanner.usage();
    // Without `usage` (a front that drops it), the events that carried text: one token each as
    // the engines stream, rather than the tokens asked for, which would credit a front that
    // cuts answers short with the whole output.
    let output_tokens = match usage {
        Some(u) => u32::try_from(u.completion_tokens).unwrap_or(u32::MAX),
        None => scanner
            .text_events()
            .map_or(a.output_tokens, |n| u32::try_from(n).unwrap_or(u32::MAX)),
    };
    Outcome::Done {
        ttft,
        e2e,
        output_tokens,
        prompt_tokens: usage.map(|u| u32::try_from(u.prompt_tokens).unwrap_or(u32::MAX)),
        finished: start.elapsed().as_secs_f64(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    /// A front that streams without `usage` is credited with the tokens it streamed (the
    /// events that carried text), not the tokens asked for: three of ten here. With `usage`, its
    /// count. (Before, ten either way without `usage`.)
    #[tokio::test]
    async fn without_usage_the_output_is_the_streamed_text_not_the_tokens_asked_for() {
        let chunk = |t: &str| {
            format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}}}}]}}\n\n")
        };
        let role = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
        let cut_short = format!(
            "{role}{}{}{}data: [DONE]\n\n",
            chunk("a"),
            chunk("b"),
            chunk("c")
        );
        let with_usage = format!(
            "{cut_short}data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":7}}}}\n\n"
        );
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let arrival = crate::workload::Arrival {
            id: 0,
            at: 0.0,
            prompt_tokens: 8,
            prefix_group: None,
            prefix_tokens: 0,
            output_tokens: 10,
            lora: None,
            priority: Default::default(),
            tenant: 0,
        };
        for (body, want, prompt) in [(cut_short, 3, None), (with_usage, 7, Some(5))] {
            let front = infergate_testkit::scripted::scripted_server(Arc::new(move |_| {
                (200, "text/event-stream", body.clone())
            }))
            .await;
            let url = format!("http://{front}/v1/chat/completions");
            let start = tokio::time::Instant::now();
            match send(&client, &url, "m", &arrival, "hello", start).await {
                Outcome::Done {
                    output_tokens,
                    prompt_tokens,
                    ..
                } => assert_eq!((output_tokens, prompt_tokens), (want, prompt)),
                other => panic!("{other:?}"),
            }
        }
    }

    /// The pods of `spec` as if served on 127.0.0.1 from port 9000 on.
    fn loopback(spec: &FleetSpec) -> Vec<(String, std::net::SocketAddr)> {
        spec.pods
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), ([127, 0, 0, 1], 9000 + i as u16).into()))
            .collect()
    }

    const ONE_POD: &str = "name: s\nfleet: [{ name: a, profile: llama-3.1-8b/h100, replicas: 2 }]\nworkload:\n  duration_s: 1\n  arrival: { kind: poisson, rate: 1 }\n  prompt_tokens: { dist: fixed, value: 8 }\n  output_tokens: { dist: fixed, value: 2 }\n";

    /// Every scrape interval a scenario may give (at least 1 ms, any lag) makes a gateway
    /// configuration the gateway accepts — not only those below its default staleness
    /// threshold of 250 ms — with the threshold the simulator applies.
    #[test]
    fn the_gateway_accepts_the_scrape_settings_of_every_valid_interval() {
        let catalog = Catalog::builtin().unwrap();
        for interval in [
            1.0, 1.4, 50.0, 124.6, 250.0, 251.0, 300.0, 5_000.0, 1e9, 1e20,
        ] {
            for lag in [0.0, 10.0, 2_000.0] {
                let yaml =
                    format!("{ONE_POD}scrape: {{ interval_ms: {interval}, lag_ms: {lag} }}\n");
                let scenario = Scenario::from_yaml(&yaml, "s").unwrap();
                let spec = scenario.fleet_spec(&catalog, "s").unwrap();
                let served = loopback(&spec);
                for policy in ["round-robin", "infergate"] {
                    let policy: RoutePolicy = policy.parse().unwrap();
                    let cfg =
                        gateway_config(&scenario, &spec, &served, &policy, 1).unwrap_or_else(|e| {
                            panic!("interval {interval}, lag {lag}: {}", e.with_causes())
                        });
                    assert!(cfg.scrape.stale_after >= cfg.scrape.interval);
                    assert!(cfg.scrape.max_late >= cfg.scrape.timeout);
                    assert!(cfg.scrape.to_scraper_config().validate().is_ok());
                }
            }
        }
        let scrape = |interval_ms, lag_ms| {
            GatewayScrape::for_scenario(&scenario::Scrape {
                interval_ms,
                lag_ms,
            })
        };
        // The default scenario keeps the gateway's defaults.
        let defaults = infergate_proxy::config::Scrape::default();
        let base = scrape(50.0, 10.0);
        assert_eq!(
            (base.interval_ms, base.stale_after_ms),
            (50, defaults.stale_after.as_millis() as u64)
        );
        assert_eq!(
            (base.timeout_ms, base.max_late_ms),
            (
                defaults.timeout.as_millis() as u64,
                defaults.max_late.as_millis() as u64
            )
        );
        // Above it, two intervals and the lag, as the simulator judges a pod overdue.
        assert_eq!(scrape(300.0, 10.0).stale_after_ms, 610);
        assert_eq!(scrape(1_000.0, 0.0).stale_after_ms, 2_000);
        // The infergate preset's 2 s bound on metrics age is raised past the threshold and one
        // interval, as the gateway does; the baselines have none.
        use infergate_scheduler::Preset;
        assert_eq!(
            scrape(50.0, 10.0).max_metrics_age_ms(Preset::Infergate),
            Some(2_000)
        );
        assert_eq!(
            scrape(1_000.0, 0.0).max_metrics_age_ms(Preset::Infergate),
            Some(3_000)
        );
        assert_eq!(
            scrape(1_000.0, 0.0).max_metrics_age_ms(Preset::RoundRobin),
            None
        );
    }

    /// The scenario's retries reach the live gateway, and so does a policy entry's outlier
    /// detection: its settings, or `null` (off in a preset that has it on); a preset alone
    /// runs as the gateway's preset does.
    #[test]
    fn retries_and_policy_entries_reach_the_gateway() {
        use infergate_scheduler::outlier::OutlierDetection;
        let catalog = Catalog::builtin().unwrap();
        let scenario = Scenario::from_yaml(
            &format!(
                "{ONE_POD}retries: {{ maxAttempts: 1 }}\npolicies:\n  - infergate\n  - {{ name: no-od, preset: infergate, outlierDetection: null }}\n  - {{ name: rr-od, preset: round-robin, outlierDetection: {{ consecutive5xx: 2, failurePercentage: {{}} }} }}\n"
            ),
            "s",
        )
        .unwrap();
        check(&scenario, "s", &Fronts::default()).unwrap();
        let spec = scenario.fleet_spec(&catalog, "s").unwrap();
        let served = loopback(&spec);
        let od = |i: usize| {
            let cfg = gateway_config(&scenario, &spec, &served, &scenario.policies[i], 1).unwrap();
            assert_eq!(cfg.retries.max_attempts, 1);
            cfg.models[0].scheduler.outlier_detection
        };
        assert_eq!(od(0), Some(OutlierDetection::default()));
        assert_eq!(od(1), None);
        let rr = od(2).unwrap();
        assert_eq!(rr.consecutive_5xx, 2);
        assert!(rr.failure_percentage.is_some());
    }
}
