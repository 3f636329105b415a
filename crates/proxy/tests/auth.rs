//! The gateway's authentication and authorization end to end: JWTs verified against a JWKS
//! served over real HTTPS (a private CA, `caFile`), API keys inline and from a reloaded file,
//! each refusal with its exact status, and the client's credential never forwarded.
//!
//! Real clock and real sockets; nothing sleeps to let something happen: tests wait on the
//! observable effect with a deadline.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/authkit.rs"]
mod authkit;

use std::net::SocketAddr;
use std::time::Duration;

use authkit::{JwksServer, RecordingUpstream, TestKey, hs256, jwks, now, unsigned};
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use infergate_proxy::{Gateway, GatewayConfig, Listeners, serve};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const ISSUER: &str = "https://issuer.test";
const KEY_A: &str = "sk-test-team-a-0123456789";
const KEY_FILE_B: &str = "sk-test-team-b-from-file";
const KEY_FILE_C: &str = "sk-test-team-c-from-file";

fn sha256_hex(key: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn key_file(entries: &[(&str, &str, &str)]) -> String {
    let mut s = String::from("keys:\n");
    for (key, tenant, models) in entries {
        s.push_str(&format!(
            "  - {{ sha256: {}, tenant: {tenant}, models: [{models}] }}\n",
            sha256_hex(key)
        ));
    }
    s
}

struct Fixture {
    gw: Gateway,
    stop: Option<oneshot::Sender<()>>,
    jwks: JwksServer,
    up: RecordingUpstream,
    dir: tempfile::TempDir,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl Fixture {
    fn addr(&self) -> SocketAddr {
        self.gw.http_addr()
    }

    /// POSTs a chat request for `model` with these headers; status, headers, body.
    async fn chat(&self, model: &str, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap, String) {
        let body =
            format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
        let mut b =
            Request::post("/v1/chat/completions").header("content-type", "application/json");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let r = infergate_testkit::send(self.addr(), b.body(Bytes::from(body)).unwrap())
            .await
            .unwrap();
        let text = r.text();
        (r.status, r.headers, text)
    }

    async fn bearer(&self, model: &str, credential: &str) -> (StatusCode, HeaderMap, String) {
        let v = format!("Bearer {credential}");
        self.chat(model, &[("authorization", &v)]).await
    }

    async fn status(&self, model: &str, credential: &str) -> StatusCode {
        self.bearer(model, credential).await.0
    }

    /// `GET /v1/models` with `credential`: status and the listed ids.
    async fn models(&self, credential: &str) -> (StatusCode, Vec<String>) {
        let req = Request::get("/v1/models")
            .header("authorization", format!("Bearer {credential}"))
            .body(Bytes::new())
            .unwrap();
        let r = infergate_testkit::send(self.addr(), req).await.unwrap();
        let v: Value = serde_json::from_str(&r.text()).unwrap();
        let ids = v["data"]
            .as_array()
            .map(|d| {
                d.iter()
                    .map(|m| m["id"].as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        (r.status, ids)
    }

    async fn metrics(&self) -> String {
        infergate_testkit::get(self.gw.admin_addr().unwrap(), "/metrics")
            .await
            .text()
    }
}

/// The gateway with JWT (`jwt_extra` appended to its section) and API keys (inline key A for
/// model `m`, key B from the file for every model), once ready.
async fn start(keys: &[&TestKey], jwt_extra: &str) -> Fixture {
    let f = start_with(keys, jwt_extra, Jwks::Serving, ApiKeys::Configured).await;
    wait_ready(&f.gw).await;
    f
}

/// What the JWKS server answers from the start.
enum Jwks {
    Serving,
    /// 404 to every fetch (a wrong path, a provider down behind its proxy).
    NotFound,
}

/// Whether `auth.apiKeys` is configured beside `auth.jwt`.
enum ApiKeys {
    Configured,
    None,
}

async fn wait_ready(gw: &Gateway) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !gw.handle().is_ready() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gateway never ready"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// [`start`] without waiting for readiness, the JWKS server answering as `jwks_status` says,
/// with API keys or not.
async fn start_with(
    keys: &[&TestKey],
    jwt_extra: &str,
    jwks_status: Jwks,
    api_keys: ApiKeys,
) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let jwks = JwksServer::start(dir.path(), jwks(keys)).await;
    if let Jwks::NotFound = jwks_status {
        jwks.set_status(404);
    }
    let up = RecordingUpstream::start().await;
    let other = RecordingUpstream::start().await;
    let key_path = dir.path().join("keys.yaml");
    std::fs::write(&key_path, key_file(&[(KEY_FILE_B, "team-b", "\"*\"")])).unwrap();
    let api_keys = match api_keys {
        ApiKeys::None => String::new(),
        ApiKeys::Configured => format!(
            "  apiKeys:
    keys: [{{ sha256: {a}, tenant: team-a, models: [m] }}]
    file: \"{file}\"
    pollIntervalMs: 20
",
            a = sha256_hex(KEY_A),
            file = key_path.display(),
        ),
    };
    let yaml = format!(
        "auth:
  jwt:
    issuer: {ISSUER}
    remoteJWKS: {{ uri: \"{uri}\", caFile: \"{ca}\" }}
    audiences: [infergate]
    requiredClaims: [{{ name: org.team, values: [ml, research] }}]
    modelsClaim: models
{jwt_extra}{api_keys}models:
  - name: m
    loraAdapters: [m-lora]
    scheduler: {{ preset: round-robin }}
    endpoints: [{up}]
  - name: other
    scheduler: {{ preset: round-robin }}
    endpoints: [{other}]
",
        uri = jwks.uri,
        ca = jwks.ca_file.display(),
        up = up.addr,
        other = other.addr,
    );
    let config = GatewayConfig::from_yaml(&yaml).unwrap();
    let listeners = Listeners {
        http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        admin: Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
    };
    let (tx, rx) = oneshot::channel::<()>();
    let gw = serve(config, listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    std::mem::forget(other);
    Fixture {
        gw,
        stop: Some(tx),
        jwks,
        up,
        dir,
    }
}

fn claims() -> Value {
    json!({
        "iss": ISSUER,
        "aud": "infergate",
        "sub": "team-jwt",
        "org": { "team": "ml" },
        "models": ["m"],
        "iat": now(),
        "exp": now() + 600,
    })
}

fn with(mut c: Value, key: &str, v: Value) -> Value {
    c[key] = v;
    c
}

fn without(mut c: Value, key: &str) -> Value {
    c.as_object_mut().unwrap().remove(key);
    c
}

/// Asserts a 401 that challenges for a bearer token and does not repeat `credential`.
fn assert_401(r: &(StatusCode, HeaderMap, String), credential: &str, reason: &str) {
    assert_eq!(r.0, StatusCode::UNAUTHORIZED, "{}", r.2);
    assert_eq!(r.1["www-authenticate"], r#"Bearer realm="infergate""#);
    let v: Value = serde_json::from_str(&r.2).unwrap();
    assert_eq!(v["error"]["code"], "unauthorized");
    assert_eq!(v["error"]["type"], "authentication_error");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(reason), "{msg}");
    if !credential.is_empty() {
        assert!(!r.2.contains(credential), "the body repeats the credential");
        // Not even a recognisable piece of it.
        let piece = &credential[credential.len().saturating_sub(16)..];
        assert!(
            !r.2.contains(piece),
            "the body repeats part of the credential"
        );
    }
}

#[tokio::test]
async fn jwt_cases_each_get_their_exact_status() {
    let es = TestKey::es256("es-1");
    let rsa = TestKey::rs256("rsa-1");
    let ed = TestKey::ed25519("ed-1");
    let f = start(&[&es, &rsa, &ed], "").await;

    // Valid tokens, one per algorithm: 200.
    for k in [&es, &rsa, &ed] {
        let r = f.bearer("m", &k.sign(&claims())).await;
        assert_eq!(r.0, StatusCode::OK, "{}: {}", k.alg(), r.2);
    }
    // An adapter counts as its base model.
    assert_eq!(
        f.status("m-lora", &es.sign(&claims())).await,
        StatusCode::OK
    );

    let cases: Vec<(&str, String, &str)> = vec![
        (
            "expired",
            es.sign(&with(claims(), "exp", json!(now() - 120))),
            "expired",
        ),
        (
            "not yet valid",
            es.sign(&with(claims(), "nbf", json!(now() + 120))),
            "not valid yet",
        ),
        (
            "wrong issuer",
            es.sign(&with(claims(), "iss", json!("https://evil.test"))),
            "issuer",
        ),
        (
            "wrong audience",
            es.sign(&with(claims(), "aud", json!(["someone-else"]))),
            "audience",
        ),
        (
            "missing required claim",
            es.sign(&without(claims(), "org")),
            "required claim",
        ),
        (
            "required claim with another value",
            es.sign(&with(claims(), "org", json!({"team": "web"}))),
            "required claim",
        ),
        ("no expiry", es.sign(&without(claims(), "exp")), "no expiry"),
        ("alg none", unsigned("es-1", &claims()), "algorithm"),
        (
            "HS256 signed with the RSA public key",
            hs256("rsa-1", &rsa.public_der(), &claims()),
            "algorithm",
        ),
        (
            "RS256 header on an ES256 key id",
            es.sign_with(json!({"alg": "RS256"}), &claims()),
            "signing key is unknown",
        ),
        (
            "signed by a key not in the set, under a known kid",
            TestKey::es256("es-1").sign(&claims()),
            "signature is invalid",
        ),
        (
            "garbage in a JWT's shape",
            "!!!.@@@.###".to_owned(),
            "not a well-formed JWT",
        ),
        (
            "oversized token",
            format!(
                "{}.{}.{}",
                "a".repeat(4000),
                "b".repeat(4000),
                "c".repeat(400)
            ),
            "longer than the limit",
        ),
    ];
    for (name, token, reason) in &cases {
        let r = f.bearer("m", token).await;
        assert_eq!(r.0, StatusCode::UNAUTHORIZED, "{name}: {}", r.2);
        assert_401(&r, token, reason);
    }

    // Another scheme, no credential, an empty one: 401.
    let r = f
        .chat("m", &[("authorization", "Basic dXNlcjpwYXNz")])
        .await;
    assert_401(&r, "dXNlcjpwYXNz", "Bearer <credential>");
    let r = f.chat("m", &[]).await;
    assert_401(&r, "", "no credential");
    let r = f.chat("m", &[("authorization", "Bearer ")]).await;
    assert_401(&r, "", "empty");

    // Authenticated, but the token's models claim does not list the model: 403.
    let r = f.bearer("other", &es.sign(&claims())).await;
    assert_eq!(r.0, StatusCode::FORBIDDEN, "{}", r.2);
    let v: Value = serde_json::from_str(&r.2).unwrap();
    assert_eq!(v["error"]["code"], "forbidden");
    assert_eq!(
        v["error"]["message"],
        "tenant `team-jwt` may not call the model `other`"
    );
    // A token without the configured models claim may call nothing.
    assert_eq!(
        f.status("m", &es.sign(&without(claims(), "models"))).await,
        StatusCode::FORBIDDEN
    );

    // Only the good requests reached the model server, without the client's credential.
    assert_eq!(f.up.requests.load(std::sync::atomic::Ordering::SeqCst), 4);
    assert!(f.up.credentials.lock().unwrap().is_empty());

    let m = f.metrics().await;
    let unauthorized = cases.len() + 3;
    assert!(
        m.contains(&format!(
            r#"infergate_gateway_rejections_total{{reason="unauthorized"}} {unauthorized}"#
        )),
        "{m}"
    );
    assert!(
        m.contains(r#"infergate_gateway_rejections_total{reason="forbidden"} 2"#),
        "{m}"
    );
}

#[tokio::test]
async fn an_unknown_kid_refreshes_the_key_set_and_a_rotated_key_works_without_restart() {
    let old = TestKey::es256("2026-old");
    let new = TestKey::ed25519("2026-new");
    let f = start(&[&old], "    jwksMinRefreshIntervalMs: 200\n").await;
    assert_eq!(f.status("m", &old.sign(&claims())).await, StatusCode::OK);
    // The issuer has not published the new key yet.
    let r = f.bearer("m", &new.sign(&claims())).await;
    assert_401(&r, "", "signing key is unknown");

    // Rotation: the set now holds only the new key.
    f.jwks.set(jwks(&[&new]));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = f.status("m", &new.sign(&claims())).await;
        if s == StatusCode::OK {
            break;
        }
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rotated key was never picked up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The fetch that found the new key dropped the old one.
    assert_eq!(
        f.status("m", &old.sign(&claims())).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(f.up.requests.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn unknown_kids_cause_at_most_one_fetch_per_window() {
    let k = TestKey::es256("k");
    // The default window, 10 s: longer than this test.
    let f = start(&[&k], "").await;
    assert_eq!(f.status("m", &k.sign(&claims())).await, StatusCode::OK);
    let after_start = f.jwks.fetches();
    assert_eq!(after_start, 1);
    for i in 0..20 {
        let forged = TestKey::es256(&format!("made-up-{i}"));
        assert_eq!(
            f.status("m", &forged.sign(&claims())).await,
            StatusCode::UNAUTHORIZED
        );
    }
    // The startup fetch opened the window: none of the twenty caused another.
    assert_eq!(f.jwks.fetches(), 1);
}

/// Waits until every model has a pod routed on (the pools are ready, whatever authentication
/// says).
async fn wait_pods_ready(f: &Fixture) {
    let admin = f.gw.admin_addr().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let v: Value =
            serde_json::from_str(&infergate_testkit::get(admin, "/heartbeat").await.text())
                .unwrap();
        let models = v["models"].as_array().unwrap();
        if !models.is_empty() && models.iter().all(|m| m["readyPods"].as_u64() >= Some(1)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pods never ready: {v}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Asserts a 503 `auth_unavailable` whose `Retry-After` is within `retry` and whose body names
/// no address of the key set.
fn assert_auth_unavailable(
    r: &(StatusCode, HeaderMap, String),
    retry: std::ops::RangeInclusive<u64>,
    jwks_uri: &str,
) {
    assert_eq!(r.0, StatusCode::SERVICE_UNAVAILABLE, "{}", r.2);
    assert!(r.1.get("www-authenticate").is_none(), "{:?}", r.1);
    let after: u64 = r.1["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry.contains(&after), "Retry-After {after}");
    let v: Value = serde_json::from_str(&r.2).unwrap();
    assert_eq!(v["error"]["code"], "auth_unavailable");
    assert_eq!(v["error"]["type"], "server_error");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("cannot verify tokens yet") && msg.contains("could not be fetched"),
        "{msg}"
    );
    assert!(
        !r.2.contains(jwks_uri) && !r.2.contains("127.0.0.1"),
        "{}",
        r.2
    );
}

#[tokio::test]
async fn with_no_key_set_ever_fetched_a_good_token_is_503_and_jwt_alone_is_not_ready() {
    let k = TestKey::es256("k");
    let f = start_with(
        &[&k],
        "    jwksMinRefreshIntervalMs: 200\n",
        Jwks::NotFound,
        ApiKeys::None,
    )
    .await;
    let token = k.sign(&claims());
    wait_pods_ready(&f).await;
    // A correctly signed token, nothing to check it against: the provider's failure, not the
    // client's, so 503 to retry rather than 401.
    let r = f.bearer("m", &token).await;
    assert_auth_unavailable(&r, 1..=1, &f.jwks.uri);
    // What is wrong with a token whatever the keys is still the client's fault.
    assert_401(
        &f.bearer("m", "!!!.@@@.###").await,
        "",
        "not a well-formed JWT",
    );
    // Every model has a pod, but JWTs are the only way in and none can be verified.
    let admin = f.gw.admin_addr().unwrap();
    let r = infergate_testkit::get(admin, "/readyz").await;
    assert_eq!(r.status, 503);
    assert_eq!(
        r.text(),
        "not ready\nauth: jwks-not-fetched: JWTs are the only credential accepted and no signing \
         key set has been fetched yet\n"
    );
    assert!(!f.gw.handle().is_ready());

    // The provider answers again: the key set is fetched without waiting for a request (or for
    // `jwksRefreshIntervalMs`, 5 min), the gateway turns ready and the token is served.
    f.jwks.set_status(200);
    wait_ready(&f.gw).await;
    assert_eq!(infergate_testkit::get(admin, "/readyz").await.status, 200);
    assert_eq!(f.status("m", &token).await, StatusCode::OK);
    // A key id the fetched set lacks is the token's fault again: 401.
    let r = f
        .bearer("m", &TestKey::es256("made-up").sign(&claims()))
        .await;
    assert_401(&r, "", "signing key is unknown");

    assert_eq!(f.up.requests.load(std::sync::atomic::Ordering::SeqCst), 1);
    let m = f.metrics().await;
    assert!(
        m.contains(r#"infergate_gateway_rejections_total{reason="auth_unavailable"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"infergate_gateway_rejections_total{reason="unauthorized"} 2"#),
        "{m}"
    );
}

#[tokio::test]
async fn with_api_keys_beside_jwt_an_unfetched_key_set_keeps_the_gateway_ready() {
    let k = TestKey::es256("k");
    let f = start_with(&[&k], "", Jwks::NotFound, ApiKeys::Configured).await;
    // Ready: key holders can be served.
    wait_ready(&f.gw).await;
    assert_eq!(f.status("m", KEY_A).await, StatusCode::OK);
    // A token waits for no fetch: the one at start opened a window of 10 s (the default
    // `jwksMinRefreshIntervalMs`), which `Retry-After` does not exceed.
    let r = f.bearer("m", &k.sign(&claims())).await;
    assert_auth_unavailable(&r, 1..=10, &f.jwks.uri);
    assert_eq!(f.jwks.fetches(), 1);
}

#[tokio::test]
async fn the_model_list_and_an_unknown_model_s_404_show_only_what_the_caller_may_call() {
    let k = TestKey::es256("k");
    let f = start(&[&k], "").await;
    // Key A (team-a) may call `m`, and so its adapter; key B (team-b) every model.
    let (status, ids) = f.models(KEY_A).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ids, ["m", "m-lora"]);
    let (status, ids) = f.models(KEY_FILE_B).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ids, ["m", "m-lora", "other"]);
    // A token's models claim, the same way; a token without it may call nothing.
    assert_eq!(f.models(&k.sign(&claims())).await.1, ["m", "m-lora"]);
    let (status, ids) = f.models(&k.sign(&without(claims(), "models"))).await;
    assert_eq!((status, ids.len()), (StatusCode::OK, 0));
    // No credential: 401, no list.
    let (status, ids) = f.models("").await;
    assert_eq!((status, ids.len()), (StatusCode::UNAUTHORIZED, 0));

    // An unknown model's 404 lists what the caller may call, nothing else.
    let (status, _, body) = f.bearer("nope", KEY_A).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("(m, m-lora)"), "{msg}");
    assert!(!msg.contains("other"), "{msg}");
    let (status, _, body) = f.bearer("nope", KEY_FILE_B).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains("(m, m-lora, other)"), "{body}");
    let (_, _, body) = f
        .bearer("nope", &k.sign(&without(claims(), "models")))
        .await;
    assert!(body.contains("(none that this caller may use)"), "{body}");
    // A served model the caller may not call stays a 403.
    assert_eq!(f.status("other", KEY_A).await, StatusCode::FORBIDDEN);

    // One model (`GET /v1/models/{id}`): the entry of a model the caller may call; one it may
    // not call is not shown (404 listing what it may call), nor is an unknown one; HEAD is GET
    // without the body.
    let retrieve = |method: &'static str, path: &'static str, credential: &'static str| {
        let addr = f.addr();
        async move {
            let req = Request::builder()
                .method(method)
                .uri(path)
                .header("authorization", format!("Bearer {credential}"))
                .body(Bytes::new())
                .unwrap();
            let r = infergate_testkit::send(addr, req).await.unwrap();
            (r.status, r.text())
        }
    };
    let (status, body) = retrieve("GET", "/v1/models/m-lora", KEY_A).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["id"].as_str(), v["root"].as_str()),
        (Some("m-lora"), Some("m"))
    );
    assert_eq!(v["object"], "model");
    let (status, body) = retrieve("HEAD", "/v1/models/m", KEY_A).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    for (path, key) in [("/v1/models/other", KEY_A), ("/v1/models/nope", KEY_FILE_B)] {
        let (status, body) = retrieve("GET", path, key).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found", "{body}");
        // A retrieve has no body: nothing about a `model` field to set.
        assert_eq!(v["error"]["param"], Value::Null, "{body}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("ask for one of the served models")),
            "{body}"
        );
    }
    let (_, body) = retrieve("GET", "/v1/models/other", KEY_A).await;
    assert!(
        body.contains("(m, m-lora)") && !body.contains("other)"),
        "{body}"
    );
    assert_eq!(
        retrieve("GET", "/v1/models/other", KEY_FILE_B).await.0,
        StatusCode::OK
    );
    assert_eq!(
        retrieve("GET", "/v1/models/m", "").await.0,
        StatusCode::UNAUTHORIZED
    );
}

/// `OPTIONS` on an API path is answered without credentials (a browser's preflight carries
/// none, and the answer depends on the path alone); on any other path it is authenticated like
/// every request, so an anonymous caller learns nothing it could not read in the OpenAI API.
#[tokio::test]
async fn options_on_an_api_path_needs_no_credential_and_reveals_nothing() {
    let k = TestKey::es256("k");
    let f = start(&[&k], "").await;
    for (path, allow) in [
        ("/v1/chat/completions", "POST, OPTIONS"),
        ("/v1/models/other", "GET, HEAD, OPTIONS"),
        ("/v1/models/no-such-model", "GET, HEAD, OPTIONS"),
    ] {
        let req = http::Request::options(path).body(Bytes::new()).unwrap();
        let r = infergate_testkit::send(f.addr(), req).await.unwrap();
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{path}: {}", r.text());
        assert_eq!(r.headers["allow"], allow, "{path}");
        assert!(r.body.is_empty(), "{path}");
    }
    let req = http::Request::options("/v2/whatever")
        .body(Bytes::new())
        .unwrap();
    let r = infergate_testkit::send(f.addr(), req).await.unwrap();
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
}

#[tokio::test]
async fn api_keys_inline_and_from_a_reloaded_file() {
    let k = TestKey::es256("k");
    let f = start(&[&k], "").await;

    // Inline key A: model `m` (and its adapter), not `other`.
    assert_eq!(f.status("m", KEY_A).await, StatusCode::OK);
    assert_eq!(f.status("m-lora", KEY_A).await, StatusCode::OK);
    let r = f.bearer("other", KEY_A).await;
    assert_eq!(r.0, StatusCode::FORBIDDEN, "{}", r.2);
    assert!(
        r.2.contains("tenant `team-a` may not call the model `other`"),
        "{}",
        r.2
    );
    assert!(!r.2.contains(KEY_A));
    // The file's key B: every model.
    assert_eq!(f.status("other", KEY_FILE_B).await, StatusCode::OK);
    // Unknown keys, including one that differs from A by its last character.
    for bad in ["sk-nobody", &KEY_A.replace('9', "8"), KEY_FILE_C] {
        let r = f.bearer("m", bad).await;
        assert_401(&r, bad, "API key is not known");
    }
    // `x-api-key` is not a credential here (and is not forwarded either); the 401 says that it
    // was seen and not read, rather than that the request carried no credential.
    let r = f.chat("m", &[("x-api-key", KEY_A)]).await;
    assert_401(
        &r,
        KEY_A,
        "the credential is in `x-api-key`, which the gateway does not read",
    );

    // The file changes on disk: B goes, C comes, without a restart.
    let path = f.dir.path().join("keys.yaml");
    std::fs::write(&path, key_file(&[(KEY_FILE_C, "team-c", "other")])).unwrap();
    wait_for(&f, "other", KEY_FILE_C, StatusCode::OK).await;
    assert_eq!(
        f.status("other", KEY_FILE_B).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(f.status("m", KEY_FILE_C).await, StatusCode::FORBIDDEN);
    // Inline keys are unaffected.
    assert_eq!(f.status("m", KEY_A).await, StatusCode::OK);

    // A broken file is refused and the keys in force stay.
    std::fs::write(
        &path,
        "keys: [{ sha256: not-a-hash, tenant: x, models: [m] }]\n",
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(f.status("other", KEY_FILE_C).await, StatusCode::OK);

    // Upstream never saw a credential: the client's Authorization is stripped.
    let both = format!("Bearer {KEY_A}");
    let r = f
        .chat("m", &[("authorization", &both), ("x-api-key", "sk-extra")])
        .await;
    assert_eq!(r.0, StatusCode::OK, "{}", r.2);
    assert!(
        f.up.credentials.lock().unwrap().is_empty(),
        "{:?}",
        f.up.credentials.lock().unwrap()
    );
}

async fn wait_for(f: &Fixture, model: &str, key: &str, want: StatusCode) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if f.status(model, key).await == want {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "never got {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_config_without_auth_is_refused_and_auth_none_forwards_the_client_header() {
    let e = GatewayConfig::from_yaml("models:\n  - name: m\n").unwrap_err();
    assert!(e.to_string().contains("write `auth: none`"), "{e}");

    // With `auth: none` the gateway does not own the header: it reaches the model server.
    let up = RecordingUpstream::start().await;
    let config = GatewayConfig::from_yaml(&format!(
        "auth: none\nmodels:\n  - name: m\n    scheduler: {{ preset: round-robin }}\n    endpoints: [{}]\n",
        up.addr
    ))
    .unwrap();
    let listeners = Listeners {
        http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        admin: None,
    };
    let (_tx, rx) = oneshot::channel::<()>();
    let gw = serve(config, listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let req = Request::post("/v1/chat/completions")
        .header("authorization", "Bearer upstream-token")
        .body(Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        ))
        .unwrap();
    let r = infergate_testkit::send(gw.http_addr(), req).await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        *up.credentials.lock().unwrap(),
        vec!["authorization: Bearer upstream-token".to_owned()]
    );
}

#[tokio::test]
async fn a_jwks_uri_without_https_or_an_unreadable_ca_file_is_refused() {
    let e = GatewayConfig::from_yaml(
        "auth:\n  jwt:\n    issuer: i\n    remoteJWKS: { uri: \"http://127.0.0.1:1/jwks\" }\nmodels:\n  - name: m\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("https://"), "{e}");
    let config = GatewayConfig::from_yaml(
        "auth:\n  jwt:\n    issuer: i\n    remoteJWKS: { uri: \"https://127.0.0.1:1/jwks\", caFile: /nonexistent/ca.pem }\nmodels:\n  - name: m\n",
    )
    .unwrap();
    let listeners = Listeners {
        http: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        admin: None,
    };
    let err = serve(config, listeners, std::future::pending::<()>())
        .await
        .err()
        .unwrap();
    // The cause is in the error's chain, not repeated in its own message.
    let err = infergate_pool::ErrorChain(&err).to_string();
    assert!(
        err.contains("caFile") && err.contains("/nonexistent/ca.pem"),
        "{err}"
    );
}

/// The first JWKS fetch's failure is logged with its cause, as the later retries' are: it said
/// only `cannot connect to the JWKS server`, which left the reason (refused, a certificate the
/// gateway does not trust) to the retry a second later.
#[tokio::test(flavor = "current_thread")]
async fn the_first_jwks_fetch_s_failure_is_logged_with_its_cause() {
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let dir = tempfile::tempdir().unwrap();
    let ca = infergate_testkit::tls::TestCa::new("jwks CA").write_ca(dir.path());
    // Nothing listens on port 1.
    let config = GatewayConfig::from_yaml(&format!(
        "auth:\n  jwt:\n    issuer: i\n    remoteJWKS: {{ uri: \"https://127.0.0.1:1/jwks\", caFile: \"{}\" }}\nmodels:\n  - name: m\n",
        ca.display()
    ))
    .unwrap();
    let _auth = infergate_proxy::auth::Authenticator::new(&config.auth).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let line = loop {
        let text = out.text();
        if let Some(l) = text.lines().find(|l| l.contains("JWKS fetch failed")) {
            break l.to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no failed fetch logged: {text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        line.contains("cannot connect to the JWKS server") && line.contains("refused"),
        "{line}"
    );
}
