//! Who may reach what: the admin port's `/metrics` behind a TokenReview and a
//! SubjectAccessReview (against the fake API server), its probes open, the port over TLS
//! ([`tls`]), and the ClusterRole of the static manifest (the chart's default render) granting
//! exactly the operator's RBAC list.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

#[path = "common/render.rs"]
mod common;
#[path = "common/fake.rs"]
mod fake;
#[path = "access/tls.rs"]
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fake::Fake;
use infergate_operator::metrics::Metrics;
use infergate_operator::metrics_auth::{ALLOWED_TTL, REFUSED_TTL, ScrapeAuthorizer, Verdict};
use infergate_operator::rbac::{
    LEADER_RULES, METRICS_AUTH_RULES, METRICS_READER, NAMESPACED_RULES, Rule, cluster_role, grants,
};
use infergate_operator::scope::WatchScope;
use infergate_operator::serve::serve_admin;
use infergate_pool::tls::ServerTls;
use infergate_testkit::Response;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

const PROMETHEUS: &str = "system:serviceaccount:monitoring:prometheus";
const GRAFANA: &str = "system:serviceaccount:monitoring:grafana";
const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// A fake API server knowing Prometheus's token (allowed to read `/metrics`) and Grafana's
/// (authenticated, not allowed), and the operator's admin server asking it (`None`: with
/// `--metrics-auth=none`).
async fn admin(checked: bool) -> (SocketAddr, Fake, tokio::sync::oneshot::Sender<()>) {
    admin_over(checked, None).await
}

/// [`admin`], over TLS with `tls` (its counters registered, as `serve` registers them).
async fn admin_over(
    checked: bool,
    tls: Option<ServerTls>,
) -> (SocketAddr, Fake, tokio::sync::oneshot::Sender<()>) {
    let (client, fake) = fake::client();
    fake.token("prometheus-token", PROMETHEUS);
    fake.token("grafana-token", GRAFANA);
    fake.allow_metrics(PROMETHEUS);
    let metrics = Metrics::default();
    metrics.reconciliations.inc();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let auth = checked.then(|| {
        let auth = ScrapeAuthorizer::new(client);
        auth.register(&mut registry);
        Arc::new(auth)
    });
    if let Some(tls) = &tls {
        tls.register(&mut registry);
    }
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve_admin(
        listener,
        tls,
        Arc::new(registry),
        auth,
        async {
            let _ = rx.await;
        },
    ));
    (addr, fake, tx)
}

async fn scrape(addr: SocketAddr, authorization: Option<&str>) -> Response {
    let mut req = http::Request::get("/metrics");
    if let Some(a) = authorization {
        req = req.header(http::header::AUTHORIZATION, a);
    }
    infergate_testkit::send(addr, req.body(Bytes::new()).unwrap())
        .await
        .unwrap()
}

/// The reviews the fake answered: (TokenReviews, SubjectAccessReviews).
fn reviews(fake: &Fake) -> (usize, usize) {
    let log = fake.log();
    let n = |p: &str| {
        log.iter()
            .filter(|s| s.method == "POST" && s.path == p)
            .count()
    };
    (n(TOKEN_REVIEWS), n(ACCESS_REVIEWS))
}

