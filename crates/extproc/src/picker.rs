//! The endpoint picker (EPP): one ext_proc stream per HTTP request, answered with the chosen
//! endpoint and its fallbacks.
//!
//! [`EndpointPicker`] is the tonic service; each stream runs an `Exchange` (in `picker/exchange.rs`),
//! a synchronous state machine that turns Envoy's messages into answers. The service only moves
//! messages between the gRPC stream and the exchange, so dropping the stream drops the exchange
//! and, with it, the request's in-flight guard.

use std::collections::HashMap;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::pool::EndpointPool;
use crate::telemetry::Telemetry;
use crate::wire::BodyMode;

mod exchange;

pub(crate) use exchange::{Exchange, Flow};

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
        }
    }
}

/// State shared by every stream of one picker.
#[derive(Debug)]
pub(crate) struct Shared<P> {
    pub(crate) config: PickerConfig,
    pub(crate) pool: P,
    pub(crate) telemetry: Telemetry,
}

/// The ext_proc endpoint-picker service. Cheap to clone.
#[derive(Debug)]
pub struct EndpointPicker<P> {
    shared: Arc<Shared<P>>,
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
        EndpointPicker {
            shared: Arc::new(Shared {
                config,
                pool,
                telemetry,
            }),
        }
    }

    /// The pool this picker routes on.
    pub fn pool(&self) -> &P {
        &self.shared.pool
    }
}

/// Runs one ext_proc stream: reads Envoy's messages, feeds them to `on_message`, sends every
/// answer in order, and stops at the end of the stream, on a reset, or when the handler closes.
pub(crate) fn spawn_stream<S>(
    mut inbound: Streaming<ProcessingRequest>,
    mut state: S,
    mut on_message: impl FnMut(&mut S, ProcessingRequest, &mut Vec<ProcessingResponse>) -> Flow
    + Send
    + 'static,
) -> ReceiverStream<Result<ProcessingResponse, Status>>
where
    S: Send + 'static,
{
    // A few answers in flight are plenty: Envoy reads them as fast as it forwards bodies.
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut out = Vec::with_capacity(4);
        loop {
            let msg = match inbound.message().await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(status) => {
                    // A reset from the proxy: the HTTP request is gone; dropping `state` cancels.
                    tracing::debug!(%status, "ext_proc stream ended by the proxy");
                    break;
                }
            };
            let flow = on_message(&mut state, msg, &mut out);
            for r in out.drain(..) {
                if tx.send(Ok(r)).await.is_err() {
                    return;
                }
            }
            if flow == Flow::Close {
                break;
            }
        }
        drop(state);
    });
    ReceiverStream::new(rx)
}

#[tonic::async_trait]
impl<P: EndpointPool> ExternalProcessor for EndpointPicker<P> {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let exchange = Exchange::new(Arc::clone(&self.shared));
        Ok(Response::new(spawn_stream(
            request.into_inner(),
            exchange,
            |ex, msg, out| ex.on_message(msg, out),
        )))
    }
}
