//! `infergate bench --requests-csv` as a user runs it: the real binary on a small scenario file
//! writes one CSV per run, names it on stdout, and refuses the flag in live mode.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "common/signalled.rs"]
mod signalled;
use signalled::signalled;

const SCENARIO: &str = "\
name: csv-check
fleet:
  - { name: h100, profile: llama-3.1-8b/h100 }
  - { name: a10g, profile: llama-3.1-8b/a10g, replicas: 2 }
workload:
  duration_s: 20
  arrival: { kind: poisson, rate: 4 }
  prompt_tokens: { dist: lognormal, median: 600, sigma: 0.5, min: 32, max: 3000 }
  output_tokens: { dist: uniform, min: 16, max: 64 }
seeds: [1, 2]
policies: [round-robin, infergate]
";

/// `infergate bench PATH --out OUT --seeds SEEDS --requests-csv`, run to completion.
fn bench_with_records(path: &std::path::Path, out_dir: &std::path::Path, seeds: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg("bench")
        .arg(path)
        .arg("--out")
        .arg(out_dir)
        .args(["--seeds", seeds, "--requests-csv"])
        .output()
        .unwrap()
}

#[test]
fn requests_csv_writes_one_file_per_run_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("csv-check.yaml");
    std::fs::write(&file, SCENARIO).unwrap();
    let out_dir = dir.path().join("out");
    let out = bench_with_records(&file, &out_dir, "2");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let named: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("requests: "))
        .collect();
    assert_eq!(named.len(), 2, "{stdout}");
    for policy in ["round-robin", "infergate"] {
        let path = out_dir.join(format!("csv-check-simulated-{policy}-seed2-requests.csv"));
        assert!(named.contains(&path.to_str().unwrap()), "{stdout}");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines = text.lines();
        assert!(
            lines
                .next()
                .unwrap()
                .starts_with("id,arrival_s,pod,pod_name,gpu,")
        );
        // About 80 arrivals in 20 s at 4/s; every one completes on this idle fleet.
        let rows = lines.count();
        assert!(
            (50..=120).contains(&rows),
            "{rows} rows in {}",
            path.display()
        );
    }
}

#[test]
fn requests_csv_is_refused_in_live_mode_with_the_reason() {
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(["bench", "--mode", "live", "--requests-csv"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--requests-csv is for simulated runs"),
        "{stderr}"
    );
}

#[test]
fn a_folder_run_keeps_records_where_it_can_and_says_where_it_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("scenarios");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("a-plain.yaml"), SCENARIO).unwrap();
    let flow = SCENARIO
        .replace("name: csv-check", "name: csv-flow")
        .replace(
            "policies: [round-robin, infergate]",
            "policies: [infergate]\nflow: {}",
        );
    std::fs::write(folder.join("b-flow.yaml"), flow).unwrap();
    let out_dir = dir.path().join("out");
    let out = bench_with_records(&folder, &out_dir, "1");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("b-flow.yaml: no per-request records"),
        "{stderr}"
    );
    assert!(out_dir.join("csv-flow-simulated.md").exists(), "{stdout}");
    assert!(
        out_dir
            .join("csv-check-simulated-infergate-seed1-requests.csv")
            .exists(),
        "{stdout}"
    );
}

#[test]
fn a_load_scale_that_is_not_a_positive_number_is_refused_naming_the_flag() {
    for bad in ["0", "-1", "nan", "inf", "fast"] {
        let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["bench", "--load-scale", bad])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--load-scale") && stderr.contains("positive number"),
            "{bad}: {stderr}"
        );
    }
}

/// A one-pod scenario of one second at `rate` requests/s named `name`, written to `dir/NAME.yaml`
/// (short enough to run live).
fn live_scenario(dir: &Path, name: &str, rate: u32) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "name: {name}\nfleet:\n  - {{ name: h100, profile: llama-3.1-8b/h100 }}\nworkload:\n  duration_s: 1\n  arrival: {{ kind: poisson, rate: {rate} }}\n  prompt_tokens: {{ dist: fixed, value: 64 }}\n  output_tokens: {{ dist: fixed, value: 4 }}\nseeds: [1]\npolicies: [round-robin]\n"
        ),
    )
    .unwrap();
    path
}

