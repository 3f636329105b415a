//! Markdown tables.

use std::fmt::Write as _;

use super::{Report, pct, secs};
use crate::stats::Spread;

fn range(s: &Spread) -> String {
    if (s.max - s.min).abs() < 1e-12 {
        secs(s.mean)
    } else {
        format!("{} ({}–{})", secs(s.mean), secs(s.min), secs(s.max))
    }
}

/// The comparison table: one row per policy, means over seeds with ranges.
pub(super) fn table(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| policy | TTFT P50 | TTFT P95 | TTFT P99 | ITL P50 | ITL P99 | E2E P99 | req/s | out tok/s | rejected | errors | P95 vs RR | P99 vs RR | tput vs RR | P99 / floor |"
    );
    let _ = writeln!(
        s,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let opt = |o: &Option<Spread>| o.as_ref().map_or("—".to_owned(), pct);
    for p in &r.summary {
        // A policy none of whose runs completed a request has no latencies to show.
        let has = p.has_latencies();
        let lat = |v: String| if has { v } else { "—".to_owned() };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} |",
            p.policy,
            lat(secs(p.ttft_p50.mean)),
            lat(range(&p.ttft_p95)),
            lat(range(&p.ttft_p99)),
            lat(secs(p.itl_p50.mean)),
            lat(secs(p.itl_p99.mean)),
            lat(secs(p.e2e_p99.mean)),
            p.requests_per_s.mean,
            p.output_tokens_per_s.mean,
            p.rejected.mean,
            p.errors.mean,
            opt(&p.ttft_p95_vs_rr),
            opt(&p.ttft_p99_vs_rr),
            opt(&p.throughput_vs_rr),
            p.ttft_p99_vs_floor
                .as_ref()
                .map_or("—".to_owned(), |f| format!("{:.2}×", f.mean)),
        );
    }
    let floor = Spread::of(r.floors.iter().map(|f| f.ttft.p99));
    let floor95 = Spread::of(r.floors.iter().map(|f| f.ttft.p95));
    // The floor against round-robin is the largest reduction any router could show.
    let vs_rr = |get: fn(&crate::stats::Percentiles) -> f64| {
        let v: Vec<f64> = r
            .floors
            .iter()
            .filter_map(|f| {
                r.runs
                    .iter()
                    .find(|x| x.policy == "round-robin" && x.seed == f.seed && x.completed > 0)
                    .map(|b| super::change(get(&f.ttft), get(&b.ttft)))
            })
            .collect();
        if v.is_empty() {
            "—".to_owned()
        } else {
            pct(&Spread::of(v))
        }
    };
    let _ = writeln!(
        s,
        "| *clairvoyant floor* | | {} | {} | | | | | | | | {} | {} | | 1.00× |",
        range(&floor95),
        range(&floor),
        vs_rr(|p| p.p95),
        vs_rr(|p| p.p99)
    );
    s
}

/// Why requests failed, run by run; `None` when none did.
pub(super) fn failures(r: &Report) -> Option<String> {
    let mut s = String::new();
    for run in r.runs.iter().filter(|x| x.errors > 0) {
        let why = run.failure_reasons();
        let _ = writeln!(
            s,
            "- {}, seed {}: {} of {} requests failed{}{}",
            run.policy,
            run.seed,
            run.errors,
            run.requests,
            if why.is_empty() { "" } else { ": " },
            why
        );
    }
    (!s.is_empty()).then_some(s)
}

/// What the attempts of each policy's requests met (means over seeds, ranges in parentheses),
/// when the runs counted them (a scenario with failing pods); `None` otherwise.
pub(super) fn attempts(r: &Report) -> Option<String> {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| policy | first attempts to a failing pod | attempts per request | failed attempts | failed requests | ejections (held back) |\n|---|---:|---:|---:|---:|---:|"
    );
    let mut any = false;
    for p in &r.summary {
        let runs: Vec<&super::Attempts> = r
            .runs
            .iter()
            .filter(|x| x.policy == p.policy)
            .filter_map(|x| x.attempts.as_ref())
            .collect();
        if runs.is_empty() {
            continue;
        }
        any = true;
        let of = |f: &dyn Fn(&super::Attempts) -> f64| Spread::of(runs.iter().map(|a| f(a)));
        let share = of(&|a| a.first_to_failing_share() * 100.0);
        let per = of(&|a| a.per_request());
        let with_range = |sp: &Spread, digits: usize, unit: &str| {
            if (sp.max - sp.min).abs() < 1e-12 {
                format!("{:.digits$}{unit}", sp.mean)
            } else {
                format!(
                    "{:.digits$}{unit} ({:.digits$}–{:.digits$})",
                    sp.mean, sp.min, sp.max
                )
            }
        };
        let count = |f: &dyn Fn(&super::Attempts) -> u64| with_range(&of(&|a| f(a) as f64), 0, "");
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} ({}) |",
            p.policy,
            with_range(&share, 1, "%"),
            with_range(&per, 2, ""),
            count(&|a| a.failed),
            count(&|a| a.exhausted),
            count(&|a| a.ejections),
            count(&|a| a.held_back),
        );
    }
    any.then_some(s)
}

