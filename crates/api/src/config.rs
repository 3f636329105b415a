//! The `InferenceGatewayConfig` spec: one object describes a whole gateway — the Envoy Gateway
//! listener, the body-based router, TLS, JWT auth, and one endpoint picker per model.
//!
//! Field names follow the public shape of the managed offering this resource answers, so a user
//! moves their YAML by changing `apiVersion`. Defaults live in the schema (`#[serde(default)]`
//! becomes the CRD's `default`) so the API server fills them in and `kubectl get -o yaml` shows
//! the values the operator acts on.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, EnvVar, ResourceRequirements, Toleration};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::status::InferenceGatewayConfigStatus;
use crate::validation;

mod flow;
mod precise;
mod quotas;
mod rewrites;

pub use flow::{
    FlowBandLimits, FlowBands, FlowControlSpec, FlowFairness, FlowHeadroom, FlowOrdering,
    FlowServiceWeights, ObjectivePriority, PriorityBand, TenancySpec,
};
pub use precise::{PrecisePrefixSpec, TokenizerSource};
pub use quotas::{QuotaLimits, QuotaRedis, QuotasSpec, SecretKeyRef};
pub use rewrites::{
    FailurePercentageSpec, MatchKind, MatchValue, ModelMatch, ModelRewriteRule,
    OutlierDetectionSpec, RewriteTarget, StaleMetricsSpec, StaleMode,
};

/// Desired state of an infergate gateway.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "infergate.dev",
    version = "v1alpha1",
    kind = "InferenceGatewayConfig",
    namespaced,
    shortname = "igwc",
    doc = "An infergate gateway: Envoy Gateway, the body-based router and one endpoint picker per model.",
    status = "InferenceGatewayConfigStatus",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = validation::spec_rules)]
pub struct InferenceGatewayConfigSpec {
    /// The body-based router: reads `model` from the request body and sets the header the
    /// HTTPRoutes match on. Required when more than one scheduler is configured.
    #[serde(default)]
    pub bbr: BbrSpec,
    /// The Gateway (Envoy Gateway data plane) that fronts every scheduler.
    #[serde(default)]
    pub gateway: GatewaySpec,
    /// TLS for HTTPS listeners: an existing certificate Secret, or a cert-manager issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// Client authentication at the Gateway. Required unless `allowUnauthenticated` is true:
    /// the models are never exposed without authentication by omission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,
    /// Serve the Gateway's listeners without client authentication (no `auth`): an explicit
    /// choice, for a Gateway reachable only from trusted networks or authenticated in front of
    /// it. A config with neither `auth` nor this set to true is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_unauthenticated: bool,
    /// Logging and metrics of the pods the operator runs.
    #[serde(default)]
    pub observability: ObservabilitySpec,
    /// Settings applied to every pod the operator runs (BBR and endpoint pickers).
    #[serde(default)]
    pub pod_defaults: PodDefaults,
    /// One endpoint picker (and InferencePool, HTTPRoute) per model. Between 1 and 100.
    #[schemars(length(max = 100))]
    pub schedulers: Vec<SchedulerSpec>,
    /// Per-tenant request and token quotas, enforced by every endpoint picker (shared through
    /// Redis when `redis` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<QuotasSpec>,
    /// Flow control at every endpoint picker: requests wait in bounded per-priority queues
    /// while every pod of their pool is saturated (each pool its own queues, with these limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_control: Option<FlowControlSpec>,
    /// How the endpoint pickers find a request's priority (objectives) and which tenants get
    /// their own metric label; used by flow control.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenancy: Option<TenancySpec>,
}

/// The body-based router.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BbrSpec {
    /// Run the body-based router. Must stay `true` with more than one scheduler.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// BBR pods.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 100))]
    pub replicas: i32,
    /// Largest request body the router reads, in bytes; larger bodies are rejected with 413.
    #[serde(default = "default_max_body")]
    #[schemars(range(min = 1024, max = 268435456))]
    pub max_request_body_bytes: i64,
}

