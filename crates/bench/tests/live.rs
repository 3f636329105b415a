//! Live mode end to end: emulated pods on 127.0.0.1, the standalone gateway in front, real
//! streaming HTTP requests.

#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use std::path::Path;
use std::time::Duration;

use infergate_bench::live::{Fronts, run_with_fronts};
use infergate_bench::scenario::LoraSpec;
use infergate_bench::{BenchError, Front, Progress, Scenario, Silent};

const TINY: &str = r#"
name: tiny-live
fleet:
  - { name: h100, profile: llama-3.1-8b/h100 }
  - { name: a10g, profile: llama-3.1-8b/a10g }
workload:
  duration_s: 3
  arrival: { kind: poisson, rate: 4 }
  prompt_tokens: { dist: uniform, min: 50, max: 400 }
  output_tokens: { dist: uniform, min: 4, max: 16 }
seeds: [5]
policies: [round-robin, infergate]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_runs_account_for_every_request_through_the_gateway() {
    let scenario = Scenario::from_yaml(TINY, "tiny").unwrap();
    let report = infergate_bench::live::run(&scenario, "tiny", &mut Silent)
        .await
        .unwrap();
    assert_eq!(report.mode, "live");
    assert_eq!(report.runs.len(), 2);
    for r in &report.runs {
        assert!(r.requests >= 4, "{}", r.requests);
        assert_eq!(r.errors + r.rejected, 0, "{}: {r:?}", r.policy);
        assert_eq!(r.completed, r.requests);
        // The pods ended as many requests as the client completed.
        assert_eq!(r.per_pod_requests.iter().sum::<u64>(), r.completed);
        assert!(r.ttft.p50 > 0.0 && r.ttft.p99 <= r.e2e.p99);
        assert!(r.load.as_ref().unwrap().pods.len() == 2);
    }
    // Round-robin alternates: both pods served.
    let rr = &report.runs[0];
    assert!(
        rr.per_pod_requests.iter().all(|n| *n > 0),
        "{:?}",
        rr.per_pod_requests
    );
}

/// `--tokenizer` with the tiny tokenizer: every prompt is sized in its tokens and the pods serve
/// with it, so the prompt tokens the pods count (`usage.prompt_tokens`, summed per run) are the
/// tiny tokenizer's count of each chat request — template included — and not the stand-in's
/// count of the stand-in's text, which a run without it reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_models_tokenizer_sizes_the_prompts_and_counts_their_tokens() {
    use infergate_bench::prompt::ModelPrompts;
    use infergate_tokenizer::ChatRequest;
    let mut scenario = Scenario::from_yaml(TINY, "tiny").unwrap();
    scenario.policies = vec!["round-robin".parse().unwrap()];
    scenario.workload.duration_s = 2.0;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/fixtures/tiny");
    let prompts = std::sync::Arc::new(ModelPrompts::load(&dir).unwrap());
    let logs = tempfile::tempdir().unwrap();
    let mut fronts = Fronts {
        list: Vec::new(),
        log_dir: logs.path().to_owned(),
        tokenizer: None,
    };
    let standin = run_with_fronts(&scenario, "tiny", &fronts, &mut Silent)
        .await
        .unwrap();
    fronts.tokenizer = Some(prompts.clone());
    let model = run_with_fronts(&scenario, "tiny", &fronts, &mut Silent)
        .await
        .unwrap();
    // What the tiny tokenizer counts in each arrival's chat request, as vLLM would.
    let arrivals = infergate_bench::workload::generate(&scenario.workload, 5);
    let mut ids = Vec::new();
    let mut expected = 0u64;
    for a in &arrivals {
        let text = prompts.text(a);
        assert_eq!(prompts.count(&text).unwrap(), a.prompt_tokens);
        let body = serde_json::json!({"messages": [{"role": "user", "content": &*text}]});
        let request = ChatRequest::from_json(body.to_string().as_bytes()).unwrap();
        prompts.tokenizer().encode_chat(&request, &mut ids).unwrap();
        expected += ids.len() as u64;
    }
    let (s, m) = (&standin.runs[0], &model.runs[0]);
    for r in [s, m] {
        assert_eq!(r.completed, arrivals.len() as u64, "{r:?}");
    }
    assert_eq!(m.prompt_tokens, Some(expected));
    assert_ne!(s.prompt_tokens, Some(expected));
    assert!(s.prompt_tokens.is_some());
    assert_eq!(model.tokenizer.as_deref(), Some(dir.as_path()));
    assert_eq!(standin.tokenizer, None);
    let page = model.markdown();
    assert!(
        page.contains(&format!(
            "Prompts: sized in the tokens of the model's tokenizer in `{}`",
            dir.display()
        )),
        "{page}"
    );
    assert!(
        page.contains(&format!(
            "{:.1} prompt tokens per completed request",
            expected as f64 / arrivals.len() as f64
        )),
        "{page}"
    );
    assert!(
        standin
            .markdown()
            .contains("Prompts: sized in the emulator's stand-in tokens")
    );
}

