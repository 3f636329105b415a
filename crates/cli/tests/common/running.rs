//! A started `infergate` process for the tests that run several binaries side by side (a
//! gateway or a picker and the global routers polling it): killed when dropped, its output in a
//! file the failures print.
#![allow(
    clippy::unwrap_used,
    dead_code,
    reason = "test helpers: a failure is a failed test; each test binary uses a part"
)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A started `infergate` process, killed when dropped; its output in a file.
pub struct Running {
    child: Child,
    log: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// Starts `infergate ARGS` with `RUST_LOG=info`, its output in `DIR/WHAT.log`. The
    /// variables that would name another file or certificate than the arguments do are
    /// removed.
    pub fn start(dir: &Path, what: &str, args: &[String]) -> Running {
        let log = dir.join(format!("{what}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("INFERGATE_GATEWAY_CONFIG")
            .env_remove("INFERGATE_GLOBAL_CONFIG")
            .env_remove("INFERGATE_METRICS_TLS_CLIENT_CA_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Running { child, log }
    }

    /// What it printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails the test with the process's output if it has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("exited ({status}) with:\n{}", self.log());
        }
    }
}

/// A free port on 127.0.0.1 (free when asked).
pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `p` as it goes into a command line or a YAML string.
pub fn path(p: &Path) -> String {
    p.display().to_string()
}
