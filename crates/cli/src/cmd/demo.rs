//! `infergate demo`: round-robin versus infergate, live, on a small mixed H100/A10G fleet of
//! emulated pods on 127.0.0.1 behind the standalone gateway, with one minute of bursty traffic;
//! prints the comparison table and writes the report with plots. Needs nothing but this binary.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use infergate_bench::{Scenario, StderrBar};

/// The demo's scenario: data, like every other scenario (`benches/scenarios/demo.yaml`).
const DEMO: &str = include_str!("../../../../benches/scenarios/demo.yaml");

/// Arguments of `infergate demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Folder for the report (markdown, JSON, SVG plots); under `target/` by default, so a run
    /// from a clone leaves nothing untracked.
    #[arg(long, default_value = "target/infergate-demo")]
    out: PathBuf,
    /// Run on the discrete-event simulator (virtual time, seconds) instead of live HTTP.
    #[arg(long)]
    simulated: bool,
}

/// Runs `infergate demo`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let scenario = Scenario::from_yaml(DEMO, "demo").context("the built-in demo scenario")?;
    super::bench::writable(&args.out)?;
    let started = Instant::now();
    let report = if args.simulated {
        tokio::task::spawn_blocking(move || {
            infergate_bench::simulate::run(&scenario, "demo", &mut StderrBar::default())
        })
        .await??
    } else {
        infergate_bench::live::run(&scenario, "demo", &mut StderrBar::default()).await?
    };
    let written = report.write(&args.out)?;
    super::bench::print(&report, &written)?;
    let unserved = super::bench::unserved(&report);
    if !unserved.is_empty() {
        anyhow::bail!(
            "demo runs that completed no request:\n  {}",
            unserved.join("\n  ")
        );
    }
    tracing::info!(
        seconds = started.elapsed().as_secs(),
        report = %written.first().map(|p| p.display().to_string()).unwrap_or_default(),
        "demo finished"
    );
    Ok(())
}