fn nginx_present() -> bool {
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .any(|p| Path::new(p).exists())
}

/// benches/peers/nginx-front.sh, the script `benches/peers/run.sh` runs nginx with, as a front:
/// same arrivals, one report, its process group gone afterwards, and its log holding every
/// seed's run (a later seed's run used to start the file afresh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_front_runs_on_the_same_arrivals_into_the_same_report() {
    if !infergate_testkit::required_tool(nginx_present(), "nginx", "apt-get install -y nginx-light")
    {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/peers/nginx-front.sh");
    let mut scenario = Scenario::from_yaml(TINY, "tiny").unwrap();
    scenario.policies = vec!["round-robin".parse().unwrap()];
    scenario.seeds = vec![5, 6];
    scenario.workload.duration_s = 2.0;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tiny-live-live-front-nginx.log"),
        "a previous bench's output\n",
    )
    .unwrap();
    let fronts = Fronts {
        list: vec![
            format!("nginx=echo started >&2; exec {}", script.display())
                .parse()
                .unwrap(),
        ],
        log_dir: dir.path().to_owned(),
        tokenizer: None,
    };
    let report = run_with_fronts(&scenario, "tiny", &fronts, &mut Silent)
        .await
        .unwrap();
    assert_eq!(report.runs.len(), 4);
    let log = std::fs::read_to_string(dir.path().join("tiny-live-live-front-nginx.log")).unwrap();
    assert!(!log.contains("a previous bench's output"), "{log}");
    let seed5 = log.find("== front nginx, seed 5 ==").unwrap();
    let seed6 = log.find("== front nginx, seed 6 ==").unwrap();
    assert!(seed5 < seed6, "{log}");
    assert_eq!(log.matches("started\n").count(), 2, "{log}");
    let (gw, nginx) = (&report.runs[0], &report.runs[1]);
    assert_eq!(nginx.policy, "nginx");
    assert_eq!(nginx.requests, gw.requests, "the same arrivals");
    assert_eq!(nginx.errors + nginx.rejected, 0, "{nginx:?}");
    assert_eq!(nginx.completed, nginx.requests);
    assert_eq!(nginx.per_pod_requests.iter().sum::<u64>(), nginx.completed);
    assert!(
        nginx.per_pod_requests.iter().all(|n| *n > 0),
        "nginx round-robin serves both pods: {:?}",
        nginx.per_pod_requests
    );
    assert!(nginx.ttft.p50 > 0.0 && nginx.ttft.p99 <= nginx.e2e.p99);
    assert!(report.policy("nginx").is_some());
    assert!(dir.path().join("tiny-live-live-front-nginx.log").exists());
    // nginx (its configuration folder is named after the script) was stopped with its group.
    let left = std::process::Command::new("pgrep")
        .args(["-f", "infergate-nginx-front"])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "left running: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}

/// What a bench said of its runs: `finish LABEL` or `fail LABEL: WHY`, one line per run.
#[derive(Debug, Default)]
struct Said(Vec<String>, String);

impl Progress for Said {
    fn start(&mut self, label: &str, _total: u64) {
        self.1 = label.to_owned();
    }
    fn advance(&mut self, _done: u64) {}
    fn finish(&mut self) {
        self.0.push(format!("finish {}", self.1));
    }
    fn fail(&mut self, why: &str) {
        self.0.push(format!("fail {}: {why}", self.1));
    }
}

