//! `infergate render`: prints the objects the operator would apply for a config, like
//! `helm template`, so a GitOps user can preview (or commit) them.
//!
//! Each `InferenceGatewayConfig` goes through what the cluster would do to it, in the same
//! order: the CRD's schema as the API server applies it (`apiVersion`, types, bounds, patterns,
//! and fields the API server would silently drop, refused here as the typos they usually are),
//! then the operator's own validation and render. An invalid config fails with every broken
//! field, and with the message the operator would write into the config's `Accepted` condition.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use infergate_api::schema::CrdSchema;
use infergate_api::{InferenceGatewayConfig, validation};
use infergate_operator::render::{PullPolicy, RenderOptions, render};
use serde::Deserialize as _;
use serde_json::Value;

/// Arguments of `infergate render`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A YAML file with one or more `InferenceGatewayConfig` documents (other kinds are skipped);
    /// `-` reads standard input.
    #[arg(long, short = 'f')]
    pub file: PathBuf,
    /// Namespace of the configs that set no `metadata.namespace` (as `kubectl apply -n`); a
    /// config that sets another one is refused.
    #[arg(long, short = 'n', value_name = "NS")]
    pub namespace: Option<String>,
    /// Image the body-based router and endpoint pickers run (default: this build's release).
    #[arg(long, env = "INFERGATE_IMAGE")]
    pub image: Option<String>,
    #[command(flatten)]
    pub pull: PullArgs,
}

/// How the pods the operator creates pull their image (`infergate operator` and `infergate
/// render` share these).
#[derive(Debug, Clone, clap::Args)]
pub struct PullArgs {
    /// `imagePullPolicy` of the body-based router and endpoint picker containers.
    #[arg(long, env = "INFERGATE_IMAGE_PULL_POLICY", value_enum, default_value_t = PullPolicy::IfNotPresent)]
    pub image_pull_policy: PullPolicy,
    /// A Secret the body-based router and endpoint picker pods pull their image with
    /// (`imagePullSecrets`); repeat the flag, or separate names with commas. Each must exist in
    /// the namespace of every config: a pod names Secrets of its own namespace only.
    #[arg(
        long = "image-pull-secret",
        env = "INFERGATE_IMAGE_PULL_SECRETS",
        value_delimiter = ',',
        value_name = "NAME",
        value_parser = secret_name
    )]
    pub image_pull_secrets: Vec<String>,
}

impl PullArgs {
    /// Sets `opts`' pull policy and Secrets (their names were checked as the flags were read).
    pub fn apply(self, opts: &mut RenderOptions) {
        opts.image_pull_policy = self.image_pull_policy;
        opts.image_pull_secrets = self.image_pull_secrets;
    }
}

/// `--image-pull-secret`'s parser: refuses a name Kubernetes would refuse for a Secret, so the
/// mistake is reported as the flag (or its variable) is read, not by the API server on every
/// pod the operator creates.
fn secret_name(name: &str) -> Result<String, String> {
    if is_dns_subdomain(name) {
        Ok(name.to_owned())
    } else {
        Err(
            "not a Secret name (lowercase letters, digits, '-' and '.', starting and ending \
             with a letter or digit, at most 253 characters)"
                .to_owned(),
        )
    }
}

/// An RFC 1123 DNS subdomain, what Kubernetes requires of a Secret's name.
fn is_dns_subdomain(name: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| alnum(b) || b == b'-' || b == b'.')
        && name.split('.').all(|part| {
            let b = part.as_bytes();
            b.first().is_some_and(|&c| alnum(c)) && b.last().is_some_and(|&c| alnum(c))
        })
}

/// Runs `infergate render`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let text = if args.file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let mut opts = RenderOptions::default();
    if let Some(image) = args.image {
        opts.image = image;
    }
    args.pull.apply(&mut opts);
    let out = render_documents(&text, &opts, args.namespace.as_deref())?;
    std::io::stdout().lock().write_all(out.as_bytes())?;
    Ok(())
}