/// The verdict list.
pub(super) fn verdicts(r: &Report) -> String {
    let mut s = String::new();
    for v in &r.verdicts {
        let _ = writeln!(
            s,
            "- {} **{}** — {}: {}",
            if v.met { "✅" } else { "❌" },
            if v.met { "met" } else { "missed" },
            v.target,
            v.measured
        );
    }
    s
}

/// Prefix-cache hit rate per policy (mean over seeds, range), when the runs measured it.
pub(super) fn prefix_hits(r: &Report) -> Option<String> {
    let mut s = String::new();
    let _ = writeln!(s, "| policy | prefix-cache hit rate |\n|---|---:|");
    let mut any = false;
    for p in &r.summary {
        let rates: Vec<f64> = r
            .runs
            .iter()
            .filter(|x| x.policy == p.policy)
            .filter_map(|x| x.prefix_hit_rate)
            .collect();
        if rates.is_empty() {
            continue;
        }
        any = true;
        let sp = Spread::of(rates);
        let _ = writeln!(
            s,
            "| {} | {:.1}% ({:.1}–{:.1}) |",
            p.policy,
            sp.mean * 100.0,
            sp.min * 100.0,
            sp.max * 100.0
        );
    }
    any.then_some(s)
}

/// Per-pod share of completed requests.
pub(super) fn pod_shares(r: &Report) -> String {
    let mut s = String::new();
    let _ = write!(s, "| pod | GPU |");
    for p in &r.summary {
        let _ = write!(s, " {} |", p.policy);
    }
    let _ = writeln!(s);
    let _ = write!(s, "|---|---|");
    for _ in &r.summary {
        let _ = write!(s, "---:|");
    }
    let _ = writeln!(s);
    for (i, pod) in r.pods.iter().enumerate() {
        let _ = write!(s, "| {} | {} |", pod.name, pod.gpu);
        for p in &r.summary {
            match p.pod_share.as_ref().and_then(|v| v.get(i)) {
                Some(share) => {
                    let _ = write!(s, " {:.1}% |", share * 100.0);
                }
                _ => {
                    let _ = write!(s, " — |");
                }
            }
        }
        let _ = writeln!(s);
    }
    s
}

/// What the live gateway ran with: its scrape settings and the metrics-age bounds.
fn gateway(g: &super::LiveGateway) -> String {
    let ms = |v: u64| secs(v as f64 / 1e3);
    let sc = &g.scrape;
    let mut s = format!(
        "Gateway: scrapes every {} (`scrape.intervalMs` {}); a pod is stale after {} without a good page (`staleAfterMs` {}: two intervals and the scenario's scrape lag, as simulated, at least the gateway's default); a scrape has {} to connect (`timeoutMs`) and {} to answer (`maxLateMs`).",
        ms(sc.interval_ms),
        sc.interval_ms,
        ms(sc.stale_after_ms),
        sc.stale_after_ms,
        ms(sc.timeout_ms),
        ms(sc.max_late_ms),
    );
    if !g.max_metrics_age_ms.is_empty() {
        let ages: Vec<String> = g
            .max_metrics_age_ms
            .iter()
            .map(|(p, age)| format!("{p} {}", ms(*age)))
            .collect();
        let _ = write!(
            s,
            " Pods whose metrics are older are not routed on (`maxMetricsAge`, at least the threshold plus one interval): {}.",
            ages.join(", ")
        );
    }
    s.push('\n');
    s
}

