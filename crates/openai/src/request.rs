//! Parsing an OpenAI request body into the facts routing needs, without copying its strings.
//!
//! [`parse_request`] reads only what routing uses — `model`, `stream`, `stream_options`, output
//! limits and the prompt — and ignores every other field, so new OpenAI parameters pass through
//! untouched. Strings are borrowed from the body unless they contain JSON escapes.
//!
//! The prompt is kept as ordered *segments* (for chat: each message's role, then its text parts),
//! which the scheduler's prefix hasher reads as one stream. Two requests that share a conversation
//! prefix therefore share hashed blocks, whichever API carried them.

use std::borrow::Cow;
use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::api::ApiKind;
use crate::error::ApiError;

/// Characters per token for estimates when no tokenizer is at hand (the common ~4 chars/token rule).
pub const CHARS_PER_TOKEN: usize = 4;

/// What routing needs from one OpenAI request, borrowed from its body.
#[derive(Debug, Clone)]
pub struct ParsedRequest<'a> {
    /// Which API the path named.
    pub kind: ApiKind,
    /// The requested model (served model name or LoRA adapter name).
    pub model: Cow<'a, str>,
    /// Byte range of the `model` value (the JSON string, quotes included) in the body.
    model_span: Range<usize>,
    /// Whether the client asked for a streamed (SSE) response.
    pub stream: bool,
    /// Whether a streamed response will end with a usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The output token limit, if the request set one (`max_tokens`, `max_completion_tokens` or
    /// `max_output_tokens`).
    pub max_output_tokens: Option<u32>,
    /// Prompt segments in order, for prefix hashing.
    pub prompt: Vec<Cow<'a, str>>,
    /// Prompt tokens given directly as token ids (completions and embeddings accept them).
    pub prompt_token_ids: usize,
    /// vLLM's `cache_salt`: prefix-cache blocks are shared only between requests with the same
    /// salt (vLLM hashes it into the request's first block). `None` when absent, `null`, empty
    /// or not a string (the request is not refused for it: the model server decides).
    pub cache_salt: Option<Cow<'a, str>>,
}

impl<'a> ParsedRequest<'a> {
    /// Total characters of prompt text.
    pub fn prompt_chars(&self) -> usize {
        self.prompt.iter().map(|s| s.len()).sum()
    }

    /// Estimated prompt tokens: text at [`CHARS_PER_TOKEN`] characters a token (rounded up), plus
    /// token ids given directly.
    pub fn estimated_prompt_tokens(&self) -> u32 {
        let text = self.prompt_chars().div_ceil(CHARS_PER_TOKEN);
        u32::try_from(text.saturating_add(self.prompt_token_ids)).unwrap_or(u32::MAX)
    }

    /// The prompt segments as string slices, in order.
    pub fn segments(&self) -> impl Iterator<Item = &str> + '_ {
        self.prompt.iter().map(|s| s.as_ref())
    }

    /// The body with its `model` value replaced by `model`; every other byte is kept as it was.
    pub fn rewrite_model(&self, body: &[u8], model: &str) -> Vec<u8> {
        let quoted = json_string(model);
        let mut out = Vec::with_capacity(body.len() + quoted.len());
        out.extend_from_slice(&body[..self.model_span.start]);
        out.extend_from_slice(quoted.as_bytes());
        out.extend_from_slice(&body[self.model_span.end..]);
        out
    }
}

fn json_string(s: &str) -> String {
    // Serialising a &str cannot fail.
    serde_json::to_string(s).unwrap_or_else(|_| String::from("\"\""))
}

