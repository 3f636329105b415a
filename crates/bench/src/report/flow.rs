//! Flow-control figures: per run (per tenant, per priority, rejections by reason, queue bounds,
//! stale windows), their summary over seeds, the verdicts against a scenario's flow targets, and
//! the markdown tables.

use std::fmt::Write as _;

use infergate_scheduler::Priority;
use serde::{Deserialize, Serialize};

use super::{RunResult, secs};
use crate::scenario::{FlowPolicy, Scenario};
use crate::stats::{Percentiles, Spread};

/// One tenant's or one priority's requests in a run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GroupStats {
    /// Tenant or priority name.
    pub name: String,
    /// Requests offered.
    pub offered: u64,
    /// Requests served (completed).
    pub completed: u64,
    /// Requests answered with a rejection or an error.
    pub rejected: u64,
    /// Tokens served: prompt plus output of the completed requests.
    pub served_tokens: u64,
    /// TTFT of the completed requests, from arrival (queueing included).
    pub ttft: Percentiles,
    /// Of the completed requests, the time between arrival and being sent to a pod (waiting in
    /// the gateway's queues).
    #[serde(default)]
    pub queued: Percentiles,
    /// Of the completed requests, the time from being sent to a pod to the first token (the
    /// engine's own queue and the prefill).
    #[serde(default)]
    pub at_pod: Percentiles,
    /// Time of the group's first rejection (s).
    pub first_rejected_s: Option<f64>,
}

/// Rejections of one reason in a run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RejectStats {
    /// Reason, as the response's reason header or metric label says it.
    pub reason: String,
    /// HTTP status.
    pub status: u16,
    /// Requests.
    pub count: u64,
    /// Of those, the ones told when to retry (`Retry-After`).
    pub with_retry_after: u64,
    /// Mean `Retry-After` of those (s).
    pub retry_after_mean_s: f64,
    /// Largest `Retry-After` (s).
    pub retry_after_max_s: f64,
}

/// Requests that arrived while the pool's metrics were stale.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StaleStats {
    /// Requests arriving in a stale window.
    pub arrived: u64,
    /// Requests sent to a pod during a stale window (whenever they arrived).
    pub dispatched: u64,
    /// Of the requests arriving in a window, those served.
    pub completed: u64,
    /// Their TTFT, from arrival.
    pub ttft: Percentiles,
}

/// Flow-control figures of one run.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct FlowRun {
    /// Per tenant, in the workload's order.
    pub tenants: Vec<GroupStats>,
    /// Per priority: critical, standard, sheddable.
    pub priorities: Vec<GroupStats>,
    /// Jain's fairness index of served tokens per tenant: (Σx)² / (n·Σx²), 1 = equal.
    pub jain: f64,
    /// Rejections by reason.
    pub rejects: Vec<RejectStats>,
    /// Most requests queued at once.
    pub max_queue: u64,
    /// Most requests queued at once per band (critical, standard, sheddable).
    pub max_band: [u64; 3],
    /// Longest time a request spent queued (dispatched or removed), s.
    pub max_wait_s: f64,
    /// Requests with no answer at the end of the run (must be 0).
    pub unanswered: u64,
    /// Requests arriving in stale windows (scenarios with stale windows).
    pub stale: Option<StaleStats>,
}

/// Jain's fairness index of `xs`; 1 for an empty or all-zero list (nothing to be unfair about).
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sq <= 0.0 {
        1.0
    } else {
        sum * sum / (xs.len() as f64 * sq)
    }
}

/// A run that only serves as a reference point for a target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineRun {
    /// What it is: `alone:TENANT`, `critical-only` or `direct`.
    pub kind: String,
    /// The run (its `policy` is the flow policy it ran with).
    pub run: RunResult,
}

