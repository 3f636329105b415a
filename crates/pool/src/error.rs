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

/// An error and its causes on one line, `error: cause: root cause`, for a log field.
///
/// The errors of infergate's crates keep a cause out of their own message and return it from
/// `source()` (so that a printed chain, as `anyhow` prints one, says each thing once); a log
/// line of the error's message alone would drop the cause, this one keeps it.
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

impl std::fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
