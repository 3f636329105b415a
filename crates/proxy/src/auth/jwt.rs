//! JWT verification: a key set parsed from a JWKS document, and a token checked against it and
//! the provider's claims. Pure: the time is passed in, nothing here does IO.
//!
//! Accepted algorithms are RS256, ES256 and EdDSA (Ed25519), each bound to its key type: an
//! RS256 token verifies only with an `RSA` key, ES256 only with an `EC` P-256 key, EdDSA only
//! with an `OKP` Ed25519 key. Everything else (`none`, HS256/384/512, PS*, ES384, …) is refused
//! before any key is looked at, so a token "signed" with a public key as an HMAC secret can never
//! verify. A token with a `crit` header is refused (no extension is understood).

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::Value;

use crate::config::auth::JwtConfig;

/// Why a token was refused. Each message is a fixed phrase: none repeats the token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenError {
    /// Not three base64url parts with a JSON header and payload.
    #[error("the token is not a well-formed JWT")]
    Malformed,
    /// `alg` is not RS256, ES256 or EdDSA.
    #[error("the token's algorithm is not accepted (RS256, ES256 and EdDSA are)")]
    Algorithm,
    /// The header has `crit`.
    #[error("the token has critical header parameters")]
    Critical,
    /// No key of the set has the token's `kid` (and type).
    #[error("the token's signing key is unknown")]
    UnknownKey,
    /// The signature does not verify.
    #[error("the token's signature is invalid")]
    Signature,
    /// `exp` is missing or not a number.
    #[error("the token has no expiry")]
    NoExpiry,
    /// `exp` is past.
    #[error("the token has expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("the token is not valid yet")]
    NotYetValid,
    /// `iss` is not the provider's issuer.
    #[error("the token's issuer is not accepted")]
    Issuer,
    /// `aud` names none of the accepted audiences.
    #[error("the token's audience is not accepted")]
    Audience,
    /// A required claim is missing or has no accepted value.
    #[error("the token lacks a required claim")]
    RequiredClaim,
    /// The tenant claim is missing or not a string.
    #[error("the token names no tenant")]
    NoTenant,
    /// The models claim is present but neither a string nor a list of strings.
    #[error("the token's models claim is malformed")]
    ModelsClaim,
}

/// The algorithms infergate accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alg {
    Rs256,
    Es256,
    EdDsa,
}

impl Alg {
    fn parse(s: &str) -> Option<Alg> {
        match s {
            "RS256" => Some(Alg::Rs256),
            "ES256" => Some(Alg::Es256),
            "EdDSA" => Some(Alg::EdDsa),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Alg::Rs256 => "RS256",
            Alg::Es256 => "ES256",
            Alg::EdDsa => "EdDSA",
        }
    }
}

/// A public key of a supported type.
#[derive(Debug, PartialEq, Eq)]
enum PublicKey {
    /// RSA modulus and exponent, big-endian.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// A P-256 point, uncompressed (`04 || x || y`).
    P256(Vec<u8>),
    /// An Ed25519 public key (32 bytes).
    Ed25519(Vec<u8>),
}

impl PublicKey {
    fn alg(&self) -> Alg {
        match self {
            PublicKey::Rsa { .. } => Alg::Rs256,
            PublicKey::P256(_) => Alg::Es256,
            PublicKey::Ed25519(_) => Alg::EdDsa,
        }
    }

    fn verify(&self, message: &[u8], sig: &[u8]) -> bool {
        match self {
            PublicKey::Rsa { n, e } => RsaPublicKeyComponents { n, e }
                .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, sig)
                .is_ok(),
            PublicKey::P256(point) => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(message, sig)
                    .is_ok()
            }
            PublicKey::Ed25519(k) => UnparsedPublicKey::new(&signature::ED25519, k)
                .verify(message, sig)
                .is_ok(),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Key {
    kid: Option<String>,
    key: PublicKey,
}

/// The usable keys of one JWKS document.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct KeySet {
    keys: Vec<Key>,
}

#[derive(Deserialize)]
struct RawSet {
    keys: Vec<RawJwk>,
}

#[derive(Deserialize)]
struct RawJwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default, rename = "use")]
    use_: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

