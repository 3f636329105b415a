//! The generated CRD's structural schema, applied to a document as the API server applies it.
//!
//! An `InferenceGatewayConfig` sent to a cluster meets the CRD's `openAPIV3Schema` before anything
//! of ours sees it: types, bounds, lengths, patterns, enums and required fields are checked, and a
//! field the schema does not declare is *pruned* — dropped without a word. Offline (`infergate
//! render`) nothing stands in for the API server, so [`CrdSchema::admit`] does its part: it walks
//! the document alongside the schema that [`InferenceGatewayConfig::crd`] generates (the one
//! `infergate crdgen` writes to `crds/`) and lists every field that breaks it, each with its path.
//! A field the API server would prune is refused rather than dropped, because offline it is almost
//! always a typo that would otherwise vanish on the way to the cluster.
//!
//! What is checked is what Kubernetes' structural schemas use, read as the API server reads them
//! (OpenAPI v3, not JSON Schema): `nullable`, `x-kubernetes-int-or-string` and
//! `x-kubernetes-preserve-unknown-fields` included, `exclusiveMinimum` as a flag, lengths in
//! characters, patterns as RE2 (Go) expressions. A `null` where the schema does not allow one is
//! pruned, as the API server prunes it. The CEL rules (`x-kubernetes-validations`) are not
//! evaluated here: [`crate::validation::validate`] checks the same table in Rust. `status` is not
//! checked (the status subresource ignores it on create and update), nor is `metadata` beyond its
//! shape: the API server owns both.
//!
//! [`InferenceGatewayConfig::crd`]: kube::CustomResourceExt::crd

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt as _;
use serde_json::{Map, Value};

use crate::config::InferenceGatewayConfig;
use crate::error::Error;

/// Patterns of the CRD and what they mean, for a message a person can act on. A pattern missing
/// here is still checked; its message then quotes the expression (a test lists the CRD's patterns
/// against this table).
pub const PATTERN_HINTS: &[(&str, &str)] = &[
    (
        "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        "a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit (it becomes part of object names)",
    ),
    (
        "^([0-9]{1,5}(h|m|s|ms)){1,4}$",
        "a Gateway API duration: 1 to 4 groups of up to 5 digits and a unit (h, m, s or ms), such as 30s, 5m or 1h30m",
    ),
    ("^https://", "an https:// URL"),
    (
        "^[^/.][^\\x00]*$",
        "a relative path that starts with neither '/' nor '.'",
    ),
];

/// One field that breaks the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaViolation {
    /// Path of the field, e.g. `spec.schedulers[0].targetPort` (`apiVersion` and `kind` for the
    /// document's type).
    pub field: String,
    /// What is wrong with its value.
    pub problem: String,
}

impl fmt::Display for SchemaViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

/// The CRD's schema, with the `apiVersion` and `kind` it serves; build it once per run.
#[derive(Debug, Clone)]
pub struct CrdSchema {
    api_version: String,
    kind: String,
    root: JSONSchemaProps,
}

impl CrdSchema {
    /// The schema of the CRD [`crate::crd::crds`] generates (its served version).
    pub fn new() -> Self {
        let crd = InferenceGatewayConfig::crd();
        let version = crd
            .spec
            .versions
            .iter()
            .find(|v| v.served)
            .or(crd.spec.versions.first());
        let root = version
            .and_then(|v| v.schema.as_ref())
            .and_then(|s| s.open_api_v3_schema.clone())
            .unwrap_or_default();
        let api_version = format!(
            "{}/{}",
            crd.spec.group,
            version.map_or("", |v| v.name.as_str())
        );
        CrdSchema {
            api_version,
            kind: crd.spec.names.kind,
            root,
        }
    }

