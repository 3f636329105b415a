//! Results and reports: per-run numbers, the summary over seeds, verdicts against the scenario's
//! targets, and the markdown / JSON / SVG files.
//!
//! Layout: this file holds the result types and the summary; `report/markdown.rs` the tables;
//! `report/svg.rs` the plots (hand-written SVG, no plotting dependency).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::BenchError;
use crate::scenario::Scenario;
use crate::simulate::LoadSeries;
use crate::stats::{Percentiles, Spread};

pub mod flow;
mod markdown;
mod svg;

pub use flow::{BaselineRun, FlowReport, FlowRun, GroupStats, RejectStats, StaleStats};

/// One panel of [`time_series_svg`]: a title, the values' unit, and named `(seconds, value)`
/// series.
pub struct Panel<'a> {
    /// What the panel shows.
    pub title: &'a str,
    /// The unit of the values.
    pub unit: &'a str,
    /// Named series of `(seconds since start, value)` points.
    pub series: Vec<(&'a str, Vec<(f64, f64)>)>,
}

/// A plot of values over time, one panel per [`Panel`] on a shared time axis (the soak run's
/// RSS, open fds and latency figures).
pub fn time_series_svg(title: &str, panels: &[Panel<'_>]) -> String {
    svg::time_series(title, panels)
}

/// Relative change of a policy's TTFT percentile under which a uniform-fleet run still counts as
/// "not worse than round-robin" (run-to-run noise of the seeds used).
pub const NOISE: f64 = 0.05;

/// One pod of the fleet, as reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodInfo {
    /// Pod name.
    pub name: String,
    /// Simulator profile.
    pub profile: String,
    /// GPU.
    pub gpu: String,
    /// Engine flavour.
    pub engine: String,
}

impl PodInfo {
    /// One entry per pod of a fleet, in fleet order.
    pub fn list(spec: &infergate_sim::FleetSpec) -> Vec<PodInfo> {
        spec.pods
            .iter()
            .map(|p| PodInfo {
                name: p.name.clone(),
                profile: p.profile.id.clone(),
                gpu: p.profile.gpu.clone(),
                engine: p.engine.as_str().to_owned(),
            })
            .collect()
    }
}

/// One policy on one seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Policy (scheduler preset).
    pub policy: String,
    /// Seed.
    pub seed: u64,
    /// Requests offered.
    pub requests: u64,
    /// Requests completed.
    pub completed: u64,
    /// Requests the router refused (429 / 503).
    pub rejected: u64,
    /// Requests no pod accepted (after fallbacks).
    pub errors: u64,
    /// Time to first token (s).
    pub ttft: Percentiles,
    /// Mean inter-token latency per request (s).
    pub itl: Percentiles,
    /// End-to-end latency (s).
    pub e2e: Percentiles,
    /// Completed requests per second, from the first arrival to the last completion.
    pub requests_per_s: f64,
    /// Output tokens per second over the same span.
    pub output_tokens_per_s: f64,
    /// Completed requests per pod, in fleet order.
    pub per_pod_requests: Vec<u64>,
    /// TTFT quantiles at 1/200, 2/200, ..., 1 (for the CDF plot).
    pub ttft_cdf: Vec<f64>,
    /// Per-pod load over time (first seed only).
    pub load: Option<LoadSeries>,
    /// Flow-control figures (scenarios with a `flow:` section).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<FlowRun>,
    /// Prompt tokens served from the pods' prefix caches over all prompt tokens of completed
    /// requests, 0–1 (simulated runs; `None` when not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_hit_rate: Option<f64>,
    /// One record per completed request, in completion order, when the run kept them
    /// ([`crate::simulate::RunOptions::requests`]); written as CSV beside the report, not in
    /// its JSON.
    #[serde(skip)]
    pub records: Option<Vec<RequestRecord>>,
    /// Why the run's failed requests (`errors`) failed: a reason (`HTTP 500`, `no connection
    /// or no response`, …) and how many (live runs; empty when none failed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failures: BTreeMap<String, u64>,
    /// What the attempts of the run's requests met, in a simulated run of a scenario with
    /// failing pods ([`Scenario::has_failing_pods`]); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Attempts>,
    /// Prompt tokens of the completed requests, as the server counted them (each answer's
    /// `usage.prompt_tokens`: the pods', in the model's tokens with `--tokenizer`); live runs,
    /// `None` when no answer said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
}

