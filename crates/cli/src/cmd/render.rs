//! `infergate render`: prints the objects the operator would apply for a config, like
//! `helm template`, so a GitOps user can preview (or commit) them. It runs the operator's own
//! validation and render, so an invalid config fails here with the message the operator would
//! write into the config's `Accepted` condition.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use infergate_api::InferenceGatewayConfig;
use infergate_operator::render::{RenderOptions, render};
use serde::Deserialize as _;

/// Arguments of `infergate render`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A YAML file with one or more `InferenceGatewayConfig` documents (other kinds are skipped);
    /// `-` reads standard input.
    #[arg(long, short = 'f')]
    pub file: PathBuf,
    /// Image the body-based router and endpoint pickers run (default: this build's release).
    #[arg(long, env = "INFERGATE_IMAGE")]
    pub image: Option<String>,
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
    let out = render_documents(&text, &opts)?;
    std::io::stdout().lock().write_all(out.as_bytes())?;
    Ok(())
}

/// Every child of every `InferenceGatewayConfig` in `text`, as a YAML stream.
pub fn render_documents(text: &str, opts: &RenderOptions) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut configs = 0;
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml::Value::deserialize(doc)
            .with_context(|| format!("document {} is not YAML", i + 1))?;
        if value.is_null()
            || value.get("kind").and_then(|k| k.as_str()) != Some("InferenceGatewayConfig")
        {
            continue;
        }
        let cfg: InferenceGatewayConfig = serde_yaml::from_value(value)
            .with_context(|| format!("document {} is not a valid InferenceGatewayConfig", i + 1))?;
        let name = format!(
            "{}/{}",
            cfg.metadata
                .namespace
                .as_deref()
                .unwrap_or("<no namespace>"),
            cfg.metadata.name.as_deref().unwrap_or("<no name>")
        );
        let children =
            render(&cfg, opts).with_context(|| format!("InferenceGatewayConfig {name}"))?;
        configs += 1;
        for c in children {
            out.push_str(&format!("---\n# {} (from {name})\n", c.key()));
            out.push_str(&serde_yaml::to_string(&c.object)?);
        }
    }
    if configs == 0 {
        bail!("no InferenceGatewayConfig document found");
    }
    Ok(out)
}