    /// `group/version` of the CRD, e.g. `infergate.dev/v1alpha1`.
    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// The kind, `InferenceGatewayConfig`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Checks `document` (one whole object, as JSON) as the API server would on create: its
    /// `apiVersion` and `kind`, then every field of `spec` against the schema. Nulls the schema
    /// does not allow are removed from `document`, as the API server prunes them; everything
    /// else is left as it is. Every broken rule is listed ([`Error::Schema`]).
    pub fn admit(&self, document: &mut Value) -> Result<(), Error> {
        let mut walk = Walk::default();
        let Value::Object(map) = document else {
            walk.fail(
                "(document)",
                format!(
                    "must be a mapping with apiVersion, kind, metadata and spec, not {}",
                    describe(document)
                ),
            );
            return Err(Error::Schema(walk.out));
        };
        self.check_type(map, &mut walk);
        match map.get("metadata") {
            None | Some(Value::Object(_)) => {}
            Some(other) => walk.fail(
                "metadata",
                format!("must be a mapping, not {}", describe(other)),
            ),
        }
        // apiVersion, kind and metadata are the API server's own; status belongs to the status
        // subresource, which ignores it on create and update. The rest is the schema's.
        let mut own = Map::new();
        for key in ["apiVersion", "kind", "metadata", "status"] {
            if let Some((k, v)) = map.remove_entry(key) {
                own.insert(k, v);
            }
        }
        let mut rest = Value::Object(std::mem::take(map));
        walk.node(&self.root, &mut rest, &mut String::new());
        if let Value::Object(rest) = rest {
            *map = rest;
        }
        map.extend(own);
        if walk.out.is_empty() {
            Ok(())
        } else {
            Err(Error::Schema(walk.out))
        }
    }

    fn check_type(&self, map: &Map<String, Value>, walk: &mut Walk) {
        for (field, want, what) in [
            ("apiVersion", &self.api_version, "the CRD serves"),
            ("kind", &self.kind, "the CRD's kind is"),
        ] {
            match map.get(field) {
                Some(Value::String(got)) if got == want => {}
                Some(Value::String(got)) => {
                    walk.fail(field, format!("is {got:?}, but {what} {want}"));
                }
                Some(other) => walk.fail(
                    field,
                    format!("must be the string {want}, not {}", describe(other)),
                ),
                None => walk.fail(field, format!("is missing: set it to {want}")),
            }
        }
    }
}

impl Default for CrdSchema {
    fn default() -> Self {
        Self::new()
    }
}

/// One pass over a document: the violations found and the patterns compiled so far.
#[derive(Default)]
struct Walk {
    out: Vec<SchemaViolation>,
    patterns: HashMap<String, Option<regex::Regex>>,
}

impl Walk {
    fn fail(&mut self, field: &str, problem: String) {
        self.out.push(SchemaViolation {
            field: if field.is_empty() {
                "(document)".to_owned()
            } else {
                field.to_owned()
            },
            problem,
        });
    }

    /// Checks `value` at `path` against `schema`.
    fn node(&mut self, schema: &JSONSchemaProps, value: &mut Value, path: &mut String) {
        if value.is_null() {
            if schema.nullable != Some(true) {
                self.fail(path, format!("must be {}, not null", expected(schema)));
            }
            return;
        }
        if schema.x_kubernetes_int_or_string == Some(true) {
            if !(is_integer(value) || value.is_string()) {
                self.fail(
                    path,
                    format!("must be an integer or a string, not {}", describe(value)),
                );
                return;
            }
        } else if let Some(ty) = schema.type_.as_deref()
            && !has_type(value, ty)
        {
            self.fail(
                path,
                format!("must be {}, not {}", expected(schema), describe(value)),
            );
            return;
        }
        if let Some(options) = &schema.enum_
            && !options.iter().any(|o| &o.0 == value)
        {
            let options: Vec<String> = options.iter().map(|o| plain(&o.0)).collect();
            self.fail(
                path,
                format!("{} is not one of {}", quoted(value), options.join(", ")),
            );
        }
        match value {
            Value::Number(n) => self.number(schema, n, path),
            Value::String(s) => self.string(schema, s, path),
            Value::Array(items) => self.array(schema, items, path),
            Value::Object(map) => self.object(schema, map, path),
            Value::Null | Value::Bool(_) => {}
        }
    }

