//! Runs scenario files in simulated mode without building the whole `infergate` binary:
//! `cargo run --release -p infergate-bench --example scenario -- FILE... [--out DIR]`.
//! The reports land in `DIR` (default `target/bench-reports`); tables go to stdout.

use std::io::Write;
use std::path::PathBuf;

use infergate_bench::{Scenario, StderrBar};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut out = PathBuf::from("target/bench-reports");
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--out" {
            out = args.next().ok_or("--out needs a folder")?.into();
        } else {
            files.push(PathBuf::from(a));
        }
    }
    let mut stdout = std::io::stdout().lock();
    for f in files {
        let scenario = Scenario::from_file(&f)?;
        let started = std::time::Instant::now();
        let report = infergate_bench::simulate::run(
            &scenario,
            &f.display().to_string(),
            &mut StderrBar::default(),
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
    }
    Ok(())
}
