//! A small stateful Kubernetes API behind a `tower-test` mock: it keeps objects by path, lists
//! by label selector, applies server-side-apply and JSON patches, deletes, records every request
//! and can inject error answers. Every change (a request's or the test's own `put`, `edit`,
//! `delete`) is also kept as a watch event, so the controller's watches see it: a watch request
//! is answered, as a long poll, with the events after its `resourceVersion` once there is one.
//! Enough for the reconciler's and the controller's calls, nothing more.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    dead_code,
    reason = "test helpers"
)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// HTTP method.
    pub method: String,
    /// URL path.
    pub path: String,
    /// URL query.
    pub query: String,
    /// `content-type` header.
    pub content_type: String,
    /// Parsed JSON body (Null when empty).
    pub body: Value,
}

struct Fault {
    method: String,
    path: String,
    code: u16,
    remaining: u32,
}

/// A change, as a watch reports it.
struct Change {
    rv: u64,
    path: String,
    type_: &'static str,
    object: Value,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Value>,
    log: Vec<Seen>,
    faults: Vec<Fault>,
    rv: u64,
    changes: Vec<Change>,
    /// Bearer tokens a TokenReview authenticates, to their user.
    tokens: BTreeMap<String, String>,
    /// Users a SubjectAccessReview allows to `get` the non-resource URL `/metrics`.
    metrics_readers: Vec<String>,
}

impl State {
    /// Records the change of `path` to `object` (or its deletion) at the current version.
    fn changed(&mut self, path: &str, type_: &'static str, object: &Value) {
        let mut object = object.clone();
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.changes.push(Change {
            rv: self.rv,
            path: path.to_owned(),
            type_,
            object,
        });
    }

    /// Stores `obj` at `path` as a new version and records the change.
    fn store(&mut self, path: &str, obj: Value) {
        self.rv += 1;
        let type_ = if self.objects.contains_key(path) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.changed(path, type_, &obj);
        self.objects.insert(path.to_owned(), obj);
    }

    /// Removes the object at `path` and records the deletion.
    fn remove(&mut self, path: &str) -> Option<Value> {
        let gone = self.objects.remove(path)?;
        self.rv += 1;
        self.changed(path, "DELETED", &gone);
        Some(gone)
    }
}

/// Handle on the fake's state.
#[derive(Clone, Default)]
pub struct Fake {
    state: Arc<Mutex<State>>,
    /// Woken at every change, for the watches waiting for one.
    wake: Arc<tokio::sync::Notify>,
}

/// A client talking to a fresh fake.
pub fn client() -> (Client, Fake) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let fake = Fake::default();
    let served = fake.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            // Each on its own task: a watch waits for a change while other requests go on.
            let served = served.clone();
            tokio::spawn(async move {
                let resp = served.handle(req).await;
                send.send_response(resp);
                served.wake.notify_waiters();
            });
        }
    });
    (Client::new(svc, "default"), fake)
}

impl Fake {
    /// Stores an object at its item path.
    pub fn put(&self, path: &str, obj: Value) {
        self.state.lock().unwrap().store(path, obj);
        self.wake.notify_waiters();
    }

    /// Removes the object at `path` (as another client would delete it).
    pub fn delete(&self, path: &str) {
        self.state.lock().unwrap().remove(path);
        self.wake.notify_waiters();
    }

    /// The object at `path`.
    pub fn get(&self, path: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(path).cloned()
    }

    /// Changes the object at `path` in place.
    pub fn edit(&self, path: &str, f: impl FnOnce(&mut Value)) {
        let mut st = self.state.lock().unwrap();
        let mut obj = st.objects.get(path).cloned().expect("object to edit");
        f(&mut obj);
        st.store(path, obj);
        drop(st);
        self.wake.notify_waiters();
    }

    /// Item paths of every stored object.
    pub fn paths(&self) -> Vec<String> {
        self.state.lock().unwrap().objects.keys().cloned().collect()
    }

    /// Requests seen so far.
    pub fn log(&self) -> Vec<Seen> {
        self.state.lock().unwrap().log.clone()
    }

