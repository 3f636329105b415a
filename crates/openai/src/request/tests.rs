use super::*;
use proptest::prelude::*;

fn chat(body: &str) -> Result<ParsedRequest<'_>, ApiError> {
    parse_request(ApiKind::ChatCompletions, body.as_bytes())
}

#[test]
fn chat_request_yields_model_stream_and_segments() {
    let body = r#"{"model":"llama","stream":true,"stream_options":{"include_usage":true},
        "max_completion_tokens":64,"temperature":0.2,
        "messages":[{"role":"system","content":"be brief"},
                    {"role":"user","content":[{"type":"text","text":"hello"},{"type":"image_url","image_url":{"url":"x"}}]}]}"#;
    let r = chat(body).unwrap();
    assert_eq!(r.model, "llama");
    assert!(r.stream && r.include_usage);
    assert_eq!(r.max_output_tokens, Some(64));
    let segs: Vec<&str> = r.segments().collect();
    assert_eq!(segs, ["system", "be brief", "user", "hello"]);
    assert_eq!(r.prompt_chars(), 6 + 8 + 4 + 5);
    assert_eq!(r.estimated_prompt_tokens(), 23usize.div_ceil(4) as u32);
}

#[test]
fn strings_without_escapes_are_borrowed() {
    let r = chat(r#"{"model":"m","messages":[{"role":"user","content":"plain"}]}"#).unwrap();
    assert!(matches!(r.model, Cow::Borrowed(_)));
    assert!(r.prompt.iter().all(|s| matches!(s, Cow::Borrowed(_))));
    let r = chat(r#"{"model":"m","messages":[{"role":"user","content":"a\nb"}]}"#).unwrap();
    assert_eq!(r.prompt[1], "a\nb");
}

#[test]
fn completions_accept_strings_arrays_and_token_ids() {
    fn p(b: &str) -> Result<ParsedRequest<'_>, ApiError> {
        parse_request(ApiKind::Completions, b.as_bytes())
    }
    let r = p(r#"{"model":"m","prompt":"abcdefgh","max_tokens":5}"#).unwrap();
    assert_eq!(r.estimated_prompt_tokens(), 2);
    assert_eq!(r.max_output_tokens, Some(5));
    let r = p(r#"{"model":"m","prompt":["ab","cd"]}"#).unwrap();
    assert_eq!(r.segments().collect::<Vec<_>>(), ["ab", "cd"]);
    let r = p(r#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
    assert_eq!(r.estimated_prompt_tokens(), 3);
    let r = p(r#"{"model":"m","prompt":[[1,2],[3]]}"#).unwrap();
    assert_eq!(r.prompt_token_ids, 3);
    assert!(p(r#"{"model":"m"}"#).is_err());
    assert!(p(r#"{"model":"m","prompt":{"a":1}}"#).is_err());
    assert!(p(r#"{"model":"m","prompt":[true]}"#).is_err());
}

#[test]
fn responses_and_embeddings() {
    let r = parse_request(
        ApiKind::Responses,
        br#"{"model":"m","instructions":"sys","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]}"#,
    )
    .unwrap();
    assert_eq!(r.segments().collect::<Vec<_>>(), ["sys", "user", "hi"]);
    let r = parse_request(ApiKind::Responses, br#"{"model":"m","input":"hello"}"#).unwrap();
    assert_eq!(r.segments().collect::<Vec<_>>(), ["hello"]);
    let r = parse_request(ApiKind::Embeddings, br#"{"model":"m","input":["a","b"]}"#).unwrap();
    assert_eq!(r.prompt.len(), 2);
}

#[test]
fn bad_input_gets_a_typed_error_naming_the_field() {
    let cases: &[(&str, &str)] = &[
        ("", "invalid_json"),
        ("not json", "invalid_json"),
        ("[1,2]", "invalid_json"),
        ("{\"model\":", "invalid_json"),
        ("\u{0}\u{1}\u{2}", "invalid_json"),
        (r#"{"messages":[]}"#, "missing_model"),
        (r#"{"model":"  ","messages":[]}"#, "missing_model"),
        (r#"{"model":7,"messages":[]}"#, "invalid_field"),
        (r#"{"model":"m","messages":[]}"#, "invalid_field"),
        (r#"{"model":"m"}"#, "invalid_field"),
        (r#"{"model":"m","messages":"hi"}"#, "invalid_field"),
        (
            r#"{"model":"m","stream":"yes","messages":[]}"#,
            "invalid_field",
        ),
        (
            r#"{"model":"m","max_tokens":-1,"messages":[{"role":"user","content":"x"}]}"#,
            "invalid_field",
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
            "invalid_field",
        ),
    ];
    for (body, label) in cases {
        let err = chat(body).unwrap_err();
        assert_eq!(err.metric_label(), *label, "{body}: {err}");
        assert_eq!(err.status(), 400, "{body}");
    }
    let err = chat(r#"{"model":"m","messages":[{"role":"user","content":5}]}"#).unwrap_err();
    assert!(err.to_string().contains("messages[0].content"), "{err}");
    // An empty `model` is said to be empty: the field is there (it read "has no `model` field").
    for body in [
        r#"{"model":"","messages":[]}"#,
        r#"{"model":"  ","messages":[]}"#,
    ] {
        let err = chat(body).unwrap_err().to_string();
        assert!(
            err.starts_with("the request's `model` is empty"),
            "{body}: {err}"
        );
    }
    let err = chat(r#"{"messages":[]}"#).unwrap_err().to_string();
    assert!(err.starts_with("the request has no `model` field"), "{err}");
    // An empty body says so, not where the parser stopped.
    for body in ["", " \r\n"] {
        assert_eq!(
            chat(body).unwrap_err().to_string(),
            "the request body is not valid JSON: the body is empty: send a JSON object with \
             `model` and the API's fields"
        );
    }
}

/// vLLM's `cache_salt`: a string (borrowed, or unescaped), else none. A salt that is not a
/// string is not refused here (vLLM refuses it, other engines ignore the field): it salts
/// nothing.
#[test]
fn cache_salt_is_read_and_anything_but_a_string_is_none() {
    let with = |salt: &str| {
        let body = format!(
            r#"{{"model":"m","cache_salt":{salt},"messages":[{{"role":"user","content":"hi"}}]}}"#
        );
        chat(&body).unwrap().cache_salt.map(|s| s.into_owned())
    };
    assert_eq!(with(r#""tenant-a""#).as_deref(), Some("tenant-a"));
    assert_eq!(with(r#""a\"b""#).as_deref(), Some("a\"b"));
    for none in ["null", r#""""#, "7", "true", "[\"a\"]", "{}"] {
        assert_eq!(with(none), None, "{none}");
    }
    let r = chat(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
    assert!(r.cache_salt.is_none());
    let r = chat(r#"{"model":"m","cache_salt":"s","messages":[{"role":"user","content":"hi"}]}"#);
    assert!(matches!(r.unwrap().cache_salt, Some(Cow::Borrowed("s"))));
}

#[test]
fn null_optionals_are_accepted() {
    let r = chat(
        r#"{"model":"m","stream":null,"stream_options":null,"max_tokens":null,"messages":[{"role":"assistant","content":null}]}"#,
    )
    .unwrap();
    assert!(!r.stream && !r.include_usage && r.max_output_tokens.is_none());
}

#[test]
fn rewrite_model_changes_only_the_model_value() {
    let body = br#"{ "messages":[{"role":"user","content":"x"}], "model" :  "lora-a" , "n":1}"#;
    let r = parse_request(ApiKind::ChatCompletions, body).unwrap();
    let out = r.rewrite_model(body, "base \"quoted\"");
    let expected =
        br#"{ "messages":[{"role":"user","content":"x"}], "model" :  "base \"quoted\"" , "n":1}"#;
    assert_eq!(
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(expected)
    );
    let again = parse_request(ApiKind::ChatCompletions, &out).unwrap();
    assert_eq!(again.model, "base \"quoted\"");
}

proptest! {
    #[test]
    fn every_string_reads_back_as_it_was_sent(model in "\\PC{1,12}", role in "[a-z\"\\\\]{0,6}", content in "\\PC{0,40}") {
        let body = serde_json::json!({"model": model, "messages": [{"role": role, "content": content}]});
        let body = serde_json::to_vec(&body).unwrap_or_default();
        let r = parse_request(ApiKind::ChatCompletions, &body);
        if model.trim().is_empty() {
            prop_assert!(r.is_err());
        } else {
            let r = r.map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(r.model.as_ref(), model.as_str());
            prop_assert_eq!(r.segments().collect::<Vec<_>>(), vec![role.as_str(), content.as_str()]);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        for kind in ApiKind::ALL {
            let _ = parse_request(kind, &bytes);
        }
    }

    #[test]
    fn truncated_bodies_are_rejected_not_misread(cut in 0usize..80) {
        let body = br#"{"model":"llama","messages":[{"role":"user","content":"hello there"}]}"#;
        let cut = cut.min(body.len() - 1);
        prop_assert!(parse_request(ApiKind::ChatCompletions, &body[..cut]).is_err());
    }

    #[test]
    fn rewrite_round_trips(model in "[a-zA-Z0-9\"\\\\/ -]{1,20}", new in "[a-zA-Z0-9\"\\\\/ -]{1,20}") {
        prop_assume!(!model.trim().is_empty() && !new.trim().is_empty());
        let body = serde_json::json!({"model": model, "messages": [{"role":"user","content":"q"}]}).to_string();
        let r = parse_request(ApiKind::ChatCompletions, body.as_bytes()).unwrap();
        prop_assert_eq!(r.model.as_ref(), model.as_str());
        let out = r.rewrite_model(body.as_bytes(), &new);
        let again = parse_request(ApiKind::ChatCompletions, &out).unwrap();
        prop_assert_eq!(again.model.as_ref(), new.as_str());
        prop_assert_eq!(again.segments().collect::<Vec<_>>(), vec!["user", "q"]);
    }
}
