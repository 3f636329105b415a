//! Chat requests as the OpenAI API carries them, and their conversion into the conversation a
//! chat template sees, as vLLM 0.32 converts them (`vllm/renderers/chat_utils.py`,
//! `_parse_chat_message_content`; `vllm/renderers/hf.py`, `safe_apply_chat_template`).
//!
//! Only text is reproduced: a message whose content holds an image, audio or another
//! multimodal part, an assistant message with `tool_calls`, and a request with `tools`,
//! `chat_template`, `chat_template_kwargs` or `continue_final_message` are refused with a typed
//! error, so a caller falls back to its approximate match rather than route on ids the engine
//! would not compute.

use indexmap::IndexMap;
use minijinja::Value;
use serde::Deserialize;

use crate::Error;

/// A chat completions request: the fields that decide its prompt tokens. Deserializes from a
/// whole `/v1/chat/completions` body (other fields are ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Append the template's generation prompt (vLLM's default: true).
    #[serde(default = "yes")]
    pub add_generation_prompt: bool,
    /// Add the tokenizer's special tokens (BOS) on top of the template's (vLLM's default: false).
    #[serde(default)]
    pub add_special_tokens: bool,
    /// Leave the last message open (refused: not reproduced).
    #[serde(default)]
    pub continue_final_message: bool,
    /// Tool definitions (refused when non-empty: not reproduced).
    #[serde(default)]
    pub tools: Option<serde_json::Value>,
    /// A per-request chat template (refused: not reproduced).
    #[serde(default)]
    pub chat_template: Option<serde_json::Value>,
    /// Extra template variables (refused when non-empty: not reproduced).
    #[serde(default)]
    pub chat_template_kwargs: Option<serde_json::Value>,
}

fn yes() -> bool {
    true
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The content: a string, an array of parts, or null.
    #[serde(default)]
    pub content: Option<Content>,
    /// The participant's name (passed to the template, as vLLM does).
    #[serde(default)]
    pub name: Option<String>,
    /// An assistant's reasoning (passed as `reasoning` and `reasoning_content`, as vLLM does).
    #[serde(default)]
    pub reasoning: Option<String>,
    /// A tool message's call id (passed to the template).
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// An assistant's tool calls (refused when non-empty).
    #[serde(default)]
    pub tool_calls: Option<serde_json::Value>,
}

/// A message's content.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// OpenAI content parts.
    Parts(Vec<ContentPart>),
}

/// One OpenAI content part.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ContentPart {
    /// A bare string part (vLLM accepts them).
    Bare(String),
    /// A typed part: `{"type": "text", "text": ...}` and the other text types
    /// (`input_text`, `output_text`, `refusal`, `thinking`); any other type is refused.
    Typed {
        /// The part's `type`.
        #[serde(rename = "type", default)]
        kind: Option<String>,
        /// Text of `text`, `input_text` and `output_text` parts.
        #[serde(default)]
        text: Option<String>,
        /// Text of a `refusal` part.
        #[serde(default)]
        refusal: Option<String>,
        /// Text of a `thinking` part.
        #[serde(default)]
        thinking: Option<String>,
    },
}

impl ChatRequest {
    /// A request with vLLM's defaults: generation prompt on, no extra special tokens.
    pub fn new(messages: Vec<ChatMessage>) -> Self {
        Self {
            messages,
            add_generation_prompt: true,
            add_special_tokens: false,
            continue_final_message: false,
            tools: None,
            chat_template: None,
            chat_template_kwargs: None,
        }
    }

    /// Parses a `/v1/chat/completions` body, or a bare JSON array of messages (told apart by the
    /// first byte, so the error names the field that is wrong in the shape that was meant).
    pub fn from_json(json: &[u8]) -> Result<Self, Error> {
        let array = json.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
        let parsed = if array {
            serde_json::from_slice::<Vec<ChatMessage>>(json).map(Self::new)
        } else {
            serde_json::from_slice::<ChatRequest>(json)
        };
        parsed.map_err(|source| Error::ChatJson { source })
    }

