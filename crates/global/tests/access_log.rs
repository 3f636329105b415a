//! The router's access log (`accessLog:`) on 127.0.0.1, in front of a real gateway over an
//! emulated fleet and of scripted clusters: one JSON line per request, whatever way it ended,
//! read back from the file as a log shipper would.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "a failed unwrap is a failed test; the estimate test prints what it measured"
)]

#[path = "common/clusters.rs"]
mod clusters;
#[path = "common/scripted.rs"]
mod scripted;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use clusters::{CHAT, TestCluster, counter, router_with};
use infergate_global::{GlobalConfig, Router};
use infergate_testkit::json_lines;
use scripted::{HeldStream, Scripted, heartbeat, holding_pod, open_stream};
use serde_json::Value;
use tokio::time::Instant;

/// A chat request (not streamed) for the scripted clusters' model.
const CHAT_M: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// Heartbeats every 50 ms, no slow start; the log in `log`.
fn top(log: &Path) -> String {
    format!(
        "auth: none\nheartbeat: {{ intervalMs: 50, staleAfterMs: 2000, slowStartMs: 0 }}\naccessLog: {{ path: {} }}\nclusters:\n",
        log.display()
    )
}

/// A scripted cluster entry serving `m`, priced `cost` per million input tokens.
fn entry(name: &str, url: SocketAddr, beat: SocketAddr, cost: f64) -> String {
    format!(
        "  - {{ name: {name}, url: 'http://{url}', heartbeatUrl: 'http://{beat}/heartbeat', region: r-{name}, models: [m], cost: {{ inputPerMillion: {cost} }} }}\n"
    )
}

/// Waits until every cluster of `names` is routed on at full weight.
async fn until_up(router: &Router, names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for name in names {
        let weight = format!("infergate_global_cluster_weight{{cluster=\"{name}\"}}");
        while counter(&page(router).await, &weight) != 1.0 {
            assert!(Instant::now() < deadline, "{name} never up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn page(router: &Router) -> String {
    infergate_testkit::get(router.admin_addr().unwrap(), "/metrics")
        .await
        .text()
}

/// `POST /v1/chat/completions` with `body`, and an `x-request-id` when given.
async fn chat(
    router: &Router,
    body: &str,
    request_id: Option<&str>,
) -> infergate_testkit::Response {
    let mut req =
        http::Request::post("/v1/chat/completions").header("content-type", "application/json");
    if let Some(id) = request_id {
        req = req.header("x-request-id", id);
    }
    let req = req.body(Bytes::from(body.to_owned())).unwrap();
    infergate_testkit::send(router.http_addr(), req)
        .await
        .unwrap()
}

fn the<'a>(lines: &'a [Value], path: &str, model: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["path"] == path && l["model"] == model)
        .unwrap_or_else(|| panic!("no line for {path} {model}: {lines:?}"))
}

/// A streamed answer through a real gateway, a failover from a cluster answering 503 to the
/// next, and an error the router answers itself: a line each, saying how each ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_gets_one_line_saying_how_it_ended() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let east = TestCluster::start("east", "llama-3.1-8b/h100", 1, 31).await;
    let (bad, good) = (Scripted::start(503).await, Scripted::start(200).await);
    let (beat_bad, beat_good) = (heartbeat().await, heartbeat().await);
    // `bad` is the cheaper: requests for `m` meet it first.
    let yaml = format!(
        "{}{}{}{}",
        top(&log),
        east.entry("us-east", 0.5, 2.0),
        entry("bad", bad.addr, beat_bad, 0.1),
        entry("good", good.addr, beat_good, 1.0),
    );
    let (router, _stop) = router_with(&yaml).await;
    until_up(&router, &["east", "bad", "good"]).await;

    let r = chat(&router, CHAT, Some("streamed-1")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("data: [DONE]"), "{}", r.text());
    let r = chat(&router, CHAT_M, None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-infergate-cluster"), Some("good"));
    let r = chat(&router, &CHAT_M.replace("\"m\"", "\"nope\""), None).await;
    assert_eq!(r.status, 404, "{}", r.text());

    let lines = json_lines(&log, 3).await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    let streamed = the(&lines, "/v1/chat/completions", "llama");
    assert_eq!(streamed["request_id"], "streamed-1");
    assert_eq!(streamed["method"], "POST");
    assert_eq!(streamed["status"], 200);
    assert_eq!(streamed["outcome"], "completed");
    assert!(streamed["error"].is_null(), "{streamed}");
    assert_eq!(streamed["tenant"], "default", "{streamed}");
    assert_eq!(streamed["stream"], true);
    assert_eq!(streamed["cluster"], "east");
    assert_eq!(streamed["region"], "us-east");
    assert_eq!(streamed["clusters_tried"], 1);
    let (prompt, completion) = (
        streamed["prompt_tokens"].as_f64().unwrap(),
        streamed["completion_tokens"].as_f64().unwrap(),
    );
    assert!(prompt > 0.0 && completion > 0.0, "{streamed}");
    // East's prices: 0.5 and 2.0 per million tokens.
    let cost = streamed["cost"].as_f64().unwrap();
    let expected = (prompt * 0.5 + completion * 2.0) / 1e6;
    assert!(
        (cost - expected).abs() < 1e-12,
        "{cost} ≠ {expected}: {streamed}"
    );
    let (ttft, took) = (
        streamed["ttft_ms"].as_f64().unwrap(),
        streamed["duration_ms"].as_f64().unwrap(),
    );
    assert!(ttft > 0.0 && ttft <= took, "{streamed}");
    let client: SocketAddr = streamed["client"].as_str().unwrap().parse().unwrap();
    assert!(client.ip().is_loopback(), "{streamed}");
    // RFC 3339, UTC, milliseconds.
    let time = streamed["time"].as_str().unwrap();
    assert!(time.len() == 24 && time.ends_with('Z'), "{time}");

    let failover = the(&lines, "/v1/chat/completions", "m");
    assert_eq!(failover["clusters_tried"], 2, "{failover}");
    assert_eq!(failover["cluster"], "good");
    assert_eq!(failover["region"], "r-good");
    assert_eq!(failover["outcome"], "completed");
    assert_eq!(failover["stream"], false);
    // Sent without one: the router's own id, 32 hex digits.
    let id = failover["request_id"].as_str().unwrap();
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{failover}"
    );
    assert!(failover["ttft_ms"].is_null(), "{failover}");
    assert_eq!(
        (
            failover["prompt_tokens"].clone(),
            failover["completion_tokens"].clone()
        ),
        (7.into(), 3.into()),
        "the scripted answer's usage: {failover}"
    );
    // 7 input tokens at 1.0 per million; output free.
    assert!(
        (failover["cost"].as_f64().unwrap() - 7e-6).abs() < 1e-15,
        "{failover}"
    );

    let refused = the(&lines, "/v1/chat/completions", "nope");
    assert_eq!(refused["status"], 404);
    assert_eq!(refused["outcome"], "router");
    assert_eq!(refused["error"], "unknown_model");
    assert_eq!(refused["clusters_tried"], 0);
    assert!(
        refused["cluster"].is_null() && refused["cost"].is_null(),
        "{refused}"
    );

    // Every field, in the documented order (docs/global.md), in every line.
    let fields = [
        "time",
        "request_id",
        "client",
        "method",
        "path",
        "status",
        "outcome",
        "error",
        "tenant",
        "model",
        "stream",
        "cluster",
        "region",
        "clusters_tried",
        "estimated_ttft_ms",
        "ttft_ms",
        "duration_ms",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "cost",
    ];
    for line in std::fs::read_to_string(&log).unwrap().lines() {
        let at: Vec<usize> = fields
            .iter()
            .map(|f| {
                line.find(&format!("\"{f}\":"))
                    .unwrap_or_else(|| panic!("{f}: {line}"))
            })
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{line}");
        assert_eq!(line.matches("\":").count(), fields.len(), "{line}");
    }

    let metrics = page(&router).await;
    for (result, n) in [("written", 3), ("dropped", 0), ("failed", 0)] {
        let series =
            format!("infergate_global_access_log_lines_total{{result=\"{result}\"}} {n}\n");
        assert!(metrics.contains(&series), "{series} in {metrics}");
    }
}