/// The top-level fields routing reads. Everything else is ignored.
#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_completion_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    max_output_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cache_salt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    role: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// Parses an OpenAI request body for the API `kind`.
///
/// Errors: [`ApiError::InvalidJson`] for bytes that are not a JSON object,
/// [`ApiError::MissingModel`] without a `model`, [`ApiError::InvalidField`] for a field routing
/// reads that has the wrong type (the error names the field).
pub fn parse_request(kind: ApiKind, body: &[u8]) -> Result<ParsedRequest<'_>, ApiError> {
    let wire: Wire<'_> = serde_json::from_slice(body).map_err(|source| ApiError::InvalidJson {
        // An empty body is not a parse position to report (`EOF while parsing a value at line
        // 1 column 0`): say what is missing.
        source: if body.trim_ascii().is_empty() {
            <serde_json::Error as serde::de::Error>::custom(
                "the body is empty: send a JSON object with `model` and the API's fields",
            )
        } else {
            source
        },
    })?;
    // serde would also accept a JSON array for a struct; an OpenAI body is always an object.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(ApiError::InvalidJson {
            source: <serde_json::Error as serde::de::Error>::custom(
                "the request body must be a JSON object",
            ),
        });
    }
    let model_raw = wire.model.ok_or(ApiError::MissingModel { empty: false })?;
    let model = parse_str(model_raw, "model", "a string naming the model")?;
    if model.trim().is_empty() {
        return Err(ApiError::MissingModel { empty: true });
    }
    let start = span_start(body, model_raw);
    let model_span = start..start + model_raw.get().len();

    let stream = match wire.stream {
        Some(raw) => parse_field::<Option<bool>>(raw, "stream", "a boolean")?.unwrap_or(false),
        None => false,
    };
    let include_usage = match wire.stream_options {
        Some(raw) => parse_field::<Option<StreamOptions>>(
            raw,
            "stream_options",
            "an object like {\"include_usage\": true}",
        )?
        .and_then(|o| o.include_usage)
        .unwrap_or(false),
        None => false,
    };
    let mut max_output_tokens = None;
    for (raw, field) in [
        (wire.max_tokens, "max_tokens"),
        (wire.max_completion_tokens, "max_completion_tokens"),
        (wire.max_output_tokens, "max_output_tokens"),
    ] {
        if let Some(raw) = raw {
            let v: Option<u64> = parse_field(raw, field, "a non-negative integer")?;
            if let Some(v) = v {
                max_output_tokens = Some(u32::try_from(v).unwrap_or(u32::MAX));
            }
        }
    }

    // Only vLLM reads the salt, and it refuses one that is not a non-empty string (400): such a
    // request is routed as unsalted and left to the model server to answer, as another engine,
    // which ignores the field, would serve it.
    let cache_salt = wire
        .cache_salt
        .and_then(|raw| parse_str(raw, "cache_salt", "a string").ok())
        .filter(|s| !s.is_empty());

    let mut req = ParsedRequest {
        kind,
        model,
        model_span,
        stream,
        include_usage,
        max_output_tokens,
        prompt: Vec::new(),
        prompt_token_ids: 0,
        cache_salt,
    };
    match kind {
        ApiKind::ChatCompletions => {
            let raw = wire.messages.ok_or_else(|| ApiError::InvalidField {
                field: "messages".into(),
                expected: "a non-empty array of chat messages",
            })?;
            push_messages(&mut req, raw, "messages")?;
        }
        ApiKind::Completions => {
            let raw = wire.prompt.ok_or_else(|| ApiError::InvalidField {
                field: "prompt".into(),
                expected: "a string, an array of strings, or token ids",
            })?;
            push_prompt(&mut req, raw, "prompt")?;
        }
        ApiKind::Embeddings => {
            if let Some(raw) = wire.input {
                push_prompt(&mut req, raw, "input")?;
            }
        }
        ApiKind::Responses => {
            if let Some(raw) = wire.instructions
                && raw.get() != "null"
            {
                req.prompt.push(parse_str(raw, "instructions", "a string")?);
            }
            if let Some(raw) = wire.input {
                if raw.get().starts_with('[') {
                    push_messages(&mut req, raw, "input")?;
                } else {
                    push_prompt(&mut req, raw, "input")?;
                }
            }
        }
    }
    Ok(req)
}

/// Byte offset of a raw value borrowed from `body`. RawValue borrows a sub-slice of the input,
/// so its address lies inside the body; fall back to a search if it somehow does not.
fn span_start(body: &[u8], raw: &RawValue) -> usize {
    let base = body.as_ptr() as usize;
    let at = raw.get().as_ptr() as usize;
    if at >= base && at + raw.get().len() <= base + body.len() {
        at - base
    } else {
        body.windows(raw.get().len())
            .position(|w| w == raw.get().as_bytes())
            .unwrap_or(0)
    }
}

