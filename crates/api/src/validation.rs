//! Admission rules of `InferenceGatewayConfig`, kept in one table per schema node.
//!
//! Each [`CelRule`] is written into the generated CRD as an `x-kubernetes-validations` entry (by
//! the `schemars` transforms below) and is checked again in Rust by [`validate`] with the same
//! message. The API server enforces the CEL form at admission; the operator runs the Rust form
//! before rendering and reports a failure as `Accepted=False` with the message, which covers
//! objects stored before the CRD carried a rule and clusters whose API server skips CEL.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;

use serde_json::{Value, json};

use crate::config::{
    FlowBandLimits, FlowControlSpec, InferenceGatewayConfigSpec, ListenerProtocol, ListenerSpec,
    ObjectivePriority, PriorityBand, QuotasSpec, SchedulerSpec, TenancySpec, TlsSpec, Weights,
    with_weight_names,
};
use crate::error::Error;

/// One CEL rule and the message a person reads when it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CelRule {
    /// The CEL expression, evaluated with `self` bound to the node that carries it.
    pub rule: &'static str,
    /// What the user is told when the rule fails.
    pub message: &'static str,
}

/// Rules on `spec`.
pub const SPEC_RULES: &[CelRule] = &[
    SCHEDULER_COUNT,
    BBR_REQUIRED,
    MODEL_NAME_UNIQUE,
    NAME_UNIQUE,
    HTTPS_NEEDS_TLS,
    ISSUER_NEEDS_HOSTNAME,
    LORA_NEEDS_BBR,
    AUTH_REQUIRED,
    AUTH_OR_UNAUTHENTICATED,
];
/// Rules on each `spec.schedulers[*]`.
pub const SCHEDULER_RULES: &[CelRule] = &[PRESET_XOR_WEIGHTS];
/// Rules on each `spec.schedulers[*].weights`.
pub const WEIGHTS_RULES: &[CelRule] = &[WEIGHTS_NON_NEGATIVE, WEIGHTS_ONE_POSITIVE];
/// Rules on `spec.gateway.listeners` (Gateway API's own rules on a Gateway's listeners).
pub const LISTENER_RULES: &[CelRule] = &[LISTENER_NAME_UNIQUE, LISTENER_PORT_UNIQUE];
/// Rules on `spec.tls`.
pub const TLS_RULES: &[CelRule] = &[TLS_ONE_SOURCE];
/// Rules on `spec.quotas.redis`.
pub const REDIS_RULES: &[CelRule] = &[REDIS_ONE_PASSWORD];
/// Rules on `spec.schedulers[*].precisePrefix.tokenizer`.
pub const TOKENIZER_RULES: &[CelRule] = &[TOKENIZER_ONE_SOURCE, SUB_PATH_NEEDS_CLAIM];
/// Rules on `spec.schedulers[*].precisePrefix`.
pub const PRECISE_RULES: &[CelRule] = &[REPLAY_NOT_EVENTS_PORT];
/// Rules on `spec.schedulers[*].outlierDetection`.
pub const OUTLIER_RULES: &[CelRule] = &[MAX_EJECTION_NOT_BELOW_BASE];

