//! Upstream kinds the operator writes and no maintained crate provides, reduced to the fields
//! infergate sets. Unknown fields from the cluster are ignored on read; nothing here generates a
//! CRD (`schema = "disabled"`): the upstream projects own those schemas.

pub mod envoy_gateway;
pub mod inference_pool;

pub use envoy_gateway::{
    Authorization, AuthorizationRule, BackendRef, CircuitBreaker, ClaimMatch, ClaimToHeader,
    ClientTrafficPolicy, ClientTrafficPolicySpec, ClusterSettings, EnvoyExtensionPolicy,
    EnvoyExtensionPolicySpec, ExtProc, HeaderFilter, HeaderSettings, Jwt, JwtPrincipal, Principal,
    ProcessingMode, ProcessingModeDirection, RemoteJwksRef, SecurityJwtProvider, SecurityPolicy,
    SecurityPolicySpec, TargetRef,
};
pub use inference_pool::{
    EndpointPickerRef, InferencePool, InferencePoolSpec, PoolSelector, PortNumber,
};
