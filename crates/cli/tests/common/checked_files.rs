//! The files a configuration names, written good and bad for the `--check` tests: a certificate
//! and its key from a test CA, that CA, a key of another certificate, an empty API key file, and
//! a path with nothing there.
#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failure is a failed test"
)]

use std::path::Path;

/// The paths written into a folder, as they go into a YAML string.
pub struct CheckedFiles {
    /// A certificate for 127.0.0.1 (PEM).
    pub cert: String,
    /// Its key.
    pub key: String,
    /// The CA that issued it.
    pub ca: String,
    /// The key of another certificate of that CA.
    pub other_key: String,
    /// An API key file listing no key (valid, and no PEM certificate).
    pub keys: String,
    /// A path where no file is.
    pub missing: String,
}

impl CheckedFiles {
    /// Writes them into `dir`.
    pub fn write(dir: &Path) -> CheckedFiles {
        let ca = infergate_testkit::tls::TestCa::new("check test CA");
        let (cert, key) = ca.issue(&["127.0.0.1"]).write(dir);
        let ca_file = ca.write_ca(dir);
        let other_key = dir.join("other-key.pem");
        std::fs::write(&other_key, ca.issue(&["127.0.0.1"]).key_pem).unwrap();
        let keys = dir.join("keys.yaml");
        std::fs::write(&keys, "keys: []\n").unwrap();
        let text = |p: &Path| p.display().to_string();
        CheckedFiles {
            cert: text(&cert),
            key: text(&key),
            ca: text(&ca_file),
            other_key: text(&other_key),
            keys: text(&keys),
            missing: text(&dir.join("missing.pem")),
        }
    }
}