impl Default for BbrSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            replicas: default_replicas(),
            max_request_body_bytes: default_max_body(),
        }
    }
}

/// The Gateway that carries client traffic.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// GatewayClass of the rendered Gateway (Envoy Gateway's default class is `eg`).
    #[serde(default = "default_class")]
    #[schemars(length(min = 1, max = 253))]
    pub class_name: String,
    /// Listeners of the Gateway. Defaults to one HTTP listener on port 80. Names, and the
    /// combinations of port, protocol and hostname, are unique (as Gateway API requires).
    #[serde(default = "default_listeners")]
    #[schemars(length(min = 1, max = 16), transform = validation::listeners_rules)]
    pub listeners: Vec<ListenerSpec>,
}

impl Default for GatewaySpec {
    fn default() -> Self {
        Self {
            class_name: default_class(),
            listeners: default_listeners(),
        }
    }
}

/// One Gateway listener.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSpec {
    /// Listener name, unique within the Gateway.
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Port the Gateway listens on.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// `HTTP` or `HTTPS` (HTTPS needs `spec.tls`).
    #[serde(default)]
    pub protocol: ListenerProtocol,
    /// Host name the listener answers for; all hosts when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub hostname: Option<String>,
}

/// Listener protocol.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ListenerProtocol {
    /// Plain HTTP.
    #[default]
    #[serde(rename = "HTTP")]
    Http,
    /// HTTPS, terminated at the Gateway with the certificate from `spec.tls`.
    #[serde(rename = "HTTPS")]
    Https,
}

/// TLS certificate source: exactly one of `certificateSecretRef` and `issuerRef`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = validation::tls_rules)]
pub struct TlsSpec {
    /// An existing `kubernetes.io/tls` Secret in the config's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_secret_ref: Option<SecretRef>,
    /// A cert-manager issuer; the Gateway is annotated so cert-manager issues the certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_ref: Option<IssuerRef>,
}

/// Reference to a Secret in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct SecretRef {
    /// Secret name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Reference to a cert-manager issuer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct IssuerRef {
    /// Issuer name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// `Issuer` (namespaced) or `ClusterIssuer`.
    #[serde(default)]
    pub kind: IssuerKind,
}

/// Kind of cert-manager issuer.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum IssuerKind {
    /// A namespaced `Issuer`.
    #[default]
    Issuer,
    /// A cluster-wide `ClusterIssuer`.
    ClusterIssuer,
}

/// Client authentication.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct AuthSpec {
    /// JSON Web Token validation at the Gateway.
    pub jwt: JwtAuth,
}

/// JWT validation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct JwtAuth {
    /// The token issuer.
    pub provider: JwtProvider,
}

/// A JWT provider: where its keys are and which tokens it accepts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JwtProvider {
    /// Provider name, unique within the policy.
    #[serde(default = "default_provider_name")]
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Expected `iss` claim.
    #[schemars(length(min = 1, max = 253))]
    pub issuer: String,
    /// Where the signing keys are published.
    #[serde(rename = "remoteJWKS")]
    pub remote_jwks: RemoteJwks,
    /// Accepted `aud` values; any audience when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub audiences: Vec<String>,
    /// Claims a token must carry, each with its accepted values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub required_claims: Vec<RequiredClaim>,
    /// The claim naming the request's tenant (nested claims with dots, e.g. `org.team`): the
    /// endpoint pickers' tenant for quotas, fairness and per-tenant rewrites. Envoy writes it
    /// into `x-llm-d-inference-fairness-id` after the token is checked, and a header of that
    /// name sent by the client is removed first. A token without the claim (or with a
    /// list or object there) is the tenant `default`.
    #[serde(default = "default_tenant_claim")]
    #[schemars(length(min = 1, max = 253))]
    pub tenant_claim: String,
}

/// Remote JSON Web Key Set.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct RemoteJwks {
    /// HTTPS URI of the key set (`https://` only: keys fetched in clear text could be replaced
    /// on the way).
    #[schemars(length(min = 1, max = 253), pattern(r"^https://"))]
    pub uri: String,
}

