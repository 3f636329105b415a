//! The gateway end to end on 127.0.0.1: real sockets to small scripted model servers.
//!
//! These run on the real clock (loopback IO does not mix with tokio's paused time); nothing
//! sleeps to let something happen — tests wait on the observable effect with a deadline.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/upstream.rs"]
mod upstream;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use infergate_proxy::{Gateway, GatewayConfig, Listeners, WorkerListeners, serve, serve_workers};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use upstream::{Behaviour, Upstream, get, open_stream, post, refused_addr, send};

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
const CHAT_STREAM: &str = r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
const COMPLETION: &str = r#"{"model":"m","prompt":"say hi","max_tokens":4}"#;

struct Running {
    gw: Gateway,
    stop: Option<oneshot::Sender<()>>,
}

impl Running {
    fn addr(&self) -> SocketAddr {
        self.gw.http_addr()
    }
    fn admin(&self) -> SocketAddr {
        self.gw.admin_addr().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn yaml(models: &str) -> String {
    format!(
        "auth: none\nretries: {{ maxAttempts: 3 }}\ntimeouts: {{ connectMs: 500, idleMs: 5000 }}\nreloadIntervalMs: 20\nmodels:\n{models}"
    )
}

fn model(name: &str, preset: &str, addrs: &[SocketAddr]) -> String {
    let eps: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    format!(
        "  - name: {name}\n    loraAdapters: [{name}-lora]\n    scheduler: {{ preset: {preset} }}\n    endpoints: [{}]\n",
        eps.join(", ")
    )
}

/// The gateway as `infergate gateway` runs it: two worker threads, each with its own runtime,
/// `SO_REUSEPORT` listener and upstream connections.
async fn start(config: &str) -> Running {
    let config = GatewayConfig::from_yaml(config).unwrap();
    let local = "127.0.0.1:0".parse().unwrap();
    let listeners = WorkerListeners::bind(local, Some(local), 2).unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let gw = serve_workers(config, listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    Running { gw, stop: Some(tx) }
}

async fn eventually<F: Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn json(b: &[u8]) -> serde_json::Value {
    serde_json::from_slice(b).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(b)))
}

#[tokio::test]
async fn non_streaming_chat_and_completions_are_routed_with_headers() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&yaml(&model("m", "round-robin", &[up.addr]))).await;

    let (status, headers, body) = post(gw.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);
    assert_eq!(body, Bytes::from_static(upstream::CHAT_JSON.as_bytes()));
    assert_eq!(
        headers["x-infergate-endpoint"],
        up.addr.to_string().as_str()
    );
    let id = headers["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(id.len(), 32);
    assert_eq!(
        up.seen.last_request_id.lock().unwrap().as_deref(),
        Some(id.as_str())
    );

    // The client's own request id is kept, end to end; completions work the same way.
    let (status, headers, body) = send(
        gw.addr(),
        "POST",
        "/v1/completions",
        COMPLETION,
        &[("x-request-id", "abc-123")],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(json(&body)["choices"][0]["text"], "hello");
    assert_eq!(headers["x-request-id"], "abc-123");
    assert_eq!(
        up.seen.last_request_id.lock().unwrap().as_deref(),
        Some("abc-123")
    );
    assert_eq!(
        up.seen.last_path.lock().unwrap().as_deref(),
        Some("/v1/completions")
    );

    // A LoRA adapter name routes to its base model's pool.
    let (status, _, _) = post(
        gw.addr(),
        "/v1/chat/completions",
        &CHAT.replace("\"m\"", "\"m-lora\""),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(up.requests(), 3);

    // Usage was counted, and every request released its in-flight entry.
    let (_, metrics) = get(gw.admin(), "/metrics").await;
    assert!(
        metrics.contains(r#"infergate_gateway_tokens_total{model="m",direction="in"} 19"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"infergate_gateway_tokens_total{model="m",direction="out"} 8"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"infergate_gateway_requests_total{model="m",code="2xx"} 3"#),
        "{metrics}"
    );
    assert_eq!(gw.gw.handle().inflight("m"), Some(0));
}

#[tokio::test]
async fn streaming_chat_is_passed_through_chunk_by_chunk() {
    let up = Upstream::start(Behaviour::Stepped).await;
    let gw = start(&yaml(&model("m", "round-robin", &[up.addr]))).await;
    let req = http::Request::post(format!("http://{}/v1/chat/completions", gw.addr()))
        .body(Full::new(Bytes::from_static(CHAT_STREAM.as_bytes())))
        .unwrap();
    let resp = upstream::client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    // Each event reaches the client while the upstream is still holding back the next one: the
    // gateway buffers nothing.
    for i in 0..3 {
        let frame = body.frame().await.unwrap().unwrap();
        let data = frame.into_data().unwrap();
        assert!(
            String::from_utf8_lossy(&data).contains(&format!("\"t{i}\"")),
            "{data:?}"
        );
        up.step.notify_one();
    }
    // The first token was seen and timed.
    let (_, metrics) = get(gw.admin(), "/metrics").await;
    assert!(
        metrics.contains(r#"infergate_gateway_ttft_seconds_count{model="m"} 1"#),
        "{metrics}"
    );
    assert_eq!(gw.gw.handle().inflight("m"), Some(1));
    drop(body);
}

#[tokio::test]
async fn a_full_stream_reports_usage_and_completes() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&yaml(&model("m", "round-robin", &[up.addr]))).await;
    let (status, headers, body) = post(gw.addr(), "/v1/chat/completions", CHAT_STREAM).await;
    assert_eq!(status, 200);
    assert_eq!(
        headers["x-infergate-endpoint"],
        up.addr.to_string().as_str()
    );
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("\"hel\"") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
    let (_, metrics) = get(gw.admin(), "/metrics").await;
    assert!(
        metrics.contains(r#"infergate_gateway_tokens_total{model="m",direction="out"} 2"#),
        "{metrics}"
    );
    assert_eq!(gw.gw.handle().inflight("m"), Some(0));
}

#[tokio::test]
async fn client_disconnect_mid_stream_cancels_upstream_and_releases_the_pod() {
    let up = Upstream::start(Behaviour::Stepped).await;
    let gw = start(&yaml(&model("m", "least-request", &[up.addr]))).await;
    let req = http::Request::post(format!("http://{}/v1/chat/completions", gw.addr()))
        .body(Full::new(Bytes::from_static(CHAT_STREAM.as_bytes())))
        .unwrap();
    let resp = upstream::client().request(req).await.unwrap();
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    assert_eq!(gw.gw.handle().inflight("m"), Some(1));
    // The client goes away mid-stream.
    drop(body);
    let handle = gw.gw.handle();
    eventually("the in-flight entry to be released", || {
        let h = handle.clone();
        async move { h.inflight("m") == Some(0) }
    })
    .await;
    eventually("the model server to see the request cancelled", || {
        up.step.notify_one();
        let d = up
            .seen
            .disconnected
            .load(std::sync::atomic::Ordering::SeqCst);
        async move { d }
    })
    .await;
}

#[tokio::test]
async fn a_refused_endpoint_is_retried_on_the_fallback() {
    let good = Upstream::start(Behaviour::Ok).await;
    let dead = refused_addr().await;
    let gw = start(&yaml(&model("m", "round-robin", &[dead, good.addr]))).await;
    for _ in 0..4 {
        let (status, headers, _) = post(gw.addr(), "/v1/chat/completions", CHAT).await;
        assert_eq!(status, 200);
        assert_eq!(
            headers["x-infergate-endpoint"],
            good.addr.to_string().as_str()
        );
    }
    assert_eq!(good.requests(), 4);
    let (_, metrics) = get(gw.admin(), "/metrics").await;
    // Round-robin puts the dead endpoint first on every other request.
    assert!(
        metrics.contains(r#"infergate_gateway_retries_total{model="m"} 2"#),
        "{metrics}"
    );
    assert_eq!(gw.gw.handle().inflight("m"), Some(0));
}

/// A pod that answers 500 to every request while its metrics page is fine: without outlier
/// detection round-robin puts it first on every third request, each paying a round trip
/// before the retry; with `outlierDetection` it is out after `consecutive5xx` failures, the
/// ejection is counted, and a reload that turns it off brings the pod back.
#[tokio::test]
async fn a_pod_failing_every_request_is_ejected_by_outlier_detection() {
    for on in [false, true] {
        let good = [
            Upstream::start(Behaviour::Ok).await,
            Upstream::start(Behaviour::Ok).await,
        ];
        let bad = Upstream::start(Behaviour::Fail500).await;
        let addrs = [bad.addr, good[0].addr, good[1].addr];
        let plain = model("m", "round-robin", &addrs);
        let models = if on {
            plain.replace(
                "{ preset: round-robin }",
                "{ preset: round-robin, outlierDetection: { consecutive5xx: 3, baseEjectionMs: 60000, maxEjectionMs: 60000 } }",
            )
        } else {
            plain.clone()
        };
        let gw = start(&yaml(&models)).await;
        for i in 0..30 {
            let (status, _, body) = post(gw.addr(), "/v1/chat/completions", CHAT).await;
            assert_eq!(
                status,
                200,
                "request {i}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        let (_, metrics) = get(gw.admin(), "/metrics").await;
        let ejections = infergate_testkit::metric(
            &metrics,
            "infergate_pool_endpoint_ejections_total",
            &[("model", "m")],
        );
        assert_eq!(good[0].requests() + good[1].requests(), 30);
        let ejected = |addr: SocketAddr| {
            infergate_testkit::metric(
                &metrics,
                "infergate_pod_ejected",
                &[("pod", &addr.to_string())],
            )
        };
        if on {
            assert_eq!(bad.requests(), 3, "an ejected pod was sent requests");
            assert_eq!(ejections, Some(1.0), "{metrics}");
            assert_eq!(ejected(bad.addr), Some(1.0), "{metrics}");
            assert_eq!(ejected(good[0].addr), Some(0.0), "{metrics}");
            // Off by a reload: the pod is a candidate again at once.
            gw.gw
                .handle()
                .reload(GatewayConfig::from_yaml(&yaml(&plain)).unwrap())
                .unwrap();
            for _ in 0..6 {
                post(gw.addr(), "/v1/chat/completions", CHAT).await;
            }
            assert!(bad.requests() > 3, "{}", bad.requests());
        } else {
            assert_eq!(
                bad.requests(),
                10,
                "round-robin puts it first every third time"
            );
            assert_eq!(ejections, Some(0.0), "{metrics}");
            assert_eq!(ejected(bad.addr), Some(0.0), "{metrics}");
            // Answers are counted per pod with outlier detection off too: each 500 is one.
            let answers = |addr: SocketAddr, result: &str| {
                infergate_testkit::metric(
                    &metrics,
                    "infergate_pod_answers_total",
                    &[("pod", &addr.to_string()), ("result", result)],
                )
            };
            assert_eq!(answers(bad.addr, "failure"), Some(10.0), "{metrics}");
            assert_eq!(answers(bad.addr, "success"), Some(0.0), "{metrics}");
            assert_eq!(
                answers(good[0].addr, "success").zip(answers(good[1].addr, "success")),
                Some((good[0].requests() as f64, good[1].requests() as f64)),
                "{metrics}"
            );
        }
    }
}

/// A pod failing every other request never fails `consecutive5xx` times in a row; with
/// `failurePercentage` the share of failures over an interval ejects it, judged by its first
/// answer after the interval ends.
#[tokio::test]
async fn a_pod_failing_every_other_request_is_ejected_by_failure_percentage() {
    for on in [false, true] {
        let good = [
            Upstream::start(Behaviour::Ok).await,
            Upstream::start(Behaviour::Ok).await,
        ];
        let flaky = Upstream::start(Behaviour::FailEveryOther).await;
        let addrs = [flaky.addr, good[0].addr, good[1].addr];
        let detection = if on {
            "{ consecutive5xx: 3, baseEjectionMs: 60000, maxEjectionMs: 60000, failurePercentage: { threshold: 40, minimumRequests: 4, intervalMs: 1000 } }"
        } else {
            "{ consecutive5xx: 3, baseEjectionMs: 60000, maxEjectionMs: 60000 }"
        };
        let models = model("m", "round-robin", &addrs).replace(
            "{ preset: round-robin }",
            &format!("{{ preset: round-robin, outlierDetection: {detection} }}"),
        );
        let gw = start(&yaml(&models)).await;
        let front = gw.addr();
        let send = |n: usize| async move {
            for i in 0..n {
                let (status, _, body) = post(front, "/v1/chat/completions", CHAT).await;
                assert_eq!(
                    status,
                    200,
                    "request {i}: {}",
                    String::from_utf8_lossy(&body)
                );
            }
        };
        // Round-robin puts the flaky pod first for 8 of 24: 4 failures, 4 successes, by turns.
        // (Within the interval: a second, where 24 requests on loopback take milliseconds.)
        send(24).await;
        assert_eq!(flaky.requests(), 8);
        if on {
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
        send(12).await;
        let (_, metrics) = get(gw.admin(), "/metrics").await;
        let ejections = infergate_testkit::metric(
            &metrics,
            "infergate_pool_endpoint_ejections_total",
            &[("model", "m")],
        );
        let flaky_series = |name: &str, result: Option<&str>| {
            let pod = flaky.addr.to_string();
            let mut labels = vec![("pod", pod.as_str())];
            labels.extend(result.map(|r| ("result", r)));
            infergate_testkit::metric(&metrics, name, &labels)
        };
        let answers = |result| flaky_series("infergate_pod_answers_total", Some(result));
        let share = flaky_series("infergate_pod_failure_percent", None);
        if on {
            // Its first answer after the interval (a failure) closes it: 4 of 8 failed, 50%.
            assert_eq!(flaky.requests(), 9, "an ejected pod was sent requests");
            assert_eq!(ejections, Some(1.0), "{metrics}");
            assert_eq!(share, Some(50.0), "{metrics}");
            assert_eq!(
                (answers("failure"), answers("success")),
                (Some(5.0), Some(4.0))
            );
        } else {
            assert_eq!(flaky.requests(), 12);
            assert_eq!(ejections, Some(0.0), "{metrics}");
            assert_eq!(share, None, "no failurePercentage, no share: {metrics}");
            assert_eq!(
                (answers("failure"), answers("success")),
                (Some(6.0), Some(6.0))
            );
        }
        // Every request answered: the good pods took all but the flaky pod's successes.
        assert_eq!(
            good[0].requests() + good[1].requests() + flaky.requests() / 2,
            36
        );
    }
}

#[tokio::test]
async fn a_5xx_before_any_byte_is_retried_and_the_last_one_passed_through() {
    let good = Upstream::start(Behaviour::Ok).await;
    let bad = Upstream::start(Behaviour::Fail500).await;
    let gw = start(&yaml(
        &(model("m", "round-robin", &[bad.addr, good.addr])
            + &model("solo", "round-robin", &[bad.addr])),
    ))
    .await;
    for _ in 0..4 {
        let (status, _, _) = post(gw.addr(), "/v1/chat/completions", CHAT).await;
        assert_eq!(status, 200);
    }
    assert_eq!((good.requests(), bad.requests()), (4, 2));
    // With no endpoint left to try, the model server's own 5xx reaches the client unchanged.
    let (status, headers, body) = post(
        gw.addr(),
        "/v1/chat/completions",
        &CHAT.replace("\"m\"", "\"solo\""),
    )
    .await;
    assert_eq!(status, 500);
    assert_eq!(json(&body)["error"]["message"], "engine died");
    assert!(
        !headers.contains_key("x-infergate-overloaded"),
        "a model server's overload mark passed on"
    );
    assert_eq!(
        headers["x-infergate-endpoint"],
        bad.addr.to_string().as_str()
    );
}

#[tokio::test]
async fn a_failure_after_the_first_byte_is_passed_through_not_retried() {
    let good = Upstream::start(Behaviour::Ok).await;
    let broken = Upstream::start(Behaviour::AbortMidStream).await;
    let gw = start(&yaml(&model("m", "round-robin", &[broken.addr, good.addr]))).await;
    let mut broken_streams = 0;
    for _ in 0..4 {
        let req = http::Request::post(format!("http://{}/v1/chat/completions", gw.addr()))
            .body(Full::new(Bytes::from_static(CHAT_STREAM.as_bytes())))
            .unwrap();
        let resp = upstream::client().request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let from = resp.headers()["x-infergate-endpoint"]
            .to_str()
            .unwrap()
            .to_owned();
        match resp.into_body().collect().await {
            Ok(_) => assert_eq!(from, good.addr.to_string()),
            Err(_) => {
                assert_eq!(from, broken.addr.to_string());
                broken_streams += 1;
            }
        }
    }
    // Every request reached exactly one model server: nothing was sent twice.
    assert_eq!(broken_streams, 2);
    assert_eq!((broken.requests(), good.requests()), (2, 2));
    let (_, metrics) = get(gw.admin(), "/metrics").await;
    assert!(
        metrics.contains(r#"infergate_gateway_retries_total{model="m"} 0"#),
        "{metrics}"
    );
    assert_eq!(gw.gw.handle().inflight("m"), Some(0));
}

#[tokio::test]
async fn a_first_byte_timeout_is_504_and_not_retried() {
    let hung = Upstream::start(Behaviour::Hang).await;
    let good = Upstream::start(Behaviour::Ok).await;
    let config = format!(
        "auth: none\ntimeouts: {{ firstByteMs: 200 }}\nmodels:\n{}",
        model("m", "round-robin", &[hung.addr, good.addr])
    );
    let gw = start(&config).await;
    let mut timeouts = 0;
    for _ in 0..2 {
        let (status, _, body) = post(gw.addr(), "/v1/chat/completions", CHAT).await;
        if status == 504 {
            assert_eq!(json(&body)["error"]["code"], "upstream_timeout");
            timeouts += 1;
        } else {
            assert_eq!(status, 200);
        }
    }
    // The model server may still be working on it: the request is not sent a second time.
    assert_eq!(timeouts, 1);
    assert_eq!((hung.requests(), good.requests()), (1, 1));
    assert_eq!(gw.gw.handle().inflight("m"), Some(0));
}

#[tokio::test]
async fn bad_requests_get_clear_json_errors() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&format!(
        "limits: {{ maxRequestBodyBytes: 1000 }}\n{}",
        yaml(&model("m", "round-robin", &[up.addr]))
    ))
    .await;
    let cases: [(&str, &str, &str, u16, &str); 7] = [
        (
            "POST",
            "/v1/chat/completions",
            "{not json",
            400,
            "invalid_json",
        ),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"messages":[]}"#,
            400,
            "missing_model",
        ),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}"#,
            404,
            "model_not_found",
        ),
        (
            "POST",
            "/v1/completions",
            r#"{"model":"m","stream":"yes","prompt":"x"}"#,
            400,
            "invalid_field",
        ),
        ("GET", "/v1/chat/completions", "", 405, "method_not_allowed"),
        ("POST", "/v2/whatever", "{}", 404, "not_found"),
        (
            "POST",
            "/v1/chat/completions",
            &"x".repeat(1001),
            413,
            "body_too_large",
        ),
    ];
    for (method, path, body, status, code) in cases {
        let (s, headers, b) = send(gw.addr(), method, path, body, &[]).await;
        assert_eq!(s.as_u16(), status, "{method} {path} {body}");
        assert_eq!(headers["content-type"], "application/json");
        assert!(headers.contains_key("x-request-id"));
        let v = json(&b);
        assert_eq!(v["error"]["code"], code, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().len() > 10, "{v}");
    }
    // The unknown-model answer tells the client what to do.
    let (_, _, b) = post(
        gw.addr(),
        "/v1/chat/completions",
        &CHAT.replace("\"m\"", "\"gpt-9\""),
    )
    .await;
    let msg = json(&b)["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        msg.contains("gpt-9") && msg.contains("`model` field") && msg.contains("m-lora"),
        "{msg}"
    );

    // A chunked body with no length is cut off at the limit too.
    let chunks = futures_stream(vec![
        Bytes::from(vec![b' '; 600]),
        Bytes::from(vec![b' '; 600]),
    ]);
    let req = http::Request::post(format!("http://{}/v1/chat/completions", gw.addr()))
        .body(chunks)
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 413);

    // A client that waits for `100 Continue` before sending a body over the limit (curl does
    // above 1 MiB) gets the 413 at once, never told to send the body it would be refused for.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
        s.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
              content-length: 1500\r\nexpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
        let mut head = vec![0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut head))
            .await
            .expect("an answer before the body is sent")
            .unwrap();
        let head = String::from_utf8_lossy(&head[..n]).into_owned();
        assert!(head.starts_with("HTTP/1.1 413 "), "{head}");
    }
    assert_eq!(up.requests(), 0);
}

