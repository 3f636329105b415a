//! The response body the gateway sends: either its own small answer, or the upstream body passed
//! through frame by frame.
//!
//! [`Tracked`] forwards each upstream frame the moment it arrives (nothing is buffered on the way
//! to the client) and watches it on the side: SSE frames go through an [`SseScanner`] for the
//! first token and the final usage; a non-streamed JSON answer is also kept, up to a cap, to read
//! its `usage` at the end. When the body ends it reports the outcome on the request's in-flight
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
use infergate_openai::{SseScanner, Usage, extract_usage};
use tokio::time::{Instant, Sleep};

use crate::backend::Inflight;
use crate::state::{Model, Permit};
use crate::upstream::Lease;

/// The largest non-streamed response kept to read its `usage` (larger ones are passed through
/// all the same, without usage accounting).
pub const MAX_USAGE_BODY: usize = 1 << 20;

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
            ResponseBody::Stream(t) => t.inner.size_hint(),
        }
    }
}

/// What the side channel watches for.
enum Watch {
    /// An SSE stream: first token and final usage.
    Sse(SseScanner),
    /// A JSON answer kept to read `usage` at the end. A body that arrives as one frame (the usual
    /// case) is kept by reference, without a copy.
    Json(Option<Bytes>, Vec<u8>),
    /// Nothing to read (errors, embeddings over the cap, ...).
    Nothing,
}

/// An upstream body passed through to the client, reporting its outcome.
pub struct Tracked {
    inner: Incoming,
    lease: Option<Lease>,
    /// The model's concurrency slot, if it has a limit: held until the body is dropped.
    _permit: Option<Permit>,
    inflight: Option<Inflight>,
    model: Arc<Model>,
    status: StatusCode,
    watch: Watch,
    started: Instant,
    idle: Duration,
    /// When the last frame arrived (kept once the idle timer is armed); the idle timeout counts
    /// from there.
    last_frame: Instant,
    /// Armed only when the upstream makes the body wait: most answers arrive whole, and a
    /// timer per request would cost an allocation and two timer-wheel updates for nothing.
    idle_timer: Option<Pin<Box<Sleep>>>,
    done: bool,
}

impl Tracked {
    #[allow(clippy::too_many_arguments)] // one call site; a builder would only rename these
    pub(crate) fn new(
        inner: Incoming,
        lease: Lease,
        permit: Option<Permit>,
        inflight: Inflight,
        model: Arc<Model>,
        status: StatusCode,
        sse: bool,
        generates: bool,
        started: Instant,
        idle: Duration,
    ) -> Self {
        let watch = if !status.is_success() {
            Watch::Nothing
        } else if sse {
            Watch::Sse(SseScanner::new())
        } else if generates {
            Watch::Json(None, Vec::new())
        } else {
            Watch::Nothing
        };
        Tracked {
            inner,
            lease: Some(lease),
            _permit: permit,
            inflight: Some(inflight),
            model,
            status,
            watch,
            started,
            idle,
            last_frame: Instant::now(),
            idle_timer: None,
            done: false,
        }
    }

    fn on_data(&mut self, data: &Bytes) {
        match &mut self.watch {
            Watch::Sse(scanner) => {
                if scanner.feed(data)
                    && let Some(i) = self.inflight.as_mut()
                {
                    i.first_token();
                    self.model.metrics.ttft(self.started.elapsed());
                }
            }
            Watch::Json(first, buf) => {
                let held = first.as_ref().map_or(0, Bytes::len) + buf.len();
                if held + data.len() > MAX_USAGE_BODY {
                    self.watch = Watch::Nothing;
                } else if first.is_none() && buf.is_empty() {
                    *first = Some(data.clone());
                } else {
                    if let Some(f) = first.take() {
                        buf.extend_from_slice(&f);
                    }
                    buf.extend_from_slice(data);
                }
            }
            Watch::Nothing => {}
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
        if !ok || self.status.is_server_error() {
            inflight.fail();
            return;
        }
        if !self.status.is_success() {
            // The server answered (a 4xx about the request itself): nothing to learn from it.
            drop(inflight);
            return;
        }
        let usage = match &mut self.watch {
            Watch::Sse(scanner) => {
                scanner.finish();
                scanner.usage()
            }
            Watch::Json(Some(first), _) => extract_usage(first),
            Watch::Json(None, buf) => extract_usage(buf),
            Watch::Nothing => None,
        };
        let usage = usage.unwrap_or(Usage::default());
        self.model.metrics.tokens(&usage);
        inflight.complete(infergate_scheduler::Usage {
            prompt_tokens: clamp(usage.prompt_tokens),
            cached_tokens: clamp(usage.cached_tokens),
            output_tokens: clamp(usage.completion_tokens),
        });
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
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                this.finish(false);
                Poll::Ready(Some(Err(BodyError::Upstream(e))))
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.on_data(data);
                }
                if this.idle_timer.is_some() {
                    this.last_frame = Instant::now();
                }
                if this.inner.is_end_stream() {
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
        self.model.metrics.duration(self.started.elapsed());
        // `inflight`, if still held, cancels itself when dropped.
    }
}

fn clamp(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}
