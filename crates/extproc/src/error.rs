//! The crate's error type.

use std::path::PathBuf;

/// What can go wrong starting or running the ext_proc servers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration or endpoints file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// A YAML file did not parse.
    #[error("{path} is not valid")]
    Yaml {
        /// The file.
        path: PathBuf,
        /// What the parser reported, with the failing location.
        #[source]
        source: serde_yaml::Error,
    },
    /// A rewrites file parsed, but its rules are inconsistent.
    #[error("{path}: invalid model rewrites")]
    Rewrites {
        /// The file.
        path: PathBuf,
        /// Which rule is wrong, and how.
        #[source]
        source: infergate_scheduler::RewriteError,
    },
    /// An endpoint entry is unusable.
    #[error("endpoint `{endpoint}`: {reason}")]
    Endpoint {
        /// The entry as written.
        endpoint: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An endpoint's engine is missing or unknown.
    #[error(transparent)]
    Engine(#[from] infergate_metrics::Error),
    /// The model table is inconsistent.
    #[error("model table")]
    Models(#[from] infergate_openai::ModelRouterError),
    /// The live pool could not start or rejected its endpoints.
    #[error(transparent)]
    Pool(#[from] infergate_pool::PoolError),
    /// The peer exchange's settings are invalid or its port could not be bound.
    #[error(transparent)]
    Peers(#[from] infergate_pool::peers::PeerSetupError),
    /// Precise prefix routing could not start (its tokenizer did not load).
    #[error(transparent)]
    Precise(#[from] infergate_pool::precise::PreciseError),
    /// The ext_proc port's certificate could not be loaded or generated.
    #[error("ext_proc TLS")]
    Tls(#[from] infergate_pool::tls::TlsError),
    /// The metrics port's certificate or client CA bundle could not be loaded.
    #[error("metrics port TLS")]
    MetricsTls(#[source] infergate_pool::tls::TlsError),
    /// A client CA bundle was given for a port that does not serve TLS.
    #[error(
        "the client CA bundle {path} needs TLS on the ext_proc port (--tls-cert-file and \
         --tls-key-file, or --tls-self-signed)"
    )]
    ClientCaWithoutTls {
        /// The CA bundle.
        path: PathBuf,
    },
    /// A listener failed.
    #[error("server IO failed")]
    Io(#[from] std::io::Error),
    /// A Kubernetes API call failed.
    #[error("Kubernetes API call failed")]
    Kube(#[from] kube::Error),
    /// No Kubernetes client could be configured: neither in a pod nor with a kubeconfig.
    // kube's message already holds its causes, each once; as a `source` they would print again.
    #[error(
        "no Kubernetes cluster to discover the pool's pods in (in a pod: its service account; \
         elsewhere: KUBECONFIG or ~/.kube/config): {cause}"
    )]
    NoCluster {
        /// What kube reported.
        cause: kube::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server failed")]
    Transport(#[from] tonic::transport::Error),
}
