//! The soak run: the release `infergate gateway` in front of an emulated fleet at a steady load
//! for a long time, watching the gateway process for growth.
//!
//! ```text
//! cargo build --release -p infergate-cli
//! cargo run --release -p infergate-bench --example soak -- --minutes 30
//! ```
//!
//! It serves the fleet (`--fleet`, default `crates/sim/fleets/mixed-h100-a10g.yaml`) in this
//! process, writes a gateway configuration routing the fleet's model to every pod, starts the
//! gateway binary (`--bin`, default `target/release/infergate`) as a child process and sends
//! chat requests at a fixed rate (`--rate`, default 100/s, open loop over `--connections`
//! keep-alive HTTP/1.1 connections; every prompt is different, so the prefix index keeps
//! admitting and evicting). Every `--every` seconds (default 10) it samples the gateway's resident
//! memory (`VmRSS` in `/proc/PID/status`), its open file descriptors (`/proc/PID/fd`) and the
//! latency of the requests finished in that interval (p50, p99, measured from each request's
//! scheduled send time), into `OUT/soak.csv` (`--out`, default `target/soak`), and at the end
//! plots them in `OUT/soak.svg` and writes `OUT/summary.md`.
//!
//! The run passes when every RSS sample after the warm-up (`--warmup-minutes`, default 5) is
//! within 10% of the first sample after it and the fd count did not grow by more than the
//! connections' churn allows (10 over the first post-warm-up sample); it exits with status 1
//! otherwise. Failed requests are counted and reported, not part of the verdict: on a shared
//! machine a stall of the whole host makes scrapes late and the gateway answers 503 by design.
//! Pods count as stale after 2 s without a metrics page (the default 250 ms is for a quiet
//! machine; this run measures the gateway's resources, not its freshness bound).
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool"
)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use infergate_bench::report::{Panel, time_series_svg};
use infergate_sim::{FleetSpec, serve_fleet};
use tokio::net::TcpStream;
use tokio::time::Instant;

#[path = "common/process.rs"]
mod process;

use process::{free_port, stop};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    minutes: f64,
    warmup_minutes: f64,
    rate: f64,
    connections: usize,
    every: f64,
    bin: PathBuf,
    fleet: PathBuf,
    out: PathBuf,
}

fn args() -> Result<Args, BoxError> {
    let mut a = Args {
        minutes: 30.0,
        warmup_minutes: 5.0,
        rate: 100.0,
        connections: 32,
        every: 10.0,
        bin: PathBuf::from("target/release/infergate"),
        fleet: PathBuf::from("crates/sim/fleets/mixed-h100-a10g.yaml"),
        out: PathBuf::from("target/soak"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--minutes" => a.minutes = value()?.parse()?,
            "--warmup-minutes" => a.warmup_minutes = value()?.parse()?,
            "--rate" => a.rate = value()?.parse()?,
            "--connections" => a.connections = value()?.parse()?,
            "--every" => a.every = value()?.parse()?,
            "--bin" => a.bin = value()?.into(),
            "--fleet" => a.fleet = value()?.into(),
            "--out" => a.out = value()?.into(),
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: soak [--minutes 30] [--warmup-minutes 5] \
                     [--rate 100] [--connections 32] [--every 10] [--bin PATH] [--fleet FILE] \
                     [--out DIR]"
                )
                .into());
            }
        }
    }
    if a.rate <= 0.0 || a.connections == 0 || a.every <= 0.0 || a.minutes <= 0.0 {
        return Err("--rate, --connections, --every and --minutes must be above zero".into());
    }
    Ok(a)
}

/// One sample of the gateway process and of the requests finished since the previous one.
struct Sample {
    t: f64,
    rss_kib: u64,
    fds: usize,
    ok: usize,
    errors: u64,
    p50_ms: f64,
    p99_ms: f64,
}

fn rss_kib(pid: u32) -> Result<u64, BoxError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or("no VmRSS line")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .ok_or("bad VmRSS line")?
        .parse()?)
}

fn open_fds(pid: u32) -> Result<usize, BoxError> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