/// The attempts of a simulated run's requests, as the gateway makes them: a request a pod fails
/// is tried on the next pod of its pick, up to the scenario's `retries.maxAttempts`, and each
/// answer is reported to the scheduler's outlier detection.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Attempts {
    /// Requests sent to a pod at least once.
    pub requests: u64,
    /// Attempts sent to pods: first attempts and retries.
    pub sent: u64,
    /// Of those, attempts the pod failed.
    pub failed: u64,
    /// First attempts that went to a pod failing requests at the time (an `error_rate` above 0).
    pub first_to_failing: u64,
    /// First attempts per pod, in fleet order.
    pub first_per_pod: Vec<u64>,
    /// Requests whose every attempt failed (counted in the run's `errors` too).
    pub exhausted: u64,
    /// Pods ejected by the scheduler's outlier detection.
    pub ejections: u64,
    /// Ejections due but held back by `maxEjectionPercent`.
    pub held_back: u64,
}

impl Attempts {
    /// Counters at 0 for a fleet of `pods`.
    pub fn new(pods: usize) -> Self {
        Attempts {
            first_per_pod: vec![0; pods],
            ..Attempts::default()
        }
    }

    /// Attempts per request sent.
    pub fn per_request(&self) -> f64 {
        self.sent as f64 / self.requests.max(1) as f64
    }

    /// Share of first attempts that went to a failing pod, 0–1.
    pub fn first_to_failing_share(&self) -> f64 {
        self.first_to_failing as f64 / self.requests.max(1) as f64
    }
}

impl RunResult {
    /// A run that did not take place (its front did not start): none of its `requests` was
    /// sent, each counts as failed for `why`, so that its row shows no latencies and the reason
    /// is listed with the other failures.
    pub fn not_started(policy: &str, seed: u64, requests: u64, pods: usize, why: String) -> Self {
        RunResult {
            policy: policy.to_owned(),
            seed,
            requests,
            completed: 0,
            rejected: 0,
            errors: requests,
            ttft: Percentiles::default(),
            itl: Percentiles::default(),
            e2e: Percentiles::default(),
            requests_per_s: 0.0,
            output_tokens_per_s: 0.0,
            per_pod_requests: vec![0; pods],
            ttft_cdf: Vec::new(),
            load: None,
            flow: None,
            prefix_hit_rate: None,
            records: None,
            failures: BTreeMap::from([(why, requests)]),
            attempts: None,
            prompt_tokens: None,
        }
    }

    /// [`RunResult::failures`] as `N × REASON`, comma-separated (empty when there are none).
    pub fn failure_reasons(&self) -> String {
        let why: Vec<String> = self
            .failures
            .iter()
            .map(|(reason, n)| format!("{n} × {reason}"))
            .collect();
        why.join(", ")
    }
}

/// One completed request of a simulated run: where it went and where its time to first token
/// went. Times in seconds of the run's virtual clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestRecord {
    /// The arrival's id (its index in the seed's arrivals).
    pub id: u64,
    /// When it arrived at the gateway.
    pub arrival_s: f64,
    /// The pod that served it (index in fleet order).
    pub pod: u32,
    /// Its LoRA adapter (index in the workload's `lora.adapters`), if it named one.
    pub adapter: Option<u16>,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Of those, served from the pod's prefix cache.
    pub cached_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// Time held at the gateway before it was sent (flow control; 0 otherwise).
    pub gateway_s: f64,
    /// Time in the pod's queue until it first entered the running batch.
    pub queue_s: f64,
    /// From entering the batch to the first token: its prefill, and what shared its steps.
    pub prefill_s: f64,
    /// Time to first token from arrival (`gateway_s + queue_s + prefill_s`).
    pub ttft_s: f64,
    /// From arrival to the last token.
    pub e2e_s: f64,
    /// Times it was preempted and recomputed.
    pub preemptions: u32,
}

