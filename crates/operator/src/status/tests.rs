use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentSpec, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

fn t(s: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
}

fn deployment(want: i32, status: Option<DeploymentStatus>) -> Deployment {
    Deployment {
        metadata: ObjectMeta {
            generation: Some(2),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(want),
            ..DeploymentSpec::default()
        }),
        status,
    }
}

#[test]
fn rollout_states() {
    assert_eq!(rollout(None), RolloutState::Pending);
    assert_eq!(
        rollout(Some(&deployment(2, None))),
        RolloutState::Progressing
    );
    let done = DeploymentStatus {
        observed_generation: Some(2),
        updated_replicas: Some(2),
        available_replicas: Some(2),
        ..DeploymentStatus::default()
    };
    assert_eq!(
        rollout(Some(&deployment(2, Some(done.clone())))),
        RolloutState::Available
    );
    let old_generation = DeploymentStatus {
        observed_generation: Some(1),
        ..done.clone()
    };
    assert_eq!(
        rollout(Some(&deployment(2, Some(old_generation)))),
        RolloutState::Progressing
    );
    let stalled = DeploymentStatus {
        conditions: Some(vec![DeploymentCondition {
            type_: "Progressing".into(),
            status: "False".into(),
            reason: Some("ProgressDeadlineExceeded".into()),
            ..DeploymentCondition::default()
        }]),
        ..done
    };
    assert_eq!(
        rollout(Some(&deployment(2, Some(stalled)))),
        RolloutState::Degraded
    );
}

#[test]
fn transition_time_moves_only_when_the_status_flips() {
    let prev = vec![cond(&[], READY, false, "Pending", "m", Some(1), &t(100))];
    let same = cond(&prev, READY, false, "Pending", "m", Some(2), &t(200));
    assert_eq!(same.last_transition_time, t(100));
    let flipped = cond(&prev, READY, true, "Ready", "m", Some(2), &t(300));
    assert_eq!(flipped.last_transition_time, t(300));
}

fn example() -> InferenceGatewayConfig {
    let mut cfg: InferenceGatewayConfig = serde_yaml::from_str(include_str!(
        "../../../../deploy/examples/single-model.yaml"
    ))
    .unwrap();
    cfg.metadata.generation = Some(1);
    cfg
}

fn find_cond<'a>(st: &'a InferenceGatewayConfigStatus, type_: &str) -> &'a Condition {
    st.conditions.iter().find(|c| c.type_ == type_).unwrap()
}

/// The status of the example config with the Gateway reading `gw` and nothing else there.
fn with_gateway(gw: serde_json::Value) -> InferenceGatewayConfigStatus {
    let observed = Observed {
        gateway: Some(gw),
        ..Observed::default()
    };
    accepted(&example(), &observed, 3, &t(1))
}

/// The example's picker Deployment (the config's only scheduler) with `status`.
fn picker(status: DeploymentStatus) -> Deployment {
    let mut d = deployment(1, Some(status));
    d.metadata.name = Some("llama-llama-8b-epp".into());
    d
}

#[test]
fn a_gateway_that_is_not_programmed_says_why_in_gateway_programmed() {
    // Envoy Gateway's own reason (here: the certificate Secret of an HTTPS listener is missing)
    // is what the user needs; "waiting for the Gateway controller" would send them looking
    // in the wrong place.
    let gw = serde_json::json!({"status": {
        "conditions": [
            {"type": "Accepted", "status": "True", "reason": "Accepted", "message": ""},
            {"type": "Programmed", "status": "False", "reason": "Invalid",
             "message": "No listeners are valid"}
        ],
        "listeners": [{"name": "https", "conditions": [
            {"type": "Accepted", "status": "True", "reason": "Accepted", "message": ""},
            {"type": "ResolvedRefs", "status": "False", "reason": "InvalidCertificateRef",
             "message": "Secret inference/llama-cert does not exist."}
        ]}]
    }});
    let st = with_gateway(gw);
    let c = find_cond(&st, GATEWAY_PROGRAMMED);
    assert_eq!(c.status, "False");
    assert_eq!(c.reason, "Invalid");
    assert!(
        c.message.contains("No listeners are valid"),
        "{}",
        c.message
    );
    assert!(
        c.message.contains(
            "listener https: ResolvedRefs=False (InvalidCertificateRef): Secret inference/llama-cert does not exist."
        ),
        "{}",
        c.message
    );
}

#[test]
fn a_programmed_gateway_with_a_broken_listener_is_not_ready() {
    // Envoy Gateway keeps the Gateway Programmed while one listener is refused: the listener
    // the config asked for does not serve, so the config is not ready.
    let gw = serde_json::json!({"status": {
        "conditions": [{"type": "Programmed", "status": "True", "reason": "Programmed", "message": ""}],
        "listeners": [
            {"name": "http", "conditions": [{"type": "Programmed", "status": "True", "reason": "Programmed", "message": ""}]},
            {"name": "https", "conditions": [
                {"type": "Programmed", "status": "False", "reason": "Invalid", "message": "Listener is invalid, see other Conditions for details."},
                {"type": "ResolvedRefs", "status": "False", "reason": "InvalidCertificateRef", "message": "Secret inference/llama-cert does not exist."}
            ]}
        ]
    }});
    let st = with_gateway(gw);
    let c = find_cond(&st, GATEWAY_PROGRAMMED);
    assert_eq!(c.status, "False");
    assert_eq!(c.reason, "ListenersNotReady");
    assert!(
        c.message
            .contains("listener https: ResolvedRefs=False (InvalidCertificateRef)"),
        "{}",
        c.message
    );
    assert!(!c.message.contains("listener http:"), "{}", c.message);
    assert_eq!(find_cond(&st, READY).status, "False");
}

