//! The live emulator over real sockets on 127.0.0.1: OpenAI API, metrics pages, faults, and
//! agreement with the discrete-event fleet (on tokio's paused clock).

// Test helpers panic on purpose: a failed call is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use infergate_sim::{
    Catalog, EngineKind, Faults, Fleet, FleetSpec, MetricsFault, POD_HEADER, PodSpec, Prompt,
    Request, ServedFleet, serve_fleet,
};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::time::Instant;

struct Reply {
    status: u16,
    pod: String,
    body: String,
    /// Arrival time of each SSE event (relative to the request's start).
    events: Vec<(Duration, String)>,
}

async fn call(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Reply {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "sim")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        )))
        .unwrap();
    let start = Instant::now();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let pod = resp
        .headers()
        .get(POD_HEADER)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let mut body = resp.into_body();
    let mut text = String::new();
    let mut events = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap();
        if let Some(data) = frame.data_ref() {
            text.push_str(std::str::from_utf8(data).unwrap());
            while let Some(end) = text[events_len(&events)..].find("\n\n") {
                let from = events_len(&events);
                let ev = text[from..from + end + 2].to_owned();
                events.push((start.elapsed(), ev));
            }
        }
    }
    Reply {
        status,
        pod,
        body: text,
        events,
    }
}

fn events_len(events: &[(Duration, String)]) -> usize {
    events.iter().map(|(_, e)| e.len()).sum()
}

fn json_of(r: &Reply) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body))
}

fn profile(id: &str) -> infergate_sim::Profile {
    Catalog::builtin().unwrap().get(id).unwrap().clone()
}

async fn serve(pods: Vec<PodSpec>) -> (ServedFleet, tokio::sync::oneshot::Sender<()>) {
    let spec = FleetSpec { seed: 1, pods }.finish().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let fleet = serve_fleet(&spec, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    (fleet, tx)
}

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// A request without `model` (or with `null`) is served by the base model, as vLLM serves it;
/// a `model` that is not a string is refused naming it.
#[tokio::test(start_paused = true)]
async fn a_request_without_a_model_is_served_by_the_base_model() {
    let (fleet, stop) = serve(vec![PodSpec::new(
        "pod-a",
        &profile("llama-3.1-8b/h100"),
        EngineKind::Vllm,
    )])
    .await;
    let addr = fleet.pods[0].addr;
    let messages = json!([{"role": "user", "content": "hello"}]);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": messages, "max_tokens": 2}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": null, "messages": messages, "max_tokens": 2}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hello", "max_tokens": 2}),
        ),
        (
            "/v1/chat/completions/render",
            json!({"messages": messages, "max_tokens": 2}),
        ),
    ] {
        let r = call(addr, "POST", path, Some(body.clone())).await;
        assert_eq!(r.status, 200, "{path} {body}: {}", r.body);
        let v = json_of(&r);
        assert_eq!(v["model"], MODEL, "{path} {body}");
    }
    let r = call(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(json!({"model": 7, "messages": messages})),
    )
    .await;
    assert_eq!(
        (r.status, json_of(&r)["error"]["param"].as_str()),
        (400, Some("model"))
    );
    let _ = stop.send(());
    fleet.wait().await;
}

