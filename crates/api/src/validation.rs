//! Admission rules of `InferenceGatewayConfig`, kept in one table per schema node.
//!
//! Each [`CelRule`] is written into the generated CRD as an `x-kubernetes-validations` entry (by
//! the `schemars` transforms below) and is checked again in Rust by [`validate`] with the same
//! message. The API server enforces the CEL form at admission; the operator runs the Rust form
//! before rendering and reports a failure as `Accepted=False` with the message, which covers
//! objects stored before the CRD carried a rule and clusters whose API server skips CEL.

use std::collections::HashSet;
use std::fmt;

use serde_json::{Value, json};

use crate::config::{
    FlowBandLimits, FlowControlSpec, InferenceGatewayConfigSpec, ListenerProtocol,
    ObjectivePriority, PriorityBand, QuotasSpec, SchedulerSpec, TenancySpec, TlsSpec, Weights,
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
];
/// Rules on each `spec.schedulers[*]`.
pub const SCHEDULER_RULES: &[CelRule] = &[PRESET_XOR_WEIGHTS];
/// Rules on each `spec.schedulers[*].weights`.
pub const WEIGHTS_RULES: &[CelRule] = &[WEIGHTS_NON_NEGATIVE, WEIGHTS_ONE_POSITIVE];
/// Rules on `spec.tls`.
pub const TLS_RULES: &[CelRule] = &[TLS_ONE_SOURCE];
/// Rules on `spec.quotas.redis`.
pub const REDIS_RULES: &[CelRule] = &[REDIS_ONE_PASSWORD];
/// Rules on `spec.schedulers[*].precisePrefix.tokenizer`.
pub const TOKENIZER_RULES: &[CelRule] = &[TOKENIZER_ONE_SOURCE, SUB_PATH_NEEDS_CLAIM];

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
/// `preset` and `weights` are exclusive.
pub const PRESET_XOR_WEIGHTS: CelRule = CelRule {
    rule: "!(has(self.preset) && has(self.weights))",
    message: "set either preset or weights on a scheduler, not both",
};
/// Weights are non-negative.
pub const WEIGHTS_NON_NEGATIVE: CelRule = CelRule {
    rule: "(!has(self.queue) || self.queue >= 0.0) && (!has(self.kvCache) || self.kvCache >= 0.0) && (!has(self.prefix) || self.prefix >= 0.0) && (!has(self.loraAffinity) || self.loraAffinity >= 0.0) && (!has(self.runningRequests) || self.runningRequests >= 0.0) && (!has(self.estimatedWait) || self.estimatedWait >= 0.0)",
    message: "scorer weights must be zero or positive numbers",
};
/// At least one weight is positive.
pub const WEIGHTS_ONE_POSITIVE: CelRule = CelRule {
    rule: "(has(self.queue) && self.queue > 0.0) || (has(self.kvCache) && self.kvCache > 0.0) || (has(self.prefix) && self.prefix > 0.0) || (has(self.loraAffinity) && self.loraAffinity > 0.0) || (has(self.runningRequests) && self.runningRequests > 0.0) || (has(self.estimatedWait) && self.estimatedWait > 0.0)",
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

/// The message for a JWKS URI that is not `https://` (the schema's `pattern: ^https://` is the
/// API server's side of the same check).
pub const JWKS_HTTPS_MESSAGE: &str = "spec.auth.jwt.provider.remoteJWKS.uri must start with https://: keys fetched in clear text could be replaced on the way";

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
    /// The rule's message.
    pub message: &'static str,
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
            message: rule.message,
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
            message: JWKS_HTTPS_MESSAGE,
        });
    }
    let mut fail_at = |field: String, message: &'static str| out.push(Violation { field, message });
    if let Some(q) = &spec.quotas {
        check_quotas(spec, q, &mut fail_at);
    }
    if let Some(f) = &spec.flow_control {
        check_flow_control(f, &mut fail_at);
    }
    if let Some(t) = &spec.tenancy {
        check_tenancy(t, &mut fail_at);
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
    if let Some(p) = &s.precise_prefix {
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

fn check_weights(i: usize, w: &Weights, fail: &mut impl FnMut(String, CelRule)) {
    let entries = w.entries();
    // NaN is rejected too: JSON cannot carry it, but a Rust caller can.
    if entries.iter().any(|(_, v)| v.is_nan() || *v < 0.0) {
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
/// `schemars` transform for the TLS node.
pub fn tls_rules(schema: &mut schemars::Schema) {
    add_rules(schema, TLS_RULES);
}
/// `schemars` transform for a tokenizer source node.
pub fn tokenizer_rules(schema: &mut schemars::Schema) {
    add_rules(schema, TOKENIZER_RULES);
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