/// A client that leaves while its answer streams: `cancelled`, with the status it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_stream_is_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let held = HeldStream::start().await;
    let beat = heartbeat().await;
    let yaml = format!("{}{}", top(&log), entry("held", held.addr, beat, 1.0));
    let (router, _stop) = router_with(&yaml).await;
    until_up(&router, &["held"]).await;
    let (client, _) = open_stream(router.http_addr()).await;
    drop(client);
    let lines = json_lines(&log, 1).await;
    let left = &lines[0];
    assert_eq!(left["outcome"], "cancelled", "{left}");
    assert_eq!(left["status"], 200);
    assert_eq!(left["cluster"], "held");
    assert_eq!(left["stream"], true);
    assert!(left["completion_tokens"].is_null(), "{left}");
    drop(held.release);
}

/// A reload that keeps the path keeps the writer; one that changes it moves the log; one
/// naming a folder that does not exist is refused, as `--check` refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_moves_the_log_and_a_bad_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("a.log"), dir.path().join("b.log"));
    let up = Scripted::start(200).await;
    let beat = heartbeat().await;
    let yaml = |log: &Path, seed: u64| {
        format!(
            "seed: {seed}\n{}{}",
            top(log),
            entry("up", up.addr, beat, 1.0)
        )
    };
    let (router, _stop) = router_with(&yaml(&first, 0)).await;
    until_up(&router, &["up"]).await;
    chat(&router, CHAT_M, Some("one")).await;
    assert_eq!(json_lines(&first, 1).await[0]["request_id"], "one");

    // The same path: the writer is kept, with the file it holds open (a new writer would
    // create the file again).
    std::fs::remove_file(&first).unwrap();
    router
        .handle()
        .reload(GlobalConfig::from_yaml(&yaml(&first, 1)).unwrap())
        .unwrap();
    assert!(!first.exists(), "the reload opened the log again");

    router
        .handle()
        .reload(GlobalConfig::from_yaml(&yaml(&second, 1)).unwrap())
        .unwrap();
    chat(&router, CHAT_M, Some("two")).await;
    let moved = json_lines(&second, 1).await;
    assert_eq!(moved.len(), 1);
    assert_eq!(moved[0]["request_id"], "two");
    assert!(!first.exists(), "the old destination takes no more");

    // A folder that does not exist: the reload is refused, the log in force stays.
    let missing = dir.path().join("no-such-dir").join("c.log");
    let e = router
        .handle()
        .reload(GlobalConfig::from_yaml(&yaml(&missing, 1)).unwrap())
        .unwrap_err();
    let chain = infergate_pool::ErrorChain(&e).to_string();
    assert!(
        chain.contains("accessLog.path") && chain.contains("c.log"),
        "{chain}"
    );
    chat(&router, CHAT_M, Some("three")).await;
    assert_eq!(json_lines(&second, 2).await[1]["request_id"], "three");
    // `--check` says the same without starting anything, and accepts a path it can use.
    let e = infergate_global::check_files(&GlobalConfig::from_yaml(&yaml(&missing, 1)).unwrap())
        .unwrap_err();
    assert!(format!("{e}").contains("no-such-dir"), "{e}");
    let fresh = dir.path().join("fresh.log");
    infergate_global::check_files(&GlobalConfig::from_yaml(&yaml(&fresh, 1)).unwrap()).unwrap();
    assert!(!fresh.exists(), "--check wrote the log");
}

