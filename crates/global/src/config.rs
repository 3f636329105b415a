//! The global router's configuration file (`infergate global --config global.yaml`).
//!
//! ```yaml
//! listen: 0.0.0.0:8080
//! admin: 127.0.0.1:9091          # no authentication: keep it private
//! auth: none                     # required, as for the gateway (`none`, or jwt / apiKeys)
//! limits: { maxRequestBodyBytes: 4194304, maxRequestsInFlight: 4096 }   # the gateway's `limits:`
//! tls: { certFile: cert.pem, keyFile: key.pem }                         # optional HTTPS front door
//! heartbeat: { intervalMs: 1000, timeoutMs: 1000, staleAfterMs: 3000, failuresToDrain: 2,
//!              slowStartMs: 30000, discoveryIntervalMs: 10000 }
//! routing:
//!   policy: costAware            # or `latency`: the fastest estimate, cost ignored
//!   ttftObjectiveMs: 2000        # default objective; per request: header below; per tenant:
//!   objectiveHeader: x-infergate-ttft-objective-ms
//!   tenantObjectives: { team-a: 500 }
//!   regionPreference: [us-east, eu-west]
//! retries: { maxAttempts: 3 }    # clusters tried per request, before the first byte
//! timeouts: { connectMs: 2000, firstByteMs: 60000 }
//! outlierDetection:              # clusters whose requests keep failing while their heartbeat is good
//!   consecutiveGatewayFailures: 5   # 502/503/504 or no response headers, in a row: ejected
//!   baseEjectionMs: 30000        # × the times ejected in a row,
//!   maxEjectionMs: 300000        # at most this
//!   maxEjectionPercent: 50       # of a model's clusters at once (0: never eject)
//!   failurePercentage: { threshold: 50, minimumRequests: 20, intervalMs: 10000 }   # optional
//! reloadIntervalMs: 1000         # the file is checked for changes this often (0: never)
//! tenancy: { tenantHeader: x-tenant }   # without auth: the tenant named by this header
//! quotas:                        # global rate limits per tenant (the gateway's `quotas:`)
//!   tenants: { team-a: { requestsPerMinute: 600, tokensPerMinute: 1000000 } }
//!   redis: { address: 10.0.0.9:6379 }   # shared by every router replica
//! accessLog: { path: stdout }   # a JSON line per request: stdout | stderr | a file (the gateway's)
//! clusters:
//!   - name: east-1
//!     url: http://10.0.0.1:8080                # the cluster's OpenAI-compatible front door
//!     heartbeatUrl: http://10.0.0.1:9090/heartbeat   # an infergate gateway's or picker's admin port
//!     region: us-east
//!     cost: { inputPerMillion: 0.10, outputPerMillion: 0.40 }     # or { gpuHour: 2.5, tokensPerSecond: 4000 }
//!     credentials: { bearerTokenFile: /etc/infergate/east-1.token }
//!   - name: eu-1
//!     url: https://gateway.eu-1.example.com         # HTTPS: verified against the system roots,
//!     region: eu-west                                # or only tls.caFile when given
//!     cost: { inputPerMillion: 0.10, outputPerMillion: 0.40 }
//!     tls: { caFile: /etc/infergate/eu-1-ca.pem, serverName: gateway.eu-1.internal,
//!            certFile: /etc/infergate/router.crt, keyFile: /etc/infergate/router.key }  # mTLS
//! ```
//!
//! Every field but `auth` and `clusters` has a default. Validation names the field at fault.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Uri;
use infergate_pool::quota::QuotasSpec;
use infergate_pool::tenant::{DEFAULT_TENANT, Tenancy, TenancyConfig};
use infergate_proxy::config::{
    AccessLogConfig, AuthConfig, Limits, ListenerTls, MAX_DURATION, header_bytes_problem,
};
use serde::Deserialize;

use crate::error::{ConfigError, OutlierError, OutlierField};

