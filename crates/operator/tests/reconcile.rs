//! The reconcile loop against a stateful fake API behind `tower-test`: create, no-op
//! re-reconcile, update, scheduler removal, deletion with the finalizer, API errors with backoff
//! and the failure metric, conflict retry, status conditions — asserting the exact requests.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

#[path = "common/render.rs"]
mod common;
#[path = "common/fake.rs"]
mod fake;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use fake::{Fake, Seen};
use infergate_api::{InferenceGatewayConfig, InferenceGatewayConfigStatus, RolloutState};
use infergate_operator::metrics::Metrics;
use infergate_operator::reconcile::{
    Context, FIELD_MANAGER, FINALIZER, REQUEUE_NOT_READY, error_policy, ready_event, reconcile, run,
};
use infergate_operator::scope::WatchScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

const NS: &str = "inference";
const CFG: &str = "/apis/infergate.dev/v1alpha1/namespaces/inference/inferencegatewayconfigs/fleet";

fn clock() -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap())
}

fn setup(example: &str) -> (Arc<Context>, Fake) {
    let (client, fake) = fake::client();
    let mut cfg = serde_json::to_value(common::example(example)).unwrap();
    cfg["metadata"]["resourceVersion"] = json!("1");
    let path = format!(
        "/apis/infergate.dev/v1alpha1/namespaces/{}/inferencegatewayconfigs/{}",
        cfg["metadata"]["namespace"].as_str().unwrap(),
        cfg["metadata"]["name"].as_str().unwrap()
    );
    // Each scheduler's model servers: one ready pod matching its modelSelector.
    let ns = cfg["metadata"]["namespace"].as_str().unwrap().to_owned();
    for s in cfg["spec"]["schedulers"].as_array().unwrap() {
        let name = format!("{}-server-0", s["name"].as_str().unwrap());
        model_pod(&fake, &ns, &name, &s["modelSelector"], true);
    }
    fake.put(&path, cfg);
    let ctx = Context::new(client, common::opts(), Metrics::default()).with_clock(clock);
    (Arc::new(ctx), fake)
}

/// Stores a model-server pod `name` with `labels`, ready or not.
fn model_pod(fake: &Fake, ns: &str, name: &str, labels: &Value, ready: bool) {
    let status = if ready { "True" } else { "False" };
    fake.put(
        &format!("/api/v1/namespaces/{ns}/pods/{name}"),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": ns, "labels": labels},
               "status": {"conditions": [{"type": "Ready", "status": status}]}}),
    );
}

/// The path of the config `setup` stored.
fn config_path(fake: &Fake) -> String {
    fake.paths()
        .into_iter()
        .find(|p| p.contains("/inferencegatewayconfigs/"))
        .expect("config stored")
}

fn config(fake: &Fake) -> Arc<InferenceGatewayConfig> {
    Arc::new(serde_json::from_value(fake.get(&config_path(fake)).unwrap()).unwrap())
}

/// Whether a request concerns the configs' Events (events.k8s.io).
fn is_event(s: &Seen) -> bool {
    s.path.contains("/apis/events.k8s.io/")
}

/// Writes to the config and its children (Events apart).
fn writes(log: &[Seen]) -> Vec<&Seen> {
    log.iter()
        .filter(|s| s.method != "GET" && !is_event(s))
        .collect()
}

/// The Events created, as (type, reason, note), in order.
fn events(log: &[Seen]) -> Vec<(String, String, String)> {
    log.iter()
        .filter(|s| is_event(s) && s.method == "POST")
        .map(|s| {
            let field = |k: &str| s.body[k].as_str().unwrap_or_default().to_owned();
            (field("type"), field("reason"), field("note"))
        })
        .collect()
}

/// What the fake stores, the Events and the model servers' pods apart.
fn stored(fake: &Fake) -> Vec<String> {
    fake.paths()
        .into_iter()
        .filter(|p| !p.contains("/apis/events.k8s.io/") && !p.contains("/pods/"))
        .collect()
}

fn paths(seen: &[&Seen], method: &str) -> BTreeSet<String> {
    seen.iter()
        .filter(|s| s.method == method)
        .map(|s| s.path.clone())
        .collect()
}

/// Adds the finalizer, then applies every child: the state after a user's `kubectl apply`.
async fn created(example: &str) -> (Arc<Context>, Fake) {
    let (ctx, fake) = setup(example);
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    fake.clear_log();
    (ctx, fake)
}