#[tokio::test]
async fn metrics_need_a_token_the_api_server_authenticates_and_allows() {
    let (addr, fake, _stop) = admin(true).await;

    let r = scrape(addr, None).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(r.text().contains("no bearer token"), "{}", r.text());
    assert!(r.text().contains("metrics-reader"), "{}", r.text());
    assert!(r.header("www-authenticate").unwrap().starts_with("Bearer"));
    let r = scrape(addr, Some("Basic cHJvbTpwYXNz")).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(
        reviews(&fake),
        (0, 0),
        "nothing to review without a bearer token"
    );

    let r = scrape(addr, Some("Bearer forged")).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(r.text().contains("invalid bearer token"), "{}", r.text());
    assert_eq!(
        reviews(&fake),
        (1, 0),
        "no access review for an unknown token"
    );

    let r = scrape(addr, Some("Bearer grafana-token")).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains(GRAFANA), "{}", r.text());
    assert!(
        r.text().contains("get the non-resource URL /metrics"),
        "{}",
        r.text()
    );
    assert_eq!(reviews(&fake), (2, 1));
    // The access review asks about the token's user, groups and uid, for get on /metrics.
    let sar = fake
        .log()
        .into_iter()
        .find(|s| s.path == ACCESS_REVIEWS)
        .unwrap()
        .body;
    assert_eq!(sar["spec"]["user"], GRAFANA);
    assert_eq!(sar["spec"]["groups"], json!(["system:authenticated"]));
    assert_eq!(sar["spec"]["uid"], format!("uid-{GRAFANA}"));
    assert_eq!(
        sar["spec"]["nonResourceAttributes"],
        json!({"path": "/metrics", "verb": "get"})
    );

    let r = scrape(addr, Some("Bearer prometheus-token")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text()
            .contains("infergate_operator_reconciliations_total 1"),
        "{}",
        r.text()
    );
    assert_eq!(reviews(&fake), (3, 2));

    // The next scrapes within the cache's time cost the API server nothing, refused ones too.
    for token in ["Bearer prometheus-token", "bearer prometheus-token"] {
        assert_eq!(scrape(addr, Some(token)).await.status, 200);
    }
    assert_eq!(scrape(addr, Some("Bearer grafana-token")).await.status, 403);
    assert_eq!(scrape(addr, Some("Bearer forged")).await.status, 401);
    assert_eq!(reviews(&fake), (3, 2), "decisions are remembered");
    // Each refusal is counted by reason, cached or not.
    let r = scrape(addr, Some("Bearer prometheus-token")).await;
    for (reason, n) in [
        ("no_token", 2.0),
        ("unauthenticated", 2.0),
        ("forbidden", 2.0),
    ] {
        let got = infergate_testkit::metric(
            &r.text(),
            "infergate_operator_metrics_scrapes_refused_total",
            &[("reason", reason)],
        );
        assert_eq!(got, Some(n), "{reason}: {}", r.text());
    }

    // The probes stay open to the kubelet, which sends no token, and ask nothing.
    for path in ["/healthz", "/readyz", "/livez"] {
        let r = infergate_testkit::get(addr, path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    assert_eq!(reviews(&fake), (3, 2));
}

#[tokio::test]
async fn with_metrics_auth_none_anyone_reads_the_metrics() {
    let (addr, fake, _stop) = admin(false).await;
    let r = scrape(addr, None).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text()
            .contains("infergate_operator_reconciliations_total 1")
    );
    assert_eq!(reviews(&fake), (0, 0));
}