/// vLLM mixes a request's `cache_salt` into its first block's hash, so the same prompt under
/// two salts (or a salt and none) shares no cached block, while requests with one salt do; its
/// request models refuse a salt that is not a non-empty string (`check_cache_salt_support`).
#[tokio::test(start_paused = true)]
async fn a_cache_salt_isolates_the_prefix_cache() {
    let (fleet, stop) = serve(vec![PodSpec::new(
        "pod-a",
        &profile("llama-3.1-8b/h100"),
        EngineKind::Vllm,
    )])
    .await;
    let addr = fleet.pods[0].addr;
    let long = "y".repeat(4 * 2000);
    let cached = |path: &'static str, salt: Value| {
        let mut body = match path {
            "/v1/completions" => json!({"model": MODEL, "prompt": long, "max_tokens": 1}),
            _ => json!({"model": MODEL, "max_tokens": 1,
                        "messages": [{"role": "user", "content": long}]}),
        };
        if !salt.is_null() {
            body["cache_salt"] = salt;
        }
        async move {
            let (status, v) = post(addr, path, body).await;
            assert_eq!(status, 200, "{v}");
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        }
    };
    for path in ["/v1/completions", "/v1/chat/completions"] {
        assert_eq!(cached(path, json!("tenant-a")).await, 0, "{path}: cold");
        assert!(
            cached(path, json!("tenant-a")).await >= 1984,
            "{path}: a salt hits its own blocks"
        );
        assert_eq!(
            cached(path, json!("tenant-b")).await,
            0,
            "{path}: another salt"
        );
        assert_eq!(cached(path, Value::Null).await, 0, "{path}: no salt");
        assert!(cached(path, Value::Null).await >= 1984, "{path}: unsalted");
        assert!(cached(path, json!("tenant-b")).await >= 1984, "{path}");
        assert!(cached(path, json!("tenant-a")).await >= 1984, "{path}");
    }
    // A salt that is not a non-empty string is refused with vLLM's message, on every API.
    let messages = json!([{"role": "user", "content": "hello"}]);
    for salt in [
        json!(""),
        json!(7),
        json!(["a"]),
        json!({"a": 1}),
        json!(true),
    ] {
        for (path, mut body) in [
            ("/v1/completions", json!({"model": MODEL, "prompt": "hi"})),
            (
                "/v1/chat/completions",
                json!({"model": MODEL, "messages": messages}),
            ),
            (
                "/v1/chat/completions/render",
                json!({"model": MODEL, "messages": messages}),
            ),
            ("/v1/responses", json!({"model": MODEL, "input": "hi"})),
        ] {
            body["cache_salt"] = salt.clone();
            let (status, v) = post(addr, path, body).await;
            assert_client_error(status, &v, 400, Some("cache_salt"));
            assert_eq!(
                v["error"]["message"],
                "Parameter 'cache_salt' must be a non-empty string if provided.",
                "{path} {salt}"
            );
        }
    }
    // `null` is no salt; the render endpoint hands the salt on as it came.
    let (status, v) = post(
        addr,
        "/v1/chat/completions/render",
        json!({"model": MODEL, "messages": messages, "cache_salt": null}),
    )
    .await;
    assert_eq!((status, &v["cache_salt"]), (200, &Value::Null), "{v}");
    let (status, v) = post(
        addr,
        "/v1/chat/completions/render",
        json!({"model": MODEL, "messages": messages, "cache_salt": "tenant-a"}),
    )
    .await;
    assert_eq!((status, &v["cache_salt"]), (200, &json!("tenant-a")), "{v}");
    let _ = stop.send(());
    fleet.wait().await;
}

#[tokio::test(start_paused = true)]
async fn live_and_virtual_clocks_agree() {
    let pods = vec![
        PodSpec::new("h100", &profile("llama-3.1-8b/h100"), EngineKind::Vllm),
        PodSpec::new("a10g", &profile("llama-3.1-8b/a10g"), EngineKind::Vllm),
    ];
    let spec = FleetSpec {
        seed: 1,
        pods: pods.clone(),
    }
    .finish()
    .unwrap();
    // A fixed workload: (arrival ms, pod, prompt bytes, output tokens), overlapping on both pods.
    let work: Vec<(u64, usize, usize, u32)> = (0..24u64)
        .map(|i| {
            (
                i * 37 % 400 + i * 5,
                (i % 2) as usize,
                400 + (i as usize * 613) % 6000,
                8 + (i as u32 * 7) % 40,
            )
        })
        .collect();
    let prompt = |i: usize, bytes: usize| format!("{i:04}") + &"lorem ipsum ".repeat(bytes / 12);

    // Virtual clock.
    let mut des = Fleet::new(&spec).unwrap();
    let mut order: Vec<usize> = (0..work.len()).collect();
    order.sort_by_key(|&i| work[i].0);
    for &i in &order {
        let (at, pod, bytes, out) = work[i];
        des.submit(
            pod,
            Request {
                id: i as u64,
                arrival: at as f64 / 1e3,
                prompt: Prompt::Text(prompt(i, bytes).into()),
                max_tokens: out,
                lora: None,
            },
        )
        .unwrap();
    }
    des.run_until_idle();
    let mut virt = des.completions().to_vec();
    virt.sort_by_key(|c| c.id);

    // Real (paused) clock over HTTP.
    let (fleet, stop) = serve(pods).await;
    let addrs = fleet.addrs();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (i, &(at, pod, bytes, out)) in work.iter().enumerate() {
        let addr = addrs[pod].1;
        let body =
            json!({"model": MODEL, "prompt": prompt(i, bytes), "max_tokens": out, "stream": true});
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(t0 + Duration::from_millis(at)).await;
            let sent = t0.elapsed();
            let r = call(addr, "POST", "/v1/completions", Some(body)).await;
            (sent, r)
        }));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        let (sent, r) = task.await.unwrap();
        assert_eq!(r.status, 200);
        let tokens: Vec<Duration> = r
            .events
            .iter()
            .filter(|(_, e)| e.contains("\"text\":\" "))
            .map(|(t, _)| *t)
            .collect();
        let v = &virt[i];
        assert_eq!(tokens.len() as u32, v.output_tokens);
        let ttft = tokens[0].as_secs_f64();
        let last = tokens[tokens.len() - 1].as_secs_f64();
        let tol = |x: f64| 0.003 + 0.01 * x;
        assert!(sent.as_millis() as u64 == work[i].0, "arrival drifted");
        assert!(
            (ttft - v.ttft()).abs() <= tol(v.ttft()),
            "req {i}: ttft live {ttft} virtual {}",
            v.ttft()
        );
        let vlast = v.last_token - v.arrival;
        assert!(
            (last - vlast).abs() <= tol(vlast),
            "req {i}: last token live {last} virtual {vlast}"
        );
    }
    let _ = stop.send(());
    fleet.wait().await;
}

