//! The gateway's `auth:` section: who may call the gateway, and which models.
//!
//! The section is required. A file without it is refused, so a gateway is never exposed without
//! authentication by accident; `auth: none` turns authentication off explicitly.
//!
//! ```yaml
//! auth:
//!   jwt:
//!     issuer: https://issuer.example.com
//!     remoteJWKS: { uri: https://issuer.example.com/.well-known/jwks.json, caFile: /etc/ca.pem }
//!     audiences: [infergate]                       # any audience when empty
//!     requiredClaims: [{ name: org.team, values: [ml] }]
//!     tenantClaim: sub                             # default `sub`
//!     modelsClaim: models                          # absent: every model
//!   apiKeys:
//!     keys: [{ sha256: <64 hex digits>, tenant: team-a, models: [llama-3-8b] }]
//!     file: /etc/infergate/keys.yaml               # the same `keys:` list, reloaded on change
//! ```
//!
//! The JWT provider's shape is the CRD's (`infergate_api::JwtProvider`: `issuer`, `remoteJWKS.uri`,
//! `audiences`, `requiredClaims`), so a cluster's YAML moves over unchanged; the rest are the
//! standalone gateway's own knobs, each with the default documented on its field.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The error for a file without `auth:`.
pub(crate) const MISSING_AUTH: &str = "`auth` is required: configure `auth.jwt` and/or \
     `auth.apiKeys`, or write `auth: none` to run without authentication";

/// Default clock-skew allowance on `exp` and `nbf`: 30 s.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);
/// Default cap on the `Authorization` header's credential: 8 KiB. A longer one is a 401 without
/// being decoded.
pub const DEFAULT_MAX_TOKEN_BYTES: usize = 8 << 10;
/// Default period of the background JWKS refresh: 5 minutes.
pub const DEFAULT_JWKS_REFRESH: Duration = Duration::from_secs(300);
/// Default shortest time between two JWKS fetches caused by a token with an unknown `kid`: 10 s.
pub const DEFAULT_JWKS_MIN_REFRESH: Duration = Duration::from_secs(10);
/// Default time allowed for one JWKS fetch: 5 s.
pub const DEFAULT_JWKS_TIMEOUT: Duration = Duration::from_secs(5);
/// Default polling period of an API key file: 1 s.
pub const DEFAULT_KEY_FILE_POLL: Duration = Duration::from_secs(1);

/// The `auth:` section.
#[derive(Clone, Debug, PartialEq)]
pub enum AuthConfig {
    /// `auth: none`: every request is let in, as the tenant `anonymous`, for every model.
    None,
    /// Requests must carry a valid JWT or API key.
    Required(Box<AuthSettings>),
}

impl AuthConfig {
    /// Whether requests are authenticated.
    pub fn is_enabled(&self) -> bool {
        matches!(self, AuthConfig::Required(_))
    }
}

/// What an authenticated gateway accepts: JWTs from one provider, API keys, or both.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AuthSettings {
    /// JWTs from one provider.
    #[serde(default)]
    pub jwt: Option<JwtConfig>,
    /// API keys, stored as SHA-256 hashes.
    #[serde(default)]
    pub api_keys: Option<ApiKeysConfig>,
    /// Longest credential accepted in `Authorization: Bearer ...`, in bytes; a longer one is
    /// answered 401 without being decoded. Default [`DEFAULT_MAX_TOKEN_BYTES`] (8 KiB).
    #[serde(default = "default_max_token_bytes")]
    pub max_token_bytes: usize,
}

/// A JWT provider, in the CRD's shape plus the gateway's own settings.
#[derive(Clone, Debug, PartialEq)]
pub struct JwtConfig {
    /// Expected `iss` claim, exactly.
    pub issuer: String,
    /// Where the signing keys are published.
    pub remote_jwks: RemoteJwksConfig,
    /// Accepted `aud` values (the token's `aud`, a string or a list, must name one); any
    /// audience when empty.
    pub audiences: Vec<String>,
    /// Claims a token must carry, each with its accepted values.
    pub required_claims: Vec<RequiredClaimConfig>,
    /// The claim naming the tenant (dotted for nested claims). Default `sub`. A token without it
    /// is refused.
    pub tenant_claim: String,
    /// The claim listing the models the token may call (a list of strings, or one string with
    /// names separated by spaces or commas). `None`, the default: every model.
    pub models_claim: Option<String>,
    /// Clock-skew allowance on `exp` and `nbf`. Default [`DEFAULT_LEEWAY`] (30 s).
    pub leeway: Duration,
    /// Period of the background key-set refresh. Default [`DEFAULT_JWKS_REFRESH`] (5 min).
    pub refresh_interval: Duration,
    /// Shortest time between two fetches caused by an unknown `kid`. Default
    /// [`DEFAULT_JWKS_MIN_REFRESH`] (10 s).
    pub min_refresh_interval: Duration,
    /// Limit on one key-set fetch. Default [`DEFAULT_JWKS_TIMEOUT`] (5 s).
    pub fetch_timeout: Duration,
}

