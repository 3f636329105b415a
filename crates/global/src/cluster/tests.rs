use super::*;

use std::sync::Mutex;

/// The first cluster of `yaml`, its files read.
fn cluster(yaml: &str) -> Cluster {
    let config = GlobalConfig::from_yaml(yaml).expect("valid configuration");
    let telemetry = Telemetry::register(&mut prometheus_client::registry::Registry::default());
    Cluster::load(
        &config,
        0,
        &mut crate::connect::SystemRoots::new(),
        &telemetry,
    )
    .expect("usable files")
}

#[test]
fn a_served_model_without_a_heartbeat_yet_is_drained_not_unknown() {
    // `models:` configured, no good heartbeat yet: the cluster serves the model with share 0
    // (drained `unknown`, a last resort), so routing does not answer "no such model".
    let c = cluster(
        "auth: none\nclusters:\n  - { name: a, url: \"http://127.0.0.1:1\", \
         heartbeatUrl: \"http://127.0.0.1:2/heartbeat\", region: r, \
         cost: { inputPerMillion: 1 }, models: [llama] }\n",
    );
    let view = c
        .view("llama", Instant::now(), 1.0)
        .expect("a configured model is a candidate before the first heartbeat");
    assert_eq!(view.weight, 0.0);
    assert!(c.view("other", Instant::now(), 1.0).is_none());
}

/// One cluster with a heartbeat and no `models:` (its models discovered).
const DISCOVERING: &str = "auth: none\nclusters:\n  - { name: a, url: \"http://127.0.0.1:1\", \
     heartbeatUrl: \"http://127.0.0.1:2/heartbeat\", region: r, cost: { inputPerMillion: 1 } }\n";

#[test]
fn a_discovered_model_without_a_good_heartbeat_is_drained_not_unknown() {
    let c = cluster(DISCOVERING);
    assert!(c.view("llama", Instant::now(), 1.0).is_none());
    c.set_served(vec!["llama".into()]);
    let view = c
        .view("llama", Instant::now(), 1.0)
        .expect("a discovered model is a candidate");
    assert_eq!(view.weight, 0.0);
    assert_eq!(c.weight("llama", Instant::now()), 0.0);
}

/// A heartbeat document with one model whose pods take `estimate` ms for a typical request,
/// all of it its own prefill, `fixed` ms of that fixed (the field left out with `None`, as a
/// gateway before it leaves it out).
fn heartbeat(estimate: f64, fixed: Option<f64>) -> Heartbeat {
    let fixed = fixed.map_or(String::new(), |f| format!(r#","fixedCostMs":{f}"#));
    serde_json::from_str(&format!(
        r#"{{"schema":"infergate.heartbeat/v1","instance":"i","generation":1,"timestampMs":1,
        "models":[{{"name":"llama","pods":1,"readyPods":1,"saturation":0.0,"queue":0,"running":0,
        "inflight":0,"estimatedTtftMs":{estimate},"prefillMs":{estimate}{fixed},"drainMs":0.0}}]}}"#
    ))
    .expect("a heartbeat document")
}

#[test]
fn a_short_prompt_is_estimated_at_the_fixed_cost_a_long_one_by_its_tokens() {
    let c = cluster(DISCOVERING);
    let at = Instant::now();
    let estimate = |tokens: f64| c.view("llama", at, tokens).expect("served").ttft_ms;
    // An emulated A10G: 165 ms for 512 tokens, 35 ms of it the fixed cost per request.
    c.apply_heartbeat(&heartbeat(165.0, Some(35.0)), Duration::ZERO, at);
    assert!((estimate(7.0) - (35.0 + 130.0 * 7.0 / 512.0)).abs() < 1e-9);
    assert!((estimate(512.0) - 165.0).abs() < 1e-9);
    assert!((estimate(4096.0) - (35.0 + 130.0 * 8.0)).abs() < 1e-9);
    // A gateway that does not publish it: in proportion to the prompt, as before.
    c.apply_heartbeat(&heartbeat(165.0, None), Duration::ZERO, at);
    assert!((estimate(7.0) - 165.0 * 7.0 / 512.0).abs() < 1e-9);
    assert!((estimate(4096.0) - 165.0 * 8.0).abs() < 1e-9);
    // Never more than the whole of the typical request's prefill.
    assert!((prompt_scale(7.0, Some(100.0), Some(500.0)) - 1.0).abs() < 1e-12);
    assert!((prompt_scale(1024.0, Some(0.0), Some(5.0)) - 2.0).abs() < 1e-12);
}

