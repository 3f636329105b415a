//! The body-based router (BBR): reads `model` from the OpenAI body and sets the headers an
//! HTTPRoute matches on, so that Envoy picks the model's pool.
//!
//! - `x-gateway-model-name`: the requested model (a served model or a LoRA adapter);
//! - `x-gateway-base-model-name`: the base model serving it (set for every known model);
//! - `clear_route_cache`, so that Envoy re-evaluates the route with the new headers;
//! - an unknown model is answered 404 with a message telling the client to set `model`.
//!
//! The body itself is re-sent unchanged (with a corrected `content-length`).
//!
//! The two routing headers belong to the router, never to the client: a value the client sent
//! (in any letter case) is overwritten on a routed request and removed on every other one —
//! a path that is not one of the OpenAI APIs, a request without a body, a body mode that does
//! not show the body — so that no client can pick a pool by setting a header. Requests that
//! carry neither header and are not routed pass through untouched (no mutation, no
//! `clear_route_cache`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    CommonResponse, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use infergate_openai::{ApiError, ApiKind, ModelRouter, check_content_encoding, parse_request};
use prometheus_client::metrics::counter::Counter;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::error::Error;
use crate::picker::DEFAULT_MAX_BODY_BYTES;
use crate::run::invalid_in;
use crate::stream::{AnswerStream, Exchange, Flow};
use crate::telemetry::{BbrTelemetry, RoutedLabels};
use crate::wire::{self, BodyMode};

/// The served models and their LoRA adapters, as written in a `--models` file:
///
/// ```yaml
/// llama-3-8b: [sql-lora, chat-lora]
/// qwen-2.5-7b: []
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct ModelsFile {
    /// Base model → adapters.
    pub models: BTreeMap<String, Vec<String>>,
}

/// How a models file is laid out, for the errors of one that is not.
const MODELS_FILE_SHAPE: &str = "the file maps each served base model to the list of its LoRA \
     adapters, one per line (`llama-3-8b: [sql-lora, chat-lora]`, `qwen-2.5-7b: []`)";

impl ModelsFile {
    /// Reads and parses a models file. A file that names no model is refused: the router would
    /// answer every request 404.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        let file = Self::parse(&text).map_err(|source| {
            let listed =
                serde_yaml::from_str::<serde_yaml::Value>(&text).is_ok_and(|v| v.is_sequence());
            if listed {
                return invalid_in(path, MODELS_FILE_SHAPE.to_owned());
            }
            Error::Yaml {
                path: path.to_owned(),
                source,
            }
        })?;
        if file.models.is_empty() {
            return Err(invalid_in(
                path,
                format!(
                    "names no model, so every request would be answered 404 \
                     `model_not_found`: {MODELS_FILE_SHAPE}"
                ),
            ));
        }
        Ok(file)
    }

    /// Parses a models file's text.
    pub fn parse(text: &str) -> Result<Self, serde_yaml::Error> {
        serde_yaml::from_str(text)
    }

    /// The router table for these models.
    pub fn router(&self) -> Result<ModelRouter<()>, Error> {
        let mut router = ModelRouter::new();
        for (model, adapters) in &self.models {
            router.add_model(model, adapters, ())?;
        }
        Ok(router)
    }
}

/// How the body-based router behaves.
#[derive(Clone, Debug)]
pub struct BbrConfig {
    /// Request bodies larger than this are answered 413.
    pub max_body_bytes: usize,
    /// Body mode assumed when Envoy does not announce one.
    pub request_body_mode: BodyMode,
}

