//! Admission: whether a request is shed when no candidate has headroom, and the `Retry-After`
//! told to the client (crate-internal).
//!
//! Runs on the candidate views, before the saturation filter: while some candidate is below the
//! saturation thresholds every request is admitted (the filter then routes among those). When every
//! candidate is saturated, with shedding on, `Sheddable` requests are shed, `Standard` ones only
//! when every candidate is also over the overload thresholds, and `Critical` ones never.
//!
//! A request whose caller queues (flow control, `queue` below) is "shed" at every priority as
//! soon as every candidate is saturated: the caller parks it until a pod has headroom.
//!
//! A queueing request may also have to leave a reserve (flow control's headroom reservation,
//! `reserved` below): it may not take a candidate with no prefill ahead when that would leave
//! fewer than `reserved` such candidates, and may take no candidate at all while fewer than
//! `reserved` are left; the candidates it may not take count as saturated for it, so it goes
//! to a pod already prefilling that has headroom, or is "shed" to wait in the queue.
//!
//! `Retry-After` is the pool's estimated drain time: for each candidate, the time until it is back
//! under the saturation thresholds at its learned rates; the smallest, rounded up to whole seconds
//! and clamped to `[retryAfterMinMs, retryAfterMaxMs]`.

use std::time::Duration;

use crate::config::SchedulerConfig;
use crate::decision::Rejection;
use crate::explain::Explanation;
use crate::rates::PoolRates;
use crate::request::Priority;
use crate::table::EndpointTable;
use crate::view::View;

/// Admits the request, or sheds it with the estimated drain time. With `queue` and a
/// `reserved` count, first marks the candidates it must leave to others saturated (recorded in
/// `ex`); `Ok(true)` says the reserve held some back (the reservation counts clear pods among
/// `views`, so a pick over a sample of the pool judges it again over the whole pool).
#[allow(
    clippy::too_many_arguments,
    reason = "crate-internal; the pieces of one pick"
)]
pub(crate) fn admit(
    cfg: &SchedulerConfig,
    priority: Priority,
    queue: bool,
    reserved: u16,
    views: &mut [View],
    table: &EndpointTable,
    rates: &PoolRates,
    mut ex: Option<&mut Explanation>,
) -> Result<bool, Rejection> {
    let mut held = false;
    if queue {
        hold_reserve(reserved, views, |v| {
            held = true;
            if let (Some(ex), Some(ep)) = (ex.as_deref_mut(), table.get(v.slot)) {
                ex.reserve_held.push(ep.cold.meta.addr);
            }
        });
    }
    if !views.iter().all(|v| v.saturated) {
        return Ok(held);
    }
    let shed = queue
        || cfg.shedding
            && match priority {
                Priority::Critical => false,
                Priority::Standard => views.iter().all(|v| v.overloaded),
                Priority::Sheddable => true,
            };
    if shed {
        return Err(Rejection::Shed {
            retry_after: retry_after(cfg, views, table, rates),
        });
    }
    Ok(held)
}

/// Whether a candidate has headroom and no prefill ahead of a new request (nothing waiting in
/// its engine, none of this gateway's requests without a first token).
fn clear(v: &View) -> bool {
    !v.saturated && v.queued_tokens < 1.0
}

/// The headroom reservation, with `keep` = `reserved` (at most the candidates minus one): while
/// more than `keep` candidates are clear the request may take any; with exactly `keep` clear it
/// may not take a clear one (they count as saturated for it); with fewer, it may take none until
/// the reserve has been rebuilt — a pod already prefilling that takes more prefills never
/// clears, so without that rule the reserve, once used, would not come back under load.
fn hold_reserve(reserved: u16, views: &mut [View], mut held: impl FnMut(&View)) {
    let keep = usize::from(reserved).min(views.len().saturating_sub(1));
    if keep == 0 {
        return;
    }
    let n_clear = views.iter().filter(|v| clear(v)).count();
    if n_clear > keep {
        return;
    }
    let all = n_clear < keep;
    for v in views.iter_mut().filter(|v| all || clear(v)) {
        if !v.saturated {
            v.saturated = true;
            held(v);
        }
    }
}