#[tokio::test]
async fn openai_endpoints_answer_like_a_model_server() {
    let mut pod = PodSpec::new("pod-a", &profile("llama-3.1-8b/h100"), EngineKind::Vllm);
    pod.lora_adapters = vec!["sql-lora".into()];
    let (fleet, stop) = serve(vec![pod]).await;
    let addr = fleet.pods[0].addr;

    let r = call(addr, "GET", "/health", None).await;
    assert_eq!((r.status, r.pod.as_str()), (200, "pod-a"));
    let models = json_of(&call(addr, "GET", "/v1/models", None).await);
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![MODEL, "sql-lora"]);
    assert_eq!(models["data"][1]["parent"], MODEL);

    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5});
    let r = call(addr, "POST", "/v1/chat/completions", Some(chat.clone())).await;
    assert_eq!(r.status, 200);
    let v = json_of(&r);
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    // Stream options on a request that is not streamed: refused, as vLLM's validator does
    // (`null` and `{}` are not options).
    let mut o = chat.clone();
    o["stream_options"] = json!({"include_usage": true});
    let r = call(addr, "POST", "/v1/chat/completions", Some(o.clone())).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body
            .contains("Stream options can only be defined when `stream=True`."),
        "{}",
        r.body
    );
    for empty in [json!(null), json!({})] {
        o["stream_options"] = empty;
        let r = call(addr, "POST", "/v1/chat/completions", Some(o.clone())).await;
        assert_eq!(r.status, 200, "{}", r.body);
    }

    // streaming with usage: role chunk, 5 token chunks, finish chunk, usage chunk, [DONE]
    let mut s = chat.clone();
    s["stream"] = json!(true);
    s["stream_options"] = json!({"include_usage": true});
    let r = call(addr, "POST", "/v1/chat/completions", Some(s)).await;
    assert_eq!(r.status, 200);
    let evs: Vec<&str> = r.body.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(evs.len(), 1 + 5 + 1 + 1 + 1, "{}", r.body);
    assert_eq!(*evs.last().unwrap(), "data: [DONE]");
    let usage: Value =
        serde_json::from_str(evs[evs.len() - 2].trim_start_matches("data: ")).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    let first: Value = serde_json::from_str(evs[0].trim_start_matches("data: ")).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert!(first["usage"].is_null());

    // completions, LoRA adapter by name
    let r = call(
        addr,
        "POST",
        "/v1/completions",
        Some(json!({"model": "sql-lora", "prompt": "SELECT"})),
    )
    .await;
    let v = json_of(&r);
    assert_eq!(v["object"], "text_completion");
    assert_eq!(
        v["usage"]["completion_tokens"], 16,
        "the OpenAI default max_tokens"
    );

    // a long shared prompt is cached the second time
    let long = "x".repeat(4 * 2000);
    let first = json_of(
        &call(
            addr,
            "POST",
            "/v1/completions",
            Some(json!({"model": MODEL, "prompt": long, "max_tokens": 1})),
        )
        .await,
    );
    let again = json_of(
        &call(
            addr,
            "POST",
            "/v1/completions",
            Some(json!({"model": MODEL, "prompt": long, "max_tokens": 1})),
        )
        .await,
    );
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 1984
    );

    // errors
    let err = |r: &Reply| json_of(r)["error"].clone();
    let r = call(addr, "POST", "/v1/chat/completions", None).await;
    assert_eq!(r.status, 400);
    assert_eq!(err(&r)["type"], "BadRequestError");
    let r = call(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]})),
    )
    .await;
    assert_eq!(r.status, 404);
    assert!(
        err(&r)["message"]
            .as_str()
            .unwrap()
            .contains("`nope` does not exist")
    );
    let r = call(
        addr,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": "x", "max_tokens": 0})),
    )
    .await;
    assert_eq!(
        (r.status, err(&r)["param"].as_str()),
        (400, Some("max_tokens"))
    );
    let r = call(
        addr,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": "x", "max_tokens": 200_000})),
    )
    .await;
    assert_eq!(r.status, 400);
    // vLLM's own message, as a client matching on it reads it: no wrapper in front.
    let message = err(&r)["message"].as_str().unwrap().to_owned();
    assert!(
        message.starts_with("This model's maximum context length is"),
        "{message}"
    );
    let r = call(
        addr,
        "POST",
        "/v1/chat/completions",
        Some(json!({"model": MODEL, "messages": []})),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(call(addr, "GET", "/v1/completions", None).await.status, 405);
    assert_eq!(call(addr, "GET", "/nope", None).await.status, 404);

    let _ = stop.send(());
    fleet.wait().await;
}

