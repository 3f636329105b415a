//! Pool membership: which endpoints the picker may route to.
//!
//! - [`static_file`] — a YAML file of endpoints (`endpoints:`) with engine and labels (standalone
//!   and tests);
//! - [`kubernetes`] — the pods an InferencePool selects, watched with the `kube` runtime.
//!
//! Each source produces [`EndpointMeta`](infergate_scheduler::EndpointMeta) lists that the caller
//! hands to the pool's `set_endpoints`.

pub mod kubernetes;
pub mod static_file;
