//! A run of the binary stopped by a signal at a given point of its progress, for the tests of
//! an interrupted `bench` or `demo`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::process::{Command, Output};

/// Runs `infergate ARGS` and sends it `signal` (`-INT`, `-TERM`) `after` the first line
/// of its stderr that `at` accepts (within 120 s); its output, with the whole of its stderr.
pub fn signalled(
    args: &[&std::ffi::OsStr],
    at: impl Fn(&str) -> bool,
    after: std::time::Duration,
    signal: &str,
) -> (Output, String) {
    use std::io::BufRead as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap();
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    loop {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("the awaited line never came");
        if at(&line) {
            break;
        }
    }
    std::thread::sleep(after);
    let sent = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = child.wait_with_output().unwrap();
    (out, reader.join().unwrap())
}