#[tokio::test]
async fn a_review_the_api_server_refuses_names_the_permission_and_the_opt_out() {
    let (addr, fake, _stop) = admin(true).await;
    fake.fail("POST", TOKEN_REVIEWS, 403, 1);
    let r = scrape(addr, Some("Bearer prometheus-token")).await;
    assert_eq!(r.status, 500, "{}", r.text());
    for want in [
        "TokenReview",
        "tokenreviews.authentication.k8s.io",
        "--metrics-auth=none",
    ] {
        assert!(r.text().contains(want), "{want}: {}", r.text());
    }
    fake.fail("POST", ACCESS_REVIEWS, 403, 1);
    let r = scrape(addr, Some("Bearer prometheus-token")).await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(
        r.text()
            .contains("subjectaccessreviews.authorization.k8s.io"),
        "{}",
        r.text()
    );
    // A failure is not remembered: the next scrape asks again and is let in.
    let r = scrape(addr, Some("Bearer prometheus-token")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_metric(
        &r,
        "infergate_operator_metrics_scrapes_refused_total",
        &[("reason", "review_failed")],
        2.0,
    );
}

/// The page `r` carries `family{labels}` at `want`.
fn assert_metric(r: &Response, family: &str, labels: &[(&str, &str)], want: f64) {
    let got = infergate_testkit::metric(&r.text(), family, labels);
    assert_eq!(got, Some(want), "{family}{labels:?}: {}", r.text());
}

#[tokio::test(start_paused = true)]
async fn decisions_are_asked_again_once_they_expire() {
    let (client, fake) = fake::client();
    fake.token("prometheus-token", PROMETHEUS);
    fake.token("grafana-token", GRAFANA);
    let auth = ScrapeAuthorizer::new(client);
    let forbidden = Verdict::Forbidden {
        user: GRAFANA.to_owned(),
        reason: String::new(),
    };
    assert_eq!(auth.verdict("grafana-token").await.unwrap(), forbidden);
    assert_eq!(reviews(&fake), (1, 1));
    // Allowed by a binding made meanwhile: seen once the refusal expires.
    fake.allow_metrics(GRAFANA);
    tokio::time::advance(REFUSED_TTL - Duration::from_secs(1)).await;
    assert_eq!(auth.verdict("grafana-token").await.unwrap(), forbidden);
    assert_eq!(reviews(&fake), (1, 1));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        auth.verdict("grafana-token").await.unwrap(),
        Verdict::Allowed
    );
    assert_eq!(reviews(&fake), (2, 2));
    tokio::time::advance(ALLOWED_TTL - Duration::from_secs(1)).await;
    assert_eq!(
        auth.verdict("grafana-token").await.unwrap(),
        Verdict::Allowed
    );
    assert_eq!(reviews(&fake), (2, 2));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        auth.verdict("grafana-token").await.unwrap(),
        Verdict::Allowed
    );
    assert_eq!(reviews(&fake), (3, 3));
}

fn repo(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// The objects of the static manifest (the chart's default render, which
/// tests/helm/check.sh holds it to).
fn manifest() -> Vec<Value> {
    let text = std::fs::read_to_string(repo("deploy/operator/operator.yaml")).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/operator/operator.yaml"))
}

#[test]
fn the_static_manifest_grants_exactly_the_rbac_list() {
    let objects = manifest();
    let cluster = object(&objects, "ClusterRole", "infergate-operator");
    let want = grants(&cluster_role(&WatchScope::Cluster, true));
    let have = common::granted_by(&cluster["rules"]);
    assert_eq!(
        have.difference(&want).collect::<Vec<_>>(),
        Vec::<&(String, String, String)>::new(),
        "granted by the chart's ClusterRole, not in infergate_operator::rbac"
    );
    assert_eq!(
        want.difference(&have).collect::<Vec<_>>(),
        Vec::<&(String, String, String)>::new(),
        "in infergate_operator::rbac, not granted by the chart's ClusterRole"
    );
    // Every child kind can be listed, read, applied (patch, create) and pruned, rendered by
    // this config or not.
    for k in infergate_operator::render::child_kinds() {
        for verb in ["get", "list", "create", "patch", "delete"] {
            let key = (k.group.clone(), k.plural.clone(), verb.to_owned());
            assert!(want.contains(&key), "{key:?}");
        }
    }
    let leader = object(&objects, "Role", "infergate-operator-leader");
    assert_eq!(common::granted_by(&leader["rules"]), grants(LEADER_RULES));
    // What a scraper is bound to: get on /metrics, nothing else.
    let reader = object(&objects, "ClusterRole", "infergate-operator-metrics-reader");
    assert_eq!(
        reader["rules"],
        json!([{"nonResourceURLs": [METRICS_READER.0], "verbs": [METRICS_READER.1]}])
    );
    // The operator's command line asks for the check its ClusterRole allows.
    let deployment = object(&objects, "Deployment", "infergate-operator");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(args.contains(&"--metrics-auth=kubernetes"), "{args:?}");
    // ... over HTTPS, which the probes speak too (the kubelet does not verify the certificate).
    assert!(args.contains(&"--metrics-tls=true"), "{args:?}");
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(container[probe]["httpGet"]["scheme"], "HTTPS", "{probe}");
    }
}

