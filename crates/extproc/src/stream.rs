//! The answer stream of one ext_proc exchange, driven inline by the gRPC response body.
//!
//! Each Envoy request opens one bidirectional stream. Its answers are produced by a synchronous
//! state machine (an [`Exchange`]); [`AnswerStream`] runs that machine directly inside the
//! response body's `poll_next`: when the server asks for the next answer, the stream hands out
//! one already produced or reads the next message from Envoy and feeds it to the machine. There is
//! no task and no channel per request — the HTTP/2 stream task that polls the response body is the
//! only one — so a request costs no spawn, no channel allocation and no cross-task wake-ups.
//!
//! The services return the stream only once its first answer is ready
//! ([`AnswerStream::first_answer`]), so the gRPC response headers and that answer leave in one
//! write.
//!
//! Dropping the stream (the request ended, Envoy reset the stream, or the connection closed)
//! drops the exchange, which releases the request's in-flight entry.

use std::pin::Pin;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use tokio_stream::Stream;
use tonic::{Status, Streaming};

/// Whether the stream goes on after a message.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Keep reading.
    Continue,
    /// An immediate response was sent: the request is over.
    Close,
}

/// A per-request state machine: one message from Envoy in, zero or more answers out, in order.
pub(crate) trait Exchange: Send + 'static {
    /// Handles one message from Envoy, appending the answers to `out`.
    fn on_message(&mut self, msg: ProcessingRequest, out: &mut Vec<ProcessingResponse>) -> Flow;

    /// Drives work the exchange waits on between messages (a request queued by flow control),
    /// appending its answers to `out`. `Pending`: still waiting (the waker is registered);
    /// Envoy's next messages are read only once it is ready.
    fn poll_waiting(
        &mut self,
        _cx: &mut Context<'_>,
        _out: &mut Vec<ProcessingResponse>,
    ) -> Poll<Flow> {
        Poll::Ready(Flow::Continue)
    }
}

/// Runs an [`Exchange`] as the response stream of one ext_proc call.
pub(crate) struct AnswerStream<C> {
    inbound: Streaming<ProcessingRequest>,
    /// `None` once the exchange is over (dropped as soon as it ends, not when the stream is).
    exchange: Option<C>,
    /// Answers produced and not yet handed out: `pending[next..]`.
    pending: Vec<ProcessingResponse>,
    next: usize,
}

impl<C: Exchange> AnswerStream<C> {
    pub(crate) fn new(inbound: Streaming<ProcessingRequest>, exchange: C) -> Self {
        AnswerStream {
            inbound,
            exchange: Some(exchange),
            // A routed request answers with a headers response and (usually) one body chunk.
            pending: Vec::with_capacity(4),
            next: 0,
        }
    }
}

// The exchange is never pinned (it is only reached through `&mut`), so the stream may move
// whatever the exchange holds.
impl<C> Unpin for AnswerStream<C> {}

impl<C: Exchange> AnswerStream<C> {
    /// Resolves once an answer is ready to go out or the exchange has ended.
    ///
    /// The services await this before returning the stream, so that the gRPC response headers
    /// leave together with the first answer (one write instead of two), as grpc-go servers send
    /// them lazily with the first message. Envoy does not wait for the response headers before
    /// sending its messages.
    pub(crate) async fn first_answer(&mut self) {
        std::future::poll_fn(|cx| self.poll_fill(cx)).await;
    }

    /// Reads Envoy's messages into the exchange until an answer is pending or the
    /// exchange is over.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.next < self.pending.len() {
                return Poll::Ready(());
            }
            let Some(exchange) = self.exchange.as_mut() else {
                return Poll::Ready(());
            };
            match exchange.poll_waiting(cx, &mut self.pending) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Flow::Close) => {
                    self.exchange = None;
                    continue;
                }
                Poll::Ready(Flow::Continue) if self.next < self.pending.len() => continue,
                Poll::Ready(Flow::Continue) => {}
            }
            match Pin::new(&mut self.inbound).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(msg))) => {
                    if exchange.on_message(msg, &mut self.pending) == Flow::Close {
                        // The answers already produced still go out; then the stream ends.
                        self.exchange = None;
                    }
                }
                Poll::Ready(Some(Err(status))) => {
                    // A reset from the proxy: the HTTP request is gone; dropping the
                    // exchange cancels it.
                    tracing::debug!(%status, "ext_proc stream ended by the proxy");
                    self.exchange = None;
                }
                Poll::Ready(None) => self.exchange = None,
            }
        }
    }
}

impl<C: Exchange> Stream for AnswerStream<C> {
    type Item = Result<ProcessingResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.poll_fill(cx).is_pending() {
            return Poll::Pending;
        }
        if this.next == this.pending.len() {
            return Poll::Ready(None);
        }
        let answer = std::mem::take(&mut this.pending[this.next]);
        this.next += 1;
        if this.next == this.pending.len() {
            this.pending.clear();
            this.next = 0;
        }
        Poll::Ready(Some(Ok(answer)))
    }
}
