//! vLLM's Responses API on an emulated vLLM pod: `POST /v1/responses`, as JSON or as named
//! server-sent events.
//!
//! A thin front over the chat path: the request's `instructions` and `input` become chat messages
//! (as vLLM's `construct_input_messages` builds them: the instructions as a system message, a
//! string input as one user message, input items as their messages), rendered with the same
//! stand-in chat template, admitted to the engine by the same [`admit`] and read back through the
//! same [`TokenFeed`]. Only the wire format is the Responses API's, modelled on vLLM 0.32
//! (`vllm/entrypoints/openai/responses/`: `serving.py`, `streaming_events.py`, `protocol.py`,
//! `api_router.py`): every event is written as `event: <type>` then `data: <json>`, numbered by
//! `sequence_number` from 0, and the stream ends after `response.completed` with no `[DONE]`.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{Map, Value, json};

use super::PodShared;
use super::http::{
    DEFAULT_CHAT_MAX_TOKENS, Fed, GENERATION_PROMPT, Parsed, Reject, SimBody, TokenFeed, admit,
    bad, cache_salt, encode_chat, error, json_response, object, opt_bool, push_message, read_body,
    resolve_model, streaming,
};
use crate::engine::Completion;
use crate::tokens::Prompt;

/// The handler label of the pod's HTTP counters, as vLLM's route.
const HANDLER: &str = "/v1/responses";

/// A parsed Responses API request: the engine request, and the request fields that the response
/// object repeats.
pub(crate) struct ResponsesRequest {
    pub(crate) parsed: Parsed,
    echo: Map<String, Value>,
}

/// `POST /v1/responses`.
pub(crate) async fn handle(shared: Arc<PodShared>, req: Request<Incoming>) -> Response<SimBody> {
    let r = answer(&shared, req).await;
    shared.count_http(HANDLER, r.status().as_u16());
    r
}

async fn answer(shared: &Arc<PodShared>, req: Request<Incoming>) -> Response<SimBody> {
    let body = match read_body(shared, req).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let request = match parse(shared, &body) {
        Ok(r) => r,
        Err((status, msg, param)) => return error(shared, status, &msg, param),
    };
    let feed = match admit(shared, &request.parsed) {
        Ok(f) => f,
        Err((status, msg, param)) => return error(shared, status, &msg, param),
    };
    let mut events = Events::new(request, &shared.name, feed.id, super::unix_now() as u64);
    if events.stream {
        let s = EventStream {
            feed,
            events,
            started: false,
            ended: false,
        };
        return streaming(shared, SimBody::Events(Box::new(s)));
    }
    match feed.collect(shared).await {
        Ok((text, done)) => {
            events.text = text;
            json_response(shared, StatusCode::OK, &events.object(&done))
        }
        Err(r) => r,
    }
}

