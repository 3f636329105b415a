//! `infergate picker` and `infergate bbr` (and the operator) refusing to start: with a file or
//! setting they refuse, the start fails naming the flag and the file, saying each cause once,
//! and nothing says the process is listening first; outside a cluster, the error says so once.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::process::Command;

#[path = "common/printed_error.rs"]
mod printed_error;
use printed_error::{assert_said_once, printed_chain};

fn picker_with(flag: &str, body: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file.yaml");
    std::fs::write(&file, body).unwrap();
    picker_in(dir.path(), &[flag.as_ref(), file.as_os_str()])
}

/// `infergate picker` over one static endpoint (a file written in `dir`), on free loopback
/// ports.
fn picker_command(dir: &std::path::Path) -> Command {
    let endpoints = dir.join("endpoints.yaml");
    std::fs::write(
        &endpoints,
        "engine: vllm\nendpoints:\n  - address: 127.0.0.1:9\n",
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_infergate"));
    cmd.arg("picker")
        .arg("--endpoints-file")
        .arg(&endpoints)
        .args(["--listen-address", "127.0.0.1"])
        .args([
            "--grpc-port",
            "0",
            "--grpc-health-port",
            "0",
            "--metrics-port",
            "0",
        ])
        .env_remove("RUST_BACKTRACE");
    cmd
}

/// [`picker_command`] with `extra` flags, run to its end.
fn picker_in(dir: &std::path::Path, extra: &[&std::ffi::OsStr]) -> (bool, String) {
    let out = picker_command(dir).args(extra).output().unwrap();
    printed_error::outcome(&out)
}

/// A tokenizer that does not load stops the start, and the picker never said it was listening
/// (it did: the line came before precise routing was set up).
#[test]
fn a_tokenizer_that_does_not_load_stops_the_start_before_listening_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("no-tokenizer-here");
    std::fs::create_dir(&empty).unwrap();
    let (ok, text) = picker_in(
        dir.path(),
        &[
            "--kv-events-port".as_ref(),
            "5557".as_ref(),
            "--tokenizer".as_ref(),
            empty.as_os_str(),
        ],
    );
    assert!(!ok, "started: {text}");
    assert!(text.contains("tokenizer"), "{text}");
    assert!(
        !text.contains("endpoint picker listening"),
        "logged listening before refusing the tokenizer: {text}"
    );
}

/// A start that succeeds says it is listening, with the addresses bound (port 0 included).
#[test]
fn a_good_start_logs_listening_with_the_bound_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let line = listening_line(picker_command(dir.path()), "endpoint picker listening");
    for field in ["grpc=127.0.0.1:", "health=127.0.0.1:", "metrics=127.0.0.1:"] {
        assert!(line.contains(field), "{field}: {line}");
    }
    assert!(!line.contains(":0 "), "an unbound port 0 logged: {line}");
}

/// The body-based router's start line names the addresses it bound, as the picker's does (it
/// gave the `--grpc-port` value alone, `grpc=9004`, whatever the port bound or the address),
/// and `off` for a port turned off with 0.
#[test]
fn the_bbr_logs_listening_with_the_bound_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = bbr_command(dir.path(), "m: []\n");
    cmd.args(["--grpc-port", "0", "--grpc-health-port", "0"]);
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = metrics.local_addr().unwrap().port();
    drop(metrics);
    cmd.args(["--metrics-port", &port.to_string()]);
    let line = listening_line(cmd, "body-based router listening");
    assert!(line.contains("grpc=127.0.0.1:"), "{line}");
    assert!(!line.contains("grpc=127.0.0.1:0 "), "{line}");
    assert!(line.contains("health=off"), "{line}");
    assert!(
        line.contains(&format!("metrics=127.0.0.1:{port}")),
        "{line}"
    );
}

