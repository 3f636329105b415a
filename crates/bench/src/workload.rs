//! Seeded workload generation: the same scenario and seed give the same arrivals, bit for bit,
//! and every policy in a run is fed exactly these.

use std::sync::Arc;

use infergate_scheduler::Priority;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::scenario::{ArrivalProcess, LengthDist, PriorityMix, Workload};

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
    /// Index of the tenant that sent it (into `workload.tenants`; 0 = `default` without tenants).
    pub tenant: u16,
}

/// Generates the arrivals of `workload` for `seed`.
///
/// Without tenants this is one stream (tenant 0, `default`). With tenants, each draws from a
/// stream of its own (seeded by the seed and the tenant's index), so removing a tenant leaves
/// the others' arrivals exactly as they were (the "alone" baselines rely on it); the streams are
/// merged in time order and numbered.
pub fn generate(workload: &Workload, seed: u64) -> Vec<Arrival> {
    let base = Stream {
        arrival: &workload.arrival,
        prompt_tokens: &workload.prompt_tokens,
        output_tokens: &workload.output_tokens,
        priority: None,
        priorities: workload.priorities.as_ref(),
        tenant: 0,
    };
    if workload.tenants.is_empty() {
        let mut rng = SmallRng::seed_from_u64(seed ^ SEED_SALT);
        return stream(workload, &base, &mut rng);
    }
    let mut out = Vec::new();
    for (k, t) in workload.tenants.iter().enumerate() {
        let scaled = t
            .arrival
            .is_none()
            .then(|| workload.arrival.scaled(t.share));
        let s = Stream {
            arrival: t
                .arrival
                .as_ref()
                .or(scaled.as_ref())
                .unwrap_or(&workload.arrival),
            prompt_tokens: t.prompt_tokens.as_ref().unwrap_or(&workload.prompt_tokens),
            output_tokens: t.output_tokens.as_ref().unwrap_or(&workload.output_tokens),
            priority: t.priority,
            priorities: t.priorities.as_ref().or(workload.priorities.as_ref()),
            tenant: u16::try_from(k).unwrap_or(u16::MAX),
        };
        let salt = (k as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut rng = SmallRng::seed_from_u64(seed ^ SEED_SALT ^ salt);
        out.extend(stream(workload, &s, &mut rng));
    }
    // Stable: equal times keep tenant order.
    out.sort_by(|a, b| a.at.total_cmp(&b.at));
    for (i, a) in out.iter_mut().enumerate() {
        a.id = i as u64;
    }
    out
}

/// The arrivals of the tenants in `keep` only, renumbered (ids stay in arrival order).
pub fn only_tenants(arrivals: &[Arrival], keep: &[u16]) -> Vec<Arrival> {
    let mut out: Vec<Arrival> = arrivals
        .iter()
        .filter(|a| keep.contains(&a.tenant))
        .cloned()
        .collect();
    for (i, a) in out.iter_mut().enumerate() {
        a.id = i as u64;
    }
    out
}

const SEED_SALT: u64 = 0x6265_6e63_685f_776c;

/// What one arrival stream draws from.
struct Stream<'a> {
    arrival: &'a ArrivalProcess,
    prompt_tokens: &'a LengthDist,
    output_tokens: &'a LengthDist,
    priority: Option<Priority>,
    priorities: Option<&'a PriorityMix>,
    tenant: u16,
}