/// A request body of several chunks and no `content-length`.
fn futures_stream(chunks: Vec<Bytes>) -> http_body_util::StreamBody<ChunkIter> {
    http_body_util::StreamBody::new(ChunkIter(chunks.into_iter()))
}

struct ChunkIter(std::vec::IntoIter<Bytes>);

impl futures_util::Stream for ChunkIter {
    type Item = Result<http_body::Frame<Bytes>, std::convert::Infallible>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::task::Poll::Ready(self.0.next().map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// A path the gateway serves, asked with another method, is a 405 whose `Allow` header and
/// message name the methods it takes, `OPTIONS` included since the gateway answers it (RFC 9110
/// §15.5.6); an unknown path stays a 404.
#[tokio::test]
async fn a_wrong_method_is_405_naming_the_allowed_one() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&yaml(&model("m", "round-robin", &[up.addr]))).await;
    for (method, path, allowed) in [
        ("GET", "/v1/chat/completions", "POST, OPTIONS"),
        ("POST", "/v1/models", "GET, HEAD, OPTIONS"),
        ("DELETE", "/v1/models", "GET, HEAD, OPTIONS"),
        ("PUT", "/v1/models/m", "GET, HEAD, OPTIONS"),
    ] {
        let (s, headers, b) = send(gw.addr(), method, path, "{}", &[]).await;
        assert_eq!(s, 405, "{method} {path}");
        assert_eq!(headers["allow"], allowed, "{method} {path}");
        let v = json(&b);
        assert_eq!(v["error"]["code"], "method_not_allowed", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("which takes {allowed}")), "{msg}");
    }
    let (s, headers, b) = send(gw.addr(), "POST", "/v2/whatever", "{}", &[]).await;
    assert_eq!(s, 404);
    assert!(!headers.contains_key("allow"));
    assert_eq!(json(&b)["error"]["code"], "not_found");
    assert_eq!(up.requests(), 0);
}