fn b64(s: &Option<String>) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(s.as_deref()?).ok()
}

impl RawJwk {
    /// The key, when it is a signing key of a supported type whose `alg` (if given) agrees.
    fn into_key(self) -> Option<Key> {
        if self.use_.as_deref().is_some_and(|u| u != "sig") {
            return None;
        }
        let key = match (self.kty.as_str(), self.crv.as_deref()) {
            ("RSA", _) => {
                let n = b64(&self.n)?;
                let e = b64(&self.e)?;
                // ring refuses moduli under 2048 bits when verifying; refuse them here too.
                let bits = n.iter().skip_while(|b| **b == 0).count() * 8;
                if bits < 2048 || e.is_empty() {
                    return None;
                }
                PublicKey::Rsa { n, e }
            }
            ("EC", Some("P-256")) => {
                let (x, y) = (b64(&self.x)?, b64(&self.y)?);
                if x.len() != 32 || y.len() != 32 {
                    return None;
                }
                let mut point = Vec::with_capacity(65);
                point.push(4);
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                PublicKey::P256(point)
            }
            ("OKP", Some("Ed25519")) => {
                let x = b64(&self.x)?;
                if x.len() != 32 {
                    return None;
                }
                PublicKey::Ed25519(x)
            }
            _ => return None,
        };
        if self.alg.as_deref().is_some_and(|a| a != key.alg().name()) {
            return None;
        }
        Some(Key { kid: self.kid, key })
    }
}

impl KeySet {
    /// Parses a JWKS document (`{"keys": [...]}`). Keys of other types or uses are skipped.
    pub(crate) fn parse(doc: &[u8]) -> Result<KeySet, serde_json::Error> {
        let raw: RawSet = serde_json::from_slice(doc)?;
        Ok(KeySet {
            keys: raw.keys.into_iter().filter_map(RawJwk::into_key).collect(),
        })
    }

    /// How many usable keys the set has.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether a key with this `kid` is known.
    fn has_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }
}

#[derive(Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    alg: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    kid: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    crit: Option<serde::de::IgnoredAny>,
}

/// A token whose header has been read but whose signature is not yet checked.
pub(crate) struct Unverified<'t> {
    alg: Alg,
    kid: Option<String>,
    signed: &'t [u8],
    payload: &'t str,
    sig: Vec<u8>,
}

impl<'t> Unverified<'t> {
    /// Splits and decodes the token's header. Cheap checks only: no signature yet.
    pub(crate) fn parse(token: &'t str) -> Result<Unverified<'t>, TokenError> {
        let mut parts = token.splitn(4, '.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let header = URL_SAFE_NO_PAD
            .decode(h)
            .map_err(|_| TokenError::Malformed)?;
        let header: Header<'_> =
            serde_json::from_slice(&header).map_err(|_| TokenError::Malformed)?;
        let alg = Alg::parse(&header.alg).ok_or(TokenError::Algorithm)?;
        if header.crit.is_some() {
            return Err(TokenError::Critical);
        }
        let sig = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| TokenError::Malformed)?;
        Ok(Unverified {
            alg,
            kid: header.kid.map(|k| k.into_owned()),
            signed: &token.as_bytes()[..h.len() + 1 + p.len()],
            payload: p,
            sig,
        })
    }

    /// Whether `keys` may hold this token's key: false when the token names a `kid` the set
    /// lacks (a refresh may find it).
    pub(crate) fn key_known(&self, keys: &KeySet) -> bool {
        self.kid.as_deref().is_none_or(|kid| keys.has_kid(kid))
    }

    /// Checks the signature with `keys`, then the claims at time `now` (seconds since the
    /// epoch), and returns the claims.
    pub(crate) fn verify(
        &self,
        keys: &KeySet,
        config: &JwtConfig,
        now: u64,
    ) -> Result<Claims, TokenError> {
        let mut candidates = keys.keys.iter().filter(|k| {
            k.key.alg() == self.alg
                && match &self.kid {
                    Some(kid) => k.kid.as_deref() == Some(kid.as_str()),
                    None => true,
                }
        });
        let mut any = false;
        let verified = candidates.any(|k| {
            any = true;
            k.key.verify(self.signed, &self.sig)
        });
        if !any {
            return Err(TokenError::UnknownKey);
        }
        if !verified {
            return Err(TokenError::Signature);
        }
        let payload = URL_SAFE_NO_PAD
            .decode(self.payload)
            .map_err(|_| TokenError::Malformed)?;
        let claims: serde_json::Map<String, Value> =
            serde_json::from_slice(&payload).map_err(|_| TokenError::Malformed)?;
        check_claims(claims, config, now)
    }
}

/// What a verified token says about its caller.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Claims {
    /// The tenant claim's value.
    pub(crate) tenant: String,
    /// The models claim's values; `None` when no models claim is configured (every model).
    pub(crate) models: Option<Vec<String>>,
}