/// Authentication is configured, or explicitly waived.
pub const AUTH_REQUIRED: CelRule = CelRule {
    rule: "has(self.auth) || (has(self.allowUnauthenticated) && self.allowUnauthenticated)",
    message: "spec.auth is not set: configure spec.auth.jwt, or set spec.allowUnauthenticated: true to serve the models without client authentication (they are never exposed unauthenticated by omission)",
};
/// Not both: authentication configured and waived.
pub const AUTH_OR_UNAUTHENTICATED: CelRule = CelRule {
    rule: "!(has(self.auth) && has(self.allowUnauthenticated) && self.allowUnauthenticated)",
    message: "spec.allowUnauthenticated: true contradicts spec.auth: remove one of them",
};
/// Between 1 and 100 schedulers.
pub const SCHEDULER_COUNT: CelRule = CelRule {
    rule: "size(self.schedulers) >= 1 && size(self.schedulers) <= 100",
    message: "spec.schedulers must list between 1 and 100 schedulers",
};
/// More than one scheduler needs the body-based router.
pub const BBR_REQUIRED: CelRule = CelRule {
    rule: "size(self.schedulers) <= 1 || self.bbr.enabled",
    message: "spec.bbr.enabled must be true when more than one scheduler is configured: the body-based router is what picks the scheduler from the request's model name",
};
/// `modelName` unique.
pub const MODEL_NAME_UNIQUE: CelRule = CelRule {
    rule: "self.schedulers.all(s, self.schedulers.exists_one(t, t.modelName == s.modelName))",
    message: "each scheduler must have a different modelName: two schedulers cannot serve the same model",
};
/// `name` unique.
pub const NAME_UNIQUE: CelRule = CelRule {
    rule: "self.schedulers.all(s, self.schedulers.exists_one(t, t.name == s.name))",
    message: "each scheduler must have a different name: the name is part of its children's names",
};
/// HTTPS listeners need a certificate.
pub const HTTPS_NEEDS_TLS: CelRule = CelRule {
    rule: "!self.gateway.listeners.exists(l, l.protocol == 'HTTPS') || has(self.tls)",
    message: "an HTTPS listener needs spec.tls (a certificate Secret or a cert-manager issuer)",
};
/// A cert-manager issuer needs each HTTPS listener's hostname: cert-manager's Gateway support
/// takes a certificate's DNS name from the listener and skips a listener without one, so its
/// Secret would never be issued and the listener would stay without a certificate.
pub const ISSUER_NEEDS_HOSTNAME: CelRule = CelRule {
    rule: "!has(self.tls) || !has(self.tls.issuerRef) || self.gateway.listeners.all(l, l.protocol != 'HTTPS' || has(l.hostname))",
    message: "an HTTPS listener needs a hostname with spec.tls.issuerRef: cert-manager issues the certificate for the listener's hostname and skips a listener without one; set the listener's hostname, or use spec.tls.certificateSecretRef",
};
/// LoRA adapters need the body-based router.
pub const LORA_NEEDS_BBR: CelRule = CelRule {
    rule: "self.bbr.enabled || self.schedulers.all(s, !has(s.loraAdapters) || size(s.loraAdapters) == 0)",
    message: "loraAdapters need the body-based router (spec.bbr.enabled: true): it is what maps an adapter to its base model for the endpoint picker; without it requests naming an adapter are not routed as adapters",
};
/// Listener names are unique (Gateway API's rule on `Gateway.spec.listeners`, same CEL).
pub const LISTENER_NAME_UNIQUE: CelRule = CelRule {
    rule: "self.all(l1, self.exists_one(l2, l1.name == l2.name))",
    message: "each listener must have a different name: the Gateway API refuses a Gateway whose listeners share a name",
};
/// Port, protocol and hostname are unique together (Gateway API's rule, same CEL).
pub const LISTENER_PORT_UNIQUE: CelRule = CelRule {
    rule: "self.all(l1, self.exists_one(l2, l1.port == l2.port && l1.protocol == l2.protocol && (has(l1.hostname) && has(l2.hostname) ? l1.hostname == l2.hostname : !has(l1.hostname) && !has(l2.hostname))))",
    message: "each listener must have a different combination of port, protocol and hostname: the Gateway API refuses a Gateway with two that are the same",
};
/// `preset` and `weights` are exclusive.
pub const PRESET_XOR_WEIGHTS: CelRule = CelRule {
    rule: "!(has(self.preset) && has(self.weights))",
    message: "set either preset or weights on a scheduler, not both",
};
/// `(!has(self.w) || self.w >= 0.0) && …` over every weight of [`with_weight_names`].
macro_rules! non_negative_rule {
    ($f0:ident: $n0:literal $(, $f:ident: $n:literal)* $(,)?) => {
        concat!(
            "(!has(self.", $n0, ") || self.", $n0, " >= 0.0)",
            $(" && (!has(self.", $n, ") || self.", $n, " >= 0.0)",)*
        )
    };
}
/// `(has(self.w) && self.w > 0.0) || …` over every weight of [`with_weight_names`].
macro_rules! one_positive_rule {
    ($f0:ident: $n0:literal $(, $f:ident: $n:literal)* $(,)?) => {
        concat!(
            "(has(self.", $n0, ") && self.", $n0, " > 0.0)",
            $(" || (has(self.", $n, ") && self.", $n, " > 0.0)",)*
        )
    };
}
/// Weights are non-negative. The rule names every weight of `Weights` (one list with
/// [`Weights::entries`], see `with_weight_names` in `config.rs`).
pub const WEIGHTS_NON_NEGATIVE: CelRule = CelRule {
    rule: with_weight_names!(non_negative_rule),
    message: "scorer weights must be zero or positive numbers",
};
/// At least one weight is positive (over the same list).
pub const WEIGHTS_ONE_POSITIVE: CelRule = CelRule {
    rule: with_weight_names!(one_positive_rule),
    message: "at least one scorer weight must be greater than zero, otherwise every pod scores the same",
};
/// Exactly one certificate source.
pub const TLS_ONE_SOURCE: CelRule = CelRule {
    rule: "has(self.certificateSecretRef) != has(self.issuerRef)",
    message: "spec.tls needs exactly one of certificateSecretRef and issuerRef",
};