/// Reads a Responses API request. As in vLLM: `model` may be left out (the base model);
/// `max_output_tokens` is cut to what the context has room for, and a prompt that fills the
/// context is refused (`param: "input"`); `background` needs a response store and a
/// `previous_response_id` a stored response, neither of which a pod has (vLLM's default).
pub(crate) fn parse(shared: &PodShared, body: &[u8]) -> Result<ResponsesRequest, Reject> {
    let obj = object(body)?;
    let model = super::http::request_model(shared, &obj)?;
    let lora = resolve_model(shared, &model)?;
    if opt_bool(&obj, "background")? == Some(true) {
        return Err(bad(
            "This vLLM engine does not support `store=True` and therefore does not support the background mode.",
            "background",
        ));
    }
    match obj.get("previous_response_id") {
        None | Some(Value::Null) => {}
        Some(Value::String(id)) => {
            return Err((
                StatusCode::NOT_FOUND,
                format!("Response with id '{id}' not found."),
                Some("response_id"),
            ));
        }
        Some(_) => {
            return Err(bad(
                "previous_response_id must be a string",
                "previous_response_id",
            ));
        }
    }
    let mut text = Conversation::default();
    match obj.get("instructions") {
        None | Some(Value::Null) => {}
        Some(v @ Value::String(s)) => {
            if !s.is_empty() {
                text.push("system", Some(v), "instructions")?;
            }
        }
        Some(_) => return Err(bad("instructions must be a string", "instructions")),
    }
    match obj.get("input") {
        Some(v @ Value::String(_)) => text.push("user", Some(v), "input")?,
        Some(Value::Array(items)) => {
            for item in items {
                push_item(&mut text, item)?;
            }
        }
        Some(_) => {
            return Err(bad(
                "input must be a string or a list of input items",
                "input",
            ));
        }
        None => return Err(bad("field required: input", "input")),
    }
    let prompt = match shared.tokenizer.as_deref() {
        // The chat request of those messages, through the model's chat template.
        Some(t) => {
            let chat = json!({"messages": text.messages}).to_string();
            Prompt::Ids(encode_chat(t, chat.as_bytes())?.into())
        }
        None => {
            text.text.push_str(GENERATION_PROMPT);
            Prompt::Text(text.text.into())
        }
    };
    let prompt_tokens = prompt.token_count();
    let max_len = shared.profile.max_model_len;
    if prompt_tokens >= max_len {
        return Err(bad(
            format!(
                "The engine prompt length {prompt_tokens} exceeds the max_model_len {max_len}. Please reduce prompt."
            ),
            "input",
        ));
    }
    let room = max_len - prompt_tokens;
    let (max_tokens, explicit_max) = match obj.get("max_output_tokens") {
        None | Some(Value::Null) => (DEFAULT_CHAT_MAX_TOKENS.min(room), false),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => (u32::try_from(n).unwrap_or(u32::MAX).min(room), true),
            _ => {
                return Err(bad(
                    "max_output_tokens must be an integer of at least 1",
                    "max_output_tokens",
                ));
            }
        },
    };
    let stream = opt_bool(&obj, "stream")?.unwrap_or(false);
    let echo = echo(&obj);
    Ok(ResponsesRequest {
        parsed: Parsed {
            prompt,
            prompt_ids: None,
            max_tokens,
            explicit_max,
            lora,
            cache_salt: cache_salt(&obj)?,
            stream,
            include_usage: false,
            model,
        },
        echo,
    })
}

/// One input item as a chat message, as vLLM turns items into messages: a message (any item with
/// a `role`), a tool's output (`function_call_output`, as a `tool` message) or a tool call the
/// model made (`function_call`: its arguments, as the assistant's). Other item types (reasoning,
/// built-in tool calls) are refused here.
/// The chat messages a Responses request stands for: rendered with the stand-in template, and
/// as the chat request's messages for the model's own template.
#[derive(Default)]
struct Conversation {
    text: String,
    messages: Vec<Value>,
}

impl Conversation {
    /// Appends one message (see [`push_message`]).
    fn push(
        &mut self,
        role: &str,
        content: Option<&Value>,
        param: &'static str,
    ) -> Result<(), Reject> {
        push_message(&mut self.text, role, content, param)?;
        self.messages
            .push(json!({"role": role, "content": content}));
        Ok(())
    }
}

fn push_item(text: &mut Conversation, item: &Value) -> Result<(), Reject> {
    let kind = item.get("type").and_then(Value::as_str);
    if let Some(role) = item.get("role").and_then(Value::as_str)
        && matches!(kind, None | Some("message"))
    {
        return text.push(role, item.get("content"), "input");
    }
    match kind {
        Some("function_call_output" | "custom_tool_call_output") => {
            text.push("tool", item.get("output"), "input")
        }
        Some("function_call") => text.push("assistant", item.get("arguments"), "input"),
        Some(other) => Err(bad(
            format!("Unsupported input item type: {other}"),
            "input",
        )),
        None => Err(bad("every input item needs a role or a type", "input")),
    }
}

