//! The infergate Kubernetes operator: reconciles each `InferenceGatewayConfig` into the Gateway
//! API, Gateway API Inference Extension and Envoy Gateway objects that wire Envoy, the
//! body-based router and one endpoint picker per model together.
//!
//! The shape follows kube-rs's controller-rs: the work is split into a pure part and thin IO.
//! - [`render`]: config → desired children, a pure function golden-tested per example config.
//! - [`status`]: observed children → status conditions, pure as well.
//! - [`reconcile`]: the controller — validate, render, server-side apply under one field
//!   manager, prune children that left the spec, finalizer, status write, `error_policy` with
//!   backoff and a failure counter.
//! - [`triggers`]: which configs an event on a model-server Pod concerns, pure; `reconcile`
//!   feeds the watch into it.
//! - [`leader`]: a `coordination.k8s.io/v1` Lease elector so two replicas never both write.
//! - [`metrics`]: Prometheus counters of reconciles and failures.
//! - [`metrics_auth`]: who may read `/metrics` (a TokenReview and a SubjectAccessReview per
//!   token, kept a short while).
//! - [`rbac`]: every permission the operator holds and why (in a ClusterRole, or with
//!   `--watch-namespaces` in a Role per namespace); the chart's renders are checked against it.
//! - [`scope`]: every namespace, or the namespaces `--watch-namespaces` lists: which API paths
//!   the controller, the start-up check and the uninstall path use.
//! - [`serve`]: the `infergate operator` process tying these together.
//! - [`uninstall`]: deleting a release's configs and waiting for the operator to let them go
//!   (the chart's `pre-delete` hook, `infergate delete-configs`).

pub mod error;
pub mod leader;
pub mod metrics;
pub mod metrics_auth;
pub mod rbac;
pub mod reconcile;
pub mod render;
pub mod scope;
pub mod serve;
pub mod status;
pub mod triggers;
pub mod uninstall;

pub use error::Error;