/// The default header a request names its TTFT objective in, in milliseconds.
pub const DEFAULT_OBJECTIVE_HEADER: &str = "x-infergate-ttft-objective-ms";

/// The whole file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GlobalConfig {
    /// The front door's address.
    #[serde(
        default = "default_listen",
        deserialize_with = "infergate_pool::address::deserialize"
    )]
    pub listen: SocketAddr,
    /// The admin port (`/metrics`, `/healthz`, `/readyz`; no authentication), default
    /// `127.0.0.1:9091`.
    #[serde(
        default = "default_admin",
        deserialize_with = "infergate_pool::address::deserialize"
    )]
    pub admin: SocketAddr,
    /// Who may call (required: `auth: none` turns authentication off).
    pub auth: AuthConfig,
    /// The gateway's request limits; the global router enforces `maxRequestBodyBytes`,
    /// `maxConnections`, `maxRequestsInFlight`, `maxBufferedRequestBytes`, `maxHeaderBytes`,
    /// `headerReadTimeoutMs`, `bodyReadTimeoutMs` and `http2.maxConcurrentStreams` (the others
    /// are accepted, unused).
    #[serde(default)]
    pub limits: Limits,
    /// HTTPS on the front door.
    #[serde(default)]
    pub tls: Option<ListenerTls>,
    /// Heartbeat polling, draining and slow start.
    #[serde(default)]
    pub heartbeat: HeartbeatConfig,
    /// How a cluster is chosen.
    #[serde(default)]
    pub routing: RoutingConfig,
    /// Retries across clusters.
    #[serde(default)]
    pub retries: Retries,
    /// Upstream timeouts.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Passive outlier detection: clusters whose routed requests keep failing are ejected.
    #[serde(default)]
    pub outlier_detection: OutlierDetection,
    /// Seed of the slow-start sampling.
    #[serde(default)]
    pub seed: u64,
    /// How often the file, and the clusters' token files, CA bundles and client certificates, are
    /// checked for changes, ms (default 1,000, the gateway's); 0 turns reloading the file off
    /// (the clusters' files are then checked every second).
    #[serde(default = "default_reload_ms")]
    pub reload_interval_ms: u64,
    /// Global per-tenant rate limits, shared across router replicas through Redis
    /// (`infergate_pool::quota`, the gateway's `quotas:` section); `None`: no limits.
    #[serde(default)]
    pub quotas: Option<QuotasSpec>,
    /// How a request's tenant is found (the gateway's `tenancy:` section): authentication's
    /// tenant, else `tenantHeader`, else `default`.
    #[serde(default)]
    pub tenancy: TenancyConfig,
    /// The access log, a JSON line per request (the gateway's `accessLog:`); `None`: none is
    /// written.
    #[serde(default)]
    pub access_log: Option<AccessLogConfig>,
    /// The clusters behind the router.
    pub clusters: Vec<ClusterConfig>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 8080))
}

fn default_reload_ms() -> u64 {
    1_000
}

/// Loopback: the admin port has no authentication (the Helm chart sets `0.0.0.0` behind a
/// ClusterIP Service of its own).
fn default_admin() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9091))
}

/// `heartbeat:`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HeartbeatConfig {
    /// How often each cluster's heartbeat is fetched, ms (default 1,000).
    pub interval_ms: u64,
    /// How long one fetch may take, ms (default 1,000).
    pub timeout_ms: u64,
    /// A cluster with no good heartbeat for this long is drained, ms (default 3,000).
    pub stale_after_ms: u64,
    /// Consecutive failed fetches (or connect failures of routed requests) that drain a cluster
    /// at once, before it is stale (default 2).
    pub failures_to_drain: u32,
    /// A returning cluster's share ramps from nothing to full over this window, ms (default
    /// 30,000; 0 returns it at full share at once).
    pub slow_start_ms: u64,
    /// How often each cluster's `/v1/models` is read, ms (default 10,000).
    pub discovery_interval_ms: u64,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        HeartbeatConfig {
            interval_ms: 1_000,
            timeout_ms: 1_000,
            stale_after_ms: 3_000,
            failures_to_drain: 2,
            slow_start_ms: 30_000,
            discovery_interval_ms: 10_000,
        }
    }
}