fn families(page: &str) -> Vec<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn metrics_pages_use_each_engines_names() {
    let h100 = profile("llama-3.1-8b/h100");
    let mut vllm = PodSpec::new("v", &h100, EngineKind::Vllm);
    vllm.lora_adapters = vec!["a".into(), "b".into()];
    vllm.max_loras = 2;
    let pods = vec![
        vllm,
        PodSpec::new("s", &h100, EngineKind::Sglang),
        PodSpec::new("t", &h100, EngineKind::Tgi),
    ];
    let (fleet, stop) = serve(pods).await;
    for p in &fleet.pods {
        call(
            p.addr,
            "POST",
            "/v1/completions",
            Some(json!({"model": MODEL, "prompt": "hello", "max_tokens": 3})),
        )
        .await;
    }
    call(
        fleet.pods[0].addr,
        "POST",
        "/v1/completions",
        Some(json!({"model": "a", "prompt": "hello", "max_tokens": 3})),
    )
    .await;

    let page = call(fleet.pods[0].addr, "GET", "/metrics", None).await.body;
    let fixture = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/vllm-0.32-metrics-after-load.txt"
    ))
    .unwrap();
    let ours = families(&page);
    let missing: Vec<String> = families(&fixture)
        .into_iter()
        .filter(|f| {
            !ours.contains(f)
                && !f.starts_with("http_request_")
                && !f.starts_with("http_response_")
                && f != "http_requests_created"
        })
        .collect();
    assert!(
        missing.is_empty(),
        "families a real vLLM page has and ours lacks: {missing:?}"
    );
    assert!(page.contains(&format!(
        "vllm:num_requests_running{{engine=\"0\",model_name=\"{MODEL}\"}} 0"
    )));
    assert!(page.contains("vllm:generation_tokens_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 6.0"));
    assert!(page.contains("block_size=\"16\""));
    assert!(page.contains(&format!("num_gpu_blocks=\"{}\"", h100.num_blocks())));
    assert!(page.contains("vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"}"));
    assert!(page.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\",le=\"+Inf\"} 2.0"));

    let page = call(fleet.pods[1].addr, "GET", "/metrics", None).await.body;
    for f in [
        "sglang:num_queue_reqs",
        "sglang:num_running_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:time_to_first_token_seconds",
    ] {
        assert!(families(&page).iter().any(|x| x == f), "{f}");
    }
    let page = call(fleet.pods[2].addr, "GET", "/metrics", None).await.body;
    for f in [
        "tgi_queue_size",
        "tgi_batch_current_size",
        "tgi_request_duration",
    ] {
        assert!(families(&page).iter().any(|x| x == f), "{f}");
    }
    assert!(!page.contains("kv_cache"));
    let _ = stop.send(());
    fleet.wait().await;
}

#[tokio::test(start_paused = true)]
async fn faults_hang_freeze_hide_fail_and_slow_down() {
    let p = profile("llama-3.1-8b/a10g");
    let (fleet, stop) = serve(vec![PodSpec::new("pod", &p, EngineKind::Vllm)]).await;
    let (addr, handle) = (fleet.pods[0].addr, fleet.pods[0].handle.clone());
    let req = json!({"model": MODEL, "prompt": "hello", "max_tokens": 11});

    // slow down: ITL doubles
    let base = call(
        addr,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": "hello", "max_tokens": 11, "stream": true})),
    )
    .await;
    handle.set_faults(Faults {
        slowdown: 2.0,
        ..Faults::default()
    });
    let slow = call(
        addr,
        "POST",
        "/v1/completions",
        Some(json!({"model": MODEL, "prompt": "hello", "max_tokens": 11, "stream": true})),
    )
    .await;
    let span = |r: &Reply| {
        let t: Vec<Duration> = r
            .events
            .iter()
            .filter(|(_, e)| e.contains("\"text\":\" "))
            .map(|(t, _)| *t)
            .collect();
        (t[t.len() - 1] - t[0]).as_secs_f64()
    };
    let ratio = span(&slow) / span(&base);
    assert!((1.9..2.1).contains(&ratio), "{ratio}");

    // errors at rate 1
    handle.set_faults(Faults {
        error_rate: 1.0,
        ..Faults::default()
    });
    assert_eq!(
        call(addr, "POST", "/v1/completions", Some(req.clone()))
            .await
            .status,
        500
    );

    // frozen metrics keep the old numbers; missing metrics are a 404
    handle.set_faults(Faults {
        metrics: MetricsFault::Frozen,
        ..Faults::default()
    });
    let before = call(addr, "GET", "/metrics", None).await.body;
    call(addr, "POST", "/v1/completions", Some(req.clone())).await;
    assert_eq!(call(addr, "GET", "/metrics", None).await.body, before);
    handle.set_faults(Faults {
        metrics: MetricsFault::Missing,
        ..Faults::default()
    });
    assert_eq!(call(addr, "GET", "/metrics", None).await.status, 404);
    handle.set_faults(Faults::default());
    assert_ne!(call(addr, "GET", "/metrics", None).await.body, before);

    // hang: no answer until the fault clears
    handle.set_faults(Faults {
        hang: true,
        ..Faults::default()
    });
    let pending = tokio::spawn(async move { call(addr, "GET", "/health", None).await.status });
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!pending.is_finished());
    handle.set_faults(Faults::default());
    assert_eq!(pending.await.unwrap(), 200);

    let _ = stop.send(());
    fleet.wait().await;
}

