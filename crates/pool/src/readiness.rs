//! What `/readyz` says when a process is not ready: which models (pools) cannot route and why,
//! and whether requests can be authenticated.
//!
//! Probes read only the status (200 or 503); the body is for the operator who runs `curl` on the
//! admin port. Its format is stable: a first line `ready` or `not ready`, then, when not ready,
//! one line per reason,
//!
//! ```text
//! not ready
//! model "llama": not-scraped: none of its 2 endpoints has had a metrics page read yet
//! model "qwen": stale: none of its 3 endpoints has fresh metrics (2 failing scrapes, 1 last page older than 2000 ms, 0 not scraped yet)
//! model "mistral": no-endpoints: no endpoint is configured or discovered
//! auth: jwks-not-fetched: JWTs are the only credential accepted and no signing key set has been fetched yet
//! ```
//!
//! that is `SUBJECT: CODE: DETAIL`, where `SUBJECT` is `model` and the model's name as a JSON
//! string (so a name holding `": "` cannot be mistaken for the separator) or `auth`, `CODE` is
//! one of [`Reason::code`]'s values, and `DETAIL` is prose that may change between releases.
//! A process that gives no reasons (the picker, the BBR, the operator: they answer a `bool`)
//! answers `not ready` alone.

use std::fmt;
use std::time::Duration;

/// A process's readiness: ready, or the reasons it is not (possibly none known).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    /// `true` when not ready.
    not_ready: bool,
    reasons: Vec<NotReady>,
}

impl Readiness {
    /// Ready.
    pub fn ready() -> Self {
        Readiness::default()
    }

    /// Not ready, for no reason given yet ([`Readiness::push`] adds them).
    pub fn not_ready() -> Self {
        Readiness {
            not_ready: true,
            reasons: Vec::new(),
        }
    }

    /// Adds a reason: the process is not ready from now on.
    pub fn push(&mut self, reason: NotReady) {
        self.not_ready = true;
        self.reasons.push(reason);
    }

    /// Whether the process is ready.
    pub fn is_ready(&self) -> bool {
        !self.not_ready
    }

    /// The reasons it is not, in the order they were added.
    pub fn reasons(&self) -> &[NotReady] {
        &self.reasons
    }
}

impl From<bool> for Readiness {
    fn from(ready: bool) -> Self {
        if ready {
            Readiness::ready()
        } else {
            Readiness::not_ready()
        }
    }
}

/// The `/readyz` body: `ready` or `not ready`, then a line per reason, each line ended by `\n`.
impl fmt::Display for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_ready() {
            return f.write_str("ready\n");
        }
        f.write_str("not ready\n")?;
        for r in &self.reasons {
            writeln!(f, "{r}")?;
        }
        Ok(())
    }
}

/// One reason a process is not ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotReady {
    /// A model's pool cannot route.
    Model {
        /// The model (gateway) or pool (picker) name.
        name: String,
        /// Why.
        reason: Reason,
    },
    /// JWTs are the only credential accepted and no signing key set has been fetched yet, so
    /// every request would be refused.
    JwksNotFetched,
}

/// One line: `model "NAME": CODE: DETAIL` or `auth: jwks-not-fetched: DETAIL`.
impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::Model { name, reason } => {
                // A JSON string: quotes, backslashes and control characters escaped.
                let quoted = serde_json::Value::from(name.as_str());
                write!(f, "model {quoted}: {}: {reason}", reason.code())
            }
            NotReady::JwksNotFetched => f.write_str(
                "auth: jwks-not-fetched: JWTs are the only credential accepted and no signing key \
                 set has been fetched yet",
            ),
        }
    }
}

/// Why a pool cannot route: none of its endpoints has metrics to be routed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// No endpoint is configured or discovered.
    NoEndpoints,
    /// Endpoints are known, but no metrics page of any has been read yet (just started or
    /// just added), and none has failed a scrape.
    NotScraped {
        /// The endpoints.
        endpoints: usize,
    },
    /// No endpoint has fresh metrics: each one's scrapes fail (refused, timed out, an error
    /// status, a page that cannot be parsed), its last page is older than the staleness
    /// threshold, or it has not been scraped yet.
    Stale {
        /// The endpoints.
        endpoints: usize,
        /// Endpoints whose scrapes fail.
        failing: usize,
        /// Endpoints whose last page is older than the threshold.
        old: usize,
        /// Endpoints not scraped yet.
        not_scraped: usize,
        /// The staleness threshold.
        stale_after: Duration,
    },
}

impl Reason {
    /// A stable code for the reason: `no-endpoints`, `not-scraped` or `stale`.
    pub const fn code(&self) -> &'static str {
        match self {
            Reason::NoEndpoints => "no-endpoints",
            Reason::NotScraped { .. } => "not-scraped",
            Reason::Stale { .. } => "stale",
        }
    }
}

/// The detail: what an operator looks at next.
impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NoEndpoints => f.write_str("no endpoint is configured or discovered"),
            Reason::NotScraped { endpoints } => write!(
                f,
                "none of its {endpoints} endpoint{} has had a metrics page read yet",
                plural(*endpoints)
            ),
            Reason::Stale {
                endpoints,
                failing,
                old,
                not_scraped,
                stale_after,
            } => write!(
                f,
                "none of its {endpoints} endpoint{} has fresh metrics ({failing} failing \
                 scrape{}, {old} last page{} older than {} ms, {not_scraped} not scraped yet)",
                plural(*endpoints),
                plural(*failing),
                plural(*old),
                stale_after.as_millis()
            ),
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_names_each_model_and_why() {
        let mut r = Readiness::not_ready();
        r.push(NotReady::Model {
            name: "llama".into(),
            reason: Reason::NotScraped { endpoints: 2 },
        });
        r.push(NotReady::Model {
            name: "odd\": name".into(),
            reason: Reason::Stale {
                endpoints: 3,
                failing: 2,
                old: 1,
                not_scraped: 0,
                stale_after: Duration::from_secs(2),
            },
        });
        r.push(NotReady::Model {
            name: "m".into(),
            reason: Reason::NoEndpoints,
        });
        r.push(NotReady::JwksNotFetched);
        assert!(!r.is_ready());
        assert_eq!(
            r.to_string(),
            "not ready\n\
             model \"llama\": not-scraped: none of its 2 endpoints has had a metrics page read yet\n\
             model \"odd\\\": name\": stale: none of its 3 endpoints has fresh metrics (2 failing \
             scrapes, 1 last page older than 2000 ms, 0 not scraped yet)\n\
             model \"m\": no-endpoints: no endpoint is configured or discovered\n\
             auth: jwks-not-fetched: JWTs are the only credential accepted and no signing key set \
             has been fetched yet\n"
        );
    }

    #[test]
    fn a_bare_answer_keeps_the_one_line_bodies() {
        assert_eq!(Readiness::from(true).to_string(), "ready\n");
        assert_eq!(Readiness::from(false).to_string(), "not ready\n");
        assert!(Readiness::ready().reasons().is_empty());
    }
}
