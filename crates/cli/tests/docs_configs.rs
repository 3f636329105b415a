//! Every gateway configuration the documentation shows is one `infergate gateway --check`
//! accepts: each fenced `yaml` block of the pages a new user follows (README.md,
//! docs/gateway.md, docs/configuration.md, docs/flow-control.md, docs/precise-prefix.md), run
//! through the real binary.
//!
//! A block is a whole gateway file when it has a top-level `models:`; otherwise it is a section
//! shown on its own (`auth:`, `quotas:`, `flowControl:` with `tenancy:`, `rewrites:`) and is
//! checked inside the smallest file that can hold it: an API key naming a tenant (so that
//! per-tenant quotas and rewrites apply) and the models it names. The files a block names under
//! `/etc/infergate/` (certificates, keys, CA bundles, an API key file) and the tokenizer folder
//! are swapped for real ones in a temporary folder, since `--check` loads them as a start does;
//! a relative tokenizer folder is taken from the repository's root, where the docs run it.
//! Blocks that are not gateway files (a `bench` scenario) are recognised by their first key and
//! listed, so that a new kind of block is not skipped unnoticed.
//!
//! The same for the global router's files in docs/global.md (`infergate global --check`) and the
//! emulated fleets of docs/global.md and docs/simulator.md (`infergate sim --check`), and the
//! gateway files of docs/global.md (`infergate gateway --check`, their relative certificate files
//! made real). The picker has no check mode, so docs/extproc.md's endpoints file is not run
//! here.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::path::{Path, PathBuf};

#[path = "common/checked_files.rs"]
#[allow(dead_code, reason = "only the good files are named here")]
mod checked_files;
#[path = "common/printed_error.rs"]
mod printed_error;
use checked_files::CheckedFiles;

/// The pages whose YAML blocks are checked, from the repository's root.
const PAGES: [&str; 5] = [
    "README.md",
    "docs/gateway.md",
    "docs/configuration.md",
    "docs/flow-control.md",
    "docs/precise-prefix.md",
];

/// First keys of blocks that are not gateway files, and what they are.
const NOT_GATEWAY_FILES: [(&str, &str); 1] = [("workload", "a `bench` scenario")];

/// One fenced `yaml` block: the page, the line of its opening fence, its text.
struct Block {
    page: &'static str,
    line: usize,
    text: String,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fenced `yaml` blocks of `page`, indented fences included.
fn yaml_blocks(page: &'static str) -> Vec<Block> {
    let doc = std::fs::read_to_string(repo().join(page)).unwrap();
    let mut blocks = Vec::new();
    let mut open: Option<(usize, bool, Vec<&str>)> = None;
    for (i, line) in doc.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(lang)) => open = Some((i + 1, lang.trim() == "yaml", Vec::new())),
            (Some((start, is_yaml, body)), Some(_)) => {
                if *is_yaml {
                    blocks.push(Block {
                        page,
                        line: *start,
                        text: body.join("\n") + "\n",
                    });
                }
                open = None;
            }
            (Some((_, _, body)), None) => body.push(line),
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{page}: a fence is never closed");
    blocks
}

/// The block's top-level keys, in order.
fn top_keys(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_alphabetic()))
        .filter_map(|l| l.split_once(':').map(|(k, _)| k))
        .collect()
}