/// Runs `cmd` until it logs a line containing `needle`, then stops it: that line.
fn listening_line(mut cmd: Command, needle: &str) -> String {
    use std::io::BufRead;
    let mut child = cmd
        .args(["--log-format", "text"])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    for pipe in [
        Box::new(stderr) as Box<dyn std::io::Read + Send>,
        Box::new(stdout),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
    }
    let line = loop {
        match rx.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(l) if l.contains(needle) => break l,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                panic!("no `{needle}` line: {e}");
            }
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    line
}

/// Runs `cmd` to its end, or for 20 s: whether it succeeded or was still running then (a
/// start that should have been refused), and what it printed.
fn outcome_within(cmd: &mut Command) -> (bool, String) {
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let (ok, text) = printed_error::outcome(&child.wait_with_output().unwrap());
    (ok || running, text)
}

/// `infergate bbr` with a models file of `models` written in `dir`, on loopback.
fn bbr_command(dir: &std::path::Path, models: &str) -> Command {
    let file = dir.join("models.yaml");
    std::fs::write(&file, models).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_infergate"));
    cmd.arg("bbr")
        .arg("--models")
        .arg(&file)
        .args(["--listen-address", "127.0.0.1"])
        .env_remove("RUST_BACKTRACE");
    cmd
}

/// A scheduler configuration, a rewrites file or TLS files the picker refuses stop its start
/// with an error naming the flag and the file (the first two named the file alone, as `X is
/// not valid`; TLS said `the ext_proc port's TLS certificate` and the file, not the flags).
#[test]
fn a_refused_scheduler_rewrites_or_tls_file_names_its_flag() {
    let cases = [
        (
            "--config",
            "weigths: { queue: 1 }\n",
            "unknown field `weigths`",
        ),
        (
            "--rewrites",
            "- name: r\n  targets: [{ modelRewrit: b }]\n",
            "unknown field `modelRewrit`",
        ),
    ];
    for (flag, body, expected) in cases {
        assert_file_refused(flag, body, expected);
    }
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("not-a-certificate.pem");
    std::fs::write(&pem, "not PEM\n").unwrap();
    let (ok, text) = picker_in(
        dir.path(),
        &[
            "--tls-cert-file".as_ref(),
            pem.as_os_str(),
            "--tls-key-file".as_ref(),
            pem.as_os_str(),
        ],
    );
    assert!(!ok, "started: {text}");
    let chain = printed_chain(&text);
    assert!(
        chain[0].starts_with("--tls-cert-file ") && chain[0].contains("--tls-key-file "),
        "{text}"
    );
    assert!(text.contains("not-a-certificate.pem"), "{text}");
    assert_said_once(&chain, &text);
}

/// A port another process holds stops either process with an error naming the port's flag and
/// what to do; it said `cannot listen on 127.0.0.1:9090` — and both processes default to
/// `--metrics-port 9090`, so one machine running both per the docs met it.
#[test]
fn a_port_in_use_names_its_flag_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let endpoints = dir.path().join("endpoints.yaml");
    std::fs::write(
        &endpoints,
        "engine: vllm\nendpoints:\n  - address: 127.0.0.1:9\n",
    )
    .unwrap();
    let mut picker = Command::new(env!("CARGO_BIN_EXE_infergate"));
    picker
        .arg("picker")
        .arg("--endpoints-file")
        .arg(&endpoints)
        .args(["--listen-address", "127.0.0.1"])
        .args(["--grpc-port", "0", "--grpc-health-port", "0"])
        .args(["--metrics-port", &port])
        .env_remove("RUST_BACKTRACE");
    let mut bbr = bbr_command(dir.path(), "m: []\n");
    bbr.args(["--grpc-port", "0", "--grpc-health-port", &port]);
    for (mut cmd, flag) in [(picker, "--metrics-port"), (bbr, "--grpc-health-port")] {
        let (ok, text) = outcome_within(&mut cmd);
        assert!(!ok, "started: {text}");
        let chain = printed_chain(&text);
        assert!(chain[0].starts_with(&format!("{flag} {port}: ")), "{text}");
        assert!(chain[0].contains(&format!("pass another {flag}")), "{text}");
        assert!(!text.contains("listening"), "{text}");
        assert_said_once(&chain, &text);
    }
    drop(taken);
}

