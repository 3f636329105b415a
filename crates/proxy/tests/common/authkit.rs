//! Test parts for the gateway's authentication: a JWKS served over real HTTPS by a private CA
//! (`infergate_testkit::tls::TestCa`), signing keys (ES256 and Ed25519 generated here, RS256 from
//! a committed test-only key), tokens signed in the test, and a model server that records the
//! `Authorization` it receives.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    dead_code,
    reason = "test helpers: a failure is a failed test"
)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// The committed RSA key (2048 bits, test-only, generated with `openssl genpkey -algorithm RSA
/// -pkeyopt rsa_keygen_bits:2048`).
const RSA_PEM: &str = include_str!("rsa-test-key.pem");

/// A signing key with its JWK.
pub enum Signer {
    Es256(EcdsaKeyPair),
    Ed25519(Ed25519KeyPair),
    Rs256(RsaKeyPair),
}

pub struct TestKey {
    pub kid: String,
    pub signer: Signer,
}

impl TestKey {
    pub fn es256(kid: &str) -> TestKey {
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        TestKey {
            kid: kid.into(),
            signer: Signer::Es256(pair),
        }
    }

    pub fn ed25519(kid: &str) -> TestKey {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        TestKey {
            kid: kid.into(),
            signer: Signer::Ed25519(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap()),
        }
    }

    pub fn rs256(kid: &str) -> TestKey {
        let der = PrivatePkcs8KeyDer::from_pem_slice(RSA_PEM.as_bytes()).unwrap();
        TestKey {
            kid: kid.into(),
            signer: Signer::Rs256(RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).unwrap()),
        }
    }

    pub fn alg(&self) -> &'static str {
        match self.signer {
            Signer::Es256(_) => "ES256",
            Signer::Ed25519(_) => "EdDSA",
            Signer::Rs256(_) => "RS256",
        }
    }

    /// The public key as a JWK.
    pub fn jwk(&self) -> Value {
        match &self.signer {
            Signer::Es256(p) => {
                let point = p.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": self.kid, "use": "sig", "alg": "ES256",
                       "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
                       "y": URL_SAFE_NO_PAD.encode(&point[33..65])})
            }
            Signer::Ed25519(p) => json!({"kty": "OKP", "crv": "Ed25519", "kid": self.kid,
                "x": URL_SAFE_NO_PAD.encode(p.public_key().as_ref())}),
            Signer::Rs256(p) => {
                let (n, e) = self.rsa_public().unwrap();
                let _ = p;
                json!({"kty": "RSA", "kid": self.kid, "alg": "RS256",
                       "n": URL_SAFE_NO_PAD.encode(n), "e": URL_SAFE_NO_PAD.encode(e)})
            }
        }
    }

    fn rsa_public(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        let Signer::Rs256(p) = &self.signer else {
            return None;
        };
        let c = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(p.public());
        Some((c.n, c.e))
    }

    /// The public key's DER (`RSAPublicKey`) — what an HS256 forgery uses as its secret.
    pub fn public_der(&self) -> Vec<u8> {
        match &self.signer {
            Signer::Es256(p) => p.public_key().as_ref().to_vec(),
            Signer::Ed25519(p) => p.public_key().as_ref().to_vec(),
            Signer::Rs256(p) => p.public().as_ref().to_vec(),
        }
    }

    /// A token with this header (the key's `alg` and `kid` unless given) and claims.
    pub fn sign_with(&self, header: Value, claims: &Value) -> String {
        let mut h = json!({"alg": self.alg(), "kid": self.kid, "typ": "JWT"});
        if let (Some(h), Some(extra)) = (h.as_object_mut(), header.as_object()) {
            for (k, v) in extra {
                h.insert(k.clone(), v.clone());
            }
        }
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(h.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let rng = SystemRandom::new();
        let sig = match &self.signer {
            Signer::Es256(p) => p
                .sign(&rng, signing_input.as_bytes())
                .unwrap()
                .as_ref()
                .to_vec(),
            Signer::Ed25519(p) => p.sign(signing_input.as_bytes()).as_ref().to_vec(),
            Signer::Rs256(p) => {
                let mut sig = vec![0; p.public().modulus_len()];
                p.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    signing_input.as_bytes(),
                    &mut sig,
                )
                .unwrap();
                sig
            }
        };
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    pub fn sign(&self, claims: &Value) -> String {
        self.sign_with(json!({}), claims)
    }
}