fn percentile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    f64::from(sorted[i]) / 1000.0
}

fn body(model: &str, i: u64) -> Bytes {
    // Every prompt differs after a shared opening, like chat turns of many users.
    let prompt = format!(
        "You are a helpful assistant for the soak test. User {} asks question {}: how far is \
         the moon from station {}?",
        i % 997,
        i,
        i.wrapping_mul(2_654_435_761) % 100_003
    );
    Bytes::from(
        serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 8,
        })
        .to_string(),
    )
}

struct Load {
    host: String,
    model: String,
    rate: f64,
    total: u64,
    next: AtomicU64,
    errors: AtomicU64,
    latencies_us: Mutex<Vec<u32>>,
}

async fn connection(load: Arc<Load>, start: Instant) -> Result<(), BoxError> {
    let connect = || async {
        let stream = TcpStream::connect(&load.host).await?;
        stream.set_nodelay(true)?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok::<_, BoxError>(send)
    };
    let mut send = connect().await?;
    loop {
        let i = load.next.fetch_add(1, Ordering::Relaxed);
        if i >= load.total {
            return Ok(());
        }
        let due = start + Duration::from_secs_f64(i as f64 / load.rate);
        tokio::time::sleep_until(due).await;
        if send.ready().await.is_err() {
            send = connect().await?;
        }
        let req = Request::post("/v1/chat/completions")
            .header("host", &load.host)
            .header("content-type", "application/json")
            .body(Full::new(body(&load.model, i)))?;
        let ok = match send.send_request(req).await {
            Ok(resp) => {
                let status = resp.status();
                let drained = resp.into_body().collect().await.is_ok();
                status.is_success() && drained
            }
            Err(_) => false,
        };
        if ok {
            let us = u32::try_from(due.elapsed().as_micros()).unwrap_or(u32::MAX);
            load.latencies_us
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(us);
        } else {
            load.errors.fetch_add(1, Ordering::Relaxed);
            // The connection may be broken: start a fresh one.
            send = connect().await?;
        }
    }
}

fn write_config(
    path: &Path,
    listen: u16,
    admin: u16,
    model: &str,
    endpoints: &[String],
    auth_none: bool,
) -> Result<(), BoxError> {
    let mut c = String::new();
    if auth_none {
        c.push_str("auth: none\n");
    }
    let _ = write!(
        c,
        "listen: 127.0.0.1:{listen}\nadmin: 127.0.0.1:{admin}\n\
         scrape: {{ intervalMs: 50, staleAfterMs: 2000, timeoutMs: 1000 }}\nmodels:\n  - name: \"{model}\"\n    \
         scheduler: {{ preset: infergate }}\n    endpoints: [{}]\n",
        endpoints.join(", ")
    );
    std::fs::write(path, c)?;
    Ok(())
}

