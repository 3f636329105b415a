#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use super::*;
use crate::Silent;

mod faults;

const MIXED: &str = r#"
name: small-mixed
fleet:
  - { name: h100, profile: llama-3.1-8b/h100 }
  - { name: a10g, profile: llama-3.1-8b/a10g, replicas: 3 }
workload:
  duration_s: 30
  arrival: { kind: poisson, rate: 6 }
  prompt_tokens: { dist: lognormal, median: 800, sigma: 0.6, min: 32, max: 4000 }
  output_tokens: { dist: uniform, min: 16, max: 64 }
seeds: [1]
policies: [round-robin, least-request, infergate]
"#;

#[test]
fn every_request_is_accounted_for_and_runs_are_reproducible() {
    let s = Scenario::from_yaml(MIXED, "t").unwrap();
    let a = run(&s, "t", &mut Silent).unwrap();
    let b = run(&s, "t", &mut Silent).unwrap();
    assert_eq!(a, b);
    for r in &a.runs {
        assert!(r.requests > 100);
        assert_eq!(
            r.completed + r.rejected + r.errors,
            r.requests,
            "{}",
            r.policy
        );
        assert_eq!(r.per_pod_requests.iter().sum::<u64>(), r.completed);
        assert!(r.ttft.p50 > 0.0 && r.ttft.p50 <= r.ttft.p99);
        assert!(r.e2e.p99 >= r.ttft.p99);
        assert_eq!(r.ttft_cdf.len(), CDF_POINTS);
        assert!(r.ttft_cdf.windows(2).all(|w| w[0] <= w[1]));
        let load = r.load.as_ref().unwrap();
        assert_eq!(load.pods.len(), 4);
        assert!(load.pods[0].len() >= 30);
    }
    // Round-robin gives every pod the same share; the floor is below every policy.
    let rr = a.policy("round-robin").unwrap();
    assert!(
        rr.pod_share
            .as_deref()
            .unwrap()
            .iter()
            .all(|s| (s - 0.25).abs() < 0.02),
        "{:?}",
        rr.pod_share
    );
    for p in &a.summary {
        assert!(p.ttft_p99_vs_floor.unwrap().mean >= 1.0, "{}", p.policy);
    }
}

#[test]
fn per_request_records_add_up_to_the_report_and_are_written_as_csv() {
    let s = Scenario::from_yaml(MIXED, "t").unwrap();
    let plain = run(&s, "t", &mut Silent).unwrap();
    let kept = run_with(&s, "t", &mut Silent, RunOptions { requests: true }).unwrap();
    for (p, k) in plain.runs.iter().zip(&kept.runs) {
        // Keeping them changes nothing else.
        assert_eq!(p.ttft, k.ttft);
        assert!(p.records.is_none());
        let records = k.records.as_ref().unwrap();
        assert_eq!(records.len() as u64, k.completed, "{}", k.policy);
        let mut ttft: Vec<f64> = records.iter().map(|r| r.ttft_s).collect();
        assert_eq!(crate::stats::Percentiles::of(&mut ttft), k.ttft);
        let mut per_pod = vec![0u64; k.per_pod_requests.len()];
        for r in records {
            per_pod[r.pod as usize] += 1;
            let parts = r.gateway_s + r.queue_s + r.prefill_s;
            assert!((parts - r.ttft_s).abs() < 1e-9, "{r:?}");
            assert!(
                r.queue_s >= 0.0 && r.prefill_s > 0.0 && r.e2e_s >= r.ttft_s,
                "{r:?}"
            );
        }
        assert_eq!(per_pod, k.per_pod_requests);
    }
    let dir = tempfile::tempdir().unwrap();
    let written = kept.write(dir.path()).unwrap();
    let csvs: Vec<_> = written
        .iter()
        .filter(|p| p.to_string_lossy().ends_with("-requests.csv"))
        .collect();
    assert_eq!(csvs.len(), 3, "{written:?}");
    let text = std::fs::read_to_string(
        dir.path()
            .join("small-mixed-simulated-infergate-seed1-requests.csv"),
    )
    .unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(crate::report::REQUESTS_CSV_HEADER));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let ig = kept.runs.iter().find(|r| r.policy == "infergate").unwrap();
    assert_eq!(rows.len() as u64, ig.completed);
    let columns = crate::report::REQUESTS_CSV_HEADER.split(',').count();
    for row in &rows {
        assert_eq!(row.len(), columns, "{row:?}");
        let pod: usize = row[2].parse().unwrap();
        assert_eq!(row[3], kept.pods[pod].name, "{row:?}");
        assert_eq!(row[4], kept.pods[pod].gpu, "{row:?}");
        assert!(row[12].parse::<f64>().unwrap() > 0.0);
    }
    // A scenario with its own runner refuses it, saying why.
    let flow = Scenario::from_yaml(&format!("{MIXED}flow: {{}}\n"), "f").unwrap();
    let err = run_with(&flow, "f", &mut Silent, RunOptions { requests: true }).unwrap_err();
    assert!(err.to_string().contains("per-request records"), "{err}");
}

