//! `infergate operator`.

/// Arguments of `infergate operator`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `infergate operator`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`infergate operator` is not part of this build yet")
}
