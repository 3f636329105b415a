//! The operator's error type.

/// Errors of a reconcile, a render or the leader elector.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config breaks an admission rule; reported as `Accepted=False`, not retried quickly.
    #[error(transparent)]
    Invalid(#[from] infergate_api::Error),
    /// The config lacks metadata the render needs (name, namespace, uid).
    #[error("InferenceGatewayConfig has no {0}")]
    MissingMetadata(&'static str),
    /// A child name would exceed the 63-character Kubernetes limit.
    #[error(
        "child name {name:?} is longer than 63 characters: shorten the config or scheduler name"
    )]
    NameTooLong {
        /// The name that does not fit.
        name: String,
    },
    /// A rendered object does not fit its typed schema (a bug in the render).
    #[error("rendered {kind} does not match its type")]
    Shape {
        /// Kind of the object.
        kind: &'static str,
        /// What did not fit.
        #[source]
        source: serde_json::Error,
    },
    /// A process's arguments could not be written as a command line (a bug in the render).
    #[error("cannot write a container command line")]
    CommandLine(#[source] infergate_extproc::args::CommandLineError),
    /// The scheduler settings of a scheduler do not make a valid picker configuration.
    #[error("invalid scheduler settings: {0}")]
    SchedulerConfig(String),
    /// A section of the spec does not make a file the picker accepts (`--quotas`,
    /// `--flow-control`): the picker's own reason.
    #[error("spec.{field} is not accepted by the endpoint picker: {reason}")]
    PickerFile {
        /// The spec's field (`quotas`, `flowControl`, `tenancy`).
        field: &'static str,
        /// The picker's message.
        reason: String,
    },
    /// A rendered file did not serialise (a bug in the render).
    #[error("cannot write a rendered file as YAML")]
    Yaml(#[source] serde_yaml::Error),
    /// An API the children need is not served by the cluster.
    #[error(
        "the {kind} API ({api_version}) is not installed: install Envoy Gateway and the Gateway API Inference Extension CRDs"
    )]
    MissingApi {
        /// Kind whose API is missing.
        kind: String,
        /// Its `group/version`.
        api_version: String,
    },
    /// The cluster does not serve `InferenceGatewayConfig`: the CRD is not installed.
    #[error(
        "the InferenceGatewayConfig CRD (infergate.dev/v1alpha1) is not installed: \
         kubectl apply --server-side -f crds/ (Helm installs it from the chart's crds/ on a \
         first install only)"
    )]
    MissingCrd,
    /// A child's name is held by an object this config does not manage (no
    /// `infergate.dev/config` label naming it): applying would take that object over, and
    /// deleting the config would delete it.
    #[error(
        "{child} already exists and is not managed by this config (it lacks the label \
         infergate.dev/config={config}): rename the config or the scheduler, or delete or \
         rename that object"
    )]
    NameTaken {
        /// `Kind namespace/name` of the object.
        child: String,
        /// The config's name.
        config: String,
    },
    /// A call to the Kubernetes API failed.
    #[error("Kubernetes API call failed")]
    Kube(#[from] kube::Error),
    /// The API server refused a call about a named object: listing, reading, writing or
    /// deleting one of the config's children, reading a Secret the spec names or a peer key,
    /// listing the configs at start (a webhook, a quota, a missing permission, a schema it
    /// enforces).
    #[error("cannot {action} {child}")]
    Child {
        /// `list`, `read`, `apply`, `create` or `delete`.
        action: &'static str,
        /// `Kind namespace/name` of the object, or the kind and selector listed.
        child: String,
        /// The API server's answer (boxed: it is large, and errors travel by value).
        #[source]
        source: Box<kube::Error>,
    },
    /// The start-up check may not list the configs in a namespace of `--watch-namespaces`:
    /// the Role and RoleBinding that grant the operator its rules there are missing or short.
    #[error(
        "cannot list InferenceGatewayConfigs in namespace {namespace}: the operator needs `list` \
         (and `watch`, `patch`) on inferencegatewayconfigs.infergate.dev there, which the Role \
         and RoleBinding the chart renders in each namespace of watchNamespaces grant; create \
         them in {namespace} or drop it from --watch-namespaces"
    )]
    NamespaceForbidden {
        /// The namespace.
        namespace: String,
        /// The API server's answer (which names the service account).
        #[source]
        source: Box<kube::Error>,
    },
    /// No client could be configured: neither in a pod nor with a kubeconfig.
    // kube's message already holds its causes, each once ("in-cluster: (...), kubeconfig:
    // (...)"); as a `source` they would print again below it.
    #[error(
        "no Kubernetes cluster to connect to (in a pod: its service account; elsewhere: \
         KUBECONFIG or ~/.kube/config): {cause}"
    )]
    NoCluster {
        /// What kube reported.
        cause: kube::Error,
    },
    /// The metrics listener could not be bound.
    #[error("cannot bind the metrics listener")]
    Io(#[source] std::io::Error),
    /// Another replica holds the leader Lease now, or renewing it failed for too long.
    #[error("lost the leader Lease")]
    LostLease,
    /// Adding or removing the finalizer failed.
    #[error("finalizer step failed")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The system's random generator failed (a peer-exchange key could not be drawn).
    #[error("no random bytes for the pickers' peer-exchange key")]
    Random,
    /// The TokenReview or SubjectAccessReview that checks a scrape of `/metrics` failed.
    #[error(
        "the {review} checking a scrape's token failed (the operator's ClusterRole needs create \
         on {resource}; --metrics-auth=none serves /metrics without the check)"
    )]
    MetricsReview {
        /// `TokenReview` or `SubjectAccessReview`.
        review: &'static str,
        /// Its `resource.group`, as RBAC names it.
        resource: &'static str,
        /// The API server's answer.
        #[source]
        source: Box<kube::Error>,
    },
    /// The API server did not answer the review of a scrape's token in time.
    #[error("the {review} checking a scrape's token got no answer within {seconds} s")]
    MetricsReviewTimeout {
        /// `TokenReview` or `SubjectAccessReview`.
        review: &'static str,
        /// The time it was given.
        seconds: u64,
    },
    /// The metrics port's certificate files could not be loaded (or a self-signed one made).
    #[error("the metrics port's TLS certificate cannot be used ({flags})")]
    MetricsTls {
        /// The flags it came from, with their values.
        flags: String,
        /// Which file, and what is wrong with it.
        #[source]
        source: infergate_pool::tls::TlsError,
    },
    /// Certificate files were given for a metrics port told to serve plain HTTP.
    #[error(
        "--metrics-tls=false serves plain HTTP, yet --metrics-tls-cert-file and \
         --metrics-tls-key-file name a certificate: drop --metrics-tls=false to serve HTTPS with \
         it, or drop the files"
    )]
    MetricsTlsConflict,
}

