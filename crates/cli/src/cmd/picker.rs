//! `infergate picker`.

/// Arguments of `infergate picker`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `infergate picker`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`infergate picker` is not part of this build yet")
}