/// At most one source of the Redis password.
pub const REDIS_ONE_PASSWORD: CelRule = CelRule {
    rule: "!(has(self.passwordEnv) && has(self.passwordSecretRef))",
    message: "spec.quotas.redis takes passwordEnv or passwordSecretRef, not both",
};

/// Exactly one tokenizer volume.
pub const TOKENIZER_ONE_SOURCE: CelRule = CelRule {
    rule: "has(self.configMap) != has(self.persistentVolumeClaim)",
    message: "precisePrefix.tokenizer needs exactly one of configMap and persistentVolumeClaim",
};
/// `subPath` is a directory of a claim.
pub const SUB_PATH_NEEDS_CLAIM: CelRule = CelRule {
    rule: "!has(self.subPath) || has(self.persistentVolumeClaim)",
    message: "precisePrefix.tokenizer.subPath names a directory of a persistentVolumeClaim: a configMap's keys are the files",
};

/// The replay port is not the events port (`eventsPort` is defaulted by the schema, so it is
/// set when the rule runs).
pub const REPLAY_NOT_EVENTS_PORT: CelRule = CelRule {
    rule: "!has(self.replayPort) || self.replayPort != self.eventsPort",
    message: "precisePrefix.replayPort must differ from eventsPort: the replay socket (vLLM's replay_endpoint) is not the one the events are published on, and every replay asked of the publishing socket would fail",
};

/// The longest ejection is not shorter than the first (each defaulted when left out: 300000 and
/// 30000 ms, `OutlierDetectionSpec::DEFAULT_*`).
pub const MAX_EJECTION_NOT_BELOW_BASE: CelRule = CelRule {
    rule: "(has(self.maxEjectionMs) ? self.maxEjectionMs : 300000) >= (has(self.baseEjectionMs) ? self.baseEjectionMs : 30000)",
    message: "outlierDetection.maxEjectionMs must not be below baseEjectionMs (a field left out counts at its default: 300000 and 30000): it caps every ejection, the first included",
};

/// The message for a JWKS URI that is not `https://` (the schema's `pattern: ^https://` is the
/// API server's side of the same check). The violation's field names the URI.
pub const JWKS_HTTPS_MESSAGE: &str =
    "must start with https://: keys fetched in clear text could be replaced on the way";
/// A scorer weight that is infinite or not a number (YAML's `.inf` and `.nan`; JSON, and so the
/// API server, cannot carry them).
pub const WEIGHT_FINITE_MESSAGE: &str = "a scorer weight must be a finite number";
/// A `modelSelector` without labels, or with more than the InferencePool's selector takes
/// (the schema's `minProperties: 1`, `maxProperties: 64` are the API server's side).
pub const MODEL_SELECTOR_MESSAGE: &str = "must have between 1 and 64 labels: the InferencePool's selector needs at least one (an empty selector would select every pod) and takes at most 64";
/// A model, adapter or matched name that is empty or only whitespace, which the body-based
/// router refuses (the schema's `minLength: 1` is the API server's side for empty names).
pub const NAME_BLANK_MESSAGE: &str =
    "must not be empty or only whitespace: the body-based router refuses such a model name";
/// Most matches of one HTTPRoute rule (Gateway API v1.6's `rules[].matches` `maxItems`); a
/// scheduler's route has one match per routed name.
pub const HTTPROUTE_MAX_MATCHES: usize = 64;

/// A flow-control limit of 0 (the schema's `minimum: 1` is the API server's side).
pub const FLOW_LIMIT_MESSAGE: &str =
    "must be at least 1: a queue bounded at 0 would refuse every request it is meant to hold";
