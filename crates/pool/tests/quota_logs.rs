//! The quota sync's warning when Redis fails, with a real `redis-server`. A binary of its own:
//! tracing caches whether a log line is wanted from the first thread to reach it, so a test
//! that reads its own log lines must not share them with tests running beside it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/quota.rs"]
mod common;
use common::config;

use std::time::Duration;

use infergate_pool::quota::Quotas;
use infergate_pool::redis::{Pipeline, Redis, RedisConfig};
use infergate_testkit::redis::RedisServer;

/// The sync's warning says why Redis failed: the cause under the client's error (the socket's
/// report), and the refusal of a Redis that asks for a password the replica was not given,
/// which Redis answers with `NOAUTH` before it closes the connection.
#[tokio::test]
async fn the_warning_of_a_failed_sync_says_why() {
    let Some(mut redis) = RedisServer::start_if_installed().await else {
        return;
    };
    // The current-thread runtime runs the sync task here, under this thread's subscriber.
    let out = infergate_testkit::CapturedLog::default();
    let _log = tracing::subscriber::set_default(out.subscriber(tracing::Level::INFO));
    let window = Duration::from_secs(2);
    // A password given to a Redis that has none: Redis refuses the `AUTH`, and the warning says
    // to leave the password out.
    let mut with_password = config(&redis, "why:", window, 100);
    if let Some(shared) = with_password.redis.as_mut() {
        shared.redis.password = Some("sekret".to_owned());
    }
    let q = Quotas::start(with_password, None).unwrap();
    infergate_testkit::eventually("a warning", || out.text().contains("Redis unreachable")).await;
    let text = out.text();
    assert!(
        text.contains("this Redis has no password: leave `redis.passwordEnv` out"),
        "{text}"
    );
    drop(q);
    let before = out.text().len();
    let mut direct = Redis::new(RedisConfig::new(redis.addr().to_string()));
    let mut p = Pipeline::new();
    p.cmd(&["CONFIG", "SET", "requirepass", "sekret"]);
    direct.pipeline(&p).await.unwrap();
    let q = Quotas::start(config(&redis, "why:", window, 100), None).unwrap();
    infergate_testkit::eventually("a warning", || {
        out.text()[before..].contains("Redis unreachable")
    })
    .await;
    let text = out.text()[before..].to_owned();
    assert!(text.contains("NOAUTH Authentication required"), "{text}");
    // ... and which setting gives the password.
    assert!(
        text.contains(
            "this Redis requires a password: name a variable holding it in `redis.passwordEnv`"
        ),
        "{text}"
    );
    drop(q);
    // A wrong password is refused with `WRONGPASS`: the warning says it was the password.
    let before = out.text().len();
    let mut wrong = config(&redis, "why:", window, 100);
    if let Some(shared) = wrong.redis.as_mut() {
        shared.redis.password = Some("not-the-password".to_owned());
    }
    let q = Quotas::start(wrong, None).unwrap();
    infergate_testkit::eventually("a warning for the wrong password", || {
        out.text()[before..].contains("Redis unreachable")
    })
    .await;
    let text = out.text()[before..].to_owned();
    assert!(
        text.contains("the password from `redis.passwordEnv` of the quotas was refused"),
        "{text}"
    );
    drop(q);

    redis.restart().await;
    let q = Quotas::start(config(&redis, "why:", window, 100), None).unwrap();
    infergate_testkit::eventually("shared", || q.redis_up()).await;
    let before = out.text().len();
    redis.kill();
    infergate_testkit::eventually("a second warning", || {
        out.text()[before..].contains("Redis unreachable")
    })
    .await;
    let text = out.text()[before..].to_owned();
    let line = text
        .lines()
        .find(|l| l.contains("Redis unreachable"))
        .unwrap();
    // `the Redis connection failed` alone would not say whether it was refused, reset or closed:
    // the client's words are followed by the socket's.
    let error = line
        .split("error=\"")
        .nth(1)
        .and_then(|e| e.split('"').next())
        .unwrap();
    assert!(
        error.starts_with("the Redis connection failed: ")
            || error.starts_with(&format!("cannot connect to Redis at {}: ", redis.addr())),
        "{line}"
    );
}
