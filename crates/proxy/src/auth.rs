//! Authentication and authorization on the front door: who is calling (a JWT or an API key in
//! `Authorization: Bearer ...`), and whether that tenant may call the requested model.
//!
//! - **Where it runs.** [`Authenticator::authenticate`] reads only the request headers, before the
//!   body is read and before any gateway-wide slot is taken: an unauthenticated request costs no
//!   body buffer. The model check ([`Identity::may_call`]) runs once routing has resolved the
//!   body's `model`. 401 and 403 are `ApiError::Unauthorized` / `ApiError::Forbidden`
//!   (and a JWT that cannot be checked because no key set was ever fetched is a 503
//!   `ApiError::AuthUnavailable`: the provider's failure is not the client's); a 401
//!   carries `WWW-Authenticate: Bearer realm="infergate"`, and neither body repeats the
//!   credential (the reasons are fixed phrases).
//! - **The credential.** `Authorization: Bearer <credential>`, the form the OpenAI SDKs send. At
//!   most `auth.maxTokenBytes` (8 KiB default) and visible ASCII only, else 401 before decoding.
//!   A credential shaped like a JWT (three dot-separated parts) is verified as a JWT when `jwt` is
//!   configured; anything else is looked up as an API key when `apiKeys` is configured. The
//!   `x-api-key` header is not read. When authentication is on, neither `Authorization` nor
//!   `x-api-key` is forwarded to the model servers.
//! - **JWT verification** uses `ring::signature` directly rather than the `jsonwebtoken` crate:
//!   ring 0.17 is already in the tree (rustls' provider), so no new cryptographic dependency comes
//!   in, and the code that binds each algorithm to one key type, refuses `none` and HS*, and
//!   applies the leeway is short enough to read in one sitting (the `jwt` module). The clock is
//!   passed in.
//! - **Tenant and models.** A key names its tenant and models in the configuration; a JWT names
//!   them in claims (`tenantClaim`, default `sub`; `modelsClaim`, absent = every model, and a
//!   token lacking a configured models claim may call nothing). A model is allowed when the list
//!   holds `*`, the requested name, or — for a LoRA adapter — its base model.
//! - **`auth: none`** lets every request in as the tenant `anonymous`.

pub mod jwks;
mod jwt;
pub mod keys;

use std::sync::Arc;

use http::HeaderMap;
use http::header::{self, HeaderName};
use infergate_openai::ApiError;

use crate::config::auth::{AuthConfig, AuthSettings, JwtConfig};
pub use jwks::JwksError;
use jwt::{TokenError, Unverified};
pub use keys::KeyFileError;

/// The tenant of requests to a gateway with `auth: none`.
pub const ANONYMOUS_TENANT: &str = "anonymous";

static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Which models a caller may use.
#[derive(Clone, Debug)]
pub enum ModelAccess {
    /// Every model.
    All,
    /// These names (models or adapters).
    Only(Arc<[String]>),
}

impl ModelAccess {
    fn from_list(list: &[String]) -> ModelAccess {
        if list.iter().any(|m| m == "*") {
            ModelAccess::All
        } else {
            ModelAccess::Only(list.into())
        }
    }

    /// Whether `requested` (whose base model is `base`) is allowed.
    pub fn allows(&self, requested: &str, base: &str) -> bool {
        match self {
            ModelAccess::All => true,
            ModelAccess::Only(list) => list.iter().any(|m| m == requested || m == base),
        }
    }
}

/// Who an admitted request comes from.
#[derive(Clone, Debug)]
pub struct Identity {
    /// The tenant (`anonymous` without authentication).
    pub tenant: Arc<str>,
    /// The models it may call.
    pub models: ModelAccess,
}

impl Identity {
    /// `Ok` when this caller may call `requested` (base model `base`), else the 403.
    pub fn may_call(&self, requested: &str, base: &str) -> Result<(), ApiError> {
        if self.models.allows(requested, base) {
            Ok(())
        } else {
            Err(ApiError::Forbidden {
                tenant: self.tenant.to_string(),
                model: requested.to_owned(),
            })
        }
    }
}