/// A front that exits before it is ready, or is not ready in the time it is given, fails its
/// own runs, not the bench: the policies before and after it and the other fronts still run,
/// the report keeps every run, and the failed ones say why (the exit status, the end of the
/// front's output, its log; the time it was given).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_that_does_not_start_fails_its_runs_and_the_rest_still_run() {
    let mut scenario = Scenario::from_yaml(TINY, "tiny").unwrap();
    scenario.policies = vec!["round-robin".parse().unwrap()];
    scenario.seeds = vec![5, 6];
    scenario.workload.duration_s = 2.0;
    let dir = tempfile::tempdir().unwrap();
    let slow: Front = "slow=exec sleep 30".parse().unwrap();
    assert_eq!(slow.ready_timeout(), Duration::from_secs(120));
    let fronts = Fronts {
        list: vec![
            slow.with_ready_timeout(Duration::from_secs(1)).unwrap(),
            "broken=echo no such router on port {port} >&2; exit 3"
                .parse()
                .unwrap(),
        ],
        log_dir: dir.path().to_owned(),
        tokenizer: None,
    };
    let mut said = Said::default();
    let report = run_with_fronts(&scenario, "tiny", &fronts, &mut said)
        .await
        .unwrap();
    // Each failure is said as it happens, not only in the report.
    assert_eq!(
        said.0.iter().filter(|l| l.starts_with("finish ")).count(),
        2,
        "{said:?}"
    );
    let failed: Vec<&String> = said.0.iter().filter(|l| l.starts_with("fail ")).collect();
    assert_eq!(failed.len(), 4, "{said:?}");
    assert!(
        failed[3].starts_with("fail tiny-live live seed 6 (2/2) broken: not started: "),
        "{said:?}"
    );
    let runs: Vec<(&str, u64)> = report
        .runs
        .iter()
        .map(|r| (r.policy.as_str(), r.seed))
        .collect();
    assert_eq!(
        runs,
        [
            ("round-robin", 5),
            ("slow", 5),
            ("broken", 5),
            ("round-robin", 6),
            ("slow", 6),
            ("broken", 6)
        ]
    );
    let slow = report.runs[1].failure_reasons();
    assert!(
        slow.contains(
            "not started: front slow did not answer GET /v1/models with 200 within 1 s (last try: "
        ) && slow.contains("tiny-live-live-front-slow.log"),
        "{slow}"
    );
    for rr in report.runs.iter().filter(|r| r.policy == "round-robin") {
        assert_eq!(rr.completed, rr.requests, "{rr:?}");
    }
    let log = dir.path().join("tiny-live-live-front-broken.log");
    for broken in report.runs.iter().filter(|r| r.policy == "broken") {
        assert_eq!((broken.completed, broken.errors), (0, broken.requests));
        assert!(broken.requests > 0);
        assert_eq!(broken.per_pod_requests, [0, 0]);
        assert_eq!(broken.failures.len(), 1, "{:?}", broken.failures);
    }
    let first = report.runs[2].failure_reasons();
    assert!(
        first.contains("not started: front broken exited (exit status: 3)")
            && first.contains("ending: no such router on port ")
            && first.contains(&log.display().to_string()),
        "{first}"
    );
    // The command is not tried again on the next seed: it said what it does.
    let second = report.runs[5].failure_reasons();
    assert!(
        second.contains("not started: front broken did not start on seed 5"),
        "{second}"
    );
    let output = std::fs::read_to_string(&log).unwrap();
    assert!(
        output.starts_with("== front broken, seed 5 ==\nno such router on port "),
        "{output}"
    );
    assert_eq!(output.matches("== front").count(), 1, "{output}");
    let broken = report.policy("broken").unwrap();
    assert!(!broken.has_latencies());
    let md = report.markdown();
    assert!(
        md.lines().any(|l| l.starts_with("| broken | — | — | — |")),
        "{md}"
    );
    assert!(md.contains("- broken, seed 5: "), "{md}");
}