    /// Forgets the requests seen so far.
    pub fn clear_log(&self) {
        self.state.lock().unwrap().log.clear();
    }

    /// Makes TokenReviews authenticate `token` as `user` (in group `system:authenticated`).
    pub fn token(&self, token: &str, user: &str) {
        let mut st = self.state.lock().unwrap();
        st.tokens.insert(token.to_owned(), user.to_owned());
    }

    /// Makes SubjectAccessReviews allow `user` to `get` the non-resource URL `/metrics`.
    pub fn allow_metrics(&self, user: &str) {
        self.state
            .lock()
            .unwrap()
            .metrics_readers
            .push(user.to_owned());
    }

    /// Answers the next `times` requests with `method` on exactly `path` with status `code`.
    pub fn fail(&self, method: &str, path: &str, code: u16, times: u32) {
        self.state.lock().unwrap().faults.push(Fault {
            method: method.to_owned(),
            path: path.to_owned(),
            code,
            remaining: times,
        });
    }

    async fn handle(&self, req: Request<Body>) -> Response<Body> {
        let method = req.method().to_string();
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or_default().to_owned();
        let content_type = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let bytes = req.into_body().collect().await.unwrap().to_bytes();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        {
            let mut st = self.state.lock().unwrap();
            st.log.push(Seen {
                method: method.clone(),
                path: path.clone(),
                query: query.clone(),
                content_type: content_type.clone(),
                body: body.clone(),
            });
            if let Some(f) = st
                .faults
                .iter_mut()
                .find(|f| f.method == method && f.path == path && f.remaining > 0)
            {
                f.remaining -= 1;
                let code = f.code;
                return status(code, "injected failure");
            }
        }
        if method == "GET" && query.split('&').any(|kv| kv == "watch=true") {
            return self.watch(&path, &query).await;
        }
        if method == "POST" {
            match path.as_str() {
                "/apis/authentication.k8s.io/v1/tokenreviews" => return self.token_review(body),
                "/apis/authorization.k8s.io/v1/subjectaccessreviews" => {
                    return self.access_review(body);
                }
                _ => {}
            }
        }
        let mut st = self.state.lock().unwrap();
        let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let Some(i) = segs.iter().position(|s| *s == "namespaces") else {
            // A list across namespaces: `/apis/G/V/RESOURCE` (or `/api/v1/RESOURCE`).
            if method == "GET" && segs.len() >= 3 {
                let selector = selector(&query);
                let items: Vec<Value> = st
                    .objects
                    .iter()
                    .filter(|(k, _)| in_collection(&path, k))
                    .filter(|(_, v)| selector.as_deref().is_none_or(|s| matches(v, s)))
                    .map(|(_, v)| v.clone())
                    .collect();
                return ok(
                    &json!({ "apiVersion": "v1", "kind": "List", "metadata": { "resourceVersion": st.rv.to_string() }, "items": items }),
                );
            }
            return status(404, "not a namespaced path");
        };
        let collection = format!("/{}", segs[..(i + 3).min(segs.len())].join("/"));
        let name = segs.get(i + 3).copied();
        let sub = segs.get(i + 4).copied();
        let item = name.map(|n| format!("{collection}/{n}"));
        match (method.as_str(), item) {
            ("GET", None) => {
                let selector = selector(&query);
                let items: Vec<Value> = st
                    .objects
                    .iter()
                    .filter(|(k, _)| in_collection(&collection, k))
                    .filter(|(_, v)| selector.as_deref().is_none_or(|s| matches(v, s)))
                    .map(|(_, v)| v.clone())
                    .collect();
                ok(
                    &json!({ "apiVersion": "v1", "kind": "List", "metadata": { "resourceVersion": st.rv.to_string() }, "items": items }),
                )
            }
            ("GET", Some(item)) => match st.objects.get(&item) {
                Some(v) => ok(v),
                None => status(404, "not found"),
            },
            ("PATCH", Some(item)) if content_type.starts_with("application/apply-patch") => {
                st.rv += 1;
                let rv = st.rv.to_string();
                let existing = st.objects.get(&item).cloned();
                let stored = if sub == Some("status") {
                    let Some(mut cur) = existing else {
                        return status(404, "not found");
                    };
                    cur["status"] = body["status"].clone();
                    cur
                } else {
                    let mut new = body.clone();
                    if let Some(cur) = existing {
                        if !cur["status"].is_null() {
                            new["status"] = cur["status"].clone();
                        }
                        new["metadata"]["uid"] = cur["metadata"]["uid"].clone();
                    } else {
                        new["metadata"]["uid"] = json!(format!("uid-{rv}"));
                    }
                    new
                };
                let mut stored = stored;
                stored["metadata"]["resourceVersion"] = json!(rv);
                let type_ = if st.objects.contains_key(&item) {
                    "MODIFIED"
                } else {
                    "ADDED"
                };
                st.changed(&item, type_, &stored);
                st.objects.insert(item, stored.clone());
                ok(&stored)
            }
            ("PATCH", Some(item)) if content_type.starts_with("application/json-patch") => {
                let Some(mut cur) = st.objects.get(&item).cloned() else {
                    return status(404, "not found");
                };
                for op in body.as_array().unwrap() {
                    let p = op["path"].as_str().unwrap();
                    match op["op"].as_str().unwrap() {
                        "test" => {}
                        "add" if p == "/metadata/finalizers" => {
                            cur["metadata"]["finalizers"] = op["value"].clone()
                        }
                        "add" if p == "/metadata/finalizers/-" => {
                            cur["metadata"]["finalizers"]
                                .as_array_mut()
                                .unwrap()
                                .push(op["value"].clone());
                        }
                        "remove" => {
                            let idx: usize = p.rsplit('/').next().unwrap().parse().unwrap();
                            cur["metadata"]["finalizers"]
                                .as_array_mut()
                                .unwrap()
                                .remove(idx);
                        }
                        other => panic!("unsupported json patch op {other} {p}"),
                    }
                }
                let gone = !cur["metadata"]["deletionTimestamp"].is_null()
                    && cur["metadata"]["finalizers"]
                        .as_array()
                        .is_none_or(Vec::is_empty);
                if gone {
                    st.objects.insert(item.clone(), cur.clone());
                    st.remove(&item);
                } else {
                    st.store(&item, cur.clone());
                }
                ok(&cur)
            }
            ("POST", None) => {
                let name = body["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let item = format!("{collection}/{name}");
                if st.objects.contains_key(&item) {
                    return status(409, "already exists");
                }
                st.rv += 1;
                let mut stored = body.clone();
                stored["metadata"]["resourceVersion"] = json!(st.rv.to_string());
                let type_ = if st.objects.contains_key(&item) {
                    "MODIFIED"
                } else {
                    "ADDED"
                };
                st.changed(&item, type_, &stored);
                st.objects.insert(item, stored.clone());
                ok(&stored)
            }
            ("PUT", Some(item)) => {
                let Some(cur) = st.objects.get(&item) else {
                    return status(404, "not found");
                };
                // Optimistic concurrency, as the API server does it.
                if body["metadata"]["resourceVersion"] != cur["metadata"]["resourceVersion"] {
                    return status(409, "the object has been modified");
                }
                st.rv += 1;
                let mut stored = body.clone();
                stored["metadata"]["resourceVersion"] = json!(st.rv.to_string());
                let type_ = if st.objects.contains_key(&item) {
                    "MODIFIED"
                } else {
                    "ADDED"
                };
                st.changed(&item, type_, &stored);
                st.objects.insert(item, stored.clone());
                ok(&stored)
            }
            // As the API server: an object with finalizers is only marked for deletion; it
            // goes when the last finalizer is removed (the JSON patch above).
            ("DELETE", Some(item)) => match st.objects.get(&item).cloned() {
                Some(mut v)
                    if v["metadata"]["finalizers"]
                        .as_array()
                        .is_some_and(|f| !f.is_empty()) =>
                {
                    if v["metadata"]["deletionTimestamp"].is_null() {
                        v["metadata"]["deletionTimestamp"] = json!("2027-01-01T00:00:00Z");
                        st.store(&item, v.clone());
                    }
                    ok(&v)
                }
                Some(_) => ok(&st.remove(&item).unwrap()),
                None => status(404, "not found"),
            },
            _ => status(405, "unsupported"),
        }
    }
}

impl Fake {
    /// A TokenReview: authenticated with the user [`Fake::token`] set, else refused with the
    /// API server's error for a token it does not know.
    fn token_review(&self, mut review: Value) -> Response<Body> {
        let token = review["spec"]["token"].as_str().unwrap_or_default();
        let user = self.state.lock().unwrap().tokens.get(token).cloned();
        review["status"] = match user {
            Some(user) => json!({
                "authenticated": true,
                "user": { "username": user, "uid": format!("uid-{user}"),
                          "groups": ["system:authenticated"] },
            }),
            None => json!({ "authenticated": false, "error": "invalid bearer token" }),
        };
        ok(&review)
    }