/// What `OPTIONS` answers for each request target: 204 with `Allow` (RFC 9110 §9.3.7).
const OPTIONS_CASES: [(&str, &str); 6] = [
    ("*", "GET, HEAD, POST, OPTIONS"),
    ("/v1/chat/completions", "POST, OPTIONS"),
    ("/v1/embeddings/", "POST, OPTIONS"),
    ("/v1/models", "GET, HEAD, OPTIONS"),
    ("/models", "GET, HEAD, OPTIONS"),
    ("/v1/models/meta-llama/Llama-3.1-8B", "GET, HEAD, OPTIONS"),
];

/// `OPTIONS *` and `OPTIONS` on a path the gateway serves are answered 204 with the methods the
/// target takes, over HTTP/1.1 (the asterisk form sent as is) and h2c, a browser's CORS
/// preflight included: without a CORS setting it gets no `Access-Control-*` header, so the
/// browser does not let its page call. A path the gateway does not serve stays a 404.
#[tokio::test]
async fn options_is_204_naming_the_methods_the_target_takes() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&yaml(&model("m", "round-robin", &[up.addr]))).await;
    let mut h1 = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    for (target, allow) in OPTIONS_CASES {
        // One keep-alive connection for every case: a 204 has no body to frame.
        let head = infergate_testkit::options_preflight(&mut h1, target).await;
        assert!(head.starts_with("http/1.1 204 "), "{target}: {head}");
        assert!(head.contains(&format!("\r\nallow: {}\r\n", allow.to_ascii_lowercase())));
        assert!(head.contains("\r\nx-request-id: "), "{target}: {head}");
        assert!(!head.contains("access-control-"), "{target}: {head}");
    }
    let stream = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    let (mut h2, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    for (target, allow) in OPTIONS_CASES {
        let uri = http::Uri::builder()
            .scheme("http")
            .authority(gw.addr().to_string())
            .path_and_query(target)
            .build()
            .unwrap();
        let req = http::Request::options(uri)
            .header("origin", "https://app.example")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = h2.send_request(req).await.unwrap();
        assert_eq!(resp.version(), http::Version::HTTP_2);
        assert_eq!(resp.status(), 204, "{target}");
        assert_eq!(resp.headers()["allow"], allow, "{target}");
        assert!(
            !resp
                .headers()
                .keys()
                .any(|k| k.as_str().starts_with("access-control-")),
            "{target}"
        );
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(body.is_empty(), "{target}: {body:?}");
    }
    let (s, _, b) = send(gw.addr(), "OPTIONS", "/v2/whatever", "", &[]).await;
    assert_eq!(s, 404);
    assert_eq!(json(&b)["error"]["code"], "not_found");
    assert_eq!(up.requests(), 0);
}