/// Why authentication could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    /// The JWKS client could not be built.
    #[error("auth.jwt")]
    Jwks(#[from] JwksError),
    /// The API key file could not be loaded.
    #[error("auth.apiKeys")]
    Keys(#[from] KeyFileError),
}

struct Jwt {
    config: JwtConfig,
    jwks: Arc<jwks::Jwks>,
    /// Set once the first fetch has been tried; requests before that wait for it.
    first_fetch: tokio::sync::watch::Receiver<bool>,
}

struct Enabled {
    settings: AuthSettings,
    jwt: Option<Jwt>,
    keys: Option<Arc<keys::KeyStore>>,
    /// The background tasks (key refresh, key file watch), stopped when this is dropped.
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Drop for Enabled {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The front door's authenticator for one `auth:` setting.
pub struct Authenticator {
    anonymous: Identity,
    enabled: Option<Enabled>,
}

fn unauthorized(reason: &'static str) -> ApiError {
    ApiError::Unauthorized { reason }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> ApiError {
        let reason = match e {
            TokenError::Malformed => "the token is not a well-formed JWT",
            TokenError::Algorithm => "the token's algorithm is not accepted",
            TokenError::Critical => "the token has critical header parameters",
            TokenError::UnknownKey => "the token's signing key is unknown",
            TokenError::Signature => "the token's signature is invalid",
            TokenError::NoExpiry => "the token has no expiry",
            TokenError::Expired => "the token has expired",
            TokenError::NotYetValid => "the token is not valid yet",
            TokenError::Issuer => "the token's issuer is not accepted",
            TokenError::Audience => "the token's audience is not accepted",
            TokenError::RequiredClaim => "the token lacks a required claim",
            TokenError::NoTenant => "the token names no tenant",
            TokenError::ModelsClaim => "the token's models claim is malformed",
        };
        unauthorized(reason)
    }
}

impl Authenticator {
    /// The authenticator for `config`. Background work (the JWKS fetches, the key file watch)
    /// is spawned on the current tokio runtime; outside one, keys are fetched on demand only.
    pub fn new(config: &AuthConfig) -> Result<Authenticator, AuthSetupError> {
        let anonymous = Identity {
            tenant: Arc::from(ANONYMOUS_TENANT),
            models: ModelAccess::All,
        };
        let settings = match config {
            AuthConfig::None => {
                return Ok(Authenticator {
                    anonymous,
                    enabled: None,
                });
            }
            AuthConfig::Required(s) => (**s).clone(),
        };
        let rt = tokio::runtime::Handle::try_current().ok();
        let mut tasks = Vec::new();
        let jwt = match &settings.jwt {
            None => None,
            Some(c) => {
                let jwks = Arc::new(jwks::Jwks::new(c)?);
                let (tx, rx) = tokio::sync::watch::channel(false);
                match &rt {
                    Some(rt) => {
                        let first = Arc::clone(&jwks);
                        let weak = Arc::downgrade(&jwks);
                        let every = c.refresh_interval;
                        tasks.push(
                            rt.spawn(async move {
                                match first.refresh().await {
                                    Ok(n) => tracing::info!(keys = n, "JWKS loaded"),
                                    Err(e) => tracing::warn!(
                                        error = %infergate_pool::ErrorChain(&e),
                                        "JWKS fetch failed; tokens are answered 503 until one \
                                         succeeds"
                                    ),
                                }
                                let _ = tx.send(true);
                                drop(first);
                                jwks::refresh_periodically(weak, every).await;
                            })
                            .abort_handle(),
                        );
                    }
                    None => {
                        let _ = tx.send(true);
                    }
                }
                Some(Jwt {
                    config: c.clone(),
                    jwks,
                    first_fetch: rx,
                })
            }
        };
        let keys = match &settings.api_keys {
            None => None,
            Some(c) => {
                let (store, text) = keys::KeyStore::new(c)?;
                let store = Arc::new(store);
                if let (Some(rt), Some(text)) = (&rt, text) {
                    let weak = Arc::downgrade(&store);
                    tasks.push(
                        rt.spawn(keys::watch_file(weak, text, c.poll_interval))
                            .abort_handle(),
                    );
                }
                Some(store)
            }
        };
        Ok(Authenticator {
            anonymous,
            enabled: Some(Enabled {
                settings,
                jwt,
                keys,
                tasks,
            }),
        })
    }

    /// Loads what `config` names as [`Authenticator::new`] does — the JWKS client with its
    /// `caFile`, the API key file — with the same errors, but starts nothing and fetches no key
    /// set (`infergate gateway --check`).
    pub fn check(config: &AuthConfig) -> Result<(), AuthSetupError> {
        let AuthConfig::Required(settings) = config else {
            return Ok(());
        };
        if let Some(c) = &settings.jwt {
            jwks::Jwks::new(c)?;
        }
        if let Some(c) = &settings.api_keys {
            keys::KeyStore::new(c)?;
        }
        Ok(())
    }

    /// Whether requests are authenticated.
    pub fn is_enabled(&self) -> bool {
        self.enabled.is_some()
    }

    /// Whether some request can be let in: false only while JWTs are the only credential
    /// accepted and no key set has been fetched yet (every request would be refused). With API
    /// keys beside JWTs, key holders are served meanwhile.
    pub fn is_ready(&self) -> bool {
        match &self.enabled {
            Some(Enabled {
                jwt: Some(jwt),
                keys: None,
                ..
            }) => jwt.jwks.fetched(),
            _ => true,
        }
    }

    /// Whether this authenticator was built from `config` (a reload keeps it, and its cached
    /// keys, when the `auth:` section did not change).
    pub fn serves(&self, config: &AuthConfig) -> bool {
        match (&self.enabled, config) {
            (None, AuthConfig::None) => true,
            (Some(e), AuthConfig::Required(s)) => e.settings == **s,
            _ => false,
        }
    }

    /// Who sent a request with these headers, or the 401.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Identity, ApiError> {
        let Some(e) = &self.enabled else {
            return Ok(self.anonymous.clone());
        };
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            // Clients of other APIs (Anthropic's SDKs) send their key there.
            if headers.contains_key(&X_API_KEY) {
                return Err(unauthorized(
                    "the credential is in `x-api-key`, which the gateway does not read",
                ));
            }
            return Err(unauthorized("the request carries no credential"));
        };
        let raw = value.as_bytes();
        // "Bearer " plus the credential; checked before anything is decoded.
        if raw.len() > e.settings.max_token_bytes.saturating_add(7) {
            return Err(unauthorized("the credential is longer than the limit"));
        }
        let credential = match raw.split_at_checked(7) {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case(b"bearer ") => rest.trim_ascii(),
            // `Bearer` alone: trailing spaces do not survive in a header value.
            None if raw.eq_ignore_ascii_case(b"bearer") => &[],
            _ => {
                return Err(unauthorized(
                    "the Authorization header is not `Bearer <credential>`",
                ));
            }
        };
        if credential.is_empty() || !credential.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(unauthorized("the credential is empty or not visible ASCII"));
        }
        let looks_like_jwt = credential.iter().filter(|b| **b == b'.').count() == 2;
        match (&e.jwt, &e.keys) {
            (Some(jwt), _) if looks_like_jwt => {
                // Visible ASCII is valid UTF-8.
                let token = std::str::from_utf8(credential)
                    .map_err(|_| unauthorized("the credential is empty or not visible ASCII"))?;
                verify_jwt(jwt, token).await
            }
            (_, Some(keys)) => match keys.lookup(&keys::digest(credential)) {
                Some(g) => Ok(Identity {
                    tenant: Arc::clone(&g.tenant),
                    models: g.models.clone(),
                }),
                None => Err(unauthorized("the API key is not known")),
            },
            (Some(_), None) => Err(unauthorized("the token is not a well-formed JWT")),
            (None, None) => Err(unauthorized("the request carries no credential")),
        }
    }
}

