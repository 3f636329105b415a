//! `infergate gateway` with a configuration it refuses: `--check` refuses what the start would,
//! and the printed error says each thing once.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::path::Path;
use std::process::Command;

#[path = "common/printed_error.rs"]
mod printed_error;
use printed_error::{assert_said_once, printed_chain};

/// Runs `infergate gateway --config <dir>/gateway.yaml` (holding `body`, or no file with `None`)
/// with `args`: whether it succeeded, and what it printed.
fn gateway_with(dir: &Path, body: Option<&str>, args: &[&str]) -> (bool, String) {
    let file = dir.join("gateway.yaml");
    if let Some(body) = body {
        std::fs::write(&file, body).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg("gateway")
        .arg("--config")
        .arg(&file)
        .args(args)
        .env_remove("INFERGATE_GATEWAY_CONFIG")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn check_refuses_listen_and_admin_on_one_port() {
    let dir = tempfile::tempdir().unwrap();
    let models = "auth: none\nmodels:\n  - name: m\n    endpoints: [127.0.0.1:9]\n";
    for (listen, admin) in [
        ("127.0.0.1:9090", "127.0.0.1:9090"),
        ("0.0.0.0:9090", "127.0.0.1:9090"),
    ] {
        let body = format!("listen: {listen}\nadmin: {admin}\n{models}");
        let (ok, text) = gateway_with(dir.path(), Some(&body), &["--check"]);
        assert!(!ok, "{listen} and {admin} passed --check: {text}");
        assert!(
            text.contains("`listen`") && text.contains("`admin`"),
            "{text}"
        );
    }
    let body = format!("listen: 127.0.0.1:8080\nadmin: 127.0.0.1:9090\n{models}");
    let (ok, text) = gateway_with(dir.path(), Some(&body), &["--check"]);
    assert!(ok, "{text}");
}

#[test]
fn a_refused_start_prints_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let ports = ["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
    let keys = "auth:\n  apiKeys: { file: /nonexistent/infergate/keys.yaml }\n\
                models:\n  - name: m\n    endpoints: [127.0.0.1:9]\n";
    let cases = [
        // No file at all.
        (None, "cannot read"),
        // Not YAML.
        (Some("auth: none\nmodels: [\n"), "line 3"),
        // A file that parses, naming an API key file that does not exist.
        (Some(keys), "auth.apiKeys"),
    ];
    for (body, expected) in cases {
        let (ok, text) = gateway_with(dir.path(), body, &ports);
        assert!(!ok, "{body:?} started: {text}");
        assert!(text.contains(expected), "{body:?}: {text}");
        assert_said_once(&printed_chain(&text), &text);
    }
}