impl Default for BbrConfig {
    fn default() -> Self {
        BbrConfig {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            request_body_mode: BodyMode::FullDuplex,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    config: BbrConfig,
    router: ModelRouter<()>,
    telemetry: BbrTelemetry,
    /// `bbr_routed_total`'s counter of every served name, made at start: the names are the
    /// models file's, so the series are bounded and each exists (at 0) before its first request,
    /// and counting a routed request is a map lookup and an atomic add.
    routed: HashMap<Box<str>, Counter>,
}

/// The ext_proc body-based router service. Cheap to clone.
#[derive(Clone, Debug)]
pub struct BodyRouter {
    pub(crate) shared: Arc<Shared>,
}

impl BodyRouter {
    /// A router over `router`'s models.
    pub fn new(config: BbrConfig, router: ModelRouter<()>, telemetry: BbrTelemetry) -> Self {
        let routed = router
            .models()
            .into_iter()
            .map(|(model, base_model)| {
                let counter = telemetry
                    .routed
                    .get_or_create(&RoutedLabels {
                        model: model.to_owned(),
                        base_model: base_model.to_owned(),
                    })
                    .clone();
                (Box::from(model), counter)
            })
            .collect();
        BodyRouter {
            shared: Arc::new(Shared {
                config,
                router,
                telemetry,
                routed,
            }),
        }
    }
}

/// The headers the router owns: whatever the client sent under these names must not reach
/// route matching.
const ROUTING_HEADERS: [&str; 2] = [wire::MODEL_HEADER, wire::BASE_MODEL_HEADER];

/// Which of [`ROUTING_HEADERS`] the client sent (matched in any letter case; Envoy's header
/// maps are lowercase anyway).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
struct ClientRoutingHeaders([bool; 2]);

impl ClientRoutingHeaders {
    fn of(headers: &HttpHeaders) -> Self {
        ClientRoutingHeaders(ROUTING_HEADERS.map(|name| wire::find_header(headers, name).is_some()))
    }

    fn any(self) -> bool {
        self.0.contains(&true)
    }

    /// The names to list in `remove_headers` (lowercase, as Envoy stores them).
    fn removals(self) -> Vec<String> {
        ROUTING_HEADERS
            .iter()
            .zip(self.0)
            .filter(|(_, sent)| *sent)
            .map(|(name, _)| (*name).to_owned())
            .collect()
    }

    /// The answer to request headers for a request the router does not route: `None` (no
    /// change) unless the client sent a routing header, which is then removed, with
    /// `clear_route_cache` so that a route already matched on it is matched again.
    fn scrub(self) -> Option<CommonResponse> {
        self.any()
            .then(|| wire::common_with_removals(Vec::new(), self.removals(), true))
    }
}

/// One request's exchange with the body-based router.
pub(crate) struct BbrExchange {
    shared: Arc<Shared>,
    request_mode: BodyMode,
    response_mode: BodyMode,
    /// The routing headers the client sent, removed or overwritten in every header answer.
    client_headers: ClientRoutingHeaders,
    /// `Some(api)` while the body of an API request is being collected to route on.
    buffering: Option<ApiKind>,
    body: Vec<u8>,
}

impl Exchange for BbrExchange {
    fn on_message(&mut self, msg: ProcessingRequest, out: &mut Vec<ProcessingResponse>) -> Flow {
        if let Some(pc) = msg.protocol_config {
            self.request_mode = BodyMode::from_envoy(pc.request_body_mode);
            self.response_mode = BodyMode::from_envoy(pc.response_body_mode);
        }
        match msg.request {
            Some(Msg::RequestHeaders(h)) => {
                let path = wire::find_header(&h, ":path").unwrap_or_default();
                let kind = std::str::from_utf8(path).ok().and_then(ApiKind::from_path);
                self.client_headers = ClientRoutingHeaders::of(&h);
                if self.client_headers.any() {
                    tracing::debug!(
                        path = %String::from_utf8_lossy(path),
                        "client-sent routing headers: removed or overwritten"
                    );
                }
                // Only an API request whose body Envoy shows us is routed; anything else passes
                // unchanged but for the client's routing headers.
                self.buffering =
                    kind.filter(|_| !h.end_of_stream && self.request_mode != BodyMode::HeadersOnly);
                // A compressed body cannot be routed (nor read by a model server): 415 now.
                if self.buffering.is_some()
                    && let Err(e) =
                        check_content_encoding(wire::find_header(&h, "content-encoding"))
                {
                    return self.reject(&e, out);
                }
                // Full duplex holds the headers answer until the route is known; otherwise the
                // headers are answered now (buffered mode routes in the body answer, and a
                // spoofed header is removed already here).
                if self.buffering.is_none() || self.request_mode != BodyMode::FullDuplex {
                    out.push(wire::request_headers(self.client_headers.scrub()));
                }
                Flow::Continue
            }
            Some(Msg::RequestBody(b)) => self.on_body(b, out),
            Some(Msg::RequestTrailers(_)) => {
                let flow = match self.buffering {
                    Some(kind) => self.route(kind, false, out),
                    None => Flow::Continue,
                };
                if flow == Flow::Continue {
                    out.push(wire::trailers_continue(true));
                }
                flow
            }
            Some(Msg::ResponseHeaders(_)) => {
                out.push(wire::response_headers_continue());
                Flow::Continue
            }
            Some(Msg::ResponseBody(b)) => {
                match self.response_mode {
                    BodyMode::FullDuplex => {
                        wire::push_chunks(out, false, b.body, b.end_of_stream);
                    }
                    _ => out.push(wire::buffered_body(false, Default::default(), None)),
                }
                Flow::Continue
            }
            Some(Msg::ResponseTrailers(_)) => {
                out.push(wire::trailers_continue(false));
                Flow::Continue
            }
            None => Flow::Continue,
        }
    }
}

impl BbrExchange {
    /// A new exchange, before Envoy's first message.
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        BbrExchange {
            request_mode: shared.config.request_body_mode,
            response_mode: BodyMode::FullDuplex,
            shared,
            client_headers: ClientRoutingHeaders::default(),
            buffering: None,
            body: Vec::new(),
        }
    }

    fn on_body(&mut self, b: HttpBody, out: &mut Vec<ProcessingResponse>) -> Flow {
        let Some(kind) = self.buffering else {
            match self.request_mode {
                // In chunks of at most MAX_CHUNK, whatever size Envoy's chunk was.
                BodyMode::FullDuplex => wire::push_chunks(out, true, b.body, b.end_of_stream),
                _ => out.push(wire::buffered_body(true, Default::default(), None)),
            }
            return Flow::Continue;
        };
        let cap = self.shared.config.max_body_bytes;
        if self.body.len().saturating_add(b.body.len()) > cap {
            return self.reject(&ApiError::BodyTooLarge { limit: cap }, out);
        }
        if self.body.is_empty() {
            self.body = b.body;
        } else {
            self.body.extend_from_slice(&b.body);
        }
        if b.end_of_stream || self.request_mode != BodyMode::FullDuplex {
            self.route(kind, true, out)
        } else {
            Flow::Continue
        }
    }

    fn route(
        &mut self,
        kind: ApiKind,
        end_of_stream: bool,
        out: &mut Vec<ProcessingResponse>,
    ) -> Flow {
        let started = Instant::now();
        self.buffering = None;
        let body = std::mem::take(&mut self.body);
        let parsed = match parse_request(kind, &body) {
            Ok(p) => p,
            Err(e) => return self.reject(&e, out),
        };
        let resolved = match self.shared.router.resolve(&parsed.model) {
            Ok(r) => r,
            Err(e) => return self.reject(&e, out),
        };
        // Looked up before the body moves on (the name borrows it); counted once answered.
        let routed = self.shared.routed.get(parsed.model.as_ref());
        let set = vec![
            wire::set_header(wire::MODEL_HEADER, parsed.model.as_bytes()),
            wire::set_header(wire::BASE_MODEL_HEADER, resolved.base_model.as_bytes()),
            wire::set_header("content-length", body.len().to_string()),
        ];
        // Both routing headers are set with OVERWRITE_IF_EXISTS_OR_ADD. A client-sent one is
        // also removed (Envoy removes before it sets): older Envoys overwrite only the first
        // of several values, so a repeated spoofed header would otherwise survive.
        let common = wire::common_with_removals(set, self.client_headers.removals(), true);
        match self.request_mode {
            BodyMode::FullDuplex => {
                out.push(wire::request_headers(Some(common)));
                wire::push_chunks(out, true, body, end_of_stream);
            }
            _ => out.push(wire::buffered_body(true, common, None)),
        }
        if let Some(routed) = routed {
            routed.inc();
        }
        self.shared
            .telemetry
            .route_seconds
            .observe(started.elapsed().as_secs_f64());
        Flow::Continue
    }

    fn reject(&mut self, err: &ApiError, out: &mut Vec<ProcessingResponse>) -> Flow {
        tracing::debug!(error = %err, status = err.status(), "request answered locally");
        self.shared.telemetry.reject(err.metric_label());
        out.push(wire::immediate_error(err));
        Flow::Close
    }
}

#[tonic::async_trait]
impl ExternalProcessor for BodyRouter {
    type ProcessStream = BbrStream;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let ex = BbrExchange::new(Arc::clone(&self.shared));
        let mut answers = AnswerStream::new(request.into_inner(), ex);
        answers.first_answer().await;
        Ok(Response::new(BbrStream(answers)))
    }
}

