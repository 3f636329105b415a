//! Model rewrites and canary splits: which served model (or LoRA adapter) a requested name goes
//! to.
//!
//! The semantics are the Gateway API Inference Extension's `InferenceModelRewrite`: a rule
//! matches a requested model name exactly (or, with no `matches`, every name no other rule
//! matches) and sends it to one of its targets, split by weight — `90/10` between two versions
//! is a canary, one target is an alias. infergate adds per-tenant rules: a rule naming
//! `tenants` applies only to those tenants and wins over the same model's rule without them.
//!
//! The split is deterministic, not random: each rule precomputes one cycle of a smooth weighted
//! round-robin (weights reduced by their greatest common divisor, so `90/10` is a cycle of ten)
//! and the n-th request to the rule takes entry `n mod cycle`. Over any stretch of requests each
//! target's share is off its weight by less than one request per target, and a choice is one
//! atomic increment and an index: no lock, no allocation, no random generator to seed. A
//! configuration reload builds a new [`Rewrites`] (its counters start at zero); requests in
//! flight keep the choice they were given.
//!
//! Precedence for a request for model `m` by tenant `t`: a rule matching `m` for `t`, then a rule
//! matching `m` without tenants, then a catch-all rule for `t`, then a catch-all rule without
//! tenants. Two rules at the same place are a configuration error (the reference takes the
//! oldest; a file has no age, so infergate refuses the ambiguity).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// The longest split cycle (sum of a rule's weights over their greatest common divisor).
pub const MAX_CYCLE: u32 = 10_000;

/// One rewrite rule, as written in the gateway file, the picker's rewrites file and (converted)
/// the CRD.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RewriteRule {
    /// A name for logs and errors (optional).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Requested names this rule applies to; empty: every name no other rule matches.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<ModelMatch>,
    /// Tenants this rule applies to; empty: every tenant.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
    /// Where matching requests go, split by weight.
    pub targets: Vec<RewriteTarget>,
}

/// What a rule matches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelMatch {
    /// The requested `model`.
    pub model: MatchValue,
}

/// A match on a name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MatchValue {
    /// How `value` is compared: `Exact` (the only kind, as in the reference).
    #[serde(rename = "type", default)]
    pub kind: MatchKind,
    /// The name.
    pub value: String,
}

/// How a name is compared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MatchKind {
    /// Byte for byte.
    #[default]
    Exact,
}

/// One target of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RewriteTarget {
    /// The model name (or LoRA adapter) the request is sent as.
    pub model_rewrite: String,
    /// Its share, relative to the rule's other targets (default 1). `0` sends it nothing.
    #[serde(default = "default_weight")]
    pub weight: u32,
}

fn default_weight() -> u32 {
    1
}

/// Why a set of rules was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    /// A rule has no target, or every weight is zero.
    #[error("rewrite rule {rule}: needs at least one target with a weight above zero")]
    NoTarget {
        /// The rule (its name, or its index).
        rule: String,
    },
    /// A target names no model.
    #[error("rewrite rule {rule}: a target's `modelRewrite` is empty")]
    EmptyTarget {
        /// The rule.
        rule: String,
    },
    /// The weights make a cycle longer than [`MAX_CYCLE`].
    #[error(
        "rewrite rule {rule}: weights reduce to a cycle of {cycle} requests (at most {MAX_CYCLE}: use smaller weights, e.g. percentages)"
    )]
    CycleTooLong {
        /// The rule.
        rule: String,
        /// The cycle its weights need.
        cycle: u64,
    },
    /// Two rules apply to the same model and tenant at the same precedence.
    #[error("rewrite rules {first} and {second} both apply to model {model} for {tenant}")]
    Ambiguous {
        /// The earlier rule.
        first: String,
        /// The later rule.
        second: String,
        /// The model (`*` for a catch-all).
        model: String,
        /// The tenant (`every tenant` when the rules name none).
        tenant: String,
    },
    /// A match or tenant is empty.
    #[error("rewrite rule {rule}: a match value or tenant is empty")]
    EmptyName {
        /// The rule.
        rule: String,
    },
}

/// A compiled rule: its targets and one cycle of the split.
#[derive(Debug)]
struct Compiled {
    targets: Vec<String>,
    /// Target indices, one cycle of the smooth weighted round-robin.
    cycle: Vec<u16>,
    next: AtomicU64,
}

impl Compiled {
    fn choose(&self) -> &str {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let i = self.cycle[(n % self.cycle.len() as u64) as usize];
        &self.targets[usize::from(i)]
    }
}