/// A heartbeat's `fixedCostMs` is another process's word: a negative one counts as none, and a
/// document whose value is not a number is refused whole, so no estimate is negative or NaN.
#[test]
fn a_hostile_fixed_cost_cannot_make_an_estimate_negative_or_nan() {
    let c = cluster(DISCOVERING);
    let at = Instant::now();
    let estimate = |tokens: f64| c.view("llama", at, tokens).expect("served").ttft_ms;
    c.apply_heartbeat(&heartbeat(165.0, Some(-500.0)), Duration::ZERO, at);
    assert!((estimate(7.0) - 165.0 * 7.0 / 512.0).abs() < 1e-9);
    assert!((estimate(4096.0) - 165.0 * 8.0).abs() < 1e-9);
    assert!((prompt_scale(7.0, Some(100.0), Some(f64::NAN)) - 7.0 / 512.0).abs() < 1e-12);
    assert!((prompt_scale(7.0, Some(100.0), Some(f64::INFINITY)) - 7.0 / 512.0).abs() < 1e-12);
    let good = r#"{"schema":"infergate.heartbeat/v1","instance":"i","generation":1,"timestampMs":1,
        "models":[{"name":"llama","pods":1,"readyPods":1,"saturation":0.0,"queue":0,
        "running":0,"inflight":0,"estimatedTtftMs":165.0,"prefillMs":165.0,
        "fixedCostMs":35.0,"drainMs":0.0}]}"#;
    assert!(serde_json::from_str::<Heartbeat>(good).is_ok());
    let doc = r#"{"schema":"infergate.heartbeat/v1","instance":"i","generation":1,"timestampMs":1,
        "models":[{"name":"llama","pods":1,"readyPods":1,"saturation":0.0,"queue":0,
        "running":0,"inflight":0,"estimatedTtftMs":165.0,"prefillMs":165.0,
        "fixedCostMs":"soon","drainMs":0.0}]}"#;
    assert!(serde_json::from_str::<Heartbeat>(doc).is_err());
}

/// A heartbeat for `llama` on an emulated A10G (165 ms for a typical request's own prefill, 35 ms
/// of it fixed) behind a queue the gateway counts as `queued` typical requests, `wait` ms in real
/// terms (the field left out with `None`, as a gateway before it leaves it out).
fn queued(queued: u32, wait: Option<f64>) -> Heartbeat {
    let estimate = 165.0 * f64::from(queued + 1);
    let wait = wait.map_or(String::new(), |w| format!(r#","waitMs":{w}"#));
    serde_json::from_str(&format!(
        r#"{{"schema":"infergate.heartbeat/v1","instance":"i","generation":1,"timestampMs":1,
        "models":[{{"name":"llama","pods":1,"readyPods":1,"saturation":0.0,"queue":{queued},
        "running":0,"inflight":0,"estimatedTtftMs":{estimate},"prefillMs":165.0,
        "fixedCostMs":35.0{wait},"drainMs":0.0}}]}}"#
    ))
    .expect("a heartbeat document")
}

/// A mixed workload: the heartbeat's queue of four is four 50-token prompts (each its fixed
/// 35 ms and 50 tokens at 130 ms per 512: 190.8 ms in all), or four 4,000-token ones
/// (4,202.5 ms). With `waitMs` only the request's own prefill grows with its prompt. Before,
/// the whole typical estimate (five typical requests: 825 ms) was scaled: a 4,096-token prompt
/// behind the short ones was estimated at 5,375 ms (it takes 1,266), a 20-token one behind the
/// long ones at 200 ms (it takes 4,243).
#[test]
fn only_the_requests_own_prefill_grows_with_its_prompt() {
    let c = Arc::new(cluster(DISCOVERING));
    let at = Instant::now();
    let estimate = |tokens: f64| c.view("llama", at, tokens).expect("served").ttft_ms;
    let own = |tokens: f64| 35.0 + 130.0 * tokens / 512.0;
    let short_queue = 4.0 * own(50.0);
    c.apply_heartbeat(&queued(4, Some(short_queue)), Duration::ZERO, at);
    assert!((estimate(4096.0) - (short_queue + own(4096.0))).abs() < 1e-9);
    assert!((estimate(20.0) - (short_queue + own(20.0))).abs() < 1e-9);
    let long_queue = 4.0 * own(4_000.0);
    c.apply_heartbeat(&queued(4, Some(long_queue)), Duration::ZERO, at);
    assert!((estimate(20.0) - (long_queue + own(20.0))).abs() < 1e-9);
    assert!(estimate(20.0) > 4_000.0, "{}", estimate(20.0));
    // The requests sent since count at their own prompts: a 4,000-token one and a 20-token one
    // ahead add their own prefills, not two of this request's.
    let sent = [c.pending("llama", 4_000), c.pending("llama", 20)];
    let ahead = own(4_000.0) + own(20.0);
    assert!((estimate(20.0) - (long_queue + ahead + own(20.0))).abs() < 1e-9);
    drop(sent);
    assert!((estimate(20.0) - (long_queue + own(20.0))).abs() < 1e-9);
    // The same queue from a gateway without the field: the whole estimate scaled, as before,
    // pending requests at this request's prompt.
    c.apply_heartbeat(&queued(4, None), Duration::ZERO, at);
    let scale = |tokens: f64| own(tokens) / 165.0;
    assert!((estimate(20.0) - 825.0 * scale(20.0)).abs() < 1e-9);
    let sent = [c.pending("llama", 4_000), c.pending("llama", 20)];
    assert!((estimate(20.0) - (825.0 + 2.0 * 165.0) * scale(20.0)).abs() < 1e-9);
    drop(sent);
}

