//! `infergate gateway`.

/// Arguments of `infergate gateway`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `infergate gateway`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`infergate gateway` is not part of this build yet")
}