/// A scenario that scrapes less often than the gateway's default staleness threshold (250 ms)
/// runs live: the gateway is given the threshold the simulator applies (two intervals and the
/// lag), every request completes through it, and the report says what it ran with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_interval_above_the_gateways_default_staleness_runs_live() {
    let mut scenario = Scenario::from_yaml(TINY, "tiny").unwrap();
    scenario.workload.duration_s = 2.0;
    scenario.scrape.interval_ms = 300.0;
    scenario.validate("tiny").unwrap();
    let mut said = Said::default();
    let report = infergate_bench::live::run(&scenario, "tiny", &mut said)
        .await
        .unwrap();
    assert_eq!(report.runs.len(), 2, "{said:?}");
    for r in &report.runs {
        assert!(r.requests > 0);
        assert_eq!(r.completed, r.requests, "{}: {:?}", r.policy, r.failures);
    }
    let gateway = report.gateway.as_ref().unwrap();
    assert_eq!(
        (gateway.scrape.interval_ms, gateway.scrape.stale_after_ms),
        (300, 610)
    );
    // infergate's 2 s bound on metrics age is above 610 + 300 ms; round-robin has none.
    assert_eq!(
        gateway.max_metrics_age_ms.iter().collect::<Vec<_>>(),
        [(&"infergate".to_owned(), &2_000)]
    );
    let md = report.markdown();
    assert!(
        md.contains(
            "Gateway: scrapes every 300 ms (`scrape.intervalMs` 300); a pod is stale after 610 ms"
        ) && md.contains(
            "(`maxMetricsAge`, at least the threshold plus one interval): infergate 2.00 s."
        ),
        "{md}"
    );
    let json: serde_json::Value = serde_json::to_value(&report).unwrap();
    assert_eq!(json["gateway"]["scrape"]["stale_after_ms"], 610);
}

/// A gateway for one of the scenario's policies that does not start fails that policy's runs,
/// not the bench, as a front's would: here the scenario's pods serve a LoRA adapter named like
/// their model, which the simulator runs but the gateway's configuration refuses (a request
/// naming it could mean either), so no gateway starts. Every run is still in the report, with
/// the gateway's reason, and a policy whose gateway failed is not started again on the next
/// seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_does_not_start_fails_its_policys_runs_and_the_rest_still_run() {
    let mut scenario = Scenario::from_yaml(TINY, "tiny").unwrap();
    scenario.seeds = vec![5, 6];
    scenario.workload.duration_s = 1.0;
    for group in &mut scenario.fleet {
        group.served_model_name = Some("tiny".to_owned());
        group.lora_adapters = vec!["tiny".to_owned()];
    }
    scenario.workload.lora = Some(LoraSpec {
        adapters: vec!["tiny".to_owned()],
        fraction: 0.5,
        zipf: 0.0,
    });
    scenario.validate("tiny").unwrap();
    let mut said = Said::default();
    let report = infergate_bench::live::run(&scenario, "tiny", &mut said)
        .await
        .unwrap();
    let runs: Vec<(&str, u64)> = report
        .runs
        .iter()
        .map(|r| (r.policy.as_str(), r.seed))
        .collect();
    assert_eq!(
        runs,
        [
            ("round-robin", 5),
            ("infergate", 5),
            ("round-robin", 6),
            ("infergate", 6)
        ]
    );
    for r in &report.runs {
        assert_eq!((r.completed, r.errors), (0, r.requests), "{r:?}");
        assert!(r.requests > 0);
        assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    }
    // The gateway's own words, cause included, not only that it was refused.
    let first = report.runs[0].failure_reasons();
    assert!(
        first.contains(
            "not started: the gateway configuration for policy round-robin was refused: "
        ) && first.contains("model name `tiny` is configured twice"),
        "{first}"
    );
    let second = report.runs[2].failure_reasons();
    assert!(
        second.contains(
            "not started: the gateway for policy round-robin did not start on seed 5, so it was not tried again"
        ),
        "{second}"
    );
    // Said as it happens, for each of them.
    let failed: Vec<&String> = said.0.iter().filter(|l| l.starts_with("fail ")).collect();
    assert_eq!(failed.len(), 4, "{said:?}");
    assert!(
        failed[1].starts_with("fail tiny-live live seed 5 (1/2) infergate: not started: "),
        "{said:?}"
    );
    let md = report.markdown();
    for policy in ["round-robin", "infergate"] {
        assert!(
            md.lines()
                .any(|l| l.starts_with(&format!("| {policy} | — | — | — |"))),
            "{md}"
        );
    }
}

/// Fires an interrupt once the run it is waiting for has routed its first request (or, with
/// `at_end`, once that run has ended), and notes when each run started.
struct InterruptOnRun {
    /// The label of the run to interrupt contains this.
    run: &'static str,
    /// Fire as the run ends rather than at its first request.
    at_end: bool,
    label: String,
    fire: Option<tokio::sync::oneshot::Sender<()>>,
    started: Vec<(String, std::time::Instant)>,
}

