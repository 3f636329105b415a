//! The routing policies a scenario compares: a scheduler preset, and whether its picks are also
//! fed the pods' KV-cache events (precise prefix routing).
//!
//! `infergate-precise` is the `infergate` preset whose every pick also carries, per pod, the
//! prompt tokens that pod holds according to its KV-cache events
//! ([`infergate_scheduler::RequestContext::cached`]), as a gateway subscribed to each vLLM pod's
//! event stream would know them; the approximate prefix index keeps serving the rest. It is a
//! simulated-mode policy: the events come from the simulator's block pools.

use std::fmt;
use std::str::FromStr;

use infergate_scheduler::Preset;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One policy of a comparison.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RoutePolicy {
    /// The scheduler preset.
    pub preset: Preset,
    /// Whether picks get the exact cached prefix of every pod from its KV-cache events.
    pub precise: bool,
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
    };

    /// The preset alone (approximate prefix matching only).
    pub const fn preset(preset: Preset) -> Self {
        RoutePolicy {
            preset,
            precise: false,
        }
    }

    /// The name used in scenario files and reports.
    pub const fn as_str(self) -> &'static str {
        if self.precise {
            // Only the infergate preset has a precise variant (see `FromStr`).
            "infergate-precise"
        } else {
            self.preset.as_str()
        }
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
            .eq_ignore_ascii_case(RoutePolicy::INFERGATE_PRECISE.as_str())
        {
            return Ok(RoutePolicy::INFERGATE_PRECISE);
        }
        s.parse::<Preset>()
            .map(RoutePolicy::preset)
            .map_err(|_| UnknownPolicyError(s.to_owned()))
    }
}

impl Serialize for RoutePolicy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RoutePolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
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