/// Splits one CSV line as RFC 4180 reads it (quoted fields may hold commas and doubled quotes).
fn csv_fields(line: &str) -> Vec<String> {
    let (mut out, mut field, mut quoted, mut chars) =
        (Vec::new(), String::new(), false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut field)),
            _ => field.push(c),
        }
    }
    out.push(field);
    out
}

#[test]
fn a_pod_name_with_a_comma_and_quotes_keeps_its_csv_row_whole() {
    let yaml = MIXED.replace("name: h100,", "name: 'h100,\"big\"',");
    let s = Scenario::from_yaml(&yaml, "t").unwrap();
    let kept = run_with(&s, "t", &mut Silent, RunOptions { requests: true }).unwrap();
    let run = kept.runs.iter().find(|r| r.policy == "infergate").unwrap();
    let csv = kept.requests_csv(run).unwrap();
    let columns = crate::report::REQUESTS_CSV_HEADER.split(',').count();
    let mut on_h100 = 0;
    for line in csv.lines().skip(1) {
        let row = csv_fields(line);
        assert_eq!(row.len(), columns, "{line}");
        if row[2] == "0" {
            assert_eq!(row[3], "h100,\"big\"", "{line}");
            on_h100 += 1;
        }
    }
    assert!(on_h100 > 0);
}

#[test]
fn speed_aware_routing_beats_round_robin_on_a_mixed_fleet() {
    let s = Scenario::from_yaml(MIXED, "t").unwrap();
    let r = run(&s, "t", &mut Silent).unwrap();
    let rr = r.policy("round-robin").unwrap();
    let ig = r.policy("infergate").unwrap();
    // The H100 prefills ~8x faster than an A10G: a router that learns it must cut the tail.
    assert!(
        ig.ttft_p99.mean < rr.ttft_p99.mean,
        "{} vs {}",
        ig.ttft_p99.mean,
        rr.ttft_p99.mean
    );
    assert!(ig.pod_share.as_deref().unwrap()[0] > rr.pod_share.as_deref().unwrap()[0]);
}

#[test]
fn the_floor_counts_a_seen_prefix_as_cached() {
    let catalog = infergate_sim::Catalog::builtin().unwrap();
    let p = catalog.get("llama-3.1-8b/h100").unwrap();
    let spec = FleetSpec::uniform(p, EngineKind::Vllm, "h", 1).unwrap();
    let mk = |id| Arrival {
        id,
        at: id as f64,
        prompt_tokens: 1000,
        prefix_group: Some(0),
        prefix_tokens: 960,
        output_tokens: 1,
        lora: None,
        priority: Default::default(),
        tenant: 0,
    };
    let one = floor(&spec, &[mk(0)], 1);
    let two = floor(&spec, &[mk(0), mk(1)], 1);
    assert!((one.ttft.p50 - p.nominal_ttft(1000)).abs() < 1e-12);
    // The second request only prefills its 40 unshared tokens.
    assert!((two.ttft.p50 - p.nominal_ttft(40)).abs() < 1e-12);
}

#[test]
fn pod_addresses_are_distinct() {
    let addrs: std::collections::HashSet<_> = (0..600).map(pod_addr).collect();
    assert_eq!(addrs.len(), 600);
}