#[test]
fn a_picker_whose_pods_cannot_be_created_says_why() {
    // A quota or Pod Security admission refusing the pods shows on the Deployment as
    // ReplicaFailure; the scheduler's condition carries that message.
    let d = picker(DeploymentStatus {
        observed_generation: Some(2),
        conditions: Some(vec![DeploymentCondition {
            type_: "ReplicaFailure".into(),
            status: "True".into(),
            reason: Some("FailedCreate".into()),
            message: Some("pods \"llama-llama-8b-epp-1\" is forbidden: exceeded quota".into()),
            ..DeploymentCondition::default()
        }]),
        ..DeploymentStatus::default()
    });
    let observed = Observed {
        deployments: vec![d],
        ..Observed::default()
    };
    let st = accepted(&example(), &observed, 3, &t(1));
    let c = &st.schedulers[0].conditions[0];
    assert_eq!(c.status, "False");
    assert!(
        c.message
            .contains("ReplicaFailure (FailedCreate): pods \"llama-llama-8b-epp-1\" is forbidden: exceeded quota"),
        "{}",
        c.message
    );
}

#[test]
fn a_route_the_gateway_refuses_makes_its_scheduler_and_the_config_not_ready() {
    // Envoy Gateway without Envoy AI Gateway's extension refuses an HTTPRoute whose backend is
    // an InferencePool; every pod can be up and no request would be routed.
    let route = serde_json::json!({
        "metadata": {"name": "llama-llama-8b"},
        "status": {"parents": [{
            "parentRef": {"name": "llama"},
            "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
            "conditions": [
                {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "Route is accepted"},
                {"type": "ResolvedRefs", "status": "False", "reason": "InvalidKind",
                 "message": "Kind InferencePool is not supported"}
            ]
        }]}
    });
    let d = picker(DeploymentStatus {
        observed_generation: Some(2),
        updated_replicas: Some(1),
        available_replicas: Some(1),
        ..DeploymentStatus::default()
    });
    let observed = Observed {
        routes: vec![route],
        deployments: vec![d],
        ..Observed::default()
    };
    let st = accepted(&example(), &observed, 3, &t(1));
    let c = &st.schedulers[0].conditions[0];
    assert_eq!(c.status, "False");
    let want = "HTTPRoute llama-llama-8b, parent llama: ResolvedRefs=False (InvalidKind): Kind InferencePool is not supported";
    assert!(c.message.contains(want), "{}", c.message);
    let ready = find_cond(&st, READY);
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason, "RouteNotAccepted");
    assert!(ready.message.contains(want), "{}", ready.message);
}

#[test]
fn ready_says_what_it_waits_for() {
    let st = accepted(&example(), &Observed::default(), 3, &t(1));
    let ready = find_cond(&st, READY);
    assert_eq!(ready.reason, "Pending");
    assert_eq!(
        ready.message,
        "waiting for Gateway: waiting for the Gateway controller to program the Gateway; \
         body-based router rollout is Pending; \
         scheduler llama-8b: endpoint picker rollout is Pending"
    );
}

/// A policy Envoy Gateway would not attach keeps the config from `Ready`, naming the policy,
/// the ancestor and Envoy Gateway's own reason: a second ClientTrafficPolicy on the Gateway
/// (so a client's tenant header is not removed). Ancestors that accepted it, and a policy
/// with no status yet, are no problem.
#[test]
fn a_policy_envoy_gateway_refuses_is_not_ready_with_its_reason() {
    let d = picker(DeploymentStatus {
        observed_generation: Some(2),
        updated_replicas: Some(1),
        available_replicas: Some(1),
        ..DeploymentStatus::default()
    });
    let gateway = serde_json::json!({
        "status": {"conditions": [{"type": "Programmed", "status": "True", "reason": "Programmed"}]}
    });
    let accepted_policy = serde_json::json!({
        "kind": "SecurityPolicy",
        "metadata": {"name": "llama-auth"},
        "status": {"ancestors": [{
            "ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "llama"},
            "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "Policy has been accepted."}]
        }]}
    });
    let unreported =
        serde_json::json!({"kind": "EnvoyExtensionPolicy", "metadata": {"name": "llama-bbr"}});
    let conflicted = serde_json::json!({
        "kind": "ClientTrafficPolicy",
        "metadata": {"name": "llama-client"},
        "status": {"ancestors": [{
            "ancestorRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "llama", "sectionName": "http"},
            "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
            "conditions": [{"type": "Accepted", "status": "False", "reason": "Conflicted",
                "message": "Unable to target Gateway llama, another ClientTrafficPolicy has already attached to it"}]
        }]}
    });
    let mut bbr = d.clone();
    bbr.metadata.name = Some("llama-bbr".into());
    let mut observed = Observed {
        gateway: Some(gateway),
        deployments: vec![d, bbr],
        policies: vec![accepted_policy, unreported],
        ..Observed::default()
    };
    let st = accepted(&example(), &observed, 3, &t(1));
    let ready = find_cond(&st, READY);
    assert_eq!(ready.reason, "Ready", "{}", ready.message);
    observed.policies.push(conflicted);
    let st = accepted(&example(), &observed, 3, &t(1));
    let ready = find_cond(&st, READY);
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason, "PolicyNotAccepted");
    assert_eq!(
        ready.message,
        "ClientTrafficPolicy llama-client, Gateway llama listener http: Accepted=False (Conflicted): Unable to target Gateway llama, another ClientTrafficPolicy has already attached to it"
    );
}