/// An HTTP server for `--front`: `GET` answers 200 (so the front is ready), `POST` answers the
/// status given as its second argument with a JSON body and no event stream.
const FAKE_FRONT: &str = r#"
import sys, http.server
port, chat = int(sys.argv[1]), int(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    def answer(self, code):
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
    def do_GET(self):
        self.answer(200)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.answer(chat)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

#[test]
fn a_live_front_that_serves_nothing_fails_the_run_with_its_reasons_and_no_latencies() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: python3 is not installed (it plays the broken front)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("front.py");
    std::fs::write(&script, FAKE_FRONT).unwrap();
    let scenario = live_scenario(dir.path(), "fronts", 8);
    let out_dir = dir.path().join("out");
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg("bench")
        .arg(&scenario)
        .args(["--mode", "live", "--out"])
        .arg(&out_dir)
        .arg("--front")
        .arg(format!("f500=python3 {} {{port}} 500", script.display()))
        .arg("--front")
        .arg(format!("notext=python3 {} {{port}} 200", script.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("f500 (seed 1) completed none of its") && stderr.contains("× HTTP 500"),
        "{stderr}"
    );
    assert!(
        stderr.contains("notext (seed 1) completed none of its")
            && stderr.contains("× HTTP 200 without generated text"),
        "{stderr}"
    );
    // The report is written whole: the broken fronts' rows show no latencies, and why.
    let md = std::fs::read_to_string(out_dir.join("fronts-live.md")).unwrap();
    for front in ["f500", "notext"] {
        let row = md
            .lines()
            .find(|l| l.starts_with(&format!("| {front} |")))
            .unwrap();
        assert!(
            row.starts_with(&format!("| {front} | — | — | — |")),
            "{row}"
        );
        assert!(md.contains(&format!("- {front}, seed 1: ")), "{md}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("fronts-live.json")).unwrap())
            .unwrap();
    let runs = json["runs"].as_array().unwrap();
    let f500 = runs.iter().find(|r| r["policy"] == "f500").unwrap();
    assert_eq!(f500["completed"], 0);
    assert_eq!(f500["failures"]["HTTP 500"], f500["requests"]);
    let rr = runs.iter().find(|r| r["policy"] == "round-robin").unwrap();
    assert_eq!(rr["completed"], rr["requests"]);
}

#[test]
fn a_front_given_as_a_url_a_missing_command_or_a_bad_ready_timeout_is_refused_before_any_run() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = live_scenario(dir.path(), "fronts", 4);
    let out_dir = dir.path().join("out");
    let bench = |front: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .arg("bench")
            .arg(&scenario)
            .args(["--mode", "live", "--out"])
            .arg(&out_dir)
            .args(["--front", front])
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{front}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };

    // Refused while the arguments are read.
    let stderr = bench("r=http://127.0.0.1:9");
    assert!(stderr.contains("the command is a URL"), "{stderr}");
    assert!(!out_dir.exists());

    // A ready timeout out of bounds, or for no front, is refused with the arguments.
    for (args, says) in [
        (
            ["--front", "a=false", "--front-ready-timeout", "a=0"],
            "from 1 to 3600",
        ),
        (
            ["--front", "a=false", "--front-ready-timeout", "a=3601"],
            "from 1 to 3600",
        ),
        (
            ["--front", "a=false", "--front-ready-timeout", "b=5"],
            "no front is named b",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .arg("bench")
            .arg(&scenario)
            .args(["--mode", "live", "--out"])
            .arg(&out_dir)
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(says),
            "{args:?}: {stderr}"
        );
        assert!(!out_dir.exists());
    }

    // Refused before the scenario's policies run, not found when its turn comes.
    let stderr = bench("gone=infergate-no-such-router --port {port}");
    assert!(
        stderr.contains(
            "front gone: its command runs `infergate-no-such-router`, which is neither a shell builtin nor a program on PATH"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("round-robin"), "a run started: {stderr}");
    assert!(!out_dir.exists());
}

/// A front that exits at once fails its own row: the policies' runs are kept, the report is
/// written with the reason, and the bench exits non-zero naming it.
#[test]
fn a_front_that_does_not_start_fails_its_row_and_the_report_is_still_written() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = live_scenario(dir.path(), "fronts", 4);
    let out_dir = dir.path().join("out");
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg("bench")
        .arg(&scenario)
        .args(["--mode", "live", "--out"])
        .arg(&out_dir)
        .args(["--front", "broken=false"])
        .args(["--front", "idle=exec sleep 30"])
        .args(["--front-ready-timeout", "idle=1"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    // Said when it happens, and again at the end.
    assert!(
        stderr.contains("broken: failed: not started: front broken exited (exit status: 1)"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "idle: failed: not started: front idle did not answer GET /v1/models with 200 within 1 s"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("broken (seed 1) completed none of its")
            && stderr.lines().any(|l| l.starts_with("Error: ")),
        "{stderr}"
    );
    let md = std::fs::read_to_string(out_dir.join("fronts-live.md")).unwrap();
    let row = md.lines().find(|l| l.starts_with("| broken |")).unwrap();
    assert!(row.starts_with("| broken | — | — | — |"), "{row}");
    assert!(
        md.contains("- broken, seed 1: ") && md.contains("× not started: front broken exited"),
        "{md}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("fronts-live.json")).unwrap())
            .unwrap();
    let runs = json["runs"].as_array().unwrap();
    let rr = runs.iter().find(|r| r["policy"] == "round-robin").unwrap();
    assert_eq!(rr["completed"], rr["requests"]);
    let broken = runs.iter().find(|r| r["policy"] == "broken").unwrap();
    assert_eq!(broken["completed"], 0);
    // Its log is the scenario's own, named in the report and in the reason.
    let log = out_dir.join("fronts-live-front-broken.log");
    assert!(log.exists());
    assert!(
        md.contains(&format!("- broken: `{}`", log.display())),
        "{md}"
    );
    assert!(stderr.contains(&log.display().to_string()), "{stderr}");
}

/// A gateway that does not start fails its policy's runs, not the bench: here the first
/// scenario's pod serves a LoRA adapter named like its model, which the gateway's configuration
/// refuses. Its report is still written with the reason, the next scenario still runs (scraping
/// every 300 ms, above the gateway's default staleness threshold), and the bench exits non-zero
/// naming the runs that did not start.
#[test]
fn a_gateway_that_does_not_start_fails_its_row_and_the_next_scenario_still_runs() {
    let dir = tempfile::tempdir().unwrap();
    let refused = live_scenario(dir.path(), "refused", 4);
    let text = std::fs::read_to_string(&refused)
        .unwrap()
        .replace(
            "profile: llama-3.1-8b/h100 }",
            "profile: llama-3.1-8b/h100, served_model_name: m, lora_adapters: [m] }",
        )
        .replace(
            "workload:\n",
            "workload:\n  lora: { adapters: [m], fraction: 0.5 }\n",
        );
    std::fs::write(&refused, text).unwrap();
    let served = live_scenario(dir.path(), "served", 4);
    let text = std::fs::read_to_string(&served).unwrap();
    std::fs::write(&served, format!("{text}scrape: {{ interval_ms: 300 }}\n")).unwrap();
    let out_dir = dir.path().join("out");
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg("bench")
        .arg(&refused)
        .arg(&served)
        .args(["--mode", "live", "--out"])
        .arg(&out_dir)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    // Said when it happens, and again at the end.
    assert!(
        stderr.contains(
            "round-robin: failed: not started: the gateway configuration for policy round-robin was refused: "
        ) && stderr.contains("model name `m` is configured twice"),
        "{stderr}"
    );
    assert!(
        stderr.contains("refused.yaml: round-robin (seed 1) completed none of its")
            && !stderr.contains("served.yaml: round-robin"),
        "{stderr}"
    );
    let md = std::fs::read_to_string(out_dir.join("refused-live.md")).unwrap();
    let row = md
        .lines()
        .find(|l| l.starts_with("| round-robin |"))
        .unwrap();
    assert!(row.starts_with("| round-robin | — | — | — |"), "{row}");
    assert!(
        md.contains("- round-robin, seed 1: ")
            && md.contains("× not started: the gateway configuration for policy round-robin"),
        "{md}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("served-live.json")).unwrap())
            .unwrap();
    let rr = &json["runs"][0];
    assert_eq!(rr["policy"], "round-robin");
    assert!(rr["completed"].as_u64().unwrap() > 0);
    assert_eq!(rr["completed"], rr["requests"]);
    assert_eq!(json["gateway"]["scrape"]["stale_after_ms"], 610);
}

#[test]
fn scenario_paths_and_durations_that_give_nothing_to_run_are_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.txt"), "not a scenario").unwrap();
    let bench = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .arg("bench")
            .args(args)
            .current_dir(dir.path())
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = bench(&["."]);
    assert!(
        stderr.contains("no scenario files (*.yaml, *.yml) in . (relative to "),
        "{stderr}"
    );
    let stderr = bench(&["missing.yaml"]);
    assert!(
        stderr.contains("no scenario file or folder missing.yaml"),
        "{stderr}"
    );
    // The default folder is the repository's; run elsewhere, the error says so.
    let stderr = bench(&[]);
    assert!(
        stderr.contains("no scenario file or folder benches/scenarios")
            && stderr.contains("run from its root"),
        "{stderr}"
    );
    for bad in ["-5", "0", "nan", "inf", "soon"] {
        let stderr = bench(&["--duration", bad, "x.yaml"]);
        assert!(
            stderr.contains("--duration") && stderr.contains("seconds"),
            "{bad}: {stderr}"
        );
    }
    // A negative exchange setting reaches the check that names it.
    let scenario = dir.path().join("s.yaml");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let stderr = bench(&[
        "--replicas",
        "1",
        "--exchange-ms",
        "-5,1",
        scenario.to_str().unwrap(),
    ]);
    assert!(
        stderr.contains("replicas.exchange.interval_ms") && stderr.contains("got -5"),
        "{stderr}"
    );
}

/// Whether process `pid` still runs (a zombie waiting for its parent does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

#[test]
fn a_stopped_live_run_stops_its_front_too() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = live_scenario(dir.path(), "stop", 4);
    let pid_file = dir.path().join("front.pid");
    // A front that never gets ready: the bench is stopped while it waits for it.
    let front = format!("idle=echo $$ > {}; exec sleep 300", pid_file.display());
    let bench = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg("bench")
        .arg(&scenario)
        .args(["--mode", "live", "--out"])
        .arg(dir.path().join("out"))
        .args(["--front", &front])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let by = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let front_pid: u32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break pid;
        }
        assert!(std::time::Instant::now() < by, "the front never started");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(alive(front_pid));
    let killed = Command::new("kill")
        .args(["-TERM", &bench.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = bench.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let by = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while alive(front_pid) {
        if std::time::Instant::now() > by {
            // Leave nothing behind, then fail.
            let _ = Command::new("kill")
                .args(["-KILL", &front_pid.to_string()])
                .status();
            panic!("the front (pid {front_pid}) outlived the bench; stderr: {stderr}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(stderr.contains("interrupted during"), "{stderr}");
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    // The policy's run completed before the front's started: its report is kept. The front's
    // run was stopped while it waited for the front, before any of its arrivals was sent: it
    // is not said to have stopped part-way.
    let md = std::fs::read_to_string(dir.path().join("out/stop-live.md")).unwrap();
    assert!(md.contains("Not run: idle seed 1."), "{md}");
}

/// Ctrl-C part-way through a live bench: the run in progress is stopped, the report of the
/// runs that completed is written — marked interrupted, naming the runs that did not run — and
/// named on stdout, the scenarios after it are said not to have run, and the bench exits 130.
#[test]
fn ctrl_c_during_a_live_bench_writes_the_report_of_the_runs_that_completed() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = live_scenario(dir.path(), "stopped", 4);
    // Two seeds of 3 s each: the signal comes 1 s into the second.
    let text = std::fs::read_to_string(&scenario)
        .unwrap()
        .replace("duration_s: 1", "duration_s: 3")
        .replace("seeds: [1]", "seeds: [1, 2]");
    std::fs::write(&scenario, text).unwrap();
    let later = live_scenario(dir.path(), "later", 4);
    let out_dir = dir.path().join("out");
    let second = "stopped live seed 2 (2/2) round-robin: ";
    let (out, stderr) = signalled(
        &[
            "bench".as_ref(),
            scenario.as_os_str(),
            later.as_os_str(),
            "--mode".as_ref(),
            "live".as_ref(),
            "--out".as_ref(),
            out_dir.as_os_str(),
        ],
        |line| line.starts_with(second) && line.ends_with(" requests"),
        std::time::Duration::from_secs(1),
        "-INT",
    );
    let (_, json) = partial_report(
        &out,
        &stderr,
        &scenario,
        &out_dir.join("stopped-live.md"),
        "round-robin seed 2 (stopped part-way)",
    );
    assert!(
        stderr.contains(&format!("scenarios not run: {}", later.display())),
        "{stderr}"
    );
    assert!(!stderr.contains(&format!("{second}done")), "{stderr}");
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["seed"], 1);
    assert_eq!(runs[0]["completed"], runs[0]["requests"]);
    assert_eq!(
        json["interrupted"]["not_run"],
        serde_json::json!([{ "policy": "round-robin", "seed": 2, "stopped": true }])
    );
    assert!(!out_dir.join("later-live.md").exists());
}

/// What a bench of `scenario` interrupted by SIGINT said and wrote, checked: it exited 130,
/// named the partial report `md` on stdout and stderr with the runs `not_run`, and marked the
/// markdown so, with round-robin's row and its latencies; the markdown, and the JSON beside it.
fn partial_report(
    out: &Output,
    stderr: &str,
    scenario: &Path,
    md: &Path,
    not_run: &str,
) -> (String, serde_json::Value) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(130), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("report: {}", md.display()))
            && stdout.contains(&format!(
                "INTERRUPTED: a partial report; not run: {not_run}"
            )),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!(
            "interrupted during {}: the partial report of the runs that completed is {}",
            scenario.display(),
            md.display()
        )),
        "{stderr}"
    );
    let text = std::fs::read_to_string(md).unwrap();
    assert!(
        text.contains("**Interrupted — partial report.**")
            && text.contains(&format!("Not run: {not_run}.")),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("| round-robin |"))
        .unwrap();
    assert!(row.contains(" ms |"), "{row}");
    let json = std::fs::read_to_string(md.with_extension("json")).unwrap();
    (text, serde_json::from_str(&json).unwrap())
}

/// Ctrl-C part-way through a simulated bench (minutes for a large study) does as in a live
/// one: the run in progress stops, every file of the report of the runs that completed is
/// written — marked interrupted, naming the runs that did not run — and named, and the bench
/// exits 130.
#[test]
fn ctrl_c_during_a_simulated_bench_writes_the_report_of_the_runs_that_completed() {
    let dir = tempfile::tempdir().unwrap();
    // About 24,000 arrivals a run: seconds per run in a debug build, the second run (infergate)
    // the longer, and it is stopped as it starts.
    let scenario = dir.path().join("long.yaml");
    std::fs::write(
        &scenario,
        SCENARIO
            .replace("name: csv-check", "name: long")
            .replace("duration_s: 20", "duration_s: 1200")
            .replace("rate: 4 }", "rate: 20 }"),
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let (out, stderr) = signalled(
        &[
            "bench".as_ref(),
            scenario.as_os_str(),
            "--requests-csv".as_ref(),
            "--out".as_ref(),
            out_dir.as_os_str(),
        ],
        |line| line.starts_with("long seed 1 (1/2) infergate: "),
        std::time::Duration::ZERO,
        "-INT",
    );
    let (md, json) = partial_report(
        &out,
        &stderr,
        &scenario,
        &out_dir.join("long-simulated.md"),
        "infergate seed 1 (stopped part-way), round-robin seed 2, infergate seed 2",
    );
    assert!(
        !stderr.contains("long seed 1 (1/2) infergate: done"),
        "{stderr}"
    );
    assert!(!md.lines().any(|l| l.starts_with("| infergate |")), "{md}");
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        (&runs[0]["policy"], &runs[0]["seed"]),
        (&"round-robin".into(), &1.into())
    );
    let (requests, completed) = (runs[0]["requests"].as_u64(), runs[0]["completed"].as_u64());
    assert!(
        requests > Some(20_000) && completed > Some(20_000),
        "{:?}",
        runs[0]
    );
    assert!(runs[0]["ttft"]["p99"].as_f64() > Some(0.0), "{:?}", runs[0]);
    assert_eq!(
        json["interrupted"]["not_run"],
        serde_json::json!([
            { "policy": "infergate", "seed": 1, "stopped": true },
            { "policy": "round-robin", "seed": 2, "stopped": false },
            { "policy": "infergate", "seed": 2, "stopped": false },
        ])
    );
    // The floor is kept for the seed that ran only; the plots and the completed run's
    // requests are written, the stopped run's are not.
    assert_eq!(json["floors"].as_array().map(Vec::len), Some(1));
    for file in ["long-simulated-ttft-cdf.svg", "long-simulated-load.svg"] {
        assert!(out_dir.join(file).is_file(), "{file}");
    }
    let csv = out_dir.join("long-simulated-round-robin-seed1-requests.csv");
    let rows = std::fs::read_to_string(&csv).unwrap().lines().count() - 1;
    assert_eq!(Some(rows as u64), completed);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("requests: {}", csv.display())),
        "{stdout}"
    );
    assert!(
        !out_dir
            .join("long-simulated-infergate-seed1-requests.csv")
            .exists()
    );
}