/// Estimated seconds until a saturated endpoint is back under the saturation thresholds.
fn drain_secs(cfg: &SchedulerConfig, v: &View, table: &EndpointTable, rates: &PoolRates) -> f64 {
    let Some(ep) = table.get(v.slot) else {
        return f64::INFINITY;
    };
    let sat = cfg.saturation;
    let prefill_rate = ep.prefill_rate(rates);
    let decode_rate = ep.decode_rate(rates);
    let excess = (v.waiting - f64::from(sat.queue_depth) + 1.0).max(0.0);
    let queue = if v.waiting > 0.0 {
        v.queued_tokens * excess / v.waiting
    } else {
        0.0
    };
    let mut secs = queue / prefill_rate;
    if let Some(k) = v.kv
        && k >= sat.kv_cache
    {
        let frac = ((k - sat.kv_cache) / (1.0 - sat.kv_cache).max(0.01)).clamp(0.1, 1.0);
        secs += frac * rates.mean_output / decode_rate;
    }
    secs
}

/// The pool's `Retry-After`: the first candidate's drain time, clamped.
fn retry_after(
    cfg: &SchedulerConfig,
    views: &[View],
    table: &EndpointTable,
    rates: &PoolRates,
) -> Duration {
    let secs = views
        .iter()
        .map(|v| drain_secs(cfg, v, table, rates))
        .fold(f64::INFINITY, f64::min);
    clamp_secs(secs, cfg.retry_after_min, cfg.retry_after_max)
}