/// The CSV header of [`Report::requests_csv`].
pub const REQUESTS_CSV_HEADER: &str = "id,arrival_s,pod,pod_name,gpu,adapter,prompt_tokens,cached_tokens,output_tokens,gateway_s,queue_s,prefill_s,ttft_s,e2e_s,preemptions";

/// The clairvoyant floor for one seed's arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FloorResult {
    /// Seed.
    pub seed: u64,
    /// TTFT of each request's uncached prefill on its fastest pod, no queueing (s).
    pub ttft: Percentiles,
}

/// One policy over all seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicySummary {
    /// Policy.
    pub policy: String,
    /// TTFT P50 (s).
    pub ttft_p50: Spread,
    /// TTFT P95 (s).
    pub ttft_p95: Spread,
    /// TTFT P99 (s).
    pub ttft_p99: Spread,
    /// Inter-token latency P50 (s).
    pub itl_p50: Spread,
    /// Inter-token latency P99 (s).
    pub itl_p99: Spread,
    /// End-to-end P50 (s).
    pub e2e_p50: Spread,
    /// End-to-end P99 (s).
    pub e2e_p99: Spread,
    /// Completed requests per second.
    pub requests_per_s: Spread,
    /// Output tokens per second.
    pub output_tokens_per_s: Spread,
    /// Rejected requests per run.
    pub rejected: Spread,
    /// Failed requests per run.
    pub errors: Spread,
    /// TTFT P95 change against round-robin on the same seed (−0.97 = 97% lower), over the
    /// runs that completed requests, on seeds where round-robin did too; `None` when there are
    /// none.
    pub ttft_p95_vs_rr: Option<Spread>,
    /// TTFT P99 change against round-robin on the same seed, as `ttft_p95_vs_rr`.
    pub ttft_p99_vs_rr: Option<Spread>,
    /// Output-throughput change against round-robin on the same seed, as `ttft_p95_vs_rr`: a
    /// run that completed nothing (a front or gateway that did not start, or served nothing)
    /// has no throughput to compare, not a change of −100%.
    pub throughput_vs_rr: Option<Spread>,
    /// TTFT P99 as a multiple of the clairvoyant floor's P99 on the same seed, over the runs
    /// that completed requests; `None` when none did.
    pub ttft_p99_vs_floor: Option<Spread>,
    /// Share of completed requests per pod (mean over the runs that completed any); `None`
    /// when no run completed a request: a policy that served nothing has no shares, not a
    /// share of 0 on every pod.
    #[serde(default)]
    pub pod_share: Option<Vec<f64>>,
    /// Runs of this policy (one per seed).
    #[serde(default)]
    pub runs: u32,
    /// Of those, runs in which no request completed. They have no latencies, so the latency
    /// figures, the comparisons with round-robin (throughput's too) and the floor ratio leave
    /// them out; when every run is empty the comparisons are `None` (the tables show "—").
    #[serde(default)]
    pub empty_runs: u32,
}

impl PolicySummary {
    /// Whether some run of this policy completed a request, so that it has latency figures.
    pub fn has_latencies(&self) -> bool {
        self.empty_runs < self.runs
    }
}

/// Whether a target holds for the `infergate` policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// What is required.
    pub target: String,
    /// What was measured (mean over seeds, with range).
    pub measured: String,
    /// Met or not.
    pub met: bool,
}

