//! The crate's error type.

use crate::validation::Violation;

/// Errors of the API crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config breaks one or more admission rules; every broken rule is listed.
    #[error("invalid InferenceGatewayConfig: {}", join(.0))]
    Invalid(Vec<Violation>),
    /// The CRD could not be serialised.
    #[error("cannot serialise the CustomResourceDefinition")]
    Serialize(#[from] serde_yaml::Error),
}

fn join(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
