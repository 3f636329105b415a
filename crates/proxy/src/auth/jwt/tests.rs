use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::json;

use super::*;
use crate::config::auth::{RemoteJwksConfig, RequiredClaimConfig};

fn config() -> JwtConfig {
    JwtConfig {
        issuer: "https://issuer".into(),
        remote_jwks: RemoteJwksConfig {
            uri: "https://issuer/jwks".into(),
            ca_file: None,
        },
        audiences: vec!["gw".into()],
        required_claims: vec![RequiredClaimConfig {
            name: "org.team".into(),
            values: vec!["ml".into()],
        }],
        tenant_claim: "sub".into(),
        models_claim: Some("models".into()),
        leeway: Duration::from_secs(30),
        refresh_interval: Duration::from_secs(300),
        min_refresh_interval: Duration::from_secs(10),
        fetch_timeout: Duration::from_secs(5),
    }
}

fn key() -> (Ed25519KeyPair, KeySet) {
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let x = URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
    let doc = json!({"keys": [
        {"kty": "OKP", "crv": "Ed25519", "kid": "k1", "x": x},
        {"kty": "oct", "k": "c2VjcmV0"},
        {"kty": "RSA", "kid": "small", "n": "AQAB", "e": "AQAB"},
    ]});
    let set = KeySet::parse(doc.to_string().as_bytes()).unwrap();
    (pair, set)
}

fn sign(pair: &Ed25519KeyPair, header: serde_json::Value, claims: serde_json::Value) -> String {
    let h = URL_SAFE_NO_PAD.encode(header.to_string());
    let p = URL_SAFE_NO_PAD.encode(claims.to_string());
    let sig = pair.sign(format!("{h}.{p}").as_bytes());
    format!("{h}.{p}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
}

const NOW: u64 = 1_800_000_000;

fn good_claims() -> serde_json::Value {
    json!({"iss": "https://issuer", "aud": ["other", "gw"], "sub": "team-a", "exp": NOW + 60,
           "org": {"team": "ml"}, "models": "llama, qwen"})
}

fn check(token: &str, keys: &KeySet) -> Result<Claims, TokenError> {
    Unverified::parse(token)?.verify(keys, &config(), NOW)
}

#[test]
fn only_supported_signing_keys_of_at_least_2048_bits_are_kept() {
    let (_, set) = key();
    assert_eq!(set.len(), 1);
}

#[test]
fn a_good_token_gives_its_tenant_and_models() {
    let (pair, set) = key();
    let t = sign(&pair, json!({"alg": "EdDSA", "kid": "k1"}), good_claims());
    let c = check(&t, &set).unwrap();
    assert_eq!(c.tenant, "team-a");
    assert_eq!(c.models, Some(vec!["llama".to_owned(), "qwen".to_owned()]));
}

#[test]
fn each_claim_check_refuses_with_its_own_reason() {
    let (pair, set) = key();
    let h = json!({"alg": "EdDSA", "kid": "k1"});
    let with = |k: &str, v: serde_json::Value| {
        let mut c = good_claims();
        c[k] = v;
        check(&sign(&pair, h.clone(), c), &set)
    };
    assert_eq!(with("exp", json!(NOW - 31)), Err(TokenError::Expired));
    // Within the 30 s leeway.
    assert!(with("exp", json!(NOW - 29)).is_ok());
    assert_eq!(with("exp", json!("soon")), Err(TokenError::NoExpiry));
    assert_eq!(with("nbf", json!(NOW + 31)), Err(TokenError::NotYetValid));
    assert!(with("nbf", json!(NOW + 29)).is_ok());
    assert_eq!(with("iss", json!("https://evil")), Err(TokenError::Issuer));
    assert_eq!(with("aud", json!("other")), Err(TokenError::Audience));
    assert_eq!(
        with("org", json!({"team": "web"})),
        Err(TokenError::RequiredClaim)
    );
    assert_eq!(with("sub", json!(7)), Err(TokenError::NoTenant));
    assert_eq!(
        with("models", json!({"a": 1})),
        Err(TokenError::ModelsClaim)
    );
}

#[test]
fn algorithms_are_bound_to_key_types_and_none_is_refused() {
    let (pair, set) = key();
    let t = sign(&pair, json!({"alg": "none", "kid": "k1"}), good_claims());
    assert_eq!(check(&t, &set).err(), Some(TokenError::Algorithm));
    let t = sign(&pair, json!({"alg": "HS256", "kid": "k1"}), good_claims());
    assert_eq!(check(&t, &set).err(), Some(TokenError::Algorithm));
    // An Ed25519 signature presented as ES256 finds no EC key.
    let t = sign(&pair, json!({"alg": "ES256", "kid": "k1"}), good_claims());
    assert_eq!(check(&t, &set).err(), Some(TokenError::UnknownKey));
    let t = sign(
        &pair,
        json!({"alg": "EdDSA", "kid": "k1", "crit": ["x"]}),
        good_claims(),
    );
    assert_eq!(check(&t, &set).err(), Some(TokenError::Critical));
    let t = sign(&pair, json!({"alg": "EdDSA", "kid": "k2"}), good_claims());
    let u = Unverified::parse(&t).unwrap();
    assert!(!u.key_known(&set));
    // A flipped signature byte.
    let mut t = sign(&pair, json!({"alg": "EdDSA"}), good_claims()).into_bytes();
    let last = t.len() - 2;
    t[last] = if t[last] == b'A' { b'B' } else { b'A' };
    let t = String::from_utf8(t).unwrap();
    assert_eq!(check(&t, &set).err(), Some(TokenError::Signature));
    assert_eq!(check("a.b", &set).err(), Some(TokenError::Malformed));
    assert_eq!(check("%%%.b.c", &set).err(), Some(TokenError::Malformed));
}
