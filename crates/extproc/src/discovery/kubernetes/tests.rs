use std::collections::BTreeMap;
use std::time::Duration;

use http::{Request, Response};
use infergate_pool::PoolConfig;
use infergate_scheduler::EngineType;
use kube::client::Body;
use serde_json::{Value, json};

use super::*;

fn pod(name: &str, ip: &str, ready: bool, engine: Option<&str>) -> Value {
    let mut labels = json!({"app": "llama"});
    if let Some(e) = engine {
        labels["inference.networking.k8s.io/engine-type"] = json!(e);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "models", "labels": labels, "resourceVersion": "1"},
        "status": {
            "podIP": ip,
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    })
}

fn parse(v: Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

fn selection(ports: &[u16]) -> PoolSelection {
    PoolSelection {
        namespace: "models".into(),
        match_labels: BTreeMap::from([("app".into(), "llama".into())]),
        target_ports: ports.to_vec(),
    }
}

#[test]
fn ready_pods_give_one_endpoint_per_target_port() {
    let pods = [
        parse(pod("a", "10.0.0.2", true, Some("vllm"))),
        parse(pod("b", "10.0.0.1", true, Some("sglang"))),
    ];
    let eps = pool_endpoints(&pods, &selection(&[8000, 8001]), None);
    let addrs: Vec<String> = eps.iter().map(|e| e.addr.to_string()).collect();
    assert_eq!(
        addrs,
        [
            "10.0.0.1:8000",
            "10.0.0.1:8001",
            "10.0.0.2:8000",
            "10.0.0.2:8001"
        ]
    );
    assert_eq!(eps[0].pod, "b");
    assert_eq!(eps[0].engine, EngineType::Sglang);
    assert_eq!(eps[2].engine, EngineType::Vllm);
    assert_eq!(eps[0].namespace, "models");
}

#[test]
fn unready_terminating_ipless_and_engineless_pods_are_not_members() {
    let mut terminating = pod("t", "10.0.0.3", true, Some("vllm"));
    terminating["metadata"]["deletionTimestamp"] = json!("2026-11-30T00:00:00Z");
    let mut no_ip = pod("n", "", true, Some("vllm"));
    no_ip["status"]["podIP"] = Value::Null;
    let mut no_status = pod("s", "10.0.0.6", true, Some("vllm"));
    no_status["status"] = Value::Null;
    let pods = [
        parse(pod("unready", "10.0.0.1", false, Some("vllm"))),
        parse(terminating),
        parse(no_ip),
        parse(no_status),
        parse(pod("no-engine", "10.0.0.4", true, None)),
        parse(pod("bad-engine", "10.0.0.5", true, Some("triton"))),
        parse(pod("ok", "10.0.0.9", true, Some("tgi"))),
    ];
    let out = infergate_testkit::CapturedLog::default();
    let logs = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let eps = pool_endpoints(&pods, &selection(&[80]), None);
    drop(logs);
    // The skipped pod's line says which value was wrong, not only that it was.
    let text = out.text();
    let line = text.lines().find(|l| l.contains("pod=bad-engine")).unwrap();
    assert!(line.contains("triton"), "{line}");
    assert_eq!(eps.len(), 1);
    assert_eq!(eps[0].pod, "ok");
    // A configured default engine admits the unlabelled pod (not the unknown one).
    let eps = pool_endpoints(&pods, &selection(&[80]), Some("vllm"));
    let names: Vec<&str> = eps.iter().map(|e| e.pod.as_str()).collect();
    assert_eq!(names, ["no-engine", "ok"]);
}

#[test]
fn selection_reads_the_inference_pool() {
    let ip: InferencePool = serde_json::from_value(json!({
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "llama", "namespace": "models"},
        "spec": {
            "selector": {"matchLabels": {"app": "llama", "tier": "gpu"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "llama-epp", "port": {"number": 9002}},
        },
    }))
    .unwrap();
    let s = PoolSelection::from_pool("models", &ip).unwrap();
    assert_eq!(s.target_ports, [8000]);
    assert_eq!(s.label_selector(), "app=llama,tier=gpu");
    let mut bad = ip.clone();
    bad.spec.target_ports[0].number = 70_000;
    assert!(PoolSelection::from_pool("models", &bad).is_err());
}

fn respond(v: &Value) -> Response<Body> {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

async fn wait_for(pool: &LivePool, want: &[&str]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut have: Vec<String> = pool
            .endpoints_info()
            .iter()
            .map(|i| i.meta.addr.to_string())
            .collect();
        have.sort();
        if have == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pool has {have:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn the_watch_keeps_the_pool_equal_to_ready_pods() {
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(mock, "default");
    let pool = LivePool::start(PoolConfig::default(), None).unwrap();
    let watch = tokio::spawn(watch_pods(client, selection(&[8000]), None, pool.clone()));

    // The initial list: one ready pod, one not ready yet.
    let (req, send) = handle.next_request().await.unwrap();
    let uri = req.uri().to_string();
    assert!(uri.starts_with("/api/v1/namespaces/models/pods?"), "{uri}");
    assert!(uri.contains("labelSelector=app%3Dllama"), "{uri}");
    assert!(!uri.contains("watch=true"), "{uri}");
    send.send_response(respond(&json!({
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {"resourceVersion": "10"},
        "items": [
            pod("a", "127.0.0.2", true, Some("vllm")),
            pod("b", "127.0.0.3", false, Some("vllm")),
        ],
    })));
    wait_for(&pool, &["127.0.0.2:8000"]).await;

    // The watch: b becomes ready, then a is deleted.
    let (req, send) = handle.next_request().await.unwrap();
    let uri = req.uri().to_string();
    assert!(
        uri.contains("watch=true") && uri.contains("resourceVersion=10"),
        "{uri}"
    );
    let mut lines = Vec::new();
    for (kind, object) in [
        ("MODIFIED", pod("b", "127.0.0.3", true, Some("vllm"))),
        ("DELETED", pod("a", "127.0.0.2", true, Some("vllm"))),
    ] {
        let mut object = object;
        object["metadata"]["resourceVersion"] = json!("11");
        lines.extend(serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap());
        lines.push(b'\n');
    }
    send.send_response(
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(lines))
            .unwrap(),
    );
    wait_for(&pool, &["127.0.0.3:8000"]).await;
    watch.abort();
    pool.shutdown();
}

fn inference_pool(labels: &[(&str, &str)], ports: &[i64], version: &str) -> Value {
    let match_labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    let ports: Vec<Value> = ports.iter().map(|p| json!({"number": p})).collect();
    json!({
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "llama", "namespace": "models", "resourceVersion": version},
        "spec": {
            "selector": {"matchLabels": match_labels},
            "targetPorts": ports,
            "endpointPickerRef": {"name": "llama-epp", "port": {"number": 9002}},
        },
    })
}

fn labelled(name: &str, ip: &str, extra: &[(&str, &str)]) -> Value {
    let mut p = pod(name, ip, true, Some("vllm"));
    for (k, v) in extra {
        p["metadata"]["labels"][*k] = json!(v);
    }
    p
}

fn addrs(eps: &[EndpointMeta]) -> Vec<String> {
    eps.iter().map(|e| e.addr.to_string()).collect()
}

#[test]
fn pods_without_every_selector_label_are_not_members() {
    let pods = [
        parse(labelled("a", "10.0.0.1", &[])),
        parse(labelled("b", "10.0.0.2", &[("tier", "gpu")])),
    ];
    let mut s = selection(&[80]);
    s.match_labels.insert("tier".into(), "gpu".into());
    assert_eq!(addrs(&pool_endpoints(&pods, &s, None)), ["10.0.0.2:80"]);
}

#[test]
fn the_tracker_follows_the_pools_selector_and_ports() {
    let ip = |labels: &[(&str, &str)], ports: &[i64]| -> InferencePool {
        serde_json::from_value(inference_pool(labels, ports, "1")).unwrap()
    };
    let mut t = PoolTracker::new("models");
    assert!(t.endpoints(None).is_empty());

    // First sight: watch the selected pods; nothing to publish until they are listed.
    let first = ip(&[("app", "llama")], &[8000]);
    assert_eq!(
        t.set_pool(Some(&first)).unwrap(),
        PoolChange::Rewatch(selection(&[8000]))
    );
    assert!(!t.synced());
    for e in [
        Event::Init,
        Event::InitApply(parse(labelled("a", "10.0.0.1", &[]))),
        Event::InitApply(parse(labelled("b", "10.0.0.2", &[("tier", "gpu")]))),
    ] {
        assert!(!t.on_pod_event(e));
    }
    assert!(t.on_pod_event(Event::InitDone));
    assert_eq!(
        addrs(&t.endpoints(None)),
        ["10.0.0.1:8000", "10.0.0.2:8000"]
    );
    assert_eq!(t.set_pool(Some(&first)).unwrap(), PoolChange::Unchanged);

    // New target ports, same selector: recomputed from the known pods, no new watch.
    let ports = ip(&[("app", "llama")], &[8000, 8001]);
    assert_eq!(t.set_pool(Some(&ports)).unwrap(), PoolChange::Endpoints);
    assert_eq!(t.endpoints(None).len(), 4);

    // A narrower selector: `a` is dropped at once, before the new watch lists anything.
    let narrow = ip(&[("app", "llama"), ("tier", "gpu")], &[8000, 8001]);
    let PoolChange::Rewatch(s) = t.set_pool(Some(&narrow)).unwrap() else {
        panic!("expected a new pod watch");
    };
    assert_eq!(s.label_selector(), "app=llama,tier=gpu");
    assert!(t.synced(), "the narrowed list is published straight away");
    assert_eq!(
        addrs(&t.endpoints(None)),
        ["10.0.0.2:8000", "10.0.0.2:8001"]
    );
    // The new watch's listing replaces the known pods (`c` newly matches).
    t.on_pod_event(Event::Init);
    t.on_pod_event(Event::InitApply(parse(labelled(
        "b",
        "10.0.0.2",
        &[("tier", "gpu")],
    ))));
    t.on_pod_event(Event::InitApply(parse(labelled(
        "c",
        "10.0.0.3",
        &[("tier", "gpu")],
    ))));
    assert!(t.on_pod_event(Event::InitDone));
    assert_eq!(t.endpoints(None).len(), 4);

    // An invalid edit is refused and changes nothing.
    let bad = ip(&[("app", "llama")], &[70_000]);
    assert!(t.set_pool(Some(&bad)).is_err());
    assert_eq!(t.endpoints(None).len(), 4);

    // Deleted: no endpoints, published at once; back: listed again before publishing.
    assert_eq!(t.set_pool(None).unwrap(), PoolChange::Gone);
    assert!(t.synced() && t.endpoints(None).is_empty());
    assert!(matches!(
        t.set_pool(Some(&first)).unwrap(),
        PoolChange::Rewatch(_)
    ));
    assert!(!t.synced());
}

/// A mock API server's requests, answered in whatever order the watchers send them.
struct MockApi {
    handle: tower_test::mock::Handle<Request<Body>, Response<Body>>,
    held: Vec<(
        Request<Body>,
        tower_test::mock::SendResponse<Response<Body>>,
    )>,
}

impl MockApi {
    /// The next request whose URI satisfies `want` (others are kept for later, unanswered).
    async fn expect(
        &mut self,
        want: impl Fn(&str) -> bool,
    ) -> (String, tower_test::mock::SendResponse<Response<Body>>) {
        if let Some(i) = self
            .held
            .iter()
            .position(|(r, _)| want(&r.uri().to_string()))
        {
            let (r, s) = self.held.remove(i);
            return (r.uri().to_string(), s);
        }
        loop {
            let (r, s) = tokio::time::timeout(Duration::from_secs(10), self.handle.next_request())
                .await
                .expect("no request in time")
                .expect("client gone");
            let uri = r.uri().to_string();
            if want(&uri) {
                return (uri, s);
            }
            self.held.push((r, s));
        }
    }
}

fn is_pool_list(uri: &str) -> bool {
    uri.starts_with("/apis/inference.networking.k8s.io/v1/namespaces/models/inferencepools?")
        && uri.contains("fieldSelector=metadata.name%3Dllama")
        && !uri.contains("watch=true")
}

fn is_pool_watch(uri: &str) -> bool {
    uri.starts_with("/apis/inference.networking.k8s.io/v1/namespaces/models/inferencepools?")
        && uri.contains("watch=true")
}

fn is_pod_list(selector: &'static str) -> impl Fn(&str) -> bool {
    move |uri: &str| {
        uri.starts_with("/api/v1/namespaces/models/pods?")
            && uri.contains(&format!("labelSelector={selector}&"))
            && !uri.contains("watch=true")
    }
}

fn watch_events(events: &[(&str, Value)]) -> Response<Body> {
    let mut lines = Vec::new();
    for (kind, object) in events {
        lines.extend(serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap());
        lines.push(b'\n');
    }
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(lines))
        .unwrap()
}

#[tokio::test]
async fn the_pod_watch_follows_the_inference_pool() {
    let (mock, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let mut api = MockApi {
        handle,
        held: Vec::new(),
    };
    let client = kube::Client::new(mock, "default");
    let pool = LivePool::start(PoolConfig::default(), None).unwrap();
    let watch = tokio::spawn({
        let pool = pool.clone();
        async move { watch_pool(client, "models", "llama", None, pool).await }
    });

    // The pool, then its pods (a and b match `app=llama`).
    let (_, send) = api.expect(is_pool_list).await;
    send.send_response(respond(&json!({
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePoolList",
        "metadata": {"resourceVersion": "5"},
        "items": [inference_pool(&[("app", "llama")], &[8000], "5")],
    })));
    let (_, send) = api.expect(is_pod_list("app%3Dllama")).await;
    send.send_response(respond(&json!({
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {"resourceVersion": "10"},
        "items": [
            labelled("a", "127.0.0.2", &[]),
            labelled("b", "127.0.0.3", &[("tier", "gpu")]),
        ],
    })));
    wait_for(&pool, &["127.0.0.2:8000", "127.0.0.3:8000"]).await;

    // The selector narrows to tier=gpu and a port is added: `a` goes at once, the pods are
    // listed again with the new selector, and `c` (which now matches) joins.
    let (uri, send) = api.expect(is_pool_watch).await;
    assert!(uri.contains("resourceVersion=5"), "{uri}");
    send.send_response(watch_events(&[(
        "MODIFIED",
        inference_pool(&[("app", "llama"), ("tier", "gpu")], &[8000, 8001], "6"),
    )]));
    wait_for(&pool, &["127.0.0.3:8000", "127.0.0.3:8001"]).await;
    let (_, send) = api.expect(is_pod_list("app%3Dllama%2Ctier%3Dgpu")).await;
    send.send_response(respond(&json!({
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {"resourceVersion": "12"},
        "items": [
            labelled("b", "127.0.0.3", &[("tier", "gpu")]),
            labelled("c", "127.0.0.4", &[("tier", "gpu")]),
        ],
    })));
    wait_for(
        &pool,
        &[
            "127.0.0.3:8000",
            "127.0.0.3:8001",
            "127.0.0.4:8000",
            "127.0.0.4:8001",
        ],
    )
    .await;

    // The pool is deleted: no endpoints.
    let (uri, send) = api.expect(is_pool_watch).await;
    assert!(uri.contains("resourceVersion=6"), "{uri}");
    send.send_response(watch_events(&[(
        "DELETED",
        inference_pool(&[("app", "llama"), ("tier", "gpu")], &[8000, 8001], "7"),
    )]));
    wait_for(&pool, &[]).await;
    watch.abort();
    pool.shutdown();
}
