//! A gateway, picker or global router sharing `quotas:` through a real `redis-server` leaves the replicas'
//! round times when it exits on SIGTERM, so the others count it out at their next round and
//! admit the whole limit again, rather than their shares for two presence periods more. (The
//! process's runtime ends with `main`: a replica that left only when its service was dropped
//! never did.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use infergate_pool::redis::{Pipeline, Redis, RedisConfig};
use infergate_testkit::redis::RedisServer;
use tokio::time::Instant;

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The quota fields the front doors take, sharing through `redis` under `prefix`. Rounds every
/// 5 s (the first at start): a replica that left only at its sync task's next tick after its
/// service was dropped does not reach it before the process exits, whatever the process does
/// after its server stopped.
fn quota_fields(redis: &RedisServer, prefix: &str) -> String {
    format!(
        "default: {{ requestsPerMinute: 600 }}\nredis: {{ address: '{}', keyPrefix: '{prefix}', syncIntervalMs: 5000 }}\n",
        redis.addr()
    )
}

/// How many replicas the round times under `prefix` name (`ZCARD`).
async fn present(direct: &mut Redis, prefix: &str) -> i64 {
    let mut p = Pipeline::new();
    p.cmd(&["ZCARD", &format!("{prefix}rounds")]);
    direct.pipeline(&p).await.unwrap()[0].as_i64().unwrap()
}

/// Starts `infergate ARGS`, waits until it has joined the round times under `prefix`, stops it
/// with SIGTERM and returns how many replicas Redis names right after it exited.
async fn present_after_sigterm(redis: &RedisServer, prefix: &str, args: &[String]) -> i64 {
    let mut child = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut direct = Redis::new(RedisConfig::new(redis.addr().to_string()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while present(&mut direct, prefix).await != 1 {
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!("{args:?} never joined the round times under {prefix}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The set must not expire on its own meanwhile: only the replica's leave takes it out.
    let mut p = Pipeline::new();
    p.cmd(&["PEXPIRE", &format!("{prefix}rounds"), "600000"]);
    direct.pipeline(&p).await.unwrap();
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{args:?} exited with {status}");
    present(&mut direct, prefix).await
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// `infergate COMMAND --config FILE` (the gateway, the global router), the file `auth: none`,
/// the quota fields under `quotas:` and then `rest`: how many replicas Redis names right after
/// it exited on SIGTERM.
async fn file_front_door_after_sigterm(
    redis: &RedisServer,
    prefix: &str,
    command: &str,
    rest: &str,
) -> i64 {
    let dir = tempfile::tempdir().unwrap();
    let quotas = quota_fields(redis, prefix).replace('\n', "\n  ");
    let config = write(
        dir.path(),
        "config.yaml",
        &format!("auth: none\nquotas:\n  {quotas}\n{rest}"),
    );
    let args = [
        command.to_string(),
        format!("--config={config}"),
        format!("--listen={}", free_addr()),
        format!("--admin={}", free_addr()),
    ];
    present_after_sigterm(redis, prefix, &args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_stopped_by_sigterm_leaves_the_shared_quotas() {
    let Some(redis) = RedisServer::start_if_installed().await else {
        return;
    };
    // Nothing listens at the endpoint: the quota service syncs all the same.
    let models =
        "models:\n  - name: llama\n    endpoints: [{ address: '127.0.0.1:9', engine: vllm }]\n";
    let left = file_front_door_after_sigterm(&redis, "gw-leave:", "gateway", models).await;
    assert_eq!(
        left, 0,
        "the gateway was still in the round times after it exited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_picker_stopped_by_sigterm_leaves_the_shared_quotas() {
    let Some(redis) = RedisServer::start_if_installed().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let quotas = write(
        dir.path(),
        "quotas.yaml",
        &quota_fields(&redis, "picker-leave:"),
    );
    let endpoints = write(
        dir.path(),
        "endpoints.yaml",
        "endpoints:\n  - { address: '127.0.0.1:9', engine: vllm }\n",
    );
    let port = |a: SocketAddr| a.port().to_string();
    let args = [
        "picker".to_string(),
        "--pool-name=llama".to_string(),
        "--listen-address=127.0.0.1".to_string(),
        format!("--endpoints-file={endpoints}"),
        format!("--quotas={quotas}"),
        format!("--grpc-port={}", port(free_addr())),
        format!("--grpc-health-port={}", port(free_addr())),
        format!("--metrics-port={}", port(free_addr())),
    ];
    let left = present_after_sigterm(&redis, "picker-leave:", &args).await;
    assert_eq!(
        left, 0,
        "the picker was still in the round times after it exited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_router_stopped_by_sigterm_leaves_the_shared_quotas() {
    let Some(redis) = RedisServer::start_if_installed().await else {
        return;
    };
    // Nothing listens at the cluster's URL: the quota service syncs all the same.
    let clusters = "clusters:\n  - { name: a, url: 'http://127.0.0.1:9', region: r, models: [llama], cost: { inputPerMillion: 1 } }\n";
    let left = file_front_door_after_sigterm(&redis, "global-leave:", "global", clusters).await;
    assert_eq!(
        left, 0,
        "the router was still in the round times after it exited"
    );
}
