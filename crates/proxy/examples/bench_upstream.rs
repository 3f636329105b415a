//! A fast static model server for the gateway-versus-nginx benchmark (`benches/nginx/compare.sh`).
//!
//! `cargo run --release -p infergate-proxy --example bench_upstream -- 127.0.0.1:18001 ...`
//!
//! Every address answers any POST at once with the same small chat completion, and `/metrics`
//! with a minimal idle vLLM page, so what the benchmark measures is the proxy in between.
#![allow(clippy::print_stdout, reason = "a command-line tool")]

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

const CHAT: &[u8] = br#"{"id":"bench","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8}}"#;
const METRICS: &[u8] = b"vllm:num_requests_waiting{model_name=\"m\"} 0\nvllm:num_requests_running{model_name=\"m\"} 0\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0\n";

async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = if req.uri().path() == "/metrics" {
        METRICS
    } else {
        CHAT
    };
    let mut r = Response::new(Full::new(Bytes::from_static(body)));
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addrs: Vec<SocketAddr> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    if addrs.is_empty() {
        return Err("usage: bench_upstream ADDR...".into());
    }
    let mut tasks = Vec::new();
    for addr in addrs {
        let listener = TcpListener::bind(addr).await?;
        println!("upstream listening on {addr}");
        tasks.push(tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                tokio::spawn(async move {
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service_fn(answer))
                        .await;
                });
            }
        }));
    }
    tokio::signal::ctrl_c().await?;
    Ok(())
}