/// Where a model's requests go: its rule for every tenant and its per-tenant rules.
#[derive(Debug, Default)]
struct Entry {
    general: Option<usize>,
    by_tenant: HashMap<String, usize>,
}

/// A compiled set of rewrite rules. Shared by reference between requests (`Arc`); choosing is
/// lock-free.
#[derive(Debug, Default)]
pub struct Rewrites {
    rules: Vec<Compiled>,
    names: Vec<String>,
    exact: HashMap<String, Entry>,
    catch_all: Entry,
}

impl Rewrites {
    /// Compiles `rules`, refusing empty targets, impossible cycles and ambiguous rules.
    pub fn new(rules: &[RewriteRule]) -> Result<Self, RewriteError> {
        let mut out = Rewrites::default();
        for (i, r) in rules.iter().enumerate() {
            let label = r.name.clone().unwrap_or_else(|| format!("rewrites[{i}]"));
            let idx = out.rules.len();
            out.rules.push(compile(r, &label)?);
            out.names.push(label.clone());
            if r.tenants.iter().any(String::is_empty)
                || r.matches.iter().any(|m| m.model.value.is_empty())
            {
                return Err(RewriteError::EmptyName { rule: label });
            }
            let models: Vec<Option<&str>> = if r.matches.is_empty() {
                vec![None]
            } else {
                r.matches
                    .iter()
                    .map(|m| Some(m.model.value.as_str()))
                    .collect()
            };
            for model in models {
                let entry = match model {
                    Some(m) => out.exact.entry(m.to_owned()).or_default(),
                    None => &mut out.catch_all,
                };
                let clash = |prev: usize, tenant: &str| RewriteError::Ambiguous {
                    first: out.names[prev].clone(),
                    second: label.clone(),
                    model: model.unwrap_or("*").to_owned(),
                    tenant: tenant.to_owned(),
                };
                if r.tenants.is_empty() {
                    if let Some(prev) = entry.general {
                        return Err(clash(prev, "every tenant"));
                    }
                    entry.general = Some(idx);
                } else {
                    for t in &r.tenants {
                        if let Some(&prev) = entry.by_tenant.get(t) {
                            return Err(clash(prev, &format!("tenant {t}")));
                        }
                        entry.by_tenant.insert(t.clone(), idx);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Whether there are no rules (every request keeps its name).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The name to send a request for `model` by `tenant` as, or `None` to keep `model`. Each
    /// call advances the matched rule's split.
    pub fn choose(&self, model: &str, tenant: Option<&str>) -> Option<&str> {
        if self.rules.is_empty() {
            return None;
        }
        let rule = self
            .exact
            .get(model)
            .and_then(|e| lookup(e, tenant))
            .or_else(|| lookup(&self.catch_all, tenant))?;
        Some(self.rules[rule].choose())
    }
}

fn lookup(e: &Entry, tenant: Option<&str>) -> Option<usize> {
    tenant
        .and_then(|t| e.by_tenant.get(t).copied())
        .or(e.general)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn compile(r: &RewriteRule, label: &str) -> Result<Compiled, RewriteError> {
    if r.targets.iter().any(|t| t.model_rewrite.is_empty()) {
        return Err(RewriteError::EmptyTarget {
            rule: label.to_owned(),
        });
    }
    let g = r
        .targets
        .iter()
        .fold(0_u64, |g, t| gcd(g, u64::from(t.weight)));
    if g == 0 || r.targets.len() > usize::from(u16::MAX) {
        return Err(RewriteError::NoTarget {
            rule: label.to_owned(),
        });
    }
    let weights: Vec<u64> = r.targets.iter().map(|t| u64::from(t.weight) / g).collect();
    let total: u64 = weights.iter().sum();
    if total > u64::from(MAX_CYCLE) {
        return Err(RewriteError::CycleTooLong {
            rule: label.to_owned(),
            cycle: total,
        });
    }
    Ok(Compiled {
        targets: r.targets.iter().map(|t| t.model_rewrite.clone()).collect(),
        cycle: smooth_cycle(&weights),
        next: AtomicU64::new(0),
    })
}

/// One cycle of the smooth weighted round-robin over `weights` (each already reduced): every
/// step adds each weight to its current value, takes the largest (first on ties) and subtracts
/// the total from it. The cycle interleaves the targets as evenly as the weights allow.
fn smooth_cycle(weights: &[u64]) -> Vec<u16> {
    let total: i64 = weights.iter().map(|&w| w as i64).sum();
    let mut current = vec![0_i64; weights.len()];
    let mut cycle = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let mut best = 0;
        for (i, &w) in weights.iter().enumerate() {
            current[i] += w as i64;
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        cycle.push(best as u16);
    }
    cycle
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
