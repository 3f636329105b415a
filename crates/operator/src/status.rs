//! Pure status computation: rendered config + observed children → `InferenceGatewayConfigStatus`.
//!
//! The clock is passed in; a condition keeps its `lastTransitionTime` while its status stays the
//! same, so an unchanged world yields an identical status and the reconciler writes nothing.

use std::collections::BTreeMap;

use infergate_api::status::{ACCEPTED, BBR_READY, GATEWAY_PROGRAMMED, READY};
use infergate_api::{
    InferenceGatewayConfig, InferenceGatewayConfigStatus, RolloutState, SchedulerStatus,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::Value;

use crate::render::{bbr_name, epp_name, scheduler_name};

/// What the reconciler saw of the children before applying.
#[derive(Debug, Default, Clone)]
pub struct Observed {
    /// The Gateway as read from the cluster (its `status` is what matters).
    pub gateway: Option<Value>,
    /// Deployments owned by the config.
    pub deployments: Vec<Deployment>,
    /// The config's HTTPRoutes as read from the cluster (their `status.parents` is what
    /// matters).
    pub routes: Vec<Value>,
    /// The config's Envoy Gateway policies (EnvoyExtensionPolicy, SecurityPolicy,
    /// ClientTrafficPolicy) as read from the cluster (their `status.ancestors` is what
    /// matters).
    pub policies: Vec<Value>,
    /// Secrets the spec names that the pods or the Gateway cannot use: what is wrong with
    /// each, naming the Secret and the field (see `reconcile::unusable_secrets`).
    pub unusable_secrets: Vec<String>,
    /// Per scheduler name, the model-server pods its `modelSelector` matches. A scheduler not
    /// in the map was not looked at and is not judged on its model servers.
    pub model_servers: BTreeMap<String, ModelServers>,
}

/// The pods a scheduler's `modelSelector` matches in the config's namespace (those being
/// deleted left out), and how many of them are ready.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ModelServers {
    /// Pods matching the selector.
    pub matching: usize,
    /// Of those, pods whose `Ready` condition is `True`.
    pub ready: usize,
}