/// `waitMs` is another process's word: a negative one is ignored (the estimate is made as
/// without it), a huge one gives a huge but finite estimate, and a document whose value is not
/// a number is refused whole.
#[test]
fn a_hostile_wait_is_ignored_or_bounded() {
    let c = cluster(DISCOVERING);
    let at = Instant::now();
    let estimate = |tokens: f64| c.view("llama", at, tokens).expect("served").ttft_ms;
    c.apply_heartbeat(&queued(4, Some(-1e9)), Duration::ZERO, at);
    assert!((estimate(20.0) - 825.0 * (35.0 + 130.0 * 20.0 / 512.0) / 165.0).abs() < 1e-9);
    c.apply_heartbeat(&queued(4, Some(1e300)), Duration::ZERO, at);
    let huge = estimate(20.0);
    assert!(huge.is_finite() && huge >= 1e300, "{huge}");
    let doc = r#"{"schema":"infergate.heartbeat/v1","instance":"i","generation":1,"timestampMs":1,
        "models":[{"name":"llama","pods":1,"readyPods":1,"saturation":0.0,"queue":0,
        "running":0,"inflight":0,"estimatedTtftMs":165.0,"prefillMs":165.0,
        "waitMs":"soon","drainMs":0.0}]}"#;
    assert!(serde_json::from_str::<Heartbeat>(doc).is_err());
    // No ready pod: no wait kept, whatever the document says.
    let none = r#"{"schema":"infergate.heartbeat/v1","instance":"i","generation":1,"timestampMs":1,
        "models":[{"name":"llama","pods":1,"readyPods":0,"saturation":1.0,"queue":0,
        "running":0,"inflight":0,"waitMs":5.0,"drainMs":0.0}]}"#;
    c.apply_heartbeat(
        &serde_json::from_str(none).expect("a document"),
        Duration::ZERO,
        at,
    );
    assert_eq!(
        lock(&c.state).models.get("llama").map(|m| m.wait_ms),
        Some(None)
    );
}

/// Three clusters up for `llama` (the third also alone serving `solo`), with
/// `outlierDetection` as given.
fn fleet(outlier: &str) -> (Vec<Arc<Cluster>>, Telemetry) {
    let mut yaml = format!("auth: none\noutlierDetection: {outlier}\nclusters:\n");
    for (name, models) in [("a", "[llama]"), ("b", "[llama]"), ("c", "[llama, solo]")] {
        yaml.push_str(&format!(
            "  - {{ name: {name}, url: 'http://127.0.0.1:1', region: r, cost: {{ inputPerMillion: 1 }}, models: {models} }}\n"
        ));
    }
    let config = GlobalConfig::from_yaml(&yaml).expect("valid configuration");
    let telemetry = Telemetry::register(&mut prometheus_client::registry::Registry::default());
    let clusters: Vec<Arc<Cluster>> = (0..3)
        .map(|i| {
            let c = Arc::new(
                Cluster::load(
                    &config,
                    i,
                    &mut crate::connect::SystemRoots::new(),
                    &telemetry,
                )
                .expect("no files to read"),
            );
            let models = c.served();
            c.apply_models_as_heartbeat(&models, Duration::from_millis(1), now());
            c.tick(now(), &telemetry);
            c
        })
        .collect();
    (clusters, telemetry)
}

#[test]
fn an_ejected_cluster_has_no_share_until_its_time_is_up_then_ramps() {
    let (clusters, telemetry) = fleet("{ baseEjectionMs: 60000 }");
    let deciding = Mutex::new(());
    let at = now();
    assert!(clusters[0].heartbeat_up());
    assert_eq!(clusters[0].weight("llama", at), 1.0);
    eject(&clusters, 0, Trigger::Consecutive, &deciding, &telemetry);
    assert_eq!(clusters[0].weight("llama", at), 0.0);
    assert_eq!(clusters[1].weight("llama", at), 1.0);
    // Still a candidate (a last resort), not dropped.
    assert!(clusters[0].view("llama", at, 1.0).is_some());
    // Its heartbeat good all along; readmitted through the slow-start ramp (30 s by default).
    let beat = |t: Instant| {
        clusters[0].apply_models_as_heartbeat(&["llama".into()], Duration::from_millis(1), t)
    };
    let after = at + Duration::from_secs(61);
    beat(after - Duration::from_secs(1));
    assert_eq!(
        clusters[0].weight("llama", after - Duration::from_secs(1)),
        0.0
    );
    let w = clusters[0].weight("llama", after);
    assert!(w > 0.0 && w < 0.1, "{w}");
    beat(after + Duration::from_secs(30));
    assert_eq!(
        clusters[0].weight("llama", after + Duration::from_secs(30)),
        1.0
    );
}

