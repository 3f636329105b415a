//! The access log (`accessLog:`) of a gateway on 127.0.0.1 in front of scripted model servers:
//! one JSON line per request, whatever way it ended, read back from the file as a log shipper
//! would.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/upstream.rs"]
mod upstream;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use infergate_proxy::{Gateway, GatewayConfig};
use infergate_testkit::{json_lines, metric};
use serde_json::Value;
use upstream::{Behaviour, Upstream, get, open_stream, post, refused_addr, send};

const CHAT_STREAM: &str = r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;

fn config(log: &Path, endpoints: &[SocketAddr]) -> String {
    let eps: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
    format!(
        "auth: none\nreloadIntervalMs: 20\nretries: {{ maxAttempts: 2 }}\ntimeouts: {{ connectMs: 500 }}\n\
         accessLog: {{ path: {} }}\n\
         models:\n  - name: m\n    scheduler: {{ preset: round-robin }}\n    endpoints: [{}]\n",
        log.display(),
        eps.join(", ")
    )
}

async fn start(yaml: &str) -> (Gateway, tokio::sync::oneshot::Sender<()>) {
    upstream::serve_gateway(GatewayConfig::from_yaml(yaml).unwrap()).await
}

fn the<'a>(lines: &'a [Value], request_id: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["request_id"] == request_id)
        .unwrap_or_else(|| panic!("no line for {request_id}: {lines:?}"))
}

#[tokio::test]
async fn every_request_gets_one_line_saying_how_it_ended() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let good = Upstream::start(Behaviour::Ok).await;
    let stepped = Upstream::start(Behaviour::Stepped).await;
    let dead = refused_addr().await;
    // Round-robin over [dead, good]: the first request meets the refused endpoint first.
    let (gw, _stop) = start(&config(&log, &[dead, good.addr])).await;
    let headers = [("x-request-id", "streamed-1")];
    let (status, _, _) = send(
        gw.http_addr(),
        "POST",
        "/v1/chat/completions",
        CHAT_STREAM,
        &headers,
    )
    .await;
    assert_eq!(status, 200);
    let unknown = r#"{"model":"nope","messages":[{"role":"user","content":"hi"}]}"#;
    let headers = [("x-request-id", "unknown-model")];
    let (status, _, _) = send(
        gw.http_addr(),
        "POST",
        "/v1/chat/completions",
        unknown,
        &headers,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = get(gw.http_addr(), "/v1/models").await;
    assert_eq!(status, 200);

    let lines = json_lines(&log, 3).await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    let streamed = the(&lines, "streamed-1");
    assert_eq!(streamed["status"], 200);
    assert_eq!(streamed["outcome"], "completed");
    assert_eq!(streamed["method"], "POST");
    assert_eq!(streamed["path"], "/v1/chat/completions");
    assert_eq!(streamed["model"], "m");
    assert_eq!(streamed["served_model"], "m");
    assert_eq!(streamed["tenant"], "anonymous");
    assert_eq!(streamed["stream"], true);
    assert!(streamed["error"].is_null(), "{streamed}");
    assert_eq!(streamed["endpoint"], good.addr.to_string());
    assert_eq!(
        streamed["attempts"], 2,
        "the refused endpoint first: {streamed}"
    );
    assert_eq!(streamed["completion_tokens"], 2, "{streamed}");
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

    let refused = the(&lines, "unknown-model");
    assert_eq!(refused["status"], 404);
    assert_eq!(refused["outcome"], "gateway");
    assert_eq!(refused["error"], "unknown_model");
    assert_eq!(refused["model"], "nope");
    assert!(refused["endpoint"].is_null() && refused["served_model"].is_null());

    let models = lines.iter().find(|l| l["path"] == "/v1/models").unwrap();
    assert_eq!(models["method"], "GET");
    assert_eq!(
        (models["status"].clone(), models["outcome"].clone()),
        (200.into(), "gateway".into())
    );

    // A client that leaves mid-stream.
    let (gw2, _stop2) = start(&config(&log, &[stepped.addr])).await;
    let body = open_stream(gw2.http_addr(), "m").await;
    drop(body);
    let lines = json_lines(&log, 4).await;
    let left = &lines[3];
    assert_eq!(left["outcome"], "cancelled", "{left}");
    assert_eq!(left["status"], 200);
    assert!(left["completion_tokens"].is_null(), "{left}");

    let (_, metrics) = get(gw.admin_addr().unwrap(), "/metrics").await;
    for (result, n) in [("written", 3), ("dropped", 0), ("failed", 0)] {
        let series =
            format!("infergate_gateway_access_log_lines_total{{result=\"{result}\"}} {n}\n");
        assert!(metrics.contains(&series), "{series} in {metrics}");
    }
}

