//! The router's access log (`accessLog:`): its record of a request, written by the gateway's
//! writer (`infergate_proxy::access_log`: the bounded queue, the writer thread, the path and
//! its check, the line counters), which this module only feeds.
//!
//! A [`Record`] is built when a request arrives, only while the log is on; the request path
//! fills it (tenant, model, the clusters tried, the status or the router's error) and hands it
//! over when the request is over: at once when the router answered itself, else when the
//! passed-through body is dropped (`crate::body`), which adds the first token, the usage and
//! its cost.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Method, Uri};
use infergate_openai::Usage;
use infergate_proxy::access_log::{AccessLog, Arrival, Measured};
use serde::{Serialize, Serializer};
use tokio::time::Instant;

use crate::cluster::Cluster;

/// The router's access log.
pub(crate) type Log = AccessLog<Record>;

/// How a request ended, as the router's log says it (the gateway's names, `router` for its
/// `gateway`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// A cluster's 2xx answer, read to its end.
    Completed,
    /// A cluster's 5xx (the last one tried), or an answer that broke off.
    Failed,
    /// A cluster's other answer passed on (a 4xx about the request, a last 429).
    Refused,
    /// The router answered itself: an error, or `/v1/models`.
    Router,
    /// The client left before the answer ended, or its request body broke off.
    Cancelled,
}

/// What the log learns of one request as it goes. Built only when the log is on.
pub(crate) struct Record {
    log: Arc<Log>,
    /// With the request's id: the client's `x-request-id`, or the one the router made up (the
    /// clusters see the same).
    arrival: Arrival,
    started: Instant,
    pub(crate) tenant: Option<Arc<str>>,
    pub(crate) model: Option<Box<str>>,
    pub(crate) stream: bool,
    /// The last cluster tried.
    pub(crate) cluster: Option<Arc<Cluster>>,
    pub(crate) clusters_tried: u8,
    /// The time to first token the router estimated for the last cluster tried, ms (its round
    /// trip included), when it chose the order: beside `ttft_ms`, how good the estimate was.
    pub(crate) estimated_ttft_ms: Option<f64>,
    pub(crate) status: Option<u16>,
    pub(crate) error: Option<&'static str>,
    pub(crate) outcome: Outcome,
    pub(crate) ttft: Option<Duration>,
    pub(crate) usage: Option<Usage>,
    /// The usage at the cluster's price, as `infergate_global_cost_total` counts it.
    pub(crate) cost: Option<f64>,
    took: Duration,
}

impl Record {
    /// A record for a request just arrived.
    pub(crate) fn new(
        log: &Arc<Log>,
        client: SocketAddr,
        method: &Method,
        uri: &Uri,
        request_id: Option<&HeaderValue>,
    ) -> Box<Record> {
        Box::new(Record {
            log: Arc::clone(log),
            arrival: Arrival::now(client, method, uri, request_id),
            started: Instant::now(),
            tenant: None,
            model: None,
            stream: false,
            cluster: None,
            clusters_tried: 0,
            estimated_ttft_ms: None,
            status: None,
            error: None,
            outcome: Outcome::Router,
            ttft: None,
            usage: None,
            cost: None,
            took: Duration::ZERO,
        })
    }

    /// The first token came now.
    pub(crate) fn first_token(&mut self) {
        self.ttft = Some(self.started.elapsed());
    }

    /// The request is over: the line goes to the log.
    pub(crate) fn done(mut self: Box<Self>) {
        self.took = self.started.elapsed();
        let log = Arc::clone(&self.log);
        log.send(self);
    }
}

impl Serialize for Record {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let cluster = self.cluster.as_deref().map(|c| &c.config);
        Line {
            arrival: &self.arrival,
            status: self.status,
            outcome: self.outcome,
            error: self.error,
            tenant: self.tenant.as_deref(),
            model: self.model.as_deref(),
            stream: self.stream,
            cluster: cluster.map(|c| c.name.as_str()),
            region: cluster.map(|c| c.region.as_str()),
            clusters_tried: self.clusters_tried,
            // Rounded to the microsecond, as `ttft_ms` is.
            estimated_ttft_ms: self
                .estimated_ttft_ms
                .filter(|v| v.is_finite())
                .map(|v| (v * 1e3).round() / 1e3),
            measured: Measured::new(self.ttft, self.took, self.usage),
            cost: self.cost,
        }
        .serialize(s)
    }
}

/// One line of the router's log, as written.
#[derive(Serialize)]
struct Line<'a> {
    #[serde(flatten)]
    arrival: &'a Arrival,
    status: Option<u16>,
    outcome: Outcome,
    error: Option<&'static str>,
    tenant: Option<&'a str>,
    model: Option<&'a str>,
    stream: bool,
    cluster: Option<&'a str>,
    region: Option<&'a str>,
    clusters_tried: u8,
    estimated_ttft_ms: Option<f64>,
    #[serde(flatten)]
    measured: Measured,
    cost: Option<f64>,
}