/// The stored config's condition `type_`.
fn find_condition<'a>(cfg: &'a Value, type_: &str) -> &'a Value {
    cfg["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

fn condition(cfg: &Value, type_: &str) -> (String, String) {
    let c = find_condition(cfg, type_);
    (
        c["status"].as_str().unwrap().to_owned(),
        c["message"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn create_adds_the_finalizer_first_then_applies_every_child_by_ssa() {
    let (ctx, fake) = setup("multi-model.yaml");
    let action = reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    let log = fake.log();
    assert_eq!(log.len(), 1, "only the finalizer patch: {log:?}");
    assert_eq!(log[0].method, "PATCH");
    assert_eq!(log[0].path, CFG);
    assert!(
        log[0]
            .content_type
            .starts_with("application/json-patch+json")
    );
    assert_eq!(
        fake.get(CFG).unwrap()["metadata"]["finalizers"],
        json!([FINALIZER])
    );

    fake.clear_log();
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let log = fake.log();
    let desired = common::children(&config(&fake));
    let applies: Vec<&Seen> = log
        .iter()
        .filter(|s| s.method == "PATCH" && !s.path.ends_with("/status"))
        .collect();
    assert_eq!(applies.len(), desired.len(), "one apply per child");
    for s in &applies {
        assert!(
            s.content_type.starts_with("application/apply-patch+yaml"),
            "{s:?}"
        );
        assert!(
            s.query.contains(&format!("fieldManager={FIELD_MANAGER}")),
            "{s:?}"
        );
        assert!(s.query.contains("force=true"), "{s:?}");
        assert!(
            s.body["apiVersion"].is_string() && s.body["kind"].is_string(),
            "{s:?}"
        );
    }
    let status_patches: Vec<&Seen> = log.iter().filter(|s| s.path.ends_with("/status")).collect();
    assert_eq!(status_patches.len(), 1);
    assert!(
        status_patches[0]
            .content_type
            .starts_with("application/apply-patch+yaml")
    );
    assert!(
        status_patches[0]
            .query
            .contains("fieldManager=infergate-operator")
    );
    assert_eq!(paths(&writes(&log), "DELETE"), BTreeSet::new());
    // Every child is now stored under its own path.
    let stored = fake.paths();
    for c in &desired {
        assert!(
            stored.iter().any(|p| p.ends_with(&format!(
                "/{}/{}",
                c.resource.plural,
                c.object.metadata.name.as_deref().unwrap()
            ))),
            "{} not stored",
            c.key()
        );
    }
    // Listing went by the owner label, once per child kind; the other reads are the peer
    // key Secret of the scheduler with two replicas (missing, so created) and each child,
    // once, to see that its name is free before it is created.
    let secret = format!("/api/v1/namespaces/{NS}/secrets/fleet-llama-70b-epp-peer-key");
    let (pod_lists, gets): (Vec<&Seen>, Vec<&Seen>) = log
        .iter()
        .filter(|s| s.method == "GET")
        .partition(|s| s.path == format!("/api/v1/namespaces/{NS}/pods"));
    // The model servers of each scheduler, by its modelSelector.
    assert_eq!(
        pod_lists
            .iter()
            .map(|s| s.query.as_str())
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([
            "&labelSelector=app%3Dsglang-qwen",
            "&labelSelector=app%3Dvllm-llama-70b"
        ]),
    );
    let (reads, lists): (Vec<&Seen>, Vec<&Seen>) = gets
        .into_iter()
        .partition(|s| !s.query.contains("labelSelector"));
    let (secret_reads, child_reads): (Vec<&Seen>, Vec<&Seen>) =
        reads.into_iter().partition(|s| s.path == secret);
    assert_eq!(secret_reads.len(), 1);
    assert_eq!(
        child_reads
            .iter()
            .map(|s| s.path.clone())
            .collect::<BTreeSet<_>>(),
        paths(&applies, "PATCH"),
        "one read per child created"
    );
    assert_eq!(child_reads.len(), desired.len());
    assert_eq!(
        paths(&writes(&log), "POST"),
        BTreeSet::from([format!("/api/v1/namespaces/{NS}/secrets")])
    );
    assert_eq!(lists.len(), infergate_operator::render::child_kinds().len());
    assert!(lists.iter().all(|s| {
        s.query
            .contains("labelSelector=infergate.dev%2Fconfig%3Dfleet")
    }));
}

#[tokio::test]
async fn status_conditions_and_observed_generation_are_written() {
    let (_ctx, fake) = created("multi-model.yaml").await;
    let cfg = fake.get(CFG).unwrap();
    assert_eq!(cfg["status"]["observedGeneration"], 1);
    assert_eq!(condition(&cfg, "Accepted").0, "True");
    assert_eq!(condition(&cfg, "Ready").0, "False");
    assert_eq!(condition(&cfg, "GatewayProgrammed").0, "False");
    assert_eq!(condition(&cfg, "BBRReady").0, "False");
    let scheds = cfg["status"]["schedulers"].as_array().unwrap();
    assert_eq!(scheds.len(), 2);
    // Before the apply nothing existed, so the rollouts are still pending.
    assert_eq!(scheds[0]["rolloutState"], "Pending");
}

#[tokio::test]
async fn no_op_re_reconcile_writes_nothing() {
    let (ctx, fake) = created("multi-model.yaml").await;
    // One more pass picks up the Deployments that now exist (Pending → Progressing).
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    fake.clear_log();
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let log = fake.log();
    assert!(
        writes(&log).is_empty(),
        "unexpected writes: {:?}",
        writes(&log)
    );
    assert!(!log.is_empty(), "it still looked");
}

#[tokio::test]
async fn update_reapplies_only_the_children_that_changed() {
    let (ctx, fake) = created("multi-model.yaml").await;
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    fake.edit(CFG, |c| {
        c["spec"]["schedulers"][1]["weights"] = json!({ "queue": 1.0 });
        c["metadata"]["generation"] = json!(2);
    });
    fake.clear_log();
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let log = fake.log();
    let w = writes(&log);
    let applied: BTreeSet<String> = paths(&w, "PATCH")
        .into_iter()
        .filter(|p| !p.ends_with("/status"))
        .collect();
    let want: BTreeSet<String> = [
        "/api/v1/namespaces/inference/configmaps/fleet-qwen-7b-epp",
        "/apis/apps/v1/namespaces/inference/deployments/fleet-qwen-7b-epp",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(applied, want);
    assert!(paths(&w, "DELETE").is_empty());
    assert_eq!(fake.get(CFG).unwrap()["status"]["observedGeneration"], 2);
}

#[tokio::test]
async fn removing_a_scheduler_prunes_exactly_its_children() {
    let (ctx, fake) = created("multi-model.yaml").await;
    fake.edit(CFG, |c| {
        c["spec"]["schedulers"].as_array_mut().unwrap().truncate(1);
        c["metadata"]["generation"] = json!(2);
    });
    fake.clear_log();
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let log = fake.log();
    let deleted = paths(&writes(&log), "DELETE");
    assert_eq!(deleted.len(), 10, "{deleted:?}");
    assert!(
        deleted
            .iter()
            .all(|p| p.ends_with("/fleet-qwen-7b") || p.ends_with("/fleet-qwen-7b-epp")),
        "{deleted:?}"
    );
    assert!(stored(&fake).iter().all(|p| !p.contains("qwen")));
    assert_eq!(
        fake.get(CFG).unwrap()["status"]["schedulers"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn children_owned_by_someone_else_are_never_pruned() {
    let (ctx, fake) = created("multi-model.yaml").await;
    // Same label, different owner: e.g. a hand-made object that copied our labels.
    fake.put(
        "/api/v1/namespaces/inference/configmaps/stranger",
        json!({ "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": "stranger", "namespace": NS, "labels": { "infergate.dev/config": "fleet" } } }),
    );
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert!(
        fake.get("/api/v1/namespaces/inference/configmaps/stranger")
            .is_some()
    );
}

#[tokio::test]
async fn deletion_runs_cleanup_then_removes_the_finalizer() {
    let (ctx, fake) = created("multi-model.yaml").await;
    let children = common::children(&config(&fake)).len();
    fake.edit(CFG, |c| {
        c["metadata"]["deletionTimestamp"] = json!("2027-01-15T08:00:00Z")
    });
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let log = fake.log();
    let w = writes(&log);
    // Every child, and the peer key Secret the operator created.
    assert_eq!(paths(&w, "DELETE").len(), children + 1);
    let last = w.last().unwrap();
    assert_eq!((last.method.as_str(), last.path.as_str()), ("PATCH", CFG));
    assert!(last.content_type.starts_with("application/json-patch+json"));
    assert_eq!(last.body[1]["op"], "remove");
    assert_eq!(
        stored(&fake),
        Vec::<String>::new(),
        "children and the config are gone"
    );
}

#[tokio::test]
async fn api_errors_back_off_exponentially_and_are_counted() {
    let (ctx, fake) = created("single-model.yaml").await;
    let deployments = "/apis/apps/v1/namespaces/inference/deployments";
    fake.fail("GET", deployments, 500, 3);
    let mut delays = Vec::new();
    for _ in 0..3 {
        let cfg = config(&fake);
        let err = reconcile(cfg.clone(), ctx.clone()).await.unwrap_err();
        assert_eq!(err.metric_label(), "kube");
        delays.push(error_policy(cfg, &err, ctx.clone()));
    }
    assert_eq!(
        delays,
        vec![
            Action::requeue(Duration::from_secs(5)),
            Action::requeue(Duration::from_secs(10)),
            Action::requeue(Duration::from_secs(20)),
        ]
    );
    assert_eq!(ctx.metrics.failures_with("kube"), 3);
    // A success resets the backoff.
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    fake.fail("GET", deployments, 500, 1);
    let cfg = config(&fake);
    let err = reconcile(cfg.clone(), ctx.clone()).await.unwrap_err();
    assert_eq!(
        error_policy(cfg, &err, ctx.clone()),
        Action::requeue(Duration::from_secs(5))
    );
}

#[tokio::test]
async fn conflict_is_retried_within_the_reconcile() {
    let (ctx, fake) = setup("single-model.yaml");
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let path = "/apis/apps/v1/namespaces/inference/deployments/llama-llama-8b-epp";
    fake.fail("PATCH", path, 409, 1);
    fake.clear_log();
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let log = fake.log();
    assert_eq!(
        log.iter()
            .filter(|s| s.method == "PATCH" && s.path == path)
            .count(),
        2
    );
    assert!(fake.get(path).is_some());
    assert_eq!(ctx.metrics.failures_with("conflict"), 0);
}

#[tokio::test]
async fn persistent_conflict_fails_with_the_conflict_label() {
    let (ctx, fake) = setup("single-model.yaml");
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let path = "/apis/apps/v1/namespaces/inference/deployments/llama-llama-8b-epp";
    fake.fail("PATCH", path, 409, 10);
    let cfg = config(&fake);
    let err = reconcile(cfg.clone(), ctx.clone()).await.unwrap_err();
    assert_eq!(err.metric_label(), "conflict");
    error_policy(cfg, &err, ctx.clone());
    assert_eq!(ctx.metrics.failures_with("conflict"), 1);
}

#[tokio::test]
async fn invalid_spec_sets_accepted_false_with_the_rule_message_and_writes_no_children() {
    let (ctx, fake) = setup("multi-model.yaml");
    fake.edit(CFG, |c| c["spec"]["bbr"]["enabled"] = json!(false));
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    fake.clear_log();
    let action = reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    let log = fake.log();
    let (event_log, log): (Vec<Seen>, Vec<Seen>) = log.into_iter().partition(is_event);
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(log[0].path.ends_with("/status"));
    let (status, message) = condition(&fake.get(CFG).unwrap(), "Accepted");
    assert_eq!(status, "False");
    assert!(
        message.contains(infergate_api::validation::BBR_REQUIRED.message),
        "{message}"
    );
    // `kubectl describe` shows it as a Warning on the config, in the config's namespace.
    let ev = events(&event_log);
    assert_eq!(ev.len(), 1, "{event_log:?}");
    assert_eq!((ev[0].0.as_str(), ev[0].1.as_str()), ("Warning", "Invalid"));
    assert!(
        ev[0]
            .2
            .contains(infergate_api::validation::BBR_REQUIRED.message),
        "{}",
        ev[0].2
    );
    assert_eq!(
        event_log[0].path,
        format!("/apis/events.k8s.io/v1/namespaces/{NS}/events")
    );
    assert_eq!(
        event_log[0].body["regarding"]["kind"],
        "InferenceGatewayConfig"
    );
    assert_eq!(event_log[0].body["regarding"]["name"], "fleet");
    assert_eq!(
        event_log[0].body["reportingController"],
        "infergate-operator"
    );
    // Reconciling the same spec again says nothing new.
    fake.clear_log();
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert_eq!(events(&fake.log()), vec![]);
    // `kubectl get -o wide` shows Ready's reason and message: they say it too.
    let cfg = fake.get(CFG).unwrap();
    assert_eq!(reason(&cfg, "Ready"), "Invalid");
    let (status, ready_message) = condition(&cfg, "Ready");
    assert_eq!(status, "False");
    assert!(
        ready_message.contains(infergate_api::validation::BBR_REQUIRED.message),
        "{ready_message}"
    );
}

#[tokio::test]
async fn quotas_the_picker_would_refuse_set_accepted_false_and_write_no_children() {
    // Only the picker's own check knows a window its buckets do not divide: the render runs it,
    // and the config is reported, not applied (no crash-looping picker).
    let (ctx, fake) = setup("multi-model.yaml");
    fake.edit(CFG, |c| {
        c["spec"]["quotas"] = json!({ "windowSeconds": 7, "buckets": 3 });
    });
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    fake.clear_log();
    let action = reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    let log: Vec<Seen> = fake.log().into_iter().filter(|s| !is_event(s)).collect();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(log[0].path.ends_with("/status"));
    let (status, message) = condition(&fake.get(CFG).unwrap(), "Accepted");
    assert_eq!(status, "False");
    assert!(
        message.starts_with("spec.quotas is not accepted by the endpoint picker: "),
        "{message}"
    );
}

/// Marks every stored Deployment available and every Gateway programmed.
fn children_ready(fake: &Fake) {
    for d in fake
        .paths()
        .into_iter()
        .filter(|p| p.contains("/deployments/"))
    {
        fake.edit(&d, |o| {
            let want = o["spec"]["replicas"].clone();
            o["status"] = json!({ "observedGeneration": 0, "replicas": want, "updatedReplicas": want, "availableReplicas": want });
        });
    }
    for g in fake
        .paths()
        .into_iter()
        .filter(|p| p.contains("/gateways/"))
    {
        fake.edit(&g, |o| {
            o["status"] = json!({ "conditions": [{ "type": "Programmed", "status": "True", "reason": "Programmed",
                "message": "", "lastTransitionTime": "2027-01-01T00:00:00Z" }] });
        });
    }
}

/// The stored config's scheduler `name`: its Ready condition's (status, reason, message).
fn scheduler_ready(cfg: &Value, name: &str) -> (String, String, String) {
    let s = cfg["status"]["schedulers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap();
    let c = &s["conditions"][0];
    let field = |k: &str| c[k].as_str().unwrap().to_owned();
    (field("status"), field("reason"), field("message"))
}

#[tokio::test]
async fn a_model_selector_matching_no_ready_pod_keeps_the_config_from_ready() {
    // Every child healthy, but the qwen scheduler's modelSelector (app=sglang-qwen) matches
    // no pod: its model has no endpoint, so the config is not Ready and says why.
    let (ctx, fake) = created("multi-model.yaml").await;
    children_ready(&fake);
    fake.delete(&format!("/api/v1/namespaces/{NS}/pods/qwen-7b-server-0"));
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let cfg = fake.get(CFG).unwrap();
    let (status, message) = condition(&cfg, "Ready");
    assert_eq!(
        (status.as_str(), reason(&cfg, "Ready").as_str()),
        ("False", "NoModelServers")
    );
    assert_eq!(
        message,
        "scheduler qwen-7b: no pod in namespace inference matches modelSelector app=sglang-qwen"
    );
    let (s, r, m) = scheduler_ready(&cfg, "qwen-7b");
    assert_eq!((s.as_str(), r.as_str()), ("False", "NoModelServers"));
    assert!(m.contains("app=sglang-qwen"), "{m}");
    assert_eq!(scheduler_ready(&cfg, "llama-70b").0, "True");
    assert!(
        events(&fake.log())
            .iter()
            .any(|(t, r, _)| t == "Warning" && r == "NoModelServers"),
        "{:?}",
        fake.log()
    );
    // A matching pod that is still starting: the config waits for it (Pending), no warning.
    model_pod(&fake, NS, "qwen-a", &json!({"app": "sglang-qwen"}), false);
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let cfg = fake.get(CFG).unwrap();
    assert_eq!(reason(&cfg, "Ready"), "Pending");
    assert!(
        condition(&cfg, "Ready")
            .1
            .contains("none of the 1 pods matching modelSelector app=sglang-qwen is ready"),
        "{}",
        condition(&cfg, "Ready").1
    );
    assert_eq!(scheduler_ready(&cfg, "qwen-7b").1, "ModelServersNotReady");
    // Ready: the config is.
    model_pod(&fake, NS, "qwen-a", &json!({"app": "sglang-qwen"}), true);
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let cfg = fake.get(CFG).unwrap();
    assert_eq!(condition(&cfg, "Ready").0, "True");
    assert_eq!(scheduler_ready(&cfg, "qwen-7b").1, "Available");
}

#[tokio::test]
async fn readiness_rolls_up_from_children() {
    let (ctx, fake) = created("multi-model.yaml").await;
    children_ready(&fake);
    let action = reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    let cfg = fake.get(CFG).unwrap();
    for c in ["Accepted", "Ready", "GatewayProgrammed", "BBRReady"] {
        assert_eq!(condition(&cfg, c).0, "True", "{c}");
    }
    let typed: InferenceGatewayConfig = serde_json::from_value(cfg).unwrap();
    let st = typed.status.unwrap();
    assert!(
        st.schedulers
            .iter()
            .all(|s| s.rollout_state == RolloutState::Available)
    );
    // Pending (while rolling out) to Ready: one Normal event.
    assert_eq!(
        events(&fake.log()),
        vec![(
            "Normal".to_owned(),
            "Ready".to_owned(),
            "the gateway serves traffic".to_owned()
        )]
    );
}

#[tokio::test]
async fn an_event_the_api_server_refuses_does_not_fail_the_reconcile() {
    // Events are for people reading `kubectl describe`: an operator whose Role lacks them (an
    // older chart) still reconciles and writes the status.
    let (ctx, fake) = setup("multi-model.yaml");
    fake.edit(CFG, |c| c["spec"]["bbr"]["enabled"] = json!(false));
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let events_path = format!("/apis/events.k8s.io/v1/namespaces/{NS}/events");
    fake.fail("POST", &events_path, 403, 1);
    fake.clear_log();
    let action = reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert_eq!(reason(&fake.get(CFG).unwrap(), "Ready"), "Invalid");
    assert!(fake.log().iter().any(|s| s.path == events_path));
}

#[tokio::test]
async fn a_changed_error_is_a_new_warning_with_its_own_message() {
    let (ctx, fake) = setup("multi-model.yaml");
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    fake.edit(CFG, |c| c["spec"]["bbr"]["enabled"] = json!(false));
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    // Another mistake: the Ready reason stays Invalid, the message changes, so a new Warning.
    fake.edit(CFG, |c| {
        c["spec"]["bbr"]["enabled"] = json!(true);
        c["spec"]["quotas"] = json!({ "windowSeconds": 7, "buckets": 3 });
    });
    fake.clear_log();
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let ev = events(&fake.log());
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].1, "Invalid");
    assert!(ev[0].2.contains("spec.quotas"), "{}", ev[0].2);
    // Back to the first mistake: a Warning again, with that mistake's message (not the
    // previous Event's, as a series of the same reason would show it).
    fake.edit(CFG, |c| {
        c["spec"]["bbr"]["enabled"] = json!(false);
        c["spec"]["quotas"] = Value::Null;
    });
    fake.clear_log();
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let ev = events(&fake.log());
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(
        ev[0]
            .2
            .contains(infergate_api::validation::BBR_REQUIRED.message),
        "{}",
        ev[0].2
    );
}

#[tokio::test]
async fn overlong_child_names_are_reported_as_not_accepted() {
    let (client, fake) = fake::client();
    let mut cfg = serde_json::to_value(common::example("single-model.yaml")).unwrap();
    let name = "llama-with-a-rather-long-config-name";
    cfg["metadata"]["name"] = json!(name);
    cfg["spec"]["schedulers"][0]["name"] = json!("and-a-long-scheduler-name");
    let path =
        format!("/apis/infergate.dev/v1alpha1/namespaces/inference/inferencegatewayconfigs/{name}");
    fake.put(&path, cfg);
    let ctx = Arc::new(Context::new(client, common::opts(), Metrics::default()).with_clock(clock));
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let (status, message) = condition(&fake.get(&path).unwrap(), "Accepted");
    assert_eq!(status, "False");
    assert!(message.contains("longer than 63 characters"), "{message}");
    assert!(
        stored(&fake)
            .iter()
            .all(|p| p.contains("inferencegatewayconfigs")),
        "no child applied"
    );
}

#[tokio::test]
async fn a_missing_upstream_api_is_named_in_the_error() {
    let (ctx, fake) = created("single-model.yaml").await;
    fake.fail(
        "GET",
        "/apis/gateway.envoyproxy.io/v1alpha1/namespaces/inference/securitypolicies",
        404,
        1,
    );
    let cfg = config(&fake);
    let err = reconcile(cfg.clone(), ctx.clone()).await.unwrap_err();
    assert_eq!(err.metric_label(), "missing_api");
    assert!(
        err.to_string()
            .contains("SecurityPolicy API (gateway.envoyproxy.io/v1alpha1) is not installed"),
        "{err}"
    );
    error_policy(cfg, &err, ctx.clone());
    assert_eq!(ctx.metrics.failures_with("missing_api"), 1);
}

#[tokio::test]
async fn deletion_with_an_upstream_api_gone_still_removes_the_finalizer() {
    // Envoy Gateway uninstalled before the config: its kinds answer 404. Nothing of theirs can
    // exist, so cleanup deletes the rest and the finalizer goes; the config must not stick.
    let (ctx, fake) = created("single-model.yaml").await;
    let cfg_path = fake
        .paths()
        .into_iter()
        .find(|p| p.contains("/inferencegatewayconfigs/"))
        .unwrap();
    fake.fail(
        "GET",
        "/apis/gateway.envoyproxy.io/v1alpha1/namespaces/inference/securitypolicies",
        404,
        1,
    );
    fake.fail(
        "GET",
        "/apis/gateway.envoyproxy.io/v1alpha1/namespaces/inference/envoyextensionpolicies",
        404,
        1,
    );
    fake.edit(&cfg_path, |c| {
        c["metadata"]["deletionTimestamp"] = json!("2027-01-15T08:00:00Z")
    });
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let remaining: Vec<String> = stored(&fake)
        .into_iter()
        .filter(|p| !p.contains("envoyextensionpolicies"))
        .collect();
    assert_eq!(
        remaining,
        Vec::<String>::new(),
        "children and the config are gone"
    );
}

#[tokio::test]
async fn a_scheduler_with_several_replicas_gets_a_random_peer_key_once_kept_and_deleted_with_the_config()
 {
    let (ctx, fake) = created("multi-model.yaml").await;
    let path = format!("/api/v1/namespaces/{NS}/secrets/fleet-llama-70b-epp-peer-key");
    let secret = fake.get(&path).expect("the peer key Secret is created");
    let key = secret["stringData"]["key"].as_str().unwrap().to_owned();
    assert_eq!(key.len(), 64, "32 random bytes, hex");
    assert!(key.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(
        secret["metadata"]["ownerReferences"][0]["kind"],
        "InferenceGatewayConfig"
    );
    assert_eq!(secret["metadata"]["ownerReferences"][0]["controller"], true);
    // The Deployment mounts exactly that Secret's key where the picker's flag reads it.
    let d = fake
        .get(&format!(
            "/apis/apps/v1/namespaces/{NS}/deployments/fleet-llama-70b-epp"
        ))
        .unwrap();
    let pod = &d["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"].is_object())
        .unwrap();
    assert_eq!(
        volume["secret"]["secretName"],
        "fleet-llama-70b-epp-peer-key"
    );
    let args = pod["containers"][0]["args"].as_array().unwrap();
    assert!(
        args.iter()
            .any(|a| a == "--peer-key-file=/etc/infergate-peer/key")
    );
    // Later reconciles keep the key (after the status catches up, no write at all).
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    fake.clear_log();
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert!(writes(&fake.log()).is_empty(), "{:?}", writes(&fake.log()));
    assert_eq!(fake.get(&path).unwrap()["stringData"]["key"], key.as_str());
    // Deleted with the config; one made by hand (no owner) would be kept.
    fake.edit(&path, |s| s["metadata"]["ownerReferences"] = json!([]));
    fake.edit(CFG, |c| {
        c["metadata"]["deletionTimestamp"] = json!("2027-01-15T08:00:00Z")
    });
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert!(
        fake.get(&path).is_some(),
        "a hand-made key is not ours to delete"
    );
}

fn reason(cfg: &Value, type_: &str) -> String {
    find_condition(cfg, type_)["reason"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_missing_upstream_api_on_a_new_config_is_reported_in_its_status() {
    // A first config on a cluster without Envoy Gateway: `kubectl get igwc` must say why nothing
    // happens, not show empty ACCEPTED / READY columns while only the operator's log knows.
    let (ctx, fake) = setup("single-model.yaml");
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    fake.fail(
        "GET",
        "/apis/gateway.envoyproxy.io/v1alpha1/namespaces/inference/securitypolicies",
        404,
        1,
    );
    let err = reconcile(config(&fake), ctx.clone()).await.unwrap_err();
    assert_eq!(err.metric_label(), "missing_api");
    let cfg = fake.get(&config_path(&fake)).unwrap();
    let (status, message) = condition(&cfg, "Ready");
    assert_eq!(status, "False");
    assert_eq!(reason(&cfg, "Ready"), "MissingAPI");
    assert!(
        message.contains("SecurityPolicy API (gateway.envoyproxy.io/v1alpha1) is not installed"),
        "{message}"
    );
    assert_eq!(condition(&cfg, "Accepted").0, "True");
    assert_eq!(cfg["status"]["observedGeneration"], json!(1));
}

#[tokio::test]
async fn a_child_the_api_server_refuses_is_named_with_its_reason_in_the_status() {
    // An admission webhook, a quota or a missing permission refuses one child: the status
    // names the child and carries the API server's own message and code.
    let (ctx, fake) = created("single-model.yaml").await;
    let route = "/apis/gateway.networking.k8s.io/v1/namespaces/inference/httproutes/llama-llama-8b";
    fake.edit(route, |o| o["spec"]["parentRefs"] = json!([]));
    fake.fail("PATCH", route, 422, 1);
    let cfg = config(&fake);
    let err = reconcile(cfg.clone(), ctx.clone()).await.unwrap_err();
    assert_eq!(err.metric_label(), "kube");
    let report = err.report();
    assert!(
        report.contains("HTTPRoute inference/llama-llama-8b")
            && report.contains("injected failure")
            && report.contains("422"),
        "{report}"
    );
    let stored = fake.get(&config_path(&fake)).unwrap();
    let (status, message) = condition(&stored, "Ready");
    assert_eq!(status, "False");
    assert_eq!(reason(&stored, "Ready"), "ApplyFailed");
    assert_eq!(message, report);
    // The same failure again changes nothing in the status: no write, so no watch event that
    // would bypass the backoff.
    fake.fail("PATCH", route, 422, 1);
    fake.clear_log();
    reconcile(config(&fake), ctx.clone()).await.unwrap_err();
    assert!(
        fake.log().iter().all(|s| !s.path.ends_with("/status")),
        "{:?}",
        fake.log()
    );
    // Once the child applies, Ready leaves the failure.
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let stored = fake.get(&config_path(&fake)).unwrap();
    assert_eq!(reason(&stored, "Ready"), "Pending");
}

#[tokio::test]
async fn a_missing_redis_password_secret_is_named_in_ready() {
    // The pickers' pods would wait in CreateContainerConfigError and the Deployment would say
    // only "Progressing": the status names the Secret, the key and the field that points at it.
    let (ctx, fake) = created("flow-control-quotas.yaml").await;
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let stored = fake.get(&config_path(&fake)).unwrap();
    let (status, message) = condition(&stored, "Ready");
    assert_eq!(status, "False");
    assert_eq!(reason(&stored, "Ready"), "SecretNotFound");
    assert!(
        message.contains(
            "Secret inference/quota-redis (spec.quotas.redis.passwordSecretRef) does not exist"
        ),
        "{message}"
    );
    // There, but without the key.
    let secret = "/api/v1/namespaces/inference/secrets/quota-redis";
    fake.put(
        secret,
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "quota-redis", "namespace": NS},
               "data": {"pass": "c2VjcmV0"}}),
    );
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let (_, message) = condition(&fake.get(&config_path(&fake)).unwrap(), "Ready");
    assert!(
        message.contains(
            "Secret inference/quota-redis (spec.quotas.redis.passwordSecretRef) has no key `password`"
        ),
        "{message}"
    );
    fake.edit(secret, |s| s["data"] = json!({"password": "c2VjcmV0"}));
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let stored = fake.get(&config_path(&fake)).unwrap();
    assert_eq!(reason(&stored, "Ready"), "Pending");
}

#[tokio::test]
async fn a_missing_certificate_secret_is_named_in_ready() {
    let (ctx, fake) = created("tgi-tls-secret.yaml").await;
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let stored = fake.get(&config_path(&fake)).unwrap();
    assert_eq!(reason(&stored, "Ready"), "SecretNotFound");
    let (_, message) = condition(&stored, "Ready");
    assert!(
        message
            .contains("Secret serving/mistral-tls (spec.tls.certificateSecretRef) does not exist"),
        "{message}"
    );
}

#[tokio::test]
async fn a_forbidden_peer_key_read_names_the_secret_in_ready() {
    // An operator whose role lacks `get` on Secrets: the status says which Secret it could not
    // read and the API server's answer, not only "Kubernetes API call failed".
    let (ctx, fake) = setup("multi-model.yaml");
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    let path = format!("/api/v1/namespaces/{NS}/secrets/fleet-llama-70b-epp-peer-key");
    fake.fail("GET", &path, 403, 1);
    reconcile(config(&fake), ctx.clone()).await.unwrap_err();
    let (status, message) = condition(&fake.get(CFG).unwrap(), "Ready");
    assert_eq!(status, "False");
    assert_eq!(
        message,
        "cannot read Secret inference/fleet-llama-70b-epp-peer-key: injected failure (HTTP 403 Forbidden)"
    );
}

#[tokio::test]
async fn an_existing_object_the_config_does_not_manage_is_not_taken_over() {
    // A Gateway of the user's that happens to have the config's name: a forced apply would
    // take it over, and deleting the config would delete it. The config reports the clash and
    // leaves it alone.
    let (ctx, fake) = setup("single-model.yaml");
    let gateway = "/apis/gateway.networking.k8s.io/v1/namespaces/inference/gateways/llama";
    let theirs = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "llama", "namespace": NS, "uid": "someone-else"},
        "spec": {"gatewayClassName": "other", "listeners": []}});
    fake.put(gateway, theirs.clone());
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    fake.clear_log();
    let err = reconcile(config(&fake), ctx.clone()).await.unwrap_err();
    assert_eq!(err.metric_label(), "name_taken");
    assert!(
        fake.log()
            .iter()
            .all(|s| !(s.method == "PATCH" && s.path == gateway)),
        "{:?}",
        fake.log()
    );
    assert_eq!(fake.get(gateway).unwrap(), theirs);
    let stored = fake.get(&config_path(&fake)).unwrap();
    assert_eq!(reason(&stored, "Ready"), "NameTaken");
    let (_, message) = condition(&stored, "Ready");
    assert!(
        message.starts_with(
            "Gateway inference/llama already exists and is not managed by this config"
        ),
        "{message}"
    );
}

#[tokio::test]
async fn an_operator_started_without_its_crd_says_so_instead_of_idling() {
    // Without the CRD the controller's watch fails with a 404 that kube logs at debug only: the
    // operator would run, ready, doing nothing. The start-up check names what to install.
    let (ctx, fake) = setup("single-model.yaml");
    let all = "/apis/infergate.dev/v1alpha1/inferencegatewayconfigs";
    infergate_operator::reconcile::preflight(&ctx.client, &WatchScope::Cluster)
        .await
        .unwrap();
    fake.fail("GET", all, 404, 1);
    let err = infergate_operator::reconcile::preflight(&ctx.client, &WatchScope::Cluster)
        .await
        .unwrap_err();
    assert_eq!(err.metric_label(), "missing_crd");
    let text = err.to_string();
    assert!(
        text.contains("InferenceGatewayConfig CRD (infergate.dev/v1alpha1) is not installed")
            && text.contains("kubectl apply --server-side -f crds/"),
        "{text}"
    );
    // A list it may not make is named with the API server's answer.
    fake.fail("GET", all, 403, 1);
    let err = infergate_operator::reconcile::preflight(&ctx.client, &WatchScope::Cluster)
        .await
        .unwrap_err();
    assert!(
        err.report()
            .starts_with("cannot list InferenceGatewayConfigs in every namespace: injected failure (HTTP 403 Forbidden)"),
        "{}",
        err.report()
    );
}

/// A status whose `Ready` condition has `status`, `reason` and `message`.
fn ready_status(status: &str, reason: &str, message: &str) -> InferenceGatewayConfigStatus {
    serde_json::from_value(json!({ "conditions": [{ "type": "Ready", "status": status,
        "reason": reason, "message": message, "lastTransitionTime": "2027-01-01T00:00:00Z" }] }))
    .unwrap()
}

#[test]
fn rollout_progress_is_no_event_and_a_long_message_is_cut_to_an_events_note() {
    let waiting = |m: &str| ready_status("False", "Pending", m);
    assert_eq!(
        ready_event(Some(&waiting("bbr 0/1")), &waiting("bbr 1/1; picker 0/2")),
        None
    );
    let first = ready_event(None, &waiting("bbr 0/1")).unwrap();
    assert!(!first.warning);
    let long = "é".repeat(700); // 1,400 bytes
    let ev = ready_event(
        Some(&waiting("x")),
        &ready_status("False", "ApplyFailed", &long),
    )
    .unwrap();
    assert!(ev.warning);
    assert!(
        ev.note.len() <= 1024 && ev.note.ends_with("..."),
        "{}",
        ev.note.len()
    );
    assert!(long.starts_with(ev.note.trim_end_matches("...")));
}

/// Runs the controller (`reconcile::run`: the configs and every watch) against the fake until
/// the test ends.
fn start_controller(ctx: &Arc<Context>) -> tokio::task::JoinHandle<()> {
    start_controller_in(ctx, WatchScope::Cluster)
}

/// [`start_controller`] over `scope`.
fn start_controller_in(ctx: &Arc<Context>, scope: WatchScope) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(
        ctx.client.clone(),
        ctx.clone(),
        scope,
        std::future::pending(),
    ))
}