/// `k=v,k2=v2`: a selector as `kubectl get pods -l` takes it.
pub fn selector_text(labels: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (k, v) in labels {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    out
}

/// Status for a config that rendered; `rendered` is the number of children applied.
pub fn accepted(
    cfg: &InferenceGatewayConfig,
    observed: &Observed,
    rendered: usize,
    now: &Time,
) -> InferenceGatewayConfigStatus {
    let prev = cfg.status.clone().unwrap_or_default();
    let name = cfg.metadata.name.clone().unwrap_or_default();
    let generation = cfg.metadata.generation;
    let mut conditions = Vec::new();
    conditions.push(cond(
        &prev.conditions,
        ACCEPTED,
        true,
        "Rendered",
        &format!("{rendered} child objects applied"),
        generation,
        now,
    ));

    // What the config still waits for, for `Ready`'s message (what `kubectl get -o wide`
    // shows): each part that is not ready, with its own message.
    let mut waiting = Vec::new();
    let gw = gateway_state(observed.gateway.as_ref());
    let programmed = gw.ok;
    if !programmed {
        waiting.push(format!("Gateway: {}", gw.message));
    }
    conditions.push(cond(
        &prev.conditions,
        GATEWAY_PROGRAMMED,
        programmed,
        &gw.reason,
        &gw.message,
        generation,
        now,
    ));

    let bbr_ok = if cfg.spec.bbr.enabled {
        let d = find(&observed.deployments, &bbr_name(&name));
        let state = rollout(d);
        let ok = state == RolloutState::Available;
        let message = rollout_message("body-based router", state, d);
        if !ok {
            waiting.push(message.clone());
        }
        conditions.push(cond(
            &prev.conditions,
            BBR_READY,
            ok,
            state_reason(state),
            &message,
            generation,
            now,
        ));
        ok
    } else {
        conditions.push(cond(
            &prev.conditions,
            BBR_READY,
            true,
            "Disabled",
            "the body-based router is disabled",
            generation,
            now,
        ));
        true
    };

    let mut schedulers = Vec::with_capacity(cfg.spec.schedulers.len());
    let mut all_available = true;
    let mut refused_routes = Vec::new();
    let mut unmatched = Vec::new();
    let mut servers_ok = true;
    for s in &cfg.spec.schedulers {
        let d = find(&observed.deployments, &epp_name(&name, &s.name));
        let state = rollout(d);
        let route = scheduler_name(&name, &s.name);
        let problems = route_problems(&route, &observed.routes);
        let selector = selector_text(&s.model_selector);
        let (servers_reason, servers_problem) = match observed.model_servers.get(&s.name) {
            Some(m) if m.matching == 0 => (
                Some("NoModelServers"),
                Some(format!(
                    "no pod in namespace {} matches modelSelector {selector}",
                    cfg.metadata.namespace.as_deref().unwrap_or_default()
                )),
            ),
            Some(m) if m.ready == 0 => (
                Some("ModelServersNotReady"),
                Some(format!(
                    "none of the {} pods matching modelSelector {selector} is ready",
                    m.matching
                )),
            ),
            _ => (None, None),
        };
        let ok =
            state == RolloutState::Available && problems.is_empty() && servers_problem.is_none();
        all_available &= state == RolloutState::Available;
        servers_ok &= servers_problem.is_none();
        let mut message = rollout_message("endpoint picker", state, d);
        for p in problems.iter().chain(&servers_problem) {
            message.push_str("; ");
            message.push_str(p);
        }
        if let (Some("NoModelServers"), Some(p)) = (servers_reason, &servers_problem) {
            unmatched.push(format!("scheduler {}: {p}", s.name));
        }
        refused_routes.extend(problems);
        if !ok {
            waiting.push(format!("scheduler {}: {message}", s.name));
        }
        let prev_s = prev
            .schedulers
            .iter()
            .find(|p| p.name == s.name)
            .map(|p| p.conditions.as_slice())
            .unwrap_or_default();
        schedulers.push(SchedulerStatus {
            name: s.name.clone(),
            conditions: vec![cond(
                prev_s,
                READY,
                ok,
                match servers_reason {
                    Some(r) if state == RolloutState::Available => r,
                    _ => state_reason(state),
                },
                &message,
                generation,
                now,
            )],
            rollout_state: state,
        });
    }
    let secrets_ok = observed.unusable_secrets.is_empty();
    let routes_ok = refused_routes.is_empty();
    let refused_policies = policy_problems(&observed.policies);
    let policies_ok = refused_policies.is_empty();
    let ready = programmed
        && bbr_ok
        && all_available
        && secrets_ok
        && routes_ok
        && policies_ok
        && servers_ok;
    let (reason, msg) = if ready {
        ("Ready", "the gateway serves traffic".to_owned())
    } else if !secrets_ok {
        ("SecretNotFound", observed.unusable_secrets.join("; "))
    } else if !routes_ok {
        ("RouteNotAccepted", refused_routes.join("; "))
    } else if !policies_ok {
        ("PolicyNotAccepted", refused_policies.join("; "))
    } else if !unmatched.is_empty() {
        // Most likely a selector that names no model server at all: nothing will come of
        // waiting, unlike pods that match and are starting (which stay `Pending`).
        ("NoModelServers", unmatched.join("; "))
    } else {
        ("Pending", format!("waiting for {}", waiting.join("; ")))
    };
    conditions.push(cond(
        &prev.conditions,
        READY,
        ready,
        reason,
        &msg,
        generation,
        now,
    ));
    InferenceGatewayConfigStatus {
        conditions,
        observed_generation: generation,
        schedulers,
    }
}

/// Status for a config that failed validation: `Accepted=False` with every rule's message.
pub fn rejected(
    cfg: &InferenceGatewayConfig,
    message: &str,
    now: &Time,
) -> InferenceGatewayConfigStatus {
    let prev = cfg.status.clone().unwrap_or_default();
    let generation = cfg.metadata.generation;
    InferenceGatewayConfigStatus {
        conditions: vec![
            cond(
                &prev.conditions,
                ACCEPTED,
                false,
                "Invalid",
                message,
                generation,
                now,
            ),
            // The same message again: `Ready` is what `kubectl get -o wide` shows.
            cond(
                &prev.conditions,
                READY,
                false,
                "Invalid",
                &format!("the spec was not accepted: {message}"),
                generation,
                now,
            ),
        ],
        observed_generation: generation,
        schedulers: Vec::new(),
    }
}

/// Status for a config that was accepted and rendered but could not be applied (an upstream
/// API not installed, a child the API server refused): `Ready=False` with `reason` and the
/// error with its causes; the other conditions and the schedulers' states stay as last seen.
pub fn failed(
    cfg: &InferenceGatewayConfig,
    reason: &str,
    message: &str,
    rendered: usize,
    now: &Time,
) -> InferenceGatewayConfigStatus {
    let prev = cfg.status.clone().unwrap_or_default();
    let generation = cfg.metadata.generation;
    let accepted = cond(
        &prev.conditions,
        ACCEPTED,
        true,
        "Rendered",
        &format!("{rendered} child objects rendered; applying them failed (see Ready)"),
        generation,
        now,
    );
    let ready = cond(
        &prev.conditions,
        READY,
        false,
        reason,
        message,
        generation,
        now,
    );
    let mut conditions = vec![accepted];
    conditions.extend(
        prev.conditions
            .iter()
            .filter(|c| c.type_ == GATEWAY_PROGRAMMED || c.type_ == BBR_READY)
            .cloned(),
    );
    conditions.push(ready);
    InferenceGatewayConfigStatus {
        conditions,
        observed_generation: generation,
        schedulers: prev.schedulers,
    }
}

/// Rollout state of a Deployment as one word.
pub fn rollout(d: Option<&Deployment>) -> RolloutState {
    let Some(d) = d else {
        return RolloutState::Pending;
    };
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(st) = &d.status else {
        return RolloutState::Progressing;
    };
    let stalled = st
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Progressing" && c.status == "False");
    if stalled {
        return RolloutState::Degraded;
    }
    let current = st.observed_generation >= d.metadata.generation;
    let updated = st.updated_replicas.unwrap_or(0) >= want;
    let available = st.available_replicas.unwrap_or(0) >= want;
    if current && updated && available {
        RolloutState::Available
    } else {
        RolloutState::Progressing
    }
}

/// The `GatewayProgrammed` condition's content.
struct GatewayState {
    ok: bool,
    reason: String,
    message: String,
}

/// Programmed when the Gateway reports `Programmed=True` and none of its listeners reports a
/// problem (Envoy Gateway keeps a Gateway programmed while refusing one of its listeners, e.g.
/// an HTTPS listener whose certificate Secret is missing). Otherwise the Gateway controller's
/// own reasons, so the user sees what it refused and why.
fn gateway_state(gw: Option<&Value>) -> GatewayState {
    let pending = || GatewayState {
        ok: false,
        reason: "Pending".to_owned(),
        message: "waiting for the Gateway controller to program the Gateway".to_owned(),
    };
    let Some(gw) = gw else {
        return pending();
    };
    let Some(programmed) = gw["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Programmed"))
    else {
        return pending();
    };
    let mut problems = Vec::new();
    for l in gw["status"]["listeners"].as_array().into_iter().flatten() {
        let name = l["name"].as_str().unwrap_or_default();
        for c in l["conditions"].as_array().into_iter().flatten() {
            let bad = match c["type"].as_str() {
                Some("Accepted" | "ResolvedRefs" | "Programmed") => c["status"] == "False",
                Some("Conflicted") => c["status"] == "True",
                _ => false,
            };
            if bad {
                problems.push(format!(
                    "listener {name}: {}={} ({}): {}",
                    c["type"].as_str().unwrap_or_default(),
                    c["status"].as_str().unwrap_or_default(),
                    c["reason"].as_str().unwrap_or_default(),
                    c["message"].as_str().unwrap_or_default(),
                ));
            }
        }
    }
    let gw_ok = programmed["status"] == "True";
    if gw_ok && problems.is_empty() {
        return GatewayState {
            ok: true,
            reason: "Programmed".to_owned(),
            message: "the Gateway is programmed".to_owned(),
        };
    }
    let mut parts = Vec::new();
    let reason = if gw_ok {
        "ListenersNotReady".to_owned()
    } else {
        parts.push(format!(
            "the Gateway is not programmed ({}): {}",
            programmed["reason"].as_str().unwrap_or_default(),
            programmed["message"].as_str().unwrap_or_default(),
        ));
        programmed["reason"]
            .as_str()
            .filter(|r| !r.is_empty())
            .unwrap_or("NotProgrammed")
            .to_owned()
    };
    parts.extend(problems);
    GatewayState {
        ok: false,
        reason,
        message: parts.join("; "),
    }
}

