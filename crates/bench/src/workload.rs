//! Seeded workload generation: the same scenario and seed give the same arrivals, bit for bit,
//! and every policy in a run is fed exactly these.

use std::sync::Arc;

use infergate_scheduler::Priority;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::scenario::{ArrivalProcess, LengthDist, Workload};

/// One generated request.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    /// Sequence number (0-based, in arrival order).
    pub id: u64,
    /// Arrival time (s).
    pub at: f64,
    /// Prompt tokens in total (shared prefix included).
    pub prompt_tokens: u32,
    /// Shared-prefix group, if the request starts with one.
    pub prefix_group: Option<u32>,
    /// Tokens of the shared prefix (0 without a group).
    pub prefix_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// Index into the workload's LoRA adapter list.
    pub lora: Option<u16>,
    /// Priority.
    pub priority: Priority,
}

/// Generates the arrivals of `workload` for `seed`.
pub fn generate(workload: &Workload, seed: u64) -> Vec<Arrival> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x6265_6e63_685f_776c);
    let prefix_cdf = workload
        .prefix
        .as_ref()
        .map(|p| zipf_cdf(p.groups as usize, p.zipf));
    let lora_cdf = workload
        .lora
        .as_ref()
        .map(|l| zipf_cdf(l.adapters.len(), l.zipf));
    let mut out = Vec::new();
    let max_rate = max_rate(&workload.arrival, workload.duration_s);
    if max_rate <= 0.0 {
        return out;
    }
    let mut t = 0.0;
    loop {
        // Thinning: candidate events at the peak rate, kept with probability rate(t) / peak.
        t += exp(&mut rng, max_rate);
        if t >= workload.duration_s {
            break;
        }
        let keep = rate_at(&workload.arrival, workload.duration_s, t) / max_rate;
        if rng.random::<f64>() >= keep {
            continue;
        }
        let mut prompt = sample(&workload.prompt_tokens, &mut rng);
        let (mut group, mut prefix_tokens) = (None, 0);
        if let (Some(p), Some(cdf)) = (&workload.prefix, &prefix_cdf)
            && rng.random::<f64>() < p.fraction
        {
            group = Some(pick(cdf, &mut rng) as u32);
            prefix_tokens = p.tokens;
            prompt = prompt.saturating_add(p.tokens);
        }
        let output = sample(&workload.output_tokens, &mut rng);
        let mut lora = None;
        if let (Some(l), Some(cdf)) = (&workload.lora, &lora_cdf)
            && rng.random::<f64>() < l.fraction
        {
            lora = u16::try_from(pick(cdf, &mut rng)).ok();
        }
        let mut priority = Priority::Standard;
        if let Some(p) = &workload.priorities {
            let u = rng.random::<f64>();
            if u < p.critical {
                priority = Priority::Critical;
            } else if u < p.critical + p.sheddable {
                priority = Priority::Sheddable;
            }
        }
        out.push(Arrival {
            id: out.len() as u64,
            at: t,
            prompt_tokens: prompt,
            prefix_group: group,
            prefix_tokens,
            output_tokens: output,
            lora,
            priority,
        });
    }
    out
}

/// The prompt text of an arrival: `prompt_tokens × 4` bytes whose first `prefix_tokens × 4` bytes
/// are the group's and the rest unique to the request, so that the simulator's prefix cache and
/// the scheduler's prefix index both see exactly the sharing the workload describes.
pub fn prompt_text(a: &Arrival) -> Arc<str> {
    let total = a.prompt_tokens as usize * infergate_sim::tokens::BYTES_PER_TOKEN;
    let shared = (a.prefix_tokens as usize * infergate_sim::tokens::BYTES_PER_TOKEN).min(total);
    let mut s = String::with_capacity(total);
    if let Some(g) = a.prefix_group {
        let head = format!("<group {g:08} system prompt>");
        fill(&mut s, &head, shared, 'p');
    }
    let head = format!("<request {:016x}>", a.id);
    fill(&mut s, &head, total, 'u');
    s.into()
}

fn fill(s: &mut String, head: &str, upto: usize, filler: char) {
    for c in head.chars() {
        if s.len() >= upto {
            return;
        }
        s.push(c);
    }
    while s.len() < upto {
        s.push(filler);
    }
}

fn exp(rng: &mut SmallRng, rate: f64) -> f64 {
    let u: f64 = rng.random::<f64>();
    -(1.0 - u).ln() / rate
}

fn rate_at(p: &ArrivalProcess, duration: f64, t: f64) -> f64 {
    match p {
        ArrivalProcess::Poisson { rate } => *rate,
        ArrivalProcess::Bursty {
            base_rate,
            burst_rate,
            burst_s,
            period_s,
        } => {
            if t % period_s < *burst_s {
                *burst_rate
            } else {
                *base_rate
            }
        }
        ArrivalProcess::Ramp { from_rate, to_rate } => {
            from_rate + (to_rate - from_rate) * (t / duration).clamp(0.0, 1.0)
        }
    }
}

