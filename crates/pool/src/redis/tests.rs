//! The client against a scripted server on loopback (the real `redis-server` is exercised in
//! `tests/quota.rs`).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// A server that reads once and answers `reply`, then keeps the connection open.
async fn scripted(reply: &'static [u8]) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        s.write_all(reply).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        buf.truncate(n);
        buf
    });
    (addr, task)
}

#[tokio::test]
async fn a_pipeline_is_encoded_as_resp_arrays_and_every_reply_kind_parses() {
    let (addr, task) =
        scripted(b"+PONG\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*2\r\n:1\r\n$-1\r\n-ERR no\r\n").await;
    let mut r = Redis::new(RedisConfig::new(addr));
    let mut p = Pipeline::new();
    p.cmd(&["PING"])
        .cmd(&["INCRBY", "k", "42"])
        .cmd(&["GET", "k"])
        .cmd(&["GET", "none"])
        .cmd(&["MGET", "a", "b"])
        .cmd(&["BAD"]);
    let values = r.pipeline(&p).await.unwrap();
    assert_eq!(
        values,
        vec![
            Value::Status("PONG".into()),
            Value::Int(42),
            Value::Bulk(b"abc".to_vec()),
            Value::Nil,
            Value::Array(vec![Value::Int(1), Value::Nil]),
            Value::Error("ERR no".into()),
        ]
    );
    let sent = task.await.unwrap();
    assert!(
        sent.starts_with(b"*1\r\n$4\r\nPING\r\n*3\r\n$6\r\nINCRBY\r\n$1\r\nk\r\n$2\r\n42\r\n"),
        "{}",
        String::from_utf8_lossy(&sent)
    );
}

#[tokio::test]
async fn an_oversized_bulk_is_a_protocol_error_not_an_allocation() {
    let (addr, _task) = scripted(b"$999999999999\r\n").await;
    let mut r = Redis::new(RedisConfig::new(addr));
    let mut p = Pipeline::new();
    p.cmd(&["GET", "k"]);
    let e = r.pipeline(&p).await.unwrap_err();
    assert!(matches!(e, RedisError::Protocol { .. }), "{e}");
    assert!(!r.is_connected());
}

#[tokio::test]
async fn a_silent_server_times_out_and_the_next_call_waits_out_the_backoff() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let _hold = tokio::spawn(async move {
        let (_s, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let mut cfg = RedisConfig::new(addr);
    cfg.command_timeout = Duration::from_millis(50);
    let mut r = Redis::new(cfg);
    let started = std::time::Instant::now();
    let e = r.ping().await.unwrap_err();
    assert!(matches!(e, RedisError::Timeout { .. }), "{e}");
    assert!(started.elapsed() < Duration::from_secs(2));
    let e = r.ping().await.unwrap_err();
    assert!(matches!(e, RedisError::Backoff { .. }), "{e}");
}

/// What Redis does to a client without `AUTH` that sends a long command: `NOAUTH` for each
/// command before it, a protocol error, then it closes the connection.
#[tokio::test]
async fn a_refusal_before_the_connection_closes_is_the_error_not_the_closed_socket() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let _server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = s.read(&mut buf).await.unwrap();
        s.write_all(
            b"-NOAUTH Authentication required.\r\n-NOAUTH Authentication required.\r\n\
              -ERR Protocol error: unauthenticated multibulk length\r\n",
        )
        .await
        .unwrap();
    });
    let mut r = Redis::new(RedisConfig::new(addr));
    let mut p = Pipeline::new();
    p.cmd(&["ZADD", "r", "1", "x"])
        .cmd(&["ZCARD", "r"])
        .cmd(&[
            "MGET", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k",
        ])
        .cmd(&["SCARD", "s"]);
    let e = r.pipeline(&p).await.unwrap_err();
    assert!(
        matches!(&e, RedisError::Server { message } if message == "NOAUTH Authentication required."),
        "{e:?}"
    );
    assert!(!r.is_connected());
}

#[tokio::test]
async fn nothing_listening_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let mut r = Redis::new(RedisConfig::new(addr));
    let e = r.ping().await.unwrap_err();
    assert!(matches!(e, RedisError::Connect { .. }), "{e}");
}

#[test]
fn integers_read_from_bulk_strings_and_nil() {
    assert_eq!(Value::Bulk(b"17".to_vec()).as_i64(), Some(17));
    assert_eq!(Value::Nil.as_i64(), Some(0));
    assert_eq!(Value::Bulk(b"x".to_vec()).as_i64(), None);
    assert_eq!(Value::Status("OK".into()).as_i64(), None);
}
