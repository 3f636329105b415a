//! The gateway's configuration file: models, their endpoints, scheduler presets and limits.
//!
//! The file is YAML (JSON is YAML too). Every section but `auth` and `models` is optional. Field
//! names are camelCase and durations are integer milliseconds (`...Ms`), as in the scheduler's
//! own configuration, which each model embeds unchanged under `scheduler:`.
//!
//! ```yaml
//! listen: 127.0.0.1:8080        # front door (HTTP/1.1 and h2c)
//! auth:                         # required: `none`, or `jwt` and/or `apiKeys` (see [`auth`])
//!   apiKeys: { file: /etc/infergate/keys.yaml }
//! admin: 127.0.0.1:9090         # /metrics, /healthz, /readyz
//! limits: { maxRequestBodyBytes: 4194304, maxConcurrentRequests: 256 }   # the latter per model
//! timeouts: { connectMs: 2000, firstByteMs: 300000, idleMs: 60000, poolIdleMs: 4000 }
//! retries: { maxAttempts: 3 }
//! models:
//!   - name: llama-3-8b
//!     engine: vllm
//!     loraAdapters: [sql-lora]
//!     scheduler: { preset: infergate }
//!     limits: { maxConcurrentRequests: 64 }   # overrides the default above for this model
//!     endpoints: [127.0.0.1:8001, { address: 127.0.0.1:8002, name: pod-b, gpu: a10g }]
//! rewrites:                     # canary splits and aliases (`InferenceModelRewrite` rules)
//!   - matches: [{ model: { type: Exact, value: llama } }]
//!     targets: [{ modelRewrite: llama-3-8b, weight: 90 }, { modelRewrite: sql-lora, weight: 10 }]
//! quotas:                      # per-tenant limits (see `infergate_pool::quota::spec`); with
//!   default: { requestsPerMinute: 60 }   # `auth: none` the only tenant is `anonymous`
//!   tenants: { team-a: { requestsPerMinute: 600, tokensPerMinute: 1000000 } }
//!   redis: { address: 127.0.0.1:6379, syncIntervalMs: 100 }   # shared across replicas
//! flowControl:                 # queue requests while every pod is saturated (off by default)
//!   enabled: true
//!   requestTtlMs: 60000
//!   fairness: least-attained-service   # or global-strict (default), round-robin
//!   bands: { sheddable: { maxRequests: 1000 } }
//! tenancy:                     # flow control's tenant and priority
//!   tenantHeader: x-tenant     # without auth: flow control's tenant (quotas see `anonymous`)
//!   objectives: { chat: critical, batch: -10 }
//! accessLog: { path: stdout }  # a JSON line per request: stdout, stderr or a file (off by default)
//! ```
//!
//! Validation happens while the file is read, so every error names the field's path *and* its
//! line: `models[1].endpoints[0]: invalid socket address syntax at line 9 column 7`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use infergate_openai::ModelRouter;
use infergate_pool::quota::QuotasSpec;
use infergate_pool::tenant::{Tenancy, TenancyConfig};
use infergate_scheduler::flow::FlowConfig;
use infergate_scheduler::{EngineType, RewriteRule, Rewrites, SchedulerConfig};
use serde::Deserialize;

pub use crate::access_log::AccessLogPath;
use crate::error::{ConfigError, DuplicateKey};

pub mod auth;
pub use auth::AuthConfig;
pub mod tls;
pub use tls::{ListenerTls, UpstreamTls};

mod limits;

pub use limits::{
    DEFAULT_BODY_READ_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_BUFFERED_REQUEST_BYTES, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_REQUESTS_IN_FLIGHT, Http2Limits, Limits, MAX_DURATION, MAX_HEADER_BYTES,
    MIN_HEADER_BYTES, header_bytes_problem,
};