/// The block with every path it names under `/etc/infergate/`, and its tokenizer, swapped for
/// a real file of the same kind in `files`; a relative tokenizer folder (the emulator's walk in
/// docs/precise-prefix.md, run from the repository's root) is made absolute from the root.
fn with_real_files(text: &str, files: &CheckedFiles, tokenizer: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let line = match line.find("/etc/infergate/") {
            Some(at) => {
                let end = line[at..]
                    .find(|c: char| c.is_whitespace() || c == ',' || c == '}')
                    .map_or(line.len(), |n| at + n);
                let path = &line[at..end];
                let real = if path.ends_with(".crt") {
                    &files.cert
                } else if path.ends_with(".key") {
                    &files.key
                } else if path.ends_with(".pem") {
                    &files.ca
                } else if path.ends_with(".yaml") {
                    &files.keys
                } else {
                    panic!("no stand-in for `{path}`: add one to with_real_files");
                };
                format!("{}{real}{}", &line[..at], &line[end..])
            }
            None => line.to_owned(),
        };
        let line = match line.split_once("tokenizer: ") {
            Some((head, tail)) if tail.starts_with('/') => {
                let rest = tail.find(' ').map_or("", |n| &tail[n..]);
                format!("{head}tokenizer: {tokenizer}{rest}")
            }
            Some((head, tail)) if !tail.trim().is_empty() => {
                let end = tail.find(' ').unwrap_or(tail.len());
                let from_root = repo().join(&tail[..end]).display().to_string();
                format!("{head}tokenizer: {from_root}{}", &tail[end..])
            }
            _ => line,
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// A whole gateway file holding the section `block` shows: an API key of tenant `team-b` (the
/// tenant the documented rewrites name) unless the block has its own `auth`, and the models the
/// block's rewrites target, or one model.
fn around(block: &str) -> String {
    let keys = top_keys(block);
    let mut file = String::new();
    if !keys.contains(&"auth") {
        // `printf %s test | sha256sum`
        file.push_str(
            "auth:\n  apiKeys:\n    keys:\n      - { sha256: \
             9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, \
             tenant: team-b, models: [\"*\"] }\n",
        );
    }
    file.push_str(block);
    let mut targets: Vec<&str> = block
        .split("modelRewrite: ")
        .skip(1)
        .filter_map(|t| t.split([',', ' ', '}']).next())
        .collect();
    targets.sort_unstable();
    targets.dedup();
    if targets.is_empty() {
        targets.push("llama-3-8b");
    }
    file.push_str("models:\n");
    for (i, model) in targets.iter().enumerate() {
        file.push_str(&format!(
            "  - name: {model}\n    endpoints: [127.0.0.1:{}]\n",
            9000 + i
        ));
    }
    file
}

#[test]
fn every_gateway_configuration_in_the_docs_passes_check() {
    let dir = tempfile::tempdir().unwrap();
    let files = CheckedFiles::write(dir.path());
    let tokenizer = repo()
        .join("crates/tokenizer/tests/fixtures/tiny")
        .display()
        .to_string();
    let mut checked = Vec::new();
    let mut skipped = Vec::new();
    let mut failures = Vec::new();
    for block in PAGES.into_iter().flat_map(yaml_blocks) {
        let at = format!("{}:{}", block.page, block.line);
        let keys = top_keys(&block.text);
        let first = keys.first().copied().unwrap_or_default();
        if let Some((_, what)) = NOT_GATEWAY_FILES.iter().find(|(k, _)| *k == first) {
            skipped.push(format!("{at} ({what})"));
            continue;
        }
        let text = with_real_files(&block.text, &files, &tokenizer);
        let body = if keys.contains(&"models") {
            text
        } else {
            around(&text)
        };
        let file = dir.path().join(format!("block-{}.yaml", checked.len()));
        std::fs::write(&file, &body).unwrap();
        // A documented `passwordEnv` names a variable the operator sets.
        let (ok, printed) = printed_error::run_with_config(
            "gateway",
            &file,
            &["--check"],
            &[("REDIS_PASSWORD", "secret")],
            "INFERGATE_GATEWAY_CONFIG",
        );
        if !ok {
            failures.push(format!("{at}:\n{body}\n--check said:\n{printed}"));
        }
        checked.push(at);
    }
    eprintln!("checked {checked:?}; not gateway files: {skipped:?}");
    assert!(
        failures.is_empty(),
        "documented configurations refused by --check:\n\n{}",
        failures.join("\n\n")
    );
    // The quick start, the reference, authentication, quotas, rewrites and flow control.
    assert!(checked.len() >= 6, "checked only {checked:?}");
    assert!(
        skipped.len() <= 1,
        "skipped more than the scenario: {skipped:?}"
    );
}

/// `block` with each relative file a `tls:` section names (`certFile: east.crt`) made real: a
/// stand-in of the same kind from `files`, copied to that name in `dir`, named by its absolute
/// path (the docs' walks run from the folder holding the certificates).
fn with_relative_files(block: &str, files: &CheckedFiles, dir: &Path) -> String {
    let mut out = String::new();
    for line in block.lines() {
        let mut line = line.to_owned();
        for field in ["certFile: ", "keyFile: ", "clientCaFile: ", "caFile: "] {
            let Some(at) = line.find(field).map(|n| n + field.len()) else {
                continue;
            };
            let end = line[at..]
                .find(|c: char| c.is_whitespace() || c == ',' || c == '}')
                .map_or(line.len(), |n| at + n);
            let name = line[at..end].to_owned();
            if name.starts_with('/') {
                continue;
            }
            let stand_in = if name.ends_with(".crt") {
                &files.cert
            } else if name.ends_with(".key") {
                &files.key
            } else if name.ends_with(".pem") {
                &files.ca
            } else {
                panic!("no stand-in for `{name}`: add one to with_relative_files");
            };
            let real = dir.join(&name);
            std::fs::copy(stand_in, &real).unwrap();
            line = format!("{}{}{}", &line[..at], real.display(), &line[end..]);
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The gateway files docs/global.md shows (the walk's gateway, the one with HTTPS on its front
/// door, its `tls:` section with a client CA, an `adminTls:` section) pass `infergate gateway --check`, their
/// relative certificate, key and CA files made real.
#[test]
fn every_gateway_file_in_the_global_router_docs_passes_check() {
    let dir = tempfile::tempdir().unwrap();
    let files = CheckedFiles::write(dir.path());
    let mut checked = Vec::new();
    let mut failures = Vec::new();
    for block in yaml_blocks("docs/global.md") {
        let keys = top_keys(&block.text);
        let gateway_file = keys.contains(&"models") && !keys.contains(&"clusters");
        let tls_section = keys == ["tls"] || keys == ["adminTls"];
        if !gateway_file && !tls_section {
            continue;
        }
        let at = format!("{}:{}", block.page, block.line);
        let text = with_relative_files(&block.text, &files, dir.path());
        let body = if gateway_file { text } else { around(&text) };
        let file = dir.path().join(format!("gateway-{}.yaml", checked.len()));
        std::fs::write(&file, &body).unwrap();
        let (ok, printed) = printed_error::run_with_config(
            "gateway",
            &file,
            &["--check"],
            &[],
            "INFERGATE_GATEWAY_CONFIG",
        );
        if !ok {
            failures.push(format!("{at}:\n{body}\n--check said:\n{printed}"));
        }
        checked.push(at);
    }
    eprintln!("checked {checked:?}");
    assert!(
        failures.is_empty(),
        "gateway files of docs/global.md refused by gateway --check:\n\n{}",
        failures.join("\n\n")
    );
    // The walk's gateway (east; west differs only in its addresses), HTTPS on the front door,
    // the client CA, HTTPS on the admin port.
    assert!(checked.len() >= 4, "checked only {checked:?}");
}

/// First keys of docs/global.md's blocks that are not global router files, and what they are.
const NOT_ROUTER_FILES: [(&str, &str); 6] = [
    ("pods", "an `infergate sim` fleet"),
    ("models", "a gateway file"),
    ("tls", "a gateway's `tls:` section"),
    ("adminTls", "a gateway's `adminTls:` section"),
    ("globalRouter", "Helm values"),
    ("", "a cluster's entry shown alone"),
];

/// A whole global router file holding the section `block` shows: no authentication, a tenant
/// header unless the block has its own `tenancy`, and one cluster.
fn around_router(block: &str) -> String {
    let keys = top_keys(block);
    let mut file = String::from("auth: none\n");
    if !keys.contains(&"tenancy") {
        file.push_str("tenancy: { tenantHeader: x-tenant }\n");
    }
    file.push_str(block);
    file.push_str(
        "clusters:\n  - { name: east, url: \"http://127.0.0.1:8180\", region: us-east,\n      \
         cost: { inputPerMillion: 0.5, outputPerMillion: 1.0 } }\n",
    );
    file
}

/// Every global router configuration docs/global.md shows passes `infergate global --check`:
/// a block with a top-level `clusters:` as it stands, a section shown alone (`tenancy:` with
/// `quotas:`) inside the smallest file that holds it. `--no-files`, since the blocks name
/// certificates, keys, CA bundles and token files that are placeholders (a relative `ca.pem`,
/// `/etc/infergate/clusters/east-1`): every field and environment variable is still checked.
#[test]
fn every_global_router_configuration_in_the_docs_passes_check() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = Vec::new();
    let mut skipped = Vec::new();
    let mut failures = Vec::new();
    for block in yaml_blocks("docs/global.md") {
        let at = format!("{}:{}", block.page, block.line);
        let keys: Vec<&str> = top_keys(&block.text)
            .into_iter()
            .filter(|k| !k.starts_with('#'))
            .collect();
        let first = keys.first().copied().unwrap_or_default();
        let whole = keys.contains(&"clusters");
        let section = matches!(first, "tenancy" | "quotas");
        if !whole && !section {
            // A gateway file's first key is `listen` or `models`: it is known by its models.
            let kind = if keys.contains(&"models") {
                "models"
            } else {
                first
            };
            let Some((_, what)) = NOT_ROUTER_FILES.iter().find(|(k, _)| *k == kind) else {
                panic!("{at}: a block of a new kind (first key `{first}`): check it or list it");
            };
            skipped.push(format!("{at} ({what})"));
            continue;
        }
        let body = if whole {
            block.text.clone()
        } else {
            around_router(&block.text)
        };
        let file = dir.path().join(format!("global-{}.yaml", checked.len()));
        std::fs::write(&file, &body).unwrap();
        let (ok, printed) = printed_error::run_with_config(
            "global",
            &file,
            &["--check", "--no-files"],
            &[("REDIS_PASSWORD", "secret")],
            "INFERGATE_GLOBAL_CONFIG",
        );
        if !ok {
            failures.push(format!("{at}:\n{body}\n--check said:\n{printed}"));
        }
        checked.push(at);
    }
    eprintln!("checked {checked:?}; not router files: {skipped:?}");
    assert!(
        failures.is_empty(),
        "documented configurations refused by global --check:\n\n{}",
        failures.join("\n\n")
    );
    // On one machine, the reference, HTTPS to clusters, rate limits.
    assert!(checked.len() >= 4, "checked only {checked:?}");
}

/// Every emulated fleet file the docs show (a block whose first key is `seed` or `pods`) passes
/// `infergate sim --check`: the fleets of docs/global.md's walk on one machine and the reference
/// file of docs/simulator.md.
#[test]
fn every_fleet_file_in_the_docs_passes_sim_check() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = Vec::new();
    let mut failures = Vec::new();
    for block in ["docs/global.md", "docs/simulator.md"]
        .into_iter()
        .flat_map(yaml_blocks)
    {
        let keys = top_keys(&block.text);
        if !matches!(keys.first().copied(), Some("seed" | "pods")) {
            continue;
        }
        let at = format!("{}:{}", block.page, block.line);
        let file = dir.path().join(format!("fleet-{}.yaml", checked.len()));
        std::fs::write(&file, &block.text).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["sim", "--check", "--fleet"])
            .arg(&file)
            .env_remove("INFERGATE_SIM_FLEET")
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE")
            .output()
            .expect("the infergate binary runs");
        let (ok, printed) = printed_error::outcome(&out);
        if !ok {
            failures.push(format!(
                "{at}:\n{}\nsim --check said:\n{printed}",
                block.text
            ));
        }
        checked.push(at);
    }
    eprintln!("checked {checked:?}");
    assert!(
        failures.is_empty(),
        "documented fleet files refused by sim --check:\n\n{}",
        failures.join("\n\n")
    );
    // global.md's east and west fleets, simulator.md's reference file.
    assert!(checked.len() >= 3, "checked only {checked:?}");
}