/// logrotate's default (rename the file; a new one is written at the path): the lines after it
/// go to a new file at the path, the renamed one keeps exactly those before. Then the folder
/// removed: the path cannot be opened again, so the lines go on to the file held, counted
/// written, the failure counted, and the router serves on. The writer is a thread on the real
/// clock that checks its path at most once a second: the test waits that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_follows_its_path_across_a_rotation() {
    const FOLLOW: Duration = Duration::from_millis(1100);
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("logs");
    std::fs::create_dir(&folder).unwrap();
    let (log, rotated) = (folder.join("access.log"), folder.join("access.log.1"));
    let up = Scripted::start(200).await;
    let beat = heartbeat().await;
    let yaml = format!("{}{}", top(&log), entry("up", up.addr, beat, 1.0));
    let (router, _stop) = router_with(&yaml).await;
    until_up(&router, &["up"]).await;
    let ids = |lines: &[Value]| -> Vec<String> {
        lines
            .iter()
            .map(|l| l["request_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(chat(&router, CHAT_M, Some("one")).await.status, 200);
    assert_eq!(ids(&json_lines(&log, 1).await), ["one"]);

    std::fs::rename(&log, &rotated).unwrap();
    tokio::time::sleep(FOLLOW).await;
    assert_eq!(chat(&router, CHAT_M, Some("two")).await.status, 200);
    assert_eq!(ids(&json_lines(&log, 1).await), ["two"]);
    assert_eq!(
        ids(&json_lines(&rotated, 1).await),
        ["one"],
        "only the line from before"
    );
    let reopens = "infergate_global_access_log_reopens_total";
    let (ok, error) = (
        format!("{reopens}{{result=\"ok\"}}"),
        format!("{reopens}{{result=\"error\"}}"),
    );
    assert_eq!(counter(&page(&router).await, &ok), 1.0);

    std::fs::remove_dir_all(&folder).unwrap();
    tokio::time::sleep(FOLLOW).await;
    assert_eq!(chat(&router, CHAT_M, Some("three")).await.status, 200);
    let written = "infergate_global_access_log_lines_total{result=\"written\"}";
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(&page(&router).await, written) != 3.0 {
        assert!(Instant::now() < deadline, "{}", page(&router).await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let metrics = page(&router).await;
    assert!(counter(&metrics, &error) >= 1.0, "{metrics}");
    assert_eq!(counter(&metrics, &ok), 1.0, "{metrics}");
    assert!(!folder.exists(), "nothing made the folder again");
}

#[test]
fn the_path_is_checked_with_the_file() {
    let base = "auth: none\nclusters: [{ name: a, url: 'http://127.0.0.1:1', region: r, cost: { inputPerMillion: 1 } }]\n";
    for (log, expected) in [
        ("accessLog: { path: '' }", "`accessLog.path` must be"),
        (
            "accessLog: { path: stdout, format: text }",
            "unknown field `format`",
        ),
    ] {
        let e = GlobalConfig::from_yaml(&format!("{base}{log}\n")).unwrap_err();
        assert!(format!("{e:#}").contains(expected), "{log}: {e:#}");
    }
    for path in ["stdout", "stderr", "/var/log/infergate/access.log"] {
        let c = GlobalConfig::from_yaml(&format!("{base}accessLog: {{ path: {path} }}\n")).unwrap();
        assert_eq!(c.access_log.unwrap().path.to_string(), path);
    }
    assert!(GlobalConfig::from_yaml(base).unwrap().access_log.is_none());
}

/// A streamed chat request of `content` (numbered `n` first, so that no prefix is cached).
fn numbered(n: usize, content: &str) -> String {
    format!(
        r#"{{"model":"llama","max_tokens":4,"stream":true,"stream_options":{{"include_usage":true}},"messages":[{{"role":"user","content":"request {n}: {content}"}}]}}"#
    )
}

/// A short prompt: 14 tokens, numbered.
const SHORT: &str = "Tell me a story.";

/// A long prompt: about 2,050 tokens, numbered.
fn long_prompt() -> String {
    "the lighthouse keeper watched the grey sea roll in ".repeat(160)
}

/// One cluster of one emulated `profile` pod whose gateway has learned, from [`SHORT`] and long
/// prompts sent to it directly one at a time on the idle pod, the pod's fixed cost per request
/// and its speed, as the requests measured after find it (a short prompt sent as a long one's
/// answer ends waits for the pod's last step: 42 ms on the H100 rather than 23).
async fn warmed(profile: &str, seed: u64) -> TestCluster {
    let cluster = TestCluster::start("east", profile, 1, seed).await;
    clusters::wait_ready(cluster.admin).await;
    let long = long_prompt();
    for n in 0..10 {
        for content in [SHORT, long.as_str()] {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let (status, ..) = clusters::stream_chat(cluster.http, numbered(n, content))
                .await
                .unwrap();
            assert_eq!(status, 200);
        }
    }
    cluster
}

/// The router's estimate beside the measured time to first token, for a short and a long
/// prompt on an emulated A10G and an emulated H100 (one pod each, idle): the short one's first
/// token is mostly the engine's fixed cost per request, which the heartbeat's `fixedCostMs`
/// carries; scaled by its length alone, its estimate was a twentieth of it. Prints the table
/// docs/global.md shows (`cargo test -p infergate-global --test access_log estimate --
/// --nocapture --test-threads=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_estimate_is_near_the_measured_ttft_for_short_and_long_prompts() {
    const ROUNDS: usize = 3;
    let long = long_prompt();
    println!("| pod | prompt | prompt tokens | estimated TTFT | measured TTFT |");
    println!("|---|---|---|---|---|");
    for (seed, profile) in [(41, "llama-3.1-8b/a10g"), (42, "llama-3.1-8b/h100")] {
        let cluster = warmed(profile, seed).await;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("access.log");
        let yaml = format!(
            "auth: none\nheartbeat: {{ intervalMs: 100, staleAfterMs: 2000, slowStartMs: 0 }}\naccessLog: {{ path: {} }}\nclusters:\n{}",
            log.display(),
            cluster.entry("us-east", 0.5, 2.0),
        );
        let (router, _stop) = router_with(&yaml).await;
        until_up(&router, &["east"]).await;
        // Each request alone, after the router's own measurement of the one before has aged
        // out (three heartbeat intervals): the estimate is the heartbeat's.
        for n in 0..ROUNDS {
            for content in [SHORT, long.as_str()] {
                tokio::time::sleep(Duration::from_millis(400)).await;
                let (status, ..) =
                    clusters::stream_chat(router.http_addr(), numbered(100 + n, content))
                        .await
                        .unwrap();
                assert_eq!(status, 200);
            }
        }
        let lines = json_lines(&log, 2 * ROUNDS).await;
        for (i, prompt) in ["short", "long"].into_iter().enumerate() {
            let mut ratios = Vec::new();
            for line in lines.iter().skip(i).step_by(2) {
                let estimated = line["estimated_ttft_ms"].as_f64().unwrap();
                let measured = line["ttft_ms"].as_f64().unwrap();
                println!(
                    "| {profile} | {prompt} | {} | {estimated:.1} ms | {measured:.1} ms |",
                    line["prompt_tokens"]
                );
                ratios.push(estimated / measured);
            }
            ratios.sort_by(f64::total_cmp);
            let median = ratios[ratios.len() / 2];
            assert!(
                (0.5..=2.0).contains(&median),
                "{profile}, {prompt} prompt: estimated/measured {ratios:?}"
            );
        }
    }
}

/// A TCP relay to `upstream` that delivers each chunk a client sends `delay` after it came: a
/// cluster far away, over a slow WAN, whose heartbeat (fetched from its admin port directly)
/// does not see the distance. Answers come back at once.
async fn slow_wan(upstream: SocketAddr, delay: Duration) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
                let read = async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = from_client.read(&mut buf).await {
                        if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                };
                let write = async move {
                    while let Some((at, chunk)) = rx.recv().await {
                        tokio::time::sleep_until(at + delay).await;
                        if to_server.write_all(&chunk).await.is_err() {
                            break;
                        }
                    }
                    let _ = to_server.shutdown().await;
                };
                let back = async move {
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                    let _ = to_client.shutdown().await;
                };
                tokio::join!(read, write, back);
            });
        }
    });
    addr
}