#[tokio::test(start_paused = true)]
async fn fault_script_from_the_fleet_file_applies_on_time() {
    let spec = FleetSpec::from_yaml(
        "pods:\n  - name: p\n    profile: llama-3.1-8b/h100\n    faults:\n      - { at_s: 10, metrics: missing }\n      - { at_s: 20, metrics: normal }\n",
    )
    .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let fleet = serve_fleet(&spec, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let addr = fleet.pods[0].addr;
    assert_eq!(call(addr, "GET", "/metrics", None).await.status, 200);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(call(addr, "GET", "/metrics", None).await.status, 404);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(call(addr, "GET", "/metrics", None).await.status, 200);
    let _ = tx.send(());
    fleet.wait().await;
}

#[tokio::test(start_paused = true)]
async fn a_client_that_goes_away_frees_its_slot_and_kv() {
    let (fleet, stop) = serve(vec![PodSpec::new(
        "pod",
        &profile("llama-3.1-8b/a10g"),
        EngineKind::Vllm,
    )])
    .await;
    let (addr, handle) = (fleet.pods[0].addr, fleet.pods[0].handle.clone());
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let body =
        json!({"model": MODEL, "prompt": "x".repeat(4000), "max_tokens": 1000, "stream": true});
    let req = http::Request::post("/v1/completions")
        .header("host", "sim")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let mut resp = send.send_request(req).await.unwrap().into_body();
    for _ in 0..3 {
        resp.frame().await.unwrap().unwrap();
    }
    let v = handle.view();
    assert_eq!(v.running, 1);
    assert!(v.kv_usage > 0.0);
    drop(resp);
    drop(send);
    conn.abort();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let v = handle.view();
    assert_eq!((v.running, v.waiting, v.kv_usage), (0, 0, 0.0));
    let page = call(addr, "GET", "/metrics", None).await.body;
    assert!(page.contains(
        "finished_reason=\"abort\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1.0"
    ));
    let _ = stop.send(());
    fleet.wait().await;
}

#[tokio::test]
async fn pods_also_speak_h2c() {
    let (fleet, stop) = serve(vec![PodSpec::new(
        "pod",
        &profile("llama-3.1-8b/h100"),
        EngineKind::Vllm,
    )])
    .await;
    let stream = TcpStream::connect(fleet.pods[0].addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let body = json!({"model": MODEL, "prompt": "hello", "max_tokens": 2}).to_string();
    let req = http::Request::post("http://sim/v1/completions")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.headers()[POD_HEADER], "pod");
    let v: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2);
    let _ = stop.send(());
    fleet.wait().await;
}

