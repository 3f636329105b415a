//! A small open-loop HTTP load generator for the gateway-versus-nginx benchmark.
//!
//! `loadgen URL RATE SECONDS CONNECTIONS` sends POSTs of one small chat request at a fixed RATE
//! (requests per second, 0 = as fast as the connections allow) over CONNECTIONS keep-alive
//! HTTP/1.1 connections for SECONDS, after a one-second warm-up, and prints one line:
//! `sent=.. ok=.. errors=.. rps=.. p50_us=.. p90_us=.. p99_us=.. max_us=..`.
//!
//! Requests are scheduled at fixed times and handed to whichever connection is free. Latency is
//! measured from each request's scheduled time, so a stalled proxy is charged for the requests
//! that queued behind it (no coordinated omission); tokio's timer granularity (1 ms) bounds how
//! late a request can leave, the same for every target.
#![allow(clippy::print_stdout, reason = "a command-line tool")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

const BODY: &[u8] =
    br#"{"model":"m","messages":[{"role":"user","content":"Say hello."}],"max_tokens":1}"#;

struct Args {
    host: String,
    path: String,
    rate: f64,
    seconds: f64,
    connections: usize,
}

fn args() -> Result<Args, Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() != 4 {
        return Err("usage: loadgen URL RATE SECONDS CONNECTIONS".into());
    }
    let uri: http::Uri = a[0].parse()?;
    Ok(Args {
        host: uri.authority().ok_or("URL needs host:port")?.to_string(),
        path: uri.path().to_owned(),
        rate: a[1].parse()?,
        seconds: a[2].parse()?,
        connections: a[3].parse()?,
    })
}

async fn worker(
    a: Arc<Args>,
    next: Arc<AtomicU64>,
    start: Instant,
    total: u64,
    measure_from: u64,
) -> Result<(Vec<u32>, u64), Box<dyn std::error::Error + Send + Sync>> {
    let connect = || async {
        let stream = TcpStream::connect(&a.host).await?;
        stream.set_nodelay(true)?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(send)
    };
    let mut send = connect().await?;
    let mut lat = Vec::new();
    let mut errors = 0;
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= total {
            return Ok((lat, errors));
        }
        let due = if a.rate > 0.0 {
            let due = start + Duration::from_secs_f64(i as f64 / a.rate);
            tokio::time::sleep_until(due).await;
            due
        } else {
            Instant::now()
        };
        // A server may close a keep-alive connection after some requests (nginx does after
        // `keepalive_requests`): open a new one, as any client would.
        if send.ready().await.is_err() {
            send = connect().await?;
        }
        let req = Request::post(a.path.as_str())
            .header("host", a.host.as_str())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(BODY)))?;
        let ok = match send.send_request(req).await {
            Ok(resp) => {
                let ok = resp.status().is_success();
                resp.into_body().collect().await.is_ok() && ok
            }
            Err(_) => false,
        };
        if i >= measure_from {
            if ok {
                lat.push(u32::try_from(due.elapsed().as_micros()).unwrap_or(u32::MAX));
            } else {
                errors += 1;
            }
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let a = Arc::new(args().map_err(|e| e.to_string())?);
    let warmup = 1.0;
    let rate = if a.rate > 0.0 { a.rate } else { 1e9 };
    let (total, measure_from) = if a.rate > 0.0 {
        (((a.seconds + warmup) * rate) as u64, (warmup * rate) as u64)
    } else {
        (u64::MAX, 0)
    };
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let stop_at = start + Duration::from_secs_f64(a.seconds + warmup);
    let mut handles = Vec::new();
    for _ in 0..a.connections {
        handles.push(tokio::spawn(worker(
            Arc::clone(&a),
            Arc::clone(&next),
            start,
            total,
            measure_from,
        )));
    }
    if a.rate <= 0.0 {
        // Closed loop: stop handing out requests when the time is up.
        tokio::time::sleep_until(stop_at).await;
        next.store(u64::MAX / 2, Ordering::Relaxed);
    }
    let mut lat = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (l, e) = h.await??;
        lat.extend(l);
        errors += e;
    }
    let elapsed = if a.rate > 0.0 {
        a.seconds
    } else {
        a.seconds + warmup
    };
    lat.sort_unstable();
    let pct = |p: f64| {
        if lat.is_empty() {
            0
        } else {
            lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)]
        }
    };
    println!(
        "sent={} ok={} errors={} rps={:.0} p50_us={} p90_us={} p99_us={} max_us={}",
        lat.len() as u64 + errors,
        lat.len(),
        errors,
        lat.len() as f64 / elapsed,
        pct(0.50),
        pct(0.90),
        pct(0.99),
        lat.last().copied().unwrap_or(0),
    );
    Ok(())
}
