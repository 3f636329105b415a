//! The Responses API (`POST /v1/responses`) through the gateway to an emulated vLLM pod
//! (`infergate-sim`, which answers in vLLM 0.32's wire format): routed, streamed event by event
//! as the pod produces tokens, its first token timed, its tokens counted, and the pod's rates
//! learned from it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/upstream.rs"]
mod upstream;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use infergate_proxy::GatewayConfig;
use infergate_testkit::metric;
use serde_json::{Value, json};
use upstream::{get, post, serve_emulated, serve_gateway, wait_ready};

/// The `(event, data)` pairs of a Responses API stream: each event an `event:` line and a `data:`
/// line.
fn events(stream: &str) -> Vec<(String, Value)> {
    stream
        .trim_end()
        .split("\n\n")
        .map(|frame| {
            let (event, data) = frame
                .split_once('\n')
                .unwrap_or_else(|| panic!("{frame:?}"));
            let event = event.strip_prefix("event: ").unwrap().to_owned();
            let data = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            (event, data)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_are_routed_streamed_timed_and_counted() {
    // An A10G pod: 35 ms a decode step, so a 16-token answer takes over half a second after its
    // first token.
    let (fleet, _fleet_stop) = serve_emulated(
        "seed: 7\npods:\n  - { name: a, profile: llama-3.1-8b/a10g, engine: vllm, served_model_name: llama, lora_adapters: [sql-lora] }\n",
    )
    .await;
    let pod = fleet.pods[0].addr;
    let config = GatewayConfig::from_yaml(&format!(
        "auth: none\nmodels:\n  - name: llama\n    loraAdapters: [sql-lora]\n    scheduler: {{ preset: infergate }}\n    endpoints:\n      - {{ address: {pod}, name: a, engine: vllm }}\n"
    ))
    .unwrap();
    let (gw, _stop) = serve_gateway(config).await;
    let admin = gw.admin_addr().unwrap();
    wait_ready(admin).await;
    let pod_label = pod.to_string();
    let learned = |m: &str| {
        metric(
            m,
            "infergate_pod_prefill_tokens_per_second",
            &[("pod", &pod_label)],
        )
    };
    assert_eq!(learned(&get(admin, "/metrics").await.1), None);

    // Streamed: read it frame by frame as the client gets it.
    let body = json!({
        "model": "llama", "instructions": "Answer briefly.", "stream": true,
        "max_output_tokens": 16, "input": "Where do tokens come from?",
    });
    let req = http::Request::post(format!("http://{}/v1/responses", gw.http_addr()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = upstream::client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert_eq!(
        resp.headers()["x-infergate-endpoint"],
        pod_label.as_str(),
        "{:?}",
        resp.headers()
    );
    let pod_handle = fleet.handle("a").unwrap();
    let mut body = resp.into_body();
    let mut stream = String::new();
    let mut ended_at_first_delta = None;
    while let Some(frame) = body.frame().await {
        let data = frame.unwrap().into_data().unwrap();
        stream.push_str(std::str::from_utf8(&data).unwrap());
        if ended_at_first_delta.is_none() && stream.contains("event: response.output_text.delta") {
            // The first text reaches the client while the pod is still generating the rest: the
            // gateway holds nothing back.
            ended_at_first_delta = Some(pod_handle.requests_ended());
        }
    }
    assert_eq!(
        ended_at_first_delta,
        Some(0),
        "the first delta arrived only after the pod had finished:\n{stream}"
    );
    // Every event arrived whole and in order, ending with vLLM's `response.completed`.
    let events = events(&stream);
    for (i, (kind, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], json!(kind), "{data}");
        assert_eq!(data["sequence_number"], json!(i), "{data}");
    }
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds[..2], ["response.created", "response.in_progress"]);
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "response.output_text.delta")
            .count(),
        16,
        "{kinds:?}"
    );
    assert_eq!(kinds.last(), Some(&"response.completed"));
    let text: String = events
        .iter()
        .filter(|(k, _)| k == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    let done = &events.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["content"][0]["text"], json!(text));
    let usage = &done["usage"];
    let input = usage["input_tokens"].as_u64().unwrap();
    assert!(input > 0, "{usage}");
    assert_eq!(usage["output_tokens"], 16, "{usage}");

    // The gateway timed the first token and counted the tokens the usage event reported.
    let timed = |m: &str| {
        metric(
            m,
            "infergate_gateway_ttft_seconds_count",
            &[("model", "llama")],
        )
    };
    let m = get(admin, "/metrics").await.1;
    assert_eq!(timed(&m), Some(1.0), "{m}");
    let tokens = |m: &str, direction: &str| {
        metric(
            m,
            "infergate_gateway_tokens_total",
            &[("model", "llama"), ("direction", direction)],
        )
    };
    assert_eq!(tokens(&m, "in"), Some(input as f64), "{m}");
    assert_eq!(tokens(&m, "out"), Some(16.0), "{m}");
    // The scheduler learned the pod's prefill rate from the streamed request's first token.
    assert!(learned(&m).is_some_and(|r| r > 0.0), "{m}");
    assert_eq!(gw.handle().inflight("llama"), Some(0));

    // Not streamed, for a LoRA adapter: one JSON response object, counted the same way.
    let body = json!({"model": "sql-lora", "max_output_tokens": 4, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "List the tables."}]},
    ]});
    let (status, headers, answer) = post(gw.http_addr(), "/v1/responses", &body.to_string()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    assert_eq!(headers["x-infergate-endpoint"], pod_label.as_str());
    let v: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(v["object"], "response", "{v}");
    assert_eq!(v["model"], "sql-lora", "{v}");
    assert!(
        !v["output"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .is_empty(),
        "{v}"
    );
    let second_input = v["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(v["usage"]["output_tokens"], 4, "{v}");
    let m = get(admin, "/metrics").await.1;
    assert_eq!(tokens(&m, "in"), Some((input + second_input) as f64), "{m}");
    assert_eq!(tokens(&m, "out"), Some(20.0), "{m}");
    assert_eq!(
        metric(
            &m,
            "infergate_gateway_requests_total",
            &[("model", "llama"), ("code", "2xx")]
        ),
        Some(2.0),
        "{m}"
    );
    // Only the streamed answer has a first token to time.
    assert_eq!(timed(&m), Some(1.0), "{m}");
    assert_eq!(gw.handle().inflight("llama"), Some(0));
}
