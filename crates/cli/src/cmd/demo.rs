//! `infergate demo`.

/// Arguments of `infergate demo`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `infergate demo`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`infergate demo` is not part of this build yet")
}
