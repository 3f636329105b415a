//! The scheduler's error type.

use std::net::SocketAddr;

/// A configuration value that failed validation. `field` is the dotted path of the offending key
/// as it is spelled in YAML/JSON, so the message points straight at the line to fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid scheduler configuration: `{field}` {reason}")]
pub struct ConfigError {
    /// Dotted path of the field, e.g. `weights.queue` or `saturation.kvCache`.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> Self {
        ConfigError {
            field,
            reason: reason.into(),
        }
    }
}

/// A preset name that infergate does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown scheduler preset {0:?}: expected one of infergate, gie-default, round-robin, random, least-request"
)]
pub struct UnknownPresetError(pub String);

/// Everything that can go wrong when the shells talk to the scheduler.
///
/// Routing outcomes that reach a client (no endpoint, request shed) are not errors of this type
/// but [`Rejection`](crate::Rejection)s, which carry their HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration did not validate.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A metrics snapshot or outcome was reported for an address that is not in the pool.
    #[error("endpoint {0} is not in the pool")]
    UnknownEndpoint(SocketAddr),
    /// A metrics snapshot carried a value that cannot be a measurement (NaN or infinite).
    #[error("metrics for endpoint {addr}: `{field}` is not a finite number")]
    InvalidMetric {
        /// The endpoint the snapshot was for.
        addr: SocketAddr,
        /// The snapshot field that was rejected.
        field: &'static str,
    },
}