fn claim<'a>(claims: &'a serde_json::Map<String, Value>, dotted: &str) -> Option<&'a Value> {
    let mut parts = dotted.split('.');
    let mut v = claims.get(parts.next()?)?;
    for p in parts {
        v = v.as_object()?.get(p)?;
    }
    Some(v)
}

fn scalar_eq(v: &Value, want: &str) -> bool {
    match v {
        Value::String(s) => s == want,
        Value::Bool(b) => (if *b { "true" } else { "false" }) == want,
        Value::Number(n) => n.to_string() == want,
        _ => false,
    }
}

fn time_claim(v: Option<&Value>) -> Option<Option<u64>> {
    match v {
        None => Some(None),
        // Fractional seconds are allowed by RFC 7519; negative or absurd values are refused.
        Some(Value::Number(n)) => n
            .as_u64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| *f >= 0.0 && *f < 1e15)
                    .map(|f| f as u64)
            })
            .map(Some),
        Some(_) => None,
    }
}

fn check_claims(
    claims: serde_json::Map<String, Value>,
    config: &JwtConfig,
    now: u64,
) -> Result<Claims, TokenError> {
    let leeway = config.leeway.as_secs();
    let exp = time_claim(claims.get("exp"))
        .flatten()
        .ok_or(TokenError::NoExpiry)?;
    if now >= exp.saturating_add(leeway) {
        return Err(TokenError::Expired);
    }
    let nbf = time_claim(claims.get("nbf")).ok_or(TokenError::NotYetValid)?;
    if nbf.is_some_and(|nbf| nbf > now.saturating_add(leeway)) {
        return Err(TokenError::NotYetValid);
    }
    if claims.get("iss").and_then(Value::as_str) != Some(config.issuer.as_str()) {
        return Err(TokenError::Issuer);
    }
    if !config.audiences.is_empty() {
        let ok = match claims.get("aud") {
            Some(Value::String(a)) => config.audiences.iter().any(|w| w == a),
            Some(Value::Array(list)) => list
                .iter()
                .filter_map(Value::as_str)
                .any(|a| config.audiences.iter().any(|w| w == a)),
            _ => false,
        };
        if !ok {
            return Err(TokenError::Audience);
        }
    }
    for rc in &config.required_claims {
        let ok = match claim(&claims, &rc.name) {
            Some(Value::Array(list)) => list
                .iter()
                .any(|v| rc.values.iter().any(|w| scalar_eq(v, w))),
            Some(v) => rc.values.iter().any(|w| scalar_eq(v, w)),
            None => false,
        };
        if !ok {
            return Err(TokenError::RequiredClaim);
        }
    }
    let tenant = match claim(&claims, &config.tenant_claim) {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err(TokenError::NoTenant),
    };
    let models = match &config.models_claim {
        None => None,
        Some(name) => Some(match claim(&claims, name) {
            // A token without the claim may call nothing: the claim is how access is granted.
            None => Vec::new(),
            Some(Value::String(s)) => s
                .split([' ', ','])
                .filter(|m| !m.is_empty())
                .map(str::to_owned)
                .collect(),
            Some(Value::Array(list)) => list
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or(TokenError::ModelsClaim)?,
            Some(_) => return Err(TokenError::ModelsClaim),
        }),
    };
    Ok(Claims { tenant, models })
}

/// Seconds since the Unix epoch now (0 if the clock is before it).
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d: Duration| d.as_secs())
}

#[cfg(test)]
mod tests;
