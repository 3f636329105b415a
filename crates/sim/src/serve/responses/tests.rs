use serde_json::{Value, json};

use super::*;
use crate::serve::http::tests::shared;
use crate::serve::http::{self, Api};

fn request(body: &Value) -> Result<ResponsesRequest, Reject> {
    parse(&shared(), body.to_string().as_bytes())
}

fn prompt_text(p: &Prompt) -> &str {
    match p {
        Prompt::Text(t) => t,
        Prompt::Tokens { .. } | Prompt::Ids(_) => panic!("a text prompt: {p:?}"),
    }
}

fn completion(prompt_tokens: u32, cached_tokens: u32, output_tokens: u32) -> Completion {
    Completion {
        id: 9,
        pod: 0,
        arrival: 0.0,
        scheduled: 0.0,
        first_token: 0.1,
        last_token: 0.2,
        prompt_tokens,
        cached_tokens,
        output_tokens,
        preemptions: 0,
    }
}

/// The `(event, data)` pairs of a stream, checking each is one `event:` line and one `data:` line.
fn frames(stream: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(stream).unwrap();
    assert!(text.ends_with("\n\n"), "{text}");
    text.trim_end()
        .split("\n\n")
        .map(|frame| {
            let (event, data) = frame.split_once('\n').unwrap();
            let event = event.strip_prefix("event: ").unwrap().to_owned();
            let data = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            (event, data)
        })
        .collect()
}

#[test]
fn a_request_is_the_chat_request_of_its_messages() {
    let r = request(&json!({
        "model": "a", "instructions": "Be brief.", "input": "Hello there",
        "max_output_tokens": 7, "stream": true,
    }))
    .unwrap();
    let chat = http::parse(
        &shared(),
        json!({
            "model": "a", "max_tokens": 7, "stream": true,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hello there"},
            ],
        })
        .to_string()
        .as_bytes(),
        Api::Chat,
    )
    .unwrap();
    // The same prompt (so the same tokens and prefix-cache blocks), adapter, length and mode.
    assert_eq!(r.parsed.prompt, chat.prompt);
    assert_eq!(r.parsed.lora, Some(0));
    assert_eq!(r.parsed.lora, chat.lora);
    assert_eq!(r.parsed.max_tokens, 7);
    assert!(r.parsed.explicit_max && r.parsed.stream);
    assert_eq!(r.parsed.model, "a");
}

#[test]
fn input_items_render_as_their_messages() {
    let r = request(&json!({"input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is 2+2?"}]},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{\"a\":2}"},
        {"type": "function_call_output", "call_id": "c1", "output": "4"},
        {"role": "assistant", "content": "It is 4."},
    ]}))
    .unwrap();
    assert_eq!(
        prompt_text(&r.parsed.prompt),
        "<|user|>\nWhat is 2+2?\n<|assistant|>\n{\"a\":2}\n<|tool|>\n4\n<|assistant|>\nIt is 4.\n<|assistant|>\n"
    );
    // No model: the base model. No length: the chat default, not an explicit limit.
    assert_eq!(r.parsed.model, "meta-llama/Llama-3.1-8B-Instruct");
    assert_eq!(r.parsed.lora, None);
    assert_eq!(r.parsed.max_tokens, http::DEFAULT_CHAT_MAX_TOKENS);
    assert!(!r.parsed.explicit_max && !r.parsed.stream);
    // Empty instructions add nothing, as in vLLM.
    let r = request(&json!({"instructions": "", "input": "x"})).unwrap();
    assert_eq!(
        prompt_text(&r.parsed.prompt),
        "<|user|>\nx\n<|assistant|>\n"
    );
}

#[test]
fn bad_requests_are_refused_with_the_field_named() {
    let cases = [
        (json!({"model": "a"}), 400, Some("input")),
        (json!({"input": 5}), 400, Some("input")),
        (
            json!({"input": [{"type": "reasoning", "summary": []}]}),
            400,
            Some("input"),
        ),
        (
            json!({"input": [{"content": "no role"}]}),
            400,
            Some("input"),
        ),
        (
            json!({"input": [{"role": "user", "content": 3}]}),
            400,
            Some("input"),
        ),
        (
            json!({"input": "x", "instructions": 3}),
            400,
            Some("instructions"),
        ),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            400,
            Some("max_output_tokens"),
        ),
        (
            json!({"input": "x", "max_output_tokens": "9"}),
            400,
            Some("max_output_tokens"),
        ),
        (json!({"input": "x", "stream": "yes"}), 400, Some("stream")),
        (json!({"input": "x", "model": 1}), 400, Some("model")),
        (json!({"input": "x", "model": "nope"}), 404, Some("model")),
        (
            json!({"input": "x", "background": true}),
            400,
            Some("background"),
        ),
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            404,
            Some("response_id"),
        ),
        (json!(["input"]), 400, None),
    ];
    for (body, status, param) in cases {
        let Err((got, msg, got_param)) = request(&body) else {
            panic!("{body} was accepted");
        };
        assert_eq!((got.as_u16(), got_param), (status, param), "{body}: {msg}");
        assert!(!msg.is_empty());
    }
    assert_eq!(parse(&shared(), b"{not json").err().unwrap().0, 400);
}

