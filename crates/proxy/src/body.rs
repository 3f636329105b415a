//! The response body the gateway sends: either its own small answer, or the upstream body passed
//! through frame by frame.
//!
//! [`Tracked`] forwards each upstream frame the moment it arrives (nothing is buffered on the way
//! to the client) and watches it on the side: SSE frames go through an
//! [`infergate_openai::SseScanner`] for the first token and the final usage; a non-streamed JSON
//! answer is also kept, up to a cap, to read its `usage` at the end. When the body ends it reports the outcome on the request's in-flight
//! guard. If the client goes away, hyper drops the body: the upstream connection is dropped with
//! it (cancelling the model server's work) and the guard cancels the in-flight entry.
//!
//! The body also drives its upstream connection (`upstream::Lease`): each poll first lets the
//! connection read, then takes the next frame, so upstream bytes wake only the client
//! connection's task. A body read to its end gives the connection back to the worker's pool.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use infergate_openai::ModelRewriter;
use infergate_pool::lifecycle::{self, Ending, ResponseWatch};
use infergate_pool::quota::QuotaTicket;
use tokio::time::{Instant, Sleep};

use crate::access_log::{Note, Outcome};
use crate::backend::Inflight;
use crate::limits::RequestSlot;
use crate::state::{Model, Permit};
use crate::upstream::Lease;

/// The largest non-streamed response kept to read its `usage` (larger ones are passed through
/// all the same, without usage accounting).
pub use infergate_pool::lifecycle::MAX_USAGE_BODY;

/// Why a response body ended early.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The model server's connection failed mid-body.
    #[error("the model server's response broke off: {0}")]
    Upstream(#[source] hyper::Error),
    /// No body bytes arrived for longer than the idle timeout.
    #[error("the model server sent nothing for {} ms", .0.as_millis())]
    Idle(Duration),
}

/// A body the gateway answers with.
pub enum ResponseBody {
    /// A complete body built by the gateway (errors, `/v1/models`).
    Full(Full<Bytes>),
    /// An upstream body passed through.
    Stream(Box<Tracked>),
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            ResponseBody::Full(f) => Pin::new(f)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map_err(|never| match never {}))),
            ResponseBody::Stream(t) => Pin::new(t.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Full(f) => f.is_end_stream(),
            ResponseBody::Stream(t) => t.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Full(f) => f.size_hint(),
            // A rewritten body's length is not the upstream's.
            ResponseBody::Stream(t) if t.rewriter.is_some() => SizeHint::default(),
            ResponseBody::Stream(t) => t.inner.size_hint(),
        }
    }
}

/// An upstream body passed through to the client, reporting its outcome.
pub struct Tracked {
    inner: Incoming,
    lease: Option<Lease>,
    /// The model's concurrency slot, if it has a limit: held until the body is dropped.
    _permit: Option<Permit>,
    /// The gateway-wide `maxRequestsInFlight` slot, held until the body is dropped.
    _slot: RequestSlot,
    inflight: Option<Inflight>,
    model: Arc<Model>,
    status: StatusCode,
    watch: ResponseWatch,
    started: Instant,
    idle: Duration,
    /// When the last frame arrived (kept once the idle timer is armed); the idle timeout counts
    /// from there.
    last_frame: Instant,
    /// Armed only when the upstream makes the body wait: most answers arrive whole, and a
    /// timer per request would cost an allocation and two timer-wheel updates for nothing.
    idle_timer: Option<Pin<Box<Sleep>>>,
    done: bool,
    /// Gives the response the model name the client asked for, when a rewrite changed it.
    rewriter: Option<ModelRewriter>,
    /// The tenant's quota charge (`quotas:`).
    quota: Option<QuotaTicket>,
    /// The tenant's attained-service charge (`flowControl:`).
    flow_charge: Option<infergate_pool::flow::FlowCharge>,
    /// The request's access-log note (`accessLog:`), logged when the body is dropped.
    note: Option<Box<Note>>,
}

/// What a [`Tracked`] body is made of: the upstream answer and the request's state.
pub(crate) struct Upstream {
    /// The model server's body.
    pub(crate) body: Incoming,
    /// Its connection, driven by the body and given back to the pool at the end.
    pub(crate) lease: Lease,
    /// The model's concurrency slot, held until the body is dropped.
    pub(crate) permit: Option<Permit>,
    /// The gateway-wide request slot, held until the body is dropped.
    pub(crate) slot: RequestSlot,
    /// The request's in-flight entry.
    pub(crate) inflight: Inflight,
    /// The model (for its metrics).
    pub(crate) model: Arc<Model>,
    /// The answer's status.
    pub(crate) status: StatusCode,
    /// Whether the body is an SSE stream.
    pub(crate) sse: bool,
    /// When the request arrived.
    pub(crate) started: Instant,
    /// Longest wait for the next body bytes.
    pub(crate) idle: Duration,
    /// The response-path model-name rewriter of a rewritten request.
    pub(crate) rewriter: Option<ModelRewriter>,
    /// The tenant's quota charge, corrected to the reported usage at the end.
    pub(crate) quota: Option<QuotaTicket>,
    /// The tenant's attained-service charge, settled with the reported usage at the end.
    pub(crate) flow_charge: Option<infergate_pool::flow::FlowCharge>,
    /// The request's access-log note, when the log is on.
    pub(crate) note: Option<Box<Note>>,
}

