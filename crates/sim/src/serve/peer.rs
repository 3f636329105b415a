//! What other routers call on a vLLM server besides inference, so that a peer router run against
//! emulated vLLM pods uses the signals it was built for instead of falling back.
//!
//! Shapes follow vLLM's own protocol (the `/tokenize` and `/detokenize` models of vLLM's
//! tokenization API, `GenerateRequest` of its render endpoints, `GET /load`'s `server_load`) and,
//! for `GET /get_load`, what vllm-router's `power_of_two` policy parses (`load` at the top level).
//! Tokens come from the pod's tokenizer — the model's own when the fleet is served with one, else
//! the stand-in of [`crate::tokens`] — and the same as inference's: the ids of a prompt are
//! exactly the tokens the engine charges for it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{Map, Value, json};

use super::PodShared;
use super::http::{
    Api, Reject, SimBody, bad, encode_chat, error, json_response, object, opt_bool, parse,
    read_body, render_chat, resolve_model, token_list, tokenizer_reject,
};
use crate::tokens::{Prompt, detokenize, token_bytes, token_ids};

/// Paths served here (vLLM pods only).
const PATHS: [(&str, Method); 6] = [
    ("/tokenize", Method::POST),
    ("/detokenize", Method::POST),
    ("/v1/chat/completions/render", Method::POST),
    ("/v1/completions/render", Method::POST),
    ("/load", Method::GET),
    ("/get_load", Method::GET),
];

/// Whether `path` is one of this module's.
pub(crate) fn serves(path: &str) -> bool {
    PATHS.iter().any(|(p, _)| *p == path)
}

/// Answers a request to one of [`PATHS`].
pub(crate) async fn handle(
    shared: Arc<PodShared>,
    path: &str,
    req: Request<Incoming>,
) -> Response<SimBody> {
    let Some((handler, allowed)) = PATHS.iter().find(|(p, _)| *p == path) else {
        return json_response(
            &shared,
            StatusCode::NOT_FOUND,
            &json!({"detail": "Not Found"}),
        );
    };
    if req.method() != allowed {
        return json_response(
            &shared,
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({"detail": "Method Not Allowed"}),
        );
    }
    if *allowed == Method::GET {
        let load = in_flight(&shared);
        let body = if *handler == "/load" {
            json!({"server_load": load})
        } else {
            json!({"load": load})
        };
        return json_response(&shared, StatusCode::OK, &body);
    }
    let body = match read_body(&shared, req).await {
        Ok(b) => b,
        Err(r) => {
            shared.count_http(handler, r.status().as_u16());
            return r;
        }
    };
    let answer = match *handler {
        "/tokenize" => tokenize(&shared, &body),
        "/detokenize" => detokenize_request(&shared, &body),
        "/v1/chat/completions/render" => render(&shared, &body, Api::Chat),
        _ => render(&shared, &body, Api::Completions),
    };
    let r = match answer {
        Ok(v) => json_response(&shared, StatusCode::OK, &v),
        Err((status, msg, param)) => error(&shared, status, &msg, param),
    };
    shared.count_http(handler, r.status().as_u16());
    r
}

/// Requests in the engine: running plus waiting (vLLM's `server_load` counts the inference
/// requests its HTTP server holds, which is the same set once each is submitted).
fn in_flight(shared: &PodShared) -> u64 {
    let v = super::lock(&shared.engine).view(shared.now());
    u64::from(v.running) + u64::from(v.waiting)
}

/// An optional `model`: when given it must be one the pod serves (404 otherwise), as vLLM checks.
fn check_model(shared: &PodShared, obj: &Map<String, Value>) -> Result<(), Reject> {
    match obj.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) => resolve_model(shared, m).map(|_| ()),
        Some(_) => Err(bad("model must be a string", "model")),
    }
}

/// `POST /tokenize`: `{"prompt"}` or `{"messages", "add_generation_prompt"}` →
/// `{"count", "max_model_len", "tokens", "token_strs"}`.
fn tokenize(shared: &PodShared, body: &[u8]) -> Result<Value, Reject> {
    let obj = object(body)?;
    check_model(shared, &obj)?;
    // The stand-in has no special tokens to add or leave out; the model's tokenizer adds them
    // by default to a prompt, not to messages (vLLM's defaults).
    let add_special_tokens = opt_bool(&obj, "add_special_tokens")?;
    let return_strs = opt_bool(&obj, "return_token_strs")?.unwrap_or(false);
    let chat = obj.contains_key("messages");
    let text = if chat {
        let add_generation_prompt = opt_bool(&obj, "add_generation_prompt")?.unwrap_or(true);
        render_chat(&obj, add_generation_prompt)?
    } else {
        match obj.get("prompt") {
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(bad("prompt must be a string", "prompt")),
            None => return Err(bad("field required: prompt or messages", "prompt")),
        }
    };
    let mut ids = Vec::new();
    match shared.tokenizer.as_deref() {
        Some(t) if chat => ids = encode_chat(t, body)?,
        Some(t) => t
            .encode_completion(&text, add_special_tokens.unwrap_or(true), &mut ids)
            .map_err(|e| tokenizer_reject(&e, "prompt"))?,
        None => token_ids(&text, &mut ids),
    }
    let token_strs = if return_strs {
        let strs: Vec<String> = ids
            .iter()
            .map(|id| match shared.tokenizer.as_deref() {
                Some(t) => t.token_str(*id).unwrap_or_default(),
                None => String::from_utf8_lossy(&token_bytes(*id).unwrap_or_default()).into_owned(),
            })
            .collect();
        json!(strs)
    } else {
        Value::Null
    };
    Ok(json!({
        "count": ids.len(),
        "max_model_len": shared.profile.max_model_len,
        "tokens": ids,
        "token_strs": token_strs,
    }))
}

