//! The `tls` sections of the gateway configuration: the front door's certificate, and a model's
//! HTTPS to its servers.
//!
//! ```yaml
//! tls: { certFile: /etc/infergate/tls/tls.crt, keyFile: /etc/infergate/tls/tls.key }
//! models:
//!   - name: llama-3-8b
//!     tls: { caFile: /etc/infergate/model-ca.pem, serverName: vllm.internal }
//!     endpoints: [10.0.0.5:8000]
//! ```
//!
//! The front door's files are read at start and polled for changes every second (see
//! `infergate_pool::tls`); the section itself is read only at start. A model's CA file is read
//! when its pool starts (at start, or on a reload that changes the model's `tls` section).

use std::path::PathBuf;

use serde::Deserialize;

/// The front door serves HTTPS (HTTP/2 and HTTP/1.1 by ALPN) with this certificate.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListenerTls {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the leaf.
    pub key_file: PathBuf,
}

/// The model's servers speak HTTPS; their certificates are verified against `caFile`. Metrics
/// are scraped over HTTPS with the same settings.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpstreamTls {
    /// PEM CA bundle the servers' certificates must chain to.
    pub ca_file: PathBuf,
    /// The name every server's certificate must carry (DNS name or IP address). Default: the
    /// endpoint's IP address.
    #[serde(default)]
    pub server_name: Option<String>,
}
