//! A pick allocates nothing on the heap once the pool and the prefix index have warmed up: the
//! returned list is an inline array and every working buffer is reused.
//!
//! This binary holds a single test because the counting allocator is process-wide.

#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use std::alloc::System;
use std::time::Duration;

use infergate_scheduler::fixtures::{mixed_snapshot, scheduler_with};
use infergate_scheduler::{
    Preset, Priority, RequestContext, Scheduler, SchedulerConfig, Timestamp, Usage,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn build(preset: Preset, n: u32, now: Timestamp) -> Scheduler {
    scheduler_with(SchedulerConfig::preset(preset), n, |i| {
        mixed_snapshot(i, now)
    })
}

/// One request cycle: pick, first token, completion. Returns the number of picks that succeeded.
fn cycle(
    s: &mut Scheduler,
    prompts: &[String],
    adapters: &[&str],
    rng: &mut SmallRng,
    now: Timestamp,
) -> usize {
    let p = rng.random_range(0..prompts.len());
    let segs = ["system", "You are helpful.", "user", prompts[p].as_str()];
    let adapter = adapters[p % adapters.len()];
    let req = RequestContext::new("llama", 700)
        .with_prompt(&segs)
        .with_lora(Some(adapter))
        .with_priority(Priority::Standard);
    match s.pick(&req, now, rng) {
        Ok(d) => {
            let first = now.saturating_add(Duration::from_millis(40));
            s.first_token(d.ticket, first);
            s.complete(
                d.ticket,
                first.saturating_add(Duration::from_millis(500)),
                Usage {
                    prompt_tokens: 700,
                    cached_tokens: 128,
                    output_tokens: 64,
                },
            );
            1
        }
        Err(_) => 0,
    }
}

#[test]
fn steady_state_picks_do_not_allocate() {
    let now = Timestamp::from_millis(1_000);
    let prompts: Vec<String> = (0..32)
        .map(|i| format!("conversation {i}: ").repeat(150))
        .collect();
    let adapters = ["adapter-0", "adapter-1", "adapter-2"];
    for preset in [
        Preset::Infergate,
        Preset::GieDefault,
        Preset::RoundRobin,
        Preset::Random,
        Preset::LeastRequest,
    ] {
        for n in [10, 1_000] {
            let mut s = build(preset, n, now);
            let mut rng = SmallRng::seed_from_u64(11);
            // Keep a few requests in flight throughout.
            let held: Vec<_> = (0..8)
                .map(|_| {
                    s.pick(&RequestContext::new("llama", 10), now, &mut rng)
                        .unwrap()
                })
                .collect();
            // Warm-up: every prompt seen, buffers and tables at their working size. A large
            // pool's sample keeps 16 of the pods that know a request's adapter, at random, so a
            // prompt reaches more pods before the prefix index holds each of them.
            for _ in 0..5_000 {
                cycle(&mut s, &prompts, &adapters, &mut rng, now);
            }
            let region = Region::new(GLOBAL);
            let mut ok = 0;
            for _ in 0..1_000 {
                ok += cycle(&mut s, &prompts, &adapters, &mut rng, now);
            }
            let stats = region.change();
            assert_eq!(ok, 1_000, "{preset} n={n}: every pick succeeded");
            assert_eq!(
                (stats.allocations, stats.reallocations),
                (0, 0),
                "{preset} n={n}: {stats:?}"
            );
            for d in held {
                assert!(s.cancel(d.ticket, now));
            }
        }
    }
}
