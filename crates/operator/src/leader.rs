//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several operator replicas
//! only one reconciles (kube 4.2 ships no elector).
//!
//! Correctness rests on two things. Every write of the Lease is a `replace` carrying the
//! `resourceVersion` that was read, so when two replicas race for an expired Lease the API
//! server accepts one write and answers the other with 409. And expiry is judged on the local
//! monotonic clock — how long this replica has seen the same Lease record unchanged — never by
//! comparing another machine's `renewTime` with ours, so clock skew between nodes cannot make two
//! replicas believe they lead. A leader that cannot renew within [`Elector::renew_deadline`]
//! (shorter than the lease duration) stops leading before anyone else may take over.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::Error;

/// What a replica should do with the Lease it just read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No Lease exists: create it, holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it over.
    TakeOver,
    /// Someone else holds a live Lease.
    Wait,
}

/// Pure decision from the Lease holder and how long its record has been seen unchanged.
pub fn decide(
    lease: Option<&Lease>,
    identity: &str,
    unchanged_for: Duration,
    lease_duration: Duration,
) -> Decision {
    let Some(lease) = lease else {
        return Decision::Create;
    };
    let holder = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or("");
    if holder == identity {
        Decision::Renew
    } else if holder.is_empty() || unchanged_for >= lease_duration {
        Decision::TakeOver
    } else {
        Decision::Wait
    }
}

/// A Lease-based leader elector.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
    /// The Lease's last seen `resourceVersion` and when it was first seen.
    observed: Mutex<Option<(String, Instant)>>,
}

impl Elector {
    /// An elector for Lease `name` in `api`'s namespace, as `identity` (the pod name).
    pub fn new(api: Api<Lease>, name: &str, identity: &str, lease_duration: Duration) -> Self {
        Self {
            api,
            name: name.to_owned(),
            identity: identity.to_owned(),
            lease_duration,
            observed: Mutex::new(None),
        }
    }

    /// How long a leader keeps leading without a successful renew: two thirds of the lease.
    pub fn renew_deadline(&self) -> Duration {
        self.lease_duration * 2 / 3
    }

    /// Reads the Lease and acquires or renews it if allowed. `Ok(true)`: we lead now.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, Error> {
        let now = Instant::now();
        let current = self.api.get_opt(&self.name).await?;
        let unchanged_for = self.unchanged_for(current.as_ref(), now);
        let decision = decide(
            current.as_ref(),
            &self.identity,
            unchanged_for,
            self.lease_duration,
        );
        let wall = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let secs = i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let result = match (decision, current) {
            (Decision::Wait, _) => return Ok(false),
            (Decision::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(secs),
                        acquire_time: Some(wall.clone()),
                        renew_time: Some(wall),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (Decision::Renew, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                spec.renew_time = Some(wall);
                spec.lease_duration_seconds = Some(secs);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
            (Decision::TakeOver, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                spec.holder_identity = Some(self.identity.clone());
                spec.acquire_time = Some(wall.clone());
                spec.renew_time = Some(wall);
                spec.lease_duration_seconds = Some(secs);
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
            (Decision::Renew | Decision::TakeOver, None) => return Ok(false),
        };
        match result {
            Ok(written) => {
                self.unchanged_for(Some(&written), now);
                if decision != Decision::Renew {
                    info!(lease = %self.name, identity = %self.identity, ?decision, "acquired leadership");
                }
                Ok(true)
            }
            // Someone else wrote first: they lead.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the Lease up if we hold it, so another replica takes over at once.
    pub async fn step_down(&self) -> Result<(), Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits to lead, then runs `work` while renewing every `renew_every`. Returns `work`'s
    /// output (after stepping down), or [`Error::LostLease`] as soon as leadership is lost —
    /// `work` is dropped then, so nothing it does outlives the Lease.
    pub async fn lead<F: Future>(
        &self,
        work: F,
        renew_every: Duration,
    ) -> Result<F::Output, Error> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => warn!(error = %e, "reading the Lease failed"),
            }
            tokio::time::sleep(renew_every).await;
        }
        let mut last_renew = Instant::now();
        tokio::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => {
                    if let Err(e) = self.step_down().await {
                        warn!(error = %e, "stepping down failed; the Lease will expire");
                    }
                    return Ok(out);
                }
                () = tokio::time::sleep(renew_every) => {
                    match self.try_acquire_or_renew().await {
                        Ok(true) => last_renew = Instant::now(),
                        Ok(false) => return Err(Error::LostLease),
                        Err(e) if last_renew.elapsed() >= self.renew_deadline() => {
                            warn!(error = %e, "renew deadline passed");
                            return Err(Error::LostLease);
                        }
                        Err(e) => warn!(error = %e, "renewing the Lease failed; retrying"),
                    }
                }
            }
        }
    }

    fn unchanged_for(&self, lease: Option<&Lease>, now: Instant) -> Duration {
        let rv = lease
            .and_then(|l| l.metadata.resource_version.clone())
            .unwrap_or_default();
        let mut seen = match self.observed.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        match &*seen {
            Some((old, since)) if *old == rv => now.saturating_duration_since(*since),
            _ => {
                *seen = Some((rv, now));
                Duration::ZERO
            }
        }
    }
}

#[cfg(test)]
mod tests;