impl Tracked {
    pub(crate) fn new(up: Upstream) -> Self {
        let mut tracked = Tracked {
            inner: up.body,
            lease: Some(up.lease),
            _permit: up.permit,
            _slot: up.slot,
            inflight: Some(up.inflight),
            model: up.model,
            status: up.status,
            watch: ResponseWatch::new(up.status.as_u16(), up.sse, MAX_USAGE_BODY),
            started: up.started,
            idle: up.idle,
            last_frame: Instant::now(),
            idle_timer: None,
            done: false,
            rewriter: up.rewriter,
            // An answer is on its way: the request counts against the quota from here.
            quota: up.quota.map(QuotaTicket::commit),
            flow_charge: up.flow_charge,
            note: up.note,
        };
        // An answer without a body (`content-length: 0`) has ended with its head. hyper sends
        // such a response without polling its body, so it ends here: else the body, dropped
        // unread, would count as the client leaving (in-flight entry cancelled, access log
        // `cancelled`, connection closed).
        if tracked.inner.is_end_stream() {
            tracked.release();
            tracked.finish(true);
        }
        tracked
    }

    fn on_data(&mut self, data: &Bytes) {
        if self.watch.feed_bytes(data)
            && let Some(i) = self.inflight.as_mut()
        {
            i.first_token();
            let ttft = self.started.elapsed();
            self.model.metrics.ttft(ttft);
            if let Some(n) = self.note.as_deref_mut() {
                n.ttft = Some(ttft);
            }
        }
    }

    fn finish(&mut self, ok: bool) {
        if self.done {
            return;
        }
        self.done = true;
        let Some(inflight) = self.inflight.take() else {
            return;
        };
        let (ending, usage) =
            lifecycle::finish(inflight, self.status.as_u16(), ok, &mut self.watch);
        if ending == Ending::Completed {
            self.model.metrics.tokens(&usage);
        }
        if let Some(n) = self.note.as_deref_mut() {
            n.outcome = match ending {
                Ending::Completed => Outcome::Completed,
                Ending::Failed => Outcome::Failed,
                Ending::Refused => Outcome::Refused,
            };
            // Zero counts: the server reported none.
            n.usage = (ending == Ending::Completed && usage != Default::default()).then_some(usage);
        }
        lifecycle::settle_quota(self.quota.take(), ending, &usage);
        lifecycle::settle_flow(self.flow_charge.take(), ending, &usage);
    }

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(lease) = &mut this.lease {
            lease.drive(cx);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                let timer = match &mut this.idle_timer {
                    Some(t) => {
                        let deadline = this.last_frame + this.idle;
                        if t.deadline() != deadline {
                            t.as_mut().reset(deadline);
                        }
                        t
                    }
                    // The first wait: the last frame (if any) was taken just before this poll.
                    None => {
                        this.last_frame = Instant::now();
                        let deadline = this.last_frame + this.idle;
                        this.idle_timer
                            .insert(Box::pin(tokio::time::sleep_until(deadline)))
                    }
                };
                ready!(timer.as_mut().poll(cx));
                this.finish(false);
                Poll::Ready(Some(Err(BodyError::Idle(this.idle))))
            }
            Poll::Ready(None) => {
                this.release();
                this.finish(true);
                // What the rewriter held back (a possible start of a match) goes out last.
                match this.rewriter.take().map(|mut rw| rw.feed(&[], true)) {
                    Some(rest) if !rest.is_empty() => {
                        Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))))
                    }
                    _ => Poll::Ready(None),
                }
            }
            Poll::Ready(Some(Err(e))) => {
                this.finish(false);
                Poll::Ready(Some(Err(BodyError::Upstream(e))))
            }
            Poll::Ready(Some(Ok(mut frame))) => {
                let end = this.inner.is_end_stream();
                if let Some(data) = frame.data_ref() {
                    this.on_data(data);
                    // The watch reads the server's bytes; the client gets its own name back.
                    // (Model servers send no trailers, so held-back bytes never trail them.)
                    if let Some(rw) = this.rewriter.as_mut() {
                        frame = Frame::data(Bytes::from(rw.feed(data, end)));
                        if end {
                            this.rewriter = None;
                        }
                    }
                }
                if this.idle_timer.is_some() {
                    this.last_frame = Instant::now();
                }
                if end {
                    this.release();
                    this.finish(true);
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    /// The upstream body ended cleanly: its connection can serve another request.
    fn release(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.release();
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        // Whether it ended or the client left, the request is over now.
        let took = self.started.elapsed();
        self.model.metrics.duration(took);
        if let Some(mut note) = self.note.take() {
            if !self.done {
                note.outcome = Outcome::Cancelled;
            }
            note.done(took);
        }
        // `inflight`, if still held, cancels itself when dropped.
    }
}