/// The request fields the response object repeats, with vLLM's defaults where they are left out.
fn echo(obj: &Map<String, Value>) -> Map<String, Value> {
    let given = |key: &str, default: Value| match obj.get(key) {
        None | Some(Value::Null) => default,
        Some(v) => v.clone(),
    };
    let mut m = Map::new();
    m.insert("instructions".into(), given("instructions", Value::Null));
    m.insert("metadata".into(), given("metadata", Value::Null));
    m.insert(
        "parallel_tool_calls".into(),
        given("parallel_tool_calls", json!(true)),
    );
    m.insert("temperature".into(), given("temperature", json!(1.0)));
    m.insert("tool_choice".into(), given("tool_choice", json!("auto")));
    m.insert("tools".into(), given("tools", json!([])));
    m.insert("top_p".into(), given("top_p", json!(1.0)));
    m.insert(
        "max_tool_calls".into(),
        given("max_tool_calls", Value::Null),
    );
    m.insert("reasoning".into(), given("reasoning", Value::Null));
    m.insert("service_tier".into(), given("service_tier", json!("auto")));
    m.insert("text".into(), given("text", Value::Null));
    m.insert("truncation".into(), given("truncation", json!("disabled")));
    m.insert("user".into(), given("user", Value::Null));
    m.insert(
        "presence_penalty".into(),
        given("presence_penalty", json!(0.0)),
    );
    m.insert(
        "frequency_penalty".into(),
        given("frequency_penalty", json!(0.0)),
    );
    m
}

/// The response object and its events for one request: what has been generated so far, and the
/// next event's sequence number.
pub(crate) struct Events {
    /// The response object's fields that do not change while it is generated.
    head: Map<String, Value>,
    item_id: String,
    /// The output text so far.
    pub(crate) text: String,
    /// The status when it ends: `incomplete` when it stops at `max_output_tokens` (the emulator
    /// always generates that many tokens, as a chat answer ends with `finish_reason: "length"`).
    incomplete: bool,
    stream: bool,
    next: u64,
    opened: bool,
}

impl Events {
    pub(crate) fn new(request: ResponsesRequest, pod: &str, id: u64, created_at: u64) -> Self {
        let p = request.parsed;
        let mut head = request.echo;
        head.insert("id".into(), json!(format!("resp_{pod}-{id}")));
        head.insert("created_at".into(), json!(created_at));
        head.insert("model".into(), json!(p.model));
        head.insert("object".into(), json!("response"));
        head.insert("background".into(), json!(false));
        head.insert("max_output_tokens".into(), json!(p.max_tokens));
        head.insert("previous_response_id".into(), Value::Null);
        head.insert("prompt".into(), Value::Null);
        head.insert("top_logprobs".into(), Value::Null);
        for key in [
            "kv_transfer_params",
            "ec_transfer_params",
            "input_messages",
            "output_messages",
        ] {
            head.insert(key.into(), Value::Null);
        }
        Events {
            head,
            item_id: format!("msg_{pod}-{id}"),
            text: String::new(),
            incomplete: p.explicit_max,
            stream: p.stream,
            next: 0,
            opened: false,
        }
    }

    /// The response object in a state: `output` and `usage` as given.
    fn response(&self, status: &str, output: Value, usage: Value) -> Value {
        let mut r = self.head.clone();
        let details = if status == "incomplete" {
            json!({"reason": "max_output_tokens"})
        } else {
            Value::Null
        };
        r.insert("incomplete_details".into(), details);
        r.insert("status".into(), json!(status));
        r.insert("output".into(), output);
        r.insert("usage".into(), usage);
        Value::Object(r)
    }

    /// The finished response object (the non-streamed answer, and `response.completed`'s).
    pub(crate) fn object(&self, done: &Completion) -> Value {
        let status = if self.incomplete {
            "incomplete"
        } else {
            "completed"
        };
        let content = if self.text.is_empty() {
            json!([])
        } else {
            json!([self.part(Value::Null)])
        };
        self.response(
            status,
            json!([self.message("completed", content)]),
            usage(done),
        )
    }

    fn message(&self, status: &str, content: Value) -> Value {
        json!({
            "id": self.item_id, "content": content, "role": "assistant", "status": status,
            "type": "message", "phase": null,
        })
    }

    fn part(&self, logprobs: Value) -> Value {
        json!({"annotations": [], "text": self.text, "type": "output_text", "logprobs": logprobs})
    }