/// `HEAD /v1/models` is answered as `GET` without the body (RFC 9110 §9.3.2), over HTTP/1.1
/// and h2c: what a health checker probing the model list sends.
#[tokio::test]
async fn head_on_the_model_list_is_its_get_without_the_body() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&yaml(&model("m", "round-robin", &[up.addr]))).await;
    let (s, got, body) = send(gw.addr(), "GET", "/v1/models", "", &[]).await;
    assert_eq!(s, 200);
    let (s, head, empty) = send(gw.addr(), "HEAD", "/v1/models", "", &[]).await;
    assert_eq!(s, 200);
    assert!(empty.is_empty(), "{empty:?}");
    assert_eq!(head["content-length"], body.len().to_string().as_str());
    assert_eq!(head["content-type"], got["content-type"]);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let req = http::Request::head(format!("http://{}/v1/models", gw.addr()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let h2_body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(h2_body.is_empty(), "{h2_body:?}");
    assert_eq!(up.requests(), 0);
}

/// A compressed body is refused 415 before it is read, naming the coding, and reaches no model
/// server; `identity` is no coding.
#[tokio::test]
async fn a_compressed_body_is_415_before_it_is_read() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&yaml(&model("m", "round-robin", &[up.addr]))).await;
    let gzip = [("content-encoding", "gzip")];
    let (s, headers, b) = send(gw.addr(), "POST", "/v1/chat/completions", CHAT, &gzip).await;
    assert_eq!(s, 415, "{}", String::from_utf8_lossy(&b));
    assert_eq!(headers["content-type"], "application/json");
    let v = json(&b);
    assert_eq!(v["error"]["code"], "unsupported_content_encoding", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`gzip`"),
        "{v}"
    );
    assert_eq!(up.requests(), 0);
    let identity = [("content-encoding", "identity")];
    let (s, _, _) = send(gw.addr(), "POST", "/v1/chat/completions", CHAT, &identity).await;
    assert_eq!(s, 200);
    let (_, metrics) = get(gw.admin(), "/metrics").await;
    assert!(
        metrics.contains(
            r#"infergate_gateway_rejections_total{reason="unsupported_content_encoding"} 1"#
        ),
        "{metrics}"
    );
}