/// An ejection takes the cluster out of `infergate_global_model_clusters` at once, for each of
/// its models; the first tick after it ends (its heartbeat good) counts it again.
#[test]
fn an_ejected_cluster_leaves_its_models_counts_until_readmitted() {
    let (clusters, telemetry) = fleet("{ baseEjectionMs: 60000, maxEjectionPercent: 100 }");
    for c in &clusters {
        c.join_model_clusters(&telemetry);
    }
    let counts = || {
        (
            telemetry.model_clusters.count("llama"),
            telemetry.model_clusters.count("solo"),
        )
    };
    assert_eq!(counts(), (Some(3), Some(1)));
    let at = now();
    eject(
        &clusters,
        2,
        Trigger::Consecutive,
        &Mutex::new(()),
        &telemetry,
    );
    assert_eq!(counts(), (Some(2), Some(0)));
    let after = at + Duration::from_secs(61);
    clusters[2].apply_models_as_heartbeat(
        &["llama".into(), "solo".into()],
        Duration::from_millis(1),
        after,
    );
    clusters[2].tick(after, &telemetry);
    assert_eq!(counts(), (Some(3), Some(1)));
}

#[test]
fn the_percent_of_a_models_clusters_ejected_is_held() {
    let (clusters, telemetry) = fleet("{ maxEjectionPercent: 50 }");
    let deciding = Mutex::new(());
    let at = now();
    eject(&clusters, 0, Trigger::Consecutive, &deciding, &telemetry);
    // A second of llama's three would be 67%: held back.
    eject(&clusters, 1, Trigger::Consecutive, &deciding, &telemetry);
    eject(&clusters, 2, Trigger::Consecutive, &deciding, &telemetry);
    let ejected: Vec<bool> = clusters
        .iter()
        .map(|c| c.weight("llama", at) == 0.0)
        .collect();
    assert_eq!(ejected, [true, false, false]);
    let held = |i: usize| {
        telemetry
            .ejections_held_back
            .get_or_create(&clusters[i].label)
            .get()
    };
    assert_eq!((held(0), held(1), held(2)), (0, 1, 1));
    assert_eq!(
        telemetry.ejections.get_or_create(&clusters[0].label).get(),
        1
    );
    assert_eq!(telemetry.ejected.get_or_create(&clusters[0].label).get(), 1);
}

#[test]
fn every_cluster_may_go_at_100_percent_none_at_0() {
    let (clusters, telemetry) = fleet("{ maxEjectionPercent: 100 }");
    let deciding = Mutex::new(());
    for i in 0..3 {
        eject(&clusters, i, Trigger::Consecutive, &deciding, &telemetry);
    }
    assert!(clusters.iter().all(|c| c.weight("llama", now()) == 0.0));
    let (clusters, telemetry) = fleet("{ maxEjectionPercent: 0 }");
    for i in 0..3 {
        eject(&clusters, i, Trigger::Consecutive, &deciding, &telemetry);
    }
    assert!(clusters.iter().all(|c| c.weight("llama", now()) == 1.0));
}

#[test]
fn a_run_of_failures_trips_at_the_threshold_and_a_success_starts_it_again() {
    let (clusters, t) = fleet("{ consecutiveGatewayFailures: 3 }");
    let c = &clusters[0];
    assert_eq!(c.observe_gateway_failure(true, &t), None);
    assert_eq!(c.observe_gateway_failure(true, &t), None);
    assert_eq!(c.observe_success(true, &t), None);
    assert_eq!(c.observe_gateway_failure(true, &t), None);
    assert_eq!(c.observe_gateway_failure(true, &t), None);
    assert_eq!(
        c.observe_gateway_failure(true, &t),
        Some(Trigger::Consecutive)
    );
}