impl HeartbeatConfig {
    /// `intervalMs`.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }
    /// `timeoutMs`.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
    /// `staleAfterMs`.
    pub fn stale_after(&self) -> Duration {
        Duration::from_millis(self.stale_after_ms)
    }
    /// `slowStartMs`.
    pub fn slow_start(&self) -> Duration {
        Duration::from_millis(self.slow_start_ms)
    }
    /// `discoveryIntervalMs`.
    pub fn discovery_interval(&self) -> Duration {
        Duration::from_millis(self.discovery_interval_ms)
    }
}

/// Which clusters come first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Policy {
    /// The cheapest cluster whose estimated TTFT meets the objective; the fastest when none does.
    #[default]
    CostAware,
    /// The fastest estimated TTFT, cost ignored (the baseline the cost report compares with).
    Latency,
}

/// `routing:`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RoutingConfig {
    /// The policy.
    pub policy: Policy,
    /// The default TTFT objective, ms (default 2,000).
    pub ttft_objective_ms: u64,
    /// The request header that sets a request's objective, ms.
    pub objective_header: String,
    /// Objectives per tenant, ms (over the default; a request's header is over both).
    pub tenant_objectives: BTreeMap<String, u64>,
    /// Regions in order of preference (a cluster of an unlisted region comes after them all).
    pub region_preference: Vec<String>,
    /// Output tokens assumed for a request without `max_tokens` when comparing costs.
    pub default_output_tokens: u32,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        RoutingConfig {
            policy: Policy::CostAware,
            ttft_objective_ms: 2_000,
            objective_header: DEFAULT_OBJECTIVE_HEADER.to_owned(),
            tenant_objectives: BTreeMap::new(),
            region_preference: Vec::new(),
            default_output_tokens: 256,
        }
    }
}

/// `retries:`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Retries {
    /// Clusters tried per request at most (the first included), default 3.
    pub max_attempts: u8,
}

impl Default for Retries {
    fn default() -> Self {
        Retries { max_attempts: 3 }
    }
}

/// `timeouts:`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Timeouts {
    /// TCP connect to a cluster, ms (default 2,000), and then, for `https://`, the TLS
    /// handshake, each within it; a timeout moves on to the next cluster.
    pub connect_ms: u64,
    /// Until a cluster's response headers, ms (default 60,000); not retried (the cluster may be
    /// working on it): 504.
    pub first_byte_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect_ms: 2_000,
            first_byte_ms: 60_000,
        }
    }
}

/// `outlierDetection:` — what the router's own requests say against a cluster, for the failures
/// its heartbeat cannot see (a gateway answering 503 to every request while its admin port
/// serves a good heartbeat).
///
/// A cluster whose routed requests fail `consecutiveGatewayFailures` times in a row (502, 503 or
/// 504, or no response headers: a broken connection, `timeouts.firstByteMs`) is ejected: ordered
/// after the clusters routed on, as a drained one is, for `baseEjectionMs` × the times it was
/// ejected in a row, at most `maxEjectionMs`; then it is readmitted through the slow-start ramp.
/// At most `maxEjectionPercent` of the clusters serving a model are ejected at once. With
/// `failurePercentage`, a cluster whose failures come mixed with successes (half its requests,
/// never enough in a row) is ejected too, by its share of failures over an interval.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct OutlierDetection {
    /// Failures in a row that eject a cluster (default 5, at least 1).
    pub consecutive_gateway_failures: u32,
    /// The first ejection's length, ms (default 30,000); the n-th in a row lasts n times as long.
    pub base_ejection_ms: u64,
    /// The longest ejection, ms (default 300,000; at least `baseEjectionMs`).
    pub max_ejection_ms: u64,
    /// The most of a model's clusters ejected at once, percent (default 50, at most 100; 0
    /// ejects none).
    pub max_ejection_percent: u32,
    /// Ejection by the share of failures over an interval (off unless given).
    pub failure_percentage: Option<FailurePercentage>,
}