/// A body chunked under another transfer coding (`gzip, chunked`) is refused 501 before it is
/// read, naming the coding, and reaches no model server; `chunked` alone is served.
#[tokio::test]
async fn a_transfer_coding_other_than_chunked_is_501() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&yaml(&model("m", "round-robin", &[up.addr]))).await;
    let gzip = [("transfer-encoding", "gzip, chunked")];
    let (s, headers, b) = send(gw.addr(), "POST", "/v1/chat/completions", CHAT, &gzip).await;
    assert_eq!(s, 501, "{}", String::from_utf8_lossy(&b));
    assert_eq!(headers["content-type"], "application/json");
    let v = json(&b);
    assert_eq!(v["error"]["code"], "unsupported_transfer_encoding", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`gzip, chunked`"),
        "{v}"
    );
    assert_eq!(up.requests(), 0);
    let chunked = [("transfer-encoding", "chunked")];
    let (s, _, b) = send(gw.addr(), "POST", "/v1/chat/completions", CHAT, &chunked).await;
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
    assert_eq!(up.requests(), 1);
    let (_, metrics) = get(gw.admin(), "/metrics").await;
    assert!(
        metrics.contains(
            r#"infergate_gateway_rejections_total{reason="unsupported_transfer_encoding"} 1"#
        ),
        "{metrics}"
    );
}