/// A scenario's full result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The scenario as run.
    pub scenario: Scenario,
    /// `simulated` or `live`.
    pub mode: String,
    /// The fleet.
    pub pods: Vec<PodInfo>,
    /// Every run.
    pub runs: Vec<RunResult>,
    /// The clairvoyant floor per seed.
    pub floors: Vec<FloorResult>,
    /// Per policy, over seeds.
    pub summary: Vec<PolicySummary>,
    /// The `infergate` policy against the scenario's targets.
    pub verdicts: Vec<Verdict>,
    /// Flow-control comparison (scenarios with a `flow:` section).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<FlowReport>,
    /// Where each external front's output went (live runs with fronts), in report order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub front_logs: Vec<FrontLog>,
    /// What the policies' gateways ran with (live runs of policies; `None` otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<LiveGateway>,
    /// The model tokenizer a live bench sized its prompts with and served its pods with
    /// (`--tokenizer`); `None`: the emulator's stand-in (4 bytes a token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<PathBuf>,
    /// Set when the bench was stopped before every run completed (Ctrl-C or SIGTERM, live or
    /// simulated): the report is partial, its figures are over the runs that completed, and
    /// this says which did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<Interrupted>,
}

/// What an interrupted bench did not run ([`Report::interrupted`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interrupted {
    /// The runs that are not in the report, in the order they would have run: the one stopped
    /// part-way (its requests' figures dropped), then those never started.
    pub not_run: Vec<NotRun>,
}

/// A run of a policy or front on a seed that an interrupted bench did not complete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotRun {
    /// The policy or front.
    pub policy: String,
    /// The seed.
    pub seed: u64,
    /// Whether it had begun sending its arrivals and was stopped part-way (otherwise none of
    /// them was sent).
    pub stopped: bool,
}

impl Interrupted {
    /// The runs not run as `POLICY seed N`, the one stopped part-way said so, comma-separated.
    pub fn list(&self) -> String {
        let runs: Vec<String> = self
            .not_run
            .iter()
            .map(|r| {
                format!(
                    "{} seed {}{}",
                    r.policy,
                    r.seed,
                    if r.stopped { " (stopped part-way)" } else { "" }
                )
            })
            .collect();
        runs.join(", ")
    }
}

/// The settings a live run's gateway ran with besides its policy's preset
/// ([`crate::live::GatewayScrape::for_scenario`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveGateway {
    /// Its `scrape:` section, derived from the scenario's.
    pub scrape: crate::live::GatewayScrape,
    /// Per policy whose preset drops pods on the age of their metrics: the bound it ran with,
    /// in milliseconds ([`crate::live::GatewayScrape::max_metrics_age_ms`]).
    #[serde(default)]
    pub max_metrics_age_ms: BTreeMap<String, u64>,
}

/// Where an external front's output went ([`crate::live::Fronts::log_path`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontLog {
    /// The front's name (its row in the report).
    pub front: String,
    /// Its log file.
    pub log: PathBuf,
}

fn change(new: f64, base: f64) -> f64 {
    if base > 0.0 { new / base - 1.0 } else { 0.0 }
}

