//! The picker's model rewrites and canary splits, reloadable while it serves.
//!
//! `infergate picker --rewrites FILE` reads a YAML list of `InferenceModelRewrite`-style rules
//! ([`RewriteRule`]; the operator renders it from the CRD's `schedulers[].modelRewrites` into the
//! picker's ConfigMap) and [`RewriteTable::watch`] reloads it when its contents change. A
//! reload swaps the compiled table in one atomic store: a request reads the table once, so it
//! is routed wholly by the old rules or wholly by the new, and none is dropped. A file that does
//! not parse or validate is logged and the rules in force stay.
//!
//! The tenant a per-tenant rule matches is the reference's fairness id,
//! `x-llm-d-inference-fairness-id`, set by the gateway in front of the picker from a trusted
//! identity.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
pub use infergate_scheduler::{RewriteRule, Rewrites};

use crate::error::Error;

/// The request header naming the tenant (the reference's flow fairness id).
pub use infergate_pool::tenant::FAIRNESS_ID_HEADER;

/// How often [`RewriteTable::watch`] looks at the file.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// The compiled rules in force, shared by every stream of a picker. Cheap to clone.
#[derive(Clone, Default)]
pub struct RewriteTable {
    rules: Arc<ArcSwap<Rewrites>>,
}

impl std::fmt::Debug for RewriteTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewriteTable")
            .field("empty", &self.rules.load().is_empty())
            .finish()
    }
}

impl RewriteTable {
    /// A table holding `rules`.
    pub fn new(rules: Rewrites) -> Self {
        RewriteTable {
            rules: Arc::new(ArcSwap::from_pointee(rules)),
        }
    }

    /// The rules in force (hold the guard for one request only).
    pub fn load(&self) -> arc_swap::Guard<Arc<Rewrites>> {
        self.rules.load()
    }

    /// Replaces the rules.
    pub fn set(&self, rules: Rewrites) {
        self.rules.store(Arc::new(rules));
    }

    /// Reads and compiles a rewrites file (a YAML list of rules; empty or `[]` for none).
    pub fn read_file(path: &Path) -> Result<Rewrites, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        parse(&text).map_err(|e| match e {
            Parsed::Yaml(source) => Error::Yaml {
                path: path.to_owned(),
                source,
            },
            Parsed::Rules(source) => Error::Rewrites {
                path: path.to_owned(),
                source,
            },
        })
    }

    /// Reloads from `path` whenever its contents change, every `interval`, until `shutdown`.
    pub fn watch(
        &self,
        path: PathBuf,
        interval: Duration,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let table = self.clone();
        infergate_pool::watch::watch_file(
            path,
            "model rewrites",
            move || interval,
            move |path| Self::read_file(path).map(|rules| table.set(rules)),
            shutdown,
        )
    }
}

enum Parsed {
    Yaml(serde_yaml::Error),
    Rules(infergate_scheduler::RewriteError),
}

fn parse(text: &str) -> Result<Rewrites, Parsed> {
    let rules: Vec<RewriteRule> = if text.trim().is_empty() {
        Vec::new()
    } else {
        serde_yaml::from_str(text).map_err(Parsed::Yaml)?
    };
    Rewrites::new(&rules).map_err(Parsed::Rules)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn a_bad_file_names_its_path_and_keeps_nothing_half_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rewrites.yaml");
        std::fs::write(&path, "").unwrap();
        assert!(RewriteTable::read_file(&path).unwrap().is_empty());
        std::fs::write(
            &path,
            "- matches: [{ model: { value: a } }]\n  targets: [{ modelRewrite: b, weight: 0 }]\n",
        )
        .unwrap();
        let e = RewriteTable::read_file(&path).unwrap_err().to_string();
        assert!(e.contains("rewrites.yaml"), "{e}");
        std::fs::write(&path, "- targets: nope\n").unwrap();
        assert!(matches!(
            RewriteTable::read_file(&path),
            Err(Error::Yaml { .. })
        ));
    }
}