    fn number(&mut self, schema: &JSONSchemaProps, n: &serde_json::Number, path: &str) {
        let Some(v) = n.as_f64() else {
            return;
        };
        if let Some(min) = schema.minimum {
            if schema.exclusive_minimum == Some(true) && v <= min {
                self.fail(path, format!("must be greater than {} (is {n})", num(min)));
            } else if v < min {
                self.fail(path, format!("must be at least {} (is {n})", num(min)));
            }
        }
        if let Some(max) = schema.maximum {
            if schema.exclusive_maximum == Some(true) && v >= max {
                self.fail(path, format!("must be less than {} (is {n})", num(max)));
            } else if v > max {
                self.fail(path, format!("must be at most {} (is {n})", num(max)));
            }
        }
    }

    fn string(&mut self, schema: &JSONSchemaProps, s: &str, path: &str) {
        // Kubernetes counts characters (runes), not bytes.
        let len = i64::try_from(s.chars().count()).unwrap_or(i64::MAX);
        match schema.min_length {
            Some(1) if len == 0 => self.fail(path, "must not be empty".to_owned()),
            Some(min) if len < min => self.fail(
                path,
                format!("{s:?} is {len} characters long; the least is {min}"),
            ),
            _ => {}
        }
        if let Some(max) = schema.max_length
            && len > max
        {
            self.fail(path, format!("is {len} characters long; the most is {max}"));
        }
        if let Some(pattern) = &schema.pattern {
            let re = self
                .patterns
                .entry(pattern.clone())
                .or_insert_with(|| regex::Regex::new(pattern).ok());
            let problem = match re {
                Some(re) if re.is_match(s) => None,
                Some(_) => Some(match hint(pattern) {
                    Some(hint) => format!("{s:?} is not {hint}"),
                    None => format!("{s:?} does not match the pattern {pattern}"),
                }),
                // The API server refuses such a CRD; nothing to check a value against.
                None => None,
            };
            if let Some(problem) = problem {
                self.fail(path, problem);
            }
        }
    }

    fn array(&mut self, schema: &JSONSchemaProps, items: &mut [Value], path: &mut String) {
        let n = i64::try_from(items.len()).unwrap_or(i64::MAX);
        if let Some(min) = schema.min_items
            && n < min
        {
            self.fail(path, format!("lists {n} items; the least is {min}"));
        }
        if let Some(max) = schema.max_items
            && n > max
        {
            self.fail(path, format!("lists {n} items; the most is {max}"));
        }
        let Some(JSONSchemaPropsOrArray::Schema(item)) = &schema.items else {
            return;
        };
        for (i, v) in items.iter_mut().enumerate() {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            self.node(item, v, path);
            path.truncate(len);
        }
    }