impl Report {
    /// Builds the summary and verdicts from the runs.
    pub fn new(
        scenario: Scenario,
        mode: &str,
        pods: Vec<PodInfo>,
        runs: Vec<RunResult>,
        floors: Vec<FloorResult>,
    ) -> Self {
        let mut policies: Vec<&str> = Vec::new();
        for r in &runs {
            if !policies.contains(&r.policy.as_str()) {
                policies.push(&r.policy);
            }
        }
        // A run in which nothing completed has no latencies: its zeros would read as the best
        // figures of the table, so it is left out of every latency, comparison and share.
        let baseline = |seed: u64| {
            runs.iter()
                .find(|r| r.policy == "round-robin" && r.seed == seed && r.completed > 0)
        };
        let floor = |seed: u64| floors.iter().find(|f| f.seed == seed);
        let summary: Vec<PolicySummary> = policies
            .iter()
            .map(|&p| {
                let mine: Vec<&RunResult> = runs.iter().filter(|r| r.policy == p).collect();
                let served: Vec<&RunResult> =
                    mine.iter().copied().filter(|r| r.completed > 0).collect();
                let s = |f: &dyn Fn(&RunResult) -> f64| Spread::of(mine.iter().map(|r| f(r)));
                let lat = |f: &dyn Fn(&RunResult) -> f64| Spread::of(served.iter().map(|r| f(r)));
                let vs_rr = |f: &dyn Fn(&RunResult) -> f64, of: &[&RunResult]| {
                    let v: Vec<f64> = of
                        .iter()
                        .filter_map(|r| baseline(r.seed).map(|b| change(f(r), f(b))))
                        .collect();
                    (!v.is_empty()).then(|| Spread::of(v))
                };
                let pods = mine.first().map_or(0, |r| r.per_pod_requests.len());
                let pod_share = (!served.is_empty()).then(|| {
                    (0..pods)
                        .map(|i| {
                            served
                                .iter()
                                .map(|r| {
                                    let total: u64 = r.per_pod_requests.iter().sum();
                                    r.per_pod_requests.get(i).copied().unwrap_or(0) as f64
                                        / total.max(1) as f64
                                })
                                .sum::<f64>()
                                / served.len() as f64
                        })
                        .collect()
                });
                PolicySummary {
                    policy: p.to_owned(),
                    ttft_p50: lat(&|r| r.ttft.p50),
                    ttft_p95: lat(&|r| r.ttft.p95),
                    ttft_p99: lat(&|r| r.ttft.p99),
                    itl_p50: lat(&|r| r.itl.p50),
                    itl_p99: lat(&|r| r.itl.p99),
                    e2e_p50: lat(&|r| r.e2e.p50),
                    e2e_p99: lat(&|r| r.e2e.p99),
                    requests_per_s: s(&|r| r.requests_per_s),
                    output_tokens_per_s: s(&|r| r.output_tokens_per_s),
                    rejected: s(&|r| r.rejected as f64),
                    errors: s(&|r| r.errors as f64),
                    ttft_p95_vs_rr: vs_rr(&|r| r.ttft.p95, &served),
                    ttft_p99_vs_rr: vs_rr(&|r| r.ttft.p99, &served),
                    // Over the runs that completed requests: one that completed none would
                    // read as −100%, a figure for a run that did not take place.
                    throughput_vs_rr: vs_rr(&|r| r.output_tokens_per_s, &served),
                    ttft_p99_vs_floor: {
                        let v: Vec<f64> = served
                            .iter()
                            .filter_map(|r| {
                                floor(r.seed).map(|f| r.ttft.p99 / f.ttft.p99.max(1e-9))
                            })
                            .collect();
                        (!v.is_empty()).then(|| Spread::of(v))
                    },
                    pod_share,
                    runs: u32::try_from(mine.len()).unwrap_or(u32::MAX),
                    empty_runs: u32::try_from(mine.len() - served.len()).unwrap_or(u32::MAX),
                }
            })
            .collect();
        let verdicts = verdicts(&scenario, &summary);
        Report {
            scenario,
            mode: mode.to_owned(),
            pods,
            runs,
            floors,
            summary,
            verdicts,
            flow: None,
            front_logs: Vec::new(),
            gateway: None,
            tokenizer: None,
            interrupted: None,
        }
    }

    /// The summary of one policy.
    pub fn policy(&self, name: &str) -> Option<&PolicySummary> {
        self.summary.iter().find(|s| s.policy == name)
    }

    /// The report as markdown: tables and verdicts, plots linked by file name.
    pub fn markdown(&self) -> String {
        markdown::render(self)
    }

    /// The comparison table alone (for the terminal), and the flow-control tables.
    pub fn table(&self) -> String {
        let mut t = markdown::table(self);
        if let Some(f) = &self.flow {
            t.push('\n');
            t.push_str(&flow::markdown(&self.scenario, f));
        }
        t
    }

    /// TTFT CDF per policy (first seed), as SVG.
    pub fn ttft_cdf_svg(&self) -> String {
        svg::ttft_cdf(self)
    }

    /// Per-pod load over time for each policy (first seed), as SVG.
    pub fn load_svg(&self) -> String {
        svg::load(self)
    }