impl InterruptOnRun {
    fn fire_on(&mut self, end: bool) {
        if end == self.at_end
            && self.label.contains(self.run)
            && let Some(fire) = self.fire.take()
        {
            let _ = fire.send(());
        }
    }
}

impl Progress for InterruptOnRun {
    fn start(&mut self, label: &str, _total: u64) {
        label.clone_into(&mut self.label);
        self.started
            .push((label.to_owned(), std::time::Instant::now()));
    }
    fn advance(&mut self, done: u64) {
        if done >= 1 {
            self.fire_on(false);
        }
    }
    fn finish(&mut self) {
        self.fire_on(true);
    }
}

/// Runs `scenario` live, interrupted at the first request of the run whose label contains
/// `run` (or, with `at_end`, once that run has ended): the report, and when each run started.
async fn interrupted_on(
    scenario: &Scenario,
    run: &'static str,
    at_end: bool,
) -> (infergate_bench::Report, Vec<(String, std::time::Instant)>) {
    let (fire, fired) = tokio::sync::oneshot::channel();
    let mut progress = InterruptOnRun {
        run,
        at_end,
        label: String::new(),
        fire: Some(fire),
        started: Vec::new(),
    };
    let report = infergate_bench::live::run_until(
        scenario,
        "tiny",
        &Fronts::default(),
        &mut progress,
        async {
            let _ = fired.await;
        },
    )
    .await
    .unwrap();
    (report, progress.started)
}

/// The runs an interrupted report names as not run: policy, seed, and whether stopped part-way.
fn not_run(report: &infergate_bench::Report) -> Vec<(&str, u64, bool)> {
    report
        .interrupted
        .as_ref()
        .unwrap()
        .not_run
        .iter()
        .map(|r| (r.policy.as_str(), r.seed, r.stopped))
        .collect()
}

/// An interrupt during a run stops it part-way and the call returns the report of the runs
/// that completed, marked interrupted and naming the runs that did not run: the stopped one,
/// then the rest of its seed and the later seeds. The run is stopped, not waited out: the call
/// returns before that run's last request would even have been sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_bench_reports_the_runs_that_completed_and_names_the_rest() {
    let mut scenario = Scenario::from_yaml(TINY, "tiny").unwrap();
    scenario.seeds = vec![5, 6];
    scenario.workload.duration_s = 6.0;
    let last_arrival = infergate_bench::workload::generate(&scenario.workload, 5)
        .last()
        .unwrap()
        .at;
    let (report, runs) = interrupted_on(&scenario, "seed 5 (1/2) infergate", false).await;
    let returned = std::time::Instant::now();
    let (label, started) = runs.last().unwrap();
    assert!(label.ends_with("infergate"), "{runs:?}");
    assert!(
        returned < *started + Duration::from_secs_f64(last_arrival),
        "returned {:?} after the interrupted run started; its arrivals span {last_arrival} s",
        returned - *started
    );
    assert_eq!(runs.len(), 2, "later runs started");

    assert_eq!(report.runs.len(), 1);
    let rr = &report.runs[0];
    assert_eq!((rr.policy.as_str(), rr.seed), ("round-robin", 5));
    assert_eq!(rr.completed, rr.requests);
    assert_eq!(
        report.floors.len(),
        1,
        "only the seed that ran has its floor"
    );
    assert_eq!(
        not_run(&report),
        [
            ("infergate", 5, true),
            ("round-robin", 6, false),
            ("infergate", 6, false)
        ]
    );
    let md = report.markdown();
    assert!(
        md.contains("**Interrupted — partial report.**")
            && md.contains(
                "Not run: infergate seed 5 (stopped part-way), round-robin seed 6, infergate seed 6."
            ),
        "{md}"
    );
    let json: serde_json::Value = serde_json::to_value(&report).unwrap();
    assert_eq!(
        json["interrupted"]["not_run"][0],
        serde_json::json!({ "policy": "infergate", "seed": 5, "stopped": true })
    );
    // A bench that ran to its end says nothing of the kind.
    let mut whole = scenario.clone();
    whole.seeds = vec![5];
    whole.policies.truncate(1);
    whole.workload.duration_s = 1.0;
    let report = infergate_bench::live::run(&whole, "tiny", &mut Silent)
        .await
        .unwrap();
    assert!(report.interrupted.is_none());
    assert!(!report.markdown().contains("Interrupted"));
    assert!(
        serde_json::to_value(&report)
            .unwrap()
            .get("interrupted")
            .is_none()
    );
}

