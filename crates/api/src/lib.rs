//! `InferenceGatewayConfig` CRD types and the upstream kinds infergate emits.
