//! The `InferenceGatewayConfig` custom resource (group `infergate.dev`, version `v1alpha1`), its
//! validation, and Rust types for the upstream kinds the operator emits.
//!
//! The crate is pure: types, schemas and checks, no IO. Layout:
//! - [`config`]: the `InferenceGatewayConfig` spec and its defaults; [`status`]: its status.
//! - [`validation`]: the admission rules. Each rule exists twice from one table: as a CEL
//!   `x-kubernetes-validations` entry in the generated CRD (enforced by the API server) and as a
//!   Rust check ([`validation::validate`]) that the operator runs before rendering, so a config that
//!   reached the cluster without the CRD's rules still gets `Accepted=False` with the same message.
//! - [`upstream`]: `InferencePool` (`inference.networking.k8s.io/v1`) and the Envoy Gateway
//!   `EnvoyExtensionPolicy` / `SecurityPolicy` (`gateway.envoyproxy.io/v1alpha1`), reduced to the
//!   fields infergate writes. Gateway and HTTPRoute come from the `gateway-api` crate.
//! - [`crd`]: the generated `CustomResourceDefinition` as YAML, used by `infergate crdgen`.
//! - [`schema`]: that CRD's structural schema applied to a document as the API server applies it
//!   (types, bounds, patterns, unknown fields), for `infergate render`, which has no API server.

pub mod config;
pub mod crd;
pub mod error;
pub mod schema;
pub mod status;
pub mod upstream;
pub mod validation;

pub use config::{
    AppProtocol, AuthSpec, BbrSpec, DEFAULT_ROUTE_TIMEOUT, EngineType, FailureMode, GatewaySpec,
    InferenceGatewayConfig, InferenceGatewayConfigSpec, IssuerKind, IssuerRef, JwtAuth,
    JwtProvider, ListenerProtocol, ListenerSpec, LogFormat, LogLevel, ObservabilitySpec,
    PodDefaults, PrecisePrefixSpec, RemoteJwks, RequiredClaim, SchedulerPreset, SchedulerSpec,
    SecretRef, TlsSpec, TokenizerSource, Weights,
};
pub use error::Error;
pub use status::{InferenceGatewayConfigStatus, RolloutState, SchedulerStatus};
