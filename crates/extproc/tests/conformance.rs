//! The ext_proc conformance harness: a client playing Envoy's side of the stream against the
//! endpoint picker and the body-based router, asserting exact header mutations, metadata,
//! immediate responses and chunking.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/harness.rs"]
mod harness;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    ProcessingResponse, body_mutation, processing_response,
};
use harness::*;
use infergate_extproc::bbr::{BbrConfig, ModelsFile};
use infergate_extproc::wire::{self, MAX_CHUNK};
use infergate_extproc::{BbrTelemetry, BodyRouter, EndpointPicker, PickerConfig, Telemetry};
use infergate_scheduler::Usage;

const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";
const C: &str = "10.0.0.3:8000";
const CAP: usize = 256 * 1024;

async fn picker(pool: ScriptedPool) -> (Server, Envoy) {
    let config = PickerConfig {
        pool_name: "llama".into(),
        max_body_bytes: CAP,
        ..PickerConfig::default()
    };
    let server = serve(EndpointPicker::new(config, pool, Telemetry::default())).await;
    let envoy = Envoy::connect(server.addr).await;
    (server, envoy)
}

fn chat_body(words: usize) -> Vec<u8> {
    let text: String = (0..words).map(|i| format!("w{i} ")).collect();
    serde_json::to_vec(&serde_json::json!({
        "model": "llama-3-8b",
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": text},
        ],
    }))
    .unwrap()
}

/// Sends headers and `body` in chunks of `sizes`, then reads and checks the routing answer and the
/// re-sent body; returns the route.
async fn route_chunked(ex: &mut Exchange, path: &str, body: &[u8], sizes: &[usize]) -> Route {
    ex.send(request_headers(path, &[], false)).await;
    let chunks = split(body, sizes);
    let last = chunks.len() - 1;
    for (i, c) in chunks.iter().enumerate() {
        ex.send(request_body(c, i == last)).await;
    }
    let route = headers_answer(&ex.next().await);
    let resent = ex.streamed_body(true, usize::MAX).await;
    let joined: Vec<u8> = resent.iter().flat_map(|(b, _)| b.clone()).collect();
    assert_eq!(joined, body, "the body is re-sent unchanged");
    assert_eq!(
        resent.len(),
        body.len().div_ceil(MAX_CHUNK),
        "fewest chunks"
    );
    for (i, (b, eos)) in resent.iter().enumerate() {
        assert!(b.len() <= MAX_CHUNK, "chunk of {} bytes", b.len());
        assert_eq!(*eos, i + 1 == resent.len());
    }
    route
}