impl Default for OutlierDetection {
    fn default() -> Self {
        OutlierDetection {
            consecutive_gateway_failures: 5,
            base_ejection_ms: 30_000,
            max_ejection_ms: 300_000,
            max_ejection_percent: 50,
            failure_percentage: None,
        }
    }
}

/// `outlierDetection.failurePercentage:` — a cluster is ejected when, over an interval of
/// `intervalMs` with at least `minimumRequests` requests routed on it, `threshold` percent or
/// more failed at the gateway (502, 503, 504, no response headers; counted as for
/// `consecutiveGatewayFailures`). The ejection's length and the cap are those of the
/// consecutive failures. The same section as a scheduler's, for pods.
pub use infergate_scheduler::outlier::FailurePercentage;

impl OutlierDetection {
    /// `baseEjectionMs`.
    pub fn base_ejection(&self) -> Duration {
        Duration::from_millis(self.base_ejection_ms)
    }
    /// `maxEjectionMs`.
    pub fn max_ejection(&self) -> Duration {
        Duration::from_millis(self.max_ejection_ms)
    }

    /// Refuses values that cannot be used, naming the field.
    pub fn validate(&self) -> Result<(), OutlierError> {
        let max_ms = u64::try_from(MAX_DURATION.as_millis()).unwrap_or(u64::MAX);
        if self.consecutive_gateway_failures == 0 {
            return Err(OutlierError::NoFailures);
        }
        for (field, v) in [
            (OutlierField::BaseEjectionMs, self.base_ejection_ms),
            (OutlierField::MaxEjectionMs, self.max_ejection_ms),
        ] {
            if v == 0 {
                return Err(OutlierError::ZeroDuration(field));
            }
            if v > max_ms {
                return Err(OutlierError::OverAWeek(field));
            }
        }
        if self.max_ejection_ms < self.base_ejection_ms {
            return Err(OutlierError::MaxBelowBase {
                max_ms: self.max_ejection_ms,
                base_ms: self.base_ejection_ms,
            });
        }
        if self.max_ejection_percent > 100 {
            return Err(OutlierError::PercentOver100(self.max_ejection_percent));
        }
        if let Some(f) = &self.failure_percentage {
            if f.threshold == 0 || f.threshold > 100 {
                return Err(OutlierError::ThresholdOutOfRange(f.threshold));
            }
            if f.minimum_requests == 0 {
                return Err(OutlierError::NoMinimumRequests);
            }
            if f.interval_ms == 0 {
                return Err(OutlierError::ZeroDuration(OutlierField::IntervalMs));
            }
            if f.interval_ms > max_ms {
                return Err(OutlierError::OverAWeek(OutlierField::IntervalMs));
            }
        }
        Ok(())
    }
}

/// One cluster.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterConfig {
    /// A name for metrics and logs (unique).
    pub name: String,
    /// The cluster's OpenAI-compatible base URL, `http://host:port` or `https://host[:port]`
    /// (443 by default; a path prefix is kept).
    pub url: String,
    /// Its infergate heartbeat (`http://admin-host:port/heartbeat`, or `https://`). Without one,
    /// the cluster is up while its `/v1/models` answers, and no TTFT estimate comes from it.
    #[serde(default)]
    pub heartbeat_url: Option<String>,
    /// Its region.
    pub region: String,
    /// What its tokens cost.
    pub cost: Cost,
    /// Credentials sent to it.
    #[serde(default)]
    pub credentials: Option<Credentials>,
    /// Models it serves, instead of discovering them from `/v1/models`.
    #[serde(default)]
    pub models: Option<Vec<String>>,
    /// How its `https://` URLs are verified (default: the system roots and the URL's host).
    #[serde(default)]
    pub tls: Option<ClusterTls>,
}