    /// Appends one event: `fields` with the event's `sequence_number` and `type`.
    fn event(&mut self, out: &mut Vec<u8>, kind: &str, mut fields: Value) {
        if let Value::Object(m) = &mut fields {
            m.insert("sequence_number".into(), json!(self.next));
            m.insert("type".into(), json!(kind));
        }
        self.next += 1;
        out.extend_from_slice(format!("event: {kind}\ndata: {fields}\n\n").as_bytes());
    }

    /// `response.created` and `response.in_progress`, sent before the request is scheduled.
    pub(crate) fn start(&mut self) -> Bytes {
        let r = self.response("in_progress", json!([]), Value::Null);
        let mut out = Vec::new();
        self.event(&mut out, "response.created", json!({"response": r}));
        self.event(&mut out, "response.in_progress", json!({"response": r}));
        Bytes::from(out)
    }

    /// One token's `response.output_text.delta`, after the message and its text part are added
    /// (vLLM opens them with the first text).
    pub(crate) fn delta(&mut self, word: &str) -> Bytes {
        let mut out = Vec::new();
        let at = json!({"output_index": 0, "item_id": self.item_id, "content_index": 0});
        if !self.opened {
            self.opened = true;
            let item = self.message("in_progress", json!([]));
            self.event(
                &mut out,
                "response.output_item.added",
                json!({"item": item, "output_index": 0}),
            );
            let mut added = at.clone();
            added["part"] = self.part(json!([]));
            self.event(&mut out, "response.content_part.added", added);
        }
        self.text.push_str(word);
        let mut delta = at;
        delta["delta"] = json!(word);
        delta["logprobs"] = json!([]);
        self.event(&mut out, "response.output_text.delta", delta);
        Bytes::from(out)
    }

    /// The closing events: the text, its part and the message done, then `response.completed`
    /// with the usage.
    pub(crate) fn completed(&mut self, done: &Completion) -> Bytes {
        let mut out = Vec::new();
        if self.opened {
            let at = json!({"output_index": 0, "item_id": self.item_id, "content_index": 0});
            let mut text_done = at.clone();
            text_done["text"] = json!(self.text);
            text_done["logprobs"] = json!([]);
            self.event(&mut out, "response.output_text.done", text_done);
            let mut part_done = at;
            part_done["part"] = self.part(Value::Null);
            self.event(&mut out, "response.content_part.done", part_done);
            let item = self.message("completed", json!([self.part(Value::Null)]));
            self.event(
                &mut out,
                "response.output_item.done",
                json!({"item": item, "output_index": 0}),
            );
        }
        let r = self.object(done);
        self.event(&mut out, "response.completed", json!({"response": r}));
        Bytes::from(out)
    }
}

/// vLLM's `ResponseUsage` (one turn: the per-turn lists stay empty, as vLLM leaves them outside
/// its multi-turn tool contexts).
fn usage(c: &Completion) -> Value {
    json!({
        "input_tokens": c.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": c.cached_tokens, "cache_write_tokens": 0,
            "input_tokens_per_turn": [], "cached_tokens_per_turn": [],
        },
        "output_tokens": c.output_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0, "tool_output_tokens": 0,
            "output_tokens_per_turn": [], "tool_output_tokens_per_turn": [],
        },
        "total_tokens": c.prompt_tokens + c.output_tokens,
    })
}

/// A streamed Responses API answer: the events as the engine produces tokens.
pub(crate) struct EventStream {
    feed: TokenFeed,
    events: Events,
    started: bool,
    ended: bool,
}

impl EventStream {
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if !self.started {
            self.started = true;
            return Poll::Ready(Some(self.events.start()));
        }
        match self.feed.poll_fed(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Fed::Word(word)) => Poll::Ready(Some(self.events.delta(word))),
            Poll::Ready(Fed::Done(done)) => {
                self.ended = true;
                Poll::Ready(Some(self.events.completed(&done)))
            }
            Poll::Ready(Fed::Closed) => {
                self.ended = true;
                Poll::Ready(None)
            }
        }
    }
}

#[cfg(test)]
mod tests;
