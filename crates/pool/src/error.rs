//! Errors of the live pool.

use std::net::SocketAddr;

/// Why a pool could not be started or updated.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The scheduler configuration is invalid.
    #[error("invalid scheduler configuration: {0}")]
    Scheduler(#[from] infergate_scheduler::Error),
    /// The scraper configuration is invalid or the scraper refused a target.
    #[error("metrics scraper: {0}")]
    Metrics(#[from] infergate_metrics::Error),
    /// The same address was listed twice.
    #[error("endpoint {addr} is listed twice")]
    DuplicateEndpoint {
        /// The repeated address.
        addr: SocketAddr,
    },
    /// The admin server could not serve.
    #[error("admin server: {0}")]
    Io(#[from] std::io::Error),
}
