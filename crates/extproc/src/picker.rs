//! The endpoint picker (EPP): one ext_proc stream per HTTP request, answered with the chosen
//! endpoint and its fallbacks.
//!
//! [`EndpointPicker`] is the tonic service; each stream runs a `PickerExchange` (in
//! `picker/exchange.rs`), a synchronous state machine that turns Envoy's messages into answers,
//! inside the stream's response body ([`PickerStream`], see the crate-internal `stream` module):
//! no task or channel per request, and dropping the stream drops the exchange and, with it, the
//! request's in-flight guard.

use std::collections::HashMap;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::pool::EndpointPool;
use crate::stream::AnswerStream;
use crate::telemetry::{PoolTelemetry, Telemetry};
use crate::wire::BodyMode;

mod exchange;

pub(crate) use exchange::PickerExchange;

/// Default request body cap (bytes): large chat prompts fit, runaway uploads do not.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;
/// How much of a non-streamed response body is kept to read its `usage` (bytes).
pub const DEFAULT_MAX_RESPONSE_SCAN_BYTES: usize = 1 << 20;

/// How the picker behaves.
#[derive(Clone, Debug)]
pub struct PickerConfig {
    /// The InferencePool's name (a metric label).
    pub pool_name: String,
    /// Request bodies larger than this are answered 413.
    pub max_body_bytes: usize,
    /// Response bytes kept to read `usage` from a JSON (non-SSE) response.
    pub max_response_scan_bytes: usize,
    /// The body mode assumed when Envoy does not announce one (`protocol_config`). The EPP
    /// protocol configures `FULL_DUPLEX_STREAMED` on both paths.
    pub request_body_mode: BodyMode,
    /// As `request_body_mode`, for the response path.
    pub response_body_mode: BodyMode,
    /// Model names rewritten on the way in (requested → served); responses get the requested
    /// name back.
    pub model_rewrites: HashMap<String, String>,
    /// Per-tenant quotas (`--quotas`; the tenant is `x-llm-d-inference-fairness-id`, else
    /// `default`): a tenant over its quota is answered 429 before the pick.
    pub quotas: Option<infergate_pool::quota::Quotas>,
    /// Model rewrites and canary splits (`--rewrites`), reloadable; consulted before
    /// `model_rewrites`. Per-tenant rules match `x-llm-d-inference-fairness-id`.
    pub rewrites: crate::canary::RewriteTable,
    /// Whether a request carrying `x-infergate-explain: 1` gets its routing decision back in the
    /// `x-infergate-explain` response header (set by the response-path header mutation, or on
    /// the immediate response of a rejection). Off by default: the explanation names pods,
    /// addresses and scores.
    pub explain_header: bool,
    /// Flow control (`--flow-control`: `flowControl:` and `tenancy:`): requests wait in
    /// bounded per-priority queues while every pod is saturated. The tenant is
    /// `x-llm-d-inference-fairness-id` (else `default`), the priority the objective named by
    /// `x-llm-d-inference-objective`. `run_picker` turns it into [`PickerConfig::flow`].
    pub flow_control: Option<infergate_pool::flow::FlowSettings>,
    /// Precise prefix routing (`--tokenizer`, `--kv-events-port`): requests tokenized with the
    /// model's tokenizer and matched against the engines' KV-cache events. `run_picker` turns it
    /// on in the pool.
    pub precise: Option<infergate_pool::precise::PreciseConfig>,
    /// The running flow controller (set by `run_picker` from `flow_control`, or by a test);
    /// `None`: no flow control, a saturated pool routes or sheds at once.
    pub flow: Option<infergate_pool::flow::FlowController>,
}

impl Default for PickerConfig {
    fn default() -> Self {
        PickerConfig {
            pool_name: String::from("default"),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_response_scan_bytes: DEFAULT_MAX_RESPONSE_SCAN_BYTES,
            request_body_mode: BodyMode::FullDuplex,
            response_body_mode: BodyMode::FullDuplex,
            model_rewrites: HashMap::new(),
            quotas: None,
            rewrites: crate::canary::RewriteTable::default(),
            explain_header: false,
            flow_control: None,
            flow: None,
            precise: None,
        }
    }
}

/// State shared by every stream of one picker.
#[derive(Debug)]
pub(crate) struct Shared<P> {
    pub(crate) config: PickerConfig,
    pub(crate) pool: P,
    /// The pool's counters and histograms (cached handles).
    pub(crate) counters: PoolTelemetry,
}

/// The ext_proc endpoint-picker service. Cheap to clone.
#[derive(Debug)]
pub struct EndpointPicker<P> {
    pub(crate) shared: Arc<Shared<P>>,
}

impl<P> Clone for EndpointPicker<P> {
    fn clone(&self) -> Self {
        EndpointPicker {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<P: EndpointPool> EndpointPicker<P> {
    /// A picker routing on `pool`, counting into `telemetry`.
    pub fn new(config: PickerConfig, pool: P, telemetry: Telemetry) -> Self {
        let counters = telemetry.for_pool(&config.pool_name);
        if let (Some(flow), Some(changes)) = (&config.flow, pool.changes()) {
            flow.watch(changes);
        }
        EndpointPicker {
            shared: Arc::new(Shared {
                config,
                pool,
                counters,
            }),
        }
    }

    /// The pool this picker routes on.
    pub fn pool(&self) -> &P {
        &self.shared.pool
    }
}

#[tonic::async_trait]
impl<P: EndpointPool> ExternalProcessor for EndpointPicker<P> {
    type ProcessStream = PickerStream<P>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let exchange = PickerExchange::new(Arc::clone(&self.shared));
        let mut answers = AnswerStream::new(request.into_inner(), exchange);
        answers.first_answer().await;
        Ok(Response::new(PickerStream(answers)))
    }
}

/// The answers of one endpoint-picker stream. The request's state lives inside it: dropping it
/// (the stream ended or was reset) releases the request's in-flight entry.
pub struct PickerStream<P: EndpointPool>(AnswerStream<PickerExchange<P>>);

impl<P: EndpointPool> Stream for PickerStream<P> {
    type Item = Result<ProcessingResponse, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::pin::Pin::new(&mut self.0).poll_next(cx)
    }
}
