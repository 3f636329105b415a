#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body::Body as _;
use hyper::service::service_fn;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;

use super::*;

/// A server on 127.0.0.1 that answers every request with `hello` and counts its connections.
async fn server(close_after_each: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&conns);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = service_fn(move |_req: Request<Incoming>| async move {
                    let mut r = Response::new(Full::new(Bytes::from_static(b"hello")));
                    if close_after_each {
                        r.headers_mut()
                            .insert(http::header::CONNECTION, "close".parse().unwrap());
                    }
                    Ok::<_, Infallible>(r)
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, conns)
}

fn request(addr: SocketAddr) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}/v1/chat/completions"))
        .header(http::header::HOST, addr.to_string())
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

/// Reads the body to its end the way `body::Tracked` does, then releases the connection.
async fn read_all(resp: Response<Incoming>, mut lease: Lease) -> Vec<u8> {
    let mut body = resp.into_body();
    let mut out = Vec::new();
    loop {
        let frame = std::future::poll_fn(|cx| {
            lease.drive(cx);
            Pin::new(&mut body).poll_frame(cx)
        })
        .await;
        match frame {
            Some(f) => out.extend_from_slice(&f.unwrap().into_data().unwrap()),
            None => break,
        }
        if body.is_end_stream() {
            break;
        }
    }
    lease.release();
    out
}

const CONNECT: Duration = Duration::from_secs(2);
const IDLE: Duration = Duration::from_secs(60);

/// A request to `addr` on a pooled connection (idle up to [`IDLE`]) or a new one.
async fn send(
    up: &Arc<Upstreams>,
    addr: SocketAddr,
) -> Result<(Response<Incoming>, Lease), SendError> {
    up.send(
        addr,
        None,
        up.checkout(addr, IDLE, None),
        request(addr),
        CONNECT,
    )
    .await
}

