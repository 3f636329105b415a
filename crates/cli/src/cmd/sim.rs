//! `infergate sim`: serve a fleet of emulated model servers (`infergate_sim`) on 127.0.0.1.

use std::path::PathBuf;

use anyhow::Context;
use infergate_sim::{Catalog, FleetSpec, serve_fleet};

/// Arguments of `infergate sim`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The fleet file (YAML): pods with profile, engine flavour, LoRA adapters, faults.
    /// Examples are in `crates/sim/fleets/`.
    #[arg(
        long,
        short,
        env = "INFERGATE_SIM_FLEET",
        required_unless_present = "list_profiles"
    )]
    fleet: Option<PathBuf>,
    /// Print the built-in performance profiles and exit.
    #[arg(long)]
    list_profiles: bool,
    /// Check the fleet file and exit.
    #[arg(long)]
    check: bool,
}

/// Runs `infergate sim`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.list_profiles {
        let catalog = Catalog::builtin().context("built-in profiles")?;
        let mut out = String::new();
        for p in catalog.all() {
            out.push_str(&format!(
                "{:<30} {:<36} {} x{:<2} KV {:>7} tokens  decode {:>5.1} ms  prefill {:>6.0} tok/s\n",
                p.id,
                p.model,
                p.gpu,
                p.tensor_parallel,
                p.kv_capacity_tokens,
                p.decode_base_ms,
                1e6 / p.prefill_per_token_us,
            ));
        }
        eprint!("{out}");
        return Ok(());
    }
    let Some(path) = args.fleet else {
        anyhow::bail!("--fleet is required");
    };
    let spec = FleetSpec::from_file(&path)
        .with_context(|| format!("invalid fleet file {}", path.display()))?;
    if args.check {
        tracing::info!(pods = spec.pods.len(), "{} is valid", path.display());
        return Ok(());
    }
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let fleet = serve_fleet(&spec, shutdown)
        .await
        .context("cannot serve the fleet")?;
    for pod in &fleet.pods {
        tracing::info!(pod = %pod.name, addr = %pod.addr, "serving");
    }
    fleet.wait().await;
    Ok(())
}