#[tokio::test(start_paused = true)]
async fn vllm_pods_serve_the_responses_api_on_the_chat_path() {
    let vllm = PodSpec::new("v", &profile("llama-3.1-8b/a10g"), EngineKind::Vllm);
    let sglang = PodSpec::new("s", &profile("llama-3.1-8b/a10g"), EngineKind::Sglang);
    let (fleet, stop) = serve(vec![vllm, sglang]).await;
    let (addr, other) = (fleet.pods[0].addr, fleet.pods[1].addr);
    // A prompt of whole blocks, first sent as chat: the Responses request of the same messages is
    // the same prompt, so it finds every full block cached.
    let question = "q".repeat(4 * 16 * 20);
    let chat = json!({"model": MODEL, "max_tokens": 1, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": question},
    ]});
    let (status, v) = post(addr, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{v}");
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let body = json!({"instructions": "Be brief.", "input": question, "max_output_tokens": 6, "stream": true});
    let r = call(addr, "POST", "/v1/responses", Some(body)).await;
    assert_eq!((r.status, r.pod.as_str()), (200, "v"), "{}", r.body);
    let kinds: Vec<&str> = r
        .events
        .iter()
        .map(|(_, e)| e.lines().next().unwrap().trim_start_matches("event: "))
        .collect();
    assert_eq!(kinds[..2], ["response.created", "response.in_progress"]);
    assert_eq!(kinds.last(), Some(&"response.completed"));
    // Each token's delta leaves when its step ends (35 ms apart on an A10G), not all at the end.
    let deltas: Vec<Duration> = r
        .events
        .iter()
        .filter(|(_, e)| e.starts_with("event: response.output_text.delta\n"))
        .map(|(at, _)| *at)
        .collect();
    assert_eq!(deltas.len(), 6, "{kinds:?}");
    assert!(
        deltas[5] - deltas[0] >= Duration::from_millis(5 * 30),
        "{deltas:?}"
    );
    let last = r.events.last().unwrap().1.lines().nth(1).unwrap();
    let done: Value = serde_json::from_str(last.trim_start_matches("data: ")).unwrap();
    let usage = &done["response"]["usage"];
    assert_eq!(usage["input_tokens"], prompt_tokens, "{usage}");
    assert_eq!(
        usage["input_tokens_details"]["cached_tokens"],
        prompt_tokens / 16 * 16,
        "{usage}"
    );
    assert_eq!(usage["output_tokens"], 6, "{usage}");
    assert!(!r.body.contains("[DONE]"));

    // Refused as vLLM refuses it, and counted on the page under vLLM's route.
    let (status, v) = post(addr, "/v1/responses", json!({"model": MODEL})).await;
    assert_client_error(status, &v, 400, Some("input"));
    let (status, v) = post(
        addr,
        "/v1/responses",
        json!({"model": "nope", "input": "x"}),
    )
    .await;
    assert_client_error(status, &v, 404, Some("model"));
    assert_eq!(call(addr, "GET", "/v1/responses", None).await.status, 405);
    let page = call(addr, "GET", "/metrics", None).await.body;
    for (class, n) in [("2xx", 1), ("4xx", 2)] {
        let series = format!(
            "\nhttp_requests_total{{handler=\"/v1/responses\",method=\"POST\",status=\"{class}\"}} {n}.0\n"
        );
        assert!(page.contains(&series), "{series}\n{page}");
    }
    // SGLang pods do not serve it.
    let r = call(other, "POST", "/v1/responses", Some(json!({"input": "x"}))).await;
    assert_eq!(r.status, 404);
    stop.send(()).unwrap();
    fleet.wait().await;
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let r = call(addr, "POST", path, Some(body)).await;
    (r.status, json_of(&r))
}

/// A 4xx answer in the emulator's (OpenAI/vLLM) error shape, naming the field when one is wrong.
fn assert_client_error(status: u16, v: &Value, want: u16, param: Option<&str>) {
    assert_eq!(status, want, "{v}");
    assert_eq!(v["error"]["code"], want, "{v}");
    assert!(!v["error"]["message"].as_str().unwrap().is_empty(), "{v}");
    let kind = if want == 404 {
        "NotFoundError"
    } else {
        "BadRequestError"
    };
    assert_eq!(v["error"]["type"], kind, "{v}");
    if let Some(p) = param {
        assert_eq!(v["error"]["param"], p, "{v}");
    }
}

/// Sends one byte more than the emulator's 32 MiB body limit (of a longer declared body, so the
/// server has read everything sent when it answers and the answer is not lost to a reset) and
/// reads the answer off the raw socket.
async fn oversized(addr: SocketAddr, path: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let limit = 32 * 1024 * 1024;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        2 * limit
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(&vec![b' '; limit + 1]).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(
            n > 0,
            "closed before a full answer: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let len: usize = text[..end]
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().unwrap())
            })
            .unwrap();
        if buf.len() >= end + 4 + len {
            let status = text[9..12].parse().unwrap();
            let body = serde_json::from_slice(&buf[end + 4..end + 4 + len]).unwrap();
            return (status, body);
        }
    }
}