/// An answer without a body (`content-length: 0`) is over when its head is: hyper writes it to
/// the client without polling the body, which was then dropped unread and logged as the client
/// leaving (`cancelled`), its in-flight entry cancelled and its connection closed.
#[tokio::test]
async fn an_answer_without_a_body_is_logged_as_it_ended_not_as_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let ok = Upstream::start(Behaviour::Empty(200)).await;
    let missing = Upstream::start(Behaviour::Empty(404)).await;
    let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    for (n, up) in [&ok, &missing].into_iter().enumerate() {
        let (gw, _stop) = start(&config(&log, &[up.addr])).await;
        let id = format!("empty-{n}");
        let (status, _, body) = send(
            gw.http_addr(),
            "POST",
            "/v1/chat/completions",
            chat,
            &[("x-request-id", id.as_str())],
        )
        .await;
        assert!(body.is_empty(), "{body:?}");
        let lines = json_lines(&log, n + 1).await;
        let line = the(&lines, &id);
        assert_eq!(line["status"], status.as_u16(), "{line}");
        let want = if status == 200 {
            "completed"
        } else {
            "refused"
        };
        assert_eq!(line["outcome"], want, "{line}");
    }
    assert_eq!(missing.requests(), 1);
}

#[tokio::test]
async fn a_reload_moves_the_log_and_a_bad_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("a.log"), dir.path().join("b.log"));
    let up = Upstream::start(Behaviour::Ok).await;
    let file = dir.path().join("gateway.yaml");
    std::fs::write(&file, config(&first, &[up.addr])).unwrap();
    let (gw, _stop) = start(&std::fs::read_to_string(&file).unwrap()).await;
    let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    post(gw.http_addr(), "/v1/chat/completions", chat).await;
    let before = json_lines(&first, 1).await;
    assert_eq!(before[0]["outcome"], "completed");
    assert_eq!(before[0]["stream"], false);
    assert_eq!(before[0]["prompt_tokens"], 7, "{}", before[0]);

    gw.handle()
        .reload(GatewayConfig::from_yaml(&config(&second, &[up.addr])).unwrap())
        .unwrap();
    post(gw.http_addr(), "/v1/chat/completions", chat).await;
    assert_eq!(json_lines(&second, 1).await.len(), 1);
    assert_eq!(
        json_lines(&first, 1).await.len(),
        1,
        "the old file takes no more"
    );

    // A folder that does not exist: the reload is refused, the log in force stays.
    let missing = dir.path().join("no-such-dir").join("c.log");
    let e = gw
        .handle()
        .reload(GatewayConfig::from_yaml(&config(&missing, &[up.addr])).unwrap())
        .unwrap_err();
    let chain = infergate_pool::ErrorChain(&e).to_string();
    assert!(
        chain.contains("accessLog.path") && chain.contains("c.log"),
        "{chain}"
    );
    post(gw.http_addr(), "/v1/chat/completions", chat).await;
    assert_eq!(json_lines(&second, 2).await.len(), 2);
    // `--check` says the same without starting anything.
    let e = infergate_proxy::check_files(
        &GatewayConfig::from_yaml(&config(&missing, &[up.addr])).unwrap(),
    )
    .unwrap_err();
    assert!(format!("{e}").contains("no-such-dir"), "{e}");
}

/// How long a test waits, after the writer's last check of its path, for the next one to be
/// due: the writer is a thread of its own on the real clock, checking at most once a second.
const FOLLOW: Duration = Duration::from_millis(1100);

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

/// A chat request with `x-request-id: id`, answered 200.
async fn chat(gw: &Gateway, id: &str) {
    let headers = [("x-request-id", id)];
    let (status, _, _) = send(
        gw.http_addr(),
        "POST",
        "/v1/chat/completions",
        CHAT,
        &headers,
    )
    .await;
    assert_eq!(status, 200, "{id}");
}