/// Headers the `Connection` header names are hop-by-hop (RFC 9110 §7.6.1): neither the client's
/// nor the model server's reach the other side, whichever `Connection` line names them and in
/// whatever case; the other headers do.
#[tokio::test]
async fn headers_named_by_connection_are_not_forwarded_either_way() {
    use infergate_testkit::recorder::{HOP_REQUEST_HEADERS, HOP_RESPONSE_HEADERS, Recorder};
    let up = Recorder::start(&HOP_RESPONSE_HEADERS).await;
    let gw = start(&yaml(&model("m", "round-robin", &[up.addr]))).await;
    let (status, headers, body) = send(
        gw.addr(),
        "POST",
        "/v1/chat/completions",
        CHAT,
        &HOP_REQUEST_HEADERS,
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    up.assert_hop_by_hop_dropped(&headers);
}

#[tokio::test]
async fn the_upstream_request_is_in_origin_form_with_the_endpoint_as_host() {
    use infergate_testkit::recorder::Recorder;
    let up = Recorder::start(&[]).await;
    let gw = start(&yaml(&model("m", "round-robin", &[up.addr]))).await;
    let (status, _, body) = send(
        gw.addr(),
        "POST",
        "/v1/chat/completions?x=1",
        CHAT,
        &[("host", "gateway.example")],
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let heads = up.heads();
    let head = heads.last().expect("one model request");
    let mut lines = head.split("\r\n");
    assert_eq!(
        lines.next(),
        Some("POST /v1/chat/completions?x=1 HTTP/1.1"),
        "{head}"
    );
    let hosts: Vec<&str> = lines
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.eq_ignore_ascii_case("host"))
        .map(|(_, v)| v.trim())
        .collect();
    assert_eq!(hosts, [up.addr.to_string()], "{head}");

    // The gateway takes an API path with one trailing slash; the model server gets the API's
    // own path (vLLM redirects the slashed one to its own address, others have no route).
    for (sent, forwarded) in [
        (
            "/v1/chat/completions/",
            "POST /v1/chat/completions HTTP/1.1",
        ),
        (
            "/v1/chat/completions/?x=1",
            "POST /v1/chat/completions?x=1 HTTP/1.1",
        ),
    ] {
        let (status, _, body) = send(gw.addr(), "POST", sent, CHAT, &[]).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let heads = up.heads();
        let head = heads.last().expect("one model request");
        assert_eq!(head.split("\r\n").next(), Some(forwarded), "{head}");
    }
}

#[tokio::test]
async fn models_are_listed() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&yaml(
        &(model("m", "round-robin", &[up.addr]) + &model("q", "infergate", &[up.addr])),
    ))
    .await;
    let (status, body) = get(gw.addr(), "/v1/models").await;
    assert_eq!(status, 200);
    let v = json(body.as_bytes());
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["m", "m-lora", "q", "q-lora"]);
    assert_eq!(v["data"][1]["root"], "m");
    // vLLM's shape: an adapter's `parent` is its base model, a base model's is null.
    assert_eq!(v["data"][1]["parent"], "m");
    assert!(v["data"][0]["parent"].is_null(), "{v}");
    assert!(v["data"][2]["parent"].is_null(), "{v}");
    assert_eq!(v["data"][3]["parent"], "q");
    // The retrieve answers the list's entry.
    let (status, body) = get(gw.addr(), "/v1/models/q-lora").await;
    assert_eq!(status, 200);
    assert_eq!(json(body.as_bytes()), v["data"][3], "{body}");
}