/// A cluster's `tls:` — the names and meaning of the gateway's `models[].tls`: with `caFile` the
/// cluster's certificate must chain to it (and only to it: the system roots are not used), with
/// `serverName` it must carry that name instead of the URL's host. With `certFile` and
/// `keyFile` the router presents that client certificate (mutual TLS: a gateway with
/// `tls.clientCaFile`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterTls {
    /// PEM CA bundle the cluster's certificates must chain to, instead of the system roots
    /// (re-read on change).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The name the cluster's certificates must carry (DNS name or IP address), when the URL's
    /// host is an IP address or another name.
    #[serde(default)]
    pub server_name: Option<String>,
    /// PEM certificate chain (leaf first) the router presents when the cluster asks for a
    /// client certificate, with `keyFile` (re-read on change).
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `certFile`'s leaf (re-read on change).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

/// A cluster's price: per million input and output tokens, or per GPU-hour at a throughput.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Cost {
    /// Price of a million prompt tokens.
    #[serde(default)]
    pub input_per_million: Option<f64>,
    /// Price of a million generated tokens.
    #[serde(default)]
    pub output_per_million: Option<f64>,
    /// Price of one GPU-hour (with `tokensPerSecond`: every token costs the same).
    #[serde(default)]
    pub gpu_hour: Option<f64>,
    /// Tokens (prompt and generated) one GPU serves per second, for `gpuHour`.
    #[serde(default)]
    pub tokens_per_second: Option<f64>,
}

impl Cost {
    /// Price of one input token and one output token.
    pub fn per_token(&self) -> (f64, f64) {
        match (self.gpu_hour, self.tokens_per_second) {
            (Some(h), Some(tps)) if tps > 0.0 => {
                let t = h / (tps * 3600.0);
                (t, t)
            }
            _ => (
                self.input_per_million.unwrap_or(0.0) / 1e6,
                self.output_per_million.unwrap_or(0.0) / 1e6,
            ),
        }
    }
}

/// `credentials:`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Credentials {
    /// A file holding the bearer token sent as `Authorization: Bearer ...` (re-read on change).
    pub bearer_token_file: PathBuf,
}

