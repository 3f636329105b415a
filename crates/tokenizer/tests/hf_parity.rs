//! The ids this crate computes against the ids the Python Hugging Face stack computes for the
//! same files, prompts and conversations (`tests/fixtures/make_fixtures.py` wrote them; see its
//! docstring for how each is computed to match vLLM 0.32). Exact equality, case by case.

#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use std::path::{Path, PathBuf};

use infergate_tokenizer::{
    ChatRequest, ContentFormat, Error, Limits, ModelTokenizer, Options, TokenizerFiles,
};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn expected(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| u32::try_from(i.as_u64().unwrap()).unwrap())
        .collect()
}

fn check_fixture(name: &str, format: ContentFormat) {
    let tok = ModelTokenizer::from_dir(fixture(name), Options::default()).unwrap();
    let exp = expected(name);
    assert_eq!(
        exp["content_format"].as_str(),
        Some(match format {
            ContentFormat::String => "string",
            ContentFormat::OpenAi => "openai",
        })
    );
    assert_eq!(
        tok.content_format(),
        format,
        "{name}: detected content format"
    );
    let mut out = Vec::new();
    let mut checked = 0;
    for case in exp["cases"].as_array().unwrap() {
        let case_name = case["name"].as_str().unwrap();
        if let Some(prompt) = case["prompt"].as_str() {
            tok.encode_completion(prompt, true, &mut out).unwrap();
            assert_eq!(out, ids(&case["ids"]), "{name}/{case_name}");
        } else {
            let body = serde_json::to_vec(&case["messages"]).unwrap();
            let request = ChatRequest::from_json(&body).unwrap();
            if let Some(err) = case["error"].as_str() {
                match tok.encode_chat(&request, &mut out) {
                    Err(Error::TemplateRefused { message }) => {
                        assert_eq!(message, err, "{name}/{case_name}")
                    }
                    other => panic!("{name}/{case_name}: expected a refusal, got {other:?}"),
                }
            } else {
                let rendered = tok.render_chat(&request).unwrap();
                assert_eq!(
                    rendered,
                    case["rendered"].as_str().unwrap(),
                    "{name}/{case_name}: rendered text"
                );
                tok.encode_chat(&request, &mut out).unwrap();
                assert_eq!(out, ids(&case["ids"]), "{name}/{case_name}");
            }
        }
        checked += 1;
    }
    assert!(checked >= 20, "{name}: only {checked} cases");
}

#[test]
fn tiny_model_matches_hugging_face() {
    check_fixture("tiny", ContentFormat::String);
}

#[test]
fn bos_tokenizer_with_config_template_matches_hugging_face() {
    check_fixture("tiny-bos", ContentFormat::OpenAi);
}

