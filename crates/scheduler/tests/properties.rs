//! Property tests of the scheduler's invariants over arbitrary pools and requests.

#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use infergate_scheduler::fixtures::{addr, index_of, scheduler_with, snapshot};
use infergate_scheduler::{
    AllFilteredAction, LoraState, Preset, Priority, Rejection, RequestContext, Scheduler,
    SchedulerConfig, Timestamp, Usage, Weights,
};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;

const NOW: Timestamp = Timestamp::from_millis(100_000);

#[derive(Clone, Debug)]
struct Pod {
    waiting: u32,
    running: u32,
    kv: f64,
    stale: bool,
    lora: Option<(u32, Vec<u8>, Vec<u8>)>,
}

fn pod() -> impl Strategy<Value = Pod> {
    (
        0u32..80,
        0u32..40,
        0.0f64..1.0,
        prop::bool::weighted(0.2),
        prop::option::of((
            0u32..3,
            prop::collection::vec(0u8..4, 0..3),
            prop::collection::vec(0u8..4, 0..3),
        )),
    )
        .prop_map(|(waiting, running, kv, stale, lora)| Pod {
            waiting,
            running,
            kv,
            stale,
            lora,
        })
}

fn adapter(i: u8) -> String {
    format!("adapter-{i}")
}

fn build(cfg: SchedulerConfig, pods: &[Pod]) -> Scheduler {
    scheduler_with(cfg, pods.len() as u32, |i| {
        let p = &pods[i as usize];
        let sampled_at = if p.stale {
            Timestamp::from_millis(1_000)
        } else {
            NOW
        };
        let mut m = snapshot(sampled_at, p.waiting, p.kv);
        m.running = p.running;
        m.lora = p.lora.as_ref().map(|(max, run, wait)| LoraState {
            max_lora: *max,
            running: run.iter().map(|a| adapter(*a)).collect(),
            waiting: wait.iter().map(|a| adapter(*a)).collect(),
        });
        m
    })
}

fn lora_capable(p: &Pod, a: u8) -> bool {
    match &p.lora {
        None => true,
        Some((max, run, wait)) => {
            let loaded: HashSet<u8> = run.iter().chain(wait).copied().collect();
            run.contains(&a) || wait.contains(&a) || (loaded.len() as u32) < *max
        }
    }
}