/// The router's own measured TTFT corrects the heartbeat's estimate for each request's prompt
/// rather than replacing it. One emulated A10G pod (about 40 ms to a short prompt's first
/// token, 600 ms to a long one's), reached directly (`near`) and through a WAN that adds 300 ms
/// the heartbeat does not see (`far`), each through its own router. On each, requests go back
/// to back (each sent as the one before ends, so the router's measurement of it is fresh): four
/// short prompts, then four long ones, then a short one. The long prompt after the short ones
/// is estimated near its own TTFT, not the short ones' (it was estimated at 41 ms, and took
/// 600), and the short one after the long ones near its own (it was estimated at 600 ms); the
/// far cluster, whose answers keep coming later than its heartbeat says, is estimated at the
/// WAN's time more than the near one for both. Prints the table docs/global.md shows (`cargo
/// test -p infergate-global --test access_log estimate -- --nocapture --test-threads=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_measured_ttft_corrects_the_estimate_for_each_prompt_length() {
    const WAN: Duration = Duration::from_millis(300);
    let cluster = warmed("llama-3.1-8b/a10g", 43).await;
    let far = slow_wan(cluster.http, WAN).await;
    let long = long_prompt();
    let sequence = [
        SHORT, SHORT, SHORT, SHORT, &long, &long, &long, &long, SHORT,
    ];
    println!("| cluster | request | prompt tokens | estimated TTFT | measured TTFT |");
    println!("|---|---|---|---|---|");
    // Per cluster, the estimates of the long prompt after the short ones and of the short
    // prompt after the long ones.
    let mut switched = Vec::new();
    for (i, (name, url)) in [("near", cluster.http), ("far", far)]
        .into_iter()
        .enumerate()
    {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("access.log");
        // Heartbeats every second: a measurement counts for 3 s, longer than the next one
        // takes to come (a pause, then a long prompt's answer through the WAN), so the samples
        // are smoothed together.
        let yaml = format!(
            "auth: none\nheartbeat: {{ intervalMs: 1000, staleAfterMs: 3000, slowStartMs: 0 }}\naccessLog: {{ path: {} }}\nclusters:\n  - {{ name: {name}, url: 'http://{url}', heartbeatUrl: 'http://{}/heartbeat', region: r, cost: {{ inputPerMillion: 1 }} }}\n",
            log.display(),
            cluster.admin,
        );
        let (router, _stop) = router_with(&yaml).await;
        until_up(&router, &[name]).await;
        // Numbered apart from every other request, so that no prefix is cached.
        let first = 200 + 20 * i;
        for (n, content) in sequence.iter().enumerate() {
            // Longer than a heartbeat interval: the heartbeat the request is routed on shows
            // the pod idle, as it is, rather than busy with the request before.
            tokio::time::sleep(Duration::from_millis(1100)).await;
            let (status, ..) =
                clusters::stream_chat(router.http_addr(), numbered(first + n, content))
                    .await
                    .unwrap();
            assert_eq!(status, 200);
        }
        let lines = json_lines(&log, sequence.len()).await;
        let mut runs = Vec::new();
        for (n, line) in lines.iter().enumerate() {
            let estimated = line["estimated_ttft_ms"].as_f64().unwrap();
            let measured = line["ttft_ms"].as_f64().unwrap();
            println!(
                "| {name} | {} | {} | {estimated:.1} ms | {measured:.1} ms |",
                n + 1,
                line["prompt_tokens"]
            );
            runs.push((estimated, measured));
        }
        // The long prompt after four short ones is estimated nearer the long ones' TTFT than
        // the short ones' (the old estimate was the short ones' measurement), and the short
        // one after four long ones nearer the short ones'. Medians: on a shared machine one
        // request in a few takes 100–300 ms more.
        let median = |range: std::ops::Range<usize>| {
            let mut measured: Vec<f64> = runs[range].iter().map(|r| r.1).collect();
            measured.sort_by(f64::total_cmp);
            measured[measured.len() / 2]
        };
        let (short_ms, long_ms) = (median(0..4), median(4..8));
        let between = (short_ms + long_ms) / 2.0;
        let (long_after_short, short_after_long) = (runs[4].0, runs[8].0);
        assert!(
            long_after_short > between && short_after_long < between,
            "{name}: short prompts took {short_ms:.1} ms, long ones {long_ms:.1} ms; the long \
             one after the short ones was estimated at {long_after_short:.1} ms, the short one \
             after the long ones at {short_after_long:.1} ms: {runs:?}"
        );
        switched.push((runs[4].0, runs[8].0));
    }
    let ((near_long, near_short), (far_long, far_short)) = (switched[0], switched[1]);
    let penalty = WAN.as_secs_f64() * 1e3 / 2.0;
    assert!(
        far_long - near_long >= penalty && far_short - near_short >= penalty,
        "the far cluster's estimates {far_long:.1} ms (long), {far_short:.1} ms (short), the near \
         one's {near_long:.1} ms, {near_short:.1} ms: the WAN's {WAN:?} is not in both"
    );
}

