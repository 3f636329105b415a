//! The `tls` sections of the gateway configuration: the front door's certificate, and a model's
//! HTTPS to its servers.
//!
//! ```yaml
//! tls: { certFile: /etc/infergate/tls/tls.crt, keyFile: /etc/infergate/tls/tls.key,
//!        clientCaFile: /etc/infergate/tls/clients-ca.pem }   # optional: mutual TLS
//! models:
//!   - name: llama-3-8b
//!     tls: { caFile: /etc/infergate/model-ca.pem, serverName: vllm.internal }
//!     endpoints: [10.0.0.5:8000]
//! ```
//!
//! The front door's files (the client CA bundle included) are read at start and polled for
//! changes every second (see `infergate_pool::tls`); the section itself is read only at start. A model's CA file is read
//! when its pool starts (at start, or on a reload that changes the model's `tls` section).

use std::path::PathBuf;

use infergate_pool::tls::{
    ALPN_HTTP, Certificate, ServerTls, ServerTlsOptions, TlsError, client_verifier, load_pair,
};
use serde::Deserialize;

/// The front door serves HTTPS (HTTP/2 and HTTP/1.1 by ALPN) with this certificate; with
/// `clientCaFile`, to clients presenting a certificate chained to that bundle only. The
/// gateway's and the global router's front doors.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListenerTls {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of the leaf.
    pub key_file: PathBuf,
    /// PEM CA bundle every client's certificate must chain to (mutual TLS); `None`: no client
    /// certificate is asked for.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

impl ListenerTls {
    /// The TLS of the port named `port` (one of [`infergate_pool::tls::port`]: the gateway's
    /// front door or admin port, the global router's port): ALPN `h2` then `http/1.1`, the files
    /// polled for changes. Must run inside a tokio runtime.
    pub fn server_tls(&self, port: &'static str) -> Result<ServerTls, TlsError> {
        let certificate = Certificate::Files {
            cert: self.cert_file.clone(),
            key: self.key_file.clone(),
        };
        let options = ServerTlsOptions {
            client_ca: self.client_ca_file.clone(),
            ..ServerTlsOptions::new(port, &ALPN_HTTP)
        };
        ServerTls::new(&certificate, &options)
    }

    /// Loads the files as [`Self::server_tls`] does — the key matched to the certificate, the
    /// client CA bundle made a verifier — with the same errors, polling nothing.
    pub fn check(&self) -> Result<(), TlsError> {
        let provider = rustls::crypto::ring::default_provider();
        load_pair(&self.cert_file, &self.key_file, &provider)?;
        if let Some(ca) = &self.client_ca_file {
            client_verifier(ca)?;
        }
        Ok(())
    }
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
