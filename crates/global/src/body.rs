//! The router's response body: its own small answer, or a cluster's body passed through frame
//! by frame, untouched, while its first token and usage are read on the side.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use infergate_pool::lifecycle::ResponseWatch;
use tokio::time::Instant;

use infergate_openai::Usage;

use crate::access_log::{Outcome, Record};
use crate::cluster::Cluster;
use crate::server::Slot;
use crate::telemetry::Telemetry;

/// A body the router answers with.
pub enum RouterBody {
    /// Built by the router (errors, `/v1/models`).
    Full(Full<Bytes>),
    /// A cluster's answer.
    Upstream(Box<Observed>),
}

/// A cluster's body, watched on the side.
pub struct Observed {
    pub(crate) inner: Incoming,
    pub(crate) cluster: Arc<Cluster>,
    /// The cluster's price of one input and one output token when the request was routed.
    pub(crate) price: (f64, f64),
    pub(crate) telemetry: Arc<Telemetry>,
    pub(crate) watch: ResponseWatch,
    pub(crate) sent_at: Instant,
    /// The cluster's heartbeat-based estimate of this request's TTFT, ms, which its measured
    /// TTFT corrects.
    pub(crate) heartbeat_ttft_ms: f64,
    pub(crate) first_token: bool,
    /// Counted as pending on the cluster until the first token.
    pub(crate) pending: Option<crate::cluster::Pending>,
    /// The tenant's quota charge, corrected to the reported usage at the end.
    pub(crate) quota: Option<infergate_pool::quota::QuotaTicket>,
    pub(crate) done: bool,
    /// The request's access-log record (`accessLog:`), logged when the body is dropped.
    pub(crate) record: Option<Box<Record>>,
    /// The router-wide request slot, held to the last byte.
    pub(crate) _slot: Slot,
}

impl Observed {
    fn finish(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let usage = self.watch.usage();
        let cost = usage.map(|u| {
            if let Some(q) = self.quota.take() {
                q.settle(&u);
            }
            self.cluster.observe_usage(
                u.prompt_tokens,
                u.completion_tokens,
                self.price,
                &self.telemetry,
            )
        });
        if let Some(r) = self.record.as_deref_mut() {
            r.outcome = match r.status {
                Some(200..=299) => Outcome::Completed,
                Some(500..) => Outcome::Failed,
                _ => Outcome::Refused,
            };
            // Zero counts: the cluster reported none.
            if usage.is_some_and(|u| u != Usage::default()) {
                (r.usage, r.cost) = (usage, cost);
            }
        }
    }
}

impl Body for RouterBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            RouterBody::Full(f) => Pin::new(f)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map_err(|never| match never {}))),
            RouterBody::Upstream(o) => {
                let o = o.as_mut();
                let frame = ready!(Pin::new(&mut o.inner).poll_frame(cx));
                match &frame {
                    Some(Ok(f)) => {
                        if let Some(data) = f.data_ref()
                            && o.watch.feed_bytes(data)
                            && !o.first_token
                        {
                            o.first_token = true;
                            o.pending = None;
                            o.cluster.observe_ttft(
                                o.sent_at.elapsed(),
                                o.heartbeat_ttft_ms,
                                &o.telemetry,
                            );
                            if let Some(r) = o.record.as_deref_mut() {
                                r.first_token();
                            }
                        }
                    }
                    None => o.finish(),
                    Some(Err(_)) => {
                        o.done = true;
                        if let Some(r) = o.record.as_deref_mut() {
                            r.outcome = Outcome::Failed;
                        }
                    }
                }
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RouterBody::Full(f) => f.is_end_stream(),
            RouterBody::Upstream(o) => o.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RouterBody::Full(f) => f.size_hint(),
            RouterBody::Upstream(o) => o.inner.size_hint(),
        }
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        // A body whose end-of-stream frame was never polled (its length was known) still
        // reports its usage.
        if self.inner.is_end_stream() {
            self.finish();
        }
        // Whether it ended or the client left, the request is over now.
        if let Some(mut record) = self.record.take() {
            if !self.done {
                record.outcome = Outcome::Cancelled;
            }
            record.done();
        }
    }
}
