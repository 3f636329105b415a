//! API keys: a table from each key's SHA-256 to its tenant and models, inline keys plus a key
//! file re-read when its contents change.
//!
//! Only hashes are ever held: the presented key is hashed (SHA-256, `ring::digest`) and looked up.
//! The lookup compares digests, not keys, so its timing says nothing useful about any stored key
//! (finding a key from its digest's prefix is a preimage search). The table lives in an
//! [`ArcSwap`]: a request reads it without a lock, and a reload swaps in a whole new table.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use infergate_pool::ErrorChain;

use super::ModelAccess;
use crate::config::auth::{ApiKeyConfig, ApiKeyFile, ApiKeysConfig, check_unique};

/// What a key grants.
pub(crate) struct Grant {
    pub(crate) tenant: Arc<str>,
    pub(crate) models: ModelAccess,
}

type Table = HashMap<[u8; 32], Arc<Grant>>;

/// Why the key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read.
    #[error("cannot read the API key file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid key list.
    #[error("invalid API key file {}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What was wrong, with the line.
        #[source]
        source: serde_yaml::Error,
    },
    /// A hash is listed twice (inline and in the file, or twice in the file).
    #[error("API key file {}: {reason}", path.display())]
    Duplicate {
        /// The file.
        path: PathBuf,
        /// Which entry.
        reason: String,
    },
}

/// The key table and where it comes from.
pub(crate) struct KeyStore {
    inline: Vec<ApiKeyConfig>,
    file: Option<PathBuf>,
    table: ArcSwap<Table>,
}

fn grant(k: &ApiKeyConfig) -> Arc<Grant> {
    Arc::new(Grant {
        tenant: Arc::from(k.tenant.as_str()),
        models: ModelAccess::from_list(&k.models),
    })
}

impl KeyStore {
    /// Loads the inline keys and the file (which must be readable and valid at start).
    pub(crate) fn new(config: &ApiKeysConfig) -> Result<(KeyStore, Option<Vec<u8>>), KeyFileError> {
        let store = KeyStore {
            inline: config.keys.clone(),
            file: config.file.clone(),
            table: ArcSwap::from_pointee(Table::new()),
        };
        let text = match &store.file {
            None => {
                store.table.store(Arc::new(store.build(&[])));
                None
            }
            Some(path) => {
                let text = read(path)?;
                store.load(path, &text)?;
                Some(text)
            }
        };
        Ok((store, text))
    }

    fn build(&self, from_file: &[ApiKeyConfig]) -> Table {
        self.inline
            .iter()
            .chain(from_file)
            .map(|k| (k.sha256, grant(k)))
            .collect()
    }

    fn load(&self, path: &Path, text: &[u8]) -> Result<usize, KeyFileError> {
        let text = String::from_utf8_lossy(text);
        let file = ApiKeyFile::from_yaml(&text).map_err(|source| KeyFileError::Invalid {
            path: path.to_owned(),
            source,
        })?;
        let all: Vec<ApiKeyConfig> = self.inline.iter().chain(&file.keys).cloned().collect();
        check_unique(&all).map_err(|reason| KeyFileError::Duplicate {
            path: path.to_owned(),
            reason,
        })?;
        let table = self.build(&file.keys);
        let n = table.len();
        self.table.store(Arc::new(table));
        Ok(n)
    }

    /// The grant of the key whose SHA-256 is `digest`.
    pub(crate) fn lookup(&self, digest: &[u8; 32]) -> Option<Arc<Grant>> {
        self.table.load().get(digest).cloned()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, KeyFileError> {
    std::fs::read(path).map_err(|source| KeyFileError::Read {
        path: path.to_owned(),
        source,
    })
}

/// SHA-256 of a presented key.
pub(crate) fn digest(key: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, key);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Re-reads the key file every `every` while `store` lives, and swaps in its keys when its
/// contents changed and are valid (a bad file is logged and the keys in force stay).
pub(crate) async fn watch_file(
    store: std::sync::Weak<KeyStore>,
    mut last: Vec<u8>,
    every: Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        let Some(s) = store.upgrade() else { return };
        let Some(path) = s.file.clone() else { return };
        let text = match read(&path) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(
                    error = %ErrorChain(&e),
                    "API key file unreadable; keeping the keys in force"
                );
                continue;
            }
        };
        if text == last {
            continue;
        }
        match s.load(&path, &text) {
            Ok(n) => tracing::info!(keys = n, file = %path.display(), "API keys reloaded"),
            Err(e) => {
                tracing::warn!(
                    error = %ErrorChain(&e),
                    "API key file rejected; keeping the keys in force"
                )
            }
        }
        last = text;
    }
}