/// A TTL beyond a day (the schema's `maximum` is the API server's side).
pub const FLOW_TTL_MESSAGE: &str =
    "must be between 0 (no TTL) and 86400000 ms (one day): a request does not wait longer";
/// A fair-share half-life of 0 (the schema's `minimum: 1` is the API server's side).
pub const FLOW_HALF_LIFE_MESSAGE: &str =
    "must be at least 1 ms: a tenant's recent service needs a time to decay over";
/// A service weight that is negative or not a number.
pub const FLOW_WEIGHT_MESSAGE: &str = "must be a finite number of 0 or more";
/// An objective's priority that is neither a band nor an integer.
pub const OBJECTIVE_PRIORITY_MESSAGE: &str = "must be critical, standard, sheddable or an integer priority (above 0 critical, 0 standard, below 0 sheddable)";
/// An empty objective name (no request header can name it).
pub const OBJECTIVE_NAME_MESSAGE: &str = "an objective name must not be empty";
/// `passwordEnv` naming a variable the pods do not have.
pub const PASSWORD_ENV_MESSAGE: &str = "names a variable spec.podDefaults.env does not define, so the picker would refuse to start: define it there (e.g. from a Secret) or use passwordSecretRef";

/// A broken rule, with the path of the field that breaks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Path of the offending node, e.g. `spec.schedulers[1].weights`.
    pub field: String,
    /// The rule's message; a check that names a second place or a count says so here.
    pub message: Cow<'static, str>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Checks every rule of the tables above against a (defaulted) spec; lists all violations.
pub fn validate(spec: &InferenceGatewayConfigSpec) -> Result<(), Error> {
    let mut out = Vec::new();
    let mut fail = |field: String, rule: CelRule| {
        out.push(Violation {
            field,
            message: rule.message.into(),
        });
    };
    let n = spec.schedulers.len();
    if !(1..=100).contains(&n) {
        fail("spec.schedulers".into(), SCHEDULER_COUNT);
    }
    if n > 1 && !spec.bbr.enabled {
        fail("spec.bbr.enabled".into(), BBR_REQUIRED);
    }
    if !all_unique(spec.schedulers.iter().map(|s| s.model_name.as_str())) {
        fail("spec.schedulers".into(), MODEL_NAME_UNIQUE);
    }
    if !all_unique(spec.schedulers.iter().map(|s| s.name.as_str())) {
        fail("spec.schedulers".into(), NAME_UNIQUE);
    }
    let https = spec
        .gateway
        .listeners
        .iter()
        .any(|l| l.protocol == ListenerProtocol::Https);
    if https && spec.tls.is_none() {
        fail("spec".into(), HTTPS_NEEDS_TLS);
    }
    if spec.tls.as_ref().is_some_and(|t| t.issuer_ref.is_some()) {
        for (i, l) in spec.gateway.listeners.iter().enumerate() {
            if l.protocol == ListenerProtocol::Https && l.hostname.is_none() {
                fail(
                    format!("spec.gateway.listeners[{i}].hostname"),
                    ISSUER_NEEDS_HOSTNAME,
                );
            }
        }
    }
    match (&spec.auth, spec.allow_unauthenticated) {
        (None, false) => fail("spec".into(), AUTH_REQUIRED),
        (Some(_), true) => fail("spec".into(), AUTH_OR_UNAUTHENTICATED),
        _ => {}
    }
    if !spec.bbr.enabled && spec.schedulers.iter().any(|s| !s.lora_adapters.is_empty()) {
        fail("spec.bbr.enabled".into(), LORA_NEEDS_BBR);
    }
    check_listeners(&spec.gateway.listeners, &mut fail);
    if let Some(tls) = &spec.tls {
        check_tls(tls, &mut fail);
    }
    for (i, s) in spec.schedulers.iter().enumerate() {
        check_scheduler(i, s, &mut fail);
    }
    if let Some(auth) = &spec.auth
        && !auth.jwt.provider.remote_jwks.uri.starts_with("https://")
    {
        out.push(Violation {
            field: "spec.auth.jwt.provider.remoteJWKS.uri".into(),
            message: JWKS_HTTPS_MESSAGE.into(),
        });
    }
    let mut fail_at = |field: String, message: Cow<'static, str>| {
        out.push(Violation { field, message });
    };
    for (i, s) in spec.schedulers.iter().enumerate() {
        check_scheduler_fields(i, s, spec.bbr.enabled, &mut fail_at);
    }
    check_routed_names(&spec.schedulers, &mut fail_at);
    let mut fail_with = |field: String, message: &'static str| fail_at(field, message.into());
    if let Some(q) = &spec.quotas {
        check_quotas(spec, q, &mut fail_with);
    }
    if let Some(f) = &spec.flow_control {
        check_flow_control(f, &mut fail_with);
    }
    if let Some(t) = &spec.tenancy {
        check_tenancy(t, &mut fail_with);
    }
    if out.is_empty() {
        Ok(())
    } else {
        Err(Error::Invalid(out))
    }
}

