//! A process whose log destination fails keeps working: `infergate gateway` with its stderr a
//! pipe nobody reads (every write fails with EPIPE, as on a full disk) serves, scrapes and
//! answers. It used to exit at its first log line (tracing reported the failed write with
//! `eprintln!`, which panics when stderr fails), and a task that logged later died.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// One HTTP/1.1 exchange; the whole answer, or `None` when the connection fails.
fn exchange(addr: SocketAddr, request: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(request.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn get(addr: SocketAddr, path: &str) -> Option<String> {
    exchange(
        addr,
        &format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n"),
    )
}

#[test]
fn a_gateway_whose_logs_cannot_be_written_keeps_serving_and_scraping() {
    let dir = tempfile::tempdir().unwrap();
    let (listen, admin) = (free_addr(), free_addr());
    // The model's one pod does not exist: its scrape fails and is logged (a warning), and a
    // request is answered 503 by the gateway itself.
    let config = dir.path().join("gateway.yaml");
    std::fs::write(
        &config,
        format!(
            "auth: none\nlisten: {listen}\nadmin: {admin}\nmodels:\n  - name: m\n    endpoints: [127.0.0.1:9]\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(["gateway", "--config"])
        .arg(&config)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Nobody reads the logs any more.
    drop(child.stderr.take());

    let deadline = Instant::now() + Duration::from_secs(20);
    let metrics = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the gateway exited ({status}) with its logs unwritable");
        }
        match get(admin, "/metrics") {
            // The scrape task judged the pod failed (and logged it): it is still running.
            Some(m) if m.contains(r#"infergate_metrics_stale_targets{model="m"} 1"#) => break m,
            _ => {}
        }
        assert!(Instant::now() < deadline, "no scrape judged within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");

    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    for _ in 0..3 {
        let answer = exchange(
            listen,
            &format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            ),
        )
        .expect("an answer, not a dropped connection");
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("no endpoint serving the model"), "{answer}");
    }
    assert!(get(admin, "/healthz").unwrap().starts_with("HTTP/1.1 200"));
    assert!(child.try_wait().unwrap().is_none(), "still running");
    child.kill().unwrap();
    child.wait().unwrap();
}