    /// Writes `NAME.md`, `NAME.json`, `NAME-ttft-cdf.svg` and `NAME-load.svg` (and the runs'
    /// request CSVs) into `dir` (created if missing) and returns their paths.
    ///
    /// All or nothing: every file is first written beside its place as `.FILE.partial`, and
    /// only once all are complete are they renamed into place, so a failed or interrupted write
    /// leaves the previous report (or none), never a new markdown beside an old JSON.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
        std::fs::create_dir_all(dir).map_err(|source| BenchError::Write {
            path: dir.to_owned(),
            source,
        })?;
        let name = format!("{}-{}", self.scenario.name, self.mode);
        let mut files = vec![
            (format!("{name}.md"), self.markdown()),
            (format!("{name}.json"), serde_json::to_string_pretty(self)?),
            (format!("{name}-ttft-cdf.svg"), self.ttft_cdf_svg()),
            (format!("{name}-load.svg"), self.load_svg()),
        ];
        for run in &self.runs {
            if let Some(csv) = self.requests_csv(run) {
                files.push((
                    format!("{name}-{}-seed{}-requests.csv", run.policy, run.seed),
                    csv,
                ));
            }
        }
        let mut staged: Vec<(PathBuf, PathBuf)> = Vec::with_capacity(files.len());
        let staged_all = (|| {
            for (file, text) in &files {
                let path = dir.join(file);
                if path.is_dir() {
                    return Err(BenchError::Write {
                        source: std::io::Error::other("a folder has the report file's name"),
                        path,
                    });
                }
                let partial = dir.join(format!(".{file}.partial"));
                std::fs::write(&partial, text).map_err(|source| BenchError::Write {
                    path: partial.clone(),
                    source,
                })?;
                staged.push((partial, path));
            }
            Ok(())
        })();
        if let Err(e) = staged_all {
            for (partial, _) in &staged {
                let _ = std::fs::remove_file(partial);
            }
            return Err(e);
        }
        let mut out = Vec::with_capacity(staged.len());
        for (partial, path) in staged {
            std::fs::rename(&partial, &path).map_err(|source| BenchError::Write {
                path: path.clone(),
                source,
            })?;
            out.push(path);
        }
        Ok(out)
    }

    /// A run's per-request records as CSV ([`REQUESTS_CSV_HEADER`], one line per request in
    /// completion order, pods and adapters also by name); `None` when the run kept none.
    pub fn requests_csv(&self, run: &RunResult) -> Option<String> {
        use std::fmt::Write as _;
        let records = run.records.as_ref()?;
        let adapters = self
            .scenario
            .workload
            .lora
            .as_ref()
            .map(|l| l.adapters.as_slice())
            .unwrap_or_default();
        let mut csv = String::with_capacity(96 * (records.len() + 1));
        csv.push_str(REQUESTS_CSV_HEADER);
        csv.push('\n');
        for r in records {
            let pod = self.pods.get(r.pod as usize);
            let adapter = r
                .adapter
                .and_then(|i| adapters.get(usize::from(i)))
                .map_or("", String::as_str);
            // Writing into a String cannot fail.
            let _ = writeln!(
                csv,
                "{},{:.6},{},{},{},{},{},{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{}",
                r.id,
                r.arrival_s,
                r.pod,
                CsvField(pod.map_or("", |p| p.name.as_str())),
                CsvField(pod.map_or("", |p| p.gpu.as_str())),
                CsvField(adapter),
                r.prompt_tokens,
                r.cached_tokens,
                r.output_tokens,
                r.gateway_s,
                r.queue_s,
                r.prefill_s,
                r.ttft_s,
                r.e2e_s,
                r.preemptions,
            );
        }
        Some(csv)
    }
}

/// A text field of a CSV row: as is, or in double quotes with its quotes doubled when it holds
/// a comma, a quote or a line break (RFC 4180). Pod group and adapter names are the scenario
/// author's and may hold any of them.
struct CsvField<'a>(&'a str);

