//! `infergate crdgen`: writes infergate's CustomResourceDefinitions as YAML.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;

/// Arguments of `infergate crdgen`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Folder to write one `<plural>.<group>.yaml` per CRD into; standard output when unset.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs `infergate crdgen`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    for (file, crd) in infergate_api::crd::crds() {
        let yaml = infergate_api::crd::to_yaml(&crd)?;
        match &args.out {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                let path = dir.join(&file);
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            None => {
                let mut out = std::io::stdout().lock();
                out.write_all(b"---\n")?;
                out.write_all(yaml.as_bytes())?;
            }
        }
    }
    Ok(())
}
