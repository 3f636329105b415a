//! Envoy Gateway policies, `gateway.envoyproxy.io/v1alpha1`: `EnvoyExtensionPolicy` (an ext_proc
//! filter on a Gateway or route), `SecurityPolicy` (JWT authentication and claim checks) and
//! `ClientTrafficPolicy` (here: the request headers removed before any filter runs).

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// Attaches ext_proc servers to a Gateway or an HTTPRoute.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gateway.envoyproxy.io",
    version = "v1alpha1",
    kind = "EnvoyExtensionPolicy",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyExtensionPolicySpec {
    /// What the policy attaches to.
    pub target_refs: Vec<TargetRef>,
    /// The ext_proc servers, called in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ext_proc: Vec<ExtProc>,
}

/// A Gateway API object a policy attaches to (same namespace).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// `gateway.networking.k8s.io`.
    pub group: String,
    /// `Gateway` or `HTTPRoute`.
    pub kind: String,
    /// Object name.
    pub name: String,
}

impl TargetRef {
    /// A reference to a Gateway API object of `kind` named `name`.
    pub fn gateway_api(kind: &str, name: &str) -> Self {
        Self {
            group: "gateway.networking.k8s.io".to_owned(),
            kind: kind.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// One ext_proc server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExtProc {
    /// The gRPC server.
    pub backend_refs: Vec<BackendRef>,
    /// Which parts of the request and response are sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processing_mode: Option<ProcessingMode>,
    /// Per-message timeout, e.g. `5s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_timeout: Option<String>,
    /// Let requests through when the server fails (must be false with full-duplex bodies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_open: Option<bool>,
    /// Settings of the cluster Envoy Gateway builds for the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_settings: Option<ClusterSettings>,
}

/// Settings of an upstream cluster (Envoy Gateway's `ClusterSettings`), reduced to the circuit
/// breaker.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSettings {
    /// Limits on the cluster's connections and requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreaker>,
}

/// A cluster's circuit breaker. Envoy Gateway's CRD defaults every field left out of a present
/// circuit breaker to 1024, Envoy's own default, so all three are set together.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreaker {
    /// Connections to the cluster at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// Requests (on HTTP/2, streams) to the cluster at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel_requests: Option<u32>,
    /// Requests waiting for a connection at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_requests: Option<u32>,
}

/// A Service backend.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    /// Core group (`""`) for a Service.
    pub group: String,
    /// `Service`.
    pub kind: String,
    /// Service name.
    pub name: String,
    /// Service port.
    pub port: i32,
}

impl BackendRef {
    /// A Service port in the policy's namespace.
    pub fn service(name: &str, port: i32) -> Self {
        Self {
            group: String::new(),
            kind: "Service".to_owned(),
            name: name.to_owned(),
            port,
        }
    }
}

/// ext_proc processing mode.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessingMode {
    /// Request side; headers are sent whenever this is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<ProcessingModeDirection>,
    /// Response side; headers are sent whenever this is present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<ProcessingModeDirection>,
}

/// Body mode of one direction.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessingModeDirection {
    /// `Streamed`, `Buffered`, `BufferedPartial` or `FullDuplexStreamed`; headers only when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

/// Authentication and authorisation at a Gateway or route.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gateway.envoyproxy.io",
    version = "v1alpha1",
    kind = "SecurityPolicy",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct SecurityPolicySpec {
    /// What the policy attaches to.
    pub target_refs: Vec<TargetRef>,
    /// JWT authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<Jwt>,
    /// Claim-based authorisation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization: Option<Authorization>,
}

/// JWT authentication.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Jwt {
    /// Accepted providers; a token valid for any one passes.
    pub providers: Vec<SecurityJwtProvider>,
}

/// One JWT provider.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SecurityJwtProvider {
    /// Provider name.
    pub name: String,
    /// Expected issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// Accepted audiences.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    /// Remote key set.
    #[serde(rename = "remoteJWKS")]
    pub remote_jwks: RemoteJwksRef,
    /// Claims of a valid token copied into request headers, for the filters after the JWT
    /// check (the endpoint picker reads its tenant from one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claim_to_headers: Vec<ClaimToHeader>,
}

/// One claim copied into a request header.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ClaimToHeader {
    /// The header written.
    pub header: String,
    /// The claim (nested claims with dots, e.g. `org.team`).
    pub claim: String,
}

/// Remote key set.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RemoteJwksRef {
    /// URI of the key set.
    pub uri: String,
}

/// Authorisation rules.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Authorization {
    /// `Allow` or `Deny` when no rule matches.
    pub default_action: String,
    /// Rules, first match wins.
    pub rules: Vec<AuthorizationRule>,
}

/// One authorisation rule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct AuthorizationRule {
    /// Rule name.
    pub name: String,
    /// `Allow` or `Deny`.
    pub action: String,
    /// Who the rule matches.
    pub principal: Principal,
}

/// Principal of a rule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// JWT claims the request's token must carry.
    pub jwt: JwtPrincipal,
}

/// JWT claim match.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct JwtPrincipal {
    /// The provider that validated the token.
    pub provider: String,
    /// Claims, all of which must match.
    pub claims: Vec<ClaimMatch>,
}

/// One claim and its accepted values.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ClaimMatch {
    /// Claim name.
    pub name: String,
    /// Accepted values.
    pub values: Vec<String>,
}

/// Settings of the connections and requests between clients and a Gateway's Envoy.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gateway.envoyproxy.io",
    version = "v1alpha1",
    kind = "ClientTrafficPolicy",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ClientTrafficPolicySpec {
    /// What the policy attaches to (a Gateway, or one of its listeners).
    pub target_refs: Vec<TargetRef>,
    /// Request and response header handling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<HeaderSettings>,
}

/// Header handling of a `ClientTrafficPolicy`, reduced to the early request header changes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HeaderSettings {
    /// Changes to a request's headers made as Envoy receives them: before routing and before
    /// any HTTP filter (JWT check, ext_proc) sees the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_request_headers: Option<HeaderFilter>,
}

/// Gateway API's `HTTPHeaderFilter`, reduced to header removal.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderFilter {
    /// Header names removed (case-insensitive).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}