/// How a live report's prompts were sized, and the prompt tokens the server counted.
fn prompts(r: &Report) -> String {
    let mut s = match &r.tokenizer {
        Some(dir) => format!(
            "Prompts: sized in the tokens of the model's tokenizer in `{}` (`--tokenizer`), which the pods tokenize with too.",
            dir.display()
        ),
        None => "Prompts: sized in the emulator's stand-in tokens (4 bytes of text a token; `--tokenizer DIR` sizes them in a model's).".to_owned(),
    };
    let (tokens, completed) = r
        .runs
        .iter()
        .filter_map(|x| x.prompt_tokens.map(|t| (t, x.completed)))
        .fold((0u64, 0u64), |(t, c), (x, y)| (t + x, c + y));
    if completed > 0 {
        let _ = write!(
            s,
            " The server counted {:.1} prompt tokens per completed request (`usage.prompt_tokens`, chat template included).",
            tokens as f64 / completed as f64
        );
    }
    s.push('\n');
    s
}

/// The whole report page.
pub(super) fn render(r: &Report) -> String {
    let sc = &r.scenario;
    let mut s = String::new();
    let _ = writeln!(s, "# {} ({})\n", sc.name, r.mode);
    if let Some(i) = &r.interrupted {
        let _ = writeln!(
            s,
            "**Interrupted — partial report.** The bench was stopped before every run completed; the figures below are over the runs that did. Not run: {}.\n",
            i.list()
        );
    }
    if !sc.description.is_empty() {
        let _ = writeln!(s, "{}\n", sc.description.trim());
    }
    let seeds: Vec<String> = sc.seeds.iter().map(u64::to_string).collect();
    let requests = Spread::of(
        r.runs
            .iter()
            .filter(|x| x.policy == r.summary.first().map_or("", |p| p.policy.as_str()))
            .map(|x| x.requests as f64),
    );
    let _ = writeln!(
        s,
        "Fleet: {} pods. Seeds: {} (every policy sees the same arrivals per seed; about {:.0} requests per run). \
         Figures are means over seeds, ranges in parentheses; \"vs RR\" compares with round-robin on the same seed.\n",
        r.pods.len(),
        seeds.join(", "),
        requests.mean
    );
    if let Some(g) = &r.gateway {
        let _ = writeln!(s, "{}", gateway(g));
    }
    if r.mode == "live" {
        let _ = writeln!(s, "{}", prompts(r));
    }
    if let Some(st) = &sc.study {
        let f = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:+.0}%"));
        let _ = writeln!(
            s,
            "Published study, against round-robin: TTFT P95 {}, P99 {}, throughput {}.\n",
            f(st.ttft_p95_pct),
            f(st.ttft_p99_pct),
            f(st.throughput_pct)
        );
    }
    let _ = writeln!(s, "{}", table(r));
    if let Some(f) = failures(r) {
        let _ = writeln!(s, "Failed requests:\n\n{f}");
    }
    if let Some(t) = attempts(r) {
        let _ = writeln!(
            s,
            "Attempts per policy, per run: a request a pod fails is tried on the next pod of its pick, at most {} {} in all (`retries.maxAttempts`); a failing pod is one with an `error_rate` above 0 when the attempt is sent; failed requests are those whose every attempt failed.\n\n{t}",
            sc.retries.max_attempts,
            if sc.retries.max_attempts == 1 {
                "attempt"
            } else {
                "attempts"
            }
        );
    }
    if !r.front_logs.is_empty() {
        let _ = writeln!(s, "Output of the external fronts:\n");
        for l in &r.front_logs {
            let _ = writeln!(s, "- {}: `{}`", l.front, l.log.display());
        }
        let _ = writeln!(s);
    }
    if let Some(f) = &r.flow {
        let _ = writeln!(
            s,
            "## Flow control\n\nEvery flow policy routes with the same scheduler preset; TTFT counts from arrival, so time queued in the gateway is included.\n\n{}",
            super::flow::markdown(sc, f)
        );
    }
    if !r.verdicts.is_empty() {
        let _ = writeln!(s, "Targets for `infergate`:\n\n{}", verdicts(r));
    }
    let _ = writeln!(
        s,
        "Share of completed requests per pod:\n\n{}",
        pod_shares(r)
    );
    if let Some(t) = prefix_hits(r) {
        let _ = writeln!(
            s,
            "Prompt tokens served from the pods' prefix caches:\n\n{t}"
        );
    }
    let name = format!("{}-{}", sc.name, r.mode);
    let _ = writeln!(
        s,
        "![TTFT CDF per policy]({name}-ttft-cdf.svg)\n\n![Per-pod load over time]({name}-load.svg)"
    );
    s
}