async fn verify_jwt(jwt: &Jwt, token: &str) -> Result<Identity, ApiError> {
    let unverified = Unverified::parse(token)?;
    if !*jwt.first_fetch.borrow() {
        let mut rx = jwt.first_fetch.clone();
        let _ = tokio::time::timeout(jwt.config.fetch_timeout, rx.wait_for(|done| *done)).await;
    }
    let now = jwt::unix_now();
    let mut keys = jwt.jwks.keys();
    let known = unverified.key_known(&keys) && keys.len() > 0;
    if !known && jwt.jwks.try_claim_refresh() {
        match jwt.jwks.refresh_claimed().await {
            Ok(n) => tracing::info!(keys = n, "JWKS refreshed for an unknown key id"),
            Err(e) => tracing::warn!(error = %e, "JWKS refresh for an unknown key id failed"),
        }
        keys = jwt.jwks.keys();
    }
    if !jwt.jwks.fetched() {
        // Nothing to verify against: the provider's fault (or the network's), not the token's.
        return Err(ApiError::AuthUnavailable {
            retry_after: jwt.jwks.next_fetch_in(),
        });
    }
    let claims = unverified.verify(&keys, &jwt.config, now)?;
    Ok(Identity {
        tenant: Arc::from(claims.tenant),
        models: match claims.models {
            None => ModelAccess::All,
            Some(list) => ModelAccess::from_list(&list),
        },
    })
}

/// The SHA-256 of an API key as 64 lowercase hex digits: what `auth.apiKeys[].sha256` holds.
pub fn sha256_hex(key: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let d = keys::digest(key);
    let mut s = String::with_capacity(64);
    for b in d {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    s
}

/// Removes the client's credentials from headers going upstream (when authentication is on).
pub(crate) fn strip_credentials(headers: &mut HeaderMap) {
    headers.remove(header::AUTHORIZATION);
    headers.remove(&X_API_KEY);
}
