//! `infergate demo`: round-robin versus infergate, live, on a small mixed H100/A10G fleet of
//! emulated pods on 127.0.0.1 behind the standalone gateway, with one minute of bursty traffic;
//! prints the comparison table and writes the report with plots. Needs nothing but this binary.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use infergate_bench::live::Fronts;
use infergate_bench::simulate::RunOptions;
use infergate_bench::{Progress, Scenario, StderrBar};

use super::bench::{self, Mode, Stopped};

/// The demo's scenario: data, like every other scenario (`benches/scenarios/demo.yaml`).
const DEMO: &str = include_str!("../../../../benches/scenarios/demo.yaml");

/// Arguments of `infergate demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Folder for the report (markdown, JSON, SVG plots); under `target/` by default, so a run
    /// from a clone leaves nothing untracked.
    #[arg(long, default_value = "target/infergate-demo")]
    out: PathBuf,
    /// Run on the discrete-event simulator (virtual time, seconds) instead of live HTTP.
    #[arg(long)]
    simulated: bool,
}

/// Runs `infergate demo`. Ctrl-C or SIGTERM stops it as it does a bench: the report of the
/// policies that completed is written, marked interrupted, and the demo exits 130 or 143.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let stopped = bench::stop_signal()?;
    match demo(args, &stopped, StderrBar::default(), &mut std::io::stdout()).await? {
        Some(code) => bench::exit(code),
        None => Ok(()),
    }
}

/// The demo until `stopped`, its progress on `progress` and its table and report's path on
/// `out` (stdout): the exit status to end with when it was stopped.
async fn demo(
    args: Args,
    stopped: &Stopped,
    progress: impl Progress + Send + 'static,
    out: &mut dyn Write,
) -> anyhow::Result<Option<u8>> {
    let scenario = Scenario::from_yaml(DEMO, "demo").context("the built-in demo scenario")?;
    bench::writable(&args.out)?;
    let started = Instant::now();
    let fronts = Fronts::default();
    let mode = if args.simulated {
        Mode::Simulated(RunOptions::default())
    } else {
        Mode::Live(&fronts)
    };
    let (report, code) = bench::run_scenario(scenario, "demo", mode, stopped, progress).await?;
    if code.is_some() {
        bench::interrupted(out, &report, &args.out, "demo", &[])?;
        return Ok(code);
    }
    let written = report.write(&args.out)?;
    bench::print(out, &report, &written)?;
    let unserved = bench::unserved(&report);
    if !unserved.is_empty() {
        anyhow::bail!(
            "demo runs that completed no request:\n  {}",
            unserved.join("\n  ")
        );
    }
    tracing::info!(
        seconds = started.elapsed().as_secs(),
        report = %written.first().map(|p| p.display().to_string()).unwrap_or_default(),
        "demo finished"
    );
    Ok(None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

    use super::*;

    /// Stops the demo with `code` once its first run has ended, as a signal between its two
    /// runs would.
    struct StopAfterFirstRun(Stopped, u8);

    impl Progress for StopAfterFirstRun {
        fn start(&mut self, _label: &str, _total: u64) {}
        fn advance(&mut self, _done: u64) {}
        fn finish(&mut self) {
            self.0.stop(self.1);
        }
    }

    fn args(out: &std::path::Path) -> Args {
        Args {
            out: out.to_owned(),
            simulated: true,
        }
    }

    /// A simulated demo stopped after round-robin's run writes that run's report, marked
    /// interrupted and naming infergate's run as not run, prints its path, and ends with the
    /// signal's status (SIGTERM's here).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_simulated_demo_writes_the_report_of_the_run_that_completed() {
        let dir = tempfile::tempdir().unwrap();
        let stopped = Stopped::default();
        let mut out = Vec::new();
        let progress = StopAfterFirstRun(stopped.clone(), 143);
        let code = demo(args(dir.path()), &stopped, progress, &mut out)
            .await
            .unwrap();
        assert_eq!(code, Some(143));
        let md = dir.path().join("demo-simulated.md");
        let printed = String::from_utf8(out).unwrap();
        assert!(
            printed.contains("INTERRUPTED: a partial report; not run: infergate seed 1\n")
                && printed.contains(&format!("report: {}", md.display())),
            "{printed}"
        );
        let text = std::fs::read_to_string(&md).unwrap();
        assert!(
            text.contains("**Interrupted — partial report.**")
                && text.contains("Not run: infergate seed 1."),
            "{text}"
        );
        assert!(text.lines().any(|l| l.starts_with("| round-robin |")));
        assert!(!text.lines().any(|l| l.starts_with("| infergate |")));
    }

    /// A demo stopped before its first run ends has nothing to report: it writes none and
    /// ends with the signal's status all the same.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_demo_stopped_before_any_run_ended_writes_no_report() {
        let dir = tempfile::tempdir().unwrap();
        let stopped = Stopped::default();
        stopped.stop(130);
        let mut out = Vec::new();
        let code = demo(
            args(dir.path()),
            &stopped,
            infergate_bench::Silent,
            &mut out,
        )
        .await
        .unwrap();
        assert_eq!(code, Some(130));
        assert!(!dir.path().join("demo-simulated.md").exists());
        assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
    }
}