/// One flow policy over all seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowPolicySummary {
    /// Row label (the flow policy, with the router preset when several are compared).
    pub policy: String,
    /// The flow policy.
    pub flow: FlowPolicy,
    /// Jain's index of served tokens per tenant.
    pub jain: Spread,
    /// Per tenant: TTFT P50, P99, served tokens, completed, offered, rejected.
    pub tenants: Vec<GroupSummary>,
    /// Per priority, the same.
    pub priorities: Vec<GroupSummary>,
    /// Rejections by reason: mean count per run, with the mean and largest `Retry-After`.
    pub rejects: Vec<RejectSummary>,
    /// Largest queue over seeds.
    pub max_queue: u64,
    /// Largest band lengths over seeds.
    pub max_band: [u64; 3],
    /// Longest wait over seeds (s).
    pub max_wait_s: f64,
    /// Unanswered requests over all seeds.
    pub unanswered: u64,
    /// The isolation tenant's TTFT P99 over its P99 alone, per seed.
    pub isolation_ratio: Option<Spread>,
    /// Critical TTFT P99 over its P99 with only Critical traffic, per seed.
    pub critical_ratio: Option<Spread>,
    /// TTFT P99 of requests arriving in stale windows over the direct path's, per seed.
    pub stale_ratio: Option<Spread>,
    /// Requests dispatched during stale windows (mean per run).
    pub stale_dispatched: Option<Spread>,
    /// TTFT P99 of the requests arriving in stale windows.
    pub stale_ttft_p99: Option<Spread>,
}

/// A tenant or priority over seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupSummary {
    /// Name.
    pub name: String,
    /// Requests offered per run.
    pub offered: Spread,
    /// Served per run.
    pub completed: Spread,
    /// Rejected per run.
    pub rejected: Spread,
    /// Served tokens per run.
    pub served_tokens: Spread,
    /// TTFT P50.
    pub ttft_p50: Spread,
    /// TTFT P99.
    pub ttft_p99: Spread,
    /// P99 of the time queued in the gateway.
    #[serde(default)]
    pub queued_p99: Spread,
    /// P99 of the time from dispatch to the first token.
    #[serde(default)]
    pub at_pod_p99: Spread,
}

/// A rejection reason over seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RejectSummary {
    /// Reason.
    pub reason: String,
    /// HTTP status.
    pub status: u16,
    /// Count per run.
    pub count: Spread,
    /// Share of them told when to retry.
    pub with_retry_after: f64,
    /// Mean `Retry-After` over those (s).
    pub retry_after_mean_s: f64,
    /// Largest `Retry-After` (s).
    pub retry_after_max_s: f64,
}

/// Flow-control part of a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowReport {
    /// Per row, in table order.
    pub summary: Vec<FlowPolicySummary>,
    /// Reference runs behind the targets' ratios.
    pub baselines: Vec<BaselineRun>,
    /// The `infergate` flow policy against the scenario's flow targets.
    pub verdicts: Vec<super::Verdict>,
}

fn group_summary(runs: &[&FlowRun], pick: fn(&FlowRun) -> &[GroupStats]) -> Vec<GroupSummary> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    (0..pick(first).len())
        .map(|i| {
            let g = |f: &dyn Fn(&GroupStats) -> f64| {
                Spread::of(runs.iter().filter_map(|r| pick(r).get(i)).map(f))
            };
            GroupSummary {
                name: pick(first)[i].name.clone(),
                offered: g(&|s| s.offered as f64),
                completed: g(&|s| s.completed as f64),
                rejected: g(&|s| s.rejected as f64),
                served_tokens: g(&|s| s.served_tokens as f64),
                ttft_p50: g(&|s| s.ttft.p50),
                ttft_p99: g(&|s| s.ttft.p99),
                queued_p99: g(&|s| s.queued.p99),
                at_pod_p99: g(&|s| s.at_pod.p99),
            }
        })
        .collect()
}