/// With `failurePercentage`, failures mixed with successes (never three in a row) eject once
/// an interval with enough requests closes at or over the threshold; its share is exported.
/// Without it, the same requests never do.
#[test]
fn half_the_requests_failing_trips_an_interval_not_a_run() {
    let mixed = |c: &Cluster, t: &Telemetry| {
        let mut due = Vec::new();
        for i in 0..40 {
            due.extend(if i % 2 == 0 {
                c.observe_gateway_failure(true, t)
            } else {
                c.observe_success(true, t)
            });
        }
        due
    };
    let (clusters, t) = fleet("{ consecutiveGatewayFailures: 3 }");
    assert!(mixed(&clusters[0], &t).is_empty());
    let (clusters, t) = fleet(
        "{ consecutiveGatewayFailures: 3, failurePercentage: { threshold: 50, minimumRequests: 10, intervalMs: 1 } }",
    );
    let c = &clusters[0];
    // The first interval began when the cluster was set up; let it end.
    std::thread::sleep(Duration::from_millis(2));
    // This failure closes an interval with nothing in it, then counts in the next.
    assert_eq!(c.observe_gateway_failure(true, &t), None);
    for i in 0..19 {
        let due = if i % 2 == 0 {
            c.observe_success(true, &t)
        } else {
            c.observe_gateway_failure(true, &t)
        };
        assert_eq!(due, None, "request {i}: the interval is not over");
    }
    std::thread::sleep(Duration::from_millis(2));
    // Requests of a last resort (not routed on) count in no interval, and close none.
    assert_eq!(c.observe_success(false, &t), None);
    let due = c.observe_success(true, &t);
    let Some(Trigger::FailurePercentage(interval)) = due else {
        panic!("{due:?}");
    };
    assert_eq!((interval.successes, interval.failures), (10, 10));
    let shown = t.failure_percent.get_or_create(&c.label).get();
    assert_eq!(shown, 50.0);
    // Ejected: its interval starts over, empty.
    eject(&clusters, 0, due.unwrap(), &Mutex::new(()), &t);
    assert!(c.ejected_at(now()));
    assert_eq!(c.window.record(Verdict::Neutral, 0, u64::MAX), None);
}

#[test]
fn failures_of_a_drained_or_ejected_cluster_start_no_run() {
    let (clusters, telemetry) = fleet("{ consecutiveGatewayFailures: 2 }");
    let c = &clusters[0];
    // Its heartbeat drained it: the heartbeat decides its return.
    for _ in 0..10 {
        assert_eq!(c.observe_gateway_failure(false, &telemetry), None);
    }
    assert_eq!(c.consecutive.get(), 0);
    assert_eq!(c.observe_gateway_failure(true, &telemetry), None);
    assert_eq!(
        c.observe_gateway_failure(true, &telemetry),
        Some(Trigger::Consecutive)
    );
    eject(
        &clusters,
        0,
        Trigger::Consecutive,
        &Mutex::new(()),
        &telemetry,
    );
    assert_eq!(c.consecutive.get(), 0);
    // Requests sent before the ejection, failing during it.
    for _ in 0..10 {
        assert_eq!(c.observe_gateway_failure(true, &telemetry), None);
    }
    assert_eq!(c.consecutive.get(), 0);
}

fn reloads(telemetry: &Telemetry, file: &'static str, result: &'static str) -> u64 {
    telemetry
        .credential_reloads
        .get_or_create(&crate::telemetry::ClusterFileResult {
            cluster: "a".into(),
            file,
            result,
        })
        .get()
}

/// A token file rewritten is swapped in at the next check; one made unusable keeps the last good
/// token, and is counted once however many checks find it so.
#[test]
fn a_changed_token_file_is_swapped_in_and_an_unusable_one_keeps_the_last() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let token = dir.path().join("token");
    std::fs::write(&token, "one\n").expect("write the token");
    let c = cluster(&format!(
        "auth: none\nclusters:\n  - {{ name: a, url: 'http://127.0.0.1:1', region: r, \
         cost: {{ inputPerMillion: 1 }}, models: [m], credentials: {{ bearerTokenFile: '{}' }} }}\n",
        token.display()
    ));
    let telemetry = Telemetry::register(&mut prometheus_client::registry::Registry::default());
    let sent = |c: &Cluster| c.token().map(|v| v.to_str().unwrap_or_default().to_owned());
    assert_eq!(sent(&c).as_deref(), Some("Bearer one"));
    c.check_files(&telemetry);
    assert_eq!(
        reloads(&telemetry, "token", "ok"),
        0,
        "an unchanged file is no reload"
    );

    std::fs::write(&token, "two").expect("write the token");
    c.check_files(&telemetry);
    assert_eq!(sent(&c).as_deref(), Some("Bearer two"));
    assert_eq!(reloads(&telemetry, "token", "ok"), 1);

    std::fs::write(&token, "  \n").expect("write the token");
    for _ in 0..3 {
        c.check_files(&telemetry);
    }
    assert_eq!(sent(&c).as_deref(), Some("Bearer two"));
    assert_eq!(reloads(&telemetry, "token", "error"), 1);
    assert_eq!(c.rotated_files(), ["token"]);
}

