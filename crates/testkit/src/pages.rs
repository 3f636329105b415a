//! A metrics server that answers every request with a page the test computes: stands in for a
//! model server's `/metrics` where a test sets the gauges itself (an emulated fleet is the
//! heavier alternative).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The page, computed for every request.
pub type Page = Arc<dyn Fn() -> String + Send + Sync>;

/// A vLLM page with `waiting` requests waiting, none running and 10% KV cache in use.
pub fn vllm_page(waiting: u32) -> String {
    format!(
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name=\"m\"}} {waiting}\n\
         # TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"m\"}} 0\n\
         # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{model_name=\"m\"}} 0.1\n"
    )
}

/// Serves `page()` as `200 text/plain` to every HTTP/1.1 request on a free loopback port, keeping
/// connections alive, until the runtime ends. Returns the address.
///
/// # Panics
/// When no loopback port can be bound (a test cannot go on without it).
pub async fn page_server(page: Page) -> SocketAddr {
    serve_loopback("the page server", move |s| answer(s, Arc::clone(&page))).await
}

/// Binds a free loopback port and hands every connection to `serve` on a task of its own,
/// until the runtime ends. Returns the address. `what` names the server in the panic.
///
/// # Panics
/// When no loopback port can be bound (a test cannot go on without it).
pub(crate) async fn serve_loopback<F, Fut>(what: &str, serve: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("a loopback port for {what}: {e}"));
    #[allow(
        clippy::expect_used,
        reason = "a test helper: a panic is a failed test"
    )]
    let addr = listener.local_addr().expect("the bound address");
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(serve(s));
        }
    });
    addr
}

/// Answers every HTTP/1.1 request on `s` with `page()` (`200 text/plain`) until the client
/// closes: the connection side of [`page_server`], for a test that runs its own listener (one
/// it kills and restarts, say).
pub async fn answer(mut s: TcpStream, page: Page) {
    let mut buf = vec![0u8; 4096];
    loop {
        // One request head, then the answer.
        let mut got = 0;
        loop {
            match s.read(&mut buf[got..]).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got += n,
            }
            if buf[..got].windows(4).any(|w| w == b"\r\n\r\n") || got == buf.len() {
                break;
            }
        }
        let body = page();
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        if s.write_all(head.as_bytes()).await.is_err()
            || s.write_all(body.as_bytes()).await.is_err()
        {
            return;
        }
    }
}