impl GlobalConfig {
    /// Parses and validates a configuration.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let config: GlobalConfig = match serde_yaml::from_str(text) {
            Ok(config) => config,
            // serde_yaml names no line for a top-level key given twice: the gateway's loader
            // finds it.
            Err(source) => {
                return Err(
                    match infergate_proxy::config::duplicate_top_level_key(source, text) {
                        Ok(duplicate) => ConfigError::DuplicateKey(duplicate),
                        Err(source) => {
                            missing_section(text, &source).unwrap_or(ConfigError::Parse { source })
                        }
                    },
                );
            }
        };
        config.validate()?;
        Ok(config)
    }

    /// Overrides `listen` and `admin` (the command line's `--listen` and `--admin`), refusing
    /// a pair the router could not both bind, as the file's own pair is refused.
    pub fn set_addresses(
        &mut self,
        listen: Option<SocketAddr>,
        admin: Option<SocketAddr>,
    ) -> Result<(), ConfigError> {
        let listen = listen.unwrap_or(self.listen);
        let admin = admin.unwrap_or(self.admin);
        check_listen_and_admin(listen, admin)?;
        self.listen = listen;
        self.admin = admin;
        Ok(())
    }

    /// Reads, parses and validates a configuration file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field: String, reason: &str| ConfigError::Invalid {
            field,
            reason: reason.to_owned(),
        };
        check_listen_and_admin(self.listen, self.admin)?;
        if let Some(q) = &self.quotas {
            q.to_config()
                .map_err(|reason| ConfigError::Quotas { reason })?;
        }
        Tenancy::new(&self.tenancy)?;
        if self.clusters.len() > crate::route::MAX_CLUSTERS {
            return Err(invalid("clusters".into(), "at most 64 clusters"));
        }
        if self.clusters.is_empty() {
            return Err(invalid("clusters".into(), "at least one cluster is needed"));
        }
        let hb = &self.heartbeat;
        let l = &self.limits;
        // Zero would serve nothing (or spin); past a week a timer's deadline could overflow.
        let max_ms = u64::try_from(MAX_DURATION.as_millis()).unwrap_or(u64::MAX);
        for (name, v) in [
            ("heartbeat.intervalMs", hb.interval_ms),
            ("heartbeat.timeoutMs", hb.timeout_ms),
            ("heartbeat.staleAfterMs", hb.stale_after_ms),
            ("heartbeat.discoveryIntervalMs", hb.discovery_interval_ms),
            ("timeouts.connectMs", self.timeouts.connect_ms),
            ("timeouts.firstByteMs", self.timeouts.first_byte_ms),
            ("routing.ttftObjectiveMs", self.routing.ttft_objective_ms),
            ("limits.headerReadTimeoutMs", l.header_read_timeout_ms),
            ("limits.bodyReadTimeoutMs", l.body_read_timeout_ms),
        ] {
            if v == 0 {
                return Err(invalid(name.into(), "must be above zero"));
            }
            if v > max_ms {
                return Err(invalid(name.into(), "must be at most 604800000 (a week)"));
            }
        }
        for (name, v) in [
            ("heartbeat.slowStartMs", hb.slow_start_ms),
            ("reloadIntervalMs", self.reload_interval_ms),
        ] {
            if v > max_ms {
                return Err(invalid(name.into(), "must be at most 604800000 (a week)"));
            }
        }
        // The gateway's limits the router enforces: zero would refuse every request.
        for (name, zero) in [
            ("limits.maxRequestBodyBytes", l.max_request_body_bytes == 0),
            ("limits.maxConnections", l.max_connections == 0),
            ("limits.maxRequestsInFlight", l.max_requests_in_flight == 0),
            (
                "limits.maxBufferedRequestBytes",
                l.max_buffered_request_bytes == 0,
            ),
            (
                "limits.http2.maxConcurrentStreams",
                l.http2.max_concurrent_streams == 0,
            ),
        ] {
            if zero {
                return Err(invalid(name.into(), "must be above zero"));
            }
        }
        // The gateway's own rule: a head limit outside what can be enforced is refused, not
        // clamped without a word.
        if let Some(problem) = header_bytes_problem(l.max_header_bytes) {
            return Err(invalid("limits.maxHeaderBytes".into(), &problem));
        }
        if hb.stale_after_ms < hb.interval_ms {
            return Err(invalid(
                "heartbeat.staleAfterMs".into(),
                "must be at least heartbeat.intervalMs",
            ));
        }
        if hb.failures_to_drain == 0 {
            return Err(invalid(
                "heartbeat.failuresToDrain".into(),
                "must be at least 1",
            ));
        }
        self.outlier_detection.validate()?;
        if self.retries.max_attempts == 0 {
            return Err(invalid("retries.maxAttempts".into(), "must be at least 1"));
        }
        for (tenant, ms) in &self.routing.tenant_objectives {
            let field = || format!("routing.tenantObjectives.{tenant}");
            if *ms == 0 {
                return Err(invalid(field(), "must be above zero"));
            }
            if *ms > max_ms {
                return Err(invalid(field(), "must be at most 604800000 (a week)"));
            }
        }
        if http::HeaderName::from_bytes(self.routing.objective_header.as_bytes()).is_err() {
            return Err(invalid(
                "routing.objectiveHeader".into(),
                "is not a valid header name",
            ));
        }
        for (i, c) in self.clusters.iter().enumerate() {
            let at = |f: &str| format!("clusters[{i}].{f}");
            if c.name.is_empty() {
                return Err(invalid(at("name"), "must not be empty"));
            }
            // The name is a label value on /metrics (written there as it is) and the value of
            // the `x-infergate-cluster` response header.
            if c.name.len() > MAX_NAME_LEN
                || !c
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            {
                return Err(invalid(
                    at("name"),
                    "use at most 63 letters, digits, `-`, `_` and `.`",
                ));
            }
            if self.clusters[..i].iter().any(|o| o.name == c.name) {
                return Err(invalid(at("name"), "is used by another cluster"));
            }
            let url = parse_url(&c.url).map_err(|reason| invalid(at("url"), reason))?;
            // OpenAI clients' base URLs end in /v1; here the request's own path, which starts
            // with /v1, follows the URL (the answer would be a 404 for /v1/v1/...).
            if url.path().trim_end_matches('/').ends_with("/v1") {
                return Err(invalid(
                    at("url"),
                    "ends in /v1, which every request's path (/v1/chat/completions, /v1/models, …) \
                     already starts with: leave /v1 out (http://host:port)",
                ));
            }
            let heartbeat = match &c.heartbeat_url {
                Some(h) => {
                    Some(parse_url(h).map_err(|reason| invalid(at("heartbeatUrl"), reason))?)
                }
                None => None,
            };
            if let Some(tls) = &c.tls {
                let https = |u: &Uri| u.scheme() == Some(&http::uri::Scheme::HTTPS);
                if !https(&url) && !heartbeat.as_ref().is_some_and(https) {
                    return Err(invalid(
                        at("tls"),
                        "applies to https:// URLs, and url (and heartbeatUrl) are http://: use \
                         https:// or leave tls out",
                    ));
                }
                match (&tls.cert_file, &tls.key_file) {
                    (Some(_), None) => {
                        return Err(invalid(
                            at("tls.keyFile"),
                            "is missing: certFile needs the key of its certificate",
                        ));
                    }
                    (None, Some(_)) => {
                        return Err(invalid(
                            at("tls.certFile"),
                            "is missing: keyFile needs the certificate it is the key of",
                        ));
                    }
                    (None, None) if tls.ca_file.is_none() && tls.server_name.is_none() => {
                        return Err(invalid(
                            at("tls"),
                            "give caFile, serverName and/or certFile with keyFile",
                        ));
                    }
                    _ => {}
                }
                if let Some(name) = &tls.server_name
                    && rustls_pki_types::ServerName::try_from(name.as_str()).is_err()
                {
                    return Err(invalid(
                        at("tls.serverName"),
                        "is neither a DNS name nor an IP address",
                    ));
                }
            }
            if let Some(models) = &c.models {
                if models.is_empty() {
                    return Err(invalid(
                        at("models"),
                        "lists no model: name the models it serves, or leave `models` out to read them from its /v1/models",
                    ));
                }
                if let Some(j) = models.iter().position(String::is_empty) {
                    return Err(invalid(at(&format!("models[{j}]")), "must not be empty"));
                }
            }
            let cost = &c.cost;
            let per_token = cost.input_per_million.is_some() || cost.output_per_million.is_some();
            let per_hour = cost.gpu_hour.is_some() || cost.tokens_per_second.is_some();
            if per_token == per_hour {
                return Err(invalid(
                    at("cost"),
                    "give inputPerMillion and outputPerMillion, or gpuHour and tokensPerSecond",
                ));
            }
            if per_hour
                && !(cost.tokens_per_second.is_some_and(|t| t > 0.0) && cost.gpu_hour.is_some())
            {
                return Err(invalid(
                    at("cost"),
                    "gpuHour needs tokensPerSecond above zero",
                ));
            }
            let (i_, o_) = cost.per_token();
            if !(i_.is_finite() && o_.is_finite() && i_ >= 0.0 && o_ >= 0.0) {
                return Err(invalid(
                    at("cost"),
                    "prices must be finite and not negative",
                ));
            }
        }
        // Without authentication and without a tenant header every request is one tenant:
        // a quota or an objective for another never applies (that tenant would be unlimited).
        if matches!(self.auth, AuthConfig::None) && self.tenancy.tenant_header.is_none() {
            let quota_tenants = self.quotas.iter().flat_map(|q| q.tenants.keys());
            let named = quota_tenants
                .map(|t| ("quotas.tenants", t))
                .chain(
                    self.routing
                        .tenant_objectives
                        .keys()
                        .map(|t| ("routing.tenantObjectives", t)),
                )
                .find(|(_, t)| t.as_str() != DEFAULT_TENANT);
            if let Some((section, tenant)) = named {
                return Err(invalid(
                    format!("{section}.{tenant}"),
                    &format!(
                        "with `auth: none` and no `tenancy.tenantHeader` every request is the \
                         tenant `{DEFAULT_TENANT}`, so `{tenant}` never applies: configure \
                         `auth.jwt` or `auth.apiKeys`, or `tenancy.tenantHeader` (a header a \
                         trusted proxy in front sets), or use `{DEFAULT_TENANT}`"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A cluster URL: `http://host[:port][/prefix]` or `https://…` (ports 80 and 443 by default).
pub(crate) fn parse_url(url: &str) -> Result<Uri, &'static str> {
    let uri: Uri = url.parse().map_err(|_| "is not a URL")?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err("must start with http:// or https://"),
    }
    if uri.authority().is_none() {
        return Err("has no host");
    }
    if uri.query().is_some() {
        return Err("must not have a query (`?...`): a request's own path and query follow it");
    }
    Ok(uri)
}

/// The port `uri` (a [`parse_url`] URL) is reached on: its own, else its scheme's.
pub(crate) fn port_of(uri: &Uri) -> u16 {
    uri.port_u16()
        .unwrap_or(if uri.scheme() == Some(&http::uri::Scheme::HTTPS) {
            443
        } else {
            80
        })
}

/// Whether `uri`'s host is this machine (`localhost`, 127.0.0.0/8, `::1`): what is sent to it
/// does not cross a network.
pub(crate) fn is_loopback(uri: &Uri) -> bool {
    let host = uri.host().unwrap_or_default();
    let ip = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || ip
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The longest cluster name.
const MAX_NAME_LEN: usize = 63;

/// Refuses a `listen` and an `admin` the router could not both bind, as the gateway does.
fn check_listen_and_admin(listen: SocketAddr, admin: SocketAddr) -> Result<(), ConfigError> {
    infergate_proxy::config::check_listen_and_admin(listen, admin).map_err(|reason| {
        ConfigError::Invalid {
            field: "admin".into(),
            reason,
        }
    })
}

/// The two required sections, said plainly rather than as the parser's ``missing field `auth` ``,
/// when that is the parser's complaint: a section misspelt (`cluster:`) is an unknown field, which
/// the parser meets first and names with the fields it expected.
fn missing_section(text: &str, parsed: &serde_yaml::Error) -> Option<ConfigError> {
    let serde_yaml::Value::Mapping(top) = serde_yaml::from_str(text).ok()? else {
        return None;
    };
    let (field, reason) = if !top.contains_key("auth") {
        (
            "auth",
            "is required: configure `auth.jwt` and/or `auth.apiKeys`, or write `auth: none` to \
             run without authentication",
        )
    } else if !top.contains_key("clusters") {
        ("clusters", "is required: at least one cluster is needed")
    } else {
        return None;
    };
    // The parser's message for a missing field of the top level, and nothing else.
    let missing = format!("missing field `{field}`");
    parsed
        .to_string()
        .starts_with(&missing)
        .then(|| ConfigError::Invalid {
            field: field.into(),
            reason: reason.into(),
        })
}

#[cfg(test)]
mod tests;