    /// Refuses what would make the ids differ from the engine's.
    pub(crate) fn check_supported(&self) -> Result<(), Error> {
        if self.continue_final_message {
            return Err(Error::Unsupported {
                field: "continue_final_message",
                why: "the engine's prefill trimming is not reproduced",
            });
        }
        if non_empty(self.tools.as_ref()) {
            return Err(Error::Unsupported {
                field: "tools",
                why: "tool schemas reach the template in the engine's own normalised form",
            });
        }
        if self.chat_template.as_ref().is_some_and(|t| !t.is_null()) {
            return Err(Error::Unsupported {
                field: "chat_template",
                why: "only the model's own template is loaded",
            });
        }
        if non_empty(self.chat_template_kwargs.as_ref()) {
            return Err(Error::Unsupported {
                field: "chat_template_kwargs",
                why: "the engine filters them by what the template reads",
            });
        }
        for m in &self.messages {
            if non_empty(m.tool_calls.as_ref()) {
                return Err(Error::Unsupported {
                    field: "messages[].tool_calls",
                    why: "the engine parses tool-call arguments into objects before rendering",
                });
            }
        }
        Ok(())
    }

    /// Bytes of text in the messages (bounded before rendering).
    pub(crate) fn text_bytes(&self) -> usize {
        self.messages
            .iter()
            .map(|m| match &m.content {
                None => 0,
                Some(Content::Text(t)) => t.len(),
                Some(Content::Parts(parts)) => parts.iter().map(ContentPart::text_len).sum(),
            })
            .sum()
    }
}

fn non_empty(v: Option<&serde_json::Value>) -> bool {
    match v {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Array(a)) => !a.is_empty(),
        Some(serde_json::Value::Object(o)) => !o.is_empty(),
        Some(_) => true,
    }
}

impl ContentPart {
    fn text_len(&self) -> usize {
        match self {
            ContentPart::Bare(s) => s.len(),
            ContentPart::Typed {
                text,
                refusal,
                thinking,
                ..
            } => [text, refusal, thinking]
                .iter()
                .map(|t| t.as_ref().map_or(0, String::len))
                .sum(),
        }
    }

    /// The part's text as vLLM reads it: `Ok(None)` for a text part with no text (skipped),
    /// an error for a non-text part.
    fn text(&self, message: usize, part: usize) -> Result<Option<&str>, Error> {
        match self {
            ContentPart::Bare(s) => Ok(Some(s)),
            ContentPart::Typed {
                kind,
                text,
                refusal,
                thinking,
            } => match kind.as_deref() {
                Some("text" | "input_text" | "output_text") => Ok(text.as_deref()),
                Some("refusal") => Ok(refusal.as_deref()),
                Some("thinking") => Ok(thinking.as_deref()),
                other => Err(Error::UnsupportedContent {
                    message,
                    part,
                    kind: other.unwrap_or("(none)").to_owned(),
                }),
            },
        }
    }
}

/// How a chat template expects `message.content`: vLLM's "string" or "openai" content format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// Content is one string: text parts are joined with `"\n"`.
    String,
    /// Content is a list of `{"type": "text", "text": ...}` parts (also for string content).
    OpenAi,
}

/// The prefix of Claude Code's per-request attribution line, which vLLM drops from system text.
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// The conversation the template sees, as vLLM builds it.
pub(crate) fn conversation(
    request: &ChatRequest,
    format: ContentFormat,
    template_knows_developer: bool,
) -> Result<Vec<Value>, Error> {
    let mut out = Vec::with_capacity(request.messages.len());
    let mut texts: Vec<&str> = Vec::new();
    for (i, m) in request.messages.iter().enumerate() {
        texts.clear();
        match &m.content {
            None => {}
            Some(Content::Text(t)) => texts.push(t),
            Some(Content::Parts(parts)) => {
                for (j, p) in parts.iter().enumerate() {
                    if let Some(t) = p.text(i, j)? {
                        texts.push(t);
                    }
                }
            }
        }
        if m.role == "system" {
            strip_billing_header(&mut texts);
        }
        let role = if m.role == "developer" && !template_knows_developer {
            "system"
        } else {
            m.role.as_str()
        };
        let mut fields: Vec<(&str, Value)> = Vec::with_capacity(4);
        fields.push(("role", Value::from(role)));
        // vLLM: a tool message's text parts always become one string.
        let content = if format == ContentFormat::OpenAi && m.role != "tool" {
            Value::from(
                texts
                    .iter()
                    .map(|t| map([("type", Value::from("text")), ("text", Value::from(*t))]))
                    .collect::<Vec<_>>(),
            )
        } else {
            Value::from(texts.join("\n"))
        };
        fields.push(("content", content));
        if m.role == "assistant"
            && let Some(r) = &m.reasoning
        {
            fields.push(("reasoning", Value::from(r.as_str())));
            fields.push(("reasoning_content", Value::from(r.as_str())));
        }
        if m.role == "tool"
            && let Some(id) = &m.tool_call_id
        {
            fields.push(("tool_call_id", Value::from(id.as_str())));
        }
        if let Some(name) = &m.name {
            fields.push(("name", Value::from(name.as_str())));
        }
        out.push((role, fields));
    }
    let converted_developer =
        !template_knows_developer && request.messages.iter().any(|m| m.role == "developer");
    let mut values: Vec<Value> = Vec::with_capacity(out.len());
    if converted_developer {
        consolidate_system(&mut out, &mut values);
    } else {
        values.extend(out.into_iter().map(|(_, f)| map(f)));
    }
    Ok(values)
}

