//! Passive outlier detection (`outlierDetection:`) on 127.0.0.1, with real HTTP servers as the
//! clusters: a real infergate gateway whose only pod answers 503 to inference while its metrics
//! (and so the gateway's heartbeat) stay good, and scripted model servers behind a good
//! heartbeat. What is measured is how many requests reach the failing cluster, and when
//! (`cargo test -p infergate-global --test outlier -- --nocapture` prints it).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a failed unwrap is a failed test; the tests print what they measured"
)]

#[path = "common/clusters.rs"]
mod clusters;
#[path = "common/scripted.rs"]
mod scripted;

use std::net::SocketAddr;
use std::time::Duration;

use clusters::counter;
use infergate_global::{GlobalConfig, Router};
use infergate_testkit::Response;
use scripted::{Scripted, heartbeat};
use tokio::sync::oneshot;
use tokio::time::Instant;

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// The router's entry for a cluster answering on `url` with its heartbeat on `beat`; the
/// cheaper cluster comes first.
fn entry(name: &str, url: SocketAddr, beat: SocketAddr, cost: f64) -> String {
    format!(
        "  - {{ name: {name}, url: 'http://{url}', heartbeatUrl: 'http://{beat}/heartbeat', region: r, models: [m], cost: {{ inputPerMillion: {cost} }} }}\n"
    )
}

