//! Every permission the operator holds, and why: the chart's roles
//! (charts/infergate/templates/rbac.yaml) grant exactly these, the static manifest
//! (deploy/operator/operator.yaml) is rendered from the chart, and the operator's tests check
//! both against this list, every API call of a config's life against it, and that each `list`
//! and `watch` it grants is one the operator makes or grants its pickers (Kubernetes lets it
//! create only Roles that grant what it holds itself). docs/operator.md gives the same table.
//!
//! Where the rules are granted depends on the [`WatchScope`]: across the cluster, the
//! ClusterRole holds [`NAMESPACED_RULES`] and, with `--metrics-auth=kubernetes`,
//! [`METRICS_AUTH_RULES`]; with `--watch-namespaces`, a Role in each watched namespace holds
//! [`NAMESPACED_RULES`] and the ClusterRole only the reviews, which have no namespace
//! ([`cluster_role`], [`namespace_role`]). The leader Role is the same in both.

use crate::scope::WatchScope;

/// One RBAC rule: `verbs` on each of `resources` in API group `group` (`""`: the core group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// API group.
    pub group: &'static str,
    /// Resources, subresources as `resource/subresource`.
    pub resources: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// What the operator does with them.
    pub why: &'static str,
}

/// The children a config renders ([`crate::render::child_kinds`]) that the operator does not
/// watch: read by label to see what exists (`list`), by name before a first apply to refuse
/// taking over another's object (`get`), written by server-side apply (`patch`, and `create`,
/// which the API server checks when the object does not exist yet), pruned (`delete`).
const CHILD: &[&str] = &["get", "list", "create", "patch", "delete"];
/// The children it also watches (`Controller::owns`: their status feeds the config's), or
/// whose `watch` the pickers' Role grants.
const WATCHED_CHILD: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];

/// The rules on namespaced resources (the configs, their children, Secrets, Events, Pods):
/// the ClusterRole's across the cluster, each watched namespace's Role with
/// `--watch-namespaces`.
pub const NAMESPACED_RULES: &[Rule] = &[
    Rule {
        group: "infergate.dev",
        resources: &["inferencegatewayconfigs"],
        verbs: &["list", "watch", "patch"],
        why: "the controller's watch and the start-up check list and watch the configs; the finalizer is added and removed by JSON patch",
    },
    Rule {
        group: "infergate.dev",
        resources: &["inferencegatewayconfigs/status"],
        verbs: &["patch"],
        why: "the status, by server-side apply",
    },
    Rule {
        group: "infergate.dev",
        resources: &["inferencegatewayconfigs/finalizers"],
        verbs: &["update"],
        why: "children with a controller owner reference on clusters that enforce owner-reference permissions",
    },
    Rule {
        group: "",
        resources: &["serviceaccounts", "configmaps", "services"],
        verbs: CHILD,
        why: "children: the pickers' and the BBR's accounts, files and Services",
    },
    Rule {
        group: "apps",
        resources: &["deployments"],
        verbs: WATCHED_CHILD,
        why: "children, watched: their rollout is the config's readiness",
    },
    Rule {
        group: "policy",
        resources: &["poddisruptionbudgets"],
        verbs: CHILD,
        why: "children: the pickers' disruption budgets",
    },
    Rule {
        group: "networking.k8s.io",
        resources: &["networkpolicies"],
        verbs: CHILD,
        why: "children: the pickers' network policies",
    },
    Rule {
        group: "rbac.authorization.k8s.io",
        resources: &["roles", "rolebindings"],
        verbs: CHILD,
        why: "children: each picker's Role (pods and inferencepools) and its binding",
    },
    Rule {
        group: "gateway.networking.k8s.io",
        resources: &["gateways", "httproutes"],
        verbs: WATCHED_CHILD,
        why: "children, watched: whether the Gateway is programmed and each route accepted",
    },
    Rule {
        group: "inference.networking.k8s.io",
        resources: &["inferencepools"],
        verbs: WATCHED_CHILD,
        why: "children; watch only because the pickers' Role grants it (the operator does not watch them)",
    },
    Rule {
        group: "gateway.envoyproxy.io",
        resources: &[
            "envoyextensionpolicies",
            "securitypolicies",
            "clienttrafficpolicies",
        ],
        verbs: WATCHED_CHILD,
        why: "children, watched: whether Envoy Gateway attached each policy",
    },
    Rule {
        group: "",
        resources: &["secrets"],
        verbs: &["get", "create", "delete"],
        why: "the pickers' peer-exchange key (created when missing, deleted with its config) and the Secrets a spec names, read by name: no list or watch, which would reach every Secret",
    },
    Rule {
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create"],
        why: "an Event on the config at each change of Ready",
    },
    Rule {
        group: "",
        resources: &["pods"],
        verbs: &["get", "list", "watch"],
        why: "the model servers each modelSelector matches (list), their coming and going (watch, metadata only); get because the pickers' Role grants it",
    },
];

/// Added to the ClusterRole with `--metrics-auth=kubernetes` (the chart's `metrics.auth`), in
/// either scope: reviews are cluster-scoped, no Role can grant them.
pub const METRICS_AUTH_RULES: &[Rule] = &[
    Rule {
        group: "authentication.k8s.io",
        resources: &["tokenreviews"],
        verbs: &["create"],
        why: "whose bearer token a scrape of /metrics carries",
    },
    Rule {
        group: "authorization.k8s.io",
        resources: &["subjectaccessreviews"],
        verbs: &["create"],
        why: "whether that user may get /metrics",
    },
];

/// The leader Role, in the operator's namespace (`get` and `update` limited to its own Lease).
pub const LEADER_RULES: &[Rule] = &[Rule {
    group: "coordination.k8s.io",
    resources: &["leases"],
    verbs: &["create", "get", "update"],
    why: "leader election: create the Lease, then read and renew only the operator's own",
}];

/// What a scraper needs (the chart's `metrics-reader` ClusterRole): `get` on the non-resource
/// URL `/metrics`.
pub const METRICS_READER: (&str, &str) = ("/metrics", "get");

/// What the operator's ClusterRole grants in `scope`, with or without the reviews of
/// `--metrics-auth=kubernetes` (`metrics_auth`). Empty when neither applies: the chart then
/// renders no ClusterRole for the operator.
pub fn cluster_role(scope: &WatchScope, metrics_auth: bool) -> Vec<Rule> {
    let mut rules = Vec::new();
    if *scope == WatchScope::Cluster {
        rules.extend_from_slice(NAMESPACED_RULES);
    }
    if metrics_auth {
        rules.extend_from_slice(METRICS_AUTH_RULES);
    }
    rules
}

/// What the operator's Role in each namespace of `scope` grants: [`NAMESPACED_RULES`] with
/// `--watch-namespaces`, nothing across the cluster (the ClusterRole holds them).
pub fn namespace_role(scope: &WatchScope) -> Vec<Rule> {
    match scope {
        WatchScope::Cluster => Vec::new(),
        WatchScope::Namespaces(_) => NAMESPACED_RULES.to_vec(),
    }
}

/// Every `(group, resource, verb)` that `rules` grant.
pub fn grants(rules: &[Rule]) -> std::collections::BTreeSet<(String, String, String)> {
    rules
        .iter()
        .flat_map(|r| {
            r.resources.iter().flat_map(move |res| {
                r.verbs
                    .iter()
                    .map(move |v| (r.group.to_owned(), (*res).to_owned(), (*v).to_owned()))
            })
        })
        .collect()
}
