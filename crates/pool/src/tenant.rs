//! The tenant and priority of a request, for flow control and its metrics.
//!
//! A *flow* is a tenant (fairness id) within a priority band, as in the reference endpoint
//! picker, whose two request headers infergate reads and writes:
//! [`FAIRNESS_ID_HEADER`] (the tenant) and [`OBJECTIVE_HEADER`] (an objective name, mapped to a
//! priority the way the reference's `InferenceObjective` `spec.priority` is).
//!
//! - **Gateway** ([`Tenancy::gateway`]): the tenant is the one authentication named (API key or
//!   JWT claim); without authentication (`auth: none`, tenant `anonymous`), the configured
//!   `tenantHeader`; else [`DEFAULT_TENANT`]. The priority comes from the configured
//!   `priorityHeader` (a band name) or the objective header, else `defaultPriority`. Clients
//!   cannot choose their fairness id: the gateway removes both reference headers from every
//!   request ([`strip_client_headers`]) and sets the fairness id from what it decided
//!   ([`set_upstream_headers`]), so a picker behind it sees a trusted value.
//! - **Picker** ([`Tenancy::picker`]): the fairness id header (set by a trusted gateway in front
//!   of Envoy), else [`DEFAULT_TENANT`]; the objective header through the configured objectives.
//!
//! Metric labels stay bounded: [`Tenancy::label`] is the tenant when it is one of the configured
//! `metricTenants` (and `default`), else `other`.

use std::collections::BTreeMap;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use infergate_scheduler::Priority;
use serde::{Deserialize, Serialize};

/// The tenant of a request nothing names.
pub const DEFAULT_TENANT: &str = "default";

/// The metric label of tenants not listed in `metricTenants`.
pub const OTHER_TENANT: &str = "other";

/// The reference's fairness-id header: the request's tenant.
pub const FAIRNESS_ID_HEADER: &str = "x-llm-d-inference-fairness-id";

/// The reference's objective header: the name of an objective whose priority the request gets.
pub const OBJECTIVE_HEADER: &str = "x-llm-d-inference-objective";

/// The longest tenant name taken from a header, in bytes; a longer value is ignored (the
/// request falls to the default tenant), so a client cannot grow the queues' flow table with
/// huge names.
pub const MAX_TENANT_BYTES: usize = 128;

/// An objective's priority: a band name, or the reference's integer `spec.priority` (above 0
/// is Critical, 0 Standard, below 0 Sheddable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ObjectivePriority {
    /// `critical`, `standard` or `sheddable`.
    Band(Priority),
    /// The reference's integer priority.
    Level(i32),
}

/// What a configured objective priority must be, in the error for one that is neither.
const OBJECTIVE_PRIORITY_EXPECTED: &str = "critical, standard, sheddable or an integer priority (above 0 critical, 0 standard, below 0 sheddable)";

impl<'de> Deserialize<'de> for ObjectivePriority {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ObjectivePriority;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(OBJECTIVE_PRIORITY_EXPECTED)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                match v {
                    "critical" => Ok(ObjectivePriority::Band(Priority::Critical)),
                    "standard" => Ok(ObjectivePriority::Band(Priority::Standard)),
                    "sheddable" => Ok(ObjectivePriority::Band(Priority::Sheddable)),
                    _ => Err(E::custom(format_args!(
                        "`{v}` is not a priority: expected {OBJECTIVE_PRIORITY_EXPECTED}"
                    ))),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                i32::try_from(v)
                    .map(ObjectivePriority::Level)
                    .map_err(|_| E::custom(format_args!("the priority {v} is out of range")))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i32::try_from(v)
                    .map(ObjectivePriority::Level)
                    .map_err(|_| E::custom(format_args!("the priority {v} is out of range")))
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl ObjectivePriority {
    /// The band.
    pub const fn priority(self) -> Priority {
        match self {
            ObjectivePriority::Band(p) => p,
            ObjectivePriority::Level(n) if n > 0 => Priority::Critical,
            ObjectivePriority::Level(0) => Priority::Standard,
            ObjectivePriority::Level(_) => Priority::Sheddable,
        }
    }
}

/// How a request's tenant and priority are found (`tenancy:` in the gateway file, and in the
/// picker's `--flow-control` file).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct TenancyConfig {
    /// Gateway: the header naming the tenant when authentication names none.
    pub tenant_header: Option<String>,
    /// Gateway: the header naming the priority band (`critical`, `standard`, `sheddable`).
    pub priority_header: Option<String>,
    /// Objective names (the value of [`OBJECTIVE_HEADER`]) and their priority.
    pub objectives: BTreeMap<String, ObjectivePriority>,
    /// The priority of a request that names none (or an unknown objective).
    pub default_priority: Priority,
    /// Tenants given their own metric label; every other tenant is counted as `other`.
    pub metric_tenants: Vec<String>,
}

/// A request's tenant and priority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantPriority {
    /// The tenant (fairness id).
    pub tenant: Arc<str>,
    /// The priority band.
    pub priority: Priority,
}