/// `secs` rounded up to whole seconds within `lo..=hi`. A drain time beyond what a `Duration`
/// holds (absurd rates), infinite or not a number is `hi` or `lo`, never a panic.
fn clamp_secs(secs: f64, lo: Duration, hi: Duration) -> Duration {
    let d = Duration::try_from_secs_f64(secs.max(0.0).ceil()).unwrap_or(hi);
    // `max` then `min` rather than `clamp`: `clamp` panics when `lo > hi`.
    d.max(lo).min(hi)
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests {
    use std::time::Duration;

    use crate::fixtures::*;
    use crate::*;

    #[test]
    fn saturated_pool_sheds_sheddable_first_and_never_critical() {
        let mut s = saturated_scheduler();
        let shed = s
            .pick(
                &RequestContext::new("m", 100).with_priority(Priority::Sheddable),
                T0,
                &mut rng(1),
            )
            .unwrap_err();
        assert_eq!(shed.http_status(), 429);
        assert_eq!(shed.metric_label(), "shed");
        assert!(shed.retry_after().unwrap() >= Duration::from_secs(1));
        // Standard still gets through while the pool is saturated but not overloaded.
        let d = s
            .pick(&RequestContext::new("m", 100), T0, &mut rng(2))
            .unwrap();
        s.cancel(d.ticket, T0);
        // Overloaded: Standard is shed too, Critical is not.
        let over = s.config().overload.queue_depth;
        for i in 0..3 {
            s.apply_metrics(addr(i), snapshot(T0, over + i, 0.5))
                .unwrap();
        }
        let std = s.pick(&RequestContext::new("m", 100), T0, &mut rng(3));
        assert!(matches!(std, Err(Rejection::Shed { .. })));
        for seed in 0..20 {
            let d = s
                .pick(
                    &RequestContext::new("m", 100).with_priority(Priority::Critical),
                    T0,
                    &mut rng(seed),
                )
                .unwrap();
            // Critical goes to the least loaded pod.
            assert_eq!(d.endpoints.first(), addr(0));
            s.cancel(d.ticket, T0);
        }
    }

    #[test]
    fn a_queueing_caller_gets_shed_at_every_priority_only_when_saturated() {
        let mut s = saturated_scheduler();
        for p in [Priority::Critical, Priority::Standard, Priority::Sheddable] {
            let cx = RequestContext::new("m", 100)
                .with_priority(p)
                .with_queueing(true);
            let r = s.pick(&cx, T0, &mut rng(1)).unwrap_err();
            assert!(matches!(r, Rejection::Shed { .. }), "{p:?}: {r:?}");
        }
        // With headroom on one pod, a queueing caller is routed as any other.
        s.apply_metrics(addr(0), snapshot(T0, 0, 0.1)).unwrap();
        let cx = RequestContext::new("m", 100)
            .with_priority(Priority::Critical)
            .with_queueing(true);
        let d = s.pick(&cx, T0, &mut rng(1)).unwrap();
        assert_eq!(d.endpoints.first(), addr(0));
    }

    #[test]
    fn a_reserve_leaves_the_last_clear_pods_to_requests_without_one() {
        // Saturated from 16 waiting: a pod with one request prefilling still has headroom.
        let mut s = scheduler(SchedulerConfig::default(), 3);
        let keep_two = |s: &mut Scheduler, seed| {
            let cx = RequestContext::new("m", 500)
                .with_queueing(true)
                .with_reserved_endpoints(2);
            s.pick(&cx, T0, &mut rng(seed))
        };
        // Three clear pods: taking one leaves two.
        let first = keep_two(&mut s, 1).unwrap().endpoints.first();
        // Two clear pods left: the next requests go to the pod already prefilling.
        for seed in 2..6 {
            let d = keep_two(&mut s, seed).unwrap();
            assert_eq!(d.endpoints.first(), first, "seed {seed}");
        }
        // A request without a reserve takes a clear pod.
        let cx = RequestContext::new("m", 500).with_queueing(true);
        let free = s.pick(&cx, T0, &mut rng(7)).unwrap().endpoints.first();
        assert_ne!(free, first);
        // One clear pod left, fewer than the reserve: nothing for a request that must leave two,
        // though two pods have headroom, until the reserve is rebuilt.
        let cx = RequestContext::new("m", 500)
            .with_queueing(true)
            .with_reserved_endpoints(2);
        let (r, ex) = s.pick_explained(&cx, T0, &mut rng(10));
        assert!(matches!(r, Err(Rejection::Shed { .. })), "{r:?}");
        // The explanation names the pods held back for the reserve.
        assert_eq!(ex.reserve_held.len(), 3, "{ex:?}");
        assert!(
            ex.summary(4).contains(" reserve_held="),
            "{}",
            ex.summary(4)
        );
        // A request that must leave one may still use the pods already prefilling.
        let cx = RequestContext::new("m", 500)
            .with_queueing(true)
            .with_reserved_endpoints(1);
        let d = s.pick(&cx, T0, &mut rng(11)).unwrap();
        assert!(d.endpoints.first() == first || d.endpoints.first() == free);
        // One clear pod left, and the two others saturated: the reserve holds, the request waits.
        let sat = s.config().saturation.queue_depth;
        s.apply_metrics(first, snapshot(T0, sat, 0.5)).unwrap();
        s.apply_metrics(free, snapshot(T0, sat, 0.5)).unwrap();
        assert!(matches!(keep_two(&mut s, 8), Err(Rejection::Shed { .. })));
        // Without queueing the reserve does not apply.
        let cx = RequestContext::new("m", 500).with_reserved_endpoints(2);
        assert!(s.pick(&cx, T0, &mut rng(9)).is_ok());
        // A pool of one pod reserves nothing.
        let mut one = scheduler(SchedulerConfig::default(), 1);
        for seed in 0..3 {
            assert!(keep_two(&mut one, seed).is_ok());
        }
    }

    #[test]
    fn retry_after_from_absurd_drain_times_is_clamped_not_a_panic() {
        let (lo, hi) = (Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(super::clamp_secs(1e30, lo, hi), hi);
        assert_eq!(super::clamp_secs(f64::INFINITY, lo, hi), hi);
        assert_eq!(super::clamp_secs(f64::NAN, lo, hi), lo);
        assert_eq!(super::clamp_secs(-5.0, lo, hi), lo);
        assert_eq!(super::clamp_secs(2.1, lo, hi), Duration::from_secs(3));
        assert_eq!(super::clamp_secs(1e30, lo, Duration::MAX), Duration::MAX);
        // An inverted range (min above max) gives the maximum instead of panicking.
        assert_eq!(super::clamp_secs(5.0, hi, lo), lo);
    }

    #[test]
    fn retry_after_follows_the_estimated_drain_time() {
        let req = RequestContext::new("m", 100).with_priority(Priority::Sheddable);
        let mut retry = Vec::new();
        for depth in [16, 40, 200] {
            let mut s = scheduler(SchedulerConfig::default(), 2);
            for i in 0..2 {
                s.apply_metrics(addr(i), snapshot(T0, depth, 0.5)).unwrap();
            }
            retry.push(
                s.pick(&req, T0, &mut rng(1))
                    .unwrap_err()
                    .retry_after()
                    .unwrap(),
            );
        }
        assert!(retry[0] < retry[1] && retry[1] < retry[2], "{retry:?}");
        assert!(retry.iter().all(|d| d.subsec_nanos() == 0));
    }
}
