//! CPU time of parsing one page, immune to other load on the machine:
//! `cargo run --release -p infergate-metrics --example parse_cpu`.
//!
//! Parses each fixture page `--iterations` times (default 100,000) on one thread and divides the
//! thread's CPU time (user + system, from `/proc/thread-self/stat`) by the count. Wall time per
//! parse is printed beside it: on a busy machine it is the larger one. For an exact, repeatable
//! count of instructions, run the built binary under
//! `valgrind --tool=callgrind target/release/examples/parse_cpu --iterations 1000`.
#![allow(clippy::print_stdout, reason = "the example's output is its report")]

use std::error::Error;
use std::hint::black_box;
use std::time::Instant;

use infergate_metrics::parse_page;
use infergate_scheduler::{EngineType, Timestamp};

const PAGES: [(&str, EngineType, &[u8]); 3] = [
    (
        "vllm-after-load.txt",
        EngineType::Vllm,
        include_bytes!("../tests/fixtures/vllm-after-load.txt"),
    ),
    (
        "sglang-busy.txt",
        EngineType::Sglang,
        include_bytes!("../tests/fixtures/sglang-busy.txt"),
    ),
    (
        "tgi-busy.txt",
        EngineType::Tgi,
        include_bytes!("../tests/fixtures/tgi-busy.txt"),
    ),
];

/// CPU seconds (user + system) of the calling thread.
fn thread_cpu_seconds(ticks_per_sec: f64) -> Result<f64, Box<dyn Error>> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat")?;
    let rest = stat.rsplit_once(')').ok_or("bad /proc stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11).ok_or("short stat")?.parse()?;
    let stime: f64 = fields.get(12).ok_or("short stat")?.parse()?;
    Ok((utime + stime) / ticks_per_sec)
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut iterations: u32 = 100_000;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--iterations" => {
                iterations = args.next().ok_or("--iterations needs a value")?.parse()?;
            }
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    // Linux reports these times in clock ticks of 1/100 s (USER_HZ).
    let ticks = 100.0;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{iterations} parses per page; machine load average {}",
        load.split_whitespace().next().unwrap_or("?")
    );
    for (name, engine, page) in PAGES {
        // Fails loudly if the page stopped parsing: a fast error is no result.
        parse_page(engine, page, None, Timestamp::ZERO)?;
        let (cpu0, wall0) = (thread_cpu_seconds(ticks)?, Instant::now());
        for _ in 0..iterations {
            let parsed = parse_page(engine, black_box(page), None, Timestamp::ZERO);
            black_box(parsed.is_ok());
        }
        let (cpu, wall) = (thread_cpu_seconds(ticks)? - cpu0, wall0.elapsed());
        let n = f64::from(iterations);
        println!(
            "{name} ({} bytes): {:.2} µs CPU per parse, {:.2} µs wall",
            page.len(),
            cpu / n * 1e6,
            wall.as_secs_f64() / n * 1e6
        );
    }
    Ok(())
}
