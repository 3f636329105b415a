//! CPU cost of scraping many pods: `cargo run --release -p infergate-metrics --example scrape_load`.
//!
//! Starts a child process that serves a real vLLM 0.32 page (635 lines, 52.8 KB) on `--pods`
//! ports of 127.0.0.1, with the head a vLLM server sends (uvicorn's `date` and `server` headers,
//! `content-length`, the Prometheus content type), then scrapes all of them every `--interval-ms`
//! with the production [`Scraper`] in its default configuration for `--seconds` after a warm-up,
//! and reports the scraper process's CPU time (user + system, read from `/proc/self/stat`) divided
//! by wall time, i.e. cores used. The child's CPU is reported separately and is not counted.
//! Options: `--pods 1000 --interval-ms 50 --seconds 10`, and `--caller-runtime` to scrape on the
//! example's own 2-worker runtime instead of the scraper's thread (`own_thread: false`).
#![allow(clippy::print_stdout, reason = "the example's output is its report")]
#![allow(clippy::unwrap_used, reason = "a benchmark harness fails loudly")]

use std::error::Error;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use infergate_metrics::{Clock, ScrapeMetrics, Scraper, ScraperConfig, Target, Update};
use infergate_scheduler::EngineType;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const PAGE: &[u8] = include_bytes!("../tests/fixtures/vllm-after-load.txt");

struct Args {
    pods: usize,
    interval: Duration,
    seconds: u64,
    caller_runtime: bool,
}

fn args() -> Result<(bool, Args), Box<dyn Error>> {
    let mut serve = false;
    let mut a = Args {
        pods: 1000,
        interval: Duration::from_millis(50),
        seconds: 10,
        caller_runtime: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "serve" => serve = true,
            "--pods" => a.pods = it.next().ok_or("--pods needs a value")?.parse()?,
            "--interval-ms" => {
                a.interval =
                    Duration::from_millis(it.next().ok_or("--interval-ms needs a value")?.parse()?);
            }
            "--seconds" => a.seconds = it.next().ok_or("--seconds needs a value")?.parse()?,
            "--caller-runtime" => a.caller_runtime = true,
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    Ok((serve, a))
}

/// CPU seconds of a process from its `/proc/<pid>/stat`: (user, system).
fn cpu_times(pid: &str, ticks_per_sec: f64) -> Result<(f64, f64), Box<dyn Error>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').ok_or("bad /proc stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11).ok_or("short stat")?.parse()?;
    let stime: f64 = fields.get(12).ok_or("short stat")?.parse()?;
    Ok((utime / ticks_per_sec, stime / ticks_per_sec))
}

/// CPU seconds (user + system) of a process.
fn cpu_seconds(pid: &str, ticks_per_sec: f64) -> Result<f64, Box<dyn Error>> {
    let (user, system) = cpu_times(pid, ticks_per_sec)?;
    Ok(user + system)
}

fn ticks_per_sec() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The child: serve the page on `pods` ports and print them, one per line.
fn serve(pods: usize) -> Result<(), Box<dyn Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        // The head uvicorn writes for vLLM's /metrics route (a fixed date: the child does not
        // format one per answer, which a real server does but the scraper never reads).
        let mut response = format!(
            "HTTP/1.1 200 OK\r\ndate: Mon, 30 Nov 2026 06:00:00 GMT\r\nserver: uvicorn\r\n\
             content-length: {}\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n\r\n",
            PAGE.len()
        )
        .into_bytes();
        response.extend_from_slice(PAGE);
        let response: Arc<[u8]> = response.into();
        let mut out = std::io::stdout().lock();
        for _ in 0..pods {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            writeln!(out, "{}", listener.local_addr()?)?;
            let response = Arc::clone(&response);
            tokio::spawn(async move {
                while let Ok((mut stream, _)) = listener.accept().await {
                    let response = Arc::clone(&response);
                    tokio::spawn(async move {
                        let _ = stream.set_nodelay(true);
                        let mut buf = Vec::with_capacity(512);
                        let mut chunk = [0u8; 512];
                        loop {
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                            while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                buf.drain(..end + 4);
                                if stream.write_all(&response).await.is_err() {
                                    return;
                                }
                            }
                        }
                    });
                }
            });
        }
        writeln!(out, "ready")?;
        out.flush()?;
        drop(out);
        std::future::pending::<()>().await;
        Ok::<(), Box<dyn Error>>(())
    })
}

