#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use super::*;
use crate::stats::Percentiles;

fn run(policy: &str, seed: u64, p99: f64, tput: f64) -> RunResult {
    RunResult {
        policy: policy.into(),
        seed,
        requests: 10,
        completed: 10,
        rejected: 0,
        errors: 0,
        ttft: Percentiles {
            mean: p99 / 4.0,
            p50: p99 / 4.0,
            p95: p99 / 2.0,
            p99,
        },
        itl: Percentiles::default(),
        e2e: Percentiles::default(),
        requests_per_s: 1.0,
        output_tokens_per_s: tput,
        per_pod_requests: vec![7, 3],
        ttft_cdf: vec![0.1, 0.2, p99],
        load: Some(LoadSeries {
            every_s: 1.0,
            pods: vec![vec![1, 2, 3], vec![0, 1, 0]],
        }),
        flow: None,
        prefix_hit_rate: None,
        records: None,
        failures: BTreeMap::new(),
        attempts: None,
        prompt_tokens: None,
    }
}

fn report() -> Report {
    let mut scenario = Scenario::from_yaml(
        "name: r\nfleet: [{name: a, profile: llama-3.1-8b/h100, replicas: 2}]\nworkload:\n  duration_s: 1\n  arrival: {kind: poisson, rate: 1}\n  prompt_tokens: {dist: fixed, value: 1}\n  output_tokens: {dist: fixed, value: 1}\nseeds: [1, 2]\n",
        "t",
    )
    .unwrap();
    scenario.targets.ttft_p99_reduction = Some(0.9);
    scenario.targets.throughput_not_lower = true;
    let runs = vec![
        run("round-robin", 1, 10.0, 100.0),
        run("round-robin", 2, 20.0, 100.0),
        run("gie-default", 1, 2.0, 100.0),
        run("gie-default", 2, 2.0, 100.0),
        run("infergate", 1, 0.5, 101.0),
        run("infergate", 2, 3.0, 99.0),
    ];
    let floors = vec![
        FloorResult {
            seed: 1,
            ttft: Percentiles {
                p99: 0.25,
                ..Percentiles::default()
            },
        },
        FloorResult {
            seed: 2,
            ttft: Percentiles {
                p99: 1.0,
                ..Percentiles::default()
            },
        },
    ];
    let pods = vec![
        PodInfo {
            name: "a-0".into(),
            profile: "p".into(),
            gpu: "H100".into(),
            engine: "vllm".into(),
        },
        PodInfo {
            name: "a-1".into(),
            profile: "p".into(),
            gpu: "H100".into(),
            engine: "vllm".into(),
        },
    ];
    Report::new(scenario, "simulated", pods, runs, floors)
}

#[test]
fn changes_are_per_seed_against_round_robin() {
    let r = report();
    let ig = r.policy("infergate").unwrap();
    let p99 = ig.ttft_p99_vs_rr.unwrap();
    // Seed 1: 0.5 / 10 − 1 = −0.95; seed 2: 3 / 20 − 1 = −0.85.
    assert!((p99.min + 0.95).abs() < 1e-9 && (p99.max + 0.85).abs() < 1e-9);
    assert!((p99.mean + 0.90).abs() < 1e-9);
    assert!((ig.ttft_p99_vs_floor.unwrap().mean - 2.5).abs() < 1e-9);
    assert!((ig.pod_share.as_deref().unwrap()[0] - 0.7).abs() < 1e-9);
}

#[test]
fn verdicts_follow_the_targets() {
    let r = report();
    let get = |prefix: &str| {
        r.verdicts
            .iter()
            .find(|v| v.target.starts_with(prefix))
            .unwrap()
    };
    assert!(get("TTFT P99 ≥ 90%").met);
    assert!(get("output throughput").met);
    // P95 0.875 s and P99 1.75 s are below gie-default's 1 s and 2 s.
    assert!(get("TTFT P95 and P99 below gie-default").met);
    assert!(!get("TTFT P99 within 1.5").met);
}

#[test]
fn files_are_written_and_plots_are_svg() {
    let r = report();
    let dir = tempfile::tempdir().unwrap();
    let files = r.write(dir.path()).unwrap();
    assert_eq!(files.len(), 4);
    let md = std::fs::read_to_string(&files[0]).unwrap();
    assert!(md.contains("| infergate |") && md.contains("clairvoyant floor"));
    let json: Report = serde_json::from_str(&std::fs::read_to_string(&files[1]).unwrap()).unwrap();
    assert_eq!(json.verdicts, r.verdicts);
    assert_eq!(json.runs.len(), r.runs.len());
    for f in &files[2..] {
        let svg = std::fs::read_to_string(f).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("infergate"));
    }
}

