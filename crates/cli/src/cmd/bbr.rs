//! `infergate bbr`.

/// Arguments of `infergate bbr`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `infergate bbr`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`infergate bbr` is not part of this build yet")
}
