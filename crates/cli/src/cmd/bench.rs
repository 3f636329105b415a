//! `infergate bench`.

/// Arguments of `infergate bench`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `infergate bench`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`infergate bench` is not part of this build yet")
}
