//! [`EndpointPool`] for the shared live pool.

use std::net::SocketAddr;

use infergate_pool::{Inflight, LivePool};
use infergate_scheduler::{Rejection, RequestContext, Usage};

use super::{EndpointPool, InflightGuard};

impl EndpointPool for LivePool {
    type Inflight = Inflight;

    fn pick(&self, cx: &RequestContext<'_>) -> Result<Inflight, Rejection> {
        LivePool::pick(self, cx)
    }

    fn is_ready(&self) -> bool {
        LivePool::is_ready(self)
    }

    fn pick_explained(
        &self,
        cx: &RequestContext<'_>,
    ) -> (Result<Inflight, Rejection>, Option<String>) {
        let (picked, explanation) = LivePool::pick_explained(self, cx);
        (picked, Some(explanation.summary(EXPLAIN_CANDIDATES)))
    }
}

/// Candidates listed, best first, in an `x-infergate-explain` answer.
const EXPLAIN_CANDIDATES: usize = 8;

impl InflightGuard for Inflight {
    fn endpoints(&self) -> &[SocketAddr] {
        Inflight::endpoints(self).as_slice()
    }

    fn reassign(&mut self, addr: SocketAddr) {
        Inflight::reassign(self, addr);
    }

    fn first_token(&mut self) {
        Inflight::first_token(self);
    }

    fn complete(self, usage: Usage) {
        Inflight::complete(self, usage);
    }

    fn fail(self) {
        Inflight::fail(self);
    }
}