/// A claim a token must carry.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct RequiredClaim {
    /// Claim name (nested claims with dots, e.g. `org.team`).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Accepted values; the token's claim must equal one of them.
    #[schemars(length(min = 1, max = 128))]
    pub values: Vec<String>,
}

/// Logging and metrics.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservabilitySpec {
    /// Log level of the BBR and endpoint-picker pods.
    #[serde(default)]
    pub log_level: LogLevel,
    /// Log line format.
    #[serde(default)]
    pub log_format: LogFormat,
    /// Annotate pods for Prometheus scraping (`prometheus.io/scrape`, port 9090).
    #[serde(default = "default_true")]
    pub metrics: bool,
}

// Written out, not derived: a derived default would turn `metrics` off when `observability`
// is left out, and the CRD would carry that as the object's default.
impl Default for ObservabilitySpec {
    fn default() -> Self {
        Self {
            log_level: LogLevel::default(),
            log_format: LogFormat::default(),
            metrics: default_true(),
        }
    }
}

/// Log level.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// The default.
    #[default]
    Info,
    /// Each routing decision explained.
    Debug,
    /// Everything.
    Trace,
}

/// Log line format.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One JSON object per line.
    #[default]
    Json,
    /// Human-readable text.
    Text,
}

/// Pod settings applied to every pod the operator runs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodDefaults {
    /// Container resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Node selector.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Extra pod labels (the operator's own labels win on a clash).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Extra pod annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Extra container environment variables. Each name is set once per container: a name the
    /// operator sets on every container (`RUST_LOG`, `INFERGATE_LOG_FORMAT`, `POD_NAME`,
    /// `POD_NAMESPACE`) takes the value given here; a name listed twice here takes the later
    /// value. `INFERGATE_QUOTA_REDIS_PASSWORD` stays the one `quotas.redis.passwordSecretRef`
    /// sets, when it is set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
}

/// One model served through one InferencePool and its endpoint picker.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = validation::scheduler_rules)]
pub struct SchedulerSpec {
    /// Scheduler name, unique in the config; children are named `<config>-<name>-…`.
    #[schemars(length(min = 1, max = 40), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Model name clients send in `model`; the HTTPRoute matches it. Unique in the config,
    /// among the model names, LoRA adapters and rewritten names of every scheduler.
    #[schemars(length(min = 1, max = 253))]
    pub model_name: String,
    /// Labels selecting the model-server pods of this pool: 1 to 64, as the InferencePool's
    /// selector takes (an empty selector is refused, it would select every pod).
    #[schemars(extend("minProperties" = 1, "maxProperties" = 64))]
    pub model_selector: BTreeMap<String, String>,
    /// Port the model servers listen on.
    #[serde(default = "default_target_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub target_port: i32,
    /// Protocol the gateway speaks to the model servers.
    #[serde(default)]
    pub app_protocol: AppProtocol,
    /// Model-server engine, which decides the metric names the picker reads.
    #[serde(default)]
    pub engine_type: EngineType,
    /// Named scorer settings; exclusive with `weights`. `infergate` when neither is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<SchedulerPreset>,
    /// Explicit scorer weights; exclusive with `preset`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<Weights>,
    /// Endpoint-picker pods.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 100))]
    pub replicas: i32,
    /// LoRA adapters served on top of `modelName`; requests naming one route to this pool.
    /// Each name is unique in the config, like `modelName`. They need the body-based router
    /// (`bbr.enabled`), which tells the picker the base model. Each routed name (`modelName`,
    /// the adapters, the names `modelRewrites` match) is one HTTPRoute match, and a route rule
    /// holds 64: at most 63 adapters, fewer with rewritten names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 63), inner(length(min = 1, max = 253)))]
    pub lora_adapters: Vec<String>,
    /// Request timeout on the route (Gateway API `timeouts.request`: from the request to the end
    /// of the response), a Gateway API duration; default `300s`. Every HTTPRoute gets one:
    /// without it Envoy applies its default of 15 s, which cuts every streamed answer that takes
    /// longer. `0s` sets no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"))]
    pub route_timeout: Option<String>,
    /// What the gateway does when the picker does not answer.
    #[serde(default)]
    pub failure_mode: FailureMode,
    /// Model rewrites and canary splits within this pool (`InferenceModelRewrite` rules, plus
    /// per-tenant ones). Changing them updates the picker in place, without a restart. A name
    /// they match routes to this pool, so no other scheduler may have it as its model, adapter
    /// or matched name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub model_rewrites: Vec<ModelRewriteRule>,
    /// What the picker does when no pod has fresh metrics, or every fresh one would shed the
    /// request (default: fail-open, 32 per pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_metrics: Option<StaleMetricsSpec>,
    /// Passive outlier detection: a pod whose requests keep failing while its metrics look fine
    /// leaves the candidates for a while (off unless given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetectionSpec>,
    /// Precise prefix routing from the model servers' own KV-cache events (vLLM), with the
    /// model's tokenizer; the approximate prefix index stays as the fallback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precise_prefix: Option<PrecisePrefixSpec>,
}