/// [`TenancyConfig`] ready to use per request.
#[derive(Clone, Debug)]
pub struct Tenancy {
    tenant_header: Option<HeaderName>,
    priority_header: Option<HeaderName>,
    objectives: BTreeMap<String, Priority>,
    default_priority: Priority,
    metric_tenants: Vec<Arc<str>>,
    default_tenant: Arc<str>,
}

/// A configured header name that is not a valid HTTP header name.
#[derive(Debug, thiserror::Error)]
#[error("tenancy.{field}: {value:?} is not a valid header name")]
pub struct TenancyError {
    /// `tenantHeader` or `priorityHeader`.
    pub field: &'static str,
    /// The configured value.
    pub value: String,
    /// Why it is invalid.
    #[source]
    pub source: http::header::InvalidHeaderName,
}

impl Default for Tenancy {
    fn default() -> Self {
        Tenancy {
            tenant_header: None,
            priority_header: None,
            objectives: BTreeMap::new(),
            default_priority: Priority::Standard,
            metric_tenants: Vec::new(),
            default_tenant: Arc::from(DEFAULT_TENANT),
        }
    }
}

impl Tenancy {
    /// Checks the header names.
    pub fn new(cfg: &TenancyConfig) -> Result<Self, TenancyError> {
        let header = |field, v: &Option<String>| {
            v.as_deref()
                .map(|s| {
                    HeaderName::try_from(s).map_err(|source| TenancyError {
                        field,
                        value: s.to_owned(),
                        source,
                    })
                })
                .transpose()
        };
        Ok(Tenancy {
            tenant_header: header("tenantHeader", &cfg.tenant_header)?,
            priority_header: header("priorityHeader", &cfg.priority_header)?,
            objectives: cfg
                .objectives
                .iter()
                .map(|(k, v)| (k.clone(), v.priority()))
                .collect(),
            default_priority: cfg.default_priority,
            metric_tenants: cfg
                .metric_tenants
                .iter()
                .map(|t| Arc::from(t.as_str()))
                .collect(),
            default_tenant: Arc::from(DEFAULT_TENANT),
        })
    }

    /// The gateway's view: `authenticated` is the tenant authentication named (`None` without
    /// authentication), `headers` the client's request headers (before
    /// [`strip_client_headers`]).
    pub fn gateway(&self, authenticated: Option<&Arc<str>>, headers: &HeaderMap) -> TenantPriority {
        let tenant = match authenticated {
            Some(t) => Arc::clone(t),
            None => self
                .tenant_header
                .as_ref()
                .and_then(|h| header_tenant(headers, h))
                .map_or_else(|| Arc::clone(&self.default_tenant), Arc::from),
        };
        let priority = self
            .priority_header
            .as_ref()
            .and_then(|h| headers.get(h))
            .and_then(|v| v.to_str().ok())
            .and_then(parse_band)
            .or_else(|| self.objective(headers))
            .unwrap_or(self.default_priority);
        TenantPriority { tenant, priority }
    }