/// A CA bundle rewritten gives the cluster new clients (new pools); the same bundle, or one
/// without a certificate, keeps those in force.
#[test]
fn a_changed_ca_bundle_gives_new_clients() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (one, two) = (
        infergate_testkit::tls::TestCa::new("one"),
        infergate_testkit::tls::TestCa::new("two"),
    );
    let bundle = dir.path().join("ca.pem");
    std::fs::write(&bundle, one.cert_pem()).expect("write the bundle");
    let c = cluster(&format!(
        "auth: none\nclusters:\n  - {{ name: a, url: 'https://127.0.0.1:1', region: r, \
         cost: {{ inputPerMillion: 1 }}, models: [m], tls: {{ caFile: '{}' }} }}\n",
        bundle.display()
    ));
    let telemetry = Telemetry::register(&mut prometheus_client::registry::Registry::default());
    let first = c.clients();
    c.check_files(&telemetry);
    assert!(Arc::ptr_eq(&first, &c.clients()), "an unchanged bundle");

    std::fs::write(&bundle, two.cert_pem()).expect("write the bundle");
    c.check_files(&telemetry);
    let second = c.clients();
    assert!(!Arc::ptr_eq(&first, &second), "the bundle changed");
    assert_eq!(reloads(&telemetry, "ca", "ok"), 1);

    std::fs::write(&bundle, "no certificate\n").expect("write the bundle");
    c.check_files(&telemetry);
    assert!(
        Arc::ptr_eq(&second, &c.clients()),
        "a bundle without a certificate"
    );
    assert_eq!(reloads(&telemetry, "ca", "error"), 1);
    assert_eq!(c.rotated_files(), ["ca"]);
}

/// The cluster `name`, presenting the client certificate `cert` (its key in `key`).
fn presenting(name: &str, cert: &std::path::Path, key: &std::path::Path) -> Cluster {
    cluster(&format!(
        "auth: none\nclusters:\n  - {{ name: {name}, url: 'https://127.0.0.1:1', region: r, \
         cost: {{ inputPerMillion: 1 }}, models: [m], \
         tls: {{ certFile: '{}', keyFile: '{}' }} }}\n",
        cert.display(),
        key.display()
    ))
}

/// A client certificate rewritten (both files, or either) gives the cluster new clients; a
/// certificate whose key was not replaced keeps those in force, counted once however many checks
/// find it so.
#[test]
fn a_changed_client_certificate_gives_new_clients() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let ca = infergate_testkit::tls::TestCa::new("router");
    let (cert, key) = ca.issue(&["router"]).write(dir.path());
    let c = presenting("a", &cert, &key);
    let telemetry = Telemetry::register(&mut prometheus_client::registry::Registry::default());
    let first = c.clients();
    c.check_files(&telemetry);
    assert!(Arc::ptr_eq(&first, &c.clients()), "an unchanged pair");

    ca.issue(&["router"]).write(dir.path());
    c.check_files(&telemetry);
    let second = c.clients();
    assert!(!Arc::ptr_eq(&first, &second), "the pair changed");
    assert_eq!(reloads(&telemetry, "client_cert", "ok"), 1);

    std::fs::write(&cert, ca.issue(&["router"]).cert_pem).expect("write the certificate");
    for _ in 0..3 {
        c.check_files(&telemetry);
    }
    assert!(
        Arc::ptr_eq(&second, &c.clients()),
        "a certificate without its key"
    );
    assert_eq!(reloads(&telemetry, "client_cert", "error"), 1);
    assert_eq!(c.rotated_files(), ["client_cert"]);
}

/// The `infergate_global_cluster_tls_not_after_timestamp_seconds` lines of `registry`'s page.
fn tls_dates(registry: &prometheus_client::registry::Registry) -> Vec<String> {
    let mut page = String::new();
    prometheus_client::encoding::text::encode(&mut page, registry).expect("encoded");
    page.lines()
        .filter(|l| l.starts_with("infergate_global_cluster_tls_not_after_timestamp_seconds{"))
        .map(str::to_owned)
        .collect()
}