fn max_rate(p: &ArrivalProcess, _duration: f64) -> f64 {
    match p {
        ArrivalProcess::Poisson { rate } => *rate,
        ArrivalProcess::Bursty {
            base_rate,
            burst_rate,
            ..
        } => base_rate.max(*burst_rate),
        ArrivalProcess::Ramp { from_rate, to_rate } => from_rate.max(*to_rate),
    }
}

/// Draws a length from `d`.
pub fn sample(d: &LengthDist, rng: &mut SmallRng) -> u32 {
    match d {
        LengthDist::Fixed { value } => *value,
        LengthDist::Uniform { min, max } => rng.random_range(*min..=*max),
        LengthDist::Lognormal {
            median,
            sigma,
            min,
            max,
        } => {
            // Box–Muller.
            let u1: f64 = 1.0 - rng.random::<f64>();
            let u2: f64 = rng.random::<f64>();
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            let v = (median.ln() + sigma * z).exp().round();
            (v.clamp(f64::from(*min), f64::from(*max))) as u32
        }
    }
}

fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let weights: Vec<f64> = (1..=n).map(|k| 1.0 / (k as f64).powf(s)).collect();
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    weights
        .iter()
        .map(|w| {
            acc += w / total;
            acc
        })
        .collect()
}

fn pick(cdf: &[f64], rng: &mut SmallRng) -> usize {
    let u: f64 = rng.random::<f64>();
    cdf.partition_point(|c| *c <= u)
        .min(cdf.len().saturating_sub(1))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use crate::scenario::{PrefixSpec, PriorityMix};

    fn workload(arrival: ArrivalProcess) -> Workload {
        Workload {
            duration_s: 200.0,
            arrival,
            prompt_tokens: LengthDist::Lognormal {
                median: 500.0,
                sigma: 0.5,
                min: 10,
                max: 4000,
            },
            output_tokens: LengthDist::Uniform { min: 10, max: 20 },
            prefix: Some(PrefixSpec {
                groups: 4,
                tokens: 100,
                fraction: 0.5,
                zipf: 1.0,
            }),
            lora: None,
            priorities: Some(PriorityMix {
                critical: 0.1,
                sheddable: 0.2,
            }),
        }
    }

    #[test]
    fn same_seed_same_arrivals_other_seed_other_arrivals() {
        let w = workload(ArrivalProcess::Poisson { rate: 5.0 });
        assert_eq!(generate(&w, 7), generate(&w, 7));
        assert_ne!(generate(&w, 7), generate(&w, 8));
    }

    #[test]
    fn poisson_rate_and_lengths_are_as_configured() {
        let w = workload(ArrivalProcess::Poisson { rate: 5.0 });
        let a = generate(&w, 1);
        // 1000 expected; a Poisson count's sd is ~32.
        assert!((850..1150).contains(&a.len()), "{}", a.len());
        assert!(a.windows(2).all(|p| p[0].at <= p[1].at));
        assert!(a.iter().all(|r| (10..=20).contains(&r.output_tokens)));
        let grouped = a.iter().filter(|r| r.prefix_group.is_some()).count();
        assert!((350..650).contains(&grouped), "{grouped}");
        assert!(
            a.iter()
                .all(|r| r.prefix_group.is_none() || r.prompt_tokens >= 110)
        );
        let critical = a
            .iter()
            .filter(|r| r.priority == Priority::Critical)
            .count();
        assert!((50..150).contains(&critical), "{critical}");
    }

    #[test]
    fn bursts_concentrate_arrivals() {
        let w = workload(ArrivalProcess::Bursty {
            base_rate: 1.0,
            burst_rate: 20.0,
            burst_s: 5.0,
            period_s: 50.0,
        });
        let a = generate(&w, 3);
        let in_burst = a.iter().filter(|r| r.at % 50.0 < 5.0).count();
        // Expected 400 in bursts against 180 outside.
        assert!(
            in_burst > 300 && a.len() - in_burst < 260,
            "{in_burst} of {}",
            a.len()
        );
    }

    #[test]
    fn prompt_text_shares_exactly_the_prefix() {
        let mk = |id, group| Arrival {
            id,
            at: 0.0,
            prompt_tokens: 64,
            prefix_group: group,
            prefix_tokens: if group.is_some() { 32 } else { 0 },
            output_tokens: 1,
            lora: None,
            priority: Priority::Standard,
        };
        let (a, b, c) = (
            prompt_text(&mk(1, Some(2))),
            prompt_text(&mk(2, Some(2))),
            prompt_text(&mk(3, Some(3))),
        );
        assert_eq!(a.len(), 256);
        assert_eq!(a[..128], b[..128]);
        assert_ne!(a[128..], b[128..]);
        assert_ne!(a[..64], c[..64]);
        let lone = prompt_text(&mk(4, None));
        assert_eq!(lone.len(), 256);
        assert!(lone.starts_with("<request"));
    }
}