/// An HS256 token whose HMAC secret is `secret` (an attacker's forgery with a public key).
pub fn hs256(kid: &str, secret: &[u8], claims: &Value) -> String {
    let h = json!({"alg": "HS256", "kid": kid, "typ": "JWT"});
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(h.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let tag = ring::hmac::sign(&key, input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// An unsigned token (`alg: none`).
pub fn unsigned(kid: &str, claims: &Value) -> String {
    let h = json!({"alg": "none", "kid": kid, "typ": "JWT"});
    format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(h.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    )
}

pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A JWKS document for these keys.
pub fn jwks(keys: &[&TestKey]) -> String {
    json!({"keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>()}).to_string()
}

/// A JWKS server over HTTPS with a private CA, serving whatever document it is given.
pub struct JwksServer {
    pub uri: String,
    pub ca_file: PathBuf,
    doc: Arc<Mutex<String>>,
    fetches: Arc<AtomicUsize>,
    status: Arc<AtomicU16>,
}

impl JwksServer {
    pub async fn start(dir: &Path, doc: String) -> JwksServer {
        let ca = infergate_testkit::tls::TestCa::new("infergate test CA");
        let leaf = ca.issue(&["127.0.0.1"]);
        let ca_file = ca.write_ca(dir);

        let certs = vec![leaf.der.clone()];
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let doc = Arc::new(Mutex::new(doc));
        let fetches = Arc::new(AtomicUsize::new(0));
        let status = Arc::new(AtomicU16::new(200));
        let (d, f, st) = (Arc::clone(&doc), Arc::clone(&fetches), Arc::clone(&status));
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, d, f, st) = (
                    acceptor.clone(),
                    Arc::clone(&d),
                    Arc::clone(&f),
                    Arc::clone(&st),
                );
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(move |_req: Request<Incoming>| {
                        f.fetch_add(1, Ordering::SeqCst);
                        let body = d.lock().unwrap().clone();
                        let status = http::StatusCode::from_u16(st.load(Ordering::SeqCst)).unwrap();
                        async move {
                            let mut r = Response::new(Full::new(Bytes::from(body)));
                            *r.status_mut() = status;
                            r.headers_mut().insert(
                                http::header::CONTENT_TYPE,
                                http::HeaderValue::from_static("application/json"),
                            );
                            Ok::<_, Infallible>(r)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        JwksServer {
            uri: format!("https://{addr}/.well-known/jwks.json"),
            ca_file,
            doc,
            fetches,
            status,
        }
    }

    /// Answers every fetch with `status` from now on (200, the default, serves the document).
    pub fn set_status(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    /// Serves `doc` from now on.
    pub fn set(&self, doc: String) {
        *self.doc.lock().unwrap() = doc;
    }

    /// How many times the key set was fetched.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

/// A model server that answers every request with a chat completion, serves a vLLM `/metrics`
/// page, and records the `Authorization` and `x-api-key` headers it received.
pub struct RecordingUpstream {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicUsize>,
    pub credentials: Arc<Mutex<Vec<String>>>,
}

const CHAT_JSON: &str = r#"{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#;
const METRICS: &str = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 0\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.1\n";

impl RecordingUpstream {
    pub async fn start() -> RecordingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let credentials = Arc::new(Mutex::new(Vec::new()));
        let (r, c) = (Arc::clone(&requests), Arc::clone(&credentials));
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (r, c) = (Arc::clone(&r), Arc::clone(&c));
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let body = if req.uri().path() == "/metrics" {
                            METRICS
                        } else {
                            r.fetch_add(1, Ordering::SeqCst);
                            for h in ["authorization", "x-api-key"] {
                                if let Some(v) = req.headers().get(h) {
                                    c.lock()
                                        .unwrap()
                                        .push(format!("{h}: {}", v.to_str().unwrap_or("?")));
                                }
                            }
                            CHAT_JSON
                        };
                        async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body)))) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        RecordingUpstream {
            addr,
            requests,
            credentials,
        }
    }
}