/// Longest wait for a status change caused by a watch: well under the 15 s requeue of a config
/// not ready (300 s once ready), so a timed pass cannot be what ends the wait.
const PROMPTLY: Duration = Duration::from_secs(5);

/// Waits until the stored config's `Ready` reason is `want` and returns how long that took on
/// the paused clock; fails after [`PROMPTLY`].
async fn ready_reason_becomes(fake: &Fake, want: &str) -> Duration {
    let start = tokio::time::Instant::now();
    let wall = std::time::Instant::now();
    loop {
        let cfg = fake.get(&config_path(fake)).unwrap();
        if reason(&cfg, "Ready") == want {
            let took = start.elapsed();
            eprintln!(
                "Ready reason {want} after {took:?} on the paused clock ({:?} of wall time)",
                wall.elapsed()
            );
            return took;
        }
        assert!(
            start.elapsed() < PROMPTLY,
            "Ready is still {} ({}) after {PROMPTLY:?}, not {want}",
            reason(&cfg, "Ready"),
            condition(&cfg, "Ready").1
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Starts the controller and lets its first passes (every config and owned child listed)
/// finish, so what follows is caused by the change the test makes.
async fn controller_settled(ctx: &Arc<Context>) -> tokio::task::JoinHandle<()> {
    let controller = start_controller(ctx);
    tokio::time::sleep(Duration::from_secs(1)).await;
    controller
}

#[tokio::test(start_paused = true)]
async fn a_matching_ready_pod_makes_a_config_without_model_servers_ready_at_once() {
    assert!(PROMPTLY < REQUEUE_NOT_READY);
    let (ctx, fake) = created("multi-model.yaml").await;
    children_ready(&fake);
    fake.delete(&format!("/api/v1/namespaces/{NS}/pods/qwen-7b-server-0"));
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert_eq!(reason(&fake.get(CFG).unwrap(), "Ready"), "NoModelServers");
    let controller = controller_settled(&ctx).await;
    assert_eq!(reason(&fake.get(CFG).unwrap(), "Ready"), "NoModelServers");
    // A model server of the qwen scheduler appears, not ready yet, then ready.
    model_pod(&fake, NS, "qwen-a", &json!({"app": "sglang-qwen"}), false);
    ready_reason_becomes(&fake, "Pending").await;
    model_pod(&fake, NS, "qwen-a", &json!({"app": "sglang-qwen"}), true);
    ready_reason_becomes(&fake, "Ready").await;
    controller.abort();
}

#[tokio::test(start_paused = true)]
async fn a_ready_config_whose_model_servers_go_away_says_so_at_once() {
    let (ctx, fake) = created("multi-model.yaml").await;
    children_ready(&fake);
    let action = reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    assert_eq!(reason(&fake.get(CFG).unwrap(), "Ready"), "Ready");
    let controller = controller_settled(&ctx).await;
    let pod = format!("/api/v1/namespaces/{NS}/pods/qwen-7b-server-0");
    let labels = fake.get(&pod).unwrap()["metadata"]["labels"].clone();
    fake.delete(&pod);
    ready_reason_becomes(&fake, "NoModelServers").await;
    // Back, then taken out of the selector by relabelling (its event carries only the new
    // labels, which match no config: the controller remembers which config it served).
    model_pod(&fake, NS, "qwen-7b-server-0", &labels, true);
    ready_reason_becomes(&fake, "Ready").await;
    model_pod(
        &fake,
        NS,
        "qwen-7b-server-0",
        &json!({"app": "debug"}),
        true,
    );
    ready_reason_becomes(&fake, "NoModelServers").await;
    controller.abort();
}

/// Secrets are not watched (that would need `list` and `watch` on every Secret in the cluster):
/// a deleted one the spec names shows at the next timed pass of a ready config, not before.
#[tokio::test(start_paused = true)]
async fn a_deleted_secret_the_spec_names_shows_at_the_next_timed_pass() {
    let (ctx, fake) = created("flow-control-quotas.yaml").await;
    let secret = format!("/api/v1/namespaces/{NS}/secrets/quota-redis");
    let object = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "quota-redis", "namespace": NS},
        "data": {"password": "c2VjcmV0"}});
    fake.put(&secret, object.clone());
    children_ready(&fake);
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert_eq!(
        reason(&fake.get(&config_path(&fake)).unwrap(), "Ready"),
        "Ready"
    );
    let controller = controller_settled(&ctx).await;
    fake.delete(&secret);
    tokio::time::sleep(PROMPTLY).await;
    assert_eq!(
        reason(&fake.get(&config_path(&fake)).unwrap(), "Ready"),
        "Ready",
        "nothing watches Secrets"
    );
    tokio::time::sleep(infergate_operator::reconcile::REQUEUE_READY).await;
    ready_reason_becomes(&fake, "SecretNotFound").await;
    let (_, message) = condition(&fake.get(&config_path(&fake)).unwrap(), "Ready");
    assert!(
        message.contains("Secret inference/quota-redis"),
        "{message}"
    );
    controller.abort();
}