#[test]
fn explicit_files_and_a_forced_content_format() {
    let dir = fixture("tiny");
    let files = TokenizerFiles {
        tokenizer_json: dir.join("tokenizer.json"),
        tokenizer_config: Some(dir.join("tokenizer_config.json")),
        special_tokens_map: None,
        chat_template: Some(dir.join("chat_template.jinja")),
    };
    let opts = Options {
        content_format: Some(ContentFormat::OpenAi),
        ..Options::default()
    };
    let tok = ModelTokenizer::from_files(&files, opts).unwrap();
    assert_eq!(tok.content_format(), ContentFormat::OpenAi);
    // Without a template, completions still work and chat says why it cannot.
    let bare = TokenizerFiles {
        tokenizer_config: None,
        chat_template: None,
        ..files
    };
    let tok = ModelTokenizer::from_files(&bare, Options::default()).unwrap();
    assert!(!tok.has_chat_template());
    let mut out = Vec::new();
    tok.encode_completion("hello world", true, &mut out)
        .unwrap();
    assert_eq!(out.len(), 2);
    let req = ChatRequest::from_json(br#"[{"role":"user","content":"hi"}]"#).unwrap();
    assert!(matches!(
        tok.encode_chat(&req, &mut out),
        Err(Error::NoChatTemplate)
    ));
}

#[test]
fn limits_are_typed_errors() {
    let opts = Options {
        limits: Limits {
            max_input_bytes: 64,
            max_tokens: 5,
        },
        ..Options::default()
    };
    let tok = ModelTokenizer::from_dir(fixture("tiny"), opts).unwrap();
    let mut out = vec![7];
    let long = "x".repeat(65);
    assert!(matches!(
        tok.encode_completion(&long, true, &mut out),
        Err(Error::InputTooLarge {
            bytes: 65,
            limit: 64
        })
    ));
    assert!(matches!(
        tok.encode_completion(
            "the quick brown fox jumps over the lazy dog",
            true,
            &mut out
        ),
        Err(Error::TooManyTokens { limit: 5, .. })
    ));
    let req = ChatRequest::from_json(
        format!(r#"[{{"role":"user","content":"{}"}}]"#, "y".repeat(100)).as_bytes(),
    )
    .unwrap();
    assert!(matches!(
        tok.encode_chat(&req, &mut out),
        Err(Error::InputTooLarge { limit: 64, .. })
    ));
    // The buffer is reused: cleared, then filled.
    tok.encode_completion("hello", true, &mut out).unwrap();
    assert_eq!(out.len(), 1);
}

#[test]
fn loading_errors_name_the_file() {
    let err = ModelTokenizer::from_dir("/nonexistent/model", Options::default()).unwrap_err();
    assert!(matches!(err, Error::NoDirectory { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/model"));
    let dir = tempfile::tempdir().unwrap();
    let err = ModelTokenizer::from_dir(dir.path(), Options::default()).unwrap_err();
    assert!(matches!(err, Error::NoTokenizerJson { .. }), "{err}");
    std::fs::write(
        dir.path().join("tokenizer.json"),
        b"{\"not\": \"a tokenizer\"}",
    )
    .unwrap();
    let err = ModelTokenizer::from_dir(dir.path(), Options::default()).unwrap_err();
    assert!(matches!(err, Error::TokenizerJson { .. }), "{err}");
    std::fs::copy(
        fixture("tiny").join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), b"{oops").unwrap();
    let err = ModelTokenizer::from_dir(dir.path(), Options::default()).unwrap_err();
    assert!(matches!(err, Error::ConfigJson { .. }), "{err}");
    std::fs::write(dir.path().join("tokenizer_config.json"), b"{}").unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), b"{% for %}").unwrap();
    let err = ModelTokenizer::from_dir(dir.path(), Options::default()).unwrap_err();
    assert!(matches!(err, Error::TemplateSyntax { .. }), "{err}");
    assert!(err.to_string().contains("chat_template.jinja"));
}

#[test]
fn special_tokens_fall_back_to_special_tokens_map() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("tiny").join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    // The older layout: special tokens in special_tokens_map.json, as added-token objects, and
    // the template as a list of named templates in the config.
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        br#"{"eos_token": "<|end|>", "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}"}]}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("special_tokens_map.json"),
        br#"{"bos_token": {"content": "<|bos|>", "lstrip": false}, "eos_token": "<|eos|>"}"#,
    )
    .unwrap();
    let tok = ModelTokenizer::from_dir(dir.path(), Options::default()).unwrap();
    let req = ChatRequest::from_json(br#"[{"role":"user","content":"hi"}]"#).unwrap();
    // bos from the map, eos from the config (which wins).
    assert_eq!(tok.render_chat(&req).unwrap(), "<|bos|>hi<|end|>");
    let mut ids = Vec::new();
    tok.encode_chat(&req, &mut ids).unwrap();
    assert_eq!(ids.first(), Some(&0), "<|bos|> is id 0 in the fixture");
}

/// Templates in the shapes real models ship, each rendered for three chats, against what
/// transformers renders (`tests/fixtures/make_templates.py` wrote `templates.json`).
#[test]
fn templates_render_as_transformers_renders_them() {
    let text = std::fs::read_to_string(fixture("templates.json")).unwrap();
    let exp: Value = serde_json::from_str(&text).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("tiny").join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        br#"{"bos_token": "<s>", "eos_token": "</s>"}"#,
    )
    .unwrap();
    let fixture_date = exp["date_utc"].as_str().unwrap();
    let mut checked = 0;
    for case in exp["cases"].as_array().unwrap() {
        let name = case["template"].as_str().unwrap();
        let template = exp["templates"][name].as_str().unwrap();
        std::fs::write(dir.path().join("chat_template.jinja"), template).unwrap();
        let tok = ModelTokenizer::from_dir(dir.path(), Options::default()).unwrap();
        let want_format = match case["content_format"].as_str() {
            Some("openai") => ContentFormat::OpenAi,
            _ => ContentFormat::String,
        };
        assert_eq!(tok.content_format(), want_format, "{name}: content format");
        let chat = &exp["chats"][case["chat"].as_u64().unwrap() as usize];
        let req = ChatRequest::from_json(&serde_json::to_vec(chat).unwrap()).unwrap();
        let got = tok.render_chat(&req);
        let what = format!("{name} on chat {}", case["chat"]);
        if let Some(err) = case["error"].as_str() {
            match got {
                Err(Error::TemplateRefused { message }) => assert_eq!(message, err, "{what}"),
                other => panic!("{what}: expected a refusal, got {other:?}"),
            }
        } else {
            let got = got.unwrap_or_else(|e| panic!("{what}: {e:?}"));
            let mut want = case["rendered"].as_str().unwrap().to_owned();
            // strftime_now: the fixture holds the day it was made; this run renders today.
            if let Some(at) = got.find("Today Date: ") {
                let today = &got[at + 12..at + 23];
                want = want.replace(fixture_date, today);
            }
            assert_eq!(got, want, "{what}");
        }
        checked += 1;
    }
    assert_eq!(checked, 27);
}
