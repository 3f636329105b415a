//! The gateway in front of emulated vLLM and SGLang pods (`infergate-sim`), with the `infergate`
//! preset scoring on their scraped metrics pages.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/upstream.rs"]
mod upstream;

use std::net::SocketAddr;
use std::time::Duration;

use infergate_proxy::{Gateway, GatewayConfig};
use infergate_sim::{Faults, MetricsFault, ServedFleet};
use infergate_testkit::metric;
use upstream::{get, post, send, serve_emulated, serve_gateway, wait_ready};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emulated_pods_serve_chat_and_completions_through_the_gateway() {
    let (fleet, fleet_stop) = serve_emulated(
        "seed: 7\npods:\n  - { name: a, profile: llama-3.1-8b/h100, engine: vllm, served_model_name: llama }\n  - { name: b, profile: llama-3.1-8b/h100, engine: sglang, served_model_name: llama }\n",
    )
    .await;
    let addrs = fleet.addrs();
    let config = GatewayConfig::from_yaml(&format!(
        "auth: none\nmodels:\n  - name: llama\n    scheduler: {{ preset: infergate }}\n    endpoints:\n      - {{ address: {}, name: a, engine: vllm }}\n      - {{ address: {}, name: b, engine: sglang }}\n",
        addrs[0].1, addrs[1].1
    ))
    .unwrap();
    let (gw, stop) = serve_gateway(config).await;
    let admin = gw.admin_addr().unwrap();

    // Both engines' pages are scraped: the gateway becomes ready.
    wait_ready(admin).await;

    let served: Vec<String> = addrs.iter().map(|(_, a)| a.to_string()).collect();
    let chat =
        r#"{"model":"llama","max_tokens":4,"messages":[{"role":"user","content":"Hello there"}]}"#;
    let (status, headers, body) = post(gw.http_addr(), "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let from = headers["x-infergate-endpoint"].to_str().unwrap().to_owned();
    assert!(served.contains(&from), "{from}");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0, "{v}");

    let stream = r#"{"model":"llama","max_tokens":4,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hello again"}]}"#;
    let (status, _, body) = post(gw.http_addr(), "/v1/chat/completions", stream).await;
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("data: [DONE]"), "{text}");

    let completion = r#"{"model":"llama","max_tokens":4,"prompt":"Once upon a time"}"#;
    let (status, _, _) = post(gw.http_addr(), "/v1/completions", completion).await;
    assert_eq!(status, 200);

    let (_, m) = get(admin, "/metrics").await;
    assert!(
        m.contains(r#"infergate_gateway_requests_total{model="llama",code="2xx"} 3"#),
        "{m}"
    );
    assert!(
        m.contains(r#"infergate_gateway_ttft_seconds_count{model="llama"} 1"#),
        "{m}"
    );
    assert_eq!(gw.handle().inflight("llama"), Some(0));

    stop.send(()).unwrap();
    gw.wait().await;
    fleet_stop.send(()).unwrap();
    fleet.wait().await;
}

/// Emulated vLLM pods `a`, `b`, … behind a gateway with the `infergate` preset (extra YAML for the
/// model in `model_extra`), ready (every pod scraped).
struct Rig {
    fleet: Option<ServedFleet>,
    fleet_stop: Option<tokio::sync::oneshot::Sender<()>>,
    gw: Gateway,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Rig {
    async fn start(pods: usize, top: &str, model_extra: &str) -> Rig {
        let names: Vec<String> = (0..pods)
            .map(|i| ((b'a' + i as u8) as char).to_string())
            .collect();
        let mut yaml = String::from("seed: 7\npods:\n");
        for n in &names {
            yaml += &format!(
                "  - {{ name: {n}, profile: llama-3.1-8b/h100, engine: vllm, served_model_name: llama }}\n"
            );
        }
        let (fleet, fleet_stop) = serve_emulated(&yaml).await;
        let mut config = format!(
            "auth: none\n{top}models:\n  - name: llama\n    scheduler: {{ preset: infergate }}\n{model_extra}    endpoints:\n"
        );
        for (name, addr) in fleet.addrs() {
            config += &format!("      - {{ address: {addr}, name: {name}, engine: vllm }}\n");
        }
        let config = GatewayConfig::from_yaml(&config).unwrap();
        let (gw, stop) = serve_gateway(config).await;
        let admin = gw.admin_addr().unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (_, m) = get(admin, "/metrics").await;
            if fleet.pods.iter().all(|p| {
                metric(&m, "infergate_pod_stale", &[("pod", &p.addr.to_string())]) == Some(0.0)
            }) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pods never scraped\n{m}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Rig {
            fleet: Some(fleet),
            fleet_stop: Some(fleet_stop),
            gw,
            _stop: stop,
        }
    }

    fn fleet(&self) -> &ServedFleet {
        self.fleet.as_ref().unwrap()
    }

    fn pod(&self, name: &str) -> SocketAddr {
        self.fleet()
            .pods
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .addr
    }

    fn set_metrics(&self, name: &str, metrics: MetricsFault) {
        let h = self.fleet().handle(name).unwrap();
        h.set_faults(Faults {
            metrics,
            ..h.faults()
        });
    }

    async fn metrics(&self) -> String {
        get(self.gw.admin_addr().unwrap(), "/metrics").await.1
    }

    /// Waits until `family{pod=<name's address>, …}` reads `value` on the gateway's `/metrics`.
    async fn wait_metric(&self, family: &str, name: &str, value: f64) {
        let pod = self.pod(name).to_string();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let m = self.metrics().await;
            if metric(&m, family, &[("pod", &pod)]) == Some(value) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{family} of {name} never {value}\n{m}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends one chat request and returns (status, serving pod address, headers).
    async fn chat(&self, i: usize) -> (u16, Option<SocketAddr>, http::HeaderMap) {
        let body = format!(
            r#"{{"model":"llama","max_tokens":2,"messages":[{{"role":"user","content":"question {i}"}}]}}"#
        );
        let (status, headers, _) = post(self.gw.http_addr(), "/v1/chat/completions", &body).await;
        let from = headers
            .get("x-infergate-endpoint")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        (status.as_u16(), from, headers)
    }
}

/// Keeps `n` long generations running on `pod`, sent directly (as other gateways would).
fn load(pod: SocketAddr, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            tokio::spawn(async move {
                let body = format!(
                    r#"{{"model":"llama","max_tokens":4000,"messages":[{{"role":"user","content":"background job {i}"}}]}}"#
                );
                // Its answer does not matter (the test ends first): no panic if it fails.
                let _ = infergate_testkit::try_post(
                    pod,
                    "/v1/chat/completions",
                    "application/json",
                    &body,
                )
                .await;
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_pod_metrics_on_the_gateway_match_the_pods_own_pages() {
    let rig = Rig::start(2, "", "").await;
    let a = rig.pod("a");
    let jobs = load(a, 300);
    // Wait until pod a's page shows the load (running and queued), then freeze it so that the
    // gateway's copy and ours are the same page. The frozen page is the last one served, which
    // may be a scrape taken after the load drained: then thaw it and try again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let loaded = |page: &str| {
        [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
        ]
        .iter()
        .all(|f| metric(page, f, &[]).unwrap_or(0.0) > 0.0)
    };
    let page = loop {
        let (_, page) = get(a, "/metrics").await;
        if loaded(&page) {
            rig.set_metrics("a", MetricsFault::Frozen);
            let (_, frozen) = get(a, "/metrics").await;
            if loaded(&frozen) {
                break frozen;
            }
            rig.set_metrics("a", MetricsFault::Normal);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "load never visible\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let waiting = metric(&page, "vllm:num_requests_waiting", &[]).unwrap();
    let running = metric(&page, "vllm:num_requests_running", &[]).unwrap();
    let kv = metric(&page, "vllm:kv_cache_usage_perc", &[]).unwrap();
    // An earlier page may have had the same waiting count: wait for the frozen page's whole
    // reading, not one field of it.
    rig.wait_metric("infergate_pod_waiting_requests", "a", waiting)
        .await;
    rig.wait_metric("infergate_pod_running_requests", "a", running)
        .await;
    rig.wait_metric("infergate_pod_kv_cache_usage_ratio", "a", kv)
        .await;
    let m = rig.metrics().await;
    let pod = a.to_string();
    let labels = [
        ("model", "llama"),
        ("pod", pod.as_str()),
        ("name", "llama/a"),
    ];
    assert_eq!(
        metric(&m, "infergate_pod_running_requests", &labels),
        Some(running),
        "{m}"
    );
    assert_eq!(
        metric(&m, "infergate_pod_kv_cache_usage_ratio", &labels),
        Some(kv),
        "{m}"
    );
    assert_eq!(
        metric(&m, "infergate_pod_inflight_requests", &labels),
        Some(0.0),
        "{m}"
    );
    assert_eq!(metric(&m, "infergate_pod_stale", &labels), Some(0.0), "{m}");
    let age = metric(&m, "infergate_pod_metrics_age_seconds", &labels).unwrap();
    assert!((0.0..0.25).contains(&age), "{age}");
    // Pod b is idle, and its series are its own.
    let b = rig.pod("b").to_string();
    let labels_b = [("pod", b.as_str()), ("name", "llama/b")];
    assert_eq!(
        metric(&m, "infergate_pod_waiting_requests", &labels_b),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "infergate_pod_running_requests", &labels_b),
        Some(0.0),
        "{m}"
    );
    // One series per pod and family.
    let count = m
        .lines()
        .filter(|l| l.starts_with("infergate_pod_running_requests{"))
        .count();
    assert_eq!(count, 2, "{m}");
    for j in jobs {
        j.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_pod_is_excluded_and_readmitted_by_the_gateway() {
    let rig = Rig::start(2, "", "").await;
    let (a, b) = (rig.pod("a"), rig.pod("b"));
    // b's metrics page goes away (404): it turns stale and gets no traffic.
    rig.set_metrics("b", MetricsFault::Missing);
    rig.wait_metric("infergate_pod_stale", "b", 1.0).await;
    for i in 0..20 {
        let (status, from, _) = rig.chat(i).await;
        assert_eq!(status, 200);
        assert_eq!(from, Some(a), "request {i} went to the stale pod");
    }
    // The page comes back: b is readmitted on its next good scrape.
    rig.set_metrics("b", MetricsFault::Normal);
    rig.wait_metric("infergate_pod_stale", "b", 0.0).await;
    let mut on_b = 0;
    for i in 0..40 {
        let (status, from, _) = rig.chat(100 + i).await;
        assert_eq!(status, 200);
        on_b += usize::from(from == Some(b));
    }
    assert!(on_b > 0, "b never readmitted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pod_dead_is_503_with_retry_after_on_the_gateway() {
    let mut rig = Rig::start(2, "", "").await;
    assert_eq!(rig.chat(0).await.0, 200);
    // Every pod dies (connections refused, scrapes fail).
    rig.fleet_stop.take().unwrap().send(()).unwrap();
    rig.fleet.take().unwrap().wait().await;
    // Until the scrapes see the refusals a request may still be sent to a pod believed alive:
    // its refused connection takes the pod out at once, and the answer is 503 `upstream_refused`
    // (nothing was sent), never a 502. Then the gateway stops routing to dead pods. Every answer
    // says when to come back.
    let body = r#"{"model":"llama","messages":[{"role":"user","content":"x"}]}"#;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut refused = 0;
    loop {
        let (status, headers, answer) =
            post(rig.gw.http_addr(), "/v1/chat/completions", body).await;
        let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(status, 503, "{v}");
        assert_eq!(headers["retry-after"], "1");
        if v["error"]["code"] == "no_fresh_endpoints" {
            break;
        }
        assert_eq!(v["error"]["code"], "upstream_refused", "{v}");
        refused += 1;
        assert!(
            tokio::time::Instant::now() < deadline,
            "never no_fresh_endpoints"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Two pods: each refusal takes one out, so at most one answer per pod says so.
    assert!(refused <= 2, "{refused} requests were sent to dead pods");
    let (status, _, body) = post(rig.gw.http_addr(), "/v1/chat/completions", body).await;
    assert_eq!(status, 503);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "no_fresh_endpoints", "{v}");
    let m = rig.metrics().await;
    assert!(
        metric(
            &m,
            "infergate_gateway_rejections_total",
            &[("reason", "no_fresh_endpoints")]
        )
        .is_some_and(|n| n >= 2.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            "infergate_gateway_rejections_total",
            &[("reason", "upstream_refused")]
        )
        .unwrap_or(0.0),
        f64::from(refused),
        "{m}"
    );
    assert_eq!(
        m.lines()
            .filter(|l| l.starts_with("infergate_pod_stale{") && l.ends_with(" 1"))
            .count(),
        2,
        "{m}"
    );
    // `/readyz` says which model cannot route, and why.
    let (status, why) = get(rig.gw.admin_addr().unwrap(), "/readyz").await;
    assert_eq!(status, 503);
    assert!(
        why.starts_with(
            "not ready\nmodel \"llama\": stale: none of its 2 endpoints has fresh metrics (2 \
             failing scrapes, 0 last pages older than "
        ),
        "{why}"
    );
}

/// Pool exhaustion: every pod saturated, standard requests shed with a `Retry-After` that is the
/// pool's estimated drain time. The test measures the real drain time on emulated A10G pods (the
/// time from the first 429 until a retry is routed again, with no new load) and requires the
/// advertised `Retry-After` to be within a factor of two of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shed_retry_after_is_within_twice_the_emulated_drain_time() {
    let (fleet, _fleet_stop) = serve_emulated(
        "seed: 7\npods:\n  - { name: a, profile: llama-3.1-8b/a10g, engine: vllm, served_model_name: llama }\n  - { name: b, profile: llama-3.1-8b/a10g, engine: vllm, served_model_name: llama }\n",
    )
    .await;
    let mut config = String::from(
        "auth: none\nretries: { maxAttempts: 1 }\nmodels:\n  - name: llama\n    scheduler: { preset: infergate }\n    endpoints:\n",
    );
    for (name, addr) in fleet.addrs() {
        config += &format!("      - {{ address: {addr}, name: {name}, engine: vllm }}\n");
    }
    let config = GatewayConfig::from_yaml(&config).unwrap();
    let (gw, _stop) = serve_gateway(config).await;
    let (http, admin) = (gw.http_addr(), gw.admin_addr().unwrap());
    wait_ready(admin).await;
    let filler = "The quick brown fox jumps over the lazy dog. ".repeat(25);
    let job = move |i: usize| {
        format!(
            r#"{{"model":"llama","max_tokens":48,"stream":true,"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"job {i}: {filler}"}}]}}"#
        )
    };
    // Warm-up: the gateway learns the pods' rates and the traffic's shape, as it would have in
    // production before an overload.
    for i in 0..4 {
        let (status, _, _) = post(http, "/v1/chat/completions", &job(i)).await;
        assert_eq!(status, 200);
    }
    // Overload: jobs arrive faster than the pods take them until the gateway sheds.
    let (shed_tx, mut shed_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let mut running = Vec::new();
    let mut retry_after = None;
    for i in 0..2_000 {
        let body = job(100 + i);
        let tx = shed_tx.clone();
        running.push(tokio::spawn(async move {
            let (status, headers, _) = post(http, "/v1/chat/completions", &body).await;
            if status == 429 {
                let secs = headers["retry-after"].to_str().unwrap().parse().unwrap();
                let _ = tx.send(secs);
            }
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
        if let Ok(secs) = shed_rx.try_recv() {
            retry_after = Some(secs);
            break;
        }
    }
    let shed_at = tokio::time::Instant::now();
    let retry_after = retry_after.expect("never shed");
    // No new load: probe until a request is routed again.
    let probe =
        r#"{"model":"llama","max_tokens":1,"messages":[{"role":"user","content":"probe"}]}"#;
    let drained = loop {
        let (status, _, _) = post(http, "/v1/chat/completions", probe).await;
        if status != 429 {
            break shed_at.elapsed();
        }
        assert!(
            shed_at.elapsed() < Duration::from_secs(120),
            "never drained"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let drained = drained.as_secs_f64();
    let m = get(admin, "/metrics").await.1;
    let waiting: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("infergate_pod_waiting_requests{"))
        .collect();
    eprintln!(
        "Retry-After {retry_after} s, drained after {drained:.2} s, {} jobs, {waiting:?}",
        running.len()
    );
    let ra = retry_after as f64;
    assert!(
        ra <= 2.0 * drained.max(0.5) && ra >= drained / 2.0,
        "Retry-After {retry_after} s against a drain of {drained:.2} s"
    );
    for r in running {
        r.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_explain_header_is_off_by_default_and_names_the_chosen_pod_when_on() {
    let chat = r#"{"model":"llama","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#;
    let ask = [("x-infergate-explain", "1")];
    // Off by default: asking changes nothing.
    let off = Rig::start(2, "", "").await;
    let (status, headers, _) = send(
        off.gw.http_addr(),
        "POST",
        "/v1/chat/completions",
        chat,
        &ask,
    )
    .await;
    assert_eq!(status, 200);
    assert!(!headers.contains_key("x-infergate-explain"), "{headers:?}");
    drop(off);

    let mut on = Rig::start(2, "explainHeader: true\n", "").await;
    // On, but not asked: nothing.
    let (_, headers, _) = post(on.gw.http_addr(), "/v1/chat/completions", chat).await;
    assert!(!headers.contains_key("x-infergate-explain"), "{headers:?}");
    // Asked: the decision, naming the pod that served.
    let (status, headers, _) = send(
        on.gw.http_addr(),
        "POST",
        "/v1/chat/completions",
        chat,
        &ask,
    )
    .await;
    assert_eq!(status, 200);
    let served = headers["x-infergate-endpoint"].to_str().unwrap().to_owned();
    let explained = headers["x-infergate-explain"].to_str().unwrap().to_owned();
    assert!(
        explained.starts_with(&format!("chosen={served}")),
        "{explained}"
    );
    let name = if served == on.pod("a").to_string() {
        "llama/a"
    } else {
        "llama/b"
    };
    assert!(
        explained.contains(&format!("| {name} {served} total=")),
        "{explained}"
    );
    assert!(explained.contains("estimated-wait="), "{explained}");
    // Every page missing while the pods still answer: the `infergate` preset dispatches
    // fail-open (`staleMetrics`), and the explanation says so. (Before fail-open this was the
    // rejection case; it moved to dead pods below.)
    on.set_metrics("a", MetricsFault::Missing);
    on.set_metrics("b", MetricsFault::Missing);
    on.wait_metric("infergate_pod_stale", "a", 1.0).await;
    on.wait_metric("infergate_pod_stale", "b", 1.0).await;
    let (status, headers, _) = send(
        on.gw.http_addr(),
        "POST",
        "/v1/chat/completions",
        chat,
        &ask,
    )
    .await;
    assert_eq!(status, 200);
    let explained = headers["x-infergate-explain"].to_str().unwrap();
    assert!(explained.starts_with("chosen="), "{explained}");
    assert!(explained.contains(" fail_open"), "{explained}");
    // A rejection is explained too: every pod gone (nothing answers), 503.
    on.fleet_stop.take().unwrap().send(()).unwrap();
    on.fleet.take().unwrap().wait().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let headers = loop {
        let (status, headers, body) = send(
            on.gw.http_addr(),
            "POST",
            "/v1/chat/completions",
            chat,
            &ask,
        )
        .await;
        assert_eq!(status, 503);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        if v["error"]["code"] == "no_fresh_endpoints" {
            break headers;
        }
        // A request sent before the gateway knew: refused, explained as the pick it made.
        assert_eq!(v["error"]["code"], "upstream_refused", "{v}");
        let explained = headers["x-infergate-explain"].to_str().unwrap();
        assert!(explained.starts_with("chosen="), "{explained}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "never no_fresh_endpoints"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let explained = headers["x-infergate-explain"].to_str().unwrap();
    assert!(
        explained.starts_with("rejected=no_fresh_endpoints retry_after=1s"),
        "{explained}"
    );
    assert!(explained.contains(":freshness"), "{explained}");
}