fn main() -> Result<(), Box<dyn Error>> {
    let (is_server, a) = args()?;
    if is_server {
        return serve(a.pods);
    }
    let mut child = Command::new(std::env::current_exe()?)
        .args(["serve", "--pods", &a.pods.to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let child_pid = child.id().to_string();
    let mut addrs: Vec<SocketAddr> = Vec::with_capacity(a.pods);
    for line in BufReader::new(child.stdout.take().ok_or("no child stdout")?).lines() {
        let line = line?;
        if line == "ready" {
            break;
        }
        addrs.push(line.parse()?);
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let ticks = ticks_per_sec();
    let result = rt.block_on(async {
        let snapshots = Arc::new(AtomicU64::new(0));
        let stale = Arc::new(AtomicU64::new(0));
        let metrics = ScrapeMetrics::default();
        // Defaults scaled to the interval (the defaults are 5 intervals of 50 ms).
        let config = ScraperConfig {
            interval: a.interval,
            stale_after: a.interval * 5,
            timeout: a.interval * 5,
            own_thread: !a.caller_runtime,
            ..ScraperConfig::default()
        };
        let sink = {
            let (snapshots, stale) = (Arc::clone(&snapshots), Arc::clone(&stale));
            move |_: &usize, u: Update| match u {
                Update::Snapshot(s) => {
                    std::hint::black_box(s);
                    snapshots.fetch_add(1, Ordering::Relaxed);
                }
                Update::Late { .. } | Update::Stale { .. } => {
                    stale.fetch_add(1, Ordering::Relaxed);
                }
            }
        };
        let scraper = Scraper::spawn(config.clone(), Clock::starting_now(), metrics.clone(), sink)?;
        scraper.set_targets(
            addrs
                .iter()
                .enumerate()
                .map(|(i, addr)| Target::new(i, *addr, EngineType::Vllm)),
        )?;
        tokio::time::sleep(Duration::from_secs(2)).await;

        let (snap0, stale0) = (
            snapshots.load(Ordering::Relaxed),
            stale.load(Ordering::Relaxed),
        );
        const REASONS: [&str; 10] = [
            "connect",
            "http",
            "status",
            "timeout",
            "body_too_large",
            "parse_truncated",
            "parse_malformed",
            "parse_invalid_value",
            "parse_duplicate_series",
            "parse_missing_family",
        ];
        let errors = |m: &ScrapeMetrics| -> u64 { REASONS.iter().map(|r| m.errors(r)).sum() };
        let by_reason =
            |m: &ScrapeMetrics| -> Vec<u64> { REASONS.iter().map(|r| m.errors(r)).collect() };
        let reasons0 = by_reason(&metrics);
        let err0 = errors(&metrics);
        let (times0, child0, wall0) = (
            cpu_times("self", ticks)?,
            cpu_seconds(&child_pid, ticks)?,
            Instant::now(),
        );
        tokio::time::sleep(Duration::from_secs(a.seconds)).await;
        let (times1, child1, wall) = (
            cpu_times("self", ticks)?,
            cpu_seconds(&child_pid, ticks)?,
            wall0.elapsed(),
        );
        let (cpu0, cpu1) = (times0.0 + times0.1, times1.0 + times1.1);
        let scrapes = snapshots.load(Ordering::Relaxed) - snap0;
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let wall_s = wall.as_secs_f64();
        #[allow(clippy::cast_precision_loss, reason = "report arithmetic")]
        let (rate, expected) = (
            scrapes as f64 / wall_s,
            a.pods as f64 / a.interval.as_secs_f64(),
        );
        println!(
            "pods {} interval {:?} window {:.1} s; scrapes on {}; machine load average {}",
            a.pods,
            a.interval,
            wall_s,
            if a.caller_runtime {
                "the caller's 2-worker runtime"
            } else {
                "the scraper's own thread"
            },
            load.split_whitespace().next().unwrap_or("?")
        );
        println!(
            "scrapes/s {rate:.0} (schedule asks {expected:.0}); errors {}; stale reports {}",
            errors(&metrics) - err0,
            stale.load(Ordering::Relaxed) - stale0
        );
        let failed: Vec<String> = REASONS
            .iter()
            .zip(by_reason(&metrics).iter().zip(&reasons0))
            .filter(|(_, (now, then))| now > then)
            .map(|(r, (now, then))| format!("{r} {}", now - then))
            .collect();
        if !failed.is_empty() {
            println!("errors by reason: {}", failed.join(", "));
        }
        println!(
            "scraper CPU: {:.3} cores ({:.2} s CPU over {:.1} s)",
            (cpu1 - cpu0) / wall_s,
            cpu1 - cpu0,
            wall_s
        );
        #[allow(clippy::cast_precision_loss, reason = "report arithmetic")]
        let per = |seconds: f64| seconds / scrapes.max(1) as f64 * 1e6;
        println!(
            "scraper CPU per scrape: {:.1} µs (user {:.1} µs, system {:.1} µs)",
            per(cpu1 - cpu0),
            per(times1.0 - times0.0),
            per(times1.1 - times0.1)
        );
        println!(
            "page server (child, not counted): {:.3} cores",
            (child1 - child0) / wall_s
        );
        scraper.shutdown();
        Ok::<(), Box<dyn Error>>(())
    });
    let _ = child.kill();
    let _ = child.wait();
    result
}
