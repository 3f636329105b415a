//! The crate's error type. Errors a *client* sees are `infergate_openai::ApiError`; these are
//! the operator's: a bad configuration file, a listener that cannot be used, a pool that fails to
//! start.
//!
//! A cause is returned by `source()` and kept out of the error's own message, so that a printed
//! chain (`Caused by:`) says each thing once; a log line of one of these errors shows the whole
//! chain with [`infergate_pool::ErrorChain`].

use std::path::PathBuf;

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML or a value is wrong. The message names the field's path
    /// (e.g. `models[1].endpoints[0]`) and its line.
    // Transparent: the parser's message is the whole message, shown once in an error chain.
    #[error(transparent)]
    Invalid {
        /// The parser's error, with path, line and column.
        source: serde_yaml::Error,
    },
    /// A top-level key given twice (a key appended to a file that already had it).
    #[error(transparent)]
    DuplicateKey(#[from] DuplicateKey),
    /// The front door and admin addresses, with the command line's overrides applied, cannot
    /// both be bound.
    #[error("with --listen/--admin applied, {0}")]
    Addresses(String),
}

/// A top-level YAML key given twice (a key appended to a file that already had it): the line of
/// the second. The parser's message names no line for it: the top-level mapping starts at line
/// 1, column 1, which serde_yaml leaves out of its messages. Found by
/// [`crate::config::duplicate_top_level_key`], for the gateway's file and the global router's.
#[derive(Debug, thiserror::Error)]
#[error("the top-level key `{key}` is given twice, the second time at line {line}")]
pub struct DuplicateKey {
    /// The key.
    pub key: String,
    /// The line (from 1) of its second occurrence.
    pub line: usize,
    /// The parser's error.
    #[source]
    pub source: serde_yaml::Error,
}

/// Everything that can stop the gateway from starting or reloading.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid.
    #[error("invalid gateway configuration")]
    Config(#[from] ConfigError),
    /// A model's endpoint pool could not be started or updated.
    #[error("model `{model}`")]
    Pool {
        /// The model.
        model: String,
        /// What failed.
        #[source]
        source: infergate_pool::PoolError,
    },
    /// A model's precise prefix routing could not start (its tokenizer did not load).
    #[error("model `{model}`")]
    Precise {
        /// The model.
        model: String,
        /// What failed.
        #[source]
        source: infergate_pool::precise::PreciseError,
    },
    /// Authentication could not be set up (JWKS client, API key file).
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthSetupError),
    /// A listener could not be used.
    #[error("listener")]
    Io(#[from] std::io::Error),
    /// The front door's certificate or key could not be loaded.
    #[error("tls: the front door's certFile, keyFile or clientCaFile cannot be used")]
    Tls(#[source] Box<infergate_pool::tls::TlsError>),
    /// The admin port's certificate or key could not be loaded.
    #[error("adminTls: the admin port's certFile, keyFile or clientCaFile cannot be used")]
    AdminTls(#[source] Box<infergate_pool::tls::TlsError>),
    /// The access log could not be opened.
    #[error(transparent)]
    AccessLog(#[from] crate::access_log::AccessLogError),
    /// A model's `tls` section (CA file, server name) could not be used.
    #[error("model `{model}`: tls")]
    UpstreamTls {
        /// The model.
        model: String,
        /// What failed (boxed: the error stays small on the happy path).
        #[source]
        source: Box<infergate_pool::tls::TlsError>,
    },
}