/// Where a provider's keys are published.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RemoteJwksConfig {
    /// The key set's URI; must be `https://`.
    pub uri: String,
    /// A PEM bundle of extra trusted CAs (a private CA), added to the system's roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// A claim a token must carry.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequiredClaimConfig {
    /// Claim name; nested claims with dots (`org.team`).
    pub name: String,
    /// Accepted values: the claim (a string, number or boolean, or a list holding one) must
    /// equal one of them.
    pub values: Vec<String>,
}

/// API keys: inline, from a file, or both.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", try_from = "RawApiKeys")]
pub struct ApiKeysConfig {
    /// Keys written in the gateway's file.
    pub keys: Vec<ApiKeyConfig>,
    /// A file holding `keys: [...]` in the same shape (e.g. a mounted Secret), re-read when its
    /// contents change.
    pub file: Option<PathBuf>,
    /// How often `file` is checked. Default [`DEFAULT_KEY_FILE_POLL`] (1 s).
    pub poll_interval: Duration,
}

/// One API key, as its SHA-256 hash.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawApiKey")]
pub struct ApiKeyConfig {
    /// SHA-256 of the key, 32 bytes (written as 64 hex digits).
    pub sha256: [u8; 32],
    /// The tenant the key belongs to.
    pub tenant: String,
    /// The models the key may call (`*`: every model). A LoRA adapter counts as its base model
    /// unless the adapter itself is listed.
    pub models: Vec<String>,
}

/// An API key file: `keys: [{sha256, tenant, models}]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyFile {
    /// The keys.
    #[serde(default)]
    pub keys: Vec<ApiKeyConfig>,
}

impl ApiKeyFile {
    /// Parses a key file; errors name the field and its line.
    pub fn from_yaml(text: &str) -> Result<Self, serde_yaml::Error> {
        serde_yaml::from_str(text)
    }
}

fn default_max_token_bytes() -> usize {
    DEFAULT_MAX_TOKEN_BYTES
}

impl<'de> Deserialize<'de> for AuthConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = AuthConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`none` or a map with `jwt` and/or `apiKeys`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<AuthConfig, E> {
                if v == "none" {
                    Ok(AuthConfig::None)
                } else {
                    Err(E::custom(format_args!(
                        "`{}` is not an auth setting: write `none` or a map with `jwt` and/or \
                         `apiKeys`",
                        v.chars().take(64).collect::<String>()
                    )))
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, a: A) -> Result<AuthConfig, A::Error> {
                let s = AuthSettings::deserialize(serde::de::value::MapAccessDeserializer::new(a))?;
                if s.jwt.is_none() && s.api_keys.is_none() {
                    return Err(serde::de::Error::custom(
                        "`auth` needs `jwt`, `apiKeys` or both (or `auth: none` for no \
                         authentication)",
                    ));
                }
                if s.max_token_bytes == 0 {
                    return Err(serde::de::Error::custom(
                        "`maxTokenBytes` must be above zero",
                    ));
                }
                Ok(AuthConfig::Required(Box::new(s)))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawJwt {
    issuer: String,
    #[serde(rename = "remoteJWKS")]
    remote_jwks: RemoteJwksConfig,
    #[serde(default)]
    audiences: Vec<String>,
    #[serde(default)]
    required_claims: Vec<RequiredClaimConfig>,
    #[serde(default = "default_tenant_claim")]
    tenant_claim: String,
    #[serde(default)]
    models_claim: Option<String>,
    #[serde(default = "default_leeway_secs")]
    leeway_secs: u64,
    #[serde(default = "default_refresh_ms")]
    jwks_refresh_interval_ms: u64,
    #[serde(default = "default_min_refresh_ms")]
    jwks_min_refresh_interval_ms: u64,
    #[serde(default = "default_fetch_timeout_ms")]
    jwks_fetch_timeout_ms: u64,
}

fn default_tenant_claim() -> String {
    "sub".into()
}
fn default_leeway_secs() -> u64 {
    DEFAULT_LEEWAY.as_secs()
}
fn default_refresh_ms() -> u64 {
    DEFAULT_JWKS_REFRESH.as_millis() as u64
}
fn default_min_refresh_ms() -> u64 {
    DEFAULT_JWKS_MIN_REFRESH.as_millis() as u64
}
fn default_fetch_timeout_ms() -> u64 {
    DEFAULT_JWKS_TIMEOUT.as_millis() as u64
}

impl<'de> Deserialize<'de> for JwtConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = RawJwt::deserialize(d)?;
        JwtConfig::try_from(r).map_err(serde::de::Error::custom)
    }
}

impl TryFrom<RawJwt> for JwtConfig {
    type Error = String;

