//! Errors of the live pool, and [`ErrorChain`], how the shells log an error with its causes.

use std::net::SocketAddr;

/// Why a pool could not be started or updated.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The scheduler configuration is invalid.
    // Transparent: the scheduler's message already says it is its configuration.
    #[error(transparent)]
    Scheduler(#[from] infergate_scheduler::Error),
    /// The scraper configuration is invalid or the scraper refused a target.
    #[error("metrics scraper")]
    Metrics(#[from] infergate_metrics::Error),
    /// The same address was listed twice.
    #[error("endpoint {addr} is listed twice")]
    DuplicateEndpoint {
        /// The repeated address.
        addr: SocketAddr,
    },
    /// The admin server could not serve.
    #[error("admin server")]
    Io(#[from] std::io::Error),
}

pub use infergate_metrics::ErrorChain;
