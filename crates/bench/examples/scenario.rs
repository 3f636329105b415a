//! Runs scenario files in simulated mode without building the whole `infergate` binary:
//! `cargo run --release -p infergate-bench --example scenario -- FILE... [--out DIR]
//! [--requests-csv]`. The reports land in `DIR` (default `target/bench-reports`); tables go to
//! stdout. `--requests-csv` also writes every completed request of every run as a CSV row, as
//! `infergate bench --requests-csv` does.

use std::io::Write;
use std::path::PathBuf;

use infergate_bench::{Scenario, StderrBar};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut out = PathBuf::from("target/bench-reports");
    let mut files = Vec::new();
    let mut requests = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--out" {
            out = args.next().ok_or("--out needs a folder")?.into();
        } else if a == "--requests-csv" {
            requests = true;
        } else {
            files.push(PathBuf::from(a));
        }
    }
    let mut stdout = std::io::stdout().lock();
    for f in files {
        let scenario = Scenario::from_file(&f)?;
        if requests && !scenario.keeps_request_records() {
            eprintln!(
                "{}: no per-request records (a scenario with a `flow:` or `replicas:` section keeps its own figures only)",
                f.display()
            );
        }
        let started = std::time::Instant::now();
        let report = infergate_bench::simulate::run_with(
            &scenario,
            &f.display().to_string(),
            &mut StderrBar::default(),
            infergate_bench::simulate::RunOptions {
                requests: requests && scenario.keeps_request_records(),
            },
        )?;
        let written = report.write(&out)?;
        writeln!(
            stdout,
            "\n## {} ({:.1} s wall)\n",
            scenario.name,
            started.elapsed().as_secs_f64()
        )?;
        writeln!(stdout, "{}", report.table())?;
        for v in &report.verdicts {
            writeln!(
                stdout,
                "{} {}: {}",
                if v.met { "met   " } else { "MISSED" },
                v.target,
                v.measured
            )?;
        }
        writeln!(stdout, "report: {}", written[0].display())?;
        for w in written
            .iter()
            .filter(|w| w.to_string_lossy().ends_with("-requests.csv"))
        {
            writeln!(stdout, "requests: {}", w.display())?;
        }
    }
    Ok(())
}
