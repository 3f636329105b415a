//! Token usage and first-token detection on the response path.
//!
//! Non-streamed responses carry `usage` in their JSON body ([`extract_usage`]). Streamed ones are
//! Server-Sent Events; [`SseScanner`] reads them chunk by chunk as they pass through — chunks may
//! split lines anywhere — notices the first event that carries generated text (the time to first
//! token) and the final `usage` event (`stream_options.include_usage`). It never holds more than
//! one partial line, capped, so a hostile stream cannot grow it without bound.

use serde::Deserialize;
use serde_json::value::RawValue;

/// The longest SSE line kept while waiting for its end. Longer lines are skipped (their usage,
/// if any, is lost, and the scanner says so through [`SseScanner::overflowed`]).
pub const MAX_SSE_LINE: usize = 1 << 20;

/// Token counts reported by the model server.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt (input) tokens.
    pub prompt_tokens: u64,
    /// Generated (output) tokens.
    pub completion_tokens: u64,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u64,
}

#[derive(Deserialize)]
struct UsageWire {
    #[serde(default, alias = "input_tokens")]
    prompt_tokens: Option<u64>,
    #[serde(default, alias = "output_tokens")]
    completion_tokens: Option<u64>,
    #[serde(default, alias = "input_tokens_details")]
    prompt_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl From<UsageWire> for Usage {
    fn from(w: UsageWire) -> Self {
        Usage {
            prompt_tokens: w.prompt_tokens.unwrap_or(0),
            completion_tokens: w.completion_tokens.unwrap_or(0),
            cached_tokens: w
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
        }
    }
}

#[derive(Deserialize)]
struct WithUsage {
    #[serde(default)]
    usage: Option<UsageWire>,
    #[serde(default)]
    response: Option<Box<WithUsage>>,
}

impl WithUsage {
    fn into_usage(self) -> Option<Usage> {
        match (self.usage, self.response) {
            (Some(u), _) => Some(u.into()),
            (None, Some(r)) => r.into_usage(),
            (None, None) => None,
        }
    }
}

/// Usage from a non-streamed JSON response body (or one SSE event); `None` if it has none or is
/// not a JSON object.
///
/// Only the `usage` value (or `response.usage`, the Responses API's events) is deserialized: the
/// rest of the body is skimmed for its structure — strings, nesting, separators — without
/// decoding it, so a large answer costs one pass over its bytes. A key written with escapes, or a
/// key given twice, takes the full parse instead, which reads such bodies exactly as JSON does.
/// The skipped parts are checked for structure only: a bad escape or number outside `usage` does
/// not lose the usage it carries (the full parse would drop it with the whole body).
pub fn extract_usage(body: &[u8]) -> Option<Usage> {
    match skim::usage(body) {
        skim::Found::Usage(raw) => serde_json::from_slice::<Option<UsageWire>>(raw)
            .ok()
            .flatten()
            .map(Usage::from),
        skim::Found::Nothing => None,
        skim::Found::Unsure => full_parse(body),
    }
}

/// The whole body through serde: the reference [`extract_usage`] agrees with.
fn full_parse(body: &[u8]) -> Option<Usage> {
    serde_json::from_slice::<WithUsage>(body)
        .ok()
        .and_then(WithUsage::into_usage)
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow, default)]
    choices: Option<Vec<Choice<'a>>>,
    /// Responses API stream events: `{"type":"response.output_text.delta","delta":"..."}`.
    #[serde(borrow, default, rename = "type")]
    kind: Option<&'a str>,
    #[serde(borrow, default)]
    delta: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning_content: Option<&'a RawValue>,
}

fn non_empty_string(raw: Option<&RawValue>) -> bool {
    raw.is_some_and(|r| r.get().len() > 2 && r.get().starts_with('"'))
}

impl Event<'_> {
    fn carries_text(&self) -> bool {
        if let Some(choices) = &self.choices {
            return choices.iter().any(|c| {
                non_empty_string(c.text)
                    || c.delta.as_ref().is_some_and(|d| {
                        non_empty_string(d.content) || non_empty_string(d.reasoning_content)
                    })
            });
        }
        self.kind.is_some_and(|k| k.ends_with("output_text.delta")) && non_empty_string(self.delta)
    }
}

/// Incremental reader of an OpenAI SSE response stream.
#[derive(Debug, Default)]
pub struct SseScanner {
    partial: Vec<u8>,
    skipping: bool,
    overflowed: bool,
    first_token: bool,
    done: bool,
    usage: Option<Usage>,
    events: u64,
    /// Events carrying generated text, when counted ([`SseScanner::counting_text`]).
    text_events: Option<u64>,
}

impl SseScanner {
    /// A scanner at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// A scanner that also counts the events carrying generated text
    /// ([`SseScanner::text_events`]): each event is then parsed, not only those up to the first
    /// token, so the proxies' scanners do not count.
    pub fn counting_text() -> Self {
        Self {
            text_events: Some(0),
            ..Self::default()
        }
    }

    /// Reads the next chunk of the stream. Returns `true` if this chunk carried the stream's first
    /// generated text (the moment to record time to first token).
    pub fn feed(&mut self, mut chunk: &[u8]) -> bool {
        let before = self.first_token;
        while let Some(nl) = chunk.iter().position(|&b| b == b'\n') {
            let (line, rest) = chunk.split_at(nl);
            chunk = &rest[1..];
            if self.skipping {
                self.skipping = false;
                self.partial.clear();
                continue;
            }
            if self.partial.is_empty() {
                self.line(line);
            } else {
                let mut buf = std::mem::take(&mut self.partial);
                buf.extend_from_slice(line);
                self.line(&buf);
                buf.clear();
                self.partial = buf;
            }
        }
        if !chunk.is_empty() && !self.skipping {
            if self.partial.len() + chunk.len() > MAX_SSE_LINE {
                self.partial.clear();
                self.skipping = true;
                self.overflowed = true;
            } else {
                self.partial.extend_from_slice(chunk);
            }
        }
        !before && self.first_token
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        self.events += 1;
        if (!self.first_token || self.text_events.is_some())
            && let Ok(ev) = serde_json::from_slice::<Event<'_>>(data)
            && ev.carries_text()
        {
            self.first_token = true;
            if let Some(n) = &mut self.text_events {
                *n += 1;
            }
        }
        if contains(data, b"\"usage\"")
            && let Some(u) = extract_usage(data)
        {
            self.usage = Some(u);
        }
    }

    /// Ends the stream: a final line without a newline is read too.
    pub fn finish(&mut self) {
        if !self.partial.is_empty() && !self.skipping {
            let buf = std::mem::take(&mut self.partial);
            self.line(&buf);
        }
        self.partial.clear();
    }

    /// The usage reported by the stream, if any event carried it.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Whether generated text has been seen.
    pub fn saw_first_token(&self) -> bool {
        self.first_token
    }

    /// Whether the `data: [DONE]` terminator has been seen.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Number of `data:` events seen (not counting `[DONE]`).
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Number of events that carried generated text, for a scanner made with
    /// [`SseScanner::counting_text`] (`None` otherwise). vLLM, SGLang and TGI stream one token per
    /// event, so without `usage` this is the output's length in tokens.
    pub fn text_events(&self) -> Option<u64> {
        self.text_events
    }

    /// Whether a line longer than [`MAX_SSE_LINE`] was skipped.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }
}

mod skim;

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

#[cfg(test)]
mod tests;