/// The whole gateway configuration.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", try_from = "RawGateway")]
pub struct GatewayConfig {
    /// Front-door address (`infergate gateway --listen` overrides it). Default `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// Admin address for `/metrics`, `/healthz`, `/readyz`. Default `127.0.0.1:9090`.
    pub admin: SocketAddr,
    /// Request limits.
    pub limits: Limits,
    /// Upstream timeouts.
    pub timeouts: Timeouts,
    /// Retry policy.
    pub retries: Retries,
    /// How model-server metrics are scraped.
    pub scrape: Scrape,
    /// How often the file is checked for changes; 0 turns reloading off.
    pub reload_interval: Duration,
    /// Seed of the schedulers' random tie-breaks (each model derives its own from it).
    pub seed: u64,
    /// Whether a request carrying `x-infergate-explain: 1` gets its routing decision back in the
    /// `x-infergate-explain` response header. Off by default: the explanation names pods,
    /// addresses and scores, which a public endpoint should not hand to every client.
    pub explain_header: bool,
    /// Who may call the gateway (required; `auth: none` turns authentication off).
    pub auth: AuthConfig,
    /// HTTPS on the front door (`tls: { certFile, keyFile, clientCaFile }`, the last for mutual
    /// TLS); `None` serves plain HTTP.
    pub tls: Option<ListenerTls>,
    /// HTTPS on the admin port (`adminTls: { certFile, keyFile, clientCaFile }`, the same
    /// fields as `tls`): `/heartbeat`, `/metrics` and the probes over TLS, for a global router
    /// or a scraper across a network; `None` serves plain HTTP.
    pub admin_tls: Option<ListenerTls>,
    /// The served models, each with its endpoints and scheduler.
    pub models: Vec<ModelConfig>,
    /// Model rewrites and canary splits (the Gateway API Inference Extension's
    /// `InferenceModelRewrite` rules; see `infergate_scheduler::canary`). Every target must be a
    /// served model or LoRA adapter; responses keep the name the client asked for.
    pub rewrites: Vec<RewriteRule>,
    /// Per-tenant request and token quotas, optionally shared through Redis
    /// (`infergate_pool::quota`); `None`: no quotas.
    pub quotas: Option<QuotasSpec>,
    /// Flow control: bounded per-priority queues while every pod of a model is saturated
    /// (`infergate_pool::flow`); off unless `enabled: true`.
    pub flow_control: FlowConfig,
    /// How a request's tenant and priority are found (`infergate_pool::tenant`).
    pub tenancy: TenancyConfig,
    /// The access log, a JSON line per request; `None`: none is written.
    pub access_log: Option<AccessLogConfig>,
}

/// `accessLog:`: where the gateway writes a JSON line per request.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    try_from = "RawAccessLog"
)]
pub struct AccessLogConfig {
    /// `stdout`, `stderr` or a file (appended to, created if missing).
    pub path: AccessLogPath,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawAccessLog {
    path: String,
}

impl TryFrom<RawAccessLog> for AccessLogConfig {
    type Error = String;

    fn try_from(r: RawAccessLog) -> Result<Self, String> {
        Ok(AccessLogConfig {
            path: AccessLogPath::parse(&r.path)?,
        })
    }
}

/// How long a client turned away by a model's `maxConcurrentRequests` is told to wait
/// (`Retry-After`, whole seconds).
pub const CONCURRENCY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// One model's limits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelLimits {
    /// Requests to this model (its LoRA adapters included) that may run at once, from routing
    /// to the last response byte. One more is answered `429` with `Retry-After` (see
    /// [`CONCURRENCY_RETRY_AFTER`]) without reaching a model server. `None` falls back to the
    /// top-level `limits.maxConcurrentRequests`.
    pub max_concurrent_requests: Option<u32>,
}

/// Upstream timeouts, in milliseconds in the file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, from = "RawTimeouts")]
pub struct Timeouts {
    /// Establishing a TCP connection to a model server. A timeout counts as a connect failure
    /// (retried on the next endpoint).
    pub connect: Duration,
    /// From sending the request to the response headers (prefill plus queueing). Not retried: the
    /// server may still be working on it.
    pub first_byte: Duration,
    /// Longest gap between two body chunks of a response; the stream is cut after it.
    pub idle: Duration,
    /// How long an unused keep-alive upstream connection is kept. Default
    /// [`DEFAULT_POOL_IDLE`]; it should stay below the model servers' own keep-alive timeout.
    pub pool_idle: Duration,
}