/// The HTTPRoute's request timeout when `routeTimeout` is left out: five minutes, room for a long
/// generation, where Envoy's own default (15 s, from the request to the end of the response)
/// would cut streamed answers.
pub const DEFAULT_ROUTE_TIMEOUT: &str = "300s";

impl SchedulerSpec {
    /// The names that route to this scheduler's pool besides `modelName`: its LoRA adapters,
    /// then the names its rewrite rules match, each once. The body-based router maps them to
    /// `modelName`, and the HTTPRoute has one match for `modelName` and one for each of them.
    pub fn routed_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.lora_adapters.iter().map(String::as_str).collect();
        for r in &self.model_rewrites {
            for m in &r.matches {
                let n = m.model.value.as_str();
                if n != self.model_name && !names.contains(&n) {
                    names.push(n);
                }
            }
        }
        names
    }

    /// The HTTPRoute's request timeout: `routeTimeout`, else [`DEFAULT_ROUTE_TIMEOUT`].
    pub fn route_timeout(&self) -> &str {
        self.route_timeout
            .as_deref()
            .unwrap_or(DEFAULT_ROUTE_TIMEOUT)
    }

    /// The HTTPRoute's request timeout as a duration; `None` when it sets no deadline (`0s`).
    /// A string the schema's pattern refuses reads as no deadline.
    pub fn route_deadline(&self) -> Option<std::time::Duration> {
        let mut total = std::time::Duration::ZERO;
        let mut rest = self.route_timeout();
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit())?;
            let n: u64 = rest[..digits].parse().ok()?;
            rest = &rest[digits..];
            let (unit, len) = if rest.starts_with("ms") {
                (std::time::Duration::from_millis(n), 2)
            } else if rest.starts_with('s') {
                (std::time::Duration::from_secs(n), 1)
            } else if rest.starts_with('m') {
                (std::time::Duration::from_secs(n * 60), 1)
            } else if rest.starts_with('h') {
                (std::time::Duration::from_secs(n * 3600), 1)
            } else {
                return None;
            };
            total += unit;
            rest = &rest[len..];
        }
        (!total.is_zero()).then_some(total)
    }

    /// The scorer preset the picker runs: the explicit one, else `infergate` unless weights are set.
    pub fn effective_preset(&self) -> Option<SchedulerPreset> {
        match (&self.preset, &self.weights) {
            (Some(p), _) => Some(*p),
            (None, Some(_)) => None,
            (None, None) => Some(SchedulerPreset::Infergate),
        }
    }
}

/// Protocol between the gateway and the model servers.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AppProtocol {
    /// HTTP/1.1.
    #[default]
    #[serde(rename = "http")]
    Http,
    /// HTTP/2 over cleartext.
    #[serde(rename = "kubernetes.io/h2c")]
    H2c,
}