fn reject_summary(runs: &[&FlowRun]) -> Vec<RejectSummary> {
    let mut reasons: Vec<(String, u16)> = Vec::new();
    for r in runs {
        for x in &r.rejects {
            if !reasons.iter().any(|(n, _)| *n == x.reason) {
                reasons.push((x.reason.clone(), x.status));
            }
        }
    }
    reasons
        .into_iter()
        .map(|(reason, status)| {
            let of = |r: &FlowRun| r.rejects.iter().find(|x| x.reason == reason).cloned();
            let all: Vec<RejectStats> = runs.iter().filter_map(|r| of(r)).collect();
            let total: u64 = all.iter().map(|x| x.count).sum();
            let with: u64 = all.iter().map(|x| x.with_retry_after).sum();
            let ra_sum: f64 = all
                .iter()
                .map(|x| x.retry_after_mean_s * x.with_retry_after as f64)
                .sum();
            RejectSummary {
                count: Spread::of(runs.iter().map(|r| of(r).map_or(0.0, |x| x.count as f64))),
                status,
                with_retry_after: if total > 0 {
                    with as f64 / total as f64
                } else {
                    0.0
                },
                retry_after_mean_s: if with > 0 { ra_sum / with as f64 } else { 0.0 },
                retry_after_max_s: all.iter().map(|x| x.retry_after_max_s).fold(0.0, f64::max),
                reason,
            }
        })
        .collect()
}

fn priority_p99(r: &RunResult, p: Priority) -> Option<f64> {
    let f = r.flow.as_ref()?;
    f.priorities
        .iter()
        .find(|g| g.name == p.as_str())
        .map(|g| g.ttft.p99)
}

fn tenant_p99(r: &RunResult, tenant: &str) -> Option<f64> {
    let f = r.flow.as_ref()?;
    f.tenants
        .iter()
        .find(|g| g.name == tenant)
        .map(|g| g.ttft.p99)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::INFINITY }
}

impl FlowReport {
    /// Summarises `runs` (labelled per row; `flows[i]` is row i's flow policy) and checks the
    /// scenario's flow targets for the `infergate` flow policy.
    pub fn new(
        scenario: &Scenario,
        rows: &[(String, FlowPolicy)],
        runs: &[RunResult],
        baselines: Vec<BaselineRun>,
    ) -> FlowReport {
        let targets = scenario
            .flow
            .as_ref()
            .map(|f| f.targets.clone())
            .unwrap_or_default();
        let base = |kind: &str, policy: &str, seed: u64| {
            baselines
                .iter()
                .find(|b| b.kind == kind && b.run.policy == policy && b.run.seed == seed)
                .map(|b| &b.run)
        };
        let summary: Vec<FlowPolicySummary> = rows
            .iter()
            .map(|(label, fp)| {
                let mine: Vec<&RunResult> = runs.iter().filter(|r| r.policy == *label).collect();
                let flows: Vec<&FlowRun> = mine.iter().filter_map(|r| r.flow.as_ref()).collect();
                let per_seed = |f: &dyn Fn(&RunResult) -> Option<f64>| {
                    let v: Vec<f64> = mine.iter().filter_map(|r| f(r)).collect();
                    (!v.is_empty()).then(|| Spread::of(v))
                };
                let isolation_ratio = targets.isolation.as_ref().and_then(|iso| {
                    per_seed(&|r| {
                        let alone = base(&format!("alone:{}", iso.tenant), fp.as_str(), r.seed)?;
                        Some(ratio(
                            tenant_p99(r, &iso.tenant)?,
                            tenant_p99(alone, &iso.tenant)?,
                        ))
                    })
                });
                let critical_ratio = targets.critical_vs_unloaded.and_then(|_| {
                    per_seed(&|r| {
                        let only = base("critical-only", fp.as_str(), r.seed)?;
                        Some(ratio(
                            priority_p99(r, Priority::Critical)?,
                            priority_p99(only, Priority::Critical)?,
                        ))
                    })
                });
                let stale_of = |r: &RunResult| r.flow.as_ref().and_then(|f| f.stale.clone());
                let stale_ratio = targets.stale_vs_direct.and_then(|_| {
                    per_seed(&|r| {
                        let direct = base("direct", FlowPolicy::None.as_str(), r.seed)?;
                        Some(ratio(stale_of(r)?.ttft.p99, stale_of(direct)?.ttft.p99))
                    })
                });
                FlowPolicySummary {
                    policy: label.clone(),
                    flow: *fp,
                    jain: Spread::of(flows.iter().map(|f| f.jain)),
                    tenants: group_summary(&flows, |f| &f.tenants),
                    priorities: group_summary(&flows, |f| &f.priorities),
                    rejects: reject_summary(&flows),
                    max_queue: flows.iter().map(|f| f.max_queue).max().unwrap_or(0),
                    max_band: [0, 1, 2]
                        .map(|b| flows.iter().map(|f| f.max_band[b]).max().unwrap_or(0)),
                    max_wait_s: flows.iter().map(|f| f.max_wait_s).fold(0.0, f64::max),
                    unanswered: flows.iter().map(|f| f.unanswered).sum(),
                    isolation_ratio,
                    critical_ratio,
                    stale_ratio,
                    stale_dispatched: per_seed(&|r| stale_of(r).map(|s| s.dispatched as f64)),
                    stale_ttft_p99: per_seed(&|r| stale_of(r).map(|s| s.ttft.p99)),
                }
            })
            .collect();
        let verdicts = verdicts(scenario, &summary, runs);
        FlowReport {
            summary,
            baselines,
            verdicts,
        }
    }
}