#[test]
fn two_scenario_files_of_one_name_are_refused_before_either_runs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), SCENARIO).unwrap();
    std::fs::write(dir.path().join("b.yaml"), SCENARIO).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg("bench")
        .arg(dir.path())
        .arg("--out")
        .arg(dir.path().join("out"))
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("are both scenario `csv-check`") && stderr.contains("b.yaml"),
        "{stderr}"
    );
    assert!(!dir.path().join("out").exists());
}

#[test]
fn a_live_run_refuses_what_only_the_simulator_runs_before_any_scenario_runs() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    // A scenario that would run live for minutes comes first in the folder.
    std::fs::write(dir.path().join("a-plain.yaml"), SCENARIO).unwrap();
    for (file, field) in [
        ("flow-noisy-neighbour-llama-8b.yaml", "flow"),
        ("eviction-heavy-llama-8b.yaml", "policies"),
    ] {
        std::fs::copy(
            repo.join("benches/scenarios").join(file),
            dir.path().join(format!("b-{file}")),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .arg("bench")
            .arg(dir.path())
            .args(["--mode", "live", "--out"])
            .arg(dir.path().join("out"))
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!("b-{file}: field `{field}`")),
            "{stderr}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        assert!(!dir.path().join("out").exists(), "{file}: a run started");
        std::fs::remove_file(dir.path().join(format!("b-{file}"))).unwrap();
    }
    // --replicas makes a replicas section, which live mode does not run either.
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg("bench")
        .arg(dir.path().join("a-plain.yaml"))
        .args(["--mode", "live", "--replicas", "1,3", "--out"])
        .arg(dir.path().join("out"))
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("field `replicas`"), "{stderr}");
}

