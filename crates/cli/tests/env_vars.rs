//! The real binary and the environment variables its flags read: a misspelt variable is named in
//! a warning with the one it resembles (the shell takes any name, and infergate would ignore it
//! silently), and a bad value read from a variable is reported with the variable's name (clap
//! names only the flag, which the user never typed).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::process::{Command, Output};

/// Runs `infergate ARGS` with `vars` added to a clean environment (PATH only).
fn run(args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_infergate"));
    cmd.args(args).env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd.envs(vars.iter().copied()).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_misspelt_variable_is_named_with_the_one_it_resembles() {
    // `crdgen` to a fresh folder: a command that starts, logs and exits 0.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("crds");
    let o = run(
        &["crdgen", "--out", out.to_str().unwrap()],
        &[
            ("INFERGATE_LOG_FROMAT", "json"),
            ("infergate_gateway_workers", "2"),
            ("INFERGATE_REDIS_PASSWORD", "secret"),
        ],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(
            "the environment variable INFERGATE_LOG_FROMAT is not one infergate reads, so it is \
             ignored: did you mean INFERGATE_LOG_FORMAT?"
        ),
        "{err}"
    );
    assert!(
        err.contains("infergate_gateway_workers is not one infergate reads")
            && err.contains("did you mean INFERGATE_GATEWAY_WORKERS?"),
        "{err}"
    );
    // A name a configuration file may give a secret resembles nothing: no warning, and the
    // value is never printed.
    assert!(!err.contains("INFERGATE_REDIS_PASSWORD"), "{err}");
    assert!(!err.contains("secret"), "{err}");
    // The right name: no warning.
    let o = run(
        &["crdgen", "--out", out.to_str().unwrap()],
        &[("INFERGATE_LOG_FORMAT", "json")],
    );
    assert!(!stderr(&o).contains("did you mean"), "{}", stderr(&o));
}

#[test]
fn a_bad_value_from_a_variable_names_the_variable() {
    let o = run(
        &["gateway", "--config", "/nonexistent.yaml"],
        &[("INFERGATE_GATEWAY_WORKERS", "0")],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("invalid value '0' for '--workers"),
        "clap's own message: {err}"
    );
    assert!(
        err.contains(
            "(read from the environment variable INFERGATE_GATEWAY_WORKERS: the flag was not given)"
        ),
        "{err}"
    );
    let o = run(
        &["crdgen", "--out", "/x"],
        &[("INFERGATE_LOG_FORMAT", "yaml")],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("environment variable INFERGATE_LOG_FORMAT"),
        "{err}"
    );
    // The same bad value given as the flag: clap's message alone.
    let o = run(
        &["gateway", "--config", "/nonexistent.yaml", "--workers", "0"],
        &[("INFERGATE_GATEWAY_WORKERS", "0")],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(!err.contains("environment variable"), "{err}");
}

/// A Secret name Kubernetes would refuse, from the operator's pull-secret variable (as the
/// chart sets it): refused at start, before the operator listens or talks to the API server,
/// naming the variable and the name.
#[test]
fn a_bad_pull_secret_from_the_variable_is_refused_at_start() {
    let o = run(
        &["operator", "--metrics-addr", "127.0.0.1:0"],
        &[("INFERGATE_IMAGE_PULL_SECRETS", "regcred,Bad_Name")],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "invalid value 'Bad_Name' for '--image-pull-secret <NAME>': not a Secret name"
        ),
        "{err}"
    );
    assert!(
        err.contains("environment variable INFERGATE_IMAGE_PULL_SECRETS"),
        "{err}"
    );
}

/// The operator's namespace list from its variable (as the chart's `watchNamespaces` sets it):
/// a name Kubernetes would refuse stops the start before the operator listens or talks to the
/// API server, naming the variable and the name.
#[test]
fn a_bad_namespace_from_the_watch_variable_is_refused_at_start() {
    let o = run(
        &["operator", "--metrics-addr", "127.0.0.1:0"],
        &[("INFERGATE_WATCH_NAMESPACES", "inference,Team_A")],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("invalid value 'Team_A' for '--watch-namespaces <NAMESPACE,...>'"),
        "{err}"
    );
    assert!(
        err.contains("environment variable INFERGATE_WATCH_NAMESPACES"),
        "{err}"
    );
}

/// Every variable `infergate <command> --help` shows (`[env: NAME=]`), over every command the
/// top-level help lists.
fn variables_in_help() -> std::collections::BTreeSet<String> {
    let help = |args: &[&str]| String::from_utf8(run(args, &[]).stdout).unwrap();
    let top = help(&["--help"]);
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect();
    assert!(
        commands.len() >= 10,
        "commands read from --help: {commands:?}"
    );
    let mut names = std::collections::BTreeSet::new();
    for command in &commands {
        let text = help(&[command, "--help"]);
        for rest in text.split("[env: ").skip(1) {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names
}

/// docs/configuration.md's list of the variables ("The variables are ..." up to "Since a shell
/// accepts any name") is every variable a flag reads, and only those: a variable the page leaves out is
/// one a user cannot find without reading each command's help.
#[test]
fn the_configuration_page_lists_every_variable_the_flags_read() {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md"),
    )
    .unwrap();
    let list = page
        .split_once("The variables are ")
        .and_then(|(_, rest)| rest.split_once("Since a shell accepts any name"))
        .map(|(list, _)| list)
        .expect("docs/configuration.md has its list of variables");
    let documented: std::collections::BTreeSet<String> = list
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| name.starts_with(|c: char| c.is_ascii_uppercase()) && *name != "RUST_LOG")
        .map(str::to_owned)
        .collect();
    let read = variables_in_help();
    let missing: Vec<_> = read.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&read).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "docs/configuration.md, Environment variables: not listed {missing:?}; listed but read by \
         no flag {unknown:?}"
    );
}