fn check_tls(tls: &TlsSpec, fail: &mut impl FnMut(String, CelRule)) {
    if tls.certificate_secret_ref.is_some() == tls.issuer_ref.is_some() {
        fail("spec.tls".into(), TLS_ONE_SOURCE);
    }
}

fn check_scheduler(i: usize, s: &SchedulerSpec, fail: &mut impl FnMut(String, CelRule)) {
    if s.preset.is_some() && s.weights.is_some() {
        fail(format!("spec.schedulers[{i}]"), PRESET_XOR_WEIGHTS);
    }
    if let Some(w) = &s.weights {
        check_weights(i, w, fail);
    }
    if let Some(o) = &s.outlier_detection
        && o.max_ejection_ms() < o.base_ejection_ms()
    {
        fail(
            format!("spec.schedulers[{i}].outlierDetection"),
            MAX_EJECTION_NOT_BELOW_BASE,
        );
    }
    if let Some(p) = &s.precise_prefix {
        if p.replay_port == Some(p.events_port) {
            fail(
                format!("spec.schedulers[{i}].precisePrefix"),
                REPLAY_NOT_EVENTS_PORT,
            );
        }
        let t = &p.tokenizer;
        let at = format!("spec.schedulers[{i}].precisePrefix.tokenizer");
        if t.config_map.is_some() == t.persistent_volume_claim.is_some() {
            fail(at.clone(), TOKENIZER_ONE_SOURCE);
        }
        if t.sub_path.is_some() && t.persistent_volume_claim.is_none() {
            fail(at, SUB_PATH_NEEDS_CLAIM);
        }
    }
}

fn check_listeners(listeners: &[ListenerSpec], fail: &mut impl FnMut(String, CelRule)) {
    if !all_unique(listeners.iter().map(|l| l.name.as_str())) {
        fail("spec.gateway.listeners".into(), LISTENER_NAME_UNIQUE);
    }
    let mut seen = HashSet::new();
    if !listeners
        .iter()
        .all(|l| seen.insert((l.port, l.protocol, l.hostname.as_deref())))
    {
        fail("spec.gateway.listeners".into(), LISTENER_PORT_UNIQUE);
    }
}

fn check_weights(i: usize, w: &Weights, fail: &mut impl FnMut(String, CelRule)) {
    let entries = w.entries();
    // Infinite and NaN weights are refused by `check_scheduler_fields`, naming the weight.
    if entries.iter().any(|(_, v)| v.is_finite() && *v < 0.0) {
        fail(
            format!("spec.schedulers[{i}].weights"),
            WEIGHTS_NON_NEGATIVE,
        );
    }
    if !entries.iter().any(|(_, v)| *v > 0.0) {
        fail(
            format!("spec.schedulers[{i}].weights"),
            WEIGHTS_ONE_POSITIVE,
        );
    }
}