/// What the Gateway controller refused of the HTTPRoute `name`: each parent's `Accepted` or
/// `ResolvedRefs` condition that is `False` (e.g. an InferencePool backend on an Envoy Gateway
/// without Envoy AI Gateway's extension), as one sentence naming the route and the parent.
fn route_problems(name: &str, routes: &[Value]) -> Vec<String> {
    let Some(route) = routes.iter().find(|r| r["metadata"]["name"] == name) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for parent in route["status"]["parents"].as_array().into_iter().flatten() {
        let parent_name = parent["parentRef"]["name"].as_str().unwrap_or_default();
        for c in parent["conditions"].as_array().into_iter().flatten() {
            let refused = matches!(c["type"].as_str(), Some("Accepted" | "ResolvedRefs"))
                && c["status"] == "False";
            if refused {
                out.push(format!(
                    "HTTPRoute {name}, parent {parent_name}: {}=False ({}): {}",
                    c["type"].as_str().unwrap_or_default(),
                    c["reason"].as_str().unwrap_or_default(),
                    c["message"].as_str().unwrap_or_default(),
                ));
            }
        }
    }
    out
}

/// What Envoy Gateway refused of the config's policies: each ancestor (the Gateway, or one of
/// its listeners) whose `Accepted` condition is `False`, as one sentence naming the policy, the
/// ancestor and Envoy Gateway's reason and message. Envoy Gateway reports a policy it could not
/// attach this way: a second `ClientTrafficPolicy` on the same Gateway (`Conflicted`, so a
/// client's tenant header is not removed), an invalid JWT provider, an ext_proc backend it
/// cannot resolve. A refused SecurityPolicy or the BBR's EnvoyExtensionPolicy leaves the routes
/// failing or unmatched, however healthy the pods are.
fn policy_problems(policies: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    for p in policies {
        let kind = p["kind"].as_str().unwrap_or("policy");
        let name = p["metadata"]["name"].as_str().unwrap_or_default();
        for a in p["status"]["ancestors"].as_array().into_iter().flatten() {
            let r = &a["ancestorRef"];
            let mut ancestor = format!(
                "{} {}",
                r["kind"].as_str().unwrap_or("Gateway"),
                r["name"].as_str().unwrap_or_default()
            );
            if let Some(section) = r["sectionName"].as_str() {
                ancestor.push_str(&format!(" listener {section}"));
            }
            for c in a["conditions"].as_array().into_iter().flatten() {
                if c["type"] == "Accepted" && c["status"] == "False" {
                    out.push(format!(
                        "{kind} {name}, {ancestor}: Accepted=False ({}): {}",
                        c["reason"].as_str().unwrap_or_default(),
                        c["message"].as_str().unwrap_or_default(),
                    ));
                }
            }
        }
    }
    out
}

/// "… rollout is STATE", with the Deployment's own account of a failure (pods it cannot
/// create, a stalled rollout) when it gives one.
fn rollout_message(what: &str, state: RolloutState, d: Option<&Deployment>) -> String {
    let mut msg = format!("{what} rollout is {}", state_reason(state));
    let conditions = d
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.conditions.as_ref());
    for c in conditions.into_iter().flatten() {
        let bad = (c.type_ == "ReplicaFailure" && c.status == "True")
            || (c.type_ == "Progressing" && c.status == "False");
        if bad {
            msg.push_str(&format!(
                "; {} ({}): {}",
                c.type_,
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default()
            ));
        }
    }
    msg
}

fn find<'a>(ds: &'a [Deployment], name: &str) -> Option<&'a Deployment> {
    ds.iter().find(|d| d.metadata.name.as_deref() == Some(name))
}

fn state_reason(s: RolloutState) -> &'static str {
    match s {
        RolloutState::Pending => "Pending",
        RolloutState::Progressing => "Progressing",
        RolloutState::Available => "Available",
        RolloutState::Degraded => "Degraded",
    }
}

fn cond(
    prev: &[Condition],
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let since = prev
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time: since,
    }
}

#[cfg(test)]
mod tests;