#[test]
fn the_output_length_is_cut_to_the_room_the_context_leaves() {
    let s = shared();
    let max_len = s.profile.max_model_len;
    // 100 tokens of input text (4 bytes a token) plus the template's.
    let input = "abcd".repeat(100);
    let r = request(&json!({"input": input, "max_output_tokens": u64::from(max_len) * 2})).unwrap();
    let prompt_tokens = r.parsed.prompt.token_count();
    assert!(prompt_tokens > 100);
    assert_eq!(r.parsed.max_tokens, max_len - prompt_tokens);
    assert!(r.parsed.explicit_max);
    // A prompt that fills the context is refused.
    let input = "abcd".repeat(max_len as usize);
    let (status, msg, param) = request(&json!({"input": input})).err().unwrap();
    assert_eq!((status.as_u16(), param), (400, Some("input")), "{msg}");
    assert!(msg.contains("exceeds the max_model_len"), "{msg}");
}

#[test]
fn a_stream_is_vllms_event_sequence() {
    let r = request(&json!({"input": "Hi", "max_output_tokens": 3, "stream": true})).unwrap();
    let mut events = Events::new(r, "p", 9, 1_700_000_000);
    let mut out = events.start().to_vec();
    for word in [" the", " model", " server"] {
        out.extend_from_slice(&events.delta(word));
    }
    out.extend_from_slice(&events.completed(&completion(5, 2, 3)));
    let frames = frames(&out);
    let kinds: Vec<&str> = frames.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, (kind, data)) in frames.iter().enumerate() {
        assert_eq!(data["type"], json!(kind), "{data}");
        assert_eq!(data["sequence_number"], json!(i), "{data}");
    }
    let created = &frames[0].1["response"];
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["id"], "resp_p-9");
    assert_eq!(created["output"], json!([]));
    assert_eq!(created["usage"], Value::Null);
    // The message is opened empty, its text part with no text, and filled by the deltas.
    assert_eq!(frames[2].1["item"]["status"], "in_progress");
    assert_eq!(frames[2].1["item"]["id"], "msg_p-9");
    assert_eq!(frames[3].1["part"]["text"], "");
    let deltas: String = frames[4..7]
        .iter()
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, " the model server");
    assert_eq!(frames[7].1["text"], json!(deltas));
    for (_, d) in &frames[3..9] {
        assert_eq!(d["item_id"], "msg_p-9", "{d}");
        assert_eq!(
            (&d["output_index"], &d["content_index"]),
            (&json!(0), &json!(0))
        );
    }
    assert_eq!(frames[9].1["item"]["content"][0]["text"], json!(deltas));
    // Completed: the whole response with vLLM's usage; it stopped at max_output_tokens.
    let done = &frames[10].1["response"];
    assert_eq!(done["status"], "incomplete");
    assert_eq!(done["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(done["output"][0]["content"][0]["text"], json!(deltas));
    assert_eq!(
        done["usage"],
        json!({
            "input_tokens": 5,
            "input_tokens_details": {
                "cached_tokens": 2, "cache_write_tokens": 0,
                "input_tokens_per_turn": [], "cached_tokens_per_turn": [],
            },
            "output_tokens": 3,
            "output_tokens_details": {
                "reasoning_tokens": 0, "tool_output_tokens": 0,
                "output_tokens_per_turn": [], "tool_output_tokens_per_turn": [],
            },
            "total_tokens": 8,
        })
    );
    // vLLM ends the stream with the last event: no `[DONE]`.
    assert!(!String::from_utf8_lossy(&out).contains("[DONE]"));
}

#[test]
fn a_json_answer_is_the_completed_response() {
    let r = request(&json!({"model": "a", "instructions": "Be brief.", "input": "Hi", "temperature": 0.5, "user": "u1"})).unwrap();
    let mut events = Events::new(r, "p", 4, 1_700_000_000);
    events.text = "hello".into();
    let v = events.object(&completion(12, 8, 256));
    assert_eq!(v["object"], "response");
    assert_eq!(v["id"], "resp_p-4");
    assert_eq!(v["created_at"], 1_700_000_000);
    assert_eq!(v["model"], "a");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["incomplete_details"], Value::Null);
    assert_eq!(v["max_output_tokens"], 256);
    // The request's fields are repeated, vLLM's defaults filled in.
    assert_eq!(v["instructions"], "Be brief.");
    assert_eq!(v["temperature"], 0.5);
    assert_eq!(v["user"], "u1");
    assert_eq!(v["top_p"], 1.0);
    assert_eq!(v["tools"], json!([]));
    assert_eq!(v["tool_choice"], "auto");
    assert_eq!(
        v["output"],
        json!([{
            "id": "msg_p-4", "type": "message", "role": "assistant", "status": "completed",
            "phase": null,
            "content": [{"type": "output_text", "text": "hello", "annotations": [], "logprobs": null}],
        }])
    );
    assert_eq!(v["usage"]["input_tokens"], 12);
    assert_eq!(v["usage"]["input_tokens_details"]["cached_tokens"], 8);
    assert_eq!(v["usage"]["output_tokens"], 256);
    assert_eq!(v["usage"]["total_tokens"], 268);
}