/// Default `timeouts.poolIdleMs`: 4 s, below the 5 s after which uvicorn — the server of vLLM's
/// (`VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, 5 by default) and SGLang's OpenAI APIs — closes an idle
/// keep-alive connection. The gateway retires a connection before the server's timer can fire,
/// so a request never goes out on one the server is closing (the keep-alive race, see
/// `crate::upstream::RACE_IDLE`); the 1 s margin covers the server's timer starting as it sends
/// the answer's last byte, a little before the gateway has read it. A quieter endpoint pays a new
/// connection per request, which is what the server's own timeout costs it anyway.
pub const DEFAULT_POOL_IDLE: Duration = Duration::from_secs(4);

impl Default for Timeouts {
    fn default() -> Self {
        RawTimeouts::default().into()
    }
}

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct RawTimeouts {
    connect_ms: u64,
    first_byte_ms: u64,
    idle_ms: u64,
    pool_idle_ms: u64,
}

impl Default for RawTimeouts {
    fn default() -> Self {
        RawTimeouts {
            connect_ms: 2_000,
            first_byte_ms: 300_000,
            idle_ms: 60_000,
            pool_idle_ms: u64::try_from(DEFAULT_POOL_IDLE.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

impl From<RawTimeouts> for Timeouts {
    fn from(r: RawTimeouts) -> Self {
        Timeouts {
            // Clamped: a deadline computed from an absurd value must not overflow the clock.
            connect: limits::clamped_millis(r.connect_ms.max(1)),
            first_byte: limits::clamped_millis(r.first_byte_ms.max(1)),
            idle: limits::clamped_millis(r.idle_ms.max(1)),
            pool_idle: limits::clamped_millis(r.pool_idle_ms),
        }
    }
}

/// Retry policy: attempts on the picker's fallback endpoints.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Retries {
    /// Endpoints tried per request, the first included (1 = no other endpoint). Retries happen
    /// only before any response byte reached the client — on a connect failure, a connection
    /// closed before the response headers, or a 5xx answer — and each goes to another endpoint:
    /// the pick's ranked list, then the model's other endpoints not known to be down, so there
    /// are never more attempts than endpoints. A keep-alive race's second send to the same
    /// endpoint (see docs/gateway.md, Retries) is not counted here.
    pub max_attempts: u8,
}

impl Default for Retries {
    fn default() -> Self {
        Retries { max_attempts: 3 }
    }
}

/// Metrics scraping settings (see `infergate_metrics::ScraperConfig`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, from = "RawScrape")]
pub struct Scrape {
    /// Time between two scrapes of one endpoint.
    pub interval: Duration,
    /// An endpoint whose last good page is older is stale.
    pub stale_after: Duration,
    /// Limit on one scrape before it is connected (and before a connected one counts as late).
    pub timeout: Duration,
    /// Limit on one connected scrape: until then a slow page makes the endpoint late (routed on
    /// its last page), not failed.
    pub max_late: Duration,
}

impl Default for Scrape {
    fn default() -> Self {
        RawScrape::default().into()
    }
}

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct RawScrape {
    interval_ms: u64,
    stale_after_ms: u64,
    timeout_ms: u64,
    max_late_ms: u64,
}

impl Default for RawScrape {
    fn default() -> Self {
        RawScrape {
            interval_ms: 50,
            stale_after_ms: 250,
            timeout_ms: 250,
            max_late_ms: 20_000,
        }
    }
}

impl From<RawScrape> for Scrape {
    fn from(r: RawScrape) -> Self {
        Scrape {
            interval: limits::clamped_millis(r.interval_ms),
            stale_after: limits::clamped_millis(r.stale_after_ms),
            timeout: limits::clamped_millis(r.timeout_ms),
            max_late: limits::clamped_millis(r.max_late_ms),
        }
    }
}

impl Scrape {
    /// The scraper configuration these settings stand for.
    pub fn to_scraper_config(&self) -> infergate_metrics::ScraperConfig {
        infergate_metrics::ScraperConfig {
            interval: self.interval,
            stale_after: self.stale_after,
            timeout: self.timeout,
            max_late: self.max_late,
            ..infergate_metrics::ScraperConfig::default()
        }
    }
}

/// One served model.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", try_from = "RawModel")]
pub struct ModelConfig {
    /// The served model name clients put in `model`.
    pub name: String,
    /// The engine of its endpoints (decides the metric names scraped). Default `vllm`.
    pub engine: EngineType,
    /// LoRA adapter names served by the same endpoints; requests naming one route here.
    pub lora_adapters: Vec<String>,
    /// The scheduler: a preset (`infergate`, `gie-default`, `round-robin`, `random`,
    /// `least-request`) plus any overrides, exactly as the scheduler crate reads it.
    pub scheduler: SchedulerConfig,
    /// The model servers.
    pub endpoints: Vec<EndpointConfig>,
    /// This model's limits.
    pub limits: ModelLimits,
    /// HTTPS to this model's servers (requests and metrics scrapes); `None` is plain HTTP.
    pub tls: Option<UpstreamTls>,
    /// Precise prefix routing (`precisePrefix`): the model's tokenizer and its servers'
    /// KV-cache events. A change on reload starts the model's pool afresh.
    pub precise_prefix: Option<infergate_pool::precise::PreciseConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawModel {
    name: String,
    #[serde(default)]
    engine: Option<EngineType>,
    #[serde(default)]
    lora_adapters: Vec<String>,
    #[serde(default)]
    scheduler: SchedulerConfig,
    #[serde(default)]
    endpoints: Vec<EndpointConfig>,
    #[serde(default)]
    pod_selector: Option<BTreeMap<String, String>>,
    #[serde(default)]
    limits: ModelLimits,
    #[serde(default)]
    tls: Option<UpstreamTls>,
    #[serde(default)]
    precise_prefix: Option<infergate_pool::precise::PreciseConfig>,
}

impl TryFrom<RawModel> for ModelConfig {
    type Error = String;

    fn try_from(r: RawModel) -> Result<Self, String> {
        if r.name.trim().is_empty() {
            return Err("`name` must not be empty".into());
        }
        if r.pod_selector.is_some() {
            return Err(format!(
                "model `{}`: `podSelector` needs in-cluster discovery; the standalone gateway \
                 reads `endpoints` (in Kubernetes, run `infergate picker` behind Envoy Gateway)",
                r.name
            ));
        }
        if let Err(e) = r.scheduler.validate() {
            return Err(format!("model `{}`: scheduler: {e}", r.name));
        }
        if r.limits.max_concurrent_requests == Some(0) {
            return Err(format!(
                "model `{}`: `limits.maxConcurrentRequests` must be at least 1 (leave it out for \
                 no limit)",
                r.name
            ));
        }
        if let Some(Err(e)) = r.precise_prefix.as_ref().map(|p| p.validate()) {
            return Err(format!("model `{}`: {e}", r.name));
        }
        let mut seen = std::collections::HashSet::new();
        for ep in &r.endpoints {
            if let Err(reason) = infergate_pool::precise::check_port_labels(&ep.labels) {
                return Err(format!(
                    "model `{}`: endpoint {}: {reason}",
                    r.name, ep.address
                ));
            }
            if !seen.insert(ep.address) {
                return Err(format!(
                    "model `{}`: endpoint {} is listed twice",
                    r.name, ep.address
                ));
            }
        }
        Ok(ModelConfig {
            name: r.name,
            engine: r.engine.unwrap_or(EngineType::Vllm),
            lora_adapters: r.lora_adapters,
            scheduler: r.scheduler,
            endpoints: r.endpoints,
            limits: r.limits,
            tls: r.tls,
            precise_prefix: r.precise_prefix,
        })
    }
}

/// One model server: an address, or an address with a name and labels.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "RawEndpoint")]
pub struct EndpointConfig {
    /// Where the server listens (`ip:port`).
    pub address: SocketAddr,
    /// A name for logs, explanations and metrics (default: the address).
    pub name: Option<String>,
    /// The GPU type, informational.
    pub gpu: Option<String>,
    /// This endpoint's engine, when it differs from the model's.
    pub engine: Option<EngineType>,
    /// Free-form labels.
    pub labels: BTreeMap<String, String>,
}

/// An endpoint as written: a plain address or a map. Written by hand rather than as an untagged
/// enum so that a bad value is reported at its own line, with the real reason.
enum RawEndpoint {
    Addr(SocketAddr),
    Full(FullEndpoint),
}

impl<'de> Deserialize<'de> for RawEndpoint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawEndpoint;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an `ip:port` address or {address, name, gpu, engine, labels}")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawEndpoint, E> {
                v.parse().map(RawEndpoint::Addr).map_err(|_| {
                    E::custom(format_args!(
                        "`{v}` is not an `ip:port` address (host names are not resolved)"
                    ))
                })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                a: A,
            ) -> Result<RawEndpoint, A::Error> {
                FullEndpoint::deserialize(serde::de::value::MapAccessDeserializer::new(a))
                    .map(RawEndpoint::Full)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FullEndpoint {
    address: SocketAddr,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    gpu: Option<String>,
    #[serde(default)]
    engine: Option<EngineType>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

impl From<RawEndpoint> for EndpointConfig {
    fn from(r: RawEndpoint) -> Self {
        match r {
            RawEndpoint::Addr(address) => EndpointConfig {
                address,
                name: None,
                gpu: None,
                engine: None,
                labels: BTreeMap::new(),
            },
            RawEndpoint::Full(f) => EndpointConfig {
                address: f.address,
                name: f.name,
                gpu: f.gpu,
                engine: f.engine,
                labels: f.labels,
            },
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawGateway {
    #[serde(
        default = "default_listen",
        deserialize_with = "infergate_pool::address::deserialize"
    )]
    listen: SocketAddr,
    #[serde(
        default = "default_admin",
        deserialize_with = "infergate_pool::address::deserialize"
    )]
    admin: SocketAddr,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    timeouts: Timeouts,
    #[serde(default)]
    retries: Retries,
    #[serde(default)]
    scrape: Scrape,
    #[serde(default = "default_reload_ms")]
    reload_interval_ms: u64,
    #[serde(default)]
    seed: u64,
    #[serde(default)]
    explain_header: bool,
    #[serde(default)]
    auth: Option<AuthConfig>,
    #[serde(default)]
    tls: Option<ListenerTls>,
    #[serde(default)]
    admin_tls: Option<ListenerTls>,
    models: Vec<ModelConfig>,
    #[serde(default)]
    rewrites: Vec<RewriteRule>,
    #[serde(default)]
    quotas: Option<QuotasSpec>,
    #[serde(default)]
    flow_control: FlowConfig,
    #[serde(default)]
    tenancy: TenancyConfig,
    #[serde(default)]
    access_log: Option<AccessLogConfig>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}

fn default_admin() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9090))
}

fn default_reload_ms() -> u64 {
    1_000
}

impl TryFrom<RawGateway> for GatewayConfig {
    type Error = String;

