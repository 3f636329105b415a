//! The global router's errors (a client never sees these: its errors are
//! `infergate_openai::ApiError`).

use std::path::PathBuf;

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Not YAML of the expected shape (serde_yaml's message names the field and the line, and
    /// is this error's own).
    #[error(transparent)]
    Parse {
        /// The parser's error, with the field path and line.
        source: serde_yaml::Error,
    },
    /// A top-level key given twice (a section appended to a file that already had it): the
    /// line of the second, as the gateway's loader finds it.
    #[error(transparent)]
    DuplicateKey(#[from] infergate_proxy::error::DuplicateKey),
    /// A value that cannot be used.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field's path, e.g. `clusters[1].url`.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The `quotas:` section (the quota service's own check, which names the field, e.g.
    /// `` `quotas.redis.passwordEnv`: the variable `REDIS_PASSWORD` is not set ``).
    #[error("{reason}")]
    Quotas {
        /// What is wrong, the field's path first.
        reason: String,
    },
    /// The `tenancy:` section.
    #[error(transparent)]
    Tenancy(#[from] infergate_pool::tenant::TenancyError),
    /// The `outlierDetection:` section.
    #[error(transparent)]
    OutlierDetection(#[from] OutlierError),
}

/// An `outlierDetection:` value that cannot be used (each message starts with the field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OutlierError {
    /// `consecutiveGatewayFailures: 0` would eject a cluster on no evidence at all.
    #[error(
        "outlierDetection.consecutiveGatewayFailures: must be at least 1 (to turn ejection off, \
         set maxEjectionPercent: 0)"
    )]
    NoFailures,
    /// An ejection of no time.
    #[error("outlierDetection.{0}: must be above zero")]
    ZeroDuration(OutlierField),
    /// Past a week a timer's deadline could overflow.
    #[error("outlierDetection.{0}: must be at most 604800000 (a week)")]
    OverAWeek(OutlierField),
    /// The cap is below the first ejection's length.
    #[error(
        "outlierDetection.maxEjectionMs: {max_ms} is below baseEjectionMs ({base_ms}), the \
         first ejection's length"
    )]
    MaxBelowBase {
        /// `maxEjectionMs`.
        max_ms: u64,
        /// `baseEjectionMs`.
        base_ms: u64,
    },
    /// A share of a model's clusters above all of them.
    #[error("outlierDetection.maxEjectionPercent: {0} is over 100")]
    PercentOver100(u32),
    /// A failure share of none (every interval would eject) or above all requests (none would).
    #[error(
        "outlierDetection.failurePercentage.threshold: {0} is not a percentage from 1 to 100 \
         (to turn it off, leave failurePercentage out)"
    )]
    ThresholdOutOfRange(u32),
    /// An interval of no request would judge a cluster on no evidence.
    #[error("outlierDetection.failurePercentage.minimumRequests: must be at least 1")]
    NoMinimumRequests,
}

/// An `outlierDetection:` duration field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutlierField {
    /// `baseEjectionMs`.
    BaseEjectionMs,
    /// `maxEjectionMs`.
    MaxEjectionMs,
    /// `failurePercentage.intervalMs`.
    IntervalMs,
}

impl std::fmt::Display for OutlierField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OutlierField::BaseEjectionMs => "baseEjectionMs",
            OutlierField::MaxEjectionMs => "maxEjectionMs",
            OutlierField::IntervalMs => "failurePercentage.intervalMs",
        })
    }
}

/// Why the router could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Binding or serving a socket.
    #[error("socket error")]
    Io(#[from] std::io::Error),
    /// The `auth:` section could not be set up.
    #[error("cannot set up authentication")]
    Auth(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The quota service could not start.
    #[error("cannot start the quotas")]
    Quota(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The access log (`accessLog.path`) cannot be opened.
    #[error(transparent)]
    AccessLog(#[from] infergate_proxy::access_log::AccessLogError),
    /// The front door's `tls` files: its certificate, key or client CA bundle (the cause names
    /// the file).
    #[error("tls: the front door's certFile, keyFile or clientCaFile cannot be used")]
    Tls(#[source] Box<infergate_pool::tls::TlsError>),
    /// A cluster's `credentials.bearerTokenFile` cannot be used at start.
    #[error("cluster `{cluster}`: credentials.bearerTokenFile {}", path.display())]
    Credentials {
        /// The cluster's name.
        cluster: String,
        /// The token file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: TokenError,
    },
    /// A cluster's TLS settings cannot be used at start (its `tls.caFile` cannot be read or
    /// holds no certificate).
    #[error("cluster `{cluster}`: {}", match path {
        Some(p) => format!("tls.caFile {}", p.display()),
        None => "TLS settings".to_owned(),
    })]
    ClusterTls {
        /// The cluster's name.
        cluster: String,
        /// Its `tls.caFile`, if it has one.
        path: Option<PathBuf>,
        /// What is wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A cluster's client certificate cannot be used at start (its `tls.certFile` or
    /// `tls.keyFile` cannot be read, is not PEM, or the key is not the certificate's).
    #[error("cluster `{cluster}`: tls.certFile/tls.keyFile")]
    ClusterCertificate {
        /// The cluster's name.
        cluster: String,
        /// What is wrong, naming the file.
        #[source]
        source: Box<infergate_pool::tls::TlsError>,
    },
}

/// Why a bearer token file cannot be sent as `Authorization: Bearer …`.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// It could not be read.
    #[error("cannot read it")]
    Read(#[source] std::io::Error),
    /// It holds nothing but white space.
    #[error("it is empty")]
    Empty,
    /// It holds characters a header value cannot carry (a control character, say).
    #[error("it holds characters an HTTP header cannot carry")]
    NotAHeader,
}