/// A template map whose keys keep their order, as Python's dicts do.
pub(crate) fn map<'a>(fields: impl IntoIterator<Item = (&'a str, Value)>) -> Value {
    Value::from(
        fields
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect::<IndexMap<Value, Value>>(),
    )
}

/// vLLM's `_strip_claude_code_billing_header`: the attribution line changes every request.
fn strip_billing_header(texts: &mut Vec<&str>) {
    texts.retain_mut(|t| {
        if !t.starts_with(BILLING_HEADER) {
            return true;
        }
        let rest = t.split_once('\n').map_or("", |(_, rest)| rest);
        *t = rest;
        !rest.is_empty()
    });
}

/// vLLM's `_consolidate_system_messages` (after developer messages became system ones): every
/// system message merged into one at position 0, when any is not already alone there.
fn consolidate_system(out: &mut Vec<(&str, Vec<(&str, Value)>)>, values: &mut Vec<Value>) {
    let mut system: Vec<String> = Vec::new();
    let mut needs = false;
    let mut rest = Vec::with_capacity(out.len());
    for (i, (role, fields)) in out.drain(..).enumerate() {
        if role != "system" {
            rest.push(map(fields));
            continue;
        }
        if i > 0 || !system.is_empty() {
            needs = true;
        }
        let content = fields
            .iter()
            .find(|(k, _)| *k == "content")
            .map(|(_, v)| content_text(v))
            .unwrap_or_default();
        if !content.is_empty() {
            system.push(content);
        }
        // Kept in place when no consolidation turns out to be needed.
        rest.push(map(fields));
    }
    if !needs {
        values.extend(rest);
        return;
    }
    values.push(map([
        ("role", Value::from("system")),
        ("content", Value::from(system.join("\n\n"))),
    ]));
    values.extend(rest.into_iter().filter(|m| {
        m.get_attr("role")
            .ok()
            .is_none_or(|r| r.as_str() != Some("system"))
    }));
}

/// A converted message's content as one string (parts joined with `"\n"`).
fn content_text(v: &Value) -> String {
    if let Some(s) = v.as_str() {
        return s.to_owned();
    }
    let mut parts = Vec::new();
    if let Ok(iter) = v.try_iter() {
        for p in iter {
            if let Ok(t) = p.get_attr("text")
                && let Some(t) = t.as_str()
            {
                parts.push(t.to_owned());
            }
        }
    }
    parts.join("\n")
}

/// Whether the template mentions the `developer` role (vLLM's `_detect_developer_role_support`).
pub(crate) fn knows_developer(template: &str) -> bool {
    template.contains("\"developer\"") || template.contains("'developer'")
}

/// The content format a template expects, detected as vLLM's `_detect_content_format` does:
/// "openai" when some loop iterates over a message's `content` (`for c in message['content']`,
/// `message.content`, or a plain `content` variable outside macros), where the message comes
/// from a loop over `messages` or over a variable assigned from it (`set rest = messages[1:]`).
///
/// vLLM walks the Jinja AST; this reads the statements' text, which covers the shapes chat
/// templates use. [`Options::content_format`](crate::Options) overrides it, as
/// `--chat-template-content-format` does for vLLM.
pub fn detect_content_format(template: &str) -> ContentFormat {
    let statements = statements(template);
    // Names that hold the message list: `messages` and what is assigned from it.
    let mut lists = vec!["messages".to_owned()];
    let mut grew = true;
    while grew {
        grew = false;
        for st in &statements {
            let Some(rest) = st.text.strip_prefix("set ") else {
                continue;
            };
            let Some((lhs, rhs)) = rest.split_once('=') else {
                continue;
            };
            let lhs = lhs.trim();
            if !is_ident(lhs) || lists.iter().any(|l| l == lhs) {
                continue;
            }
            if lists.iter().any(|l| is_var_or_elems(rhs.trim(), l, None)) {
                lists.push(lhs.to_owned());
                grew = true;
            }
        }
    }
    // Loop variables over a message list.
    let mut message_vars: Vec<&str> = Vec::new();
    for st in &statements {
        if let Some((target, iter)) = for_loop(&st.text)
            && lists.iter().any(|l| is_var_or_elems(iter, l, None))
        {
            message_vars.push(target);
        }
    }
    for st in &statements {
        let Some((_, iter)) = for_loop(&st.text) else {
            continue;
        };
        if message_vars
            .iter()
            .any(|m| is_var_or_elems(iter, m, Some("content")))
        {
            return ContentFormat::OpenAi;
        }
        if !st.in_macro && iter == "content" {
            return ContentFormat::OpenAi;
        }
    }
    ContentFormat::String
}