/// The answers of one body-based-router stream (see the crate-internal `stream` module).
pub struct BbrStream(AnswerStream<BbrExchange>);

impl Stream for BbrStream {
    type Item = Result<ProcessingResponse, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::pin::Pin::new(&mut self.0).poll_next(cx)
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests {
    use super::*;

    /// A models file naming no model (empty, or `{}`) is refused: the router started and
    /// answered every request 404. A bare list of names says how the file is laid out (it said
    /// `invalid type: sequence, expected a map`).
    #[test]
    fn an_empty_or_listed_models_file_says_what_to_write() {
        let dir = tempfile::tempdir().unwrap();
        let load = |text: &str| {
            let path = dir.path().join("models.yaml");
            std::fs::write(&path, text).unwrap();
            ModelsFile::load(&path)
        };
        for text in ["", "\n", "{}\n", "- llama-3-8b\n- qwen-2.5-7b\n"] {
            let err = load(text).unwrap_err();
            assert!(matches!(err, Error::Yaml { .. }), "{text:?}: {err}");
            assert!(err.to_string().contains("models.yaml"), "{err}");
            let chain = infergate_pool::ErrorChain(&err).to_string();
            assert!(
                chain.contains("maps each served base model to the list of its LoRA adapters"),
                "{text:?}: {chain}"
            );
        }
        let chain = infergate_pool::ErrorChain(&load("").unwrap_err()).to_string();
        assert!(chain.contains("names no model"), "{chain}");
        let chain = infergate_pool::ErrorChain(&load("llama: sql\n").unwrap_err()).to_string();
        assert!(chain.contains("expected a sequence"), "{chain}");
        let file = load("llama-3-8b: [sql-lora]\nqwen-2.5-7b: []\n").unwrap();
        assert_eq!(file.models.len(), 2);
    }
}