#[test]
fn a_report_that_cannot_be_written_whole_is_not_written_at_all() {
    let r = report();
    let dir = tempfile::tempdir().unwrap();
    // The third file's name is taken by a folder: the markdown and JSON before it must not be
    // left as a new report beside no plots.
    std::fs::create_dir_all(dir.path().join("r-simulated-ttft-cdf.svg/x")).unwrap();
    let err = r.write(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("r-simulated-ttft-cdf.svg"),
        "{err}"
    );
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["r-simulated-ttft-cdf.svg"]);

    // Written whole, nothing staged is left behind.
    std::fs::remove_dir_all(dir.path().join("r-simulated-ttft-cdf.svg")).unwrap();
    let files = r.write(dir.path()).unwrap();
    assert_eq!(files.len(), 4);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".partial")), "{names:?}");
}

/// The `(x, y, text)` of every `<text>` element of `svg` and its width and height.
fn svg_texts(svg: &str) -> (f64, f64, Vec<(f64, f64, String)>) {
    let attr = |tag: &str, name: &str| -> f64 {
        let key = format!(" {name}=\"");
        let at = tag.find(&key).unwrap() + key.len();
        tag[at..at + tag[at..].find('"').unwrap()].parse().unwrap()
    };
    let head = &svg[..svg.find('>').unwrap()];
    let (w, h) = (attr(head, "width"), attr(head, "height"));
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find("<text ") {
        let tag_end = i + rest[i..].find('>').unwrap();
        let tag = &rest[i..tag_end];
        let close = tag_end + rest[tag_end..].find("</text>").unwrap();
        out.push((
            attr(tag, "x"),
            attr(tag, "y"),
            rest[tag_end + 1..close].to_owned(),
        ));
        rest = &rest[close..];
    }
    (w, h, out)
}

#[test]
fn plot_labels_neither_overlap_nor_fall_outside() {
    let mut r = report();
    // Names as long as the peer fronts' and a fleet larger than the legend shows.
    for run in &mut r.runs {
        if run.policy == "gie-default" {
            run.policy = "vllm-router-consistent_hash".into();
        }
    }
    let pod = r.pods[0].clone();
    r.pods = (0..30)
        .map(|i| PodInfo {
            name: format!("a10g-llama-3.1-8b-{i}"),
            ..pod.clone()
        })
        .collect();

    let (w, h, texts) = svg_texts(&svg::ttft_cdf(&r));
    // The y-axis labels (right-aligned left of the plot) are at least a line apart.
    let mut ys: Vec<f64> = texts.iter().filter(|t| t.0 == 64.0).map(|t| t.1).collect();
    ys.sort_by(f64::total_cmp);
    assert!(ys.len() >= 5, "{texts:?}");
    for pair in ys.windows(2) {
        assert!(pair[1] - pair[0] >= 12.0, "y labels at {ys:?}");
    }
    for (x, y, t) in &texts {
        assert!(*y <= h, "{t} at y {y} below the plot's {h}");
        assert!(
            x + t.chars().count() as f64 * 6.5 <= w,
            "{t} at x {x} runs past the plot's width {w}"
        );
    }

    let (w, h, texts) = svg_texts(&svg::load(&r));
    assert!(texts.iter().any(|t| t.2 == "a10g-llama-3.1-8b-23 (H100)"));
    assert!(texts.iter().any(|t| t.2 == "… and 6 more"));
    for (x, y, t) in &texts {
        assert!(*y <= h, "{t} at y {y} below the plot's {h}");
        if *x > 100.0 {
            // Left-anchored legend and title text.
            assert!(
                x + t.chars().count() as f64 * 6.5 <= w,
                "{t} at x {x} runs past the plot's width {w}"
            );
        }
    }
}

#[test]
fn csv_fields_with_commas_quotes_or_line_breaks_are_quoted() {
    assert_eq!(CsvField("a10g-0").to_string(), "a10g-0");
    assert_eq!(CsvField("").to_string(), "");
    assert_eq!(CsvField("fin,eu").to_string(), "\"fin,eu\"");
    assert_eq!(CsvField("say \"hi\"").to_string(), "\"say \"\"hi\"\"\"");
    assert_eq!(CsvField("two\nlines").to_string(), "\"two\nlines\"");
}

/// A run in which every request failed (a front answering 500, say).
fn empty_run(policy: &str, seed: u64) -> RunResult {
    let mut r = run(policy, seed, 0.0, 0.0);
    r.completed = 0;
    r.errors = r.requests;
    r.ttft = Percentiles::default();
    r.ttft_cdf = vec![0.0; 3];
    r.per_pod_requests = vec![0, 0];
    r.failures = BTreeMap::from([("HTTP 500".to_owned(), r.requests)]);
    r
}

