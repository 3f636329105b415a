//! A provider's key set, fetched over HTTPS and kept fresh.
//!
//! The keys live in an [`ArcSwap`]: a request reads them without a lock. They are fetched once
//! at start (a failure is logged, not fatal: until a fetch succeeds the gateway has nothing to
//! verify against and answers tokens 503 `auth_unavailable`, and the background task tries again
//! every `jwksMinRefreshIntervalMs`), then every `jwksRefreshIntervalMs` by a background task,
//! and again when a token names a `kid`
//! the set lacks — at most once per `jwksMinRefreshIntervalMs`, counted from the last fetch of
//! any kind. Within that window a token with an unknown `kid` is refused at once: only the one
//! request that starts a fetch waits for it (at most `jwksFetchTimeoutMs`), so a stream of
//! tokens with made-up `kid`s cannot turn into a stream of fetches.
//!
//! The fetch is one HTTP/1.1 `GET` over rustls (ring provider) on a fresh connection; the server
//! certificate is checked against the system's roots (`rustls-native-certs`) plus `caFile` when
//! given. The answer must be `200` and at most [`MAX_JWKS_BYTES`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::time::Instant;

use infergate_pool::ErrorChain;

use super::jwt::KeySet;
use crate::config::auth::JwtConfig;

/// Largest JWKS document read: 1 MiB.
pub const MAX_JWKS_BYTES: usize = 1 << 20;

/// Why the key set could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    /// `caFile` could not be read or holds no certificate.
    #[error("cannot use caFile {path}: {reason}")]
    CaFile {
        /// The file.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// No trusted root at all (no system roots and no `caFile`).
    #[error("no trusted root certificates (the system has none; set remoteJWKS.caFile)")]
    NoRoots,
    /// The URI has no usable host.
    #[error("remoteJWKS.uri has no usable host")]
    Uri,
    /// TCP or TLS failed.
    #[error("cannot connect to the JWKS server")]
    Connect {
        /// The IO or TLS error.
        #[source]
        source: std::io::Error,
    },
    /// HTTP failed.
    #[error("JWKS request failed")]
    Http {
        /// The hyper error.
        #[source]
        source: hyper::Error,
    },
    /// The server answered something other than 200.
    #[error("the JWKS server answered {status}")]
    Status {
        /// The status.
        status: StatusCode,
    },
    /// The body was too large or broke off.
    #[error("the JWKS document is larger than {MAX_JWKS_BYTES} bytes or broke off")]
    Body,
    /// The body is not a JWKS document.
    #[error("not a JWKS document")]
    Parse {
        /// What the JSON parser reported.
        #[source]
        source: serde_json::Error,
    },
    /// The fetch took longer than `jwksFetchTimeoutMs`.
    #[error("the JWKS fetch timed out")]
    Timeout,
}

/// One provider's keys and how to refresh them.
pub(crate) struct Jwks {
    uri: Uri,
    host: String,
    port: u16,
    tls: tokio_rustls::TlsConnector,
    timeout: Duration,
    min_refresh: Duration,
    keys: ArcSwap<KeySet>,
    /// When the last fetch started, in milliseconds since `epoch` (`u64::MAX`: never).
    last_fetch_ms: AtomicU64,
    epoch: Instant,
    /// Whether a fetch has ever succeeded. Until one has, there is nothing to check a token
    /// against: requests are answered 503 (not the token's fault), `/readyz` may say not ready,
    /// and the background task retries every `min_refresh` instead of every `refresh_interval`.
    fetched: AtomicBool,
}

