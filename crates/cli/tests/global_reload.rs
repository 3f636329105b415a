//! `infergate global` reloads its file as it runs: the real binary, its file rewritten, the change
//! seen on its front door; a bad rewrite refused and counted while the last good file serves.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The router process, killed when dropped.
struct Global(Child);

impl Drop for Global {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A file with one cluster serving `models` (nothing listens at its URL: `GET /v1/models` on
/// the router lists the configured models all the same). Its `listen` and `admin` are
/// overridden on the command line.
fn file(models: &str) -> String {
    format!(
        "listen: 127.0.0.1:1\nadmin: 127.0.0.1:2\nauth: none\nreloadIntervalMs: 100\nclusters:\n  - {{ name: a, url: 'http://127.0.0.1:9', region: r, models: [{models}], cost: {{ inputPerMillion: 1 }} }}\n"
    )
}

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut f: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn models(http: SocketAddr) -> Option<String> {
    let r = infergate_testkit::try_get(http, "/v1/models").await.ok()?;
    (r.status == 200).then(|| r.text())
}

async fn reloads(admin: SocketAddr, result: &str) -> Option<f64> {
    let r = infergate_testkit::try_get(admin, "/metrics").await.ok()?;
    let series = format!("infergate_global_config_reloads_total{{result=\"{result}\"}} ");
    r.text()
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str())?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewritten_file_takes_effect_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("global.yaml");
    std::fs::write(&path, file("m-one")).unwrap();
    let (http, admin) = (free_addr(), free_addr());
    let log = dir.path().join("log");
    let _router = Global(
        Command::new(env!("CARGO_BIN_EXE_infergate"))
            .arg("global")
            .arg("--config")
            .arg(&path)
            .arg(format!("--listen={http}"))
            .arg(format!("--admin={admin}"))
            .env("RUST_LOG", "info")
            .env_remove("INFERGATE_GLOBAL_CONFIG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    eventually("the router serves m-one", || async {
        models(http).await.is_some_and(|t| t.contains("m-one"))
    })
    .await;
    assert_eq!(reloads(admin, "ok").await, Some(0.0));
    assert_eq!(reloads(admin, "error").await, Some(0.0));

    std::fs::write(&path, file("m-two")).unwrap();
    eventually("the rewritten file is served", || async {
        models(http)
            .await
            .is_some_and(|t| t.contains("m-two") && !t.contains("m-one"))
    })
    .await;
    assert_eq!(reloads(admin, "ok").await, Some(1.0));

    std::fs::write(&path, file("m-three").replace("region: r, ", "")).unwrap();
    eventually("the bad file is counted", || async {
        reloads(admin, "error").await == Some(1.0)
    })
    .await;
    let served = models(http).await.unwrap();
    assert!(
        served.contains("m-two") && !served.contains("m-three"),
        "{served}"
    );
    let printed = std::fs::read_to_string(&log).unwrap();
    assert!(
        printed.contains("configuration reload rejected"),
        "{printed}"
    );
    assert!(printed.contains("region"), "{printed}");
    // `--listen` and `--admin` stay over the file's addresses: not a change needing a restart.
    assert!(!printed.contains("only after a restart"), "{printed}");
}
