//! Discrete-event scale run: 1,000 pods, 1,000,000 requests (defaults), timed.
//!
//! `cargo run --release -p infergate-sim --example des_scale [-- PODS REQUESTS RATE_PER_POD SCRAPE_MS]`
//!
//! Workload (seeded): Poisson arrivals at RATE_PER_POD × PODS per second, prompts of 128–2,048
//! tokens whose first 0–1,024 tokens come from one of 64 shared prefixes, 16–512 output tokens,
//! pods chosen uniformly at random (the simulator models servers; routing is the bench's job).
//! Fleet: three H100 pods for every A10G pod, all Llama-3.1-8B. With SCRAPE_MS > 0 every pod is
//! also scraped at that interval (50 ms upstream default).

use std::time::Instant;

use infergate_sim::{
    Catalog, EngineKind, Fleet, FleetSpec, PodSpec, Prompt, Request, ScrapeConfig, SimError,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn arg(i: usize, default: f64) -> f64 {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), SimError> {
    let pods = arg(1, 1000.0) as usize;
    let requests = arg(2, 1_000_000.0) as u64;
    let rate_per_pod = arg(3, 2.0);
    let scrape_ms = arg(4, 50.0);
    let catalog = Catalog::builtin()?;
    let (h100, a10g) = (
        catalog.get("llama-3.1-8b/h100")?,
        catalog.get("llama-3.1-8b/a10g")?,
    );
    let spec = FleetSpec {
        seed: 1,
        pods: (0..pods)
            .map(|i| {
                let p = if i % 4 == 3 { a10g } else { h100 };
                PodSpec::new(format!("pod-{i}"), p, EngineKind::Vllm)
            })
            .collect(),
    }
    .finish()?;
    let mut fleet = Fleet::new(&spec)?;
    if scrape_ms > 0.0 {
        fleet.set_scrape(Some(ScrapeConfig {
            interval: scrape_ms * 1e-3,
            lag: 0.0,
        }));
    }
    let mut rng = SmallRng::seed_from_u64(42);
    let rate = rate_per_pod * pods as f64;
    let mut t = 0.0f64;
    let mut done = Vec::with_capacity(requests as usize);
    let started = Instant::now();
    for id in 0..requests {
        t += -(1.0 - rng.random::<f64>()).ln() / rate;
        let tokens = rng.random_range(128..=2048u32);
        let prefix_tokens = rng.random_range(0..=1024u32).min(tokens);
        let r = Request {
            id,
            arrival: t,
            prompt: Prompt::Tokens {
                tokens,
                prefix_group: rng.random_range(0..64u64),
                prefix_tokens,
            },
            max_tokens: rng.random_range(16..=512u32),
            lora: None,
        };
        fleet.submit(rng.random_range(0..pods), r)?;
        if id % 65_536 == 0 {
            fleet.drain_completions(&mut done);
        }
    }
    fleet.run_until_idle();
    fleet.drain_completions(&mut done);
    let wall = started.elapsed().as_secs_f64();
    let mut ttft: Vec<f64> = done.iter().map(|c| c.ttft()).collect();
    ttft.sort_by(f64::total_cmp);
    let q = |p: f64| ttft[((ttft.len() - 1) as f64 * p) as usize];
    let cached: u64 = done.iter().map(|c| u64::from(c.cached_tokens)).sum();
    let prompt: u64 = done.iter().map(|c| u64::from(c.prompt_tokens)).sum();
    let stat = |f: fn(&infergate_sim::engine::Stats) -> u64| -> u64 {
        (0..fleet.len())
            .filter_map(|i| fleet.engine(i))
            .map(|e| f(e.stats()))
            .sum()
    };
    let (steps, single, bulk) = (
        stat(|s| s.steps),
        stat(|s| s.single_steps),
        stat(|s| s.bulk_steps),
    );
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    let _ = writeln!(
        out,
        "pods={pods} requests={requests} completed={} virtual_s={:.1} wall_s={wall:.2} \
         engine_iterations={steps} single_steps={single} bulk_steps={bulk} ttft_p50_ms={:.1} ttft_p99_ms={:.1} prefix_hit_ratio={:.3} scrape_ms={scrape_ms}",
        done.len(),
        fleet.now(),
        q(0.5) * 1e3,
        q(0.99) * 1e3,
        cached as f64 / prompt.max(1) as f64,
    );
    Ok(())
}