/// The dates of the files in force are exported for the files the cluster names only: a
/// rotated bundle's at its load, and a bundle that cannot be used keeps the last good one's;
/// its gauges go with the cluster.
#[test]
fn the_dates_of_the_tls_files_in_force_are_exported() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let ca = infergate_testkit::tls::TestCa::new("cluster CA");
    let bundle = dir.path().join("ca.pem");
    let issued = |year| ca.issue_valid(&["a"], (2020, 1, 1), (year, 1, 1)).cert_pem;
    std::fs::write(&bundle, format!("{}{}", issued(2040), issued(2030))).expect("write");
    let c = cluster(&format!(
        "auth: none\nclusters:\n  - {{ name: a, url: 'https://127.0.0.1:1', region: r, \
         cost: {{ inputPerMillion: 1 }}, models: [m], tls: {{ caFile: '{}' }} }}\n",
        bundle.display()
    ));
    let mut registry = prometheus_client::registry::Registry::default();
    let telemetry = Telemetry::register(&mut registry);
    assert!(tls_dates(&registry).is_empty());
    c.export_tls_expiry(&telemetry);
    let ca_date = |at: i64| {
        vec![format!(
            "infergate_global_cluster_tls_not_after_timestamp_seconds{{cluster=\"a\",file=\"ca\"}} {at}"
        )]
    };
    // 2030-01-01, the earlier of the two.
    assert_eq!(tls_dates(&registry), ca_date(1_893_456_000));

    std::fs::write(&bundle, issued(2040)).expect("write");
    c.check_files(&telemetry);
    assert_eq!(tls_dates(&registry), ca_date(2_208_988_800));
    std::fs::write(&bundle, "no certificate\n").expect("write");
    c.check_files(&telemetry);
    assert_eq!(reloads(&telemetry, "ca", "error"), 1);
    assert_eq!(tls_dates(&registry), ca_date(2_208_988_800));

    telemetry.forget_gauges(&c.label);
    assert!(tls_dates(&registry).is_empty());
}

/// A client certificate outside its validity is warned of when it is loaded: at start, and when
/// a rotated one is.
#[test]
fn an_expired_client_certificate_is_warned_of_at_start_and_rotation() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let ca = infergate_testkit::tls::TestCa::new("router");
    let expired = ca.issue_valid(&["router"], (2020, 1, 1), (2021, 1, 1));
    let (cert, key) = expired.write(dir.path());
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    const WARNING: &str =
        "WARN infergate_global::expiry: the cluster's client certificate (tls.certFile) expired";
    let warnings = || out.text().matches(WARNING).count();
    let c = presenting("east", &cert, &key);
    let text = out.text();
    let start: Vec<&str> = text.lines().filter(|l| l.contains(WARNING)).collect();
    assert_eq!(start.len(), 1, "{text}");
    assert!(
        start[0].contains("cluster=\"east\"")
            && start[0].contains(&format!("cert={}", cert.display())),
        "{}",
        start[0]
    );

    let telemetry = Telemetry::register(&mut prometheus_client::registry::Registry::default());
    ca.issue(&["router"]).write(dir.path());
    c.check_files(&telemetry);
    assert_eq!(warnings(), 1, "a valid certificate: {}", out.text());
    expired.write(dir.path());
    c.check_files(&telemetry);
    assert_eq!(warnings(), 2, "{}", out.text());
}

/// A heartbeat for `llama` and `mistral`, each idle on one emulated A10G pod (165 ms for a
/// typical request's own prefill, 35 ms of it fixed, nothing to wait for).
fn two_models() -> Heartbeat {
    let model = |name: &str| {
        format!(
            r#"{{"name":"{name}","pods":1,"readyPods":1,"saturation":0.0,"queue":0,"running":0,
            "inflight":0,"estimatedTtftMs":165.0,"prefillMs":165.0,"fixedCostMs":35.0,
            "waitMs":0.0,"drainMs":0.0}}"#
        )
    };
    serde_json::from_str(&format!(
        r#"{{"schema":"infergate.heartbeat/v1","instance":"i","generation":1,"timestampMs":1,
        "models":[{},{}]}}"#,
        model("llama"),
        model("mistral")
    ))
    .expect("a heartbeat document")
}

/// The requests sent to a cluster since its heartbeat wait their turn on their own model's pods
/// only: two 4,000-token prompts for `llama` add their prefills to `llama`'s estimate and
/// nothing to `mistral`'s. Before, they were counted per cluster: a 20-token prompt for the idle
/// `mistral` was estimated at 2,141 ms, not 40 ms.
#[test]
fn pending_requests_count_against_their_own_model_only() {
    let c = Arc::new(cluster(DISCOVERING));
    let at = Instant::now();
    let estimate = |model: &str| c.view(model, at, 20.0).expect("served").ttft_ms;
    let own = |tokens: f64| 35.0 + 130.0 * tokens / 512.0;
    c.apply_heartbeat(&two_models(), Duration::ZERO, at);
    assert!((estimate("mistral") - own(20.0)).abs() < 1e-9);
    let sent = [c.pending("llama", 4_000), c.pending("llama", 4_000)];
    let ahead = 2.0 * own(4_000.0);
    assert!(
        (estimate("llama") - (ahead + own(20.0))).abs() < 1e-9,
        "{}",
        estimate("llama")
    );
    assert!(
        (estimate("mistral") - own(20.0)).abs() < 1e-9,
        "{}",
        estimate("mistral")
    );
    drop(sent);
    assert!((estimate("llama") - own(20.0)).abs() < 1e-9);
    // A model the cluster was never said to serve has no slot: counted in no estimate.
    let stray = c.pending("other", 4_000);
    assert!((estimate("llama") - own(20.0)).abs() < 1e-9);
    assert!((estimate("mistral") - own(20.0)).abs() < 1e-9);
    drop(stray);
}

