use super::*;
use proptest::prelude::*;

const STREAM: &str = concat!(
    "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n",
    "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n",
    "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\n\n",
    "data: {\"id\":\"1\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,\"total_tokens\":14,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n",
    "data: [DONE]\n\n",
);

fn expected() -> Usage {
    Usage {
        prompt_tokens: 12,
        completion_tokens: 2,
        cached_tokens: 8,
    }
}

#[test]
fn json_usage_is_read_with_cached_tokens() {
    let body = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}"#;
    assert_eq!(extract_usage(body), Some(expected()));
    let body = br#"{"usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
    assert_eq!(
        extract_usage(body),
        Some(Usage {
            prompt_tokens: 3,
            completion_tokens: 4,
            cached_tokens: 0
        })
    );
    // Responses API names.
    let body = br#"{"usage":{"input_tokens":5,"output_tokens":6,"input_tokens_details":{"cached_tokens":1}}}"#;
    assert_eq!(
        extract_usage(body),
        Some(Usage {
            prompt_tokens: 5,
            completion_tokens: 6,
            cached_tokens: 1
        })
    );
    assert_eq!(extract_usage(b"{}"), None);
    assert_eq!(extract_usage(b"garbage"), None);
    assert_eq!(extract_usage(br#"{"usage":"lots"}"#), None);
}

#[test]
fn stream_in_one_chunk() {
    let mut s = SseScanner::new();
    assert!(s.feed(STREAM.as_bytes()));
    s.finish();
    assert!(s.done() && s.saw_first_token());
    assert_eq!(s.usage(), Some(expected()));
    assert_eq!(s.events(), 4);
}

/// Counting, the scanner counts the events with text (not the role-only first one nor the
/// usage-only last one), fed whole or byte by byte; a scanner made with `new` does not count.
#[test]
fn a_counting_scanner_counts_the_events_that_carry_text() {
    let mut s = SseScanner::counting_text();
    s.feed(STREAM.as_bytes());
    s.finish();
    assert_eq!(s.text_events(), Some(2));
    let mut s = SseScanner::counting_text();
    for b in STREAM.as_bytes() {
        s.feed(std::slice::from_ref(b));
    }
    s.finish();
    assert_eq!(s.text_events(), Some(2));
    assert!(s.saw_first_token());
    let mut s = SseScanner::new();
    s.feed(STREAM.as_bytes());
    assert_eq!(s.text_events(), None);
    assert!(s.saw_first_token());
}

#[test]
fn role_only_chunk_is_not_the_first_token() {
    let mut s = SseScanner::new();
    let first_event_end = STREAM.find("\n\n").unwrap() + 2;
    assert!(!s.feed(&STREAM.as_bytes()[..first_event_end]));
    assert!(!s.saw_first_token());
    assert!(s.feed(&STREAM.as_bytes()[first_event_end..]));
}

#[test]
fn completions_text_and_crlf_lines() {
    let mut s = SseScanner::new();
    assert!(s.feed(b"data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\ndata: [DONE]\r\n"));
    assert!(s.done());
}

#[test]
fn final_line_without_newline_is_read_on_finish() {
    let mut s = SseScanner::new();
    s.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}");
    assert_eq!(s.usage(), None);
    s.finish();
    assert_eq!(s.usage().map(|u| u.prompt_tokens), Some(1));
}

#[test]
fn overlong_lines_are_skipped_and_reported() {
    let mut s = SseScanner::new();
    let big = vec![b'x'; MAX_SSE_LINE + 10];
    s.feed(b"data: ");
    s.feed(&big);
    s.feed(b"still the same line\n");
    assert!(s.overflowed());
    s.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n");
    assert!(
        s.saw_first_token(),
        "scanning resumes after the long line ends"
    );
}

#[test]
fn garbage_events_are_ignored() {
    let mut s = SseScanner::new();
    s.feed(b"data: {not json\n: comment\nevent: x\ndata: \"usage\"\n\n");
    assert!(!s.saw_first_token());
    assert_eq!(s.usage(), None);
}

proptest! {
    #[test]
    fn any_chunking_gives_the_same_result(cuts in proptest::collection::vec(0usize..STREAM.len(), 0..12)) {
        let mut cuts = cuts;
        cuts.sort_unstable();
        cuts.dedup();
        let bytes = STREAM.as_bytes();
        let mut s = SseScanner::new();
        let mut firsts = 0;
        let mut prev = 0;
        for c in cuts.into_iter().chain(std::iter::once(bytes.len())) {
            if s.feed(&bytes[prev..c]) { firsts += 1; }
            prev = c;
        }
        s.finish();
        prop_assert_eq!(firsts, 1);
        prop_assert_eq!(s.usage(), Some(expected()));
        prop_assert!(s.done());
    }

    #[test]
    fn arbitrary_bytes_never_panic(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8)) {
        let mut s = SseScanner::new();
        for c in &chunks { s.feed(c); }
        s.finish();
    }
}