/// A chat request for the model `m` of `content`, not streamed.
fn chat_m(content: &str) -> String {
    serde_json::json!({"model": "m", "messages": [{"role": "user", "content": content}]})
        .to_string()
}

/// The heartbeat of `slow`: idle, a typical request's first token in 400 ms, 100 ms of it
/// fixed; from a gateway before `waitMs`.
const SLOW_HEARTBEAT: &str = r#"{"schema":"infergate.heartbeat/v1","instance":"i","generation":1,
    "timestampMs":1,"models":[{"name":"m","pods":1,"readyPods":1,"saturation":0.0,"queue":0,
    "running":0,"inflight":0,"estimatedTtftMs":400.0,"prefillMs":400.0,"fixedCostMs":100.0,
    "drainMs":0.0}]}"#;

/// A real gateway serving each of `models` on its own [`holding_pod`], once ready; it stops
/// when the sender is dropped.
async fn holding_gateway(
    models: &[&str],
) -> (infergate_proxy::Gateway, tokio::sync::oneshot::Sender<()>) {
    let mut yaml = "auth: none\nscrape: { intervalMs: 20 }\nmodels:\n".to_owned();
    for model in models {
        let pod = holding_pod().await;
        yaml.push_str(&format!(
            "  - name: {model}\n    scheduler: {{ preset: infergate }}\n    endpoints: [{pod}]\n"
        ));
    }
    clusters::ready_gateway(&yaml).await
}

/// The router's settings up to its `clusters:` list: policy `latency`, heartbeats every 50 ms,
/// no slow start, the access log in `log`.
fn by_latency(log: &Path) -> String {
    format!(
        "auth: none\nheartbeat: {{ intervalMs: 50, staleAfterMs: 2000, slowStartMs: 0 }}\nrouting: {{ policy: latency }}\naccessLog: {{ path: {} }}\nclusters:\n",
        log.display()
    )
}

/// A scripted cluster answering 200, and where its heartbeat, always `beat`, is served.
async fn scripted_behind(beat: &'static str) -> (Scripted, SocketAddr) {
    let page = infergate_testkit::pages::page_server(std::sync::Arc::new(|| beat.to_owned()));
    (Scripted::start(200).await, page.await)
}