#[test]
fn a_report_folder_that_cannot_be_made_is_refused_before_the_runs() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("s.yaml");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    for command in [
        vec!["bench", scenario.to_str().unwrap(), "--mode", "live"],
        vec!["demo"],
    ] {
        let started = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(&command)
            .arg("--out")
            .arg(file.join("reports"))
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command:?}: {stderr}");
        assert!(
            stderr.contains("cannot create the report folder") && stderr.contains("(--out)"),
            "{command:?}: {stderr}"
        );
        // Live runs would take seconds; the refusal takes none.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{command:?}"
        );
    }
}

#[test]
fn progress_written_to_a_pipe_is_one_line_per_run_start_and_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.yaml");
    std::fs::write(&path, SCENARIO).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg("bench")
        .arg(&path)
        .arg("--out")
        .arg(dir.path().join("out"))
        .args(["--seeds", "1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    // No carriage-return redraws in a log.
    assert!(!stderr.contains('\r'), "{stderr:?}");
    for policy in ["round-robin", "infergate"] {
        let label = format!("csv-check seed 1 (1/1) {policy}");
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("{label}: ")) && l.ends_with(" requests")),
            "{stderr}"
        );
        assert!(stderr.contains(&format!("{label}: done\n")), "{stderr}");
    }
}
