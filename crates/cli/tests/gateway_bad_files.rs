//! `infergate gateway` with a configuration it refuses: `--check` refuses what the start would,
//! and the printed error says each thing once.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::path::Path;

#[path = "common/checked_files.rs"]
mod checked_files;
#[path = "common/printed_error.rs"]
mod printed_error;
use checked_files::CheckedFiles;
use printed_error::{assert_said_once, printed_chain};

/// Runs `infergate gateway --config <dir>/gateway.yaml` (holding `body`, or no file with `None`)
/// with `args`: whether it succeeded, and what it printed.
fn gateway_with(dir: &Path, body: Option<&str>, args: &[&str]) -> (bool, String) {
    let file = dir.join("gateway.yaml");
    if let Some(body) = body {
        std::fs::write(&file, body).unwrap();
    }
    printed_error::run_with_config("gateway", &file, args, &[], "INFERGATE_GATEWAY_CONFIG")
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
    // The same clash made by the flags that override the file: refused by `--check` and by
    // the start alike, before anything is bound, naming the flags.
    for flags in [
        ["--listen", "127.0.0.1:9090"],
        ["--admin", "127.0.0.1:8080"],
    ] {
        for check in [true, false] {
            let mut args = flags.to_vec();
            if check {
                args.push("--check");
            }
            let (ok, text) = gateway_with(dir.path(), Some(&body), &args);
            assert!(!ok, "{args:?} passed: {text}");
            assert!(text.contains("--listen/--admin"), "{args:?}: {text}");
            assert!(!text.contains("binding"), "{args:?}: {text}");
        }
    }
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

/// Every file a configuration can name, missing or unusable: `--check` refuses it with the
/// error the start stops on (the same printed chain), and passes once the files are good,
/// without fetching the JWKS (its URI answers nothing).
#[test]
fn check_loads_every_file_the_configuration_names_as_the_start_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let CheckedFiles {
        cert,
        key,
        ca: ca_file,
        other_key,
        keys,
        missing,
    } = CheckedFiles::write(d);
    let model = "models:\n  - name: m\n    endpoints: [127.0.0.1:9]\n";
    let config = |tls: &str, auth: &str, model: &str| format!("{tls}{auth}{model}");
    let tls = |c: &str, k: &str| format!("tls: {{ certFile: \"{c}\", keyFile: \"{k}\" }}\n");
    let jwt = |ca: &str| {
        format!(
            "auth:\n  jwt:\n    issuer: https://issuer.test\n    \
             remoteJWKS: {{ uri: \"https://127.0.0.1:9/jwks\", caFile: \"{ca}\" }}\n"
        )
    };
    let key_file = |f: &str| format!("auth:\n  apiKeys: {{ file: \"{f}\" }}\n");
    let model_ca = |f: &str| {
        format!(
            "models:\n  - name: m\n    tls: {{ caFile: \"{f}\" }}\n    endpoints: [127.0.0.1:9]\n"
        )
    };
    let tokenizer = |f: &str| {
        format!(
            "models:\n  - name: m\n    precisePrefix: {{ tokenizer: \"{f}\" }}\n    \
             endpoints: [127.0.0.1:9]\n"
        )
    };
    let none = "auth: none\n";
    let bad = [
        (
            "tls.certFile missing",
            config(&tls(&missing, &key), none, model),
            "tls: the front door's certFile, keyFile or clientCaFile cannot be used",
        ),
        (
            "tls.keyFile missing",
            config(&tls(&cert, &missing), none, model),
            "cannot read",
        ),
        (
            "tls key of another certificate",
            config(&tls(&cert, &other_key), none, model),
            "match",
        ),
        (
            "tls.certFile not PEM",
            config(&tls(&keys, &key), none, model),
            "certificate",
        ),
        (
            "auth.jwt.remoteJWKS.caFile missing",
            config("", &jwt(&missing), model),
            "caFile",
        ),
        (
            "auth.apiKeys.file missing",
            config("", &key_file(&missing), model),
            "API key file",
        ),
        (
            "auth.apiKeys.file not a key list",
            config("", &key_file(&cert), model),
            "API key file",
        ),
        (
            "models[].tls.caFile missing",
            config("", none, &model_ca(&missing)),
            "cannot read",
        ),
        (
            "models[].precisePrefix.tokenizer missing",
            config("", none, &tokenizer(&missing)),
            "tokenizer",
        ),
    ];
    let ports = ["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
    for (what, body, expected) in &bad {
        let (ok, checked) = gateway_with(d, Some(body), &["--check"]);
        assert!(!ok, "{what}: --check passed: {checked}");
        assert!(checked.contains(expected), "{what}: {checked}");
        let (ok, started) = gateway_with(d, Some(body), &ports);
        assert!(!ok, "{what}: started: {started}");
        assert_eq!(
            printed_chain(&checked),
            printed_chain(&started),
            "{what}: --check and the start print different errors"
        );
    }
    // The same sections with good files pass, the JWKS unfetched.
    let good = [
        config(&tls(&cert, &key), none, model),
        config("", &jwt(&ca_file), model),
        config("", &key_file(&keys), model),
        config("", none, &model_ca(&ca_file)),
    ];
    for body in &good {
        let (ok, text) = gateway_with(d, Some(body), &["--check"]);
        assert!(ok, "{body}: {text}");
        assert!(text.contains("is valid"), "{body}: {text}");
    }
}

/// `accessLog.path` in a folder that does not exist is refused by `--check` and the start;
/// `--check` creates no file.
#[test]
fn check_and_start_refuse_an_access_log_they_cannot_open() {
    let dir = tempfile::tempdir().unwrap();
    printed_error::assert_access_log_checked(
        dir.path(),
        |path| {
            format!(
                "auth: none\nlisten: 127.0.0.1:29194\nadmin: 127.0.0.1:29195\naccessLog: {{ path: '{}' }}\nmodels:\n  - name: m\n    endpoints: [127.0.0.1:9]\n",
                path.display()
            )
        },
        |body, args| gateway_with(dir.path(), Some(body), args),
    );
}

/// A `maxHeaderBytes` the gateway cannot honour (below 8 KiB, above 16 MiB) is refused by
/// `--check` and by the start, naming the field, the value and the bound, before anything is
/// bound; the bounds themselves pass `--check`.
#[test]
fn check_and_start_refuse_a_header_limit_that_cannot_be_honoured() {
    let dir = tempfile::tempdir().unwrap();
    // `listen` is a port already taken: a start that accepted the file would stop on the bind
    // (and fail the test) rather than serve forever.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap();
    let body = |bytes: u64| {
        format!(
            "auth: none\nlisten: {listen}\nadmin: 127.0.0.1:0\nlimits: {{ maxHeaderBytes: {bytes} }}\nmodels:\n  - name: m\n    endpoints: [127.0.0.1:9]\n"
        )
    };
    for (bytes, bound) in [
        (4096, "8192 (8 KiB)"),
        ((16 << 20) + 1, "16777216 (16 MiB)"),
    ] {
        for args in [&["--check"][..], &[]] {
            let (ok, text) = gateway_with(dir.path(), Some(&body(bytes)), args);
            assert!(!ok, "{bytes} {args:?} passed: {text}");
            assert!(
                text.contains(&format!("`limits.maxHeaderBytes` is {bytes}"))
                    && text.contains(bound),
                "{bytes} {args:?}: {text}"
            );
            assert_said_once(&printed_chain(&text), &text);
        }
    }
    for bytes in [8192, 16 << 20] {
        let (ok, text) = gateway_with(dir.path(), Some(&body(bytes)), &["--check"]);
        assert!(ok, "{bytes}: {text}");
    }
}

/// `RUST_BACKTRACE` is often set on pods for the sake of panics: a refused start still prints
/// its reasons alone, not a stack trace of the binary's frames under them.
#[test]
fn a_refused_start_prints_no_backtrace_whatever_the_environment_asks() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.yaml");
    std::fs::write(&file, "bogus: 1\n").unwrap();
    for (var, value) in [("RUST_BACKTRACE", "1"), ("RUST_LIB_BACKTRACE", "full")] {
        let (ok, text) = printed_error::run_with_config(
            "gateway",
            &file,
            &[],
            &[(var, value)],
            "INFERGATE_GATEWAY_CONFIG",
        );
        assert!(!ok, "{text}");
        assert!(!text.contains("backtrace"), "{var}={value}: {text}");
        let chain = printed_chain(&text);
        assert!(
            chain[0].starts_with("invalid gateway configuration"),
            "{text}"
        );
        assert!(chain[1].starts_with("unknown field `bogus`"), "{text}");
    }
}