/// `POST /detokenize`: `{"tokens"}` → `{"prompt"}`; an id no text produces is a 400.
fn detokenize_request(shared: &PodShared, body: &[u8]) -> Result<Value, Reject> {
    let obj = object(body)?;
    check_model(shared, &obj)?;
    let tokens = obj
        .get("tokens")
        .ok_or_else(|| bad("field required: tokens", "tokens"))?;
    let ids = token_list(tokens, "tokens")?;
    let text = match shared.tokenizer.as_deref() {
        Some(t) => {
            // The library skips ids outside the vocabulary; vLLM refuses them, as the stand-in's
            // unknown ids are refused.
            if let Some(id) = ids.iter().find(|id| **id as usize >= t.vocab_size()) {
                return Err(bad(
                    format!(
                        "token id {id} is outside the vocabulary ({} ids)",
                        t.vocab_size()
                    ),
                    "tokens",
                ));
            }
            t.decode(&ids, false)
                .map_err(|e| tokenizer_reject(&e, "tokens"))?
        }
        None => detokenize(&ids).map_err(|e| bad(e.to_string(), "tokens"))?,
    };
    Ok(json!({"prompt": text}))
}

/// `POST /v1/chat/completions/render` (one `GenerateRequest`) and `POST /v1/completions/render`
/// (a list of them): the request checked exactly as inference would check it, its prompt's token
/// ids and the sampling parameters the pod would run it with, nothing generated.
fn render(shared: &PodShared, body: &[u8], api: Api) -> Result<Value, Reject> {
    let p = parse(shared, body, api)?;
    let obj = object(body)?;
    let ids = match (&p.prompt, p.prompt_ids) {
        (_, Some(ids)) => ids,
        (Prompt::Ids(ids), None) => ids.to_vec(),
        (Prompt::Text(text), None) => {
            let mut ids = Vec::new();
            token_ids(text, &mut ids);
            ids
        }
        // Only token-id prompts parse to synthetic prompts, and they carry their ids.
        (Prompt::Tokens { .. }, None) => {
            return Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                "the prompt has no token ids".to_owned(),
                None,
            ));
        }
    };
    // `parse` has checked the salt as inference checks it.
    let cache_salt = p.cache_salt.as_deref().map_or(Value::Null, Value::from);
    let priority = match obj.get("priority") {
        None | Some(Value::Null) => json!(0),
        Some(v) if v.is_i64() => v.clone(),
        Some(_) => return Err(bad("priority must be an integer", "priority")),
    };
    let n = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let prefix = match api {
        Api::Chat => "chatcmpl",
        Api::Completions => "cmpl",
    };
    let stream_options = if p.stream {
        obj.get("stream_options").cloned().unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    let mut sampling = json!({"n": 1, "max_tokens": p.max_tokens});
    for key in ["temperature", "top_p", "seed", "stop"] {
        if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
            sampling[key] = v.clone();
        }
    }
    let generate = json!({
        "request_id": format!("{prefix}-{}-{n}", shared.name),
        "token_ids": ids,
        "features": null,
        "sampling_params": sampling,
        "model": p.model,
        "stream": p.stream,
        "stream_options": stream_options,
        "cache_salt": cache_salt,
        "priority": priority,
        "kv_transfer_params": null,
    });
    Ok(match api {
        Api::Chat => generate,
        Api::Completions => json!([generate]),
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::spec::PodSpec;
    use crate::{Catalog, EngineKind};

    fn shared() -> PodShared {
        let p = Catalog::builtin()
            .unwrap()
            .get("llama-3.1-8b/h100")
            .unwrap()
            .clone();
        super::super::new_shared(&PodSpec::new("p", &p, EngineKind::Vllm), None, None)
    }

    proptest! {
        // Seeded: a failure reproduces on every run.
        #![proptest_config(ProptestConfig {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed),
            ..ProptestConfig::default()
        })]

        #[test]
        fn any_body_is_answered_or_refused_as_a_client_error(
            bytes in prop::collection::vec(any::<u8>(), 0..256),
            prompt in "\\PC{0,40}",
        ) {
            let json = json!({"prompt": prompt, "tokens": bytes}).to_string();
            let messages = json!({"messages": [{"role": "user", "content": prompt}], "tokens": bytes})
                .to_string();
            for (s, body) in [shared(), super::super::http::tests::shared_with_tokenizer()]
                .iter()
                .flat_map(|s| [(s, &bytes[..]), (s, json.as_bytes()), (s, messages.as_bytes())])
            {
                for r in [
                    tokenize(s, body),
                    detokenize_request(s, body),
                    render(s, body, Api::Chat),
                    render(s, body, Api::Completions),
                ] {
                    if let Err((status, msg, _)) = r {
                        prop_assert!(status.is_client_error(), "{status} {msg}");
                        prop_assert!(!msg.is_empty());
                    }
                }
            }
        }
    }
}