#[tokio::test]
async fn no_endpoint_is_503_and_a_saturated_pool_is_429_with_retry_after() {
    let up = Upstream::start(Behaviour::Ok).await;
    up.waiting.store(1_000, std::sync::atomic::Ordering::SeqCst);
    let gw = start(&yaml(
        &(model("m", "infergate", &[up.addr]) + "  - name: empty\n    endpoints: []\n"),
    ))
    .await;
    let (status, headers, body) = post(
        gw.addr(),
        "/v1/chat/completions",
        &CHAT.replace("\"m\"", "\"empty\""),
    )
    .await;
    assert_eq!(status, 503);
    assert!(!headers.contains_key("retry-after"));
    assert_eq!(json(&body)["error"]["code"], "no_endpoints");

    // Once the scraped queue says every pod is overloaded, standard requests are shed.
    let admin = gw.admin();
    eventually("the pool's metrics to be scraped", || async move {
        let (_, m) = get(admin, "/metrics").await;
        m.contains("infergate_metrics_scrape_duration_seconds_count{model=\"m\"} ")
            && !m.contains("infergate_metrics_scrape_duration_seconds_count{model=\"m\"} 0")
    })
    .await;
    let (status, headers, body) = post(gw.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    let secs: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(secs >= 1);
    assert_eq!(json(&body)["error"]["type"], "rate_limit_error");
    assert_eq!(up.requests(), 0);
    let (_, m) = get(admin, "/metrics").await;
    assert!(
        m.contains(r#"infergate_gateway_rejections_total{reason="shed"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"infergate_gateway_rejections_total{reason="no_endpoints"} 1"#),
        "{m}"
    );
}

#[tokio::test]
async fn max_concurrent_requests_answers_429_with_retry_after_and_follows_reloads() {
    let up = Upstream::start(Behaviour::Stepped).await;
    let limited = |n: u32| {
        yaml(
            &(model("m", "round-robin", &[up.addr])
                + &format!("    limits: {{ maxConcurrentRequests: {n} }}\n")),
        )
    };
    let gw = start(&limited(1)).await;

    let first = open_stream(gw.addr(), "m").await;
    // The model's one slot is taken: plain and adapter requests alike are turned away.
    for name in ["m", "m-lora"] {
        let (status, headers, body) = post(
            gw.addr(),
            "/v1/chat/completions",
            &CHAT.replace("\"m\"", &format!("\"{name}\"")),
        )
        .await;
        assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
        assert_eq!(headers["retry-after"], "1");
        assert_eq!(json(&body)["error"]["type"], "rate_limit_error");
    }
    assert_eq!(up.requests(), 1);
    let (_, m) = get(gw.admin(), "/metrics").await;
    assert!(
        m.contains(r#"infergate_gateway_rejections_total{reason="concurrency_limit"} 2"#),
        "{m}"
    );

    // A reload to two slots keeps counting the request already running.
    let config = GatewayConfig::from_yaml(&limited(2)).unwrap();
    gw.gw.handle().reload(config).unwrap();
    let second = open_stream(gw.addr(), "m").await;
    assert_eq!(post(gw.addr(), "/v1/chat/completions", CHAT).await.0, 429);

    // Clients leaving free their slots.
    drop(first);
    drop(second);
    let addr = gw.addr();
    eventually("a slot to be free again", || async move {
        let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
            .body(Full::new(Bytes::from_static(CHAT_STREAM.as_bytes())))
            .unwrap();
        upstream::client().request(req).await.unwrap().status() == 200
    })
    .await;
}

#[tokio::test]
async fn pools_started_by_a_reload_export_their_metrics_and_removed_ones_stop() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&yaml(&model("m", "round-robin", &[up.addr]))).await;
    let admin = gw.admin();
    let scraped = |m: &str, model: &str| {
        m.lines().any(|l| {
            l.starts_with(&format!(
                "infergate_metrics_scrape_duration_seconds_count{{model=\"{model}\"}} "
            )) && !l.ends_with(" 0")
        })
    };
    eventually("model m's scrapes in /metrics", || async move {
        scraped(&get(admin, "/metrics").await.1, "m")
    })
    .await;

    let config = GatewayConfig::from_yaml(&yaml(&model("n", "round-robin", &[up.addr]))).unwrap();
    gw.gw.handle().reload(config).unwrap();
    eventually("model n's scrapes in /metrics", || async move {
        scraped(&get(admin, "/metrics").await.1, "n")
    })
    .await;
    let (_, m) = get(admin, "/metrics").await;
    assert!(m.contains("infergate_pool_endpoints{model=\"n\"} 1"), "{m}");
    // The removed pool's series go with it (the gateway's own per-model counters stay, as
    // counters do).
    assert!(!m.contains("infergate_pool_endpoints{model=\"m\"}"), "{m}");
    assert!(
        !m.contains("scrape_duration_seconds_count{model=\"m\"}"),
        "{m}"
    );
    assert!(
        m.contains("infergate_gateway_config_reloads_total{result=\"ok\"} 1"),
        "{m}"
    );
    assert!(m.ends_with("# EOF\n"), "{m}");
}

#[tokio::test]
async fn every_metric_family_appears_once_with_several_models() {
    let up = Upstream::start(Behaviour::Ok).await;
    let two = yaml(&format!(
        "{}{}",
        model("m", "round-robin", &[up.addr]),
        model("n", "round-robin", &[up.addr])
    ));
    let gw = start(&two).await;
    let admin = gw.admin();
    eventually("both models' pools in /metrics", || async move {
        let m = get(admin, "/metrics").await.1;
        m.contains("infergate_pool_endpoints{model=\"m\"} 1")
            && m.contains("infergate_pool_endpoints{model=\"n\"} 1")
    })
    .await;
    let (_, m) = get(admin, "/metrics").await;
    let mut seen = std::collections::HashSet::new();
    for line in m.lines().filter(|l| l.starts_with("# TYPE ")) {
        assert!(seen.insert(line), "family declared twice: {line}\n{m}");
    }
    // Each family's samples follow its own metadata: no sample of a family after another began.
    let mut current = String::new();
    let mut closed = std::collections::HashSet::new();
    for line in m.lines().filter(|l| !l.is_empty() && *l != "# EOF") {
        let name = match line.strip_prefix("# ") {
            Some(meta) => meta.split(' ').nth(1).unwrap_or_default().to_owned(),
            None => continue,
        };
        if name != current {
            assert!(
                closed.insert(current.clone()),
                "family {current} split\n{m}"
            );
            current = name;
        }
    }
}

#[tokio::test]
async fn admin_port_serves_health_and_readiness() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&yaml(&model("m", "round-robin", &[up.addr]))).await;
    assert_eq!(get(gw.admin(), "/healthz").await.0, 200);
    let admin = gw.admin();
    eventually("readiness", || async move {
        get(admin, "/readyz").await.0 == 200
    })
    .await;
    let (_, m) = get(admin, "/metrics").await;
    // Before any reload, both results are exported at 0: an alert on errors has a series.
    for line in [
        r#"infergate_gateway_config_reloads_total{result="ok"} 0"#,
        r#"infergate_gateway_config_reloads_total{result="error"} 0"#,
    ] {
        assert!(m.lines().any(|l| l == line), "{line} missing in\n{m}");
    }
}

