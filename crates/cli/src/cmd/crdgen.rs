//! `infergate crdgen`.

/// Arguments of `infergate crdgen`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `infergate crdgen`.
pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("`infergate crdgen` is not part of this build yet")
}