/// Every child of every `InferenceGatewayConfig` in `text`, as a YAML stream. `namespace` is
/// `--namespace`: the namespace of a config that sets none.
pub fn render_documents(
    text: &str,
    opts: &RenderOptions,
    namespace: Option<&str>,
) -> anyhow::Result<String> {
    let schema = CrdSchema::new();
    let group = schema.api_version().split('/').next().unwrap_or_default();
    let mut out = String::new();
    let mut configs = 0;
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let n = i + 1;
        let value = serde_yaml::Value::deserialize(doc)
            .with_context(|| format!("document {n} is not YAML"))?;
        if value.is_null() {
            continue;
        }
        let kind = value.get("kind").and_then(|k| k.as_str());
        if kind != Some(schema.kind()) {
            // Another kind of our group is a misspelt kind, not a document for someone else.
            let api_version = value.get("apiVersion").and_then(|v| v.as_str());
            if let Some(v) = api_version.filter(|v| v.split('/').next() == Some(group)) {
                bail!(
                    "document {n}: {v} has no kind {}: the CRD defines {}",
                    kind.map_or_else(|| "(none)".to_owned(), |k| format!("{k:?}")),
                    schema.kind()
                );
            }
            continue;
        }
        // The API server reads JSON: YAML that JSON cannot carry is refused here as kubectl
        // would refuse it (serde_json would quietly turn `.inf` into null).
        if let Some(path) = non_finite(&value, String::new()) {
            bail!("document {n}: {path} is not a finite number, which JSON cannot carry");
        }
        let mut value: Value = serde_json::to_value(&value)
            .with_context(|| format!("document {n} cannot be sent as JSON"))?;
        let name = set_namespace(&mut value, namespace, n)?;
        if let Some(problems) = schema_problems(&schema, &mut value)? {
            bail!(
                "InferenceGatewayConfig {name} (document {n}) does not pass the CRD's schema:\n- {}",
                problems.join("\n- ")
            );
        }
        let cfg: InferenceGatewayConfig = serde_json::from_value(value)
            .with_context(|| format!("document {n} is not a valid InferenceGatewayConfig"))?;
        let children =
            render(&cfg, opts).with_context(|| format!("InferenceGatewayConfig {name}"))?;
        configs += 1;
        for c in children {
            out.push_str(&format!("---\n# {} (from {name})\n", c.key()));
            out.push_str(&yaml::to_string(&c.object)?);
        }
    }
    if configs == 0 {
        bail!("no InferenceGatewayConfig document found");
    }
    Ok(out)
}

/// Applies `--namespace` to a document as `kubectl apply -n` does: it fills in a missing
/// `metadata.namespace` and refuses a different one. Returns `namespace/name` for messages;
/// `n` numbers the document in them.
fn set_namespace(doc: &mut Value, flag: Option<&str>, n: usize) -> anyhow::Result<String> {
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<no name>")
        .to_owned();
    let own = doc.pointer("/metadata/namespace").and_then(Value::as_str);
    let namespace = match (own, flag) {
        (Some(own), Some(flag)) if own != flag => bail!(
            "InferenceGatewayConfig {name} (document {n}): metadata.namespace is {own:?} but \
             --namespace is {flag:?} (kubectl refuses the same mismatch): drop one, or make them \
             the same"
        ),
        (Some(own), _) => own.to_owned(),
        (None, Some(flag)) => {
            if let Some(Value::Object(meta)) = doc.get_mut("metadata") {
                meta.insert("namespace".to_owned(), Value::String(flag.to_owned()));
            }
            flag.to_owned()
        }
        (None, None) => bail!(
            "InferenceGatewayConfig {name} (document {n}) sets no metadata.namespace: set it in \
             the file or pass --namespace"
        ),
    };
    Ok(format!("{namespace}/{name}"))
}

/// What the API server would refuse in `doc` (or drop from it, for unknown fields), one line
/// per field; `None` when it admits it, with nulls the schema does not allow pruned from `doc`
/// as the API server prunes them. As the API server follows its schema's errors with its CEL
/// rules', the operator's validation is added when the document still reads as a config.
fn schema_problems(schema: &CrdSchema, doc: &mut Value) -> anyhow::Result<Option<Vec<String>>> {
    let violations = match schema.admit(doc) {
        Ok(()) => return Ok(None),
        Err(infergate_api::Error::Schema(v)) => v,
        Err(other) => return Err(other.into()),
    };
    let rules = match serde_json::from_value::<InferenceGatewayConfig>(doc.clone()) {
        Ok(cfg) => match validation::validate(&cfg.spec) {
            Err(infergate_api::Error::Invalid(rules)) => rules,
            _ => Vec::new(),
        },
        Err(_) => Vec::new(),
    };
    // A field both the schema and the operator check (a band's `maxRequests: 0`, an empty
    // `modelSelector`) is said once, in the operator's words, which say why.
    let mut lines: Vec<String> = violations
        .iter()
        .filter(|v| !rules.iter().any(|r| r.field == v.field))
        .map(ToString::to_string)
        .collect();
    lines.extend(rules.iter().map(ToString::to_string));
    Ok(Some(lines))
}

/// The path of the first number in `v` that is infinite or not a number (YAML's `.inf`, `.nan`).
fn non_finite(v: &serde_yaml::Value, path: String) -> Option<String> {
    match v {
        serde_yaml::Value::Number(n) if n.as_f64().is_some_and(|f| !f.is_finite()) => {
            Some(if path.is_empty() {
                "(document)".to_owned()
            } else {
                path
            })
        }
        serde_yaml::Value::Sequence(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| non_finite(item, format!("{path}[{i}]"))),
        serde_yaml::Value::Mapping(map) => map.iter().find_map(|(k, item)| {
            let key = k.as_str().map_or_else(|| format!("{k:?}"), str::to_owned);
            let sub = if path.is_empty() {
                key
            } else {
                format!("{path}.{key}")
            };
            non_finite(item, sub)
        }),
        serde_yaml::Value::Tagged(t) => non_finite(&t.value, path),
        _ => None,
    }
}

mod yaml;

#[cfg(test)]
mod tests;