#[test]
fn pod_index_inverts_pod_addr() {
    for i in [0usize, 1, 254, 255, 256, 999, 1000, 65_534] {
        assert_eq!(pod_index(&pod_addr(i), 65_535), Some(i), "{i}");
    }
    assert_eq!(pod_index(&pod_addr(5), 5), None, "outside the fleet");
    assert_eq!(pod_index(&"10.0.0.1:8001".parse().unwrap(), 10), None);
    assert_eq!(pod_index(&"10.1.0.1:8000".parse().unwrap(), 10), None);
    assert_eq!(pod_index(&"[::1]:8000".parse().unwrap(), 10), None);
}

/// A scenario scraping every 3 s: the gateway raises `maxMetricsAge` (the infergate preset's 2 s)
/// to its staleness threshold plus one interval and keeps routing on pages up to that old, so the
/// simulation must too — else every pod's page is past 2 s for a third of each interval and
/// requests are turned away that the live gateway serves.
#[test]
fn a_slow_scrape_interval_keeps_pods_routable_between_pages_as_the_gateway_does() {
    let yaml = format!("{MIXED}scrape: {{ interval_ms: 3000 }}\n").replace(
        "policies: [round-robin, least-request, infergate]",
        "policies: [infergate]",
    );
    let s = Scenario::from_yaml(&yaml, "t").unwrap();
    let r = run(&s, "t", &mut Silent).unwrap();
    let run = &r.runs[0];
    assert!(run.requests > 100);
    assert_eq!(
        (run.completed, run.rejected, run.errors),
        (run.requests, 0, 0),
        "every request served"
    );
    let gateway = crate::live::GatewayScrape::for_scenario(&s.scrape);
    assert_eq!(
        gateway.max_metrics_age_ms(infergate_scheduler::Preset::Infergate),
        Some(6_000 + 3_000 + 10),
        "{gateway:?}"
    );
}

/// When [`StopAt`] sets the stop flag.
#[derive(Clone, Copy)]
enum When {
    /// As run N (from 1) starts.
    Start(usize),
    /// As run N (from 1) finishes.
    Finish(usize),
    /// When run N (from 1) has routed this many arrivals.
    Routed(usize, u64),
}

/// A progress bar that sets the stop flag at `when`, as a Ctrl-C would, and keeps what it was
/// shown.
struct StopAt<'a> {
    flag: &'a AtomicBool,
    when: When,
    labels: Vec<String>,
    finished: usize,
    /// The most arrivals any run was said to have routed after the flag was set.
    routed_after: u64,
}

impl Progress for StopAt<'_> {
    fn start(&mut self, label: &str, _total: u64) {
        self.labels.push(label.to_owned());
        if matches!(self.when, When::Start(n) if n == self.labels.len()) {
            self.flag.store(true, Ordering::Relaxed);
        }
    }

    fn advance(&mut self, done: u64) {
        if self.flag.load(Ordering::Relaxed) {
            self.routed_after = self.routed_after.max(done);
        } else if matches!(self.when, When::Routed(n, at) if n == self.labels.len() && at == done) {
            self.flag.store(true, Ordering::Relaxed);
        }
    }

    fn finish(&mut self) {
        self.finished += 1;
        if matches!(self.when, When::Finish(n) if n == self.finished) {
            self.flag.store(true, Ordering::Relaxed);
        }
    }
}

/// `s` run whole, and run again stopped at `when` by `flag`, with the progress of the second.
fn whole_and_stopped<'a>(
    s: &Scenario,
    when: When,
    flag: &'a AtomicBool,
) -> (Report, Report, StopAt<'a>) {
    let whole = run(s, "t", &mut Silent).unwrap();
    let mut bar = StopAt {
        flag,
        when,
        labels: Vec::new(),
        finished: 0,
        routed_after: 0,
    };
    let stopped = run_until(s, "t", &mut bar, RunOptions::default(), flag).unwrap();
    (whole, stopped, bar)
}

/// The runs an interrupted report names as not run: (name, seed, stopped part-way).
fn not_run(r: &Report) -> Vec<(&str, u64, bool)> {
    r.interrupted
        .as_ref()
        .unwrap()
        .not_run
        .iter()
        .map(|n| (n.policy.as_str(), n.seed, n.stopped))
        .collect()
}

