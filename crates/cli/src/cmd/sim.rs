//! `infergate sim`.

/// Arguments of `infergate sim`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `infergate sim`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`infergate sim` is not part of this build yet")
}