    fn object(
        &mut self,
        schema: &JSONSchemaProps,
        map: &mut Map<String, Value>,
        path: &mut String,
    ) {
        let empty = BTreeMap::new();
        let properties = schema.properties.as_ref().unwrap_or(&empty);
        let preserve = schema.x_kubernetes_preserve_unknown_fields == Some(true);
        let keys: Vec<String> = map.keys().cloned().collect();
        for key in keys {
            let sub = match (properties.get(&key), &schema.additional_properties) {
                (Some(p), _) => Some(p),
                (None, Some(JSONSchemaPropsOrBool::Schema(s))) => Some(&**s),
                (None, Some(JSONSchemaPropsOrBool::Bool(true))) => None,
                (None, _) if preserve => None,
                (None, _) => {
                    let field = child(path, &key);
                    self.fail(&field, unknown_field(&key, properties));
                    continue;
                }
            };
            let Some(sub) = sub else {
                continue;
            };
            let Some(v) = map.get_mut(&key) else {
                continue;
            };
            // The API server prunes a null the schema does not allow before it validates.
            if v.is_null() && sub.nullable != Some(true) {
                map.remove(&key);
                continue;
            }
            let inner = child(path, &key);
            let outer = std::mem::replace(path, inner);
            self.node(sub, v, path);
            *path = outer;
        }
        for name in schema.required.iter().flatten() {
            if !map.contains_key(name) {
                self.fail(&child(path, name), "is required but missing".to_owned());
            }
        }
        let n = i64::try_from(map.len()).unwrap_or(i64::MAX);
        if let Some(max) = schema.max_properties
            && n > max
        {
            self.fail(path, format!("has {n} entries; the most is {max}"));
        }
        if let Some(min) = schema.min_properties
            && n < min
        {
            self.fail(path, format!("has {n} entries; the least is {min}"));
        }
    }
}

/// `path.key`, or `path["key"]` for a key that is not a plain name (a label such as
/// `app.kubernetes.io/name`).
fn child(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    match (path.is_empty(), plain) {
        (true, true) => key.to_owned(),
        (false, true) => format!("{path}.{key}"),
        (_, false) => format!("{path}[{key:?}]"),
    }
}

/// The message for a field the schema does not declare.
fn unknown_field(key: &str, known: &BTreeMap<String, JSONSchemaProps>) -> String {
    let mut msg = String::from(
        "unknown field: the API server would drop it silently, so it would have no effect",
    );
    let close = known
        .keys()
        .map(|k| {
            (
                distance(&key.to_ascii_lowercase(), &k.to_ascii_lowercase()),
                k,
            )
        })
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min();
    if let Some((_, k)) = close {
        msg.push_str(&format!(" (did you mean {k}?)"));
    } else if known.is_empty() {
        msg.push_str(" (no field is declared here)");
    } else if known.len() <= 12 {
        let names: Vec<&str> = known.keys().map(String::as_str).collect();
        msg.push_str(&format!(" (fields here: {})", names.join(", ")));
    }
    msg
}

/// Edit distance (insertions, deletions, substitutions and swaps of neighbours) between `a`
/// and `b`, for a typo's suggestion.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

fn hint(pattern: &str) -> Option<&'static str> {
    PATTERN_HINTS
        .iter()
        .find(|(p, _)| *p == pattern)
        .map(|(_, h)| *h)
}

fn is_integer(v: &Value) -> bool {
    matches!(v, Value::Number(n) if n.is_i64() || n.is_u64())
}

fn has_type(v: &Value, ty: &str) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => is_integer(v),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        // A type this checker does not know is left to the API server.
        _ => true,
    }
}

/// What `schema` takes, as a person says it.
fn expected(schema: &JSONSchemaProps) -> &'static str {
    if schema.x_kubernetes_int_or_string == Some(true) {
        return "an integer or a string";
    }
    match schema.type_.as_deref() {
        Some("object") => "a mapping",
        Some("array") => "a list",
        Some("string") => "a string",
        Some("integer") => "an integer",
        Some("number") => "a number",
        Some("boolean") => "true or false",
        _ => "a value",
    }
}

/// What `v` is, with the value itself when it is short.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) if is_integer(v) => format!("the integer {n}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(_) => format!("the string {}", quoted(v)),
        Value::Array(a) => format!("a list of {} items", a.len()),
        Value::Object(_) => "a mapping".to_owned(),
    }
}

/// A scalar as it was written, strings quoted (and cut at 60 characters).
fn quoted(v: &Value) -> String {
    match v {
        Value::String(s) if s.chars().count() > 60 => {
            format!("{:?}…", s.chars().take(60).collect::<String>())
        }
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// An enum option as a person writes it (strings bare).
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A bound without a trailing `.0`.
fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests;