/// The router over `clusters` (entries) with `outlierDetection: {outlier}`, once every cluster
/// is up by its heartbeat. Heartbeats every 100 ms; no slow start unless `slow_start_ms`.
async fn start(
    outlier: &str,
    slow_start_ms: u64,
    clusters: &[String],
) -> (Router, oneshot::Sender<()>) {
    let yaml = format!(
        "auth: none\nheartbeat: {{ intervalMs: 100, staleAfterMs: 2000, slowStartMs: {slow_start_ms} }}\noutlierDetection: {outlier}\nclusters:\n{}",
        clusters.concat()
    );
    let (router, stop) = clusters::router_with(&yaml).await;
    let names: Vec<String> = config_names(&yaml);
    let admin = router.admin_addr().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let page = metrics(admin).await;
        let up = names.iter().all(|n| {
            counter(
                &page,
                &format!("infergate_global_cluster_weight{{cluster=\"{n}\"}}"),
            ) == 1.0
        });
        if up {
            break;
        }
        assert!(Instant::now() < deadline, "clusters never up:\n{page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (router, stop)
}

fn config_names(yaml: &str) -> Vec<String> {
    GlobalConfig::from_yaml(yaml)
        .unwrap()
        .clusters
        .into_iter()
        .map(|c| c.name)
        .collect()
}

async fn metrics(admin: SocketAddr) -> String {
    infergate_testkit::get(admin, "/metrics").await.text()
}

/// A series' value for `cluster` on the router's page.
async fn series(router: &Router, name: &str, cluster: &str) -> f64 {
    let page = metrics(router.admin_addr().unwrap()).await;
    counter(&page, &format!("{name}{{cluster=\"{cluster}\"}}"))
}

async fn chat(router: &Router) -> Response {
    chat_at(router.http_addr()).await
}

async fn chat_at(addr: SocketAddr) -> Response {
    infergate_testkit::post(addr, "/v1/chat/completions", "application/json", CHAT).await
}

/// A request answered 200 by `cluster`.
async fn served_by(router: &Router, cluster: &str) {
    let r = chat(router).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-infergate-cluster"), Some(cluster));
}

/// Sends a request every 20 ms until `pod` has been reached `hits` times: the time of the
/// answer that did it, and the requests sent.
async fn until_hits(router: &Router, pod: &Scripted, hits: usize) -> (Instant, usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sent = 0;
    loop {
        let r = chat(router).await;
        sent += 1;
        assert_eq!(r.status, 200, "{}", r.text());
        if pod.hits() >= hits {
            return (Instant::now(), sent);
        }
        assert!(Instant::now() < deadline, "never reached again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The defect: a cluster whose gateway answers 503 to every request while its heartbeat stays
/// good (its pod's metrics are fine) was tried first by every request, each paying a round
/// trip there before failing over. It is now ejected after `consecutiveGatewayFailures` (3
/// here), stays out for `baseEjectionMs` (1 s), is readmitted, ejected again for twice as long
/// when it fails again at once, and takes its traffic back once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_answering_503_with_a_good_heartbeat_is_ejected_then_readmitted() {
    let pod = Scripted::start(503).await;
    let (gw, gw_stop) = clusters::ready_gateway(&format!(
        "auth: none\nscrape: {{ intervalMs: 20 }}\nmodels:\n  - name: m\n    scheduler: {{ preset: infergate }}\n    endpoints: [{}]\n",
        pod.addr
    ))
    .await;
    let good = Scripted::start(200).await;
    let beat = heartbeat().await;
    let (router, _stop) = start(
        "{ consecutiveGatewayFailures: 3, baseEjectionMs: 1000, maxEjectionMs: 10000 }",
        0,
        &[
            entry("bad", gw.http_addr(), gw.admin_addr().unwrap(), 0.1),
            entry("good", good.addr, beat, 1.0),
        ],
    )
    .await;
    let heartbeat = infergate_testkit::get(gw.admin_addr().unwrap(), "/heartbeat").await;
    assert!(
        heartbeat.text().contains(r#""readyPods":1"#),
        "{}",
        heartbeat.text()
    );

    // Three requests: each tried on the cheaper `bad` first (its gateway's 503), then `good`.
    let mut third_sent = Instant::now();
    for i in 0..3 {
        third_sent = Instant::now();
        served_by(&router, "good").await;
        assert_eq!(pod.hits(), i + 1);
    }
    let ejections = "infergate_global_cluster_ejections_total";
    let ejected = "infergate_global_cluster_ejected";
    assert_eq!(series(&router, ejections, "bad").await, 1.0);
    assert_eq!(series(&router, ejected, "bad").await, 1.0);
    assert_eq!(series(&router, ejected, "good").await, 0.0);
    // Ejected: the next requests go to `good` at once, its heartbeat good all the while.
    for _ in 0..10 {
        served_by(&router, "good").await;
    }
    assert_eq!(pod.hits(), 3, "an ejected cluster was tried first");
    let heartbeat = infergate_testkit::get(gw.admin_addr().unwrap(), "/heartbeat").await;
    assert!(
        heartbeat.text().contains(r#""readyPods":1"#),
        "{}",
        heartbeat.text()
    );

    // Readmitted after baseEjectionMs (no slow start here): tried first again.
    let (back, waited) = until_hits(&router, &pod, 4).await;
    let first = back - third_sent;
    println!(
        "first ejection: readmitted {:.3} s after the request that ejected it was sent",
        first.as_secs_f64()
    );
    assert!(first >= Duration::from_millis(1000), "{first:?}");
    assert!(first < Duration::from_millis(3000), "{first:?}");

    // Failing again at once (the readmitted request was one): ejected for 2 × 1 s.
    let second_sent = Instant::now();
    served_by(&router, "good").await;
    served_by(&router, "good").await;
    assert_eq!(pod.hits(), 6);
    assert_eq!(series(&router, ejections, "bad").await, 2.0);
    // Its pod recovers during the ejection: still ejected until the time is up.
    pod.set(200);
    served_by(&router, "good").await;
    assert_eq!(pod.hits(), 6);
    let (back, _) = until_hits(&router, &pod, 7).await;
    let second = back - second_sent;
    println!(
        "second ejection in a row: readmitted {:.3} s after the first of the two failures that ejected it was sent",
        second.as_secs_f64()
    );
    assert!(second >= Duration::from_millis(2000), "{second:?}");
    assert!(second < Duration::from_millis(4000), "{second:?}");
    for _ in 0..5 {
        served_by(&router, "bad").await;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while series(&router, ejected, "bad").await != 0.0 {
        assert!(Instant::now() < deadline, "still shown ejected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "requests reaching the failing cluster: 6 of the {} sent while it failed (3 + 10 + {waited} + 2)",
        3 + 10 + waited + 2
    );
    let _ = gw_stop.send(());
}

/// A plain 500 (or another 5xx that is not a gateway's), a 4xx and a 429 are the request's
/// problem or overload, not evidence against the cluster: however many in a row, the cluster is
/// not ejected and stays first. A 503 run broken by a 2xx starts again.
#[tokio::test]
async fn a_500_a_4xx_or_a_429_does_not_eject() {
    let good = Scripted::start(200).await;
    let beat = heartbeat().await;
    for status in [500, 501, 400, 404, 429] {
        let other = Scripted::start(status).await;
        let (router, _stop) = start(
            "{ consecutiveGatewayFailures: 3, baseEjectionMs: 60000 }",
            0,
            &[
                entry("other", other.addr, beat, 0.1),
                entry("good", good.addr, beat, 1.0),
            ],
        )
        .await;
        for i in 0..10 {
            let r = chat(&router).await;
            // A 5xx or a 429 moves on to `good`; a 4xx is the client's answer.
            let want = if status >= 500 || status == 429 {
                200
            } else {
                status
            };
            assert_eq!(r.status, want, "{status}: {}", r.text());
            assert_eq!(other.hits(), i + 1, "{status}: not tried first");
        }
        let ejections = "infergate_global_cluster_ejections_total";
        assert_eq!(series(&router, ejections, "other").await, 0.0, "{status}");
        assert_eq!(
            series(&router, "infergate_global_cluster_ejected", "other").await,
            0.0,
            "{status}"
        );
    }

    // 503, 503, 200, 503, 503: never three in a row.
    let flaky = Scripted::start(503).await;
    let (router, _stop) = start(
        "{ consecutiveGatewayFailures: 3, baseEjectionMs: 60000 }",
        0,
        &[
            entry("flaky", flaky.addr, beat, 0.1),
            entry("good", good.addr, beat, 1.0),
        ],
    )
    .await;
    for status in [503, 503, 200, 503, 503, 200, 503, 503] {
        flaky.set(status);
        chat(&router).await;
    }
    assert_eq!(flaky.hits(), 8);
    let ejections = "infergate_global_cluster_ejections_total";
    assert_eq!(series(&router, ejections, "flaky").await, 0.0);
    // A 500 between 503s neither counts nor starts the run again: the two 503s that ended the
    // sequence above, a 500, then one more 503 make three.
    flaky.set(500);
    chat(&router).await;
    assert_eq!(series(&router, ejections, "flaky").await, 0.0);
    flaky.set(503);
    chat(&router).await;
    assert_eq!(series(&router, ejections, "flaky").await, 1.0);
    assert_eq!(flaky.hits(), 10);
}

/// A cluster whose gateway is full itself — every in-flight slot taken, so it answers 503
/// `gateway_busy` with `x-infergate-overloaded` — is busy, not broken: each request fails over
/// to the next cluster, the busy one is not ejected however many in a row, and it is tried
/// first again, and serves, as soon as a slot frees. (Ejecting busy clusters in turn would
/// move an overload around a region instead of serving it.)
#[tokio::test]
async fn a_gateway_full_itself_is_failed_over_not_ejected() {
    let pod = Scripted::start(200).await;
    let (gw, gw_stop) = clusters::ready_gateway(&format!(
        "auth: none\nlimits: {{ maxRequestsInFlight: 1 }}\nscrape: {{ intervalMs: 20 }}\nmodels:\n  - name: m\n    scheduler: {{ preset: infergate }}\n    endpoints: [{}]\n",
        pod.addr
    ))
    .await;
    // The gateway's one slot, held by a request whose body is still coming.
    let slow = infergate_testkit::hold_request_slot(gw.http_addr()).await;
    let direct = chat_at(gw.http_addr()).await;
    assert_eq!(direct.status, 503, "{}", direct.text());
    assert_eq!(
        direct.header(infergate_openai::OVERLOADED_HEADER),
        Some("gateway_busy")
    );

    let good = Scripted::start(200).await;
    let beat = heartbeat().await;
    let (router, _stop) = start(
        "{ consecutiveGatewayFailures: 3, baseEjectionMs: 60000 }",
        0,
        &[
            entry("busy", gw.http_addr(), gw.admin_addr().unwrap(), 0.1),
            entry("good", good.addr, beat, 1.0),
        ],
    )
    .await;
    let good_before = good.hits();
    for _ in 0..8 {
        served_by(&router, "good").await;
    }
    assert_eq!(good.hits() - good_before, 8);
    assert_eq!(pod.hits(), 0, "the busy gateway dispatched nothing");
    let ejections = "infergate_global_cluster_ejections_total";
    assert_eq!(series(&router, ejections, "busy").await, 0.0);
    assert_eq!(
        series(&router, "infergate_global_cluster_ejected", "busy").await,
        0.0
    );
    // A slot frees: the cheaper cluster is first again, and serves.
    drop(slow);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = chat(&router).await;
        assert_eq!(r.status, 200, "{}", r.text());
        if r.header("x-infergate-cluster") == Some("busy") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the busy cluster never served again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(pod.hits() >= 1);
    let _ = gw_stop.send(());
}

/// With two of three clusters failing and `maxEjectionPercent: 50`, only one is ejected (a
/// second would be 67% of the model's clusters): the other stays in, failing, and its ejection
/// is counted as held back.
#[tokio::test]
async fn no_more_than_max_ejection_percent_of_a_models_clusters_are_ejected() {
    let beat = heartbeat().await;
    let bad_1 = Scripted::start(503).await;
    let bad_2 = Scripted::start(502).await;
    let good = Scripted::start(200).await;
    let (router, _stop) = start(
        "{ consecutiveGatewayFailures: 3, baseEjectionMs: 60000, maxEjectionMs: 60000, maxEjectionPercent: 50 }",
        0,
        &[
            entry("bad-1", bad_1.addr, beat, 0.1),
            entry("bad-2", bad_2.addr, beat, 0.2),
            entry("good", good.addr, beat, 1.0),
        ],
    )
    .await;
    for _ in 0..12 {
        served_by(&router, "good").await;
    }
    let ejected = "infergate_global_cluster_ejected";
    let ejections = "infergate_global_cluster_ejections_total";
    let held = "infergate_global_cluster_ejections_held_back_total";
    // bad-1 reached three first and was ejected; bad-2's ejection was due at 3, 6, 9 and 12.
    assert_eq!(series(&router, ejected, "bad-1").await, 1.0);
    assert_eq!(series(&router, ejected, "bad-2").await, 0.0);
    assert_eq!(series(&router, ejections, "bad-1").await, 1.0);
    assert_eq!(series(&router, ejections, "bad-2").await, 0.0);
    assert_eq!(series(&router, held, "bad-2").await, 4.0);
    assert_eq!((bad_1.hits(), bad_2.hits()), (3, 12));
    println!(
        "max ejection percent 50, 2 of 3 clusters failing: bad-1 reached by {} of 12 requests (ejected), bad-2 by {} (held back {} times)",
        bad_1.hits(),
        bad_2.hits(),
        series(&router, held, "bad-2").await
    );

    // At 100% both go, and the answers come from `good` without a detour.
    let bad_1 = Scripted::start(503).await;
    let bad_2 = Scripted::start(502).await;
    let (router, _stop) = start(
        "{ consecutiveGatewayFailures: 3, baseEjectionMs: 60000, maxEjectionPercent: 100 }",
        0,
        &[
            entry("bad-1", bad_1.addr, beat, 0.1),
            entry("bad-2", bad_2.addr, beat, 0.2),
            entry("good", good.addr, beat, 1.0),
        ],
    )
    .await;
    for _ in 0..12 {
        served_by(&router, "good").await;
    }
    assert_eq!((bad_1.hits(), bad_2.hits()), (3, 3));
}

/// Every cluster of the model ejected (`maxEjectionPercent: 100`): requests are still served,
/// by the ejected clusters in their usual order, as when every cluster is drained.
#[tokio::test]
async fn with_every_cluster_ejected_requests_are_still_served() {
    let beat = heartbeat().await;
    let a = Scripted::start(503).await;
    let b = Scripted::start(504).await;
    let (router, _stop) = start(
        "{ consecutiveGatewayFailures: 2, baseEjectionMs: 60000, maxEjectionPercent: 100 }",
        0,
        &[entry("a", a.addr, beat, 0.1), entry("b", b.addr, beat, 1.0)],
    )
    .await;
    // Each request tries a, then b, whose 504 is the answer.
    for _ in 0..2 {
        let r = chat(&router).await;
        assert_eq!(r.status, 504, "{}", r.text());
    }
    let ejected = "infergate_global_cluster_ejected";
    assert_eq!(series(&router, ejected, "a").await, 1.0);
    assert_eq!(series(&router, ejected, "b").await, 1.0);
    // Both recover while ejected: the requests are served, first by the cheaper one.
    a.set(200);
    b.set(200);
    for _ in 0..3 {
        served_by(&router, "a").await;
    }
    let page = metrics(router.admin_addr().unwrap()).await;
    assert_eq!(
        counter(
            &page,
            r#"infergate_global_decisions_total{cluster="a",reason="last_resort"}"#
        ),
        3.0,
        "{page}"
    );
    // Still failing, too: the last one's answer passes through.
    a.set(503);
    b.set(503);
    let r = chat(&router).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!((a.hits(), b.hits()), (6, 3));
}

/// Readmitted through the slow-start ramp: when the ejection ends, the cluster's share starts
/// at 5% and grows over `heartbeat.slowStartMs`, as a cluster back from a drain does.
#[tokio::test]
async fn a_readmitted_cluster_ramps_up_over_the_slow_start_window() {
    let beat = heartbeat().await;
    let bad = Scripted::start(503).await;
    let good = Scripted::start(200).await;
    let (router, _stop) = start(
        "{ consecutiveGatewayFailures: 2, baseEjectionMs: 500 }",
        60_000,
        &[
            entry("bad", bad.addr, beat, 0.1),
            entry("good", good.addr, beat, 1.0),
        ],
    )
    .await;
    served_by(&router, "good").await;
    served_by(&router, "good").await;
    let weight = "infergate_global_cluster_weight";
    let ejected = "infergate_global_cluster_ejected";
    assert_eq!(series(&router, ejected, "bad").await, 1.0);
    bad.set(200);
    let deadline = Instant::now() + Duration::from_secs(5);
    // The gauges are refreshed at each heartbeat (100 ms).
    while series(&router, weight, "bad").await != 0.0 {
        assert!(Instant::now() < deadline, "never shown ejected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while series(&router, ejected, "bad").await != 0.0 {
        assert!(Instant::now() < deadline, "never readmitted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let w = series(&router, weight, "bad").await;
    println!("readmitted with slowStartMs 60000: share {w:.3}");
    assert!((0.05..0.2).contains(&w), "{w}");
    // Most requests still go to `good` while `bad` ramps (seeded draws: reproducible).
    let mut on_bad = 0;
    for _ in 0..40 {
        let r = chat(&router).await;
        assert_eq!(r.status, 200);
        on_bad += usize::from(r.header("x-infergate-cluster") == Some("bad"));
    }
    println!("first 40 requests after the readmission: {on_bad} on the readmitted cluster");
    assert!(on_bad < 20, "{on_bad}");
}

/// Sends requests one after another for `for_ms`, the cheaper `flaky` cluster answering 503
/// and 200 by turns (never two failures in a row): how many reached it.
async fn alternate(router: &Router, flaky: &Scripted, for_ms: u64) -> usize {
    let until = Instant::now() + Duration::from_millis(for_ms);
    let mut i = 0;
    while Instant::now() < until {
        flaky.set(if i % 2 == 0 { 503 } else { 200 });
        let r = chat(router).await;
        assert_eq!(r.status, 200, "{}", r.text());
        i += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    flaky.hits()
}

/// A cluster failing every other request (503, its heartbeat good) never fails
/// `consecutiveGatewayFailures` in a row, so without `failurePercentage` it is never ejected
/// and every second request pays a round trip there before failing over. With it, the first
/// request after an interval of half failures ejects it: the requests then go to the other
/// cluster at once, and the share is on the metrics page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failing_half_its_requests_is_ejected_by_failure_percentage() {
    for with in [false, true] {
        let flaky = Scripted::start(200).await;
        let good = Scripted::start(200).await;
        let (beat_a, beat_b) = (heartbeat().await, heartbeat().await);
        let rate = if with {
            ", failurePercentage: { threshold: 40, minimumRequests: 10, intervalMs: 500 }"
        } else {
            ""
        };
        let (router, _stop) = start(
            &format!("{{ consecutiveGatewayFailures: 3, baseEjectionMs: 60000{rate} }}"),
            0,
            &[
                entry("flaky", flaky.addr, beat_a, 0.1),
                entry("good", good.addr, beat_b, 1.0),
            ],
        )
        .await;
        let reached = alternate(&router, &flaky, 1_200).await;
        let ejections = series(&router, "infergate_global_cluster_ejections_total", "flaky").await;
        let page = metrics(router.admin_addr().unwrap()).await;
        let share = counter(
            &page,
            "infergate_global_cluster_failure_percent{cluster=\"flaky\"}",
        );
        let after = alternate(&router, &flaky, 300).await;
        println!(
            "failurePercentage {with}: {reached} requests reached the flaky cluster in 1.2 s, {} in the 0.3 s after; ejections {ejections}, last interval's failures {share}%",
            after - reached
        );
        if with {
            assert_eq!(ejections, 1.0, "{page}");
            assert!((40.0..=60.0).contains(&share), "{share}\n{page}");
            assert_eq!(after, reached, "an ejected cluster was tried first");
            assert_eq!(
                series(&router, "infergate_global_cluster_ejected", "flaky").await,
                1.0
            );
        } else {
            assert_eq!(ejections, 0.0, "{page}");
            assert!(
                !page.contains("infergate_global_cluster_failure_percent{"),
                "{page}"
            );
            assert!(after > reached + 5, "{reached} then {after}");
        }
    }
}