fn x(s: &Spread) -> String {
    format!("{:.2}× (worst seed {:.2}×)", s.mean, s.max)
}

fn verdicts(
    scenario: &Scenario,
    summary: &[FlowPolicySummary],
    runs: &[RunResult],
) -> Vec<super::Verdict> {
    use super::Verdict;
    let mut out = Vec::new();
    let Some(flow) = &scenario.flow else {
        return out;
    };
    let t = &flow.targets;
    let Some(ig) = summary.iter().find(|s| s.flow == FlowPolicy::Infergate) else {
        return out;
    };
    if let (Some(iso), Some(r)) = (&t.isolation, &ig.isolation_ratio) {
        out.push(Verdict {
            target: format!(
                "{}'s TTFT P99 within {}× of its P99 with no neighbour, every seed",
                iso.tenant, iso.max_ratio
            ),
            measured: x(r),
            met: r.max <= iso.max_ratio,
        });
    }
    if let (Some(m), Some(r)) = (t.critical_vs_unloaded, &ig.critical_ratio) {
        out.push(Verdict {
            target: format!("Critical TTFT P99 within {m}× of its unloaded value, every seed"),
            measured: x(r),
            met: r.max <= m,
        });
    }
    let mine: Vec<&FlowRun> = runs
        .iter()
        .filter(|r| r.policy == ig.policy)
        .filter_map(|r| r.flow.as_ref())
        .collect();
    if t.shed_order {
        let mut met = !mine.is_empty();
        let mut worst = String::new();
        for f in &mine {
            let g = |p: Priority| f.priorities.iter().find(|g| g.name == p.as_str());
            let (Some(c), Some(s), Some(h)) = (
                g(Priority::Critical),
                g(Priority::Standard),
                g(Priority::Sheddable),
            ) else {
                met = false;
                continue;
            };
            let frac = |g: &GroupStats| g.rejected as f64 / g.offered.max(1) as f64;
            let first = |g: &GroupStats| g.first_rejected_s.unwrap_or(f64::INFINITY);
            let ok = frac(h) >= frac(s)
                && frac(s) >= frac(c)
                && first(h) <= first(s)
                && first(s) <= first(c)
                && h.rejected > 0;
            met &= ok;
            let _ = write!(
                worst,
                "{}rejected sheddable {:.1}% / standard {:.1}% / critical {:.1}%",
                if worst.is_empty() { "" } else { "; " },
                frac(h) * 100.0,
                frac(s) * 100.0,
                frac(c) * 100.0
            );
        }
        out.push(Verdict {
            target:
                "Sheddable shed first (earlier and a larger share), then Standard, then Critical"
                    .into(),
            measured: worst,
            met,
        });
    }
    if t.bounded {
        let c = &flow.config;
        let ttl = c.request_ttl.as_secs_f64();
        let limits = [c.bands.critical, c.bands.standard, c.bands.sheddable];
        let bands_ok = (0..3).all(|b| ig.max_band[b] <= u64::from(limits[b].max_requests));
        let wait_ok = ttl == 0.0 || ig.max_wait_s <= ttl + 1e-6;
        out.push(Verdict {
            target: format!(
                "queue at most {} requests (bands {}/{}/{}), waits at most the TTL ({}), every request answered",
                c.max_requests,
                limits[0].max_requests,
                limits[1].max_requests,
                limits[2].max_requests,
                secs(ttl)
            ),
            measured: format!(
                "max queue {} (bands {}/{}/{}), max wait {}, unanswered {}",
                ig.max_queue,
                ig.max_band[0],
                ig.max_band[1],
                ig.max_band[2],
                secs(ig.max_wait_s),
                ig.unanswered
            ),
            met: ig.max_queue <= u64::from(c.max_requests) && bands_ok && wait_ok && ig.unanswered == 0,
        });
    }
    if let (Some(m), Some(r), Some(d)) = (t.stale_vs_direct, &ig.stale_ratio, &ig.stale_dispatched)
    {
        out.push(Verdict {
            target: format!(
                "dispatch continues on stale metrics, TTFT P99 of requests arriving then within {m}× of the direct path's"
            ),
            measured: format!("{:.0} dispatched per run while stale; {}", d.mean, x(r)),
            met: d.min > 0.0 && r.max <= m,
        });
    }
    out
}