    fn try_from(r: RawJwt) -> Result<Self, String> {
        if r.issuer.trim().is_empty() {
            return Err("`issuer` must not be empty".into());
        }
        if !r.remote_jwks.uri.starts_with("https://") {
            return Err(
                "`remoteJWKS.uri` must be an `https://` URI (keys fetched in clear text could be \
                 replaced on the way)"
                    .into(),
            );
        }
        if r.remote_jwks
            .uri
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.host().map(str::to_owned))
            .is_none()
        {
            return Err("`remoteJWKS.uri` is not a valid URI with a host".into());
        }
        for c in &r.required_claims {
            if c.name.is_empty() || c.name.split('.').any(str::is_empty) {
                return Err(format!(
                    "`requiredClaims`: `{}` is not a claim name",
                    c.name.chars().take(64).collect::<String>()
                ));
            }
            if c.values.is_empty() {
                return Err(format!(
                    "`requiredClaims`: `{}` needs at least one accepted value",
                    c.name
                ));
            }
        }
        for (field, name) in [
            ("tenantClaim", Some(&r.tenant_claim)),
            ("modelsClaim", r.models_claim.as_ref()),
        ] {
            if let Some(n) = name
                && (n.is_empty() || n.split('.').any(str::is_empty))
            {
                return Err(format!("`{field}` is not a claim name"));
            }
        }
        if r.jwks_min_refresh_interval_ms < 100 {
            return Err(
                "`jwksMinRefreshIntervalMs` must be at least 100: it is what keeps tokens with \
                 made-up key ids from turning into a stream of JWKS fetches"
                    .into(),
            );
        }
        if r.jwks_refresh_interval_ms == 0 || r.jwks_fetch_timeout_ms == 0 {
            return Err(
                "`jwksRefreshIntervalMs` and `jwksFetchTimeoutMs` must be above zero".into(),
            );
        }
        Ok(JwtConfig {
            issuer: r.issuer,
            remote_jwks: r.remote_jwks,
            audiences: r.audiences,
            required_claims: r.required_claims,
            tenant_claim: r.tenant_claim,
            models_claim: r.models_claim,
            // Bounded so that no value can overflow the arithmetic on timestamps.
            leeway: Duration::from_secs(r.leeway_secs.min(86_400)),
            refresh_interval: Duration::from_millis(r.jwks_refresh_interval_ms),
            min_refresh_interval: Duration::from_millis(r.jwks_min_refresh_interval_ms),
            fetch_timeout: Duration::from_millis(r.jwks_fetch_timeout_ms),
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawApiKeys {
    #[serde(default)]
    keys: Vec<ApiKeyConfig>,
    #[serde(default)]
    file: Option<PathBuf>,
    #[serde(default = "default_poll_ms")]
    poll_interval_ms: u64,
}

fn default_poll_ms() -> u64 {
    DEFAULT_KEY_FILE_POLL.as_millis() as u64
}

impl TryFrom<RawApiKeys> for ApiKeysConfig {
    type Error = String;

    fn try_from(r: RawApiKeys) -> Result<Self, String> {
        if r.keys.is_empty() && r.file.is_none() {
            return Err("`apiKeys` needs `keys`, `file` or both".into());
        }
        if r.file.is_some() && r.poll_interval_ms == 0 {
            return Err("`apiKeys.pollIntervalMs` must be above zero".into());
        }
        check_unique(&r.keys)?;
        Ok(ApiKeysConfig {
            keys: r.keys,
            file: r.file,
            poll_interval: Duration::from_millis(r.poll_interval_ms.max(1)),
        })
    }
}

/// Refuses a key hash listed twice (two tenants for one key would be ambiguous).
pub(crate) fn check_unique(keys: &[ApiKeyConfig]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for (i, k) in keys.iter().enumerate() {
        if !seen.insert(k.sha256) {
            return Err(format!("keys[{i}]: this key hash is listed twice"));
        }
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApiKey {
    sha256: String,
    tenant: String,
    models: Vec<String>,
}

impl TryFrom<RawApiKey> for ApiKeyConfig {
    type Error = String;

    fn try_from(r: RawApiKey) -> Result<Self, String> {
        let sha256 = parse_sha256_hex(&r.sha256).ok_or(
            "`sha256` must be 64 hex digits (the SHA-256 of the key: `printf %s \"$KEY\" | \
             sha256sum`), never the key itself",
        )?;
        if r.tenant.trim().is_empty() {
            return Err("`tenant` must not be empty".into());
        }
        if r.models.is_empty() {
            return Err("`models` must list at least one model (`\"*\"` for every model)".into());
        }
        Ok(ApiKeyConfig {
            sha256,
            tenant: r.tenant,
            models: r.models,
        })
    }
}

/// 64 hex digits (either case) as 32 bytes.
pub fn parse_sha256_hex(s: &str) -> Option<[u8; 32]> {
    let b = s.trim().as_bytes();
    if b.len() != 64 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (nibble(b[2 * i])? << 4) | nibble(b[2 * i + 1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests;
