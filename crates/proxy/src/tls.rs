//! The gateway's TLS: the front door's certificate (from `tls: { certFile, keyFile }`, reloaded
//! when the files change; with `clientCaFile`, mutual TLS) and, per model, HTTPS to its servers
//! (`models[].tls`, see `backend` and `upstream`). The machinery is `infergate_pool::tls`,
//! shared with the picker and the BBR.

use infergate_pool::tls::{ServerTls, port};

use crate::config::ListenerTls;
use crate::error::Error;

/// The front door's TLS for `config` (`None`: plain HTTP). ALPN offers `h2` then `http/1.1`;
/// hyper's automatic builder then serves whichever the client chose. Must run inside a tokio
/// runtime: the certificate files are polled there.
pub(crate) fn listener_tls(config: Option<&ListenerTls>) -> Result<Option<ServerTls>, Error> {
    config
        .map(|c| c.server_tls(port::FRONT))
        .transpose()
        .map_err(|e| Error::Tls(Box::new(e)))
}

/// Loads the front door's certificate, key and client CA bundle as [`listener_tls`] does —
/// every file read, the key matched to the certificate — with the same errors, without
/// polling the files.
pub(crate) fn check_listener_tls(config: Option<&ListenerTls>) -> Result<(), Error> {
    config
        .map(ListenerTls::check)
        .transpose()
        .map(drop)
        .map_err(|e| Error::Tls(Box::new(e)))
}

/// The admin port's TLS for `config` (`adminTls`; `None`: plain HTTP), as [`listener_tls`]
/// builds the front door's. Must run inside a tokio runtime.
pub(crate) fn admin_tls(config: Option<&ListenerTls>) -> Result<Option<ServerTls>, Error> {
    config
        .map(|c| c.server_tls(port::ADMIN))
        .transpose()
        .map_err(|e| Error::AdminTls(Box::new(e)))
}

/// Loads the admin port's files as [`admin_tls`] does, polling nothing.
pub(crate) fn check_admin_tls(config: Option<&ListenerTls>) -> Result<(), Error> {
    config
        .map(ListenerTls::check)
        .transpose()
        .map(drop)
        .map_err(|e| Error::AdminTls(Box::new(e)))
}