#[tokio::test(start_paused = true)]
async fn a_route_the_gateway_controller_stops_accepting_turns_a_ready_config_at_once() {
    let (ctx, fake) = created("multi-model.yaml").await;
    children_ready(&fake);
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert_eq!(reason(&fake.get(CFG).unwrap(), "Ready"), "Ready");
    let controller = controller_settled(&ctx).await;
    let route =
        format!("/apis/gateway.networking.k8s.io/v1/namespaces/{NS}/httproutes/fleet-qwen-7b");
    fake.edit(&route, |r| {
        r["status"] = json!({"parents": [{"parentRef": {"name": "fleet"},
            "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
            "conditions": [{"type": "ResolvedRefs", "status": "False", "reason": "InvalidKind",
                "message": "InferencePool is not a supported backend",
                "lastTransitionTime": "2027-01-01T00:00:00Z"}]}]});
    });
    ready_reason_becomes(&fake, "RouteNotAccepted").await;
    controller.abort();
}

/// Envoy Gateway refusing one of the config's policies (here a second ClientTrafficPolicy
/// already on the Gateway, so a client's tenant header would not be removed) turns a ready
/// config not ready as soon as it writes the policy's status: the policies are watched.
#[tokio::test(start_paused = true)]
async fn a_policy_the_gateway_controller_refuses_turns_a_ready_config_at_once() {
    let (ctx, fake) = created("multi-model.yaml").await;
    children_ready(&fake);
    reconcile(config(&fake), ctx.clone()).await.unwrap();
    assert_eq!(reason(&fake.get(CFG).unwrap(), "Ready"), "Ready");
    let controller = controller_settled(&ctx).await;
    let policy = format!(
        "/apis/gateway.envoyproxy.io/v1alpha1/namespaces/{NS}/clienttrafficpolicies/fleet-client"
    );
    fake.edit(&policy, |p| {
        p["status"] = json!({"ancestors": [{
            "ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "fleet"},
            "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
            "conditions": [{"type": "Accepted", "status": "False", "reason": "Conflicted",
                "message": "Unable to target Gateway fleet, another ClientTrafficPolicy has already attached to it",
                "lastTransitionTime": "2027-01-01T00:00:00Z"}]}]});
    });
    ready_reason_becomes(&fake, "PolicyNotAccepted").await;
    let (_, message) = condition(&fake.get(&config_path(&fake)).unwrap(), "Ready");
    assert_eq!(
        message,
        "ClientTrafficPolicy fleet-client, Gateway fleet: Accepted=False (Conflicted): Unable to target Gateway fleet, another ClientTrafficPolicy has already attached to it"
    );
    controller.abort();
}

