//! `infergate picker` (and the operator) refusing to start: with a quota or flow-control file it
//! refuses, the start fails naming the flag and the file, saying each cause once, and nothing
//! says the picker is listening first; outside a cluster, the error says so once.

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
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = picker_command(dir.path())
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
            Ok(l) if l.contains("endpoint picker listening") => break l,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                panic!("no listening line: {e}");
            }
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    for field in ["grpc=127.0.0.1:", "health=127.0.0.1:", "metrics=127.0.0.1:"] {
        assert!(line.contains(field), "{field}: {line}");
    }
    assert!(!line.contains(":0 "), "an unbound port 0 logged: {line}");
}

#[test]
fn a_refused_quota_or_flow_control_file_stops_the_start_before_listening_is_logged() {
    let cases = [
        (
            "--quotas",
            "quotas:\n  default: { requestsPerMinute: 3 }\n",
            "unknown field `quotas`",
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
        let (ok, text) = picker_with(flag, body);
        assert!(!ok, "{flag} {body:?} started: {text}");
        assert!(text.contains(flag), "{flag} {body:?}: {text}");
        assert!(text.contains(expected), "{flag} {body:?}: {text}");
        assert!(
            !text.contains("endpoint picker listening"),
            "{flag} {body:?}: logged listening before refusing the file: {text}"
        );
        assert_said_once(&printed_chain(&text), &text);
    }
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