fn tls_config(ca_file: Option<&std::path::Path>) -> Result<rustls::ClientConfig, JwksError> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        // A broken system certificate is skipped, as every client does.
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_file {
        let shown = path.display().to_string();
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| JwksError::CaFile {
                path: shown.clone(),
                reason: e.to_string(),
            })?
            .collect::<Result<_, _>>()
            .map_err(|e| JwksError::CaFile {
                path: shown.clone(),
                reason: e.to_string(),
            })?;
        if certs.is_empty() {
            return Err(JwksError::CaFile {
                path: shown,
                reason: "no PEM certificate in it".into(),
            });
        }
        for c in certs {
            roots.add(c).map_err(|e| JwksError::CaFile {
                path: shown.clone(),
                reason: e.to_string(),
            })?;
        }
    }
    if roots.is_empty() {
        return Err(JwksError::NoRoots);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| JwksError::Connect {
            source: std::io::Error::other(e),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

impl Jwks {
    /// A key set for `config`, empty until the first fetch.
    pub(crate) fn new(config: &JwtConfig) -> Result<Jwks, JwksError> {
        let uri: Uri = config.remote_jwks.uri.parse().map_err(|_| JwksError::Uri)?;
        let host = uri.host().ok_or(JwksError::Uri)?;
        // An IPv6 literal comes bracketed in the URI.
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let tls = tls_config(config.remote_jwks.ca_file.as_deref())?;
        Ok(Jwks {
            uri,
            host,
            port,
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            timeout: config.fetch_timeout,
            min_refresh: config.min_refresh_interval,
            keys: ArcSwap::from_pointee(KeySet::default()),
            last_fetch_ms: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            fetched: AtomicBool::new(false),
        })
    }

    /// The keys in force.
    pub(crate) fn keys(&self) -> arc_swap::Guard<Arc<KeySet>> {
        self.keys.load()
    }

    /// Whether a key set has ever been fetched (the keys in force came from the provider).
    pub(crate) fn fetched(&self) -> bool {
        self.fetched.load(Ordering::Acquire)
    }

    /// How long until another fetch may be tried: the rest of the `min_refresh` window opened by
    /// the last fetch (all of it when a fetch just started, none when there was none).
    pub(crate) fn next_fetch_in(&self) -> Duration {
        let last = self.last_fetch_ms.load(Ordering::Acquire);
        if last == u64::MAX {
            return Duration::ZERO;
        }
        let since = Duration::from_millis(self.now_ms().saturating_sub(last));
        self.min_refresh.saturating_sub(since)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Claims the right to fetch now if the last fetch started at least `min_refresh` ago (or
    /// there was none). One caller wins per window.
    pub(crate) fn try_claim_refresh(&self) -> bool {
        let now = self.now_ms();
        let last = self.last_fetch_ms.load(Ordering::Acquire);
        let window = u64::try_from(self.min_refresh.as_millis()).unwrap_or(u64::MAX);
        if last != u64::MAX && now.saturating_sub(last) < window {
            return false;
        }
        self.last_fetch_ms
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Fetches the set and, if it parses, puts it in force. Marks the fetch's start for the
    /// rate limit.
    pub(crate) async fn refresh(&self) -> Result<usize, JwksError> {
        self.last_fetch_ms.store(self.now_ms(), Ordering::Release);
        self.refresh_claimed().await
    }

    /// [`Jwks::refresh`] for a caller that already won [`Jwks::try_claim_refresh`].
    pub(crate) async fn refresh_claimed(&self) -> Result<usize, JwksError> {
        let doc = tokio::time::timeout(self.timeout, self.fetch())
            .await
            .map_err(|_| JwksError::Timeout)??;
        let set = KeySet::parse(&doc).map_err(|source| JwksError::Parse { source })?;
        let n = set.len();
        self.keys.store(Arc::new(set));
        self.fetched.store(true, Ordering::Release);
        Ok(n)
    }

    async fn fetch(&self) -> Result<Bytes, JwksError> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|source| JwksError::Connect { source })?;
        let name = ServerName::try_from(self.host.clone()).map_err(|_| JwksError::Uri)?;
        let tls = self
            .tls
            .connect(name, tcp)
            .await
            .map_err(|source| JwksError::Connect { source })?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|source| JwksError::Http { source })?;
        let driver = tokio::spawn(conn);
        let path = self
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let authority = self
            .uri
            .authority()
            .map_or(self.host.as_str(), |a| a.as_str())
            .to_owned();
        let req = Request::get(path)
            .header(header::HOST, authority)
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, "infergate")
            .body(Empty::<Bytes>::new())
            .map_err(|_| JwksError::Uri)?;
        let result = async {
            let resp = send
                .send_request(req)
                .await
                .map_err(|source| JwksError::Http { source })?;
            if resp.status() != StatusCode::OK {
                return Err(JwksError::Status {
                    status: resp.status(),
                });
            }
            Limited::new(resp.into_body(), MAX_JWKS_BYTES)
                .collect()
                .await
                .map(|c| c.to_bytes())
                .map_err(|_| JwksError::Body)
        }
        .await;
        driver.abort();
        result
    }
}

/// Refreshes `jwks` every `every` until it is dropped. Until a fetch has succeeded it tries
/// again every `jwksMinRefreshIntervalMs` instead (when no request-triggered fetch took that
/// window), so that a gateway that started while its provider was unreachable can verify tokens,
/// and turn ready, soon after the provider answers, with or without traffic.
pub(crate) async fn refresh_periodically(jwks: std::sync::Weak<Jwks>, every: Duration) {
    loop {
        let wait = match jwks.upgrade() {
            None => return,
            Some(j) if !j.fetched() => j.min_refresh.min(every),
            Some(_) => every,
        };
        tokio::time::sleep(wait).await;
        let Some(j) = jwks.upgrade() else { return };
        if j.fetched() {
            match j.refresh().await {
                Ok(n) => tracing::debug!(keys = n, "JWKS refreshed"),
                Err(e) => {
                    tracing::warn!(error = %ErrorChain(&e), "JWKS refresh failed; keeping the keys in force")
                }
            }
        } else if j.try_claim_refresh() {
            match j.refresh_claimed().await {
                Ok(n) => tracing::info!(keys = n, "JWKS loaded"),
                Err(e) => tracing::warn!(
                    error = %ErrorChain(&e),
                    "JWKS fetch failed; tokens are answered 503 until one succeeds"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fetch_error_s_chain_says_each_thing_once() {
        let e = JwksError::Connect {
            source: std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused"),
        };
        assert_eq!(
            ErrorChain(&e).to_string(),
            "cannot connect to the JWKS server: refused"
        );
        let source = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let line = ErrorChain(&JwksError::Parse { source }).to_string();
        assert_eq!(line.matches("EOF").count(), 1, "{line}");
        assert!(line.starts_with("not a JWKS document: "), "{line}");
    }
}