fn parse_field<'a, T: Deserialize<'a>>(
    raw: &'a RawValue,
    field: &str,
    expected: &'static str,
) -> Result<T, ApiError> {
    serde_json::from_str(raw.get()).map_err(|_| ApiError::InvalidField {
        field: field.to_owned(),
        expected,
    })
}

/// A JSON string value, borrowed from the body unless it contains escapes.
fn parse_str<'a>(
    raw: &'a RawValue,
    field: &str,
    expected: &'static str,
) -> Result<Cow<'a, str>, ApiError> {
    let text = raw.get();
    // serde has checked the raw value: a string without escapes is its bytes between the quotes.
    if text.len() >= 2
        && text.starts_with('"')
        && text.ends_with('"')
        && !text.as_bytes().contains(&b'\\')
    {
        return Ok(Cow::Borrowed(&text[1..text.len() - 1]));
    }
    if let Ok(s) = serde_json::from_str::<&'a str>(text) {
        return Ok(Cow::Borrowed(s));
    }
    parse_field::<String>(raw, field, expected).map(Cow::Owned)
}

fn push_messages<'a>(
    req: &mut ParsedRequest<'a>,
    raw: &'a RawValue,
    field: &str,
) -> Result<(), ApiError> {
    let messages: Vec<Message<'a>> =
        parse_field(raw, field, "an array of messages with `role` and `content`")?;
    if messages.is_empty() && req.kind == ApiKind::ChatCompletions {
        return Err(ApiError::InvalidField {
            field: field.to_owned(),
            expected: "a non-empty array of chat messages",
        });
    }
    req.prompt.reserve(messages.len() * 2);
    for (i, m) in messages.into_iter().enumerate() {
        if let Some(role) = m.role {
            req.prompt.push(parse_str(role, field, "a string role")?);
        }
        if let Some(content) = m.content {
            push_content(req, content, field, i)?;
        }
    }
    Ok(())
}

fn push_content<'a>(
    req: &mut ParsedRequest<'a>,
    raw: &'a RawValue,
    field: &str,
    index: usize,
) -> Result<(), ApiError> {
    let text = raw.get();
    let invalid = || ApiError::InvalidField {
        field: format!("{field}[{index}].content"),
        expected: "a string or an array of content parts",
    };
    match text.as_bytes().first() {
        Some(b'"') => {
            let s = parse_str(raw, field, "a string").map_err(|_| invalid())?;
            req.prompt.push(s);
        }
        Some(b'[') => {
            let parts: Vec<Part<'a>> = serde_json::from_str(text).map_err(|_| invalid())?;
            for text in parts.into_iter().filter_map(|p| p.text) {
                req.prompt
                    .push(parse_str(text, field, "a string").map_err(|_| invalid())?);
            }
        }
        Some(b'n') if text == "null" => {}
        _ => return Err(invalid()),
    }
    Ok(())
}

fn push_prompt<'a>(
    req: &mut ParsedRequest<'a>,
    raw: &'a RawValue,
    field: &str,
) -> Result<(), ApiError> {
    const EXPECTED: &str = "a string, an array of strings, or token ids";
    let text = raw.get();
    let invalid = || ApiError::InvalidField {
        field: field.to_owned(),
        expected: EXPECTED,
    };
    match text.as_bytes().first() {
        Some(b'"') => {
            req.prompt.push(parse_str(raw, field, EXPECTED)?);
        }
        Some(b'[') => {
            let items: Vec<&'a RawValue> = serde_json::from_str(text).map_err(|_| invalid())?;
            for item in items {
                match item.get().as_bytes().first() {
                    Some(b'"') => req.prompt.push(parse_str(item, field, EXPECTED)?),
                    Some(b'[') => {
                        let ids: Vec<u64> =
                            serde_json::from_str(item.get()).map_err(|_| invalid())?;
                        req.prompt_token_ids = req.prompt_token_ids.saturating_add(ids.len());
                    }
                    Some(b'0'..=b'9') => {
                        let _: u64 = serde_json::from_str(item.get()).map_err(|_| invalid())?;
                        req.prompt_token_ids = req.prompt_token_ids.saturating_add(1);
                    }
                    _ => return Err(invalid()),
                }
            }
        }
        _ => return Err(invalid()),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