/// The release's configs as the chart's `pre-delete` hook sees them: `fleet` labelled with the
/// release, and `other` (the same spec, another name, no release label) beside it.
fn release_configs(fake: &Fake) {
    fake.edit(CFG, |c| {
        c["metadata"]["labels"]["app.kubernetes.io/instance"] = json!("rel");
    });
    let mut other = fake.get(CFG).unwrap();
    other["metadata"]["name"] = json!("other");
    other["metadata"]["labels"] = json!({});
    fake.put(&CFG.replace("/fleet", "/other"), other);
}

/// `infergate delete-configs --selector app.kubernetes.io/instance=rel`, polling every second.
async fn delete_release(
    ctx: &Arc<Context>,
    timeout: Duration,
) -> Result<Vec<String>, infergate_operator::uninstall::UninstallError> {
    infergate_operator::uninstall::delete_and_wait(
        ctx.client.clone(),
        "app.kubernetes.io/instance=rel",
        &WatchScope::Cluster,
        timeout,
        Duration::from_secs(1),
    )
    .await
}

/// DELETE requests for configs the fake has seen.
fn config_deletes(fake: &Fake) -> usize {
    fake.log()
        .iter()
        .filter(|s| s.method == "DELETE" && s.path.contains("/inferencegatewayconfigs/"))
        .count()
}