#[test]
fn a_run_stopped_part_way_is_dropped_and_named_with_every_run_after_it() {
    let mut s = Scenario::from_yaml(MIXED, "t").unwrap();
    s.seeds = vec![1, 2];
    s.workload.duration_s = 200.0;
    let flag = AtomicBool::new(false);
    let (whole, stopped, bar) = whole_and_stopped(&s, When::Routed(2, 300), &flag);
    // It stopped at its next look at the flag, with nothing started after it.
    assert_eq!(bar.labels.len(), 2);
    assert!(
        (300..=300 + u64::from(STOP_EVERY)).contains(&bar.routed_after),
        "{}",
        bar.routed_after
    );
    assert_eq!(stopped.runs, whole.runs[..1]);
    assert_eq!(stopped.floors, whole.floors[..1]);
    assert_eq!(
        not_run(&stopped),
        [
            ("least-request", 1, true),
            ("infergate", 1, false),
            ("round-robin", 2, false),
            ("least-request", 2, false),
            ("infergate", 2, false),
        ]
    );
    assert!(whole.interrupted.is_none());
}

#[test]
fn a_bench_stopped_between_runs_starts_no_other() {
    let s = Scenario::from_yaml(MIXED, "t").unwrap();
    let flag = AtomicBool::new(false);
    let (whole, stopped, bar) = whole_and_stopped(&s, When::Finish(2), &flag);
    assert_eq!(bar.labels.len(), 2);
    assert_eq!(stopped.runs, whole.runs[..2]);
    assert_eq!(not_run(&stopped), [("infergate", 1, false)]);
}

#[test]
fn flow_and_replica_benches_stop_alike() {
    // A flow scenario's reference run is named by its progress label; the rows before it stay.
    let flow = Scenario::from_yaml(
        &MIXED.replace(
            "policies: [round-robin, least-request, infergate]",
            "policies: [infergate]\nstale: [{ from_s: 5, to_s: 20 }]\nflow: { targets: { stale_vs_direct: 3.0 } }",
        ),
        "t",
    )
    .unwrap();
    let flag = AtomicBool::new(false);
    let (whole, stopped, bar) = whole_and_stopped(&flow, When::Start(4), &flag);
    assert!(bar.labels[3].ends_with(" direct"), "{:?}", bar.labels);
    assert_eq!(stopped.runs, whole.runs);
    assert_eq!(not_run(&stopped), [("direct", 1, true)]);
    let (w, p) = (whole.flow.unwrap(), stopped.flow.unwrap());
    assert_eq!(p.summary.len(), w.summary.len());
    // Replica runs are named as in the report.
    let mut replicas = Scenario::from_yaml(MIXED, "t").unwrap();
    replicas.policies = vec!["infergate".parse().unwrap()];
    replicas.replicas = Some(crate::scenario::ReplicaBench {
        counts: vec![1, 2],
        ..Default::default()
    });
    let flag = AtomicBool::new(false);
    let (whole, stopped, bar) = whole_and_stopped(&replicas, When::Start(2), &flag);
    assert_eq!(stopped.runs, whole.runs[..1]);
    let names: Vec<&str> = whole.runs.iter().map(|r| r.policy.as_str()).collect();
    let stopped_names: Vec<&str> = not_run(&stopped).iter().map(|n| n.0).collect();
    assert_eq!(stopped_names, names[1..]);
    assert!(bar.labels[1].ends_with(names[1]), "{:?}", bar.labels);
}

#[test]
fn a_bench_stopped_before_it_began_runs_nothing() {
    let s = Scenario::from_yaml(MIXED, "t").unwrap();
    let flag = AtomicBool::new(true);
    let r = run_until(&s, "t", &mut Silent, RunOptions::default(), &flag).unwrap();
    assert!(r.runs.is_empty() && r.floors.is_empty());
    assert_eq!(
        not_run(&r),
        [
            ("round-robin", 1, false),
            ("least-request", 1, false),
            ("infergate", 1, false)
        ]
    );
}
