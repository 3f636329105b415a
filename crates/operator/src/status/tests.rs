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
