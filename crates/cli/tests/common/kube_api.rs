//! A fake Kubernetes API server on 127.0.0.1, over real HTTP, for the picker's pod discovery.
//!
//! It answers what the `kube` watcher asks of it: a LIST of a namespaced collection (with
//! `labelSelector` and `fieldSelector=metadata.name=…` honoured, equality terms only), then a
//! WATCH (`watch=true`) that stays open and sends a bookmark now and then, as an API server with
//! nothing changing does. Objects are served from what the test puts in, each with a
//! resourceVersion.
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the helpers"
)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// Objects by collection path (`/api/v1/namespaces/NS/pods`), in the order added.
#[derive(Default)]
struct Store {
    collections: BTreeMap<String, Vec<Value>>,
    requests: Vec<String>,
}

/// A running fake API server. Dropping it stops accepting.
pub struct FakeKube {
    /// Where it listens.
    pub addr: SocketAddr,
    store: Arc<Mutex<Store>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

impl FakeKube {
    /// Starts serving on a free port.
    pub async fn start() -> FakeKube {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let store = Arc::new(Mutex::new(Store::default()));
        let s = store.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(answer(&s, req)) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        FakeKube { addr, store, task }
    }

    /// Adds an object to the collection it belongs to (from its apiVersion, kind and
    /// namespace), giving it a resourceVersion.
    pub fn put(&self, mut obj: Value) {
        let path = collection_path(&obj);
        let mut st = self.store.lock().unwrap();
        let rv = st.collections.values().map(Vec::len).sum::<usize>() + 2;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        st.collections.entry(path).or_default().push(obj);
    }

    /// Every request path and query seen so far.
    pub fn requests(&self) -> Vec<String> {
        self.store.lock().unwrap().requests.clone()
    }

    /// A kubeconfig pointing at this server, with no credentials.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.addr
        )
    }
}

/// `/api/v1/namespaces/NS/pods` or `/apis/GROUP/VERSION/namespaces/NS/PLURAL`.
fn collection_path(obj: &Value) -> String {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let kind = obj["kind"].as_str().unwrap();
    let ns = obj["metadata"]["namespace"].as_str().unwrap();
    let plural = format!("{}s", kind.to_ascii_lowercase());
    if api_version == "v1" {
        format!("/api/v1/namespaces/{ns}/{plural}")
    } else {
        format!("/apis/{api_version}/namespaces/{ns}/{plural}")
    }
}

fn answer(store: &Mutex<Store>, req: Request<hyper::body::Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let query: BTreeMap<String, String> = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), decode(v)))
        .collect();
    let mut st = store.lock().unwrap();
    st.requests.push(req.uri().to_string());
    if req.method() != hyper::Method::GET {
        return status(405, "only GET is served");
    }
    let Some(items) = st.collections.get(&path).cloned().or_else(|| {
        // A collection nothing was put in: list as empty when the path is a known shape.
        path.contains("/namespaces/").then(Vec::new)
    }) else {
        return status(404, "not found");
    };
    let selected: Vec<Value> = items
        .into_iter()
        .filter(|o| matches_labels(o, query.get("labelSelector")))
        .filter(|o| matches_fields(o, query.get("fieldSelector")))
        .collect();
    let rv = st.collections.values().map(Vec::len).sum::<usize>() + 1;
    drop(st);
    if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
        return watch(rv);
    }
    let kind = selected
        .first()
        .and_then(|o| o["kind"].as_str())
        .map_or_else(|| "List".to_owned(), |k| format!("{k}List"));
    let list = json!({
        "apiVersion": "v1",
        "kind": kind,
        "metadata": { "resourceVersion": rv.to_string() },
        "items": selected,
    });
    json_response(200, &list)
}

/// A watch that stays open: a bookmark every second, as the watcher asked for
/// (`allowWatchBookmarks`), nothing else.
fn watch(rv: usize) -> Response<Body> {
    let stream = futures_util::stream::unfold(0_u32, move |n| async move {
        if n > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let line = json!({
            "type": "BOOKMARK",
            "object": { "kind": "Pod", "apiVersion": "v1", "metadata": { "resourceVersion": rv.to_string() } },
        });
        let mut bytes = serde_json::to_vec(&line).unwrap();
        bytes.push(b'\n');
        Some((Ok::<_, Infallible>(Frame::data(Bytes::from(bytes))), n + 1))
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(StreamBody::new(stream).boxed())
        .unwrap()
}

fn matches_labels(obj: &Value, selector: Option<&String>) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    sel.split(',').all(|term| match term.split_once('=') {
        Some((k, v)) => {
            obj["metadata"]["labels"][k.trim_end_matches('=')] == v.trim_start_matches('=')
        }
        None => obj["metadata"]["labels"].get(term).is_some(),
    })
}

fn matches_fields(obj: &Value, selector: Option<&String>) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    sel.split(',').all(|term| match term.split_once('=') {
        Some(("metadata.name", v)) => obj["metadata"]["name"] == v.trim_start_matches('='),
        Some(("metadata.namespace", v)) => {
            obj["metadata"]["namespace"] == v.trim_start_matches('=')
        }
        _ => false,
    })
}

fn decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn status(code: u16, message: &str) -> Response<Body> {
    json_response(
        code,
        &json!({ "apiVersion": "v1", "kind": "Status", "status": "Failure", "message": message, "code": code }),
    )
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(v).unwrap())).boxed())
        .unwrap()
}