/// Routes `request` by latency between `q`, a real gateway whose one pod holds the `held`
/// requests (sent to that gateway directly: routed by it, without a first token), and `slow`,
/// an idle cluster behind [`SLOW_HEARTBEAT`], once the router has seen `q`'s queue: which
/// cluster answered, and the router's estimate for the request there.
async fn route_behind(held: &[String], request: &str) -> (String, f64) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let (gw, _gw_stop) = holding_gateway(&["m"]).await;
    let (slow, slow_beat) = scripted_behind(SLOW_HEARTBEAT).await;
    let yaml = format!(
        "{}  - {{ name: q, url: 'http://{}', heartbeatUrl: 'http://{}/heartbeat', region: r, models: [m], cost: {{ inputPerMillion: 1 }} }}\n{}",
        by_latency(&log),
        gw.http_addr(),
        gw.admin_addr().unwrap(),
        entry("slow", slow.addr, slow_beat, 1.0),
    );
    let (router, _stop) = router_with(&yaml).await;
    until_up(&router, &["q", "slow"]).await;
    let holding: Vec<_> = held
        .iter()
        .map(|body| {
            let req = http::Request::post("/v1/chat/completions")
                .header("content-type", "application/json")
                .body(Bytes::from(body.clone()))
                .unwrap();
            tokio::spawn(infergate_testkit::send(gw.http_addr(), req))
        })
        .collect();
    // The router has `q`'s heartbeat with the held requests queued: its typical estimate (each
    // queued request a typical one, 128 ms at the prior rate) counts them.
    let queued = (held.len() as f64 + 0.5) * 0.128;
    let series = "infergate_global_estimated_ttft_seconds{cluster=\"q\"}";
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(&page(&router).await, series) < queued {
        assert!(Instant::now() < deadline, "q's queue never seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answer = chat(&router, request, None).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let cluster = answer.header("x-infergate-cluster").unwrap().to_owned();
    let lines = json_lines(&log, 1).await;
    let estimate = lines[0]["estimated_ttft_ms"].as_f64().unwrap();
    for h in holding {
        h.abort();
    }
    (cluster, estimate)
}

/// A mixed workload: the heartbeat's queue counted at the prompts it holds (`waitMs`), and only
/// the request's own prefill scaled to its prompt. `q` is a real gateway over one pod holding
/// four requests, at the scheduler's prior 4,000 tokens/s; `slow` is idle and takes 400 ms to a
/// typical request's first token (100 ms fixed). A long prompt (about 2,050 tokens) behind four
/// short ones on `q` waits for about 60 tokens, then its own 0.5 s: `q`. Scaling `q`'s whole
/// estimate (five typical requests) by its length put it at 2.6 s, behind `slow`'s 1.3 s. A short
/// prompt behind four long ones on `q` waits for their 8,200 tokens (2 s): `slow` (0.1 s); the
/// whole estimate scaled down to its 14 tokens put `q` at 18 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_goes_where_the_queue_ahead_of_it_is_shortest_in_tokens() {
    let long = long_prompt();
    let held: Vec<String> = (0..4)
        .map(|n| chat_m(&format!("HOLD {n}: {SHORT}")))
        .collect();
    let (long_to, long_ms) = route_behind(&held, &chat_m(&format!("request 1: {long}"))).await;
    println!("long behind four short: {long_to}, estimated {long_ms:.1} ms");
    let held: Vec<String> = (0..4)
        .map(|n| chat_m(&format!("HOLD {n}: {long}")))
        .collect();
    let (short_to, short_ms) = route_behind(&held, &chat_m(&format!("request 2: {SHORT}"))).await;
    println!("short behind four long: {short_to}, estimated {short_ms:.1} ms");
    // Both cases run before either is judged, so that a failure shows both.
    let outcome = format!(
        "a long prompt behind short ones went to {long_to}, estimated {long_ms:.1} ms; a short \
         one behind long ones went to {short_to}, estimated {short_ms:.1} ms"
    );
    assert_eq!(
        (long_to.as_str(), short_to.as_str()),
        ("q", "slow"),
        "{outcome}"
    );
    assert!((300.0..1_000.0).contains(&long_ms), "{outcome}");
    assert!(short_ms < 200.0, "{outcome}");
}

/// A chat request for `model` of `content`, not streamed.
fn chat_for(model: &str, content: &str) -> String {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": content}]})
        .to_string()
}

/// The heartbeat of `far`: `b` alone, idle, a typical request's first token in 400 ms, 100 ms of
/// it fixed (a short prompt: about 108 ms).
const FAR_B_HEARTBEAT: &str = r#"{"schema":"infergate.heartbeat/v1","instance":"i","generation":1,
    "timestampMs":1,"models":[{"name":"b","pods":1,"readyPods":1,"saturation":0.0,"queue":0,
    "running":0,"inflight":0,"estimatedTtftMs":400.0,"prefillMs":400.0,"fixedCostMs":100.0,
    "drainMs":0.0}]}"#;

/// What `model`'s entry of the heartbeat at `admin` says of `field` (`None`: absent).
async fn beat_field(admin: SocketAddr, model: &str, field: &str) -> Option<f64> {
    let beat: Value =
        serde_json::from_str(&infergate_testkit::get(admin, "/heartbeat").await.text()).ok()?;
    beat["models"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == model)
        .and_then(|m| m[field].as_f64())
}