impl Error {
    /// Short, stable label for the failure metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "invalid",
            Self::MissingMetadata(_) => "missing_metadata",
            Self::NameTooLong { .. } => "name_too_long",
            Self::Shape { .. } | Self::CommandLine(_) | Self::Yaml(_) => "render_shape",
            Self::SchedulerConfig(_) | Self::PickerFile { .. } => "invalid",
            Self::MissingApi { .. } => "missing_api",
            Self::NameTaken { .. } => "name_taken",
            Self::MissingCrd => "missing_crd",
            Self::NamespaceForbidden { .. } => "forbidden",
            Self::Kube(e) if is_conflict(e) => "conflict",
            Self::Child { source, .. } if is_conflict(source) => "conflict",
            Self::Kube(_) | Self::Child { .. } => "kube",
            Self::NoCluster { .. } => "no_cluster",
            Self::LostLease => "lost_lease",
            Self::Io(_) => "io",
            Self::Finalizer(_) => "finalizer",
            Self::Random => "random",
            Self::MetricsReview { .. } | Self::MetricsReviewTimeout { .. } => "metrics_review",
            Self::MetricsTls { .. } | Self::MetricsTlsConflict => "metrics_tls",
        }
    }

    /// The message with every cause, for the log and the config's status: what failed, then
    /// why (the API server's message, code and reason for a refused call).
    pub fn report(&self) -> String {
        match self {
            Self::Kube(e) => format!("{self}: {}", kube_detail(e)),
            Self::Child { source, .. }
            | Self::MetricsReview { source, .. }
            | Self::NamespaceForbidden { source, .. } => {
                format!("{self}: {}", kube_detail(source))
            }
            other => chain(other),
        }
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn kube_detail(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} (HTTP {} {})", s.message, s.code, s.reason),
        other => chain(other),
    }
}

/// An error and its sources, each once (many messages already repeat their source's).
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = c.source();
    }
    out
}
