//! The crate's error type.

use std::fmt::Display;

use crate::schema::SchemaViolation;
use crate::validation::Violation;

/// Errors of the API crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config breaks one or more admission rules; every broken rule is listed.
    #[error("invalid InferenceGatewayConfig: {}", join(.0))]
    Invalid(Vec<Violation>),
    /// The document breaks the CRD's schema (what the API server checks before any rule);
    /// every broken field is listed.
    #[error("does not match the InferenceGatewayConfig CRD's schema: {}", join(.0))]
    Schema(Vec<SchemaViolation>),
    /// The CRD could not be serialised.
    #[error("cannot serialise the CustomResourceDefinition")]
    Serialize(#[from] serde_yaml::Error),
}

fn join<T: Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