    fn try_from(r: RawGateway) -> Result<Self, String> {
        let auth = r.auth.ok_or(auth::MISSING_AUTH)?;
        check_listen_and_admin(r.listen, r.admin)?;
        if r.models.is_empty() {
            return Err("`models` must list at least one model".into());
        }
        r.limits.validate()?;
        if r.retries.max_attempts == 0 {
            return Err("`retries.maxAttempts` must be at least 1".into());
        }
        if let Err(e) = r.scrape.to_scraper_config().validate() {
            return Err(format!("`scrape`: {e}"));
        }
        // The same table the request path uses, so a name clash is caught here, not per request.
        let mut router = ModelRouter::new();
        for m in &r.models {
            router
                .add_model(&m.name, &m.lora_adapters, ())
                .map_err(|e| format!("`models`: {e}"))?;
        }
        Rewrites::new(&r.rewrites).map_err(|e| format!("`rewrites`: {e}"))?;
        for (i, rule) in r.rewrites.iter().enumerate() {
            for t in &rule.targets {
                if router.resolve(&t.model_rewrite).is_err() {
                    return Err(format!(
                        "`rewrites[{i}]`: target `{}` is not a served model or LoRA adapter",
                        t.model_rewrite
                    ));
                }
            }
        }
        if let Some(q) = &r.quotas {
            q.to_config()?;
        }
        r.flow_control.validate().map_err(|e| e.to_string())?;
        check_queue_fits_in_flight(&r.flow_control, &r.limits)?;
        Tenancy::new(&r.tenancy).map_err(|e| e.to_string())?;
        if !auth.is_enabled() {
            check_anonymous_tenants(r.quotas.as_ref(), &r.rewrites)?;
        }
        Ok(GatewayConfig {
            listen: r.listen,
            admin: r.admin,
            limits: r.limits,
            timeouts: r.timeouts,
            retries: r.retries,
            scrape: r.scrape,
            reload_interval: limits::clamped_millis(r.reload_interval_ms),
            seed: r.seed,
            explain_header: r.explain_header,
            auth,
            tls: r.tls,
            admin_tls: r.admin_tls,
            models: r.models,
            rewrites: r.rewrites,
            quotas: r.quotas,
            flow_control: r.flow_control,
            tenancy: r.tenancy,
            access_log: r.access_log,
        })
    }
}

/// Refuses a flow-control queue as large as `limits.maxRequestsInFlight`: queued requests hold
/// an in-flight slot, so such a queue never fills — the gateway answers 503 `gateway_busy`
/// before a request reaches it, and the rules for a full queue never apply.
fn check_queue_fits_in_flight(flow: &FlowConfig, limits: &Limits) -> Result<(), String> {
    let queued = usize::try_from(flow.max_requests).unwrap_or(usize::MAX);
    if flow.enabled && queued >= limits.max_requests_in_flight {
        return Err(format!(
            "`flowControl.maxRequests` ({queued}) must be below `limits.maxRequestsInFlight` ({}): \
             queued requests hold an in-flight slot too, so the gateway would refuse requests \
             (503 gateway_busy) before the queue filled, and a full queue's rules (429 with \
             Retry-After for Sheddable requests) would never apply; lower `flowControl.maxRequests` or raise \
             `limits.maxRequestsInFlight`, leaving room for the requests running",
            limits.max_requests_in_flight
        ));
    }
    Ok(())
}

/// What a tenant named in `quotas:` or `rewrites:` means under `auth: none`, for the errors.
const ANONYMOUS_TENANTS: &str = "with `auth: none` every request is the tenant `anonymous` for \
     quotas and rewrites (`tenancy.tenantHeader` names the tenant for flow-control fairness only, \
     since a client chooses it)";

/// Under `auth: none`, refuses a quota or rewrite rule for a tenant other than `anonymous`: no
/// request would ever be that tenant. A client-chosen header must not pick its own quota bucket
/// or rewrite, so `tenancy.tenantHeader` does not name the tenant there.
fn check_anonymous_tenants(
    quotas: Option<&QuotasSpec>,
    rewrites: &[RewriteRule],
) -> Result<(), String> {
    let anonymous = crate::auth::ANONYMOUS_TENANT;
    if let Some(t) = quotas.and_then(|q| q.tenants.keys().find(|t| *t != anonymous)) {
        return Err(format!(
            "`quotas.tenants.{t}`: {ANONYMOUS_TENANTS}, so a quota for `{t}` never applies: \
             configure `auth.jwt` or `auth.apiKeys` for per-tenant quotas, or set the limit under \
             `quotas.default` or `quotas.tenants.anonymous`"
        ));
    }
    for (i, rule) in rewrites.iter().enumerate() {
        if let Some(t) = rule.tenants.iter().find(|t| *t != anonymous) {
            return Err(format!(
                "`rewrites[{i}].tenants`: {ANONYMOUS_TENANTS}, so a rule for `{t}` never \
                 applies: configure `auth.jwt` or `auth.apiKeys` for per-tenant rewrites, or \
                 leave `tenants` out for every request"
            ));
        }
    }
    Ok(())
}

/// Refuses a `listen` and an `admin` that could not both be bound: the same port (other than
/// 0, for which the system picks a free port each time) on the same IP, or with either IP
/// unspecified (`0.0.0.0`, `[::]`), which takes the port on every address of the host. Shared
/// by the gateway's and the global router's configurations.
pub fn check_listen_and_admin(listen: SocketAddr, admin: SocketAddr) -> Result<(), String> {
    let port = listen.port();
    if port == 0 || port != admin.port() {
        return Ok(());
    }
    if listen.ip() == admin.ip() || listen.ip().is_unspecified() || admin.ip().is_unspecified() {
        return Err(format!(
            "`listen` ({listen}) and `admin` ({admin}) both take port {port}: the front door \
             and the admin port each need a port of their own"
        ));
    }
    Ok(())
}

impl GatewayConfig {
    /// Overrides `listen` and `admin` (the command line's `--listen` / `--admin`), refusing a
    /// pair the gateway could not both bind, as the file's own pair is refused.
    pub fn set_addresses(
        &mut self,
        listen: Option<SocketAddr>,
        admin: Option<SocketAddr>,
    ) -> Result<(), ConfigError> {
        let listen = listen.unwrap_or(self.listen);
        let admin = admin.unwrap_or(self.admin);
        check_listen_and_admin(listen, admin).map_err(ConfigError::Addresses)?;
        self.listen = listen;
        self.admin = admin;
        Ok(())
    }

