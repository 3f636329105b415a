//! What the ext_proc server needs from an endpoint pool.
//!
//! The picker runs on [`infergate_pool::LivePool`] in production (see `pool/live.rs`); the small
//! [`EndpointPool`] / [`InflightGuard`] seam exists so that the conformance harness can also drive
//! the protocol against a scripted pool and assert exact endpoint lists and rejections.

use std::net::SocketAddr;

use infergate_scheduler::{Rejection, RequestContext, Usage};

mod live;

/// A pool of endpoints that can route one request.
pub trait EndpointPool: Clone + Send + Sync + 'static {
    /// The in-flight guard a pick returns.
    type Inflight: InflightGuard;

    /// Chooses endpoints for a request, or says why not.
    fn pick(&self, cx: &RequestContext<'_>) -> Result<Self::Inflight, Rejection>;

    /// Whether the pool can route (discovery synced, at least one endpoint with fresh metrics).
    fn is_ready(&self) -> bool;

    /// As [`EndpointPool::pick`], with the decision explained on one line of printable ASCII
    /// (`None` when the pool keeps no decision record).
    fn pick_explained(
        &self,
        cx: &RequestContext<'_>,
    ) -> (Result<Self::Inflight, Rejection>, Option<String>) {
        (self.pick(cx), None)
    }
}

/// The in-flight entry of one routed request. Dropping it without [`InflightGuard::complete`] or
/// [`InflightGuard::fail`] must cancel the entry, so a reset stream never leaks accounting.
pub trait InflightGuard: Send + 'static {
    /// First choice, then fallbacks; never empty.
    fn endpoints(&self) -> &[SocketAddr];
    /// The proxy fell back to `addr`: move the entry there.
    fn reassign(&mut self, addr: SocketAddr);
    /// The first generated token passed by.
    fn first_token(&mut self);
    /// The response ended normally with this usage.
    fn complete(self, usage: Usage);
    /// The response failed (5xx from the model server).
    fn fail(self);
}