/// What `infergate delete-configs` (the chart's uninstall hook) does with the operator running:
/// the release's config is deleted, the operator's finalizer deletes its children and lets it
/// go, and the call returns then; a config of no release is left alone.
#[tokio::test(start_paused = true)]
async fn delete_configs_returns_once_the_operator_has_let_the_releases_configs_go() {
    let (ctx, fake) = created("multi-model.yaml").await;
    release_configs(&fake);
    assert_eq!(
        fake.get(CFG).unwrap()["metadata"]["finalizers"],
        json!([FINALIZER])
    );
    let children = |fake: &Fake| {
        fake.paths()
            .into_iter()
            .filter(|p| p.contains("/deployments/fleet-"))
            .count()
    };
    assert!(children(&fake) > 0);
    let controller = controller_settled(&ctx).await;
    let started = tokio::time::Instant::now();
    let deleted = delete_release(&ctx, Duration::from_secs(60)).await.unwrap();
    assert_eq!(deleted, ["inference/fleet"]);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(fake.get(CFG).is_none(), "the config is gone");
    assert_eq!(
        children(&fake),
        0,
        "its children were deleted by the finalizer"
    );
    assert!(fake.get(&CFG.replace("/fleet", "/other")).is_some());
    controller.abort();
}

/// Without an operator nothing removes the finalizer: the call gives up after its timeout and
/// names what is left and why it is stuck.
#[tokio::test(start_paused = true)]
async fn delete_configs_without_an_operator_times_out_naming_the_configs_left() {
    let (ctx, fake) = created("multi-model.yaml").await;
    release_configs(&fake);
    let err = delete_release(&ctx, Duration::from_secs(30))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("1 InferenceGatewayConfig(s) matching `app.kubernetes.io/instance=rel` still exist after 30s: inference/fleet (finalizers: infergate.dev/cleanup)"),
        "{text}"
    );
    assert!(text.contains("is the operator running?"), "{text}");
    // Deleted once, marked, not removed.
    let stored = fake.get(CFG).unwrap();
    assert!(!stored["metadata"]["deletionTimestamp"].is_null());
    assert_eq!(config_deletes(&fake), 1);
    // A second run (the hook retried) waits for it again without deleting it twice.
    let err = delete_release(&ctx, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("inference/fleet"), "{err}");
    assert_eq!(config_deletes(&fake), 1);
}