    /// A SubjectAccessReview: allowed for a user of [`Fake::allow_metrics`] asking to `get`
    /// `/metrics`, denied with no opinion otherwise (as RBAC answers).
    fn access_review(&self, mut review: Value) -> Response<Body> {
        let spec = &review["spec"];
        let readers = self.state.lock().unwrap().metrics_readers.clone();
        let allowed = spec["nonResourceAttributes"] == json!({"path": "/metrics", "verb": "get"})
            && spec["resourceAttributes"].is_null()
            && readers.iter().any(|r| spec["user"] == r.as_str())
            && spec["groups"] == json!(["system:authenticated"]);
        review["status"] = if allowed {
            json!({ "allowed": true, "reason": "RBAC: allowed by ClusterRoleBinding" })
        } else {
            json!({ "allowed": false })
        };
        ok(&review)
    }

    /// A watch of the collection `path` (one namespace's, or every namespace's): the changes
    /// after the request's `resourceVersion` that match its label selector, as one body of
    /// JSON lines, sent once there is at least one. The client watches again from the last.
    async fn watch(&self, path: &str, query: &str) -> Response<Body> {
        let since: u64 = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("resourceVersion="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let selector = selector(query);
        loop {
            // Registered before looking, so a change made meanwhile still wakes it.
            let woken = self.wake.notified();
            let lines: Vec<u8> = {
                let st = self.state.lock().unwrap();
                st.changes
                    .iter()
                    .filter(|c| c.rv > since && in_collection(path, &c.path))
                    .filter(|c| selector.as_deref().is_none_or(|s| matches(&c.object, s)))
                    .flat_map(|c| {
                        let mut line =
                            serde_json::to_vec(&json!({ "type": c.type_, "object": c.object }))
                                .unwrap();
                        line.push(b'\n');
                        line
                    })
                    .collect()
            };
            if !lines.is_empty() {
                return Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Body::from(lines))
                    .unwrap();
            }
            woken.await;
        }
    }
}

/// The request's label selector, decoded.
fn selector(query: &str) -> Option<String> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("labelSelector="))
        .map(|s| s.replace("%2F", "/").replace("%3D", "="))
}

/// Whether the item path `item` is in the collection `collection`: one namespace's
/// (`/api/v1/namespaces/NS/pods`) or every namespace's (`/api/v1/pods`).
fn in_collection(collection: &str, item: &str) -> bool {
    if collection.contains("/namespaces/") {
        return item
            .strip_prefix(collection)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|name| !name.contains('/'));
    }
    let Some((prefix, resource)) = collection.rsplit_once('/') else {
        return false;
    };
    item.strip_prefix(&format!("{prefix}/namespaces/"))
        .is_some_and(|rest| {
            let parts: Vec<&str> = rest.split('/').collect();
            parts.len() == 3 && parts[1] == resource
        })
}

fn matches(obj: &Value, selector: &str) -> bool {
    selector.split(',').all(|kv| {
        let (k, v) = kv.split_once('=').unwrap();
        obj["metadata"]["labels"][k] == v
    })
}

fn ok(v: &Value) -> Response<Body> {
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

fn status(code: u16, message: &str) -> Response<Body> {
    let reason = match code {
        404 => "NotFound",
        403 => "Forbidden",
        409 => "Conflict",
        422 => "Invalid",
        _ => "InternalError",
    };
    let body = json!({
        "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}