/// Sends four long prompts for `model` through `router` and returns their tasks once the
/// gateway whose admin port is `admin` counts all four in flight in its pool `pool`: the router
/// has them pending there until they are aborted.
async fn hold_four_long(
    router: &Router,
    model: &str,
    admin: SocketAddr,
    pool: &str,
) -> Vec<tokio::task::JoinHandle<Result<infergate_testkit::Response, infergate_testkit::Error>>> {
    let long = long_prompt();
    let holding: Vec<_> = (0..4)
        .map(|n| {
            let req = http::Request::post("/v1/chat/completions")
                .header("content-type", "application/json")
                .body(Bytes::from(chat_for(model, &format!("HOLD {n}: {long}"))))
                .unwrap();
            tokio::spawn(infergate_testkit::send(router.http_addr(), req))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while beat_field(admin, pool, "inflight").await != Some(4.0) {
        assert!(
            Instant::now() < deadline,
            "the held requests for {model} never reached {pool} at {admin}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    holding
}

/// The router counts the requests it sent and that have no first token yet per model, not per
/// cluster. `near` is a real gateway serving `a` and `b`, each on its own pod (idle, at the
/// scheduler's prior 4,000 tokens/s); `far` serves `b` alone, idle, about 108 ms to a short
/// prompt's first token. Four long prompts for `a` (about 8,200 tokens) are sent through the
/// router and held on `near`'s `a` pod; then a short prompt for `b`, whose pod on `near` is idle,
/// goes to `near`. When the cluster's pending requests were added to every model's estimate, it
/// was estimated behind the 8,200 tokens of `a` (2 s) and went to `far`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_queues_behind_its_own_pending_requests_only() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let (gw, _gw_stop) = holding_gateway(&["a", "b"]).await;
    let (far, far_beat) = scripted_behind(FAR_B_HEARTBEAT).await;
    let yaml = format!(
        "{}  - {{ name: near, url: 'http://{}', heartbeatUrl: 'http://{}/heartbeat', region: r, models: [a, b], cost: {{ inputPerMillion: 1 }} }}\n  - {{ name: far, url: 'http://{}', heartbeatUrl: 'http://{far_beat}/heartbeat', region: r-far, models: [b], cost: {{ inputPerMillion: 1 }} }}\n",
        by_latency(&log),
        gw.http_addr(),
        gw.admin_addr().unwrap(),
        far.addr,
    );
    let (router, _stop) = router_with(&yaml).await;
    until_up(&router, &["near", "far"]).await;
    // Pending at `near`, for `a`.
    let holding = hold_four_long(&router, "a", gw.admin_addr().unwrap(), "a").await;
    let answer = chat(
        &router,
        &chat_for("b", &format!("request 1: {SHORT}")),
        None,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let cluster = answer.header("x-infergate-cluster").unwrap().to_owned();
    let lines = json_lines(&log, 1).await;
    let estimate = lines[0]["estimated_ttft_ms"].as_f64().unwrap();
    println!(
        "a short prompt for b behind four long ones for a: {cluster}, estimated {estimate:.1} ms"
    );
    for h in holding {
        h.abort();
    }
    assert_eq!(
        cluster, "near",
        "the short prompt for b went to {cluster}, estimated {estimate:.1} ms"
    );
    assert!(estimate < 100.0, "estimated {estimate:.1} ms on near");
}

/// The heartbeat of `far`: `llama` and `b`, each idle, a typical request's first token in
/// 400 ms, 100 ms of it fixed (a short prompt: about 105 ms).
const FAR_LLAMA_B_HEARTBEAT: &str = r#"{"schema":"infergate.heartbeat/v1","instance":"i",
    "generation":1,"timestampMs":1,"models":[
    {"name":"llama","pods":1,"readyPods":1,"saturation":0.0,"queue":0,"running":0,"inflight":0,
     "estimatedTtftMs":400.0,"prefillMs":400.0,"fixedCostMs":100.0,"drainMs":0.0},
    {"name":"b","pods":1,"readyPods":1,"saturation":0.0,"queue":0,"running":0,"inflight":0,
     "estimatedTtftMs":400.0,"prefillMs":400.0,"fixedCostMs":100.0,"drainMs":0.0}]}"#;

/// A LoRA adapter's pending requests count against its base model: they queue on the same
/// pods. `near` is a real gateway serving `llama`, with the adapter `sql`, on one pod and `b` on
/// another (idle, at the scheduler's prior 4,000 tokens/s); its `/heartbeat` names `sql` among
/// `llama`'s `adapters`, and the router reads that field. `far` serves `llama` and `b`, idle,
/// about 105 ms to a short prompt's first token. The router polls heartbeats once a minute, so
/// it sees `near` idle throughout: only its own pending requests can tell it otherwise, as
/// between two heartbeats of a burst. Four long prompts for `sql` (about 8,200 tokens) are sent
/// through the router and held on `near`'s `llama` pod; then a short prompt for `llama` goes to
/// `far`, one for `b`, whose pod is idle, to `near`, and one for `sql`, served by `near` alone,
/// is estimated there behind the four (about 2 s). When each name counted its own requests
/// only, the one for `llama` went to `near`, estimated idle, to wait behind the adapter's 8,200
/// tokens (and the adapter, without its base model's figures, counted none of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_model_queues_behind_its_adapters_pending_requests() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let (llama_pod, b_pod) = (holding_pod().await, holding_pod().await);
    let (gw, _gw_stop) = clusters::ready_gateway(&format!(
        "auth: none\nscrape: {{ intervalMs: 20 }}\nmodels:\n  - name: llama\n    loraAdapters: [sql]\n    scheduler: {{ preset: infergate }}\n    endpoints: [{llama_pod}]\n  - name: b\n    scheduler: {{ preset: infergate }}\n    endpoints: [{b_pod}]\n"
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    // The field the router reads, as the gateway renders it.
    let beat: Value =
        serde_json::from_str(&infergate_testkit::get(admin, "/heartbeat").await.text()).unwrap();
    let adapters = |model: &str| {
        beat["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == model)
            .map(|m| m["adapters"].clone())
    };
    assert_eq!(
        adapters("llama"),
        Some(serde_json::json!(["sql"])),
        "{beat}"
    );
    assert_eq!(
        adapters("b"),
        Some(Value::Null),
        "no adapter, no field: {beat}"
    );
    let (far, far_beat) = scripted_behind(FAR_LLAMA_B_HEARTBEAT).await;
    let yaml = format!(
        "auth: none\nheartbeat: {{ intervalMs: 60000, staleAfterMs: 120000, slowStartMs: 0 }}\nrouting: {{ policy: latency }}\naccessLog: {{ path: {} }}\nclusters:\n  - {{ name: near, url: 'http://{}', heartbeatUrl: 'http://{admin}/heartbeat', region: r, models: [llama, sql, b], cost: {{ inputPerMillion: 1 }} }}\n  - {{ name: far, url: 'http://{}', heartbeatUrl: 'http://{far_beat}/heartbeat', region: r-far, models: [llama, b], cost: {{ inputPerMillion: 1 }} }}\n",
        log.display(),
        gw.http_addr(),
        far.addr,
    );
    let (router, _stop) = router_with(&yaml).await;
    until_up(&router, &["near", "far"]).await;
    // Pending at `near`, for `sql`, in its base model's `llama` pool.
    let holding = hold_four_long(&router, "sql", admin, "llama").await;
    let mut routed = Vec::new();
    for (n, model) in ["llama", "b", "sql"].into_iter().enumerate() {
        let body = chat_for(model, &format!("request {}: {SHORT}", n + 1));
        let answer = chat(&router, &body, None).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let cluster = answer.header("x-infergate-cluster").unwrap().to_owned();
        let lines = json_lines(&log, n + 1).await;
        let estimate = lines[n]["estimated_ttft_ms"].as_f64().unwrap();
        println!(
            "a short prompt for {model} behind four long ones for sql: {cluster}, estimated {estimate:.1} ms"
        );
        routed.push((cluster, estimate));
    }
    for h in holding {
        h.abort();
    }
    let outcome = format!("{routed:?}");
    assert_eq!(routed[0].0, "far", "the prompt for llama: {outcome}");
    assert_eq!(routed[1].0, "near", "the prompt for b: {outcome}");
    assert!(routed[1].1 < 100.0, "{outcome}");
    assert_eq!(routed[2].0, "near", "the prompt for sql: {outcome}");
    assert!(routed[2].1 > 1_500.0, "{outcome}");
}

/// A cold pool is estimated at its GPU type's speed, as its scheduler assumes it. `a10g` is one
/// fresh emulated A10G pod (the gateway told its GPU type), cheap; `h100` one fresh H100 pod,
/// ten times the price. Policy `costAware`, objective 1,000 ms, a long prompt (about 2,050
/// tokens): neither pod has served a request, so their heartbeats estimate from the scheduler's
/// cold-start rate. At the scheduler's prior for each GPU (4,000 tokens/s per H100, an A10G
/// 125/989 of it) the A10G's is over 4 s, the H100's 0.5 s: the request goes to `h100`. When the
/// heartbeat used the unscaled prior for both, both said 0.5 s and it went to the cheaper `a10g`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_pool_is_judged_at_its_gpu_types_speed() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let a10g = TestCluster::start_on_gpu("a10g", "llama-3.1-8b/a10g", "a10g", 41).await;
    let h100 = TestCluster::start_on_gpu("h100", "llama-3.1-8b/h100", "h100", 42).await;
    clusters::wait_ready(a10g.admin).await;
    clusters::wait_ready(h100.admin).await;
    let yaml = format!(
        "auth: none\nheartbeat: {{ intervalMs: 50, staleAfterMs: 2000, slowStartMs: 0 }}\nrouting: {{ policy: costAware, ttftObjectiveMs: 1000 }}\naccessLog: {{ path: {} }}\nclusters:\n{}{}",
        log.display(),
        a10g.entry("r", 0.05, 0.1),
        h100.entry("r", 0.5, 1.0),
    );
    let (router, _stop) = router_with(&yaml).await;
    until_up(&router, &["a10g", "h100"]).await;
    let (a10g_ms, h100_ms) = (
        beat_field(a10g.admin, "llama", "prefillMs").await,
        beat_field(h100.admin, "llama", "prefillMs").await,
    );
    println!("cold prefillMs: a10g {a10g_ms:?}, h100 {h100_ms:?}");
    let answer = chat(&router, &numbered(1, &long_prompt()), None).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let cluster = answer.header("x-infergate-cluster").unwrap().to_owned();
    let lines = json_lines(&log, 1).await;
    let estimate = lines[0]["estimated_ttft_ms"].as_f64().unwrap();
    println!("a long prompt, both pools cold: {cluster}, estimated {estimate:.1} ms");
    let outcome = format!(
        "went to {cluster}, estimated {estimate:.1} ms; cold prefillMs a10g {a10g_ms:?}, h100 \
         {h100_ms:?}"
    );
    assert_eq!(cluster, "h100", "{outcome}");
    let (Some(a10g_ms), Some(h100_ms)) = (a10g_ms, h100_ms) else {
        panic!("{outcome}");
    };
    // 989/125 = 7.9 times slower.
    assert!(a10g_ms > 5.0 * h100_ms, "{outcome}");
}
