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
    let eps = pool_endpoints(&pods, &selection(&[80]), None);
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
