//! The Lease elector against the fake API: one leader at a time, renewal, takeover after
//! expiry on the paused clock, stepping down, losing the race, and `lead` stopping its work the
//! moment the Lease is lost.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

#[path = "common/fake.rs"]
mod fake;

use std::time::Duration;

use fake::Fake;
use infergate_operator::Error;
use infergate_operator::leader::Elector;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::json;

const LEASE: &str =
    "/apis/coordination.k8s.io/v1/namespaces/infergate-system/leases/infergate-operator";
const DURATION: Duration = Duration::from_secs(15);

fn pair() -> (Elector, Elector, Fake) {
    let (client, fake) = fake::client();
    let api: Api<Lease> = Api::namespaced(client, "infergate-system");
    let a = Elector::new(api.clone(), "infergate-operator", "pod-a", DURATION);
    let b = Elector::new(api, "infergate-operator", "pod-b", DURATION);
    (a, b, fake)
}

fn holder(fake: &Fake) -> Option<String> {
    fake.get(LEASE).unwrap()["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_owned)
}

#[tokio::test(start_paused = true)]
async fn only_one_replica_leads_and_the_leader_renews() {
    let (a, b, fake) = pair();
    assert!(a.try_acquire_or_renew().await.unwrap());
    let created = fake.log().iter().filter(|s| s.method == "POST").count();
    assert_eq!(created, 1);
    assert!(!b.try_acquire_or_renew().await.unwrap());
    let rv_before = fake.get(LEASE).unwrap()["metadata"]["resourceVersion"].clone();
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert_ne!(
        fake.get(LEASE).unwrap()["metadata"]["resourceVersion"],
        rv_before,
        "renew wrote"
    );
    // B keeps seeing fresh records, so even past one lease duration in total it waits.
    tokio::time::advance(Duration::from_secs(12)).await;
    assert!(!b.try_acquire_or_renew().await.unwrap());
    assert_eq!(holder(&fake).as_deref(), Some("pod-a"));
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_is_taken_over_and_the_old_leader_knows() {
    let (a, b, fake) = pair();
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap()); // B starts its own timer here.
    tokio::time::advance(DURATION).await; // A has not renewed for a whole lease.
    assert!(b.try_acquire_or_renew().await.unwrap());
    let lease = fake.get(LEASE).unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "pod-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    assert!(
        !a.try_acquire_or_renew().await.unwrap(),
        "A must not lead any more"
    );
}

#[tokio::test(start_paused = true)]
async fn stepping_down_hands_over_at_once() {
    let (a, b, fake) = pair();
    assert!(a.try_acquire_or_renew().await.unwrap());
    a.step_down().await.unwrap();
    assert_eq!(holder(&fake), None);
    assert!(b.try_acquire_or_renew().await.unwrap());
    // Stepping down when not the holder changes nothing.
    a.step_down().await.unwrap();
    assert_eq!(holder(&fake).as_deref(), Some("pod-b"));
}

#[tokio::test(start_paused = true)]
async fn losing_the_write_race_means_not_leading() {
    let (a, b, fake) = pair();
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap());
    tokio::time::advance(DURATION).await;
    // Another replica wrote the Lease between B's read and B's write.
    fake.fail("PUT", LEASE, 409, 1);
    assert!(!b.try_acquire_or_renew().await.unwrap());
    assert_eq!(holder(&fake).as_deref(), Some("pod-a"));
}

#[tokio::test(start_paused = true)]
async fn lead_runs_work_while_leading_and_drops_it_when_the_lease_is_lost() {
    let (a, _b, fake) = pair();
    let steal = fake.clone();
    let work = async {
        // Runs "forever"; while it runs another replica takes the Lease.
        tokio::time::sleep(Duration::from_secs(3)).await;
        steal.edit(LEASE, |l| l["spec"]["holderIdentity"] = json!("pod-b"));
        std::future::pending::<()>().await;
    };
    let err = a.lead(work, Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(err, Error::LostLease), "{err}");
}

#[tokio::test(start_paused = true)]
async fn lead_steps_down_when_work_finishes() {
    let (a, _b, fake) = pair();
    let out = a.lead(async { 7 }, Duration::from_secs(5)).await.unwrap();
    assert_eq!(out, 7);
    assert_eq!(holder(&fake), None);
}

#[tokio::test(start_paused = true)]
async fn renew_errors_past_the_deadline_stop_leading() {
    let (a, _b, fake) = pair();
    let failing = fake.clone();
    let work = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        failing.fail("GET", LEASE, 500, 100);
        std::future::pending::<()>().await;
    };
    let started = tokio::time::Instant::now();
    let err = a.lead(work, Duration::from_secs(2)).await.unwrap_err();
    assert!(matches!(err, Error::LostLease));
    // Gave up within the renew deadline (10 s) plus one renew period, well before expiry (15 s).
    assert!(
        started.elapsed() <= Duration::from_secs(13),
        "{:?}",
        started.elapsed()
    );
}