/// [`two_models`] from a gateway that names `llama`'s LoRA adapters `sql` and `chat`: the three
/// are served by `llama`'s pod.
fn with_adapters() -> Heartbeat {
    let mut hb = two_models();
    for m in &mut hb.models {
        if m.name == "llama" {
            m.adapters = vec!["sql".into(), "chat".into()];
        }
    }
    hb
}

/// A LoRA adapter and its base model are served by the same pods, so the requests sent for one
/// wait behind those sent for the other: two 4,000-token prompts for the adapter `sql` put a
/// 20-token prompt for `llama` (or for its other adapter `chat`) at 2,141 ms, not 40 ms, and a
/// 4,000-token prompt for `llama` puts one for `sql` at 1,091 ms; `mistral`, on its own pod,
/// stays at 40 ms. Before, each name counted its own requests only (`llama` stayed at 40 ms
/// behind the adapter's 8,000 tokens), and an adapter had none of its base model's figures (the
/// least estimate of any model, scaled in proportion: 6 ms).
#[test]
fn an_adapters_pending_requests_count_against_its_base_model_and_back() {
    let c = Arc::new(cluster(DISCOVERING));
    let at = Instant::now();
    let estimate = |model: &str| c.view(model, at, 20.0).expect("served").ttft_ms;
    let own = |tokens: f64| 35.0 + 130.0 * tokens / 512.0;
    let near = |model: &str, expected: f64| {
        let got = estimate(model);
        assert!(
            (got - expected).abs() < 1e-9,
            "{model}: {got} ms, not {expected} ms"
        );
    };
    c.set_served(
        ["llama", "sql", "chat", "mistral"]
            .map(String::from)
            .to_vec(),
    );
    c.apply_heartbeat(&with_adapters(), Duration::ZERO, at);
    for model in ["llama", "sql", "chat", "mistral"] {
        near(model, own(20.0));
    }
    let sent = [c.pending("sql", 4_000), c.pending("sql", 4_000)];
    for model in ["llama", "sql", "chat"] {
        near(model, 2.0 * own(4_000.0) + own(20.0));
    }
    near("mistral", own(20.0));
    drop(sent);
    let base = c.pending("llama", 4_000);
    near("sql", own(4_000.0) + own(20.0));
    near("mistral", own(20.0));
    drop(base);
    for model in ["llama", "sql", "chat", "mistral"] {
        near(model, own(20.0));
    }
}

/// A heartbeat without `adapters` (a gateway before the field, or one whose model has none)
/// says nothing of which names share pods: each counts its own requests, as before the field.
/// And a document naming an adapter of two models, or a model as another's adapter (which no
/// gateway renders), keeps the first word on it: no name is counted twice.
#[test]
fn without_adapters_each_name_counts_its_own_pending_requests() {
    let c = Arc::new(cluster(DISCOVERING));
    let at = Instant::now();
    let estimate = |model: &str| c.view(model, at, 20.0).expect("served").ttft_ms;
    let own = |tokens: f64| 35.0 + 130.0 * tokens / 512.0;
    c.set_served(["llama", "sql", "mistral"].map(String::from).to_vec());
    c.apply_heartbeat(&two_models(), Duration::ZERO, at);
    let sent = c.pending("sql", 4_000);
    assert!((estimate("llama") - own(20.0)).abs() < 1e-9);
    drop(sent);
    // Adapters named once more: the same cluster groups them from the next heartbeat on.
    c.apply_heartbeat(&with_adapters(), Duration::ZERO, at);
    let sent = c.pending("sql", 4_000);
    assert!((estimate("llama") - (own(4_000.0) + own(20.0))).abs() < 1e-9);
    drop(sent);
    // `sql` claimed by `mistral` too, and `mistral` by `llama`: each stays where it was first.
    let mut hostile = with_adapters();
    hostile.models[0].adapters.push("mistral".into());
    hostile.models[1].adapters = vec!["sql".into(), "llama".into()];
    c.apply_heartbeat(&hostile, Duration::ZERO, at);
    let sent = c.pending("sql", 4_000);
    assert!((estimate("llama") - (own(4_000.0) + own(20.0))).abs() < 1e-9);
    assert!((estimate("mistral") - own(20.0)).abs() < 1e-9);
    drop(sent);
    let sent = c.pending("mistral", 4_000);
    assert!((estimate("llama") - own(20.0)).abs() < 1e-9);
    assert!((estimate("mistral") - (own(4_000.0) + own(20.0))).abs() < 1e-9);
    drop(sent);
}