#[tokio::test]
async fn h2c_clients_are_served() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&yaml(&model("m", "round-robin", &[up.addr]))).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = http::Request::post(format!("http://{}/v1/chat/completions", gw.addr()))
        .body(Full::new(Bytes::from_static(CHAT.as_bytes())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, Bytes::from_static(upstream::CHAT_JSON.as_bytes()));
}

#[tokio::test]
async fn config_reload_applies_good_files_and_rejects_bad_ones() {
    let a = Upstream::start(Behaviour::Ok).await;
    let b = Upstream::start(Behaviour::Ok).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, yaml(&model("m", "round-robin", &[a.addr]))).unwrap();
    let gw = start(&std::fs::read_to_string(&path).unwrap()).await;
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let watcher = gw.gw.handle().watch_file(path.clone(), async move {
        let _ = stop_rx.await;
    });

    // A new model and a moved endpoint take effect without a restart.
    std::fs::write(
        &path,
        yaml(&(model("m", "round-robin", &[b.addr]) + &model("n", "round-robin", &[a.addr]))),
    )
    .unwrap();
    let addr = gw.addr();
    eventually("the new model to be served", || async move {
        post(
            addr,
            "/v1/chat/completions",
            &CHAT.replace("\"m\"", "\"n\""),
        )
        .await
        .0 == 200
    })
    .await;
    let (_, headers, _) = post(addr, "/v1/chat/completions", CHAT).await;
    assert_eq!(headers["x-infergate-endpoint"], b.addr.to_string().as_str());

    // A broken file is rejected with the line at fault, and the running configuration stays.
    std::fs::write(
        &path,
        "models:\n  - name: m\n    endpoints: [not-an-address]\nauth: none\n",
    )
    .unwrap();
    let err = gw.gw.handle().reload_file(&path).unwrap_err();
    // The parser's message is the error's cause (`invalid gateway configuration: …`).
    let err = infergate_pool::ErrorChain(&err).to_string();
    assert!(
        err.contains("not-an-address") && err.contains("line 3"),
        "{err}"
    );
    let admin = gw.admin();
    eventually("the watcher to reject the file", || async move {
        let (_, m) = get(admin, "/metrics").await;
        m.contains(r#"infergate_gateway_config_reloads_total{result="error"} 2"#)
    })
    .await;
    assert_eq!(
        post(
            addr,
            "/v1/chat/completions",
            &CHAT.replace("\"m\"", "\"n\"")
        )
        .await
        .0,
        200
    );
    let _ = stop_tx.send(());
    watcher.await.unwrap();
}

#[tokio::test]
async fn workers_share_the_port_and_stop_accepting_at_shutdown() {
    let up = Upstream::start(Behaviour::Ok).await;
    let config = GatewayConfig::from_yaml(&yaml(&model("m", "round-robin", &[up.addr]))).unwrap();
    let local = "127.0.0.1:0".parse().unwrap();
    let listeners = WorkerListeners::bind(local, None, 3).unwrap();
    assert_eq!(listeners.http.len(), 3);
    let (tx, rx) = oneshot::channel::<()>();
    let gw = serve_workers(config, listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let addr = gw.http_addr();
    // New connections land on any of the workers; every one of them serves.
    for _ in 0..12 {
        assert_eq!(post(addr, "/v1/chat/completions", CHAT).await.0, 200);
    }
    assert_eq!(up.requests(), 12);
    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), gw.wait())
        .await
        .unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// The workers' `SO_REUSEPORT` sockets share one port; a second gateway on a port already
/// served must not join them (it would take a share of the first one's connections).
#[test]
fn a_port_already_served_is_refused_not_shared() {
    let local = "127.0.0.1:0".parse().unwrap();
    let first = WorkerListeners::bind(local, None, 2).unwrap();
    let addr = first.http[0].local_addr().unwrap();
    let e = WorkerListeners::bind(addr, None, 2).unwrap_err();
    let text = format!("{e}: {:?}", std::error::Error::source(&e));
    assert!(
        text.contains(&addr.to_string()) && text.contains("in use"),
        "{text}"
    );
    // A port another program listens on, without `SO_REUSEPORT`, as before.
    let other = std::net::TcpListener::bind(local).unwrap();
    assert!(WorkerListeners::bind(other.local_addr().unwrap(), None, 2).is_err());
    // Free again once the first gateway's sockets are closed.
    drop(first);
    WorkerListeners::bind(addr, None, 2).unwrap();
}

#[tokio::test]
async fn no_front_door_listener_is_an_error() {
    let up = Upstream::start(Behaviour::Ok).await;
    let config = GatewayConfig::from_yaml(&yaml(&model("m", "round-robin", &[up.addr]))).unwrap();
    let listeners = WorkerListeners {
        http: Vec::new(),
        admin: None,
    };
    let err = serve_workers(config, listeners, async {})
        .await
        .err()
        .unwrap();
    let err = infergate_pool::ErrorChain(&err).to_string();
    assert!(err.contains("at least one worker"), "{err}");
}

/// `serve`: one accept loop on the caller's runtime, the same request path.
#[tokio::test]
async fn shutdown_stops_accepting() {
    let up = Upstream::start(Behaviour::Ok).await;
    let config = GatewayConfig::from_yaml(&yaml(&model("m", "round-robin", &[up.addr]))).unwrap();
    let listeners = Listeners {
        http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        admin: None,
    };
    let (tx, rx) = oneshot::channel::<()>();
    let gw = serve(config, listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let addr = gw.http_addr();
    assert_eq!(post(addr, "/v1/chat/completions", CHAT).await.0, 200);
    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), gw.wait())
        .await
        .unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