/// The lines' request ids, sorted (a line is written when its response body is dropped, which
/// may be after the client read it).
fn ids(lines: &[Value]) -> Vec<&str> {
    let mut ids: Vec<&str> = lines
        .iter()
        .map(|l| l["request_id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    ids
}

/// Waits until the gateway's `series` (`family{labels}`) reads `value`.
async fn until_metric(gw: &Gateway, family: &str, labels: &[(&str, &str)], value: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, page) = get(gw.admin_addr().unwrap(), "/metrics").await;
        let now = metric(&page, family, labels);
        if now == Some(value) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{family}{labels:?}: {now:?}, not {value}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const REOPENS: &str = "infergate_gateway_access_log_reopens_total";

/// logrotate's default (the file renamed, an empty one created at the path): the lines after
/// it go to the new file, the renamed one keeps exactly those before. A file deleted is created
/// again; one truncated in place (`copytruncate`) is written on from its start, without a
/// reopen.
#[tokio::test]
async fn the_log_follows_its_path_across_rotations() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let rotated = dir.path().join("access.log.1");
    let up = Upstream::start(Behaviour::Ok).await;
    let (gw, _stop) = start(&config(&log, &[up.addr])).await;
    chat(&gw, "before-1").await;
    chat(&gw, "before-2").await;
    assert_eq!(ids(&json_lines(&log, 2).await), ["before-1", "before-2"]);

    // As logrotate's `create` does: renamed, and an empty file made at the path.
    std::fs::rename(&log, &rotated).unwrap();
    std::fs::File::create(&log).unwrap();
    tokio::time::sleep(FOLLOW).await;
    chat(&gw, "after-1").await;
    chat(&gw, "after-2").await;
    assert_eq!(ids(&json_lines(&log, 2).await), ["after-1", "after-2"]);
    assert_eq!(
        ids(&json_lines(&rotated, 2).await),
        ["before-1", "before-2"],
        "the renamed file holds the lines from before, and only those"
    );
    until_metric(&gw, REOPENS, &[("result", "ok")], 1.0).await;

    // Deleted: created again.
    std::fs::remove_file(&log).unwrap();
    tokio::time::sleep(FOLLOW).await;
    chat(&gw, "recreated").await;
    assert_eq!(ids(&json_lines(&log, 1).await), ["recreated"]);
    until_metric(&gw, REOPENS, &[("result", "ok")], 2.0).await;

    // `copytruncate`: the same file, emptied; the next line is its first (appended, so no
    // hole of zeros where the old end was), and no reopen is needed.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(0)
        .unwrap();
    tokio::time::sleep(FOLLOW).await;
    chat(&gw, "truncated").await;
    assert_eq!(ids(&json_lines(&log, 1).await), ["truncated"]);
    assert!(
        !std::fs::read(&log).unwrap().contains(&0),
        "a hole of zeros"
    );
    until_metric(
        &gw,
        "infergate_gateway_access_log_lines_total",
        &[("result", "written")],
        6.0,
    )
    .await;
    until_metric(&gw, REOPENS, &[("result", "ok")], 2.0).await;
    until_metric(&gw, REOPENS, &[("result", "error")], 0.0).await;
}

/// A path that cannot be opened again (its folder removed): the lines go on to the file held
/// and are counted written, the failure is counted, and the gateway serves on.
#[tokio::test]
async fn a_log_whose_folder_is_gone_writes_on_to_the_file_held() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("logs");
    std::fs::create_dir(&folder).unwrap();
    let log = folder.join("access.log");
    let up = Upstream::start(Behaviour::Ok).await;
    let (gw, _stop) = start(&config(&log, &[up.addr])).await;
    chat(&gw, "before").await;
    json_lines(&log, 1).await;

    std::fs::remove_dir_all(&folder).unwrap();
    tokio::time::sleep(FOLLOW).await;
    chat(&gw, "after-1").await;
    chat(&gw, "after-2").await;
    let lines = "infergate_gateway_access_log_lines_total";
    until_metric(&gw, lines, &[("result", "written")], 3.0).await;
    until_metric(&gw, lines, &[("result", "failed")], 0.0).await;
    let (_, page) = get(gw.admin_addr().unwrap(), "/metrics").await;
    let failed = metric(&page, REOPENS, &[("result", "error")]).unwrap();
    assert!(failed >= 1.0, "{failed}");
    assert_eq!(metric(&page, REOPENS, &[("result", "ok")]), Some(0.0));
    assert!(!folder.exists(), "nothing made the folder again");
}

#[test]
fn the_path_is_checked_with_the_file() {
    let base = "auth: none\nmodels: [{ name: m, endpoints: [127.0.0.1:1] }]\n";
    for (log, expected) in [
        ("accessLog: { path: '' }", "`accessLog.path` must be"),
        (
            "accessLog: { path: stdout, format: text }",
            "unknown field `format`",
        ),
        ("accessLog: stdout", "accessLog"),
    ] {
        let e = GatewayConfig::from_yaml(&format!("{base}{log}\n")).unwrap_err();
        assert!(format!("{e:#}").contains(expected), "{log}: {e:#}");
    }
    for path in ["stdout", "stderr", "/var/log/infergate/access.log"] {
        let c =
            GatewayConfig::from_yaml(&format!("{base}accessLog: {{ path: {path} }}\n")).unwrap();
        assert_eq!(c.access_log.unwrap().path.to_string(), path);
    }
}