#[test]
fn a_run_that_completed_nothing_has_no_latencies_and_misses_its_targets() {
    let mut r = report();
    r.runs.push(empty_run("broken-front", 1));
    r.runs.push(empty_run("broken-front", 2));
    // infergate's second seed completed nothing: its zeros must not pull its figures down.
    r.runs.retain(|x| !(x.policy == "infergate" && x.seed == 2));
    r.runs.push(empty_run("infergate", 2));
    let r = Report::new(r.scenario, "live", r.pods, r.runs, r.floors);

    let broken = r.policy("broken-front").unwrap();
    assert!(!broken.has_latencies());
    assert!(broken.ttft_p99_vs_rr.is_none() && broken.ttft_p95_vs_rr.is_none());
    let ig = r.policy("infergate").unwrap();
    assert_eq!((ig.runs, ig.empty_runs), (2, 1));
    // Seed 1 alone: 0.5 / 10 − 1.
    assert!((ig.ttft_p99_vs_rr.unwrap().mean + 0.95).abs() < 1e-9);
    assert!((ig.ttft_p99.mean - 0.5).abs() < 1e-9);
    let missed = r
        .verdicts
        .iter()
        .find(|v| v.target == "requests completed in every run")
        .unwrap();
    assert!(!missed.met && missed.measured == "none in 1 of 2 runs");

    let md = r.markdown();
    let row = md
        .lines()
        .find(|l| l.starts_with("| broken-front |"))
        .unwrap();
    assert!(!row.contains(" ms") && !row.contains("0.00×"), "{row}");
    assert!(row.contains("| — | — | — |"), "{row}");
    assert!(
        md.contains("- broken-front, seed 1: 10 of 10 requests failed: 10 × HTTP 500"),
        "{md}"
    );
    assert!(!svg::ttft_cdf(&r).contains("broken-front"));
    let json = serde_json::to_string(&r).unwrap();
    let back: Report = serde_json::from_str(&json).unwrap();
    assert_eq!(back.runs, r.runs);
}

#[test]
fn the_fronts_logs_are_named_in_the_report() {
    let mut r = report();
    r.runs.push(empty_run("broken-front", 1));
    let mut r = Report::new(r.scenario, "live", r.pods, r.runs, r.floors);
    let md = r.markdown();
    assert!(!md.contains("Output of the external fronts"), "{md}");
    r.front_logs = vec![FrontLog {
        front: "broken-front".to_owned(),
        log: PathBuf::from("out/s-live-front-broken-front.log"),
    }];
    let md = r.markdown();
    assert!(
        md.contains("Output of the external fronts:\n\n- broken-front: `out/s-live-front-broken-front.log`\n"),
        "{md}"
    );
    let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back.front_logs, r.front_logs);
}

/// A run that completed nothing has no figure to compare: its throughput is not "−100% against
/// round-robin" nor its P99 "0× the floor" — those read as results. The table shows "—", the
/// JSON `null`, and a policy with some empty runs is compared on the others.
#[test]
fn a_run_that_completed_nothing_has_no_relative_figures() {
    let mut r = report();
    r.runs.push(empty_run("broken-front", 1));
    r.runs.push(empty_run("broken-front", 2));
    r.runs.retain(|x| !(x.policy == "infergate" && x.seed == 2));
    r.runs.push(empty_run("infergate", 2));
    let r = Report::new(r.scenario, "live", r.pods, r.runs, r.floors);

    let broken = r.policy("broken-front").unwrap();
    assert_eq!(broken.throughput_vs_rr, None);
    assert_eq!(broken.ttft_p99_vs_floor, None);
    // Seed 1 alone: 101 / 100 − 1; the empty seed 2 is not a −100%.
    let ig = r.policy("infergate").unwrap();
    let tput = ig.throughput_vs_rr.unwrap();
    assert!((tput.min - 0.01).abs() < 1e-9 && (tput.max - 0.01).abs() < 1e-9);
    assert!((ig.ttft_p99_vs_floor.unwrap().mean - 2.0).abs() < 1e-9);

    let md = r.markdown();
    let row = md
        .lines()
        .find(|l| l.starts_with("| broken-front |"))
        .unwrap();
    assert!(row.ends_with("| — | — | — | — |"), "{row}");
    let ig_row = md.lines().find(|l| l.starts_with("| infergate |")).unwrap();
    assert!(ig_row.contains("| +1.0% (+1.0…+1.0) |"), "{ig_row}");
    assert!(!row.contains('%'), "{row}");
    let tput = r
        .verdicts
        .iter()
        .find(|v| v.target.starts_with("output throughput"))
        .unwrap();
    assert!(tput.met && !tput.measured.contains("-100"), "{tput:?}");

    let json: serde_json::Value = serde_json::to_value(&r).unwrap();
    let summary = json["summary"].as_array().unwrap();
    let broken = summary
        .iter()
        .find(|p| p["policy"] == "broken-front")
        .unwrap();
    assert!(broken["throughput_vs_rr"].is_null(), "{broken}");
    assert!(broken["ttft_p99_vs_floor"].is_null(), "{broken}");
    assert!(broken["ttft_p99_vs_rr"].is_null(), "{broken}");
    let back: Report = serde_json::from_value(json).unwrap();
    assert_eq!(back.summary, r.summary);
}