fn stream(workload: &Workload, st: &Stream<'_>, rng: &mut SmallRng) -> Vec<Arrival> {
    let prefix_cdf = workload
        .prefix
        .as_ref()
        .map(|p| zipf_cdf(p.groups as usize, p.zipf));
    let lora_cdf = workload
        .lora
        .as_ref()
        .map(|l| zipf_cdf(l.adapters.len(), l.zipf));
    let mut out = Vec::new();
    let max_rate = max_rate(st.arrival, workload.duration_s);
    if max_rate <= 0.0 {
        return out;
    }
    let mut t = 0.0;
    loop {
        // Thinning: candidate events at the peak rate, kept with probability rate(t) / peak.
        t += exp(rng, max_rate);
        if t >= workload.duration_s {
            break;
        }
        let keep = rate_at(st.arrival, workload.duration_s, t) / max_rate;
        if rng.random::<f64>() >= keep {
            continue;
        }
        let mut prompt = sample(st.prompt_tokens, rng);
        let (mut group, mut prefix_tokens) = (None, 0);
        if let (Some(p), Some(cdf)) = (&workload.prefix, &prefix_cdf)
            && rng.random::<f64>() < p.fraction
        {
            group = Some(pick(cdf, rng) as u32);
            prefix_tokens = p.tokens;
            prompt = prompt.saturating_add(p.tokens);
        }
        let output = sample(st.output_tokens, rng);
        let mut lora = None;
        if let (Some(l), Some(cdf)) = (&workload.lora, &lora_cdf)
            && rng.random::<f64>() < l.fraction
        {
            lora = u16::try_from(pick(cdf, rng)).ok();
        }
        let mut priority = st.priority.unwrap_or(Priority::Standard);
        if st.priority.is_none()
            && let Some(p) = st.priorities
        {
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
            tenant: st.tenant,
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
    use crate::scenario::{PrefixSpec, TenantSpec};

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
            tenants: Vec::new(),
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

    fn tenant(name: &str) -> TenantSpec {
        TenantSpec {
            name: name.into(),
            share: 1.0,
            arrival: None,
            priority: None,
            priorities: None,
            prompt_tokens: None,
            output_tokens: None,
        }
    }

    #[test]
    fn tenants_draw_their_own_streams_and_shares() {
        let mut w = workload(ArrivalProcess::Poisson { rate: 10.0 });
        let mut noisy = tenant("noisy");
        noisy.arrival = Some(ArrivalProcess::Bursty {
            base_rate: 1.0,
            burst_rate: 20.0,
            burst_s: 5.0,
            period_s: 50.0,
        });
        noisy.priority = Some(Priority::Sheddable);
        noisy.output_tokens = Some(LengthDist::Fixed { value: 7 });
        w.tenants = vec![
            TenantSpec {
                share: 0.2,
                ..tenant("quiet")
            },
            noisy,
        ];
        let a = generate(&w, 5);
        assert_eq!(a, generate(&w, 5));
        assert!(a.windows(2).all(|p| p[0].at <= p[1].at));
        assert!(a.iter().enumerate().all(|(i, r)| r.id == i as u64));
        let quiet: Vec<&Arrival> = a.iter().filter(|r| r.tenant == 0).collect();
        let noisy: Vec<&Arrival> = a.iter().filter(|r| r.tenant == 1).collect();
        // 0.2 × 10 req/s × 200 s = 400 expected (sd 20).
        assert!((330..470).contains(&quiet.len()), "{}", quiet.len());
        assert!(quiet.iter().all(|r| (10..=20).contains(&r.output_tokens)));
        // The quiet tenant inherits the workload's 10% / 20% mix.
        assert!(quiet.iter().any(|r| r.priority == Priority::Critical));
        assert!(
            noisy
                .iter()
                .all(|r| r.output_tokens == 7 && r.priority == Priority::Sheddable)
        );
        let in_burst = noisy.iter().filter(|r| r.at % 50.0 < 5.0).count();
        assert!(in_burst > 300, "{in_burst} of {}", noisy.len());
        // Removing a tenant leaves the other's arrivals exactly as they were.
        let mut alone = w.clone();
        alone.tenants.truncate(1);
        let solo = generate(&alone, 5);
        let kept = only_tenants(&a, &[0]);
        assert_eq!(solo, kept);
    }

    #[test]
    fn no_tenants_is_the_single_default_stream() {
        let w = workload(ArrivalProcess::Poisson { rate: 5.0 });
        let a = generate(&w, 1);
        assert!(a.iter().all(|r| r.tenant == 0));
        assert_eq!(w.tenant_names(), vec!["default".to_owned()]);
        // The first arrival of seed 1 as generated before tenants existed (a changed stream
        // would change every existing scenario's figures).
        assert_eq!(a.len(), 1027);
        assert_eq!(
            (a[0].prompt_tokens, a[0].prefix_group, a[0].output_tokens),
            (621, Some(1), 11)
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
            tenant: 0,
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