/// A models file the body-based router refuses stops it naming `--models` and the file: one
/// naming no model (it started and answered every request 404), a name given twice (it said
/// `model table`, without the file).
#[test]
fn a_refused_models_file_names_the_flag() {
    for (models, expected) in [
        ("", "names no model"),
        ("a: [x]\nb: [x]\n", "model name `x` is configured twice"),
        ("- a\n- b\n", "maps each served base model"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = bbr_command(dir.path(), models);
        cmd.args([
            "--grpc-port",
            "0",
            "--grpc-health-port",
            "0",
            "--metrics-port",
            "0",
        ]);
        let (ok, text) = outcome_within(&mut cmd);
        assert!(!ok, "{models:?} started: {text}");
        let chain = printed_chain(&text);
        assert!(chain[0].starts_with("--models "), "{models:?}: {text}");
        assert!(chain[0].contains("models.yaml"), "{text}");
        assert!(text.contains(expected), "{models:?}: {text}");
        assert!(!text.contains("listening"), "{text}");
        assert_said_once(&chain, &text);
    }
}

#[test]
fn a_refused_quota_or_flow_control_file_stops_the_start_before_listening_is_logged() {
    let cases = [
        (
            "--quotas",
            "quotas:\n  default: { requestsPerMinute: 3 }\n",
            "`quotas:` is the gateway file's key",
        ),
        (
            "--quotas",
            "redis: { address: redis }\n",
            "quotas.redis.address",
        ),
        (
            "--flow-control",
            "flowControl: { requestTtlMs: 90000000 }\n",
            "flowControl.requestTtlMs",
        ),
        (
            "--flow-control",
            "flowControl: { bands: { standard: { maxBytes: 0 } } }\n",
            "`flowControl.bands.standard.maxBytes` must be at least 1",
        ),
        (
            "--flow-control",
            "tenancy: { objectives: { a: urgent } }\n",
            "`urgent` is not a priority",
        ),
    ];
    for (flag, body, expected) in cases {
        assert_file_refused(flag, body, expected);
    }
}

/// The picker given `body` as the file of `flag` refuses to start, before saying it listens,
/// with an error that opens with the flag, holds `expected` and says each cause once.
fn assert_file_refused(flag: &str, body: &str, expected: &str) {
    let (ok, text) = picker_with(flag, body);
    assert!(!ok, "{flag} {body:?} started: {text}");
    let chain = printed_chain(&text);
    assert!(chain[0].starts_with(flag), "{flag} {body:?}: {text}");
    assert!(text.contains(expected), "{flag} {body:?}: {text}");
    assert!(
        !text.contains("endpoint picker listening"),
        "{flag} {body:?}: logged listening before refusing the file: {text}"
    );
    assert_said_once(&chain, &text);
}

/// Outside a cluster, with no kubeconfig: the operator and a picker without `--endpoints-file`
/// say there is no cluster, where they looked and (the picker) how to run without one — once.
/// They said "Kubernetes API call failed" and then kube's inference error four times over.
#[test]
fn no_cluster_and_no_kubeconfig_is_said_once_with_where_it_looked() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("no-such-kubeconfig");
    for args in [
        vec!["operator", "--metrics-addr", "127.0.0.1:0"],
        vec![
            "picker",
            "--listen-address",
            "127.0.0.1",
            "--grpc-port",
            "0",
            "--grpc-health-port",
            "0",
            "--metrics-port",
            "0",
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(&args)
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap();
        let (ok, text) = printed_error::outcome(&out);
        assert!(!ok, "{args:?} started: {text}");
        assert_eq!(
            text.matches("no Kubernetes cluster").count(),
            1,
            "{args:?}: {text}"
        );
        assert_eq!(
            text.matches(kubeconfig.to_str().unwrap()).count(),
            1,
            "{args:?}: {text}"
        );
        if args[0] == "picker" {
            assert!(text.contains("--endpoints-file"), "{text}");
        }
    }
}