/// A policy that served no request has no share of the pods: `null` in the JSON and "—" in the
/// table, not 0% on every pod (which reads as a measured spread); a policy with some empty
/// runs is shared over the others.
#[test]
fn a_policy_that_served_nothing_has_no_pod_share() {
    let mut r = report();
    r.runs.push(empty_run("broken-front", 1));
    r.runs.push(empty_run("broken-front", 2));
    r.runs.retain(|x| !(x.policy == "infergate" && x.seed == 2));
    r.runs.push(empty_run("infergate", 2));
    let r = Report::new(r.scenario, "live", r.pods, r.runs, r.floors);

    assert_eq!(r.policy("broken-front").unwrap().pod_share, None);
    // Seed 1 alone: 7 of 10 on the first pod, 3 on the second.
    let ig = r.policy("infergate").unwrap().pod_share.clone().unwrap();
    assert!(
        (ig[0] - 0.7).abs() < 1e-9 && (ig[1] - 0.3).abs() < 1e-9,
        "{ig:?}"
    );

    let json: serde_json::Value = serde_json::to_value(&r).unwrap();
    let summary = json["summary"].as_array().unwrap();
    let share =
        |policy: &str| summary.iter().find(|p| p["policy"] == policy).unwrap()["pod_share"].clone();
    assert!(share("broken-front").is_null(), "{}", share("broken-front"));
    assert_eq!(share("infergate").as_array().unwrap().len(), 2);
    let back: Report = serde_json::from_value(json).unwrap();
    assert_eq!(back.summary, r.summary);

    let md = r.markdown();
    let shares = md
        .split("Share of completed requests per pod:")
        .nth(1)
        .unwrap();
    let header = shares.lines().find(|l| l.starts_with("| pod |")).unwrap();
    let column = header
        .split('|')
        .map(str::trim)
        .position(|c| c == "broken-front")
        .unwrap();
    for row in shares.lines().filter(|l| l.starts_with("| a-")) {
        assert_eq!(
            row.split('|').map(str::trim).nth(column),
            Some("—"),
            "{row}"
        );
    }
}

/// A report none of whose runs completed anything (every gateway or front failed to start)
/// still draws its plots: empty, on finite axes.
#[test]
fn plots_of_a_report_with_no_completed_run_are_finite() {
    let r = report();
    let runs = vec![empty_run("round-robin", 1), empty_run("infergate", 1)];
    let r = Report::new(r.scenario, "live", r.pods, runs, r.floors);
    let cdf = svg::ttft_cdf(&r);
    assert!(cdf.len() < 100_000 && !cdf.contains("inf"), "{cdf}");
    assert!(!svg::load(&r).contains("NaN"));
}

#[test]
fn attempts_and_failed_requests_are_tabled_only_when_counted() {
    let plain = report();
    let page = plain.markdown();
    assert!(!page.contains("Attempts per policy"), "{page}");
    let mut runs = plain.runs.clone();
    for (i, r) in runs.iter_mut().enumerate() {
        let i = i as u64;
        r.errors = i % 2 * 2;
        r.completed = r.requests - r.errors;
        r.attempts = Some(Attempts {
            requests: 10,
            sent: 14 + 2 * i,
            failed: 4 + 2 * i,
            first_to_failing: 3 + i % 2,
            first_per_pod: vec![7, 3],
            exhausted: i % 2 * 2,
            ejections: 2 * i,
            held_back: 0,
        });
    }
    let with = Report::new(
        plain.scenario.clone(),
        "simulated",
        plain.pods.clone(),
        runs,
        plain.floors.clone(),
    );
    let page = with.markdown();
    assert!(page.contains("at most 3 attempts in all"), "{page}");
    // round-robin: runs 0 and 1; infergate: runs 4 and 5.
    for row in [
        "| round-robin | 35.0% (30.0–40.0) | 1.50 (1.40–1.60) | 5 (4–6) | 1 (0–2) | 1 (0–2) (0) |",
        "| infergate | 35.0% (30.0–40.0) | 2.30 (2.20–2.40) | 13 (12–14) | 1 (0–2) | 9 (8–10) (0) |",
    ] {
        assert!(page.contains(row), "{row}\n{page}");
    }
    let json = serde_json::to_string(&with).unwrap();
    assert!(json.contains(r#""first_to_failing":3"#), "{json}");
    assert!(!serde_json::to_string(&plain).unwrap().contains("attempts"));
}