fn prompt(i: u8) -> String {
    format!("prompt family {}: ", i % 3).repeat(20) + &"tail ".repeat(usize::from(i))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every returned endpoint passed the subset hint, the freshness filter and the LoRA filter;
    /// fallbacks are distinct; and the same seed gives the same decision.
    #[test]
    fn filtered_pods_are_never_returned_and_fallbacks_are_distinct(
        pods in prop::collection::vec(pod(), 1..12),
        subset_mask in prop::option::of(prop::collection::vec(any::<bool>(), 12)),
        lora in prop::option::of(0u8..4),
        prio in prop::sample::select(vec![Priority::Critical, Priority::Standard, Priority::Sheddable]),
        k in 1u8..=8,
        p in any::<u8>(),
        seed in any::<u64>(),
    ) {
        let cfg = SchedulerConfig {
            on_all_filtered: AllFilteredAction::Reject,
            returned_endpoints: k,
            ..SchedulerConfig::default()
        };
        let mut a = build(cfg.clone(), &pods);
        let mut b = build(cfg, &pods);
        let subset: Option<Vec<SocketAddr>> = subset_mask.map(|m| {
            (0..pods.len() as u32).filter(|i| m[*i as usize]).map(addr).collect()
        });
        let text = prompt(p);
        let segs = [text.as_str()];
        let name = lora.map(adapter);
        let req = RequestContext::new("m", 200)
            .with_prompt(&segs)
            .with_lora(name.as_deref())
            .with_priority(prio)
            .with_subset(subset.as_deref());
        let da = a.pick(&req, NOW, &mut SmallRng::seed_from_u64(seed));
        let (db, ex) = b.pick_explained(&req, NOW, &mut SmallRng::seed_from_u64(seed));
        prop_assert_eq!(&da, &db);
        let eligible: Vec<usize> = (0..pods.len())
            .filter(|i| subset.as_ref().is_none_or(|s| s.contains(&addr(*i as u32))))
            .filter(|i| !pods[*i].stale)
            .filter(|i| lora.is_none_or(|l| lora_capable(&pods[*i], l)))
            .collect();
        match da {
            Ok(d) => {
                let got = d.endpoints.as_slice();
                prop_assert!(!got.is_empty());
                prop_assert!(got.len() <= usize::from(k).min(eligible.len()));
                let distinct: HashSet<_> = got.iter().collect();
                prop_assert_eq!(distinct.len(), got.len());
                for a in got {
                    let i = index_of(*a);
                    prop_assert!(eligible.contains(&i), "{} was filtered: {:?}", a, ex.filtered);
                    prop_assert!(!ex.filtered.iter().any(|f| f.addr == *a));
                }
            }
            Err(r) => {
                let shed = r.retry_after().is_some();
                prop_assert!(eligible.is_empty() || (shed && prio != Priority::Critical));
            }
        }
    }

    /// With the default `onAllFiltered: all-ready`, a stale pod is never returned (the fallback
    /// relaxes LoRA only), and when every candidate is stale the answer is 503 with Retry-After.
    #[test]
    fn all_ready_never_returns_a_stale_pod(
        pods in prop::collection::vec(pod(), 1..12),
        lora in prop::option::of(0u8..4),
        prio in prop::sample::select(vec![Priority::Critical, Priority::Standard, Priority::Sheddable]),
        seed in any::<u64>(),
    ) {
        let mut s = build(SchedulerConfig::default(), &pods);
        let name = lora.map(adapter);
        let req = RequestContext::new("m", 200).with_lora(name.as_deref()).with_priority(prio);
        match s.pick(&req, NOW, &mut SmallRng::seed_from_u64(seed)) {
            Ok(d) => {
                for a in d.endpoints.as_slice() {
                    prop_assert!(!pods[index_of(*a)].stale, "{} is stale", a);
                }
            }
            Err(r) if pods.iter().all(|p| p.stale) => {
                prop_assert_eq!(r, Rejection::Unavailable { retry_after: Duration::from_secs(1) });
            }
            Err(r) => prop_assert!(matches!(r, Rejection::Shed { .. }), "{:?}", r),
        }
    }

    /// With a scorer's weight at zero, changing only that scorer's input never changes the pick.
    #[test]
    fn zero_weight_removes_a_scorers_influence(
        pods in prop::collection::vec(pod(), 1..10),
        kvs in prop::collection::vec(0.0f64..0.9, 10),
        seed in any::<u64>(),
    ) {
        let cfg = SchedulerConfig {
            weights: Weights { queue: 1.0, kv_cache: 0.0, estimated_wait: 2.0, ..Weights::default() },
            ..SchedulerConfig::default()
        };
        let pods: Vec<Pod> = pods.into_iter().map(|mut p| { p.kv = p.kv.min(0.9); p }).collect();
        let other: Vec<Pod> = pods.iter().zip(&kvs).map(|(p, kv)| Pod { kv: *kv, ..p.clone() }).collect();
        let mut a = build(cfg.clone(), &pods);
        let mut b = build(cfg, &other);
        let req = RequestContext::new("m", 300);
        let da = a.pick(&req, NOW, &mut SmallRng::seed_from_u64(seed)).map(|d| d.endpoints);
        let db = b.pick(&req, NOW, &mut SmallRng::seed_from_u64(seed)).map(|d| d.endpoints);
        prop_assert_eq!(da, db);
    }

    /// In-flight accounting balances: whatever order outcomes are reported in, and however often,
    /// every endpoint is back to zero once each ticket has been reported.
    #[test]
    fn inflight_accounting_balances(
        n in 1usize..6,
        ops in prop::collection::vec((0u8..5, any::<u16>()), 1..120),
        preset in prop::sample::select(Preset::ALL.to_vec()),
    ) {
        let pods = vec![Pod { waiting: 0, running: 0, kv: 0.1, stale: false, lora: None }; n];
        let mut s = build(SchedulerConfig::preset(preset), &pods);
        let mut rng = SmallRng::seed_from_u64(1);
        let mut tickets = Vec::new();
        let mut live = 0usize;
        let mut t = NOW;
        for (op, x) in ops {
            t = t.saturating_add(Duration::from_millis(5));
            match op {
                0 | 1 => {
                    if let Ok(d) = s.pick(&RequestContext::new("m", u32::from(x % 2000)), t, &mut rng) {
                        tickets.push(d.ticket);
                        live += 1;
                    }
                }
                _ if tickets.is_empty() => {}
                2 => { s.first_token(tickets[usize::from(x) % tickets.len()], t); }
                3 => {
                    let tk = tickets[usize::from(x) % tickets.len()];
                    if s.complete(tk, t, Usage { prompt_tokens: 100, cached_tokens: 10, output_tokens: 20 }) {
                        live -= 1;
                    }
                }
                _ => {
                    if s.cancel(tickets[usize::from(x) % tickets.len()], t) {
                        live -= 1;
                    }
                }
            }
            prop_assert_eq!(s.inflight(), live);
            let sum: u32 = (0..n as u32).map(|i| s.endpoint(addr(i)).unwrap().inflight).sum();
            prop_assert_eq!(sum as usize, live);
        }
        for tk in tickets {
            s.fail(tk, t);
        }
        prop_assert_eq!(s.inflight(), 0);
        for i in 0..n as u32 {
            let e = s.endpoint(addr(i)).unwrap();
            prop_assert_eq!((e.inflight, e.awaiting_first_token), (0, 0));
        }
    }
}