fn check_config(bin: &Path, config: &Path) -> Result<bool, BoxError> {
    let out = Command::new(bin)
        .args(["gateway", "--check", "-c"])
        .arg(config)
        .output()?;
    Ok(out.status.success())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let a = args()?;
    std::fs::create_dir_all(&a.out)?;
    let spec = FleetSpec::from_file(&a.fleet)?;
    let model = spec
        .pods
        .first()
        .map(|p| p.model.to_string())
        .ok_or("the fleet has no pods")?;
    let (stop_fleet, fleet_stopped) = tokio::sync::oneshot::channel::<()>();
    let fleet = serve_fleet(&spec, async {
        let _ = fleet_stopped.await;
    })
    .await?;
    let endpoints: Vec<String> = fleet.pods.iter().map(|p| p.addr.to_string()).collect();
    let (listen, admin) = (free_port()?, free_port()?);
    let config = a.out.join("gateway.yaml");
    // The gateway requires an explicit `auth:` setting; a build from before it does not know it.
    write_config(&config, listen, admin, &model, &endpoints, true)?;
    if !check_config(&a.bin, &config)? {
        write_config(&config, listen, admin, &model, &endpoints, false)?;
        if !check_config(&a.bin, &config)? {
            return Err(format!("{} rejects {}", a.bin.display(), config.display()).into());
        }
    }
    let log = std::fs::File::create(a.out.join("gateway.log"))?;
    let mut child = Command::new(&a.bin)
        .args(["gateway", "-c"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    let pid = child.id();
    let host = format!("127.0.0.1:{listen}");
    // Wait until the gateway answers (metrics scraped, every pod fresh).
    let ready = async {
        loop {
            let probe = Arc::new(Load {
                host: host.clone(),
                model: model.clone(),
                rate: 1000.0,
                total: 1,
                next: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                latencies_us: Mutex::new(Vec::new()),
            });
            if connection(Arc::clone(&probe), Instant::now()).await.is_ok()
                && probe.errors.load(Ordering::Relaxed) == 0
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(30), ready)
        .await
        .is_err()
    {
        stop(&mut child);
        return Err("the gateway did not serve a request within 30 s".into());
    }
    let seconds = a.minutes * 60.0;
    let load = Arc::new(Load {
        host,
        model,
        rate: a.rate,
        total: (a.rate * seconds) as u64,
        next: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        latencies_us: Mutex::new(Vec::new()),
    });
    eprintln!(
        "soak: gateway pid {pid}, {} pods, {} req/s over {} connections for {} min; samples every {} s in {}",
        endpoints.len(),
        a.rate,
        a.connections,
        a.minutes,
        a.every,
        a.out.join("soak.csv").display()
    );
    let start = Instant::now();
    let workers: Vec<_> = (0..a.connections)
        .map(|_| tokio::spawn(connection(Arc::clone(&load), start)))
        .collect();
    let mut csv = String::from("t_s,rss_kib,fds,requests_ok,errors,p50_ms,p99_ms\n");
    let mut samples = Vec::new();
    let mut errors_before = 0;
    let mut k = 1u64;
    loop {
        let at = start + Duration::from_secs_f64(a.every * k as f64);
        tokio::time::sleep_until(at).await;
        k += 1;
        let mut lat = std::mem::take(
            &mut *load
                .latencies_us
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        lat.sort_unstable();
        let errors = load.errors.load(Ordering::Relaxed);
        let s = Sample {
            t: start.elapsed().as_secs_f64(),
            rss_kib: rss_kib(pid)?,
            fds: open_fds(pid)?,
            ok: lat.len(),
            errors: errors - errors_before,
            p50_ms: percentile(&lat, 0.50),
            p99_ms: percentile(&lat, 0.99),
        };
        errors_before = errors;
        let _ = writeln!(
            csv,
            "{:.1},{},{},{},{},{:.2},{:.2}",
            s.t, s.rss_kib, s.fds, s.ok, s.errors, s.p50_ms, s.p99_ms
        );
        std::fs::write(a.out.join("soak.csv"), &csv)?;
        eprintln!(
            "t={:>6.0}s rss={:>7} KiB fds={:>4} ok={:>5} errors={} p50={:.2} ms p99={:.2} ms",
            s.t, s.rss_kib, s.fds, s.ok, s.errors, s.p50_ms, s.p99_ms
        );
        samples.push(s);
        if start.elapsed().as_secs_f64() + 1e-3 >= seconds {
            break;
        }
    }
    for w in workers {
        if let Ok(Err(e)) = w.await {
            eprintln!("soak: a load connection failed: {e}");
        }
    }
    stop(&mut child);
    let _ = stop_fleet.send(());
    fleet.wait().await;
    let verdict = summarize(&a, &samples, load.errors.load(Ordering::Relaxed));
    if verdict {
        Ok(())
    } else {
        std::process::exit(1);
    }
}

/// Writes the plot and the summary; returns whether the run passed.
fn summarize(a: &Args, samples: &[Sample], errors: u64) -> bool {
    let mib = |kib: u64| kib as f64 / 1024.0;
    let warm: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.t >= a.warmup_minutes * 60.0)
        .collect();
    let first = samples.first();
    let base = warm.first().copied();
    let last = samples.last();
    let max_rss = samples.iter().map(|s| s.rss_kib).max().unwrap_or(0);
    let (dev, fd_growth) = match base {
        Some(b) => (
            warm.iter()
                .map(|s| (s.rss_kib as f64 - b.rss_kib as f64).abs() / b.rss_kib.max(1) as f64)
                .fold(0.0, f64::max),
            warm.iter()
                .map(|s| s.fds.saturating_sub(b.fds))
                .max()
                .unwrap_or(0),
        ),
        None => (f64::INFINITY, 0),
    };
    let ok: usize = samples.iter().map(|s| s.ok).sum();
    let pass = dev <= 0.10 && fd_growth <= 10 && base.is_some();
    let points = |f: &dyn Fn(&Sample) -> f64| -> Vec<(f64, f64)> {
        samples.iter().map(|s| (s.t, f(s))).collect()
    };
    let svg = time_series_svg(
        &format!(
            "infergate gateway soak: {} min at {} req/s, {}",
            a.minutes,
            a.rate,
            a.fleet.display()
        ),
        &[
            Panel {
                title: "resident memory (VmRSS)",
                unit: "MiB",
                series: vec![("RSS", points(&|s| mib(s.rss_kib)))],
            },
            Panel {
                title: "open file descriptors",
                unit: "count",
                series: vec![("fds", points(&|s| s.fds as f64))],
            },
            Panel {
                title: "latency per 10 s interval",
                unit: "ms",
                series: vec![
                    ("p50", points(&|s| s.p50_ms)),
                    ("p99", points(&|s| s.p99_ms)),
                ],
            },
        ],
    );
    let _ = std::fs::write(a.out.join("soak.svg"), svg);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Soak: {} min at {} req/s over {} connections, fleet {}, samples every {} s.\n",
        a.minutes,
        a.rate,
        a.connections,
        a.fleet.display(),
        a.every
    );
    let _ = writeln!(md, "| figure | value |\n|---|---|");
    let row = |md: &mut String, k: &str, v: String| {
        let _ = writeln!(md, "| {k} | {v} |");
    };
    row(&mut md, "requests answered 200", ok.to_string());
    row(&mut md, "requests failed", errors.to_string());
    row(
        &mut md,
        "RSS first sample",
        format!("{:.1} MiB", first.map_or(0.0, |s| mib(s.rss_kib))),
    );
    row(
        &mut md,
        &format!("RSS at {} min (after warm-up)", a.warmup_minutes),
        format!("{:.1} MiB", base.map_or(0.0, |s| mib(s.rss_kib))),
    );
    row(
        &mut md,
        "RSS last sample",
        format!("{:.1} MiB", last.map_or(0.0, |s| mib(s.rss_kib))),
    );
    row(&mut md, "RSS max", format!("{:.1} MiB", mib(max_rss)));
    row(
        &mut md,
        "largest RSS deviation after warm-up",
        format!("{:.1}% (limit 10%)", dev * 100.0),
    );
    row(
        &mut md,
        "open fds first / last / max",
        format!(
            "{} / {} / {}",
            first.map_or(0, |s| s.fds),
            last.map_or(0, |s| s.fds),
            samples.iter().map(|s| s.fds).max().unwrap_or(0)
        ),
    );
    row(
        &mut md,
        "p50 per interval min / median / max",
        interval_stats(samples, |s| s.p50_ms),
    );
    row(
        &mut md,
        "p99 per interval min / median / max",
        interval_stats(samples, |s| s.p99_ms),
    );
    row(
        &mut md,
        "verdict",
        if pass { "pass" } else { "FAIL" }.into(),
    );
    let _ = std::fs::write(a.out.join("summary.md"), &md);
    println!("{md}");
    pass
}

fn interval_stats(samples: &[Sample], f: fn(&Sample) -> f64) -> String {
    let mut v: Vec<f64> = samples.iter().filter(|s| s.ok > 0).map(f).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return "-".into();
    }
    format!(
        "{:.2} / {:.2} / {:.2} ms",
        v[0],
        v[v.len() / 2],
        v[v.len() - 1]
    )
}
