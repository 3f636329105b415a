use std::net::SocketAddr;

use infergate_openai::Usage;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

use super::*;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn usage(prompt: u64, completion: u64, cached: u64) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_tokens: cached,
    }
}

/// The exported text's sample lines, sorted (families keep series in hash order).
fn samples(registry: &Registry) -> Vec<String> {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

/// A mixed sequence of finished requests: two models, three endpoints and none, every outcome,
/// usage with zero and non-zero kinds.
fn events() -> Vec<(&'static str, Option<SocketAddr>, Outcome, Option<Usage>)> {
    let (a, b, c) = (
        Some(addr("10.0.0.1:8000")),
        Some(addr("10.0.0.2:8000")),
        Some(addr("[fd00::3]:8000")),
    );
    let mut out = Vec::new();
    for i in 0..50_u64 {
        out.push(("llama", a, Outcome::Success, Some(usage(10 + i, 3, i % 4))));
        out.push(("llama", b, Outcome::Success, Some(usage(7, 0, 0))));
        if i % 3 == 0 {
            out.push(("llama", a, Outcome::Error, None));
            out.push(("qwen", c, Outcome::Cancelled, None));
        }
        if i % 7 == 0 {
            out.push(("qwen", None, Outcome::Cancelled, None));
            out.push(("qwen", c, Outcome::Success, Some(usage(1, 1, 1))));
        }
    }
    out
}

#[test]
fn cached_counting_exports_exactly_what_the_family_path_does() {
    let mut cached_registry = Registry::default();
    let cached = Telemetry::register(&mut cached_registry).for_pool("pool-a");
    let mut plain_registry = Registry::default();
    let plain = Telemetry::register(&mut plain_registry);
    for (model, pod, outcome, u) in events() {
        cached.finished(model, pod, outcome, u.as_ref());
        let pod = pod.map(|p| p.to_string()).unwrap_or_default();
        if let Some(u) = &u {
            plain.usage("pool-a", model, u);
        }
        plain.request("pool-a", model, &pod, outcome.as_str());
    }
    assert_eq!(samples(&cached_registry), samples(&plain_registry));
}

#[test]
fn counts_are_exact_per_pool_model_pod_and_outcome() {
    let mut registry = Registry::default();
    let telemetry = Telemetry::register(&mut registry);
    let pool = telemetry.for_pool("llama-pool");
    let other = telemetry.for_pool("other-pool");
    let (a, b) = (addr("10.0.0.1:8000"), addr("10.0.0.2:8001"));
    for _ in 0..3 {
        pool.finished("llama", Some(a), Outcome::Success, Some(&usage(5, 2, 0)));
    }
    pool.finished("llama", Some(b), Outcome::Error, None);
    pool.finished("llama", None, Outcome::Cancelled, None);
    other.finished("llama", Some(a), Outcome::Success, None);
    let lines = samples(&registry);
    let expected = [
        r#"infergate_extproc_requests_total{pool="llama-pool",model="llama",pod="10.0.0.1:8000",outcome="success"} 3"#,
        r#"infergate_extproc_requests_total{pool="llama-pool",model="llama",pod="10.0.0.2:8001",outcome="error"} 1"#,
        r#"infergate_extproc_requests_total{pool="llama-pool",model="llama",pod="",outcome="cancelled"} 1"#,
        r#"infergate_extproc_requests_total{pool="other-pool",model="llama",pod="10.0.0.1:8000",outcome="success"} 1"#,
        r#"infergate_extproc_tokens_total{pool="llama-pool",model="llama",kind="input"} 15"#,
        r#"infergate_extproc_tokens_total{pool="llama-pool",model="llama",kind="output"} 6"#,
    ];
    for line in expected {
        assert!(
            lines.iter().any(|l| l == line),
            "missing `{line}` in {lines:#?}"
        );
    }
    // Nothing else: no zero series for outcomes or token kinds that never happened.
    let counted: Vec<&String> = lines
        .iter()
        .filter(|l| {
            l.starts_with("infergate_extproc_requests_total")
                || l.starts_with("infergate_extproc_tokens_total")
        })
        .collect();
    assert_eq!(counted.len(), expected.len(), "{counted:#?}");
}

#[test]
fn concurrent_counting_loses_nothing() {
    let mut registry = Registry::default();
    let pool = std::sync::Arc::new(Telemetry::register(&mut registry).for_pool("p"));
    let pods: Vec<SocketAddr> = (0..8).map(|i| addr(&format!("10.0.0.{i}:8000"))).collect();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let pool = std::sync::Arc::clone(&pool);
            let pods = pods.clone();
            std::thread::spawn(move || {
                for i in 0..5_000_usize {
                    let model = if (i + t) % 2 == 0 { "m0" } else { "m1" };
                    pool.finished(
                        model,
                        Some(pods[i % pods.len()]),
                        Outcome::Success,
                        Some(&usage(1, 2, 0)),
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let lines = samples(&registry);
    let total = |prefix: &str| -> u64 {
        lines
            .iter()
            .filter(|l| l.starts_with(prefix))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(total("infergate_extproc_requests_total{"), 20_000);
    assert_eq!(
        total("infergate_extproc_tokens_total{pool=\"p\",model=\"m0\",kind=\"input\"}"),
        10_000
    );
    assert_eq!(
        total("infergate_extproc_tokens_total{pool=\"p\",model=\"m1\",kind=\"output\"}"),
        20_000
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("infergate_extproc_requests_total{"))
            .count(),
        16,
        "two models times eight pods, one outcome"
    );
}

#[test]
fn client_chosen_model_names_cannot_grow_the_series_without_bound() {
    let mut registry = Registry::default();
    let pool = Telemetry::register(&mut registry).for_pool("p");
    let pod = Some(addr("10.0.0.1:8000"));
    for i in 0..MAX_MODEL_LABELS + 100 {
        pool.finished(&format!("made-up-{i}"), pod, Outcome::Success, None);
    }
    // A model counted before the cap keeps its own series after it.
    pool.finished("made-up-0", pod, Outcome::Success, None);
    let lines = samples(&registry);
    let requests: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("infergate_extproc_requests_total"))
        .collect();
    assert_eq!(requests.len(), MAX_MODEL_LABELS + 1, "{requests:#?}");
    assert!(lines.iter().any(|l| l
        == r#"infergate_extproc_requests_total{pool="p",model="(other)",pod="10.0.0.1:8000",outcome="success"} 100"#));
    assert!(lines.iter().any(|l| l
        == r#"infergate_extproc_requests_total{pool="p",model="made-up-0",pod="10.0.0.1:8000",outcome="success"} 2"#));
}

#[test]
fn a_huge_model_name_is_cut_to_a_bounded_label() {
    let mut registry = Registry::default();
    let pool = Telemetry::register(&mut registry).for_pool("p");
    let pod = Some(addr("10.0.0.1:8000"));
    let huge = "x".repeat(1 << 20);
    pool.finished(&huge, pod, Outcome::Success, None);
    // Another name with the same first 128 bytes counts in the same series.
    pool.finished(
        &format!("{}-other", &huge[..MAX_MODEL_LABEL_BYTES]),
        pod,
        Outcome::Success,
        None,
    );
    let lines = samples(&registry);
    let expected = format!(
        r#"infergate_extproc_requests_total{{pool="p",model="{}",pod="10.0.0.1:8000",outcome="success"}} 2"#,
        "x".repeat(MAX_MODEL_LABEL_BYTES)
    );
    assert!(lines.contains(&expected), "{lines:#?}");
    assert!(lines.iter().all(|l| l.len() < 1024), "a line is too long");
}