/// Model-server engine.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EngineType {
    /// vLLM.
    #[default]
    Vllm,
    /// SGLang.
    Sglang,
    /// Hugging Face Text Generation Inference.
    Tgi,
}

impl EngineType {
    /// The name used in labels and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
            Self::Tgi => "tgi",
        }
    }
}

/// Named scorer settings the picker knows (the scheduler's presets, same names).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SchedulerPreset {
    /// infergate's default: estimated wait first, with prefix, LoRA, KV-cache and queue scorers.
    Infergate,
    /// The Gateway API Inference Extension default: queue 2, kv-cache 2, prefix 3.
    GieDefault,
    /// Baseline: next endpoint in turn.
    RoundRobin,
    /// Baseline: uniformly random endpoint.
    Random,
    /// Baseline: fewest requests in flight.
    LeastRequest,
}

impl SchedulerPreset {
    /// The name written into the picker's config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Infergate => "infergate",
            Self::GieDefault => "gie-default",
            Self::RoundRobin => "round-robin",
            Self::Random => "random",
            Self::LeastRequest => "least-request",
        }
    }
}

/// Scorer weights; unset weights are 0. Each must be non-negative and one must be positive.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = validation::weights_rules)]
pub struct Weights {
    /// Weight of the waiting-queue scorer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<f64>,
    /// Weight of the KV-cache utilisation scorer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<f64>,
    /// Weight of the prefix-cache affinity scorer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<f64>,
    /// Weight of the LoRA-affinity scorer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_affinity: Option<f64>,
    /// Weight of the running-requests scorer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_requests: Option<f64>,
    /// Weight of the in-flight-tokens scorer (estimated tokens this gateway has in flight on
    /// each pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inflight_tokens: Option<f64>,
    /// Weight of the estimated-wait scorer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_wait: Option<f64>,
}

/// Calls the macro `$m` with every field of [`Weights`] as `field: "camelCaseName"`, in order:
/// the one list [`Weights::entries`] and the weights' CEL rules
/// ([`validation::WEIGHTS_NON_NEGATIVE`], [`validation::WEIGHTS_ONE_POSITIVE`]) are built from,
/// so a weight cannot be in one and missing from the other. `entries` destructures `Weights`
/// with it, so a field missing here does not compile.
macro_rules! with_weight_names {
    ($m:ident) => {
        $m! {
            queue: "queue",
            kv_cache: "kvCache",
            prefix: "prefix",
            lora_affinity: "loraAffinity",
            running_requests: "runningRequests",
            inflight_tokens: "inflightTokens",
            estimated_wait: "estimatedWait",
        }
    };
}
pub(crate) use with_weight_names;

impl Weights {
    /// `(camelCase name, value)` of every weight, unset ones as 0.
    pub fn entries(&self) -> [(&'static str, f64); 7] {
        macro_rules! entries {
            ($($field:ident: $name:literal),* $(,)?) => {{
                let Weights { $($field),* } = self;
                [$(($name, $field.unwrap_or(0.0))),*]
            }};
        }
        with_weight_names!(entries)
    }
}

/// What the gateway does when the endpoint picker does not answer.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum FailureMode {
    /// Reject the request (the upstream default).
    #[default]
    FailClose,
    /// Route to any pod of the pool.
    FailOpen,
}

fn default_true() -> bool {
    true
}
fn default_replicas() -> i32 {
    1
}
fn default_max_body() -> i64 {
    4 * 1024 * 1024
}
fn default_class() -> String {
    "eg".to_owned()
}
fn default_listeners() -> Vec<ListenerSpec> {
    vec![ListenerSpec {
        name: "http".to_owned(),
        port: 80,
        protocol: ListenerProtocol::Http,
        hostname: None,
    }]
}
fn default_provider_name() -> String {
    "default".to_owned()
}
fn default_tenant_claim() -> String {
    "sub".to_owned()
}
fn default_target_port() -> i32 {
    8000
}
