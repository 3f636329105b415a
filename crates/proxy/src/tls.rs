//! The gateway's TLS: the front door's certificate (from `tls: { certFile, keyFile }`, reloaded
//! when the files change) and, per model, HTTPS to its servers (`models[].tls`, see `backend`
//! and `upstream`). The machinery is `infergate_pool::tls`, shared with the picker and the BBR.

use infergate_pool::tls::{ALPN_HTTP, Certificate, ServerTls, ServerTlsOptions, load_pair};

use crate::config::ListenerTls;
use crate::error::Error;

/// The front door's TLS for `config` (`None`: plain HTTP). ALPN offers `h2` then `http/1.1`;
/// hyper's automatic builder then serves whichever the client chose. Must run inside a tokio
/// runtime: the certificate files are polled there.
pub(crate) fn listener_tls(config: Option<&ListenerTls>) -> Result<Option<ServerTls>, Error> {
    let Some(config) = config else {
        return Ok(None);
    };
    let certificate = Certificate::Files {
        cert: config.cert_file.clone(),
        key: config.key_file.clone(),
    };
    ServerTls::new(&certificate, &ServerTlsOptions::new(&ALPN_HTTP))
        .map(Some)
        .map_err(|e| Error::Tls(Box::new(e)))
}

/// Loads the front door's certificate and key as [`listener_tls`] does — both files read, the
/// key matched to the certificate — with the same errors, without polling the files.
pub(crate) fn check_listener_tls(config: Option<&ListenerTls>) -> Result<(), Error> {
    let Some(config) = config else {
        return Ok(());
    };
    let provider = rustls::crypto::ring::default_provider();
    load_pair(&config.cert_file, &config.key_file, &provider)
        .map(drop)
        .map_err(|e| Error::Tls(Box::new(e)))
}
