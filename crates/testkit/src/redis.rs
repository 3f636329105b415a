//! A real `redis-server` for tests of shared state (quotas, global rate limits).
//!
//! [`RedisServer::start`] runs the Debian package's `redis-server` on a free loopback port with
//! a temporary directory, no persistence and no daemonising, and waits until it answers `PING`.
//! [`RedisServer::start_if_installed`] is what tests call: without the binary, CI fails the test
//! saying how to install it, and elsewhere the test is reported as skipped
//! ([`crate::required_tool`]). [`RedisServer::kill`] and [`RedisServer::restart`] (same port)
//! play an outage; dropping the value kills the server and removes its directory.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The binary run, unless `REDIS_SERVER` names another.
pub const REDIS_SERVER: &str = "redis-server";

/// A running (or killed, to be restarted) `redis-server`.
#[derive(Debug)]
pub struct RedisServer {
    addr: SocketAddr,
    dir: PathBuf,
    child: Option<Child>,
}

fn binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| REDIS_SERVER.to_owned())
}

/// Panics with how to install Redis when the binary cannot be run.
fn spawn(addr: SocketAddr, dir: &std::path::Path) -> Child {
    let bin = binary();
    Command::new(&bin)
        .args([
            "--port",
            &addr.port().to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir.display().to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--loglevel",
            "warning",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `{bin}` ({e}): tests of shared quotas need a real Redis; install the \
                 Debian package with `apt-get install -y redis-server` (or set REDIS_SERVER to the binary)"
            )
        })
}

impl RedisServer {
    /// [`RedisServer::start`] where the binary runs; `None` (the test returns, skipped) where it
    /// is missing outside CI; a failed test where it is missing in CI.
    pub async fn start_if_installed() -> Option<RedisServer> {
        let installed = Command::new(binary())
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !crate::required_tool(
            installed,
            &format!("`{}` (Redis)", binary()),
            "apt-get install -y redis-server, or set REDIS_SERVER to the binary",
        ) {
            return None;
        }
        Some(RedisServer::start().await)
    }

    /// Starts a server on a free loopback port and waits until it answers `PING`.
    pub async fn start() -> RedisServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no free loopback port: {e}"));
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let dir =
            std::env::temp_dir().join(format!("infergate-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let mut server = RedisServer {
            addr,
            dir,
            child: None,
        };
        server.restart().await;
        server
    }

    /// `host:port` of the server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Kills the server (SIGKILL) and waits for it to exit: an outage, not a shutdown.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port (empty: nothing was persisted) and waits until
    /// it answers `PING`.
    pub async fn restart(&mut self) {
        self.kill();
        self.child = Some(spawn(self.addr, &self.dir));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ping(self.addr).await {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("`{}` exited with {status} before answering", binary());
            }
            assert!(
                Instant::now() < deadline,
                "`{}` on {} did not answer PING within 10 s",
                binary(),
                self.addr
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Whether a server on `addr` answers `PING` with `PONG`.
async fn ping(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"*1\r\n$4\r\nPING\r\n").await.ok()?;
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).await.ok()?;
        Some(&buf == b"+PONG\r\n")
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