/// docs/operator.md's permissions table has one row per rule, as `| group | resources | verbs |`.
#[test]
fn docs_list_every_permission() {
    let doc = std::fs::read_to_string(repo("docs/operator.md")).unwrap();
    let row = |r: &Rule| {
        let group = if r.group.is_empty() {
            "core".to_owned()
        } else {
            r.group.to_owned()
        };
        let resources: Vec<String> = r.resources.iter().map(|x| format!("`{x}`")).collect();
        format!(
            "| `{group}` | {} | {} |",
            resources.join(", "),
            r.verbs.join(", ")
        )
    };
    for rule in [NAMESPACED_RULES, METRICS_AUTH_RULES, LEADER_RULES].concat() {
        let want = row(&rule);
        assert!(doc.contains(&want), "docs/operator.md lacks the row {want}");
    }
}

/// The chart's render with `watchNamespaces: [team-a, team-b]` (tests/helm/check.sh holds the
/// file to the chart): the operator's rules in a Role and RoleBinding in each namespace its
/// command line names, exactly [`namespace_role`]; the ClusterRole left with exactly
/// [`cluster_role`] of that scope (the reviews); the leader Role unchanged.
#[test]
fn the_namespaced_render_grants_the_rbac_list_in_each_watched_namespace_only() {
    use infergate_operator::rbac::namespace_role;

    let text =
        std::fs::read_to_string(repo("crates/operator/tests/rbac/watch-namespaces.yaml")).unwrap();
    let objects: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect();
    let find = |kind: &str, name: &str, ns: Option<&str>| -> Vec<&Value> {
        objects
            .iter()
            .filter(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .filter(|o| ns.is_none_or(|ns| o["metadata"]["namespace"] == ns))
            .collect()
    };
    // The scope as the operator reads it from its rendered command line.
    let deployment = find("Deployment", "infergate-operator", None)[0];
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap();
    let list = args
        .iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix("--watch-namespaces="))
        .expect("--watch-namespaces in the operator's arguments");
    let scope = WatchScope::from_names(list.split(',').map(str::to_owned)).unwrap();
    assert_eq!(scope.to_string(), "namespaces team-a, team-b");

    let namespaces: Vec<String> = scope.targets().into_iter().flatten().collect();
    let roles: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "Role" && o["metadata"]["name"] == "infergate-operator")
        .collect();
    let mut role_namespaces: Vec<&str> = roles
        .iter()
        .filter_map(|r| r["metadata"]["namespace"].as_str())
        .collect();
    role_namespaces.sort_unstable();
    assert_eq!(
        role_namespaces, namespaces,
        "one Role per watched namespace"
    );
    for ns in &namespaces {
        let role = find("Role", "infergate-operator", Some(ns))[0];
        assert_eq!(
            common::granted_by(&role["rules"]),
            grants(&namespace_role(&scope)),
            "the Role in {ns}"
        );
        let binding = find("RoleBinding", "infergate-operator", Some(ns));
        assert_eq!(binding.len(), 1, "the RoleBinding in {ns}");
        assert_eq!(
            binding[0]["roleRef"],
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "infergate-operator"})
        );
        assert_eq!(
            binding[0]["subjects"],
            json!([{"kind": "ServiceAccount", "name": "infergate-operator", "namespace": "infergate-system"}])
        );
    }
    let cluster_role_obj = find("ClusterRole", "infergate-operator", None)[0];
    assert_eq!(
        common::granted_by(&cluster_role_obj["rules"]),
        grants(&cluster_role(&scope, true)),
        "the ClusterRole with watchNamespaces"
    );
    assert_eq!(
        grants(&cluster_role(&scope, true)),
        grants(METRICS_AUTH_RULES)
    );
    let leader = find(
        "Role",
        "infergate-operator-leader",
        Some("infergate-system"),
    )[0];
    assert_eq!(common::granted_by(&leader["rules"]), grants(LEADER_RULES));
}