    /// The picker's view: the reference's fairness-id and objective headers.
    pub fn picker(&self, fairness_id: Option<&str>, objective: Option<&str>) -> TenantPriority {
        let tenant = fairness_id
            .filter(|t| !t.is_empty() && t.len() <= MAX_TENANT_BYTES)
            .map_or_else(|| Arc::clone(&self.default_tenant), Arc::from);
        let priority = objective
            .and_then(|o| self.objectives.get(o).copied())
            .unwrap_or(self.default_priority);
        TenantPriority { tenant, priority }
    }

    /// The tenant's metric label: itself when configured (or `default`), else `other`.
    pub fn label<'a>(&'a self, tenant: &'a str) -> &'a str {
        if tenant == DEFAULT_TENANT || self.metric_tenants.iter().any(|t| &**t == tenant) {
            tenant
        } else {
            OTHER_TENANT
        }
    }

    /// Replaces what a client sent as its tenant with `tenant`, the one authentication named:
    /// the fairness-id header and, when configured, `tenantHeader`. A cluster or picker behind
    /// a router that authenticated the client reads either and must see the router's tenant,
    /// never one the client chose.
    pub fn set_authenticated(&self, headers: &mut HeaderMap, tenant: &str) {
        let Ok(v) = HeaderValue::from_str(tenant) else {
            headers.remove(FAIRNESS_ID_HEADER);
            if let Some(h) = &self.tenant_header {
                headers.remove(h);
            }
            return;
        };
        if let Some(h) = &self.tenant_header {
            headers.insert(h.clone(), v.clone());
        }
        headers.insert(FAIRNESS_ID_HEADER, v);
    }

    fn objective(&self, headers: &HeaderMap) -> Option<Priority> {
        let name = headers.get(OBJECTIVE_HEADER)?.to_str().ok()?;
        self.objectives.get(name).copied()
    }
}

fn header_tenant<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.len() <= MAX_TENANT_BYTES)
}

fn parse_band(s: &str) -> Option<Priority> {
    [Priority::Critical, Priority::Standard, Priority::Sheddable]
        .into_iter()
        .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
}

/// Removes the reference's fairness-id and objective headers a client sent: only the gateway
/// decides them.
pub fn strip_client_headers(headers: &mut HeaderMap) {
    headers.remove(FAIRNESS_ID_HEADER);
    headers.remove(OBJECTIVE_HEADER);
}

