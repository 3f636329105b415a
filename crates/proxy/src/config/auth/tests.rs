use super::*;
use crate::config::GatewayConfig;

const MODELS: &str = "models:\n  - name: m\n    endpoints: [127.0.0.1:8001]\n";

fn parse(auth: &str) -> Result<GatewayConfig, String> {
    GatewayConfig::from_yaml(&format!("{auth}{MODELS}")).map_err(|e| e.to_string())
}

#[test]
fn a_file_without_auth_is_refused_with_the_way_out() {
    let e = parse("").unwrap_err();
    assert!(e.contains("`auth` is required"), "{e}");
    assert!(e.contains("auth: none"), "{e}");
}

#[test]
fn auth_none_is_explicit() {
    assert_eq!(parse("auth: none\n").unwrap().auth, AuthConfig::None);
    let e = parse("auth: off\n").unwrap_err();
    assert!(e.contains("write `none`"), "{e}");
    let e = parse("auth: {}\n").unwrap_err();
    assert!(e.contains("needs `jwt`, `apiKeys` or both"), "{e}");
}

const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

#[test]
fn a_jwt_provider_in_the_crd_shape_parses_with_defaults() {
    let c = parse(
        "auth:\n  jwt:\n    issuer: https://issuer.example\n    remoteJWKS: { uri: https://issuer.example/jwks.json }\n    audiences: [infergate]\n    requiredClaims: [{ name: org.team, values: [ml] }]\n",
    )
    .unwrap();
    let AuthConfig::Required(s) = c.auth else {
        panic!("auth is on")
    };
    let j = s.jwt.unwrap();
    assert_eq!(j.tenant_claim, "sub");
    assert_eq!(j.models_claim, None);
    assert_eq!(j.leeway, Duration::from_secs(30));
    assert_eq!(j.refresh_interval, Duration::from_secs(300));
    assert_eq!(j.min_refresh_interval, Duration::from_secs(10));
    assert_eq!(j.required_claims[0].name, "org.team");
    assert_eq!(s.max_token_bytes, 8192);
    assert!(s.api_keys.is_none());
}

#[test]
fn a_jwks_uri_must_be_https() {
    let e = parse(
        "auth:\n  jwt:\n    issuer: i\n    remoteJWKS: { uri: http://issuer.example/jwks.json }\n",
    )
    .unwrap_err();
    assert!(e.contains("must be an `https://` URI"), "{e}");
    let e = parse(
        "auth:\n  jwt:\n    issuer: i\n    remoteJWKS: { uri: https://issuer.example/jwks.json }\n    jwksMinRefreshIntervalMs: 0\n",
    )
    .unwrap_err();
    assert!(e.contains("at least 100"), "{e}");
}

#[test]
fn api_keys_are_hashes_never_keys() {
    let c = parse(&format!(
        "auth:\n  apiKeys:\n    keys: [{{ sha256: {HASH}, tenant: a, models: [m] }}]\n"
    ))
    .unwrap();
    let AuthConfig::Required(s) = c.auth else {
        panic!("auth is on")
    };
    let k = &s.api_keys.unwrap().keys[0];
    assert_eq!(k.sha256[0], 0x9f);
    assert_eq!(k.sha256[31], 0x08);
    let e =
        parse("auth:\n  apiKeys:\n    keys: [{ sha256: sk-live-123, tenant: a, models: [m] }]\n")
            .unwrap_err();
    assert!(e.contains("64 hex digits"), "{e}");
    // The message never repeats what was written (it might be the key itself).
    assert!(!e.contains("sk-live-123"), "{e}");
    let e = parse(&format!(
        "auth:\n  apiKeys:\n    keys: [{{ sha256: {HASH}, tenant: a, models: [m] }}, {{ sha256: {HASH}, tenant: b, models: [m] }}]\n"
    ))
    .unwrap_err();
    assert!(e.contains("listed twice"), "{e}");
    let e = parse(&format!(
        "auth:\n  apiKeys:\n    keys: [{{ sha256: {HASH}, tenant: a, models: [] }}]\n"
    ))
    .unwrap_err();
    assert!(e.contains("at least one model"), "{e}");
}