    /// The concurrency limit in force for `model`: its own, or the top-level default.
    pub fn max_concurrent_requests(&self, model: &ModelConfig) -> Option<u32> {
        model
            .limits
            .max_concurrent_requests
            .or(self.limits.max_concurrent_requests)
    }

    /// Parses and validates a configuration. Errors name the field's path and its line.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        // serde_yaml's messages already carry the field path and the line, except for a
        // top-level key given twice.
        serde_yaml::from_str(text).map_err(|source| match duplicate_top_level_key(source, text) {
            Ok(duplicate) => ConfigError::DuplicateKey(duplicate),
            Err(source) => ConfigError::Invalid { source },
        })
    }

    /// Reads and validates a configuration file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml(&text)
    }
}

/// For serde_yaml's `duplicate field` error of the top-level mapping (which names the mapping's
/// start, or nothing when it starts the file, rather than the key), the key and the line (from 1)
/// of its second occurrence at the start of a line.
/// The parser's error back for any other error, or a file that does not have the key twice at
/// the start of a line (a flow mapping, JSON on one line). The global router's configuration
/// uses it too.
pub fn duplicate_top_level_key(
    source: serde_yaml::Error,
    text: &str,
) -> Result<DuplicateKey, serde_yaml::Error> {
    match duplicate_line(&source, text) {
        Some((key, line)) => Ok(DuplicateKey { key, line, source }),
        None => Err(source),
    }
}

/// The key serde_yaml's positionless `duplicate field` error names, and the line of its second
/// occurrence at the start of a line.
fn duplicate_line(e: &serde_yaml::Error, text: &str) -> Option<(String, usize)> {
    let message = e.to_string();
    // The top-level mapping's error has no position when the mapping starts the file, and the
    // mapping's start (column 1) when a comment, a blank line or `---` comes first; a nested
    // mapping starts further right, and its error keeps the parser's own position.
    let body = match message.rsplit_once(" at line ") {
        Some((head, at)) => {
            let line = at.strip_suffix(" column 1")?;
            line.parse::<usize>().ok()?;
            head
        }
        None => message.as_str(),
    };
    let key = body.strip_prefix("duplicate field `")?.strip_suffix('`')?;
    let line = text
        .lines()
        .enumerate()
        .filter(|(_, l)| {
            [key, &format!("\"{key}\""), &format!("'{key}'")]
                .iter()
                .any(|k| {
                    l.strip_prefix(k)
                        .is_some_and(|rest| rest.trim_start().starts_with(':'))
                })
        })
        .nth(1)?
        .0;
    Some((key.to_owned(), line + 1))
}

#[cfg(test)]
mod tests;