fn range(s: &Spread) -> String {
    if (s.max - s.min).abs() < 1e-12 {
        secs(s.mean)
    } else {
        format!("{} ({}–{})", secs(s.mean), secs(s.min), secs(s.max))
    }
}

fn ratio_cell(s: &Option<Spread>) -> String {
    s.as_ref().map_or("—".to_owned(), |s| {
        format!("{:.2}× ({:.2}–{:.2})", s.mean, s.min, s.max)
    })
}

fn tokens(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// The comparison table of the flow policies, then per-tenant and per-priority tables.
pub(super) fn markdown(scenario: &Scenario, f: &FlowReport) -> String {
    let mut s = String::new();
    let t = scenario
        .flow
        .as_ref()
        .map(|f| f.targets.clone())
        .unwrap_or_default();
    let cfg = scenario.flow.as_ref().map(|f| f.config).unwrap_or_default();
    let _ = write!(s, "| flow policy | Jain (served tokens per tenant) |");
    let mut sep = String::from("|---|---:|");
    if let Some(iso) = &t.isolation {
        let _ = write!(s, " {} TTFT P99 | × alone |", iso.tenant);
        sep.push_str("---:|---:|");
    }
    if t.critical_vs_unloaded.is_some() {
        let _ = write!(s, " Critical TTFT P99 | × unloaded |");
        sep.push_str("---:|---:|");
    }
    if t.stale_vs_direct.is_some() {
        let _ = write!(
            s,
            " dispatched while stale | TTFT P99 arriving stale | × direct |"
        );
        sep.push_str("---:|---:|---:|");
    }
    let _ = writeln!(
        s,
        " rejected by reason (status, share with Retry-After, mean Retry-After) | max queue (limit {}) | max wait (TTL {}) | unanswered |",
        cfg.max_requests,
        secs(cfg.request_ttl.as_secs_f64())
    );
    let _ = writeln!(s, "{sep}---|---:|---:|---:|");
    for p in &f.summary {
        let _ = write!(
            s,
            "| {} | {:.3} ({:.3}–{:.3}) |",
            p.policy, p.jain.mean, p.jain.min, p.jain.max
        );
        if let Some(iso) = &t.isolation {
            let g = p.tenants.iter().find(|g| g.name == iso.tenant);
            let _ = write!(
                s,
                " {} | {} |",
                g.map_or("—".into(), |g| range(&g.ttft_p99)),
                ratio_cell(&p.isolation_ratio)
            );
        }
        if t.critical_vs_unloaded.is_some() {
            let g = p.priorities.iter().find(|g| g.name == "critical");
            let _ = write!(
                s,
                " {} | {} |",
                g.map_or("—".into(), |g| range(&g.ttft_p99)),
                ratio_cell(&p.critical_ratio)
            );
        }
        if t.stale_vs_direct.is_some() {
            let _ = write!(
                s,
                " {} | {} | {} |",
                p.stale_dispatched
                    .as_ref()
                    .map_or("—".into(), |d| format!("{:.0}", d.mean)),
                p.stale_ttft_p99.as_ref().map_or("—".into(), range),
                ratio_cell(&p.stale_ratio)
            );
        }
        let rejects: Vec<String> = p
            .rejects
            .iter()
            .map(|r| {
                let ra = if r.with_retry_after > 0.0 {
                    format!(
                        "{:.0}%, {:.1} s",
                        r.with_retry_after * 100.0,
                        r.retry_after_mean_s
                    )
                } else {
                    "no Retry-After".to_owned()
                };
                format!("{} {:.0} ({}, {ra})", r.reason, r.count.mean, r.status)
            })
            .collect();
        let _ = writeln!(
            s,
            " {} | {} ({}/{}/{}) | {} | {} |",
            if rejects.is_empty() {
                "none".to_owned()
            } else {
                rejects.join("; ")
            },
            p.max_queue,
            p.max_band[0],
            p.max_band[1],
            p.max_band[2],
            secs(p.max_wait_s),
            p.unanswered
        );
    }
    for (title, pick) in [
        (
            "tenant",
            (|p: &FlowPolicySummary| &p.tenants) as fn(&FlowPolicySummary) -> &Vec<GroupSummary>,
        ),
        ("priority", |p: &FlowPolicySummary| &p.priorities),
    ] {
        let _ = writeln!(
            s,
            "\n| flow policy | {title} | offered | served | rejected | served tokens | TTFT P50 | TTFT P99 | queued P99 | sent → first token P99 |"
        );
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for p in &f.summary {
            for g in pick(p) {
                if g.offered.mean == 0.0 {
                    continue;
                }
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} | {} |",
                    p.policy,
                    g.name,
                    g.offered.mean,
                    g.completed.mean,
                    g.rejected.mean,
                    tokens(g.served_tokens.mean),
                    range(&g.ttft_p50),
                    range(&g.ttft_p99),
                    range(&g.queued_p99),
                    range(&g.at_pod_p99)
                );
            }
        }
    }
    if !f.verdicts.is_empty() {
        let _ = writeln!(s, "\nTargets for the `infergate` flow policy:\n");
        for v in &f.verdicts {
            let _ = writeln!(
                s,
                "- **{}** — {}: {}",
                if v.met { "met" } else { "missed" },
                v.target,
                v.measured
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::jain;

    #[test]
    fn jain_index_is_one_when_equal_and_one_over_n_when_one_takes_all() {
        assert!((jain(&[5.0, 5.0, 5.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[9.0, 0.0, 0.0]) - 1.0 / 3.0).abs() < 1e-12);
        assert!((jain(&[3.0, 1.0]) - 0.8).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
    }
}
