//! The routing policies a scenario compares: a scheduler preset, whether its picks are also
//! fed the pods' KV-cache events (precise prefix routing), and whether it ejects pods whose
//! answers keep failing (outlier detection).
//!
//! `infergate-precise` is the `infergate` preset whose every pick also carries, per pod, the
//! prompt tokens that pod holds according to its KV-cache events
//! ([`infergate_scheduler::RequestContext::cached`]), as a gateway subscribed to each vLLM pod's
//! event stream would know them; the approximate prefix index keeps serving the rest. It is a
//! simulated-mode policy: the events come from the simulator's block pools.
//!
//! A policy is named by its preset (`infergate`), or given as an entry with a name of its own,
//! a preset (or `infergate-precise`) and the gateway's `outlierDetection:` settings, which the
//! scheduler then runs with ([`infergate_scheduler::outlier`]): left out, the preset's (on in
//! `infergate`, off in the baselines); `null`, off:
//!
//! ```yaml
//! policies:
//!   - round-robin
//!   - infergate
//!   - { name: infergate-no-od, preset: infergate, outlierDetection: null }
//!   - { name: round-robin-od, preset: round-robin, outlierDetection: { consecutive5xx: 5 } }
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use infergate_scheduler::outlier::OutlierDetection;
use infergate_scheduler::{Preset, SchedulerConfig};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One policy of a comparison.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RoutePolicy {
    /// The scheduler preset.
    pub preset: Preset,
    /// Whether picks get the exact cached prefix of every pod from its KV-cache events.
    pub precise: bool,
    /// The scheduler's `outlierDetection:`: `None` keeps the preset's, `Some(None)` is off.
    pub outlier_detection: Option<Option<OutlierDetection>>,
    /// The policy's own name, when the scenario gave it as an entry (else the preset's).
    pub name: Option<Arc<str>>,
}

/// A policy name that is neither a preset nor `infergate-precise`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown policy `{0}` (expected one of infergate, infergate-precise, gie-default, round-robin, random, least-request)"
)]
pub struct UnknownPolicyError(pub String);

impl RoutePolicy {
    /// `infergate` fed the pods' KV-cache events.
    pub const INFERGATE_PRECISE: RoutePolicy = RoutePolicy {
        preset: Preset::Infergate,
        precise: true,
        outlier_detection: None,
        name: None,
    };

    /// The preset alone (approximate prefix matching only).
    pub const fn preset(preset: Preset) -> Self {
        RoutePolicy {
            preset,
            precise: false,
            outlier_detection: None,
            name: None,
        }
    }

    /// The name of the preset, or of its precise variant, without the policy's own name.
    pub const fn base_name(&self) -> &'static str {
        if self.precise {
            // Only the infergate preset has a precise variant (see `FromStr`).
            "infergate-precise"
        } else {
            self.preset.as_str()
        }
    }

    /// The name used in scenario files and reports: the policy's own, else its preset's.
    pub fn as_str(&self) -> &str {
        self.name.as_deref().unwrap_or(self.base_name())
    }

    /// The scheduler configuration the policy routes with: its preset's, with its outlier
    /// detection when the entry sets it.
    pub fn scheduler_config(&self) -> SchedulerConfig {
        let mut cfg = SchedulerConfig::preset(self.preset);
        if let Some(o) = self.outlier_detection {
            cfg.outlier_detection = o;
        }
        cfg
    }

    /// Whether the scenario gave the policy as an entry (its own name or settings), which the
    /// plain simulated runner and live mode honour (the flow and replica runners refuse it).
    pub fn is_entry(&self) -> bool {
        self.name.is_some() || self.outlier_detection.is_some()
    }
}

impl From<Preset> for RoutePolicy {
    fn from(p: Preset) -> Self {
        RoutePolicy::preset(p)
    }
}

impl fmt::Display for RoutePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RoutePolicy {
    type Err = UnknownPolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim()
            .eq_ignore_ascii_case(RoutePolicy::INFERGATE_PRECISE.base_name())
        {
            return Ok(RoutePolicy::INFERGATE_PRECISE);
        }
        s.parse::<Preset>()
            .map(RoutePolicy::preset)
            .map_err(|_| UnknownPolicyError(s.to_owned()))
    }
}

/// A policy given as an entry, as written in a scenario file.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Entry {
    name: String,
    preset: String,
    /// `Some(None)`: an explicit `null` (off), apart from its absence (the preset's).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "infergate_scheduler::config::double_option"
    )]
    outlier_detection: Option<Option<OutlierDetection>>,
}

impl Serialize for RoutePolicy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if !self.is_entry() {
            return s.serialize_str(self.as_str());
        }
        Entry {
            name: self.as_str().to_owned(),
            preset: self.base_name().to_owned(),
            outlier_detection: self.outlier_detection,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for RoutePolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PolicyVisitor)
    }
}

/// A preset's name, or an entry (`{ name, preset, outlierDetection }`).
struct PolicyVisitor;

impl<'de> Visitor<'de> for PolicyVisitor {
    type Value = RoutePolicy;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a policy name, or a map with name, preset and outlierDetection")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<RoutePolicy, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RoutePolicy, A::Error> {
        let e = Entry::deserialize(de::value::MapAccessDeserializer::new(map))?;
        let base: RoutePolicy = e.preset.parse().map_err(de::Error::custom)?;
        Ok(RoutePolicy {
            outlier_detection: e.outlier_detection,
            name: Some(e.name.into()),
            ..base
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for p in Preset::ALL {
            let rp = RoutePolicy::preset(p);
            assert_eq!(rp.as_str().parse::<RoutePolicy>().unwrap(), rp);
        }
        let precise: RoutePolicy = " Infergate-Precise ".parse().unwrap();
        assert_eq!(precise, RoutePolicy::INFERGATE_PRECISE);
        assert_eq!(precise.to_string(), "infergate-precise");
        assert!("gie-default-precise".parse::<RoutePolicy>().is_err());
        let e = "smart".parse::<RoutePolicy>().unwrap_err();
        assert!(e.to_string().contains("`smart`"), "{e}");
    }
}