#[tokio::test]
async fn sequential_requests_reuse_one_connection() {
    let (addr, conns) = server(false).await;
    let up = Arc::new(Upstreams::default());
    for _ in 0..5 {
        let (resp, lease) = send(&up, addr).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(read_all(resp, lease).await, b"hello");
        assert_eq!(up.idle(addr), 1);
    }
    assert_eq!(conns.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_connection_closed_by_the_server_is_not_reused() {
    let (addr, conns) = server(true).await;
    let up = Arc::new(Upstreams::default());
    for _ in 0..3 {
        let (resp, lease) = send(&up, addr).await.unwrap();
        assert_eq!(read_all(resp, lease).await, b"hello");
    }
    assert_eq!(conns.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_body_not_read_to_the_end_closes_its_connection() {
    let (addr, conns) = server(false).await;
    let up = Arc::new(Upstreams::default());
    let (resp, lease) = send(&up, addr).await.unwrap();
    drop((resp, lease));
    assert_eq!(up.idle(addr), 0);
    let (resp, lease) = send(&up, addr).await.unwrap();
    assert_eq!(read_all(resp, lease).await, b"hello");
    assert_eq!(conns.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn idle_connections_past_the_idle_timeout_are_not_reused() {
    let (addr, conns) = server(false).await;
    let up = Arc::new(Upstreams::default());
    let (resp, lease) = send(&up, addr).await.unwrap();
    read_all(resp, lease).await;
    // An idle timeout of zero: the pooled connection is too old by the time it is taken.
    let (resp, lease) = up
        .send(
            addr,
            None,
            up.checkout(addr, Duration::ZERO, None),
            request(addr),
            CONNECT,
        )
        .await
        .unwrap();
    read_all(resp, lease).await;
    assert_eq!(conns.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let up = Arc::new(Upstreams::default());
    let err = send(&up, addr).await.err().unwrap();
    assert!(matches!(err, SendError::Connect { .. }), "{err}");
}

/// A raw server: on each connection it reads one request per entry of `answers` and answers it
/// (`true`, keep-alive) or not (`false`), then closes the connection. Returns its address, the
/// requests it read, and a channel told of each connection it closed.
async fn raw_server(
    answers: &'static [bool],
) -> (
    SocketAddr,
    Arc<AtomicUsize>,
    tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let read = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&read);
    let (closed_tx, closed_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let (read, closed_tx) = (Arc::clone(&counted), closed_tx.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                for &answer in answers {
                    while !buf.ends_with(b"{}") {
                        let n = s.read(&mut chunk).await.unwrap();
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    buf.clear();
                    read.fetch_add(1, Ordering::SeqCst);
                    if answer {
                        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
                            .await
                            .unwrap();
                    }
                }
                drop(s);
                let _ = closed_tx.send(());
            });
        }
    });
    (addr, read, closed_rx)
}

#[tokio::test]
async fn a_connection_the_server_closed_while_idle_is_replaced() {
    // One keep-alive answer per connection, then the server closes the socket.
    let (addr, _, mut closed) = raw_server(&[true]).await;
    let up = Arc::new(Upstreams::default());
    for _ in 0..3 {
        let (resp, lease) = send(&up, addr).await.unwrap();
        assert_eq!(read_all(resp, lease).await, b"hello");
        closed.recv().await.unwrap();
    }
}

/// A server that answers the first request of each connection keep-alive and closes the
/// connection upon the second without answering: the keep-alive race, as the gateway sees it.
#[tokio::test]
async fn a_pooled_connection_closed_after_the_request_was_written_is_reused_http() {
    let (addr, read, _closed) = raw_server(&[true, false]).await;
    let up = Arc::new(Upstreams::default());
    let (resp, lease) = send(&up, addr).await.unwrap();
    assert_eq!(read_all(resp, lease).await, b"hello");
    let pooled = up
        .checkout(addr, IDLE, None)
        .expect("the connection is pooled");
    assert!(!pooled.may_race(), "used a moment ago");
    let err = up
        .send(addr, None, Some(pooled), request(addr), CONNECT)
        .await
        .err()
        .unwrap();
    assert!(err.on_reused(), "{err:?}");
    assert!(!err.is_before_send());
    assert_eq!(read.load(Ordering::SeqCst), 2, "the request was read");
    // Nothing pooled any more: a new connection, answered.
    let (resp, lease) = send(&up, addr).await.unwrap();
    assert_eq!(read_all(resp, lease).await, b"hello");
}

#[tokio::test]
async fn a_sweep_closes_expired_idle_connections_and_forgets_the_endpoint() {
    let (addr, _conns) = server(false).await;
    let up = Arc::new(Upstreams::default());
    let (resp, lease) = send(&up, addr).await.unwrap();
    read_all(resp, lease).await;
    assert_eq!(up.idle(addr), 1);
    up.sweep(IDLE);
    assert_eq!(up.idle(addr), 1, "a young connection stays");
    up.sweep(Duration::ZERO);
    assert_eq!(up.idle(addr), 0);
    assert!(up.idle.lock().unwrap().is_empty());
}

/// How long uvicorn (vLLM's and SGLang's API server) keeps an idle keep-alive connection open.
const UVICORN_KEEP_ALIVE: Duration = Duration::from_secs(5);

/// Makes the connections pooled for `addr` look idle for `rested` already.
fn age(up: &Upstreams, addr: SocketAddr, rested: Duration) {
    let mut idle = up.idle.lock().unwrap();
    for conn in idle.get_mut(&addr).unwrap() {
        conn.idle_since = Instant::now().checked_sub(rested).unwrap();
    }
}

/// Under the default `poolIdleMs` a connection that rested almost as long as uvicorn keeps it
/// (its timer about to fire as the next request goes out) is neither reused nor kept by the
/// sweep: the gateway retires it first. One that rested long enough to meet a shorter timer
/// (gunicorn's 2 s) is still reused, and gets the keep-alive race's second send.
#[tokio::test]
async fn the_default_pool_retires_a_connection_before_uvicorn_closes_it() {
    let pool_idle = crate::config::DEFAULT_POOL_IDLE;
    let (addr, conns) = server(false).await;
    let up = Arc::new(Upstreams::default());
    let (resp, lease) = send(&up, addr).await.unwrap();
    read_all(resp, lease).await;
    age(&up, addr, Duration::from_secs(2));
    let pooled = up.checkout(addr, pool_idle, None).expect("young enough");
    assert!(pooled.may_race());
    let (resp, lease) = up
        .send(addr, None, Some(pooled), request(addr), CONNECT)
        .await
        .unwrap();
    read_all(resp, lease).await;
    assert_eq!(conns.load(Ordering::SeqCst), 1, "reused");
    let near = UVICORN_KEEP_ALIVE - Duration::from_millis(500);
    age(&up, addr, near);
    up.sweep(pool_idle);
    assert_eq!(up.idle(addr), 0, "the sweep closes it");
    let (resp, lease) = send(&up, addr).await.unwrap();
    read_all(resp, lease).await;
    age(&up, addr, near);
    assert!(up.checkout(addr, pool_idle, None).is_none());
    assert!(
        RACE_IDLE < pool_idle,
        "no pooled connection would get the second send"
    );
}

/// What a connection the pool retired costs the next request: `n` requests on one pooled
/// connection, then `n` each on a new one, to a loopback server; prints the median of each.
/// Run: `cargo test -p infergate-proxy --lib -- --ignored --nocapture connect_cost`.
#[tokio::test]
#[ignore = "a measurement, not a check"]
async fn connect_cost() {
    let n = 2_000;
    let (addr, _) = server(false).await;
    let up = Arc::new(Upstreams::default());
    let median = async |pool_idle: Duration| {
        let mut took = Vec::with_capacity(n);
        for _ in 0..n {
            let t = std::time::Instant::now();
            let pooled = up.checkout(addr, pool_idle, None);
            let (resp, lease) = up
                .send(addr, None, pooled, request(addr), CONNECT)
                .await
                .unwrap();
            read_all(resp, lease).await;
            took.push(t.elapsed());
        }
        took.sort();
        took[n / 2]
    };
    let pooled = median(IDLE).await;
    let fresh = median(Duration::ZERO).await;
    println!("median request: pooled {pooled:?}, new connection {fresh:?}");
}