#[tokio::test]
async fn chunked_chat_bodies_of_many_sizes_route_with_exact_mutations() {
    let pool = ScriptedPool::new(&[A, B, C]);
    let (_s, envoy) = picker(pool.clone()).await;
    let small = chat_body(10);
    let large = chat_body(30_000); // > 3 × 62,000 bytes
    assert!(large.len() > 3 * MAX_CHUNK && large.len() < CAP);
    let splits: [&[usize]; 6] = [
        &[usize::MAX],
        &[1],
        &[7, 13],
        &[4096],
        &[65_536],
        &[61_999, 1, 62_001],
    ];
    for body in [&small, &large] {
        for sizes in splits {
            if sizes == [1] && body.len() > 10_000 {
                continue; // byte-by-byte on the large body is slow and adds nothing
            }
            let mut ex = envoy.open().await;
            let route = route_chunked(&mut ex, "/v1/chat/completions", body, sizes).await;
            assert_eq!(
                route.set,
                vec![
                    (wire::DESTINATION_HEADER.to_owned(), format!("{A},{B},{C}")),
                    ("content-length".to_owned(), body.len().to_string()),
                ],
                "exact header mutations"
            );
            assert!(route.removed.is_empty());
            assert!(route.clear_route_cache);
            assert_eq!(
                route.metadata_destination.as_deref(),
                Some(format!("{A},{B},{C}").as_str())
            );
        }
    }
    let picks: Vec<_> = pool
        .events()
        .into_iter()
        .filter(|e| matches!(e, Event::Picked { .. }))
        .collect();
    match &picks[0] {
        Event::Picked {
            model,
            lora,
            prompt,
            output_tokens,
            subset,
            ..
        } => {
            assert_eq!(model, "llama-3-8b");
            assert_eq!(*lora, None);
            assert!(prompt.starts_with("systembe briefuserw0 w1"), "{prompt}");
            assert_eq!(*output_tokens, 64);
            assert_eq!(*subset, None);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn completions_path_parses_the_prompt() {
    let pool = ScriptedPool::new(&[A]);
    let (_s, envoy) = picker(pool.clone()).await;
    let body = br#"{"model":"llama-3-8b","prompt":"Once upon a time","stream":false}"#;
    let mut ex = envoy.open().await;
    let route = route_chunked(&mut ex, "/v1/completions", body, &[5]).await;
    assert_eq!(route.header(wire::DESTINATION_HEADER), Some(A));
    assert!(
        matches!(&pool.events()[0], Event::Picked { prompt, prompt_tokens: 4, .. } if prompt == "Once upon a time")
    );
}

#[tokio::test]
async fn end_of_stream_on_headers_routes_without_a_body() {
    let pool = ScriptedPool::new(&[A, B]);
    let (_s, envoy) = picker(pool.clone()).await;
    let mut ex = envoy.open().await;
    ex.send(request_headers(
        "/v1/models",
        &[(wire::MODEL_HEADER, "llama-3-8b")],
        true,
    ))
    .await;
    let route = headers_answer(&ex.next().await);
    assert_eq!(
        route.set,
        vec![(wire::DESTINATION_HEADER.to_owned(), format!("{A},{B}"))]
    );
    assert!(route.clear_route_cache);
    assert_eq!(route.metadata_destination, Some(format!("{A},{B}")));
    ex.send(response_headers(200, "application/json", false))
        .await;
    assert!(is_response_headers_continue(&ex.next().await));
    ex.send(response_body(br#"{"data":[]}"#, true)).await;
    assert_eq!(
        streamed(&ex.next().await, false),
        (&br#"{"data":[]}"#[..], true)
    );
    assert!(
        matches!(&pool.events()[0], Event::Picked { model, prompt_tokens: 0, .. } if model == "llama-3-8b")
    );
    assert_eq!(pool.events()[1], Event::Completed(Usage::default()));
    assert_eq!(pool.inflight(), 0);
}

#[tokio::test]
async fn trailers_end_the_body_and_are_answered_after_it() {
    let pool = ScriptedPool::new(&[A]);
    let (_s, envoy) = picker(pool.clone()).await;
    let body = chat_body(20);
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    for c in split(&body, &[33]) {
        ex.send(request_body(c, false)).await;
    }
    ex.send(request_trailers()).await;
    let route = headers_answer(&ex.next().await);
    assert_eq!(
        route.header("content-length"),
        Some(body.len().to_string().as_str())
    );
    let chunks = ex.streamed_body(true, 1).await;
    assert_eq!(
        chunks,
        vec![(body.clone(), false)],
        "trailers follow: the body does not end the stream"
    );
    assert!(is_trailers(&ex.next().await, true));
}

#[tokio::test]
async fn bodies_at_the_cap_route_and_over_it_get_413() {
    let pool = ScriptedPool::new(&[A]);
    let (_s, envoy) = picker(pool.clone()).await;
    let prefix = br#"{"model":"m","prompt":""#;
    let suffix = br#""}"#;
    let pad = CAP - prefix.len() - suffix.len();
    let at_cap: Vec<u8> = [&prefix[..], &vec![b'x'; pad], &suffix[..]].concat();
    assert_eq!(at_cap.len(), CAP);
    let mut ex = envoy.open().await;
    let route = route_chunked(&mut ex, "/v1/completions", &at_cap, &[70_000]).await;
    assert_eq!(
        route.header("content-length"),
        Some(CAP.to_string().as_str())
    );
    let routed = ex;

    let over: Vec<u8> = [&prefix[..], &vec![b'x'; pad + 1], &suffix[..]].concat();
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/completions", &[], false))
        .await;
    for c in split(&over, &[100_000]) {
        // The server may close the stream before the last chunks: ignore send errors then.
        let _ =
            tokio::time::timeout(Duration::from_millis(100), ex.send(request_body(c, false))).await;
    }
    let (status, headers, json) = immediate_parts(&ex.next().await);
    assert_eq!(status, 413);
    assert_eq!(
        headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    assert_eq!(json["error"]["code"], "body_too_large");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&CAP.to_string())
    );
    ex.expect_end().await;
    // Only the routed at-cap request is held, until its stream goes.
    assert_eq!(pool.inflight(), 1);
    drop(routed);
    pool.wait_inflight(0).await;
}

#[tokio::test]
async fn malformed_bodies_get_400_with_an_openai_error() {
    let (_s, envoy) = picker(ScriptedPool::new(&[A])).await;
    let cases: [(&[u8], &str, &str); 4] = [
        (b"not json at all", "invalid_json", "/v1/chat/completions"),
        (b"[1,2,3]", "invalid_json", "/v1/chat/completions"),
        (
            br#"{"messages":[]}"#,
            "missing_model",
            "/v1/chat/completions",
        ),
        (
            br#"{"model":"m","stream":"yes","prompt":"x"}"#,
            "invalid_field",
            "/v1/completions",
        ),
    ];
    for (body, code, path) in cases {
        let mut ex = envoy.open().await;
        ex.send(request_headers(path, &[], false)).await;
        ex.send(request_body(body, true)).await;
        let (status, _, json) = immediate_parts(&ex.next().await);
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(body));
        assert_eq!(json["error"]["code"], code);
        assert_eq!(json["error"]["type"], "invalid_request_error");
        ex.expect_end().await;
    }
}

#[tokio::test]
async fn subset_hints_restrict_the_pick_and_an_ineligible_subset_is_503() {
    let pool = ScriptedPool::new(&[A, B, C]);
    let (_s, envoy) = picker(pool.clone()).await;
    let body = chat_body(3);
    let hint = |addrs: &[&str]| {
        let v: Vec<_> = addrs.iter().map(|a| a.parse().unwrap()).collect();
        wire::subset_metadata(&v)
    };
    // Eligible subset: only its members, in the pool's order.
    let mut ex = envoy.open().await;
    ex.send(with_metadata(
        request_headers("/v1/chat/completions", &[], false),
        hint(&[C, A]),
    ))
    .await;
    ex.send(request_body(&body, true)).await;
    let route = headers_answer(&ex.next().await);
    assert_eq!(
        route.header(wire::DESTINATION_HEADER),
        Some(format!("{A},{C}").as_str())
    );
    assert_eq!(route.metadata_destination, Some(format!("{A},{C}")));
    drop(ex);
    // No eligible pod, and an empty hint: 503.
    for h in [hint(&["10.9.9.9:1"]), hint(&[])] {
        let mut ex = envoy.open().await;
        ex.send(with_metadata(
            request_headers("/v1/chat/completions", &[], false),
            h,
        ))
        .await;
        ex.send(request_body(&body, true)).await;
        let (status, headers, json) = immediate_parts(&ex.next().await);
        assert_eq!(status, 503);
        assert!(!headers.contains_key("retry-after"));
        assert_eq!(json["error"]["code"], "no_endpoints");
        let message = json["error"]["message"].as_str().unwrap();
        assert!(message.contains("llama-3-8b"), "{message}");
        // The hint is the cause: the pool itself has ready pods.
        assert!(
            message.contains("subset hint names (x-gateway-destination-endpoint-subset)"),
            "{message}"
        );
    }
    pool.wait_inflight(0).await;
}

#[tokio::test]
async fn shed_requests_get_429_with_retry_after() {
    let pool = ScriptedPool::new(&[A]).shedding(Duration::from_millis(2_500));
    let (_s, envoy) = picker(pool).await;
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    ex.send(request_body(&chat_body(2), true)).await;
    let (status, headers, json) = immediate_parts(&ex.next().await);
    assert_eq!(status, 429);
    assert_eq!(headers.get("retry-after").map(String::as_str), Some("3"));
    assert_eq!(json["error"]["type"], "rate_limit_error");
}

#[tokio::test]
async fn streaming_response_passes_through_and_reports_first_token_and_usage() {
    let pool = ScriptedPool::new(&[A, B]);
    let (_s, envoy) = picker(pool.clone()).await;
    let mut ex = envoy.open().await;
    let body = br#"{"model":"llama-3-8b","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    route_chunked(&mut ex, "/v1/chat/completions", body, &[10]).await;
    let mut served = response_headers(200, "text/event-stream", false);
    served.metadata_context = Some(wire::served_metadata(B.parse().unwrap()));
    ex.send(served).await;
    assert!(is_response_headers_continue(&ex.next().await));
    let sse = concat!(
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n",
        "data: [DONE]\n\n",
    )
    .as_bytes();
    let chunks = split(sse, &[17, 40, 3]);
    let last = chunks.len() - 1;
    for (i, c) in chunks.iter().enumerate() {
        ex.send(response_body(c, i == last)).await;
        let a = ex.next().await;
        assert_eq!(
            streamed(&a, false),
            (*c, i == last),
            "echoed unchanged, in order"
        );
    }
    assert_eq!(
        pool.events()[1..],
        [
            Event::Reassigned(B.parse().unwrap()),
            Event::FirstToken,
            Event::Completed(Usage {
                prompt_tokens: 9,
                cached_tokens: 4,
                output_tokens: 2
            }),
        ]
    );
    assert_eq!(pool.inflight(), 0);
}

#[tokio::test]
async fn non_streaming_json_usage_is_read_across_chunks() {
    let pool = ScriptedPool::new(&[A]);
    let (_s, envoy) = picker(pool.clone()).await;
    let mut ex = envoy.open().await;
    route_chunked(&mut ex, "/v1/chat/completions", &chat_body(4), &[64]).await;
    ex.send(response_headers(200, "application/json", false))
        .await;
    assert!(is_response_headers_continue(&ex.next().await));
    let json = br#"{"id":"x","choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#;
    for (i, c) in split(json, &[20]).iter().enumerate() {
        ex.send(response_body(c, (i + 1) * 20 >= json.len())).await;
        ex.next().await;
    }
    assert_eq!(
        pool.events().last(),
        Some(&Event::Completed(Usage {
            prompt_tokens: 12,
            cached_tokens: 0,
            output_tokens: 3
        }))
    );
}

#[tokio::test]
async fn response_trailers_end_the_response() {
    let pool = ScriptedPool::new(&[A]);
    let (_s, envoy) = picker(pool.clone()).await;
    let mut ex = envoy.open().await;
    route_chunked(&mut ex, "/v1/chat/completions", &chat_body(4), &[64]).await;
    ex.send(response_headers(200, "application/json", false))
        .await;
    ex.next().await;
    ex.send(response_body(
        br#"{"usage":{"prompt_tokens":1,"completion_tokens":1}}"#,
        false,
    ))
    .await;
    ex.next().await;
    ex.send(response_trailers()).await;
    assert!(is_trailers(&ex.next().await, false));
    assert!(matches!(pool.events().last(), Some(Event::Completed(_))));
    assert_eq!(pool.inflight(), 0);
}

/// Found by the `extproc_picker` fuzz target: a response chunk larger than 62,000 bytes was
/// passed on as one streamed answer. Every answer chunk is at most `MAX_CHUNK` bytes, in order,
/// the last alone ending the stream.
#[tokio::test]
async fn large_response_chunks_pass_in_answers_of_at_most_62000_bytes() {
    let pool = ScriptedPool::new(&[A]);
    let (_s, envoy) = picker(pool.clone()).await;
    let mut ex = envoy.open().await;
    route_chunked(
        &mut ex,
        "/v1/embeddings",
        br#"{"model":"e5","input":"x"}"#,
        &[64],
    )
    .await;
    ex.send(response_headers(200, "application/json", false))
        .await;
    assert!(is_response_headers_continue(&ex.next().await));
    let big: Vec<u8> = (0..2 * MAX_CHUNK + 10)
        .map(|i| b'a' + (i % 26) as u8)
        .collect();
    ex.send(response_body(&big, true)).await;
    let passed = ex.streamed_body(false, usize::MAX).await;
    let sizes: Vec<usize> = passed.iter().map(|(b, _)| b.len()).collect();
    assert_eq!(sizes, [MAX_CHUNK, MAX_CHUNK, 10]);
    let ends: Vec<bool> = passed.iter().map(|(_, eos)| *eos).collect();
    assert_eq!(ends, [false, false, true]);
    let joined: Vec<u8> = passed.into_iter().flat_map(|(b, _)| b).collect();
    assert_eq!(joined, big);
    assert_eq!(pool.inflight(), 0);
}

/// Found by the `extproc_picker` fuzz target: a second response headers message restarted the
/// response watch, and the first token was reported (and its TTFT observed) twice.
#[tokio::test]
async fn the_first_token_is_reported_once_even_after_repeated_response_headers() {
    let pool = ScriptedPool::new(&[A]);
    let (_s, envoy) = picker(pool.clone()).await;
    let mut ex = envoy.open().await;
    let body =
        br#"{"model":"llama-3-8b","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    route_chunked(&mut ex, "/v1/chat/completions", body, &[64]).await;
    let token = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    for _ in 0..2 {
        ex.send(response_headers(200, "text/event-stream", false))
            .await;
        assert!(is_response_headers_continue(&ex.next().await));
        ex.send(response_body(token, false)).await;
        assert_eq!(streamed(&ex.next().await, false), (&token[..], false));
    }
    let first_tokens = pool
        .events()
        .iter()
        .filter(|e| **e == Event::FirstToken)
        .count();
    assert_eq!(first_tokens, 1, "events: {:?}", pool.events());
}

#[tokio::test]
async fn server_errors_fail_the_request() {
    let pool = ScriptedPool::new(&[A]);
    let (_s, envoy) = picker(pool.clone()).await;
    let mut ex = envoy.open().await;
    route_chunked(&mut ex, "/v1/chat/completions", &chat_body(4), &[64]).await;
    ex.send(response_headers(503, "text/plain", true)).await;
    assert!(is_response_headers_continue(&ex.next().await));
    assert_eq!(pool.events().last(), Some(&Event::Failed));
    assert_eq!(pool.inflight(), 0);
}

#[tokio::test]
async fn resets_release_in_flight_accounting() {
    let pool = ScriptedPool::new(&[A]);
    let (_s, envoy) = picker(pool.clone()).await;
    // Reset mid-body: nothing was picked, nothing is held.
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    ex.send(request_body(b"{\"model\":\"llama", false)).await;
    drop(ex);
    // Reset after routing, mid-response: the pick is cancelled.
    let mut ex = envoy.open().await;
    route_chunked(&mut ex, "/v1/chat/completions", &chat_body(4), &[64]).await;
    ex.send(response_headers(200, "text/event-stream", false))
        .await;
    ex.next().await;
    assert_eq!(pool.inflight(), 1);
    ex.send(response_body(
        b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        false,
    ))
    .await;
    ex.next().await;
    drop(ex);
    pool.wait_inflight(0).await;
    let events = pool.events();
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, Event::Picked { .. }))
            .count(),
        1
    );
    assert_eq!(events.last(), Some(&Event::Cancelled));
    // Envoy half-closing before the response ends cancels too.
    let mut ex = envoy.open().await;
    route_chunked(&mut ex, "/v1/chat/completions", &chat_body(4), &[64]).await;
    ex.close_send();
    ex.expect_end().await;
    pool.wait_inflight(0).await;
}

#[tokio::test]
async fn buffered_mode_answers_every_message_once() {
    let pool = ScriptedPool::new(&[A, B]);
    let (_s, envoy) = picker(pool.clone()).await;
    let body = chat_body(5);
    let mut ex = envoy.open().await;
    ex.send(with_modes(
        request_headers("/v1/chat/completions", &[], false),
        BodySendMode::Buffered,
        BodySendMode::Buffered,
    ))
    .await;
    let first = headers_answer(&ex.next().await);
    assert!(
        first.set.is_empty() && !first.clear_route_cache,
        "headers pass unchanged: {first:?}"
    );
    ex.send(request_body(&body, true)).await;
    let route = body_answer(&ex.next().await);
    assert_eq!(
        route.set,
        vec![
            (wire::DESTINATION_HEADER.to_owned(), format!("{A},{B}")),
            ("content-length".to_owned(), body.len().to_string()),
        ]
    );
    assert!(route.clear_route_cache);
    assert_eq!(route.metadata_destination, Some(format!("{A},{B}")));
    assert_eq!(route.body_mutation, None, "the body is not replaced");
    ex.send(response_headers(200, "application/json", false))
        .await;
    assert!(is_response_headers_continue(&ex.next().await));
    ex.send(response_body(
        br#"{"usage":{"prompt_tokens":5,"completion_tokens":7}}"#,
        true,
    ))
    .await;
    let a = ex.next().await;
    assert!(matches!(a.response, Some(envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response::ResponseBody(_))));
    assert_eq!(
        pool.events().last(),
        Some(&Event::Completed(Usage {
            prompt_tokens: 5,
            cached_tokens: 0,
            output_tokens: 7
        }))
    );
}

#[tokio::test]
async fn adapter_requests_route_on_the_base_model_with_the_adapter() {
    let pool = ScriptedPool::new(&[A]);
    let (_s, envoy) = picker(pool.clone()).await;
    let mut ex = envoy.open().await;
    ex.send(request_headers(
        "/v1/completions",
        &[(wire::BASE_MODEL_HEADER, "llama-3-8b")],
        false,
    ))
    .await;
    ex.send(request_body(
        br#"{"model":"sql-lora","prompt":"select"}"#,
        true,
    ))
    .await;
    headers_answer(&ex.next().await);
    assert!(
        matches!(&pool.events()[0], Event::Picked { model, lora: Some(l), .. } if model == "llama-3-8b" && l == "sql-lora")
    );
}

#[tokio::test]
async fn model_names_are_rewritten_both_ways() {
    let pool = ScriptedPool::new(&[A]);
    let config = PickerConfig {
        model_rewrites: [("llama".to_owned(), "meta/llama-3-8b".to_owned())].into(),
        ..PickerConfig::default()
    };
    let server = serve(EndpointPicker::new(
        config,
        pool.clone(),
        Telemetry::default(),
    ))
    .await;
    let envoy = Envoy::connect(server.addr).await;
    let mut ex = envoy.open().await;
    let body = br#"{"model":"llama","stream":true,"prompt":"hi"}"#;
    let sent = br#"{"model":"meta/llama-3-8b","stream":true,"prompt":"hi"}"#;
    ex.send(request_headers("/v1/completions", &[], false))
        .await;
    ex.send(request_body(body, true)).await;
    let route = headers_answer(&ex.next().await);
    assert_eq!(
        route.header("content-length"),
        Some(sent.len().to_string().as_str())
    );
    assert_eq!(ex.streamed_body(true, 1).await, vec![(sent.to_vec(), true)]);
    assert!(matches!(&pool.events()[0], Event::Picked { model, .. } if model == "meta/llama-3-8b"));
    ex.send(response_headers(200, "text/event-stream", false))
        .await;
    let answer = ex.next().await;
    let removed = match &answer.response {
        Some(envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response::ResponseHeaders(h)) => {
            h.response.clone().unwrap().header_mutation.unwrap().remove_headers
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(removed, ["content-length"]);
    let sse =
        b"data: {\"model\":\"meta/llama-3-8b\",\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n";
    let mut echoed = Vec::new();
    let chunks = split(sse, &[11]);
    for (i, c) in chunks.iter().enumerate() {
        ex.send(response_body(c, i + 1 == chunks.len())).await;
        echoed.extend_from_slice(streamed(&ex.next().await, false).0);
    }
    assert_eq!(
        String::from_utf8(echoed).unwrap(),
        "data: {\"model\":\"llama\",\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n"
    );
    assert!(matches!(pool.events().last(), Some(Event::Completed(_))));
}

#[tokio::test]
async fn metrics_count_outcomes_rejections_and_tokens() {
    let mut registry = prometheus_client::registry::Registry::default();
    let telemetry = Telemetry::register(&mut registry);
    let pool = ScriptedPool::new(&[A, B]);
    let config = PickerConfig {
        pool_name: "llama".into(),
        ..PickerConfig::default()
    };
    let server = serve(EndpointPicker::new(config, pool.clone(), telemetry)).await;
    let envoy = Envoy::connect(server.addr).await;
    let usage = br#"{"usage":{"prompt_tokens":7,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":3}}}"#;
    // Twice on the first choice, once on the fallback the proxy reports having used: the pod
    // label is the endpoint that served, not the first choice.
    for served in [None, None, Some(B)] {
        let mut ex = envoy.open().await;
        route_chunked(&mut ex, "/v1/chat/completions", &chat_body(2), &[64]).await;
        let mut headers = response_headers(200, "application/json", false);
        if let Some(b) = served {
            headers.metadata_context = Some(wire::served_metadata(b.parse().unwrap()));
        }
        ex.send(headers).await;
        ex.next().await;
        ex.send(response_body(usage, true)).await;
        ex.next().await;
    }
    let mut ex = envoy.open().await;
    route_chunked(&mut ex, "/v1/chat/completions", &chat_body(2), &[64]).await;
    ex.send(response_headers(503, "application/json", false))
        .await;
    ex.next().await;
    ex.send(response_body(b"{}", true)).await;
    ex.next().await;
    let mut ex = envoy.open().await;
    route_chunked(&mut ex, "/v1/chat/completions", &chat_body(2), &[64]).await;
    drop(ex);
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    ex.send(request_body(b"nope", true)).await;
    ex.next().await;
    pool.wait_inflight(0).await;
    // The cancelled stream is counted when its task notices the reset.
    let deadline = tokio::time::Instant::now() + ANSWER_TIMEOUT;
    let text = loop {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        if text.contains("outcome=\"cancelled\"") || tokio::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    for line in [
        format!(
            "infergate_extproc_requests_total{{pool=\"llama\",model=\"llama-3-8b\",pod=\"{A}\",outcome=\"success\"}} 2"
        ),
        format!(
            "infergate_extproc_requests_total{{pool=\"llama\",model=\"llama-3-8b\",pod=\"{B}\",outcome=\"success\"}} 1"
        ),
        format!(
            "infergate_extproc_requests_total{{pool=\"llama\",model=\"llama-3-8b\",pod=\"{A}\",outcome=\"error\"}} 1"
        ),
        format!(
            "infergate_extproc_requests_total{{pool=\"llama\",model=\"llama-3-8b\",pod=\"{A}\",outcome=\"cancelled\"}} 1"
        ),
        "infergate_extproc_rejections_total{pool=\"llama\",reason=\"invalid_json\"} 1".to_owned(),
        "infergate_extproc_tokens_total{pool=\"llama\",model=\"llama-3-8b\",kind=\"input\"} 21"
            .to_owned(),
        "infergate_extproc_tokens_total{pool=\"llama\",model=\"llama-3-8b\",kind=\"output\"} 15"
            .to_owned(),
        "infergate_extproc_tokens_total{pool=\"llama\",model=\"llama-3-8b\",kind=\"cached\"} 9"
            .to_owned(),
        "infergate_extproc_pick_duration_seconds_count{pool=\"llama\"} 5".to_owned(),
    ] {
        assert!(text.contains(&line), "missing `{line}` in:\n{text}");
    }
    // Exactly those four request series: no zero-valued series for unseen label sets.
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("infergate_extproc_requests_total{"))
            .count(),
        4,
        "{text}"
    );
}

// ---- body-based router -----------------------------------------------------------------------

async fn bbr() -> (Server, Envoy) {
    let models = ModelsFile::parse("llama-3-8b: [sql-lora, chat-lora]\nqwen-2.5-7b: []\n").unwrap();
    let router = BodyRouter::new(
        BbrConfig::default(),
        models.router().unwrap(),
        BbrTelemetry::default(),
    );
    let server = serve(router).await;
    let envoy = Envoy::connect(server.addr).await;
    (server, envoy)
}

#[tokio::test]
async fn bbr_sets_model_headers_and_clears_the_route_cache() {
    let (_s, envoy) = bbr().await;
    for (model, base) in [
        ("llama-3-8b", "llama-3-8b"),
        ("sql-lora", "llama-3-8b"),
        ("qwen-2.5-7b", "qwen-2.5-7b"),
    ] {
        let body =
            format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
        let mut ex = envoy.open().await;
        let route = route_chunked(&mut ex, "/v1/chat/completions", body.as_bytes(), &[9]).await;
        assert_eq!(
            route.set,
            vec![
                (wire::MODEL_HEADER.to_owned(), model.to_owned()),
                (wire::BASE_MODEL_HEADER.to_owned(), base.to_owned()),
                ("content-length".to_owned(), body.len().to_string()),
            ]
        );
        assert!(route.clear_route_cache);
        assert_eq!(route.metadata_destination, None);
    }
}

/// As `large_response_chunks_pass_in_answers_of_at_most_62000_bytes`, for the body-based router
/// (found by the `extproc_bbr` fuzz target): a request passed through unrouted and a response
/// chunk, each larger than 62,000 bytes, go back in answers of at most `MAX_CHUNK` bytes.
#[tokio::test]
async fn bbr_passes_large_chunks_in_answers_of_at_most_62000_bytes() {
    let (_s, envoy) = bbr().await;
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/files", &[], false)).await;
    ex.next().await;
    let big = vec![b'x'; MAX_CHUNK + 1];
    ex.send(request_body(&big, true)).await;
    let sizes: Vec<(usize, bool)> = ex
        .streamed_body(true, usize::MAX)
        .await
        .iter()
        .map(|(b, eos)| (b.len(), *eos))
        .collect();
    assert_eq!(sizes, [(MAX_CHUNK, false), (1, true)]);
    ex.send(response_headers(200, "application/json", false))
        .await;
    ex.next().await;
    ex.send(response_body(&big, true)).await;
    let sizes: Vec<(usize, bool)> = ex
        .streamed_body(false, usize::MAX)
        .await
        .iter()
        .map(|(b, eos)| (b.len(), *eos))
        .collect();
    assert_eq!(sizes, [(MAX_CHUNK, false), (1, true)]);
}

/// A compressed body is answered 415 at its headers by the picker and the body-based router
/// alike (neither could read it to route, nor could a model server), and an `identity` coding
/// routes as usual.
#[tokio::test]
async fn compressed_bodies_get_415_at_the_headers() {
    let (_p, picker) = picker(ScriptedPool::new(&[A])).await;
    let (_b, bbr) = bbr().await;
    for (envoy, model) in [(&picker, "m"), (&bbr, "llama-3-8b")] {
        let mut ex = envoy.open().await;
        ex.send(request_headers(
            "/v1/chat/completions",
            &[("content-encoding", "gzip")],
            false,
        ))
        .await;
        let (status, _, json) = immediate_parts(&ex.next().await);
        assert_eq!(status, 415);
        assert_eq!(json["error"]["code"], "unsupported_content_encoding");
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("`gzip`"),
            "{json}"
        );
        ex.expect_end().await;

        let mut ex = envoy.open().await;
        ex.send(request_headers(
            "/v1/chat/completions",
            &[("content-encoding", "identity")],
            false,
        ))
        .await;
        let body =
            format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
        ex.send(request_body(body.as_bytes(), true)).await;
        let answer = ex.next().await;
        assert!(
            !matches!(
                answer.response,
                Some(processing_response::Response::ImmediateResponse(_))
            ),
            "{answer:?}"
        );
    }
}

#[tokio::test]
async fn bbr_unknown_model_is_404_telling_to_set_model() {
    let (_s, envoy) = bbr().await;
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/chat/completions", &[], false))
        .await;
    ex.send(request_body(
        br#"{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}"#,
        true,
    ))
    .await;
    let (status, _, json) = immediate_parts(&ex.next().await);
    assert_eq!(status, 404);
    assert_eq!(json["error"]["param"], "model");
    let msg = json["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("gpt-9") && msg.contains("`model` field"),
        "{msg}"
    );
}

#[tokio::test]
async fn bbr_buffered_mode_and_header_only_requests() {
    let (_s, envoy) = bbr().await;
    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/models", &[], true)).await;
    let r = headers_answer(&ex.next().await);
    assert!(r.set.is_empty());
    let mut ex = envoy.open().await;
    ex.send(with_modes(
        request_headers("/v1/completions", &[], false),
        BodySendMode::Buffered,
        BodySendMode::None,
    ))
    .await;
    headers_answer(&ex.next().await);
    ex.send(request_body(br#"{"model":"chat-lora","prompt":"x"}"#, true))
        .await;
    let r = body_answer(&ex.next().await);
    assert_eq!(r.header(wire::BASE_MODEL_HEADER), Some("llama-3-8b"));
    assert!(r.clear_route_cache);
    assert!(!matches!(
        r.body_mutation,
        Some(body_mutation::Mutation::Body(_))
    ));
}

// ---- body-based router: client-sent routing headers ------------------------------------------

/// A value a client might put in a routing header to pick a pool of its choosing.
const SPOOF: &str = "spoofed-pool";

/// Request headers as the harness sends them.
type Headers = Vec<(&'static str, &'static str)>;

/// Client-sent routing headers, in several letter cases, repeated, and naming a real pool; with
/// the header names the router must list in `remove_headers` (lowercase, model first).
fn spoofed_header_sets() -> Vec<(Headers, Vec<String>)> {
    let both = vec![
        wire::MODEL_HEADER.to_owned(),
        wire::BASE_MODEL_HEADER.to_owned(),
    ];
    vec![
        (
            vec![
                ("x-gateway-model-name", SPOOF),
                ("x-gateway-base-model-name", SPOOF),
            ],
            both.clone(),
        ),
        (
            vec![("X-Gateway-Model-Name", SPOOF)],
            vec![wire::MODEL_HEADER.to_owned()],
        ),
        (
            vec![("X-GATEWAY-BASE-MODEL-NAME", "qwen-2.5-7b")],
            vec![wire::BASE_MODEL_HEADER.to_owned()],
        ),
        (
            vec![
                ("x-gateway-model-name", "qwen-2.5-7b"),
                ("X-Gateway-Model-NAME", SPOOF),
                ("x-gateway-BASE-model-name", SPOOF),
            ],
            both,
        ),
    ]
}

/// Fails if any of `answers` carries `value`, as text or as bytes (a header's `raw_value` and a
/// body are `Vec<u8>`, which `Debug` prints as numbers).
fn assert_no_trace(answers: &[ProcessingResponse], value: &str) {
    let as_numbers = value
        .bytes()
        .map(|b| b.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    for a in answers {
        let text = format!("{a:?}");
        assert!(
            !text.contains(value) && !text.contains(&as_numbers),
            "`{value}` reached an answer: {text}"
        );
    }
}

#[tokio::test]
async fn bbr_overwrites_client_routing_headers_with_the_body_model() {
    let (_s, envoy) = bbr().await;
    for (headers, removed) in spoofed_header_sets() {
        for (model, base) in [("sql-lora", "llama-3-8b"), ("llama-3-8b", "llama-3-8b")] {
            let body =
                format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
            let expected_set = vec![
                (wire::MODEL_HEADER.to_owned(), model.to_owned()),
                (wire::BASE_MODEL_HEADER.to_owned(), base.to_owned()),
                ("content-length".to_owned(), body.len().to_string()),
            ];

            // Full duplex: one routing answer once the body has ended, then the body.
            let mut ex = envoy.open().await;
            ex.send(request_headers("/v1/chat/completions", &headers, false))
                .await;
            let chunks = split(body.as_bytes(), &[7]);
            for (i, c) in chunks.iter().enumerate() {
                ex.send(request_body(c, i + 1 == chunks.len())).await;
            }
            let first = ex.next().await;
            let route = headers_answer(&first);
            assert_eq!(route.set, expected_set, "{headers:?}");
            assert_eq!(route.removed, removed, "{headers:?}");
            assert!(route.clear_route_cache);
            let chunk = ex.next().await;
            assert_eq!(streamed(&chunk, true), (body.as_bytes(), true));
            let answers = [first, chunk];
            assert_no_trace(&answers, SPOOF);
            assert_no_trace(&answers, "qwen-2.5-7b");

            // Buffered: the headers answer already removes them; the body answer routes.
            let mut ex = envoy.open().await;
            ex.send(with_modes(
                request_headers("/v1/chat/completions", &headers, false),
                BodySendMode::Buffered,
                BodySendMode::None,
            ))
            .await;
            let on_headers = ex.next().await;
            let r = headers_answer(&on_headers);
            assert!(r.set.is_empty());
            assert_eq!(r.removed, removed);
            assert!(r.clear_route_cache);
            ex.send(request_body(body.as_bytes(), true)).await;
            let on_body = ex.next().await;
            let r = body_answer(&on_body);
            assert_eq!(r.set, expected_set);
            assert_eq!(r.removed, removed);
            assert!(r.clear_route_cache);
            let answers = [on_headers, on_body];
            assert_no_trace(&answers, SPOOF);
            assert_no_trace(&answers, "qwen-2.5-7b");
        }
    }
}

#[tokio::test]
async fn bbr_removes_client_routing_headers_on_other_paths_and_header_only_requests() {
    let (_s, envoy) = bbr().await;
    for (headers, removed) in spoofed_header_sets() {
        // Header-only requests: a non-API path, the model list, and an API path with no body.
        for path in ["/metrics", "/v1/models", "/v1/chat/completions"] {
            let mut ex = envoy.open().await;
            ex.send(request_headers(path, &headers, true)).await;
            let a = ex.next().await;
            let r = headers_answer(&a);
            assert!(r.set.is_empty(), "{path}: {:?}", r.set);
            assert_eq!(r.removed, removed, "{path}");
            assert!(r.clear_route_cache, "{path}");
            assert!(r.body_mutation.is_none());
            let answers = [a];
            assert_no_trace(&answers, SPOOF);
            assert_no_trace(&answers, "qwen-2.5-7b");
        }

        // A non-API path with a body (full duplex): the headers are answered at once, before
        // any body, and each chunk passes back as it came; nothing else is changed.
        let mut ex = envoy.open().await;
        ex.send(request_headers("/internal/upload", &headers, false))
            .await;
        let a = ex.next().await;
        let r = headers_answer(&a);
        assert!(r.set.is_empty(), "no content-length or model headers");
        assert_eq!(r.removed, removed);
        assert!(r.clear_route_cache);
        let mut answers = vec![a];
        for (chunk, eos) in [(&b"not "[..], false), (&b"json"[..], true)] {
            ex.send(request_body(chunk, eos)).await;
            let echo = ex.next().await;
            assert_eq!(streamed(&echo, true), (chunk, eos));
            answers.push(echo);
        }
        assert_no_trace(&answers, SPOOF);
        assert_no_trace(&answers, "qwen-2.5-7b");

        // A body mode that does not show the body: removed when the headers are answered.
        let mut ex = envoy.open().await;
        ex.send(with_modes(
            request_headers("/v1/completions", &headers, false),
            BodySendMode::None,
            BodySendMode::None,
        ))
        .await;
        let a = ex.next().await;
        let r = headers_answer(&a);
        assert!(r.set.is_empty());
        assert_eq!(r.removed, removed);
        assert!(r.clear_route_cache);
        let answers = [a];
        assert_no_trace(&answers, SPOOF);
        assert_no_trace(&answers, "qwen-2.5-7b");
    }
}

#[tokio::test]
async fn bbr_leaves_other_requests_without_routing_headers_untouched() {
    let (_s, envoy) = bbr().await;
    // Header-only, full duplex with a body, buffered with a body: no mutation at all and no
    // `clear_route_cache` (nothing changed that a route could match on).
    let mut ex = envoy.open().await;
    ex.send(request_headers("/metrics", &[("x-other", "1")], true))
        .await;
    let r = headers_answer(&ex.next().await);
    assert!(r.set.is_empty() && r.removed.is_empty() && !r.clear_route_cache);

    let mut ex = envoy.open().await;
    ex.send(request_headers("/v1/files", &[], false)).await;
    let r = headers_answer(&ex.next().await);
    assert!(r.set.is_empty() && r.removed.is_empty() && !r.clear_route_cache);
    ex.send(request_body(b"abc", false)).await;
    assert_eq!(streamed(&ex.next().await, true), (&b"abc"[..], false));
    ex.send(request_trailers()).await;
    assert!(is_trailers(&ex.next().await, true));

    let mut ex = envoy.open().await;
    ex.send(with_modes(
        request_headers("/v1/files", &[], false),
        BodySendMode::Buffered,
        BodySendMode::None,
    ))
    .await;
    let r = headers_answer(&ex.next().await);
    assert!(r.set.is_empty() && r.removed.is_empty() && !r.clear_route_cache);
    ex.send(request_body(b"{}", true)).await;
    let r = body_answer(&ex.next().await);
    assert!(r.set.is_empty() && r.removed.is_empty() && !r.clear_route_cache);
    assert!(r.body_mutation.is_none(), "the body is not replaced");
}

#[tokio::test]
async fn bbr_bodies_without_a_model_get_400_json_and_no_spoofed_value() {
    let (_s, envoy) = bbr().await;
    let headers = [
        ("X-Gateway-Model-Name", SPOOF),
        ("x-gateway-base-model-name", SPOOF),
    ];
    let cases: [(&[u8], &str); 5] = [
        (
            br#"{"messages":[{"role":"user","content":"hi"}]}"#,
            "missing_model",
        ),
        (br#"{"model":"","messages":[]}"#, "missing_model"),
        (b"not json at all", "invalid_json"),
        (br#"{"model":"llama-3-8b","messages":"#, "invalid_json"),
        (b"", "invalid_json"),
    ];
    for (body, code) in cases {
        for buffered in [false, true] {
            let what = format!("{} (buffered: {buffered})", String::from_utf8_lossy(body));
            let mut ex = envoy.open().await;
            let h = request_headers("/v1/chat/completions", &headers, false);
            let mut answers = Vec::new();
            if buffered {
                ex.send(with_modes(h, BodySendMode::Buffered, BodySendMode::None))
                    .await;
                let a = ex.next().await;
                assert_eq!(headers_answer(&a).removed.len(), 2);
                answers.push(a);
            } else {
                ex.send(h).await;
            }
            ex.send(request_body(body, true)).await;
            let a = ex.next().await;
            let (status, h, json) = immediate_parts(&a);
            assert_eq!(status, 400, "{what}");
            assert_eq!(
                h.get("content-type").map(String::as_str),
                Some("application/json"),
                "{what}"
            );
            assert_eq!(json["error"]["code"], code, "{what}");
            assert_eq!(json["error"]["type"], "invalid_request_error", "{what}");
            answers.push(a);
            ex.expect_end().await;
            assert_no_trace(&answers, SPOOF);
        }
    }
}