impl std::fmt::Display for CsvField<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.contains([',', '"', '\n', '\r']) {
            write!(f, "\"{}\"", self.0.replace('"', "\"\""))
        } else {
            f.write_str(self.0)
        }
    }
}

fn pct(s: &Spread) -> String {
    format!(
        "{:+.1}% ({:+.1}…{:+.1})",
        s.mean * 100.0,
        s.min * 100.0,
        s.max * 100.0
    )
}

fn verdicts(scenario: &Scenario, summary: &[PolicySummary]) -> Vec<Verdict> {
    let t = &scenario.targets;
    let mut out = Vec::new();
    let Some(ig) = summary.iter().find(|s| s.policy == "infergate") else {
        return out;
    };
    if ig.empty_runs > 0 {
        // The latency verdicts below are over the runs that completed requests; a run that
        // completed none is a miss of its own, not a run to leave out quietly.
        out.push(Verdict {
            target: "requests completed in every run".into(),
            measured: format!("none in {} of {} runs", ig.empty_runs, ig.runs),
            met: false,
        });
    }
    for (name, target, got) in [
        ("TTFT P95", t.ttft_p95_reduction, &ig.ttft_p95_vs_rr),
        ("TTFT P99", t.ttft_p99_reduction, &ig.ttft_p99_vs_rr),
    ] {
        if let (Some(target), Some(got)) = (target, got) {
            out.push(Verdict {
                target: format!("{name} ≥ {:.0}% below round-robin", target * 100.0),
                measured: pct(got),
                // A hair of tolerance: −0.9 computed from ratios can land at −0.8999999.
                met: -got.mean >= target - 1e-9,
            });
        }
    }
    if t.throughput_not_lower
        && let Some(got) = &ig.throughput_vs_rr
    {
        out.push(Verdict {
            target: "output throughput not lower than round-robin (−1% noise allowed)".into(),
            measured: pct(got),
            met: got.mean >= -0.01,
        });
    }
    if t.not_worse_than_round_robin
        && let (Some(p95), Some(p99)) = (&ig.ttft_p95_vs_rr, &ig.ttft_p99_vs_rr)
    {
        out.push(Verdict {
            target: format!(
                "TTFT P95 and P99 not worse than round-robin beyond noise (+{:.0}%)",
                NOISE * 100.0
            ),
            measured: format!("P95 {}, P99 {}", pct(p95), pct(p99)),
            met: p95.mean <= NOISE && p99.mean <= NOISE,
        });
    }
    if t.beat_gie_default
        && let Some(gie) = summary.iter().find(|s| s.policy == "gie-default")
    {
        out.push(Verdict {
            target: "TTFT P95 and P99 below gie-default's".into(),
            measured: format!(
                "P95 {} vs {}, P99 {} vs {}",
                secs(ig.ttft_p95.mean),
                secs(gie.ttft_p95.mean),
                secs(ig.ttft_p99.mean),
                secs(gie.ttft_p99.mean)
            ),
            met: ig.ttft_p95.mean < gie.ttft_p95.mean && ig.ttft_p99.mean < gie.ttft_p99.mean,
        });
    }
    if let (Some(m), Some(got)) = (t.floor_multiple, &ig.ttft_p99_vs_floor) {
        out.push(Verdict {
            target: format!("TTFT P99 within {m}× the clairvoyant floor"),
            measured: format!("{:.2}× ({:.2}…{:.2})", got.mean, got.min, got.max),
            met: got.mean <= m,
        });
    }
    out
}

/// A duration in seconds, written with a unit that keeps three significant figures.
pub fn secs(s: f64) -> String {
    let mut out = String::new();
    if s < 1.0 {
        let _ = write!(out, "{:.0} ms", s * 1e3);
    } else if s < 100.0 {
        let _ = write!(out, "{s:.2} s");
    } else {
        let _ = write!(out, "{s:.0} s");
    }
    out
}

#[cfg(test)]
mod tests;