/// An interrupt that comes between two runs — the first ended, the next not begun — starts
/// no other run, and the next is named as not run, not as stopped part-way: none of its
/// arrivals was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_between_two_runs_stops_none_part_way() {
    let mut scenario = Scenario::from_yaml(TINY, "tiny").unwrap();
    scenario.workload.duration_s = 1.0;
    let (report, runs) = interrupted_on(&scenario, "seed 5 (1/1) round-robin", true).await;
    assert_eq!(report.runs.len(), 1);
    assert_eq!(report.runs[0].policy, "round-robin");
    assert_eq!(not_run(&report), [("infergate", 5, false)]);
    let md = report.markdown();
    assert!(md.contains("Not run: infergate seed 5."), "{md}");
    // Not even begun: no fleet, gateway or progress line for it.
    assert_eq!(runs.len(), 1, "{runs:?}");
}

/// Two scenarios run with the same front keep their own logs: the second does not overwrite
/// the first's, and each report and failure names its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_scenario_keeps_its_own_front_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut logs = Vec::new();
    for name in ["first", "second"] {
        let mut scenario = Scenario::from_yaml(TINY, name).unwrap();
        scenario.name = name.to_owned();
        scenario.policies.clear();
        let fronts = Fronts {
            list: vec![format!("f=echo output of {name}; exit 1").parse().unwrap()],
            log_dir: dir.path().to_owned(),
            tokenizer: None,
        };
        let report = run_with_fronts(&scenario, name, &fronts, &mut Silent)
            .await
            .unwrap();
        let log = dir.path().join(format!("{name}-live-front-f.log"));
        assert!(
            report.runs[0]
                .failure_reasons()
                .contains(&log.display().to_string()),
            "{:?}",
            report.runs[0].failures
        );
        assert!(report.markdown().contains(&log.display().to_string()));
        logs.push(log);
    }
    for (log, name) in logs.iter().zip(["first", "second"]) {
        let text = std::fs::read_to_string(log).unwrap();
        assert_eq!(text, format!("== front f, seed 5 ==\noutput of {name}\n"));
    }
}

/// A front whose command is not there cannot start: it is refused before any run, not found
/// after the scenario's policies have run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_whose_command_is_missing_is_refused_before_any_run() {
    let scenario = Scenario::from_yaml(TINY, "tiny").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fronts = Fronts {
        list: vec![
            "gone=INFERGATE_X=1 infergate-no-such-router --port {port}"
                .parse()
                .unwrap(),
        ],
        log_dir: dir.path().to_owned(),
        tokenizer: None,
    };
    let started = std::time::Instant::now();
    let err = run_with_fronts(&scenario, "tiny", &fronts, &mut Silent)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("front gone") && msg.contains("infergate-no-such-router"),
        "{msg}"
    );
    assert!(!matches!(err, BenchError::FrontExited { .. }), "{msg}");
    // No policy ran (a live run takes its 3 s of arrivals), no front started.
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_fronts_of_one_name_are_refused_before_any_run() {
    let scenario = Scenario::from_yaml(TINY, "tiny").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fronts = Fronts {
        list: vec!["a=exit 1".parse().unwrap(), "a=exit 2".parse().unwrap()],
        log_dir: dir.path().to_owned(),
        tokenizer: None,
    };
    let err = run_with_fronts(&scenario, "tiny", &fronts, &mut Silent)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, BenchError::DuplicateFront(name) if name == "a"),
        "{err}"
    );
    // Refused before the scenario's policies ran or any front started.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_named_like_a_policy_is_refused() {
    let scenario = Scenario::from_yaml(TINY, "tiny").unwrap();
    let fronts = Fronts {
        list: vec!["infergate=true".parse().unwrap()],
        log_dir: std::env::temp_dir(),
        tokenizer: None,
    };
    let err = run_with_fronts(&scenario, "tiny", &fronts, &mut Silent)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("policies"), "{err}");
}