/// The `(group, resource, verb)` RBAC checks for a request the fake saw: `resource/sub` for a
/// subresource; `watch` for a watch, `list` for a collection read.
fn rbac_of(s: &Seen) -> (String, String, String) {
    let segs: Vec<&str> = s.path.trim_start_matches('/').split('/').collect();
    // `/api/v1/...` (core) or `/apis/GROUP/VERSION/...`.
    let (group, rest) = match segs.first() {
        Some(&"api") => ("", &segs[2..]),
        _ => (segs[1], &segs[3..]),
    };
    let rest = match rest {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let resource = match rest {
        [r] | [r, _] => (*r).to_owned(),
        [r, _, sub] => format!("{r}/{sub}"),
        other => panic!("unexpected path {other:?} in {}", s.path),
    };
    let named = rest.len() > 1;
    let verb = match (s.method.as_str(), named) {
        ("GET", _) if s.query.split('&').any(|kv| kv == "watch=true") => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        (m, _) => panic!("unexpected method {m}"),
    };
    (group.to_owned(), resource, verb.to_owned())
}

/// A config's whole life under the controller (start-up check, watches, first apply with its
/// name checks, peer key, status, Events, deletion with the finalizer) makes only calls the
/// operator's RBAC list grants; and every read it grants (`get`, `list`, `watch`) is one the
/// operator made here or one the pickers' Roles grant (Kubernetes lets the operator create only
/// Roles that grant what it holds). A `watch` granted on a kind it never watches fails this.
#[tokio::test(start_paused = true)]
async fn a_configs_life_needs_exactly_the_reads_the_cluster_role_grants() {
    use infergate_operator::rbac::{LEADER_RULES, METRICS_AUTH_RULES, NAMESPACED_RULES, grants};

    let (ctx, fake) = setup("multi-model.yaml");
    infergate_operator::reconcile::preflight(&ctx.client, &WatchScope::Cluster)
        .await
        .unwrap();
    let controller = controller_settled(&ctx).await;
    children_ready(&fake);
    ready_reason_becomes(&fake, "Ready").await;
    fake.edit(CFG, |c| {
        c["metadata"]["deletionTimestamp"] = json!("2027-01-15T08:00:00Z")
    });
    let start = tokio::time::Instant::now();
    while fake.get(CFG).is_some() {
        assert!(start.elapsed() < PROMPTLY, "the config was not let go");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    controller.abort();

    let used: BTreeSet<_> = fake.log().iter().map(rbac_of).collect();
    let all: Vec<_> = [NAMESPACED_RULES, METRICS_AUTH_RULES, LEADER_RULES].concat();
    let granted = grants(&all);
    let missing: Vec<_> = used.difference(&granted).collect();
    assert!(
        missing.is_empty(),
        "calls the ClusterRole does not grant: {missing:?}"
    );

    // What the pickers' Roles grant, over every example.
    let mut for_pickers = BTreeSet::new();
    for file in common::example_files() {
        for child in common::children(&common::load(&file)) {
            if child.resource.kind == "Role" {
                for_pickers.extend(common::granted_by(&child.object.data["rules"]));
            }
        }
    }
    let beyond: Vec<_> = for_pickers.difference(&granted).collect();
    assert!(
        beyond.is_empty(),
        "the pickers' Roles grant what the operator lacks: {beyond:?}"
    );
    let reads = |set: &BTreeSet<(String, String, String)>| -> BTreeSet<_> {
        set.iter()
            .filter(|(_, _, v)| ["get", "list", "watch"].contains(&v.as_str()))
            .cloned()
            .collect()
    };
    let needed: BTreeSet<_> = reads(&used).union(&reads(&for_pickers)).cloned().collect();
    let unused: Vec<_> = reads(&grants(NAMESPACED_RULES))
        .difference(&needed)
        .cloned()
        .collect();
    assert!(
        unused.is_empty(),
        "reads granted but never made: {unused:?}"
    );
}

/// A namespace no `--watch-namespaces` in these tests lists (after `inference` in path order, so
/// [`config_path`] still finds the watched config).
const OUTSIDE: &str = "outside";

/// The operator watching namespace `inference` only.
fn inference_only() -> WatchScope {
    WatchScope::from_names([NS.to_owned()]).unwrap()
}

/// Stores a copy of the watched config in [`OUTSIDE`] (labelled `labels`), with a ready model
/// server of each scheduler there, and returns its path.
fn config_outside(fake: &Fake, labels: Value) -> String {
    let mut cfg = fake.get(CFG).unwrap();
    cfg["metadata"]["namespace"] = json!(OUTSIDE);
    cfg["metadata"]["labels"] = labels;
    cfg["metadata"]["uid"] = json!("uid-outside");
    for field in ["finalizers", "deletionTimestamp"] {
        cfg["metadata"].as_object_mut().unwrap().remove(field);
    }
    cfg.as_object_mut().unwrap().remove("status");
    for s in cfg["spec"]["schedulers"].as_array().unwrap() {
        let name = format!("{}-server-0", s["name"].as_str().unwrap());
        model_pod(fake, OUTSIDE, &name, &s["modelSelector"], true);
    }
    let path = CFG.replace("/namespaces/inference/", &format!("/namespaces/{OUTSIDE}/"));
    fake.put(&path, cfg);
    path
}

/// Every request that did not go through namespace `inference`'s own paths, as `METHOD path?query`.
fn outside_inference(fake: &Fake) -> Vec<String> {
    fake.log()
        .iter()
        .filter(|s| !s.path.contains(&format!("/namespaces/{NS}/")))
        .map(|s| format!("{} {}?{}", s.method, s.path, s.query))
        .collect()
}

/// With `--watch-namespaces=inference` a config there goes through its whole life (start-up
/// check, watches, first apply, readiness from the watched children, deletion with the
/// finalizer) through namespace `inference`'s paths only: a config in another namespace, and
/// its model servers, are never read or written, and nothing asks for a path across namespaces
/// (which the namespaced Roles would refuse). Every call is one the Role in each watched
/// namespace grants; the ClusterRole keeps only the reviews.
#[tokio::test(start_paused = true)]
async fn a_namespaced_operator_works_only_through_its_namespaces_paths() {
    use infergate_operator::rbac::{
        METRICS_AUTH_RULES, NAMESPACED_RULES, cluster_role, grants, namespace_role,
    };

    let (ctx, fake) = setup("multi-model.yaml");
    let outside = config_outside(&fake, json!({}));
    let scope = inference_only();
    fake.clear_log();
    infergate_operator::reconcile::preflight(&ctx.client, &scope)
        .await
        .unwrap();
    let controller = start_controller_in(&ctx, scope.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    children_ready(&fake);
    ready_reason_becomes(&fake, "Ready").await;
    // A model server going away in the watched namespace still shows at once (its Pod watch),
    // and one going away outside changes nothing there.
    fake.delete(&format!(
        "/api/v1/namespaces/{OUTSIDE}/pods/qwen-7b-server-0"
    ));
    let pod = format!("/api/v1/namespaces/{NS}/pods/qwen-7b-server-0");
    let labels = fake.get(&pod).unwrap()["metadata"]["labels"].clone();
    fake.delete(&pod);
    ready_reason_becomes(&fake, "NoModelServers").await;
    model_pod(&fake, NS, "qwen-7b-server-0", &labels, true);
    ready_reason_becomes(&fake, "Ready").await;
    fake.edit(CFG, |c| {
        c["metadata"]["deletionTimestamp"] = json!("2027-01-15T08:00:00Z")
    });
    let start = tokio::time::Instant::now();
    while fake.get(CFG).is_some() {
        assert!(start.elapsed() < PROMPTLY, "the config was not let go");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    controller.abort();

    let outside_requests = outside_inference(&fake);
    assert!(
        outside_requests.is_empty(),
        "requests outside namespace {NS}: {outside_requests:#?}"
    );
    let untouched = fake.get(&outside).unwrap();
    assert!(
        untouched["metadata"]["finalizers"].is_null() && untouched["status"].is_null(),
        "the config outside the watched namespaces was written: {untouched}"
    );
    let children_outside: Vec<String> = fake
        .paths()
        .into_iter()
        .filter(|p| p.contains(&format!("/namespaces/{OUTSIDE}/")))
        .filter(|p| !p.contains("/pods/") && p != &outside)
        .collect();
    assert_eq!(children_outside, Vec::<String>::new());

    let used: BTreeSet<_> = fake.log().iter().map(rbac_of).collect();
    let role = grants(&namespace_role(&scope));
    assert_eq!(role, grants(NAMESPACED_RULES));
    let missing: Vec<_> = used.difference(&role).collect();
    assert!(
        missing.is_empty(),
        "calls the namespace's Role does not grant: {missing:?}"
    );
    assert_eq!(
        grants(&cluster_role(&scope, true)),
        grants(METRICS_AUTH_RULES),
        "in namespaced mode the ClusterRole holds the reviews only"
    );
    assert!(cluster_role(&scope, false).is_empty());
}

/// The start-up check of `--watch-namespaces` lists the configs in each namespace through its
/// own path (never across namespaces) and, refused in one, stops naming that namespace and the
/// permission the Role there must grant; a 404 there is still the missing CRD.
#[tokio::test]
async fn a_namespaced_start_up_check_names_the_namespace_and_the_permission_it_lacks() {
    let (ctx, fake) = setup("single-model.yaml");
    let scope = WatchScope::from_names(["team-a".to_owned(), "team-b".to_owned()]).unwrap();
    let list =
        |ns: &str| format!("/apis/infergate.dev/v1alpha1/namespaces/{ns}/inferencegatewayconfigs");
    fake.clear_log();
    infergate_operator::reconcile::preflight(&ctx.client, &scope)
        .await
        .unwrap();
    let asked: BTreeSet<String> = fake.log().iter().map(|s| s.path.clone()).collect();
    assert_eq!(asked, BTreeSet::from([list("team-a"), list("team-b")]));

    fake.fail("GET", &list("team-b"), 403, 1);
    let err = infergate_operator::reconcile::preflight(&ctx.client, &scope)
        .await
        .unwrap_err();
    assert_eq!(err.metric_label(), "forbidden");
    let report = err.report();
    for want in [
        "cannot list InferenceGatewayConfigs in namespace team-b",
        "`list`",
        "inferencegatewayconfigs.infergate.dev",
        "watchNamespaces",
        "injected failure (HTTP 403 Forbidden)",
    ] {
        assert!(report.contains(want), "{want}: {report}");
    }
    assert!(!report.contains("team-a"), "{report}");

    fake.fail("GET", &list("team-a"), 404, 1);
    let err = infergate_operator::reconcile::preflight(&ctx.client, &scope)
        .await
        .unwrap_err();
    assert_eq!(err.metric_label(), "missing_crd");
    let cluster_wide = "/apis/infergate.dev/v1alpha1/inferencegatewayconfigs";
    assert!(
        fake.log().iter().all(|s| s.path != cluster_wide),
        "a namespaced start-up check listed across namespaces"
    );
}

/// `infergate delete-configs --namespaces inference` (the uninstall hook of a namespaced
/// release) deletes the release's config there and waits for the namespaced operator to let it
/// go; a config of the same release in a namespace not listed is neither listed nor deleted.
#[tokio::test(start_paused = true)]
async fn delete_configs_in_namespaces_reads_and_deletes_only_there() {
    let (ctx, fake) = created("multi-model.yaml").await;
    release_configs(&fake);
    let outside = config_outside(&fake, json!({"app.kubernetes.io/instance": "rel"}));
    let scope = inference_only();
    let controller = start_controller_in(&ctx, scope.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    fake.clear_log();
    let deleted = infergate_operator::uninstall::delete_and_wait(
        ctx.client.clone(),
        "app.kubernetes.io/instance=rel",
        &scope,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    assert_eq!(deleted, ["inference/fleet"]);
    assert!(fake.get(CFG).is_none(), "the config is gone");
    assert!(fake.get(&outside).is_some(), "the config outside is left");
    let outside_requests = outside_inference(&fake);
    assert!(
        outside_requests.is_empty(),
        "requests outside namespace {NS}: {outside_requests:#?}"
    );
    controller.abort();
}