#[tokio::test]
async fn vllm_pods_serve_what_peer_routers_call() {
    let (fleet, stop) = serve(vec![
        PodSpec::new("vllm", &profile("llama-3.1-8b/h100"), EngineKind::Vllm),
        PodSpec::new("sglang", &profile("llama-3.1-8b/h100"), EngineKind::Sglang),
    ])
    .await;
    let addr = fleet.pods[0].addr;
    let max_len = profile("llama-3.1-8b/h100").max_model_len;

    // /tokenize of a prompt: the count is what a completion of the same prompt is charged.
    let prompt = "The quick brown fox jumps over the lazy dog, déjà vu ✓";
    let (status, tok) = post(addr, "/tokenize", json!({"model": MODEL, "prompt": prompt})).await;
    assert_eq!(status, 200, "{tok}");
    let ids = tok["tokens"].as_array().unwrap().clone();
    assert_eq!(tok["count"].as_u64().unwrap(), ids.len() as u64);
    assert_eq!(tok["max_model_len"], max_len);
    assert!(tok["token_strs"].is_null());
    let (_, done) = post(
        addr,
        "/v1/completions",
        json!({"model": MODEL, "prompt": prompt, "max_tokens": 1}),
    )
    .await;
    assert_eq!(done["usage"]["prompt_tokens"], tok["count"]);
    // The same text gives the same ids on every call.
    let (_, again) = post(addr, "/tokenize", json!({"prompt": prompt})).await;
    assert_eq!(again["tokens"], tok["tokens"]);

    // Round trip, and the pieces behind the ids.
    let (status, det) = post(addr, "/detokenize", json!({"model": MODEL, "tokens": ids})).await;
    assert_eq!((status, det["prompt"].as_str().unwrap()), (200, prompt));
    let (_, strs) = post(
        addr,
        "/tokenize",
        json!({"prompt": "abcdefghij", "return_token_strs": true}),
    )
    .await;
    assert_eq!(strs["token_strs"], json!(["abcd", "efgh", "ij"]));
    let (_, empty) = post(addr, "/tokenize", json!({"prompt": ""})).await;
    assert_eq!(empty["count"], 1);
    let (_, det) = post(addr, "/detokenize", json!({"tokens": empty["tokens"]})).await;
    assert_eq!(det["prompt"], "");

    // Chat: the template the pod applies, with and without the generation prompt.
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello there"}
    ]);
    let (status, chat_tok) = post(
        addr,
        "/tokenize",
        json!({"model": MODEL, "messages": messages, "add_generation_prompt": true}),
    )
    .await;
    assert_eq!(status, 200, "{chat_tok}");
    let (_, chat_done) = post(
        addr,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": messages, "max_tokens": 1}),
    )
    .await;
    assert_eq!(chat_done["usage"]["prompt_tokens"], chat_tok["count"]);
    let (_, no_gen) = post(
        addr,
        "/tokenize",
        json!({"model": MODEL, "messages": messages, "add_generation_prompt": false}),
    )
    .await;
    assert!(no_gen["count"].as_u64() < chat_tok["count"].as_u64());
    let (_, det) = post(addr, "/detokenize", json!({"tokens": chat_tok["tokens"]})).await;
    assert_eq!(
        det["prompt"],
        "<|system|>\nYou are terse.\n<|user|>\nhello there\n<|assistant|>\n"
    );

    // Render: vLLM's GenerateRequest, one for chat, a list for completions; nothing generated.
    let (status, r) = post(
        addr,
        "/v1/chat/completions/render",
        json!({"model": MODEL, "messages": messages, "max_tokens": 5, "temperature": 0.5}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["token_ids"], chat_tok["tokens"]);
    assert_eq!(r["model"], MODEL);
    assert_eq!(r["sampling_params"]["max_tokens"], 5);
    assert_eq!(r["sampling_params"]["temperature"], 0.5);
    assert_eq!(
        (r["stream"].clone(), r["priority"].clone()),
        (json!(false), json!(0))
    );
    assert!(r["features"].is_null());
    assert!(r["request_id"].as_str().unwrap().starts_with("chatcmpl-"));
    let (status, r) = post(
        addr,
        "/v1/completions/render",
        json!({"model": MODEL, "prompt": prompt}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r.as_array().unwrap().len(), 1);
    assert_eq!(r[0]["token_ids"], tok["tokens"]);
    assert_eq!(r[0]["sampling_params"]["max_tokens"], 16);
    let (_, r) = post(
        addr,
        "/v1/completions/render",
        json!({"model": MODEL, "prompt": [7, 8, 9], "max_tokens": 2}),
    )
    .await;
    assert_eq!(r[0]["token_ids"], json!([7, 8, 9]));
    let finished = fleet.pods[0].handle.view();
    assert_eq!((finished.running, finished.waiting), (0, 0));

    // Load when idle, in vLLM's shape and in the one vllm-router's power_of_two parses.
    let load = json_of(&call(addr, "GET", "/load", None).await);
    assert_eq!(load, json!({"server_load": 0}));
    let load = json_of(&call(addr, "GET", "/get_load", None).await);
    assert_eq!(load, json!({"load": 0}));

    // Wrong method; and an SGLang pod keeps its own endpoint set.
    assert_eq!(call(addr, "GET", "/tokenize", None).await.status, 405);
    assert_eq!(call(addr, "POST", "/get_load", None).await.status, 405);
    let sglang = fleet.pods[1].addr;
    for (method, path) in [
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("POST", "/v1/chat/completions/render"),
        ("GET", "/get_load"),
        ("GET", "/load"),
    ] {
        let body = (method == "POST").then(|| json!({"prompt": "x"}));
        assert_eq!(call(sglang, method, path, body).await.status, 404, "{path}");
    }
    let _ = stop.send(());
    fleet.wait().await;
}

#[tokio::test]
async fn peer_endpoints_reject_bad_input() {
    let (fleet, stop) = serve(vec![PodSpec::new(
        "vllm",
        &profile("llama-3.1-8b/h100"),
        EngineKind::Vllm,
    )])
    .await;
    let addr = fleet.pods[0].addr;

    // Not JSON, not an object.
    for path in [
        "/tokenize",
        "/detokenize",
        "/v1/chat/completions/render",
        "/v1/completions/render",
    ] {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let req = http::Request::post(path)
            .header("host", "sim")
            .body(Full::new(Bytes::from_static(b"{not json")))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let v: Value =
            serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
        assert_client_error(status, &v, 400, None);
        let (status, v) = post(addr, path, json!(["a list"])).await;
        assert_client_error(status, &v, 400, None);
    }

    let cases: Vec<(&str, Value, u16, &str)> = vec![
        ("/tokenize", json!({"model": MODEL}), 400, "prompt"),
        ("/tokenize", json!({"prompt": 42}), 400, "prompt"),
        (
            "/tokenize",
            json!({"prompt": "x", "model": 3}),
            400,
            "model",
        ),
        (
            "/tokenize",
            json!({"prompt": "x", "model": "nope"}),
            404,
            "model",
        ),
        ("/tokenize", json!({"messages": "hi"}), 400, "messages"),
        ("/tokenize", json!({"messages": []}), 400, "messages"),
        (
            "/tokenize",
            json!({"messages": [{"content": "no role"}]}),
            400,
            "messages",
        ),
        (
            "/tokenize",
            json!({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "yes"}),
            400,
            "add_generation_prompt",
        ),
        (
            "/tokenize",
            json!({"prompt": "x", "return_token_strs": 1}),
            400,
            "return_token_strs",
        ),
        ("/detokenize", json!({"model": MODEL}), 400, "tokens"),
        ("/detokenize", json!({"tokens": "abc"}), 400, "tokens"),
        ("/detokenize", json!({"tokens": [-1]}), 400, "tokens"),
        ("/detokenize", json!({"tokens": [1.5]}), 400, "tokens"),
        (
            "/detokenize",
            json!({"tokens": [4_294_967_296u64]}),
            400,
            "tokens",
        ),
        (
            "/v1/chat/completions/render",
            json!({"model": 3, "messages": [{"role": "user", "content": "x"}]}),
            400,
            "model",
        ),
        (
            "/v1/chat/completions/render",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
            400,
            "max_tokens",
        ),
        (
            "/v1/chat/completions/render",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "priority": "high"}),
            400,
            "priority",
        ),
        (
            "/v1/completions/render",
            json!({"model": MODEL}),
            400,
            "prompt",
        ),
        (
            "/v1/completions/render",
            json!({"model": MODEL, "prompt": ["a", "b"]}),
            400,
            "prompt",
        ),
        (
            "/v1/completions/render",
            json!({"model": "nope", "prompt": "x"}),
            404,
            "model",
        ),
    ];
    for (path, body, want, param) in cases {
        eprintln!("{path} {body}");
        let (status, v) = post(addr, path, body).await;
        assert_client_error(status, &v, want, Some(param));
    }

    // An id that no text produces: a clear 400 naming it.
    let unknown = (0u32..)
        .find(|id| infergate_sim::tokens::token_bytes(*id).is_none())
        .unwrap();
    let (status, v) = post(addr, "/detokenize", json!({"tokens": [unknown]})).await;
    assert_client_error(status, &v, 400, Some("tokens"));
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains(&unknown.to_string()) && msg.contains("vocabulary"),
        "{msg}"
    );

    // Over-long body: the same 413 as the inference endpoints.
    let (status, v) = oversized(addr, "/tokenize").await;
    assert_eq!(status, 413);
    assert_eq!(v["error"]["type"], "RequestTooLargeError");
    let _ = stop.send(());
    fleet.wait().await;
}

#[tokio::test(start_paused = true)]
async fn get_load_counts_requests_in_flight() {
    let (fleet, stop) = serve(vec![PodSpec::new(
        "pod",
        &profile("llama-3.1-8b/a10g"),
        EngineKind::Vllm,
    )])
    .await;
    let addr = fleet.pods[0].addr;
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let body =
        json!({"model": MODEL, "prompt": "x".repeat(4000), "max_tokens": 1000, "stream": true});
    let req = http::Request::post("/v1/completions")
        .header("host", "sim")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let mut resp = send.send_request(req).await.unwrap().into_body();
    for _ in 0..3 {
        resp.frame().await.unwrap().unwrap();
    }
    let load = json_of(&call(addr, "GET", "/get_load", None).await);
    assert_eq!(load, json!({"load": 1}));
    let load = json_of(&call(addr, "GET", "/load", None).await);
    assert_eq!(load, json!({"server_load": 1}));
    drop(resp);
    drop(send);
    conn.abort();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let load = json_of(&call(addr, "GET", "/get_load", None).await);
    assert_eq!(load, json!({"load": 0}));
    let _ = stop.send(());
    fleet.wait().await;
}