#[test]
fn the_skim_reads_usage_where_json_puts_it() {
    let u = |p, c, k| {
        Some(Usage {
            prompt_tokens: p,
            completion_tokens: c,
            cached_tokens: k,
        })
    };
    // Keys that look like `usage` inside strings and nested objects are not it.
    let body = br#"{"choices":[{"message":{"content":"\"usage\":{\"prompt_tokens\":99}","usage":{"prompt_tokens":98}}}],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#;
    assert_eq!(extract_usage(body), u(1, 2, 0));
    // Whitespace everywhere JSON allows it.
    let body = b" \n{ \"id\" : \"x\" ,\r\n\t\"usage\" : { \"prompt_tokens\" : 4 , \"completion_tokens\" : 5 } } \n";
    assert_eq!(extract_usage(body), u(4, 5, 0));
    // A key spelled with an escape is still `usage` (the full parse decides).
    let body = br#"{"us\u0061ge":{"prompt_tokens":6,"completion_tokens":7}}"#;
    assert_eq!(extract_usage(body), u(6, 7, 0));
    // The Responses API's streamed `response.completed` event nests it.
    let body = br#"{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":8,"output_tokens":9}}}"#;
    assert_eq!(extract_usage(body), u(8, 9, 0));
    // What JSON refuses, the skim refuses: a repeated key, trailing bytes, a cut-off body, a
    // trailing comma, a null usage.
    for body in [
        &br#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}"#[..],
        br#"{"usage":{"prompt_tokens":1}} x"#,
        br#"{"usage":{"prompt_tokens":1},"choices":[{"text":"cut"#,
        br#"{"usage":{"prompt_tokens":1},}"#,
        br#"{"usage":null,"choices":[]}"#,
        br#"{"id":,"usage":{"prompt_tokens":1}}"#,
        b"",
        b"{",
        b"\"usage\"",
    ] {
        assert_eq!(
            extract_usage(body),
            None,
            "{}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(full_parse(body), None);
    }
}

/// JSON values of every kind, with strings that hold quotes, backslashes and escapes.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let text = proptest::string::string_regex(r#"[a-z"\\/ \n\t\u{e9}{}\[\]:,]{0,12}"#)
        .unwrap_or_else(|_| unreachable!("a valid pattern"));
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        text.prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        let key = prop_oneof![
            Just("usage".to_owned()),
            Just("prompt_tokens".to_owned()),
            "[a-z\"\\\\]{1,6}"
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            proptest::collection::vec((key, inner), 0..4)
                .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn the_skim_agrees_with_the_full_parse(
        others in proptest::collection::vec(("[a-z_\"]{1,8}", json_value()), 0..5),
        usage in prop_oneof![
            Just(None),
            Just(Some(serde_json::Value::Null)),
            (0u64..1000, 0u64..1000, proptest::option::of(0u64..1000)).prop_map(|(p, c, k)| {
                let mut u = serde_json::json!({"prompt_tokens": p, "completion_tokens": c});
                if let Some(k) = k {
                    u["prompt_tokens_details"] = serde_json::json!({"cached_tokens": k});
                }
                Some(u)
            }),
            json_value().prop_map(Some),
        ],
        at in 0usize..6,
        pretty in any::<bool>(),
    ) {
        let mut map = serde_json::Map::new();
        for (i, (k, v)) in others.into_iter().enumerate() {
            if i == at && let Some(u) = &usage {
                map.insert("usage".to_owned(), u.clone());
            }
            map.entry(k).or_insert(v);
        }
        if let Some(u) = usage {
            map.entry("usage".to_owned()).or_insert(u);
        }
        let v = serde_json::Value::Object(map);
        let body = if pretty { serde_json::to_vec_pretty(&v) } else { serde_json::to_vec(&v) };
        let body = body.unwrap_or_default();
        prop_assert_eq!(extract_usage(&body), full_parse(&body), "{}", String::from_utf8_lossy(&body));
    }

    #[test]
    fn the_skim_never_panics_on_any_bytes(body in proptest::collection::vec(any::<u8>(), 0..96)) {
        let _ = extract_usage(&body);
    }
}