/// The checks of one scheduler that have no CEL rule (the schema's bounds are the API server's
/// side where one exists).
fn check_scheduler_fields(
    i: usize,
    s: &SchedulerSpec,
    bbr: bool,
    fail: &mut impl FnMut(String, Cow<'static, str>),
) {
    let at = |field: &str| format!("spec.schedulers[{i}].{field}");
    if let Some(w) = &s.weights {
        for (name, v) in w.entries() {
            if !v.is_finite() {
                fail(at(&format!("weights.{name}")), WEIGHT_FINITE_MESSAGE.into());
            }
        }
    }
    if !(1..=64).contains(&s.model_selector.len()) {
        fail(at("modelSelector"), MODEL_SELECTOR_MESSAGE.into());
    }
    // Without the BBR the route has one catch-all match (and adapters are refused above).
    let matches = 1 + s.routed_names().len();
    if bbr && matches > HTTPROUTE_MAX_MATCHES {
        fail(
            format!("spec.schedulers[{i}]"),
            format!(
                "routes {matches} names (modelName, the loraAdapters and the other names modelRewrites match, each once), but its HTTPRoute rule holds at most {HTTPROUTE_MAX_MATCHES} matches: route at most {HTTPROUTE_MAX_MATCHES}"
            )
            .into(),
        );
    }
}

/// Where a routed name is written, and what it is there.
#[derive(Clone)]
struct NamePlace {
    scheduler: usize,
    field: String,
    /// A rewrite's matched name (the BBR maps it once per scheduler, however often it is matched).
    matched: bool,
}

/// Every name that routes to a scheduler — its `modelName`, its `loraAdapters`, the names its
/// `modelRewrites` match — routes to that one: the body-based router's model table takes each
/// name once (`infergate bbr` exits on "model name … is configured twice" otherwise) and the
/// HTTPRoutes would overlap. This refuses what that table refuses (`ModelRouter::add_model`):
/// a name on two schedulers, an adapter equal to its own model or listed twice, and a blank
/// name. A matched name equal to the scheduler's own model or adapter is routed once and fine.
/// Two schedulers with one `modelName` are left to [`MODEL_NAME_UNIQUE`].
fn check_routed_names(
    schedulers: &[SchedulerSpec],
    fail: &mut impl FnMut(String, Cow<'static, str>),
) {
    let mut seen: HashMap<&str, NamePlace> = HashMap::new();
    for (i, s) in schedulers.iter().enumerate() {
        let at = |field: String| format!("spec.schedulers[{i}].{field}");
        let adapters = s
            .lora_adapters
            .iter()
            .enumerate()
            .map(|(j, a)| (a.as_str(), at(format!("loraAdapters[{j}]")), false));
        let matched = s.model_rewrites.iter().enumerate().flat_map(|(r, rule)| {
            rule.matches.iter().enumerate().map(move |(k, m)| {
                (
                    m.model.value.as_str(),
                    format!("spec.schedulers[{i}].modelRewrites[{r}].matches[{k}].model.value"),
                    true,
                )
            })
        });
        let names = std::iter::once((s.model_name.as_str(), at("modelName".into()), false))
            .chain(adapters)
            .chain(matched);
        for (name, field, is_match) in names {
            if name.trim().is_empty() {
                fail(field, NAME_BLANK_MESSAGE.into());
                continue;
            }
            let here = NamePlace {
                scheduler: i,
                field,
                matched: is_match,
            };
            let Some(first) = seen.get(name) else {
                seen.insert(name, here);
                continue;
            };
            let both_models = !first.matched
                && !here.matched
                && first.field.ends_with(".modelName")
                && here.field.ends_with(".modelName");
            let same_pool_rewrite = first.scheduler == here.scheduler && here.matched;
            if both_models || same_pool_rewrite {
                continue;
            }
            let message = if first.scheduler == here.scheduler {
                format!(
                    "`{name}` is already {}: a scheduler's model and adapters must be different names, the body-based router refuses one configured twice",
                    first.field
                )
            } else {
                format!(
                    "`{name}` is already {}: a model name, LoRA adapter or matched name routes to one scheduler only (the body-based router refuses one configured twice, and the two HTTPRoutes would both match it)",
                    first.field
                )
            };
            fail(here.field, message.into());
        }
    }
}

fn check_quotas(
    spec: &InferenceGatewayConfigSpec,
    q: &QuotasSpec,
    fail: &mut impl FnMut(String, &'static str),
) {
    let Some(r) = &q.redis else { return };
    if r.password_env.is_some() && r.password_secret_ref.is_some() {
        fail("spec.quotas.redis".into(), REDIS_ONE_PASSWORD.message);
    }
    if let Some(var) = &r.password_env
        && !spec.pod_defaults.env.iter().any(|e| e.name == *var)
    {
        fail("spec.quotas.redis.passwordEnv".into(), PASSWORD_ENV_MESSAGE);
    }
}

fn check_flow_control(f: &FlowControlSpec, fail: &mut impl FnMut(String, &'static str)) {
    let at = |field: &str| format!("spec.flowControl.{field}");
    if f.request_ttl_ms.is_some_and(|t| t > 86_400_000) {
        fail(at("requestTtlMs"), FLOW_TTL_MESSAGE);
    }
    if f.max_requests == Some(0) {
        fail(at("maxRequests"), FLOW_LIMIT_MESSAGE);
    }
    if f.max_bytes == Some(0) {
        fail(at("maxBytes"), FLOW_LIMIT_MESSAGE);
    }
    if let Some(b) = &f.bands {
        let bands: [(&str, Option<FlowBandLimits>); 3] = [
            ("critical", b.critical),
            ("standard", b.standard),
            ("sheddable", b.sheddable),
        ];
        for (name, limits) in bands {
            let Some(l) = limits else { continue };
            if l.max_requests == Some(0) {
                fail(at(&format!("bands.{name}.maxRequests")), FLOW_LIMIT_MESSAGE);
            }
            if l.max_bytes == Some(0) {
                fail(at(&format!("bands.{name}.maxBytes")), FLOW_LIMIT_MESSAGE);
            }
        }
    }
    if f.headroom.is_some_and(|h| h.share_half_life_ms == Some(0)) {
        fail(at("headroom.shareHalfLifeMs"), FLOW_HALF_LIFE_MESSAGE);
    }
    if let Some(w) = &f.service_weights {
        for (name, v) in [("input", w.input), ("output", w.output)] {
            if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
                fail(at(&format!("serviceWeights.{name}")), FLOW_WEIGHT_MESSAGE);
            }
        }
    }
}

fn check_tenancy(t: &TenancySpec, fail: &mut impl FnMut(String, &'static str)) {
    for (name, p) in &t.objectives {
        if name.is_empty() {
            fail("spec.tenancy.objectives".into(), OBJECTIVE_NAME_MESSAGE);
        }
        if let ObjectivePriority::Band(b) = p
            && PriorityBand::parse(b).is_none()
        {
            fail(
                format!("spec.tenancy.objectives.{name}"),
                OBJECTIVE_PRIORITY_MESSAGE,
            );
        }
    }
}

fn all_unique<'a>(items: impl Iterator<Item = &'a str>) -> bool {
    let mut seen = HashSet::new();
    items.into_iter().all(|x| seen.insert(x))
}

/// `schemars` transform for the spec node.
pub fn spec_rules(schema: &mut schemars::Schema) {
    add_rules(schema, SPEC_RULES);
}
/// `schemars` transform for a scheduler node.
pub fn scheduler_rules(schema: &mut schemars::Schema) {
    add_rules(schema, SCHEDULER_RULES);
}
/// `schemars` transform for a weights node.
pub fn weights_rules(schema: &mut schemars::Schema) {
    add_rules(schema, WEIGHTS_RULES);
}
/// `schemars` transform for the Gateway's listener list.
pub fn listeners_rules(schema: &mut schemars::Schema) {
    add_rules(schema, LISTENER_RULES);
}
/// `schemars` transform for the TLS node.
pub fn tls_rules(schema: &mut schemars::Schema) {
    add_rules(schema, TLS_RULES);
}
/// `schemars` transform for a tokenizer source node.
pub fn tokenizer_rules(schema: &mut schemars::Schema) {
    add_rules(schema, TOKENIZER_RULES);
}
/// `schemars` transform for a precise prefix routing node.
pub fn precise_rules(schema: &mut schemars::Schema) {
    add_rules(schema, PRECISE_RULES);
}
/// `schemars` transform for an outlier detection node.
pub fn outlier_rules(schema: &mut schemars::Schema) {
    add_rules(schema, OUTLIER_RULES);
}
/// `schemars` transform for the quotas' Redis node.
pub fn redis_rules(schema: &mut schemars::Schema) {
    add_rules(schema, REDIS_RULES);
}

fn add_rules(schema: &mut schemars::Schema, rules: &[CelRule]) {
    let list: Vec<Value> = rules
        .iter()
        .map(|r| json!({ "rule": r.rule, "message": r.message }))
        .collect();
    schema.insert("x-kubernetes-validations".to_owned(), Value::Array(list));
}

#[cfg(test)]
mod tests;