/// Sets the fairness-id header to the gateway's decision, for a picker or model server behind it.
pub fn set_upstream_headers(headers: &mut HeaderMap, tp: &TenantPriority) {
    if let Ok(v) = HeaderValue::from_str(&tp.tenant) {
        headers.insert(FAIRNESS_ID_HEADER, v);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    fn tenancy(yaml: &str) -> Tenancy {
        Tenancy::new(&serde_yaml::from_str(yaml).unwrap()).unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_gateway_prefers_the_authenticated_tenant_then_the_header_then_default() {
        let t = tenancy("tenantHeader: x-tenant\npriorityHeader: x-priority\n");
        let h = headers(&[("x-tenant", "team-b"), ("x-priority", "Sheddable")]);
        let key: Arc<str> = Arc::from("team-a");
        let tp = t.gateway(Some(&key), &h);
        assert_eq!((&*tp.tenant, tp.priority), ("team-a", Priority::Sheddable));
        let tp = t.gateway(None, &h);
        assert_eq!(&*tp.tenant, "team-b");
        let tp = t.gateway(None, &HeaderMap::new());
        assert_eq!((&*tp.tenant, tp.priority), ("default", Priority::Standard));
        // An oversized header value falls to the default tenant.
        let long = "x".repeat(MAX_TENANT_BYTES + 1);
        let tp = t.gateway(None, &headers(&[("x-tenant", &long)]));
        assert_eq!(&*tp.tenant, "default");
        // Without a tenant header configured, the fairness-id header a client sends is ignored.
        let t = tenancy("{}");
        let tp = t.gateway(None, &headers(&[(FAIRNESS_ID_HEADER, "spoofed")]));
        assert_eq!(&*tp.tenant, "default");
    }

    #[test]
    fn objectives_map_to_bands_by_name_or_reference_integer() {
        let t = tenancy(
            "objectives: {chat: critical, batch: -10, normal: 0, premium: 100}\ndefaultPriority: sheddable\n",
        );
        let p = |o| t.picker(Some("a"), Some(o)).priority;
        assert_eq!(p("chat"), Priority::Critical);
        assert_eq!(p("premium"), Priority::Critical);
        assert_eq!(p("normal"), Priority::Standard);
        assert_eq!(p("batch"), Priority::Sheddable);
        assert_eq!(p("unknown"), Priority::Sheddable);
        let tp = t.picker(None, None);
        assert_eq!((&*tp.tenant, tp.priority), ("default", Priority::Sheddable));
        let tp = t.gateway(None, &headers(&[(OBJECTIVE_HEADER, "chat")]));
        assert_eq!(tp.priority, Priority::Critical);
    }

    #[test]
    fn an_objective_priority_naming_no_band_is_refused_saying_what_is_accepted() {
        let e = serde_yaml::from_str::<TenancyConfig>("objectives: {interactive: urgent}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`urgent` is not a priority"), "{e}");
        assert!(
            e.contains("critical, standard, sheddable or an integer"),
            "{e}"
        );
        let e = serde_yaml::from_str::<TenancyConfig>("objectives: {x: [1]}\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("critical, standard, sheddable or an integer"),
            "{e}"
        );
        let e = serde_yaml::from_str::<TenancyConfig>("objectives: {x: 3000000000}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("out of range"), "{e}");
        let ok: TenancyConfig = serde_yaml::from_str(
            "objectives: {a: critical, b: standard, c: sheddable, d: -1, e: 7}\n",
        )
        .unwrap();
        assert_eq!(
            ok.objectives["a"],
            ObjectivePriority::Band(Priority::Critical)
        );
        assert_eq!(
            ok.objectives["b"],
            ObjectivePriority::Band(Priority::Standard)
        );
        assert_eq!(
            ok.objectives["c"],
            ObjectivePriority::Band(Priority::Sheddable)
        );
        assert_eq!(ok.objectives["d"], ObjectivePriority::Level(-1));
        assert_eq!(ok.objectives["e"], ObjectivePriority::Level(7));
        // A JSON round trip (the operator renders the picker's file) keeps the values.
        let back: TenancyConfig =
            serde_json::from_str(&serde_json::to_string(&ok).unwrap()).unwrap();
        assert_eq!(back, ok);
    }

    #[test]
    fn metric_labels_are_bounded_to_configured_tenants() {
        let t = tenancy("metricTenants: [team-a]\n");
        assert_eq!(t.label("team-a"), "team-a");
        assert_eq!(t.label("default"), "default");
        assert_eq!(t.label("team-zz"), "other");
    }

    #[test]
    fn client_headers_are_replaced_by_the_gateway_decision() {
        let mut h = headers(&[(FAIRNESS_ID_HEADER, "spoofed"), (OBJECTIVE_HEADER, "chat")]);
        strip_client_headers(&mut h);
        assert!(h.get(FAIRNESS_ID_HEADER).is_none() && h.get(OBJECTIVE_HEADER).is_none());
        let tp = TenantPriority {
            tenant: Arc::from("team-a"),
            priority: Priority::Standard,
        };
        set_upstream_headers(&mut h, &tp);
        assert_eq!(h.get(FAIRNESS_ID_HEADER).unwrap(), "team-a");
    }

    #[test]
    fn an_invalid_header_name_is_a_configuration_error() {
        let cfg: TenancyConfig = serde_yaml::from_str("tenantHeader: \"bad header\"").unwrap();
        let e = Tenancy::new(&cfg).unwrap_err();
        assert_eq!(e.field, "tenantHeader");
        assert!(serde_yaml::from_str::<TenancyConfig>("tenant: x").is_err());
    }
}
