//! The routing core of infergate.
//!
//! Pure and synchronous: no IO, no clock reads (time is passed in as a [`Timestamp`]), randomness
//! from a seeded generator passed in by the caller. The shells (ext_proc picker, standalone proxy,
//! benchmark simulator) feed it endpoint state and carry out its decisions.
//!
//! Layout:
//! - [`endpoint`] — endpoint identity, labels and the metrics snapshot the shells keep fresh.

pub mod endpoint;

pub use endpoint::{
    CacheConfig, EndpointMeta, EngineType, LoraState, MetricsSnapshot, Timestamp,
    UnknownEngineError,
};
