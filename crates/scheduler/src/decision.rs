//! What a pick returns: ranked endpoints and a ticket, or a typed rejection.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

/// The most endpoints one pick can return (first choice plus fallbacks).
pub const MAX_RETURNED: usize = 8;

const UNSPECIFIED: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));

/// An ordered list of distinct endpoints: the first choice, then fallbacks in order.
///
/// A fixed-capacity inline array, so returning it allocates nothing. `Display` writes the
/// comma-separated `ip:port` list that the EPP protocol puts in `x-gateway-destination-endpoint`.
#[derive(Copy, Clone, PartialEq, Eq)]
pub struct Ranked {
    addrs: [SocketAddr; MAX_RETURNED],
    len: u8,
}

impl Ranked {
    pub(crate) const fn new() -> Self {
        Ranked {
            addrs: [UNSPECIFIED; MAX_RETURNED],
            len: 0,
        }
    }

    pub(crate) fn push(&mut self, addr: SocketAddr) {
        let i = usize::from(self.len);
        if i < MAX_RETURNED {
            self.addrs[i] = addr;
            self.len += 1;
        }
    }

    /// The endpoints, best first.
    pub fn as_slice(&self) -> &[SocketAddr] {
        &self.addrs[..usize::from(self.len)]
    }

    /// The first choice. A `Ranked` inside a [`Decision`] is never empty.
    pub fn first(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// How many endpoints (1..=k).
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// True when no endpoint is listed (never the case inside a [`Decision`]).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Iterates the endpoints, best first.
    pub fn iter(&self) -> std::slice::Iter<'_, SocketAddr> {
        self.as_slice().iter()
    }
}

impl fmt::Debug for Ranked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl fmt::Display for Ranked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.as_slice().iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

impl<'a> IntoIterator for &'a Ranked {
    type Item = &'a SocketAddr;
    type IntoIter = std::slice::Iter<'a, SocketAddr>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// A handle on the in-flight entry a pick created. Report the request's outcome with it exactly
/// once ([`Scheduler::complete`](crate::Scheduler::complete), `fail` or `cancel`); a second report,
/// or a report for a ticket whose endpoint has left the pool, is ignored.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

/// A successful pick.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// First choice, then fallbacks; distinct; at most the configured `returnedEndpoints`.
    pub endpoints: Ranked,
    /// The in-flight entry, charged to `endpoints.first()`.
    pub ticket: Ticket,
    /// No candidate had fresh metrics: the pick was made fail-open, on in-flight accounting
    /// alone (`staleMetrics.mode: failOpen`).
    pub fail_open: bool,
    /// The pool was sampled (`candidateSample`) and the sample could not take the request, so
    /// the pick was made again over every candidate.
    pub sample_fallback: bool,
}

/// Why a request was not routed. Each rejection maps to one HTTP status and one metric label,
/// here and nowhere else.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// No endpoint is eligible (empty pool, every pod filtered out, or an empty subset hint).
    #[error("no ready endpoint can serve this request")]
    NoEndpoints,
    /// The pool has endpoints (within the subset hint) but none has fresh metrics: every pod is
    /// stale or unreachable. Unlike [`Rejection::NoEndpoints`] this is expected to pass (a pod is
    /// readmitted on its first good scrape), so the client is told when to retry.
    #[error("no endpoint has fresh metrics (every pod is stale or unreachable); retry after {} s", retry_after.as_secs())]
    Unavailable {
        /// When to retry: the scheduler's `retryAfterMinMs` (a recovered pod is readmitted on its
        /// next good scrape, so there is no drain to wait for).
        retry_after: Duration,
    },
    /// The pool is saturated and this request's priority is shed; retry after the estimated drain time.
    #[error("the pool is saturated; retry after {} s", retry_after.as_secs())]
    Shed {
        /// Estimated time until the pool has headroom again, in whole seconds (at least one).
        retry_after: Duration,
    },
}

impl Rejection {
    /// The HTTP status a client should see: 503 for no endpoint or none fresh, 429 for shed.
    pub const fn http_status(&self) -> u16 {
        match self {
            Rejection::NoEndpoints | Rejection::Unavailable { .. } => 503,
            Rejection::Shed { .. } => 429,
        }
    }

    /// A stable, low-cardinality label for metrics.
    pub const fn metric_label(&self) -> &'static str {
        match self {
            Rejection::NoEndpoints => "no_endpoints",
            Rejection::Unavailable { .. } => "no_fresh_endpoints",
            Rejection::Shed { .. } => "shed",
        }
    }

    /// The `Retry-After` value, when the rejection has one.
    pub const fn retry_after(&self) -> Option<Duration> {
        match self {
            Rejection::NoEndpoints => None,
            Rejection::Shed { retry_after } | Rejection::Unavailable { retry_after } => {
                Some(*retry_after)
            }
        }
    }
}

/// Token counts of a completed request, as the model server reported them in `usage`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u32,
    /// `usage.prompt_tokens_details.cached_tokens` (0 when absent).
    pub cached_tokens: u32,
    /// `usage.completion_tokens`.
    pub output_tokens: u32,
}
