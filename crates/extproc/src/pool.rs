//! What the ext_proc server needs from an endpoint pool: the request lifecycle's
//! [`EndpointPool`] / [`InflightGuard`] seam ([`infergate_pool::lifecycle`]).
//!
//! The picker runs on [`infergate_pool::LivePool`] in production; the seam exists so that the
//! conformance harness can also drive the protocol against a scripted pool and assert exact
//! endpoint lists and rejections.

pub use infergate_pool::lifecycle::{EndpointPool, InflightGuard};