/// One `{% ... %}` statement's text (whitespace-control marks and outer spaces removed), and
/// whether it sits inside a macro.
struct Statement {
    text: String,
    in_macro: bool,
}

fn statements(template: &str) -> Vec<Statement> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut rest = template;
    while let Some(start) = rest.find("{%") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("%}") else { break };
        let text = after[..end]
            .trim_start_matches(['-', '+'])
            .trim_end_matches(['-', '+'])
            .trim();
        let text: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if text.starts_with("macro ") {
            depth += 1;
        } else if text == "endmacro" {
            depth = depth.saturating_sub(1);
        }
        out.push(Statement {
            in_macro: depth > 0,
            text,
        });
        rest = &after[end + 2..];
    }
    out
}

/// `for TARGET in ITER` (a single target; `if`/`recursive` tails cut off).
fn for_loop(st: &str) -> Option<(&str, &str)> {
    let rest = st.strip_prefix("for ")?;
    let (target, iter) = rest.split_once(" in ")?;
    let target = target.trim();
    if !is_ident(target) {
        return None;
    }
    let iter = iter.trim();
    let iter = iter.split(" if ").next().unwrap_or(iter);
    let iter = iter.strip_suffix(" recursive").unwrap_or(iter).trim();
    Some((target, iter))
}

/// vLLM's `_is_var_or_elems_access`: `var` (or `var[key]` / `var.key`) possibly sliced or
/// filtered (`messages[1:]`, `messages | selectattr(...)`), but not indexed by a constant.
fn is_var_or_elems(expr: &str, var: &str, key: Option<&str>) -> bool {
    let expr = expr.trim().trim_start_matches('(').trim();
    let Some(mut rest) = expr.strip_prefix(var) else {
        return false;
    };
    if rest.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
        return false;
    }
    if let Some(key) = key {
        rest = rest.trim_start();
        let mut matched = None;
        for form in [
            format!("['{key}']"),
            format!("[\"{key}\"]"),
            format!(".{key}"),
        ] {
            if let Some(r) = rest.strip_prefix(form.as_str()) {
                matched = Some(r);
                break;
            }
        }
        let Some(r) = matched else { return false };
        if r.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
            return false;
        }
        rest = r;
    }
    let rest = rest.trim_start();
    rest.is_empty()
        || rest.starts_with('|')
        || rest.starts_with(')')
        || (rest.starts_with('[') && rest.split(']').next().is_some_and(|s| s.contains(':')))
}

fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_format_follows_the_loops() {
        let string = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}";
        assert_eq!(detect_content_format(string), ContentFormat::String);
        let openai = "{% for message in messages %}{% for c in message['content'] %}\
                      {{ c.text }}{% endfor %}{% endfor %}";
        assert_eq!(detect_content_format(openai), ContentFormat::OpenAi);
        let attr = "{%- for message in messages -%}{%- for c in message.content | \
                    selectattr('type', 'eq', 'text') -%}{{ c.text }}{%- endfor -%}{%- endfor -%}";
        assert_eq!(detect_content_format(attr), ContentFormat::OpenAi);
        let assigned = "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}\
                        {% for part in m[\"content\"] %}{{ part }}{% endfor %}{% endfor %}";
        assert_eq!(detect_content_format(assigned), ContentFormat::OpenAi);
        // A constant index is not the list: messages[0] is one message.
        let first = "{% set sys = messages[0] %}{% for c in sys['content'] %}{% endfor %}";
        assert_eq!(detect_content_format(first), ContentFormat::String);
        let plain = "{% for m in messages %}{% set content = m.content %}\
                     {% for x in content %}{% endfor %}{% endfor %}";
        assert_eq!(detect_content_format(plain), ContentFormat::OpenAi);
        let in_macro = "{% macro r(content) %}{% for x in content %}{% endfor %}{% endmacro %}";
        assert_eq!(detect_content_format(in_macro), ContentFormat::String);
    }

    #[test]
    fn developer_becomes_system_and_systems_merge() {
        let json = br#"[{"role":"system","content":"a"},{"role":"user","content":"q"},
                        {"role":"developer","content":[{"type":"text","text":"b"}]}]"#;
        let req = ChatRequest::from_json(json).unwrap();
        let conv = conversation(&req, ContentFormat::String, false).unwrap();
        assert_eq!(conv.len(), 2);
        assert_eq!(conv[0].get_attr("role").unwrap().as_str(), Some("system"));
        assert_eq!(
            conv[0].get_attr("content").unwrap().as_str(),
            Some("a\n\nb")
        );
        assert_eq!(conv[1].get_attr("role").unwrap().as_str(), Some("user"));
        // A template that knows the role keeps it.
        let conv = conversation(&req, ContentFormat::String, true).unwrap();
        assert_eq!(
            conv[2].get_attr("role").unwrap().as_str(),
            Some("developer")
        );
    }

    #[test]
    fn billing_header_line_is_dropped_from_system_text() {
        let json = br#"[{"role":"system","content":"x-anthropic-billing-header: cch=1\nrules"},
                        {"role":"user","content":"x-anthropic-billing-header stays"}]"#;
        let req = ChatRequest::from_json(json).unwrap();
        let conv = conversation(&req, ContentFormat::String, false).unwrap();
        assert_eq!(conv[0].get_attr("content").unwrap().as_str(), Some("rules"));
        assert_eq!(
            conv[1].get_attr("content").unwrap().as_str(),
            Some("x-anthropic-billing-header stays")
        );
    }

    #[test]
    fn mangled_json_is_an_error_never_a_panic() {
        let good = br#"{"model":"m","messages":[{"role":"system","content":"x-anthropic-billing-header: a\nb"},{"role":"developer","content":[{"type":"text","text":"d"},"bare"]},{"role":"user","content":null,"name":"n"},{"role":"tool","content":[{"type":"refusal","refusal":"r"}],"tool_call_id":"c"}],"add_generation_prompt":false}"#;
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut parsed = 0;
        for _ in 0..5000 {
            let mut bytes = good.to_vec();
            for _ in 0..(next() % 4 + 1) {
                let i = (next() as usize) % bytes.len();
                match next() % 3 {
                    0 => bytes[i] = (next() % 256) as u8,
                    1 => bytes.truncate(i.max(1)),
                    _ => bytes.insert(i, b"[]{}\":,0"[(next() % 8) as usize]),
                }
            }
            if let Ok(req) = ChatRequest::from_json(&bytes) {
                parsed += 1;
                for format in [ContentFormat::String, ContentFormat::OpenAi] {
                    for dev in [false, true] {
                        let _ = conversation(&req, format, dev);
                    }
                }
                let _ = req.check_supported();
            }
        }
        // Some mutations keep valid JSON (inside strings): those went through the conversion.
        assert!(parsed > 0);
    }

    #[test]
    fn non_text_parts_and_tool_calls_are_refused() {
        let json = br#"[{"role":"user","content":[{"type":"text","text":"a"},
                        {"type":"image_url","image_url":{"url":"x"}}]}]"#;
        let req = ChatRequest::from_json(json).unwrap();
        let err = conversation(&req, ContentFormat::String, false).unwrap_err();
        assert!(
            matches!(err, Error::UnsupportedContent { message: 0, part: 1, ref kind } if kind == "image_url"),
            "{err}"
        );
        let body = br#"{"messages":[{"role":"assistant","content":null,
                        "tool_calls":[{"type":"function","function":{"name":"f"}}]}]}"#;
        let req = ChatRequest::from_json(body).unwrap();
        assert!(matches!(
            req.check_supported(),
            Err(Error::Unsupported {
                field: "messages[].tool_calls",
                ..
            })
        ));
        let body = br#"{"messages":[{"role":"user","content":"a"}],"tools":[]}"#;
        assert!(
            ChatRequest::from_json(body)
                .unwrap()
                .check_supported()
                .is_ok()
        );
        assert!(matches!(
            ChatRequest::from_json(br#"{"messages": 3}"#),
            Err(Error::ChatJson { .. })
        ));
    }
}
