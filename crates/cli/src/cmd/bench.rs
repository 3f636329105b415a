//! `infergate bench`: runs scenario files (simulated or live) and writes their reports.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use infergate_bench::{Progress, Report, Scenario, StderrBar};

/// The scenarios run when none are named: the repository's folder of them.
const DEFAULT_SCENARIOS: &str = "benches/scenarios";

/// Arguments of `infergate bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Scenario files, or folders of them.
    #[arg(default_value = DEFAULT_SCENARIOS)]
    scenarios: Vec<PathBuf>,
    /// Folder for the reports (markdown, JSON, SVG).
    #[arg(long, default_value = "target/bench-reports")]
    out: PathBuf,
    /// Mode: `simulated` (virtual time) or `live` (HTTP through the gateway).
    #[arg(long, default_value = "simulated")]
    mode: String,
    /// Seeds to run instead of the scenario's (comma-separated).
    #[arg(long, value_delimiter = ',')]
    seeds: Vec<u64>,
    /// Seconds of arrivals instead of the scenario's: a positive number.
    #[arg(long, value_parser = positive_seconds, allow_negative_numbers = true)]
    duration: Option<f64>,
    /// Policies instead of the scenario's (comma-separated presets, or `infergate-precise`).
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Multiplies every arrival rate (a load sweep on one scenario): a positive number.
    #[arg(long, value_parser = positive_factor, allow_negative_numbers = true)]
    load_scale: Option<f64>,
    /// Active-active pickers: compare these picker replica counts (comma-separated, e.g.
    /// `1,3,5`), without and with the peer exchange (the scenario's `replicas:` section,
    /// defaults otherwise).
    #[arg(long, value_delimiter = ',')]
    replicas: Vec<u32>,
    /// With `--replicas`: the peer exchange's report interval and delay in milliseconds
    /// (`INTERVAL,DELAY`, e.g. `25,10`) instead of the scenario's (default 5,1).
    #[arg(
        long,
        value_delimiter = ',',
        requires = "replicas",
        allow_hyphen_values = true
    )]
    exchange_ms: Vec<f64>,
    /// With `--replicas`: periodic reports only (no report pushed right after a pick).
    #[arg(long, requires = "replicas")]
    exchange_periodic: bool,
    /// Live mode: also run an external front, `NAME=COMMAND` (repeatable), in front of a fresh
    /// fleet on the same arrivals, after the scenario's policies. The command runs with `sh -c`
    /// in a process group of its own; `{port}` (where it must listen on 127.0.0.1),
    /// `{aux_port}` (a second free port), `{urls}` (the pods as http://HOST:PORT,
    /// space-separated), `{addrs}` (HOST:PORT, comma-separated), `{model}` (the model the pods
    /// serve) and `{kv_events}` (each pod's
    /// KV-event feed, `http://HOST:PORT=tcp://HOST:PUB,tcp://HOST:REPLAY`, space-separated; the
    /// pods publish vLLM's KV-cache events only for a front that names it) are filled in, and
    /// set as INFERGATE_FRONT_PORT, _AUX_PORT, _URLS, _ADDRS, _MODEL, _KV_EVENTS. It is ready once GET
    /// /v1/models through it answers 200 (within 120 s, or --front-ready-timeout); its output
    /// goes to OUT/SCENARIO-live-front-NAME.log. Before any run, the command must be valid sh
    /// and its first program must be there; a front that then does not start fails its own runs
    /// (in the report, with the reason), not the bench.
    #[arg(long = "front", value_name = "NAME=COMMAND")]
    fronts: Vec<infergate_bench::Front>,
    /// Live mode: the time front NAME may take to answer GET /v1/models with 200, in whole
    /// seconds from 1 to 3600, instead of 120 (`NAME=SECONDS`, repeatable; a router that loads
    /// a tokenizer or builds its state before it listens may need more).
    #[arg(long = "front-ready-timeout", value_name = "NAME=SECONDS")]
    front_ready_timeouts: Vec<infergate_bench::front::ReadyTimeout>,
    /// Simulated mode: also write every completed request of every run as CSV (where it went,
    /// its queue and prefill time, its TTFT), `OUT/SCENARIO-simulated-POLICY-seedN-requests.csv`.
    /// Scenarios with a `flow:` or `replicas:` section run as usual without records (said on
    /// stderr).
    #[arg(long)]
    requests_csv: bool,
    /// Live mode: the model's tokenizer directory (tokenizer.json, tokenizer_config.json, and
    /// chat_template.jinja where present; the format of `infergate sim --tokenizer` and the
    /// gateway's `precisePrefix.tokenizer`). Prompts are then sized in its tokens — an arrival
    /// of 500 prompt tokens is 500 tokens of this tokenizer, not 2,000 bytes of the emulator's
    /// stand-in — and the pods tokenize with it, so their prefill times and the report's prompt
    /// token counts are the model's. It needs a chat template (live runs send chat requests).
    #[arg(long, value_name = "DIR")]
    tokenizer: Option<PathBuf>,
}

/// `--load-scale`: finite and above 0 (a factor of 0 leaves no arrivals to compare).
fn positive_factor(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 => Ok(f),
        Ok(f) => Err(format!("must be a positive number, not {f}")),
        Err(e) => Err(format!("{e}: expected a positive number such as 1.5")),
    }
}

/// `--duration`: finite and above 0 (the scenario's own limit, 1 day, is checked with it).
fn positive_seconds(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 => Ok(f),
        Ok(f) => Err(format!("must be a positive number of seconds, not {f}")),
        Err(e) => Err(format!("{e}: expected a number of seconds such as 30")),
    }
}

/// The scenario files named: files as given, folders' `*.yaml` / `*.yml` (not recursively). A
/// folder with none is an error naming it, not a run of nothing.
fn files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let cwd = || {
        std::env::current_dir()
            .map(|d| format!(" (relative to {})", d.display()))
            .unwrap_or_default()
    };
    for p in paths {
        let relative = if p.is_relative() {
            cwd()
        } else {
            String::new()
        };
        if !p.exists() {
            anyhow::bail!(
                "no scenario file or folder {}{relative}{}",
                p.display(),
                if p == Path::new(DEFAULT_SCENARIOS) {
                    "; the default folder is the repository's: run from its root or name scenario files"
                } else {
                    ""
                }
            );
        }
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect();
            if found.is_empty() {
                anyhow::bail!(
                    "no scenario files (*.yaml, *.yml) in {}{relative}",
                    p.display()
                );
            }
            found.sort();
            out.extend(found);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// Loads a scenario and applies the command-line overrides. The file is checked as written
/// first, so that a value only the overrides make wrong (`--duration` ending the workload before
/// a `stale:` window starts, `--replicas 0`) is said to come from them, not from the file.
fn load(path: &Path, args: &Args) -> anyhow::Result<Scenario> {
    let mut s = Scenario::from_file(path)?;
    if !args.seeds.is_empty() {
        s.seeds.clone_from(&args.seeds);
    }
    if let Some(d) = args.duration {
        s.workload.duration_s = d;
    }
    if let Some(f) = args.load_scale {
        s.scale_load(f);
    }
    if !args.policies.is_empty() {
        s.policies = args
            .policies
            .iter()
            .map(|p| p.parse())
            .collect::<Result<_, _>>()?;
    }
    if !args.replicas.is_empty() {
        let mut r = s.replicas.take().unwrap_or_default();
        r.counts.clone_from(&args.replicas);
        match args.exchange_ms[..] {
            [] => {}
            [interval_ms, delay_ms] => {
                r.exchange.interval_ms = interval_ms;
                r.exchange.delay_ms = delay_ms;
            }
            _ => anyhow::bail!("--exchange-ms takes two numbers: INTERVAL,DELAY"),
        }
        if args.exchange_periodic {
            r.exchange.push = false;
        }
        s.replicas = Some(r);
    }
    s.validate(&path.display().to_string())
        .with_context(|| format!("{} cannot run with {}", path.display(), overrides(args)))?;
    Ok(s)
}

/// The command-line values that replace a scenario's, as given: `--seeds 1,2 --duration 5`.
fn overrides(args: &Args) -> String {
    let list = |v: &[String]| v.join(",");
    let mut given = Vec::new();
    if !args.seeds.is_empty() {
        let seeds: Vec<String> = args.seeds.iter().map(u64::to_string).collect();
        given.push(format!("--seeds {}", list(&seeds)));
    }
    if let Some(d) = args.duration {
        given.push(format!("--duration {d}"));
    }
    if !args.policies.is_empty() {
        given.push(format!("--policies {}", list(&args.policies)));
    }
    if let Some(f) = args.load_scale {
        given.push(format!("--load-scale {f}"));
    }
    if !args.replicas.is_empty() {
        let counts: Vec<String> = args.replicas.iter().map(u32::to_string).collect();
        given.push(format!("--replicas {}", list(&counts)));
    }
    if !args.exchange_ms.is_empty() {
        let ms: Vec<String> = args.exchange_ms.iter().map(f64::to_string).collect();
        given.push(format!("--exchange-ms {}", list(&ms)));
    }
    if args.exchange_periodic {
        given.push("--exchange-periodic".to_owned());
    }
    given.join(" ")
}

/// Prints a report's table and verdicts on `out` (stdout).
pub fn print(out: &mut dyn Write, report: &Report, written: &[PathBuf]) -> anyhow::Result<()> {
    writeln!(out, "\n## {} ({})\n", report.scenario.name, report.mode)?;
    writeln!(out, "{}", report.table())?;
    for v in &report.verdicts {
        writeln!(
            out,
            "{} {}: {}",
            if v.met { "met   " } else { "MISSED" },
            v.target,
            v.measured
        )?;
    }
    if let Some(i) = &report.interrupted {
        writeln!(
            out,
            "\nINTERRUPTED: a partial report; not run: {}",
            i.list()
        )?;
    }
    if let Some(md) = written.first() {
        writeln!(out, "\nreport: {}", md.display())?;
    }
    for csv in written
        .iter()
        .filter(|p| p.to_string_lossy().ends_with("-requests.csv"))
    {
        writeln!(out, "requests: {}", csv.display())?;
    }
    Ok(())
}

/// Creates the report folder `dir` if missing and checks that a file can be written in it, so
/// that runs are not made for a report that cannot be kept.
pub fn writable(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the report folder {} (--out)", dir.display()))?;
    let probe = dir.join(".infergate-write-check");
    std::fs::write(&probe, b"").with_context(|| {
        format!(
            "cannot write in the report folder {} (--out)",
            dir.display()
        )
    })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// The live runs of `report` in which no request completed, one line each with the reasons;
/// empty when every run completed requests (or the run was simulated: a simulated policy that
/// completes nothing is a result, a live one is a gateway or front that does not serve).
pub fn unserved(report: &Report) -> Vec<String> {
    if report.mode != "live" {
        return Vec::new();
    }
    report
        .runs
        .iter()
        .filter(|r| r.completed == 0 && r.requests > 0)
        .map(|r| {
            let mut why = r.failure_reasons();
            if why.is_empty() {
                why = format!("{} rejected, {} failed", r.rejected, r.errors);
            }
            format!(
                "{} (seed {}) completed none of its {} requests: {why}",
                r.policy, r.seed, r.requests
            )
        })
        .collect()
}

/// A signal that stops a bench or the demo: Ctrl-C (SIGINT) or SIGTERM, once [`stop_signal`]
/// listens for it, or [`Stopped::stop`]. A live run waits for it ([`Stopped::wait`]); a
/// simulated one, on a blocking thread of its own, looks at its flag between runs and every few
/// hundred arrivals or events within one.
///
/// `Stopped::default()` is not stopped yet and listens for no signal.
#[derive(Debug, Clone, Default)]
pub struct Stopped {
    code: Arc<tokio::sync::watch::Sender<Option<u8>>>,
    flag: Arc<AtomicBool>,
}

impl Stopped {
    /// Stops the runs, to exit with status `code` (the first code given is kept).
    pub fn stop(&self, code: u8) {
        // The code first, then the flag: a simulated run that saw the flag and returned finds
        // the code sent.
        self.code.send_if_modified(|c| {
            let first = c.is_none();
            if first {
                *c = Some(code);
            }
            first
        });
        self.flag.store(true, Ordering::Release);
    }

    /// Resolves once stopped.
    async fn wait(&self) {
        // The sender is `self`'s own: the channel cannot close while this waits.
        let _ = self.code.subscribe().wait_for(Option::is_some).await;
    }

    /// The exit status to stop with, 128 + the signal's number: 130 for SIGINT, 143 for
    /// SIGTERM; `None` while not stopped.
    fn code(&self) -> Option<u8> {
        *self.code.borrow()
    }
}

/// Starts listening for SIGINT and SIGTERM (before returning, so that none is missed).
pub fn stop_signal() -> anyhow::Result<Stopped> {
    let stopped = Stopped::default();
    let stop = stopped.clone();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut int = signal(SignalKind::interrupt()).context("cannot listen for Ctrl-C")?;
        let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
        tokio::spawn(async move {
            let code = tokio::select! {
                _ = int.recv() => 130,
                _ = term.recv() => 143,
            };
            stop.stop(code);
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.stop(130);
        }
    });
    Ok(stopped)
}

/// How a scenario is run.
pub enum Mode<'a> {
    /// On the simulator, keeping what the options ask for.
    Simulated(infergate_bench::simulate::RunOptions),
    /// Live on loopback, with these fronts after the scenario's policies.
    Live(&'a infergate_bench::live::Fronts),
}

/// Runs `scenario` (`origin` in its errors) in `mode` until `stopped`: its report (marked
/// interrupted when a run was stopped), and the exit status to end with when a signal came
/// (even after the last run: the bench is then ended as the signal asked).
pub async fn run_scenario(
    scenario: Scenario,
    origin: &str,
    mode: Mode<'_>,
    stopped: &Stopped,
    mut progress: impl Progress + Send + 'static,
) -> anyhow::Result<(Report, Option<u8>)> {
    let report = match mode {
        // Fronts run in process groups of their own, out of reach of the terminal's Ctrl-C: a
        // signal stops the run in progress here, and with it the front it had started.
        Mode::Live(fronts) => {
            infergate_bench::live::run_until(
                &scenario,
                origin,
                fronts,
                &mut progress,
                stopped.wait(),
            )
            .await?
        }
        Mode::Simulated(options) => {
            let flag = Arc::clone(&stopped.flag);
            let origin = origin.to_owned();
            tokio::task::spawn_blocking(move || {
                infergate_bench::simulate::run_until(
                    &scenario,
                    &origin,
                    &mut progress,
                    options,
                    &flag,
                )
            })
            .await??
        }
    };
    if report.interrupted.is_none() && stopped.code().is_none() {
        return Ok((report, None));
    }
    // Resolves at once: the code is sent before the flag a simulated run stopped at is set.
    stopped.wait().await;
    let code = stopped.code().unwrap_or(130);
    Ok((report, Some(code)))
}

/// Ends a bench or the demo stopped by a signal during scenario `origin`: writes the report of
/// the runs that completed (marked partial, naming those that did not run) and names it on
/// `out` (stdout) and stderr, with the scenarios `later` that did not run at all.
pub fn interrupted(
    out: &mut dyn Write,
    report: &Report,
    dir: &Path,
    origin: &str,
    later: &[String],
) -> anyhow::Result<()> {
    let mut said = format!("\ninterrupted during {origin}: ");
    if report.runs.is_empty() {
        said.push_str("no run had completed, so no report was written for it");
    } else {
        let written = report.write(dir)?;
        print(out, report, &written)?;
        if let Some(md) = written.first() {
            said.push_str(&format!(
                "the partial report of the runs that completed is {}",
                md.display()
            ));
        }
    }
    if let Some(i) = &report.interrupted {
        said.push_str(&format!("\n  not run: {}", i.list()));
    }
    if !later.is_empty() {
        said.push_str(&format!("\n  scenarios not run: {}", later.join(", ")));
    }
    eprintln!("{said}");
    out.flush()?;
    Ok(())
}

/// Exits with `code`, once a signal has stopped a bench or the demo and [`interrupted`] has
/// written what completed: the front, gateway and fleet of a stopped live run have been
/// stopped and waited for, and a stopped simulated run has returned; the status says how it
/// ended, as a shell expects of a program ended by a signal.
pub fn exit(code: u8) -> ! {
    let _ = std::io::stdout().flush();
    std::process::exit(i32::from(code));
}

/// Runs `infergate bench`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let live = match args.mode.as_str() {
        "simulated" => false,
        "live" => true,
        other => anyhow::bail!("unknown mode {other:?}: expected `simulated` or `live`"),
    };
    if !live && !args.fronts.is_empty() {
        anyhow::bail!("--front runs only in live mode (add --mode live)");
    }
    if live && args.requests_csv {
        anyhow::bail!("--requests-csv is for simulated runs (drop --mode live)");
    }
    if !live && args.tokenizer.is_some() {
        anyhow::bail!(
            "--tokenizer sizes live runs' prompts (add --mode live); simulated runs count tokens without text"
        );
    }
    // Loaded before any scenario runs: a wrong directory is found at once, not after minutes.
    let tokenizer = match &args.tokenizer {
        Some(dir) => Some(Arc::new(
            infergate_bench::prompt::ModelPrompts::load(dir)
                .with_context(|| format!("--tokenizer {}", dir.display()))?,
        )),
        None => None,
    };
    if let Some(p) = args
        .policies
        .iter()
        .find(|p| p.as_str() == "infergate-precise")
    {
        // Said of the flag: the scenario check's advice is to name the policies with it.
        anyhow::bail!(
            "--policies {p}: runs in simulated mode only (the live gateway is fed no KV-cache events): drop it, or run without --mode live"
        );
    }
    let mut list = args.fronts.clone();
    infergate_bench::front::set_ready_timeouts(&mut list, &args.front_ready_timeouts)?;
    let fronts = infergate_bench::live::Fronts {
        list,
        log_dir: args.out.clone(),
        tokenizer,
    };
    let paths = files(&args.scenarios)?;
    if paths.is_empty() {
        anyhow::bail!("no scenario files found");
    }
    // Load every file first so a typo in the last one is reported before minutes of running.
    let scenarios: Vec<(PathBuf, Scenario)> = paths
        .iter()
        .map(|p| load(p, &args).map(|s| (p.clone(), s)))
        .collect::<anyhow::Result<_>>()?;
    if live {
        // What a live run cannot do, for every file, before minutes of the first ones.
        for (path, s) in &scenarios {
            infergate_bench::live::check(s, &path.display().to_string(), &fronts)?;
        }
    }
    // Reports are named after the scenario: two files of one name would write one report.
    for (i, (path, s)) in scenarios.iter().enumerate() {
        if let Some((first, _)) = scenarios[..i].iter().find(|(_, t)| t.name == s.name) {
            anyhow::bail!(
                "{} and {} are both scenario `{}`: their reports would overwrite each other (give one another `name`)",
                first.display(),
                path.display(),
                s.name
            );
        }
    }
    // A report folder that cannot be written would otherwise be found after the runs.
    writable(&args.out)?;
    // Live runs, and simulated studies of large fleets, take minutes: Ctrl-C or SIGTERM stops
    // the run in progress and keeps the report of those that completed. Listened for from here
    // on, so that no signal between two runs is lost.
    let stopped = stop_signal()?;
    let mut unserved_runs = Vec::new();
    let names: Vec<String> = scenarios
        .iter()
        .map(|(p, _)| p.display().to_string())
        .collect();
    for (index, (path, scenario)) in scenarios.into_iter().enumerate() {
        let origin = path.display().to_string();
        // A folder run keeps records where it can: flow and replica scenarios have their own
        // runners, which keep none; they say so and run as usual.
        let keeps = scenario.keeps_request_records();
        if args.requests_csv && !keeps {
            eprintln!(
                "{origin}: no per-request records (a scenario with a `flow:` or `replicas:` section keeps its own figures only)"
            );
        }
        let options = infergate_bench::simulate::RunOptions {
            requests: args.requests_csv && keeps,
        };
        let mode = if live {
            Mode::Live(&fronts)
        } else {
            Mode::Simulated(options)
        };
        let (report, code) =
            run_scenario(scenario, &origin, mode, &stopped, StderrBar::default()).await?;
        if let Some(code) = code {
            let later = &names[index + 1..];
            interrupted(&mut std::io::stdout(), &report, &args.out, &origin, later)?;
            exit(code);
        }
        let written = report.write(&args.out)?;
        print(&mut std::io::stdout(), &report, &written)?;
        let name = path.display();
        unserved_runs.extend(
            unserved(&report)
                .into_iter()
                .map(|u| format!("{name}: {u}")),
        );
    }
    if !unserved_runs.is_empty() {
        anyhow::bail!(
            "live runs that completed no request (their rows in the report show no latencies):\n  {}",
            unserved_runs.join("\n  ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

    use clap::Parser;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn scenario(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../benches/scenarios")
            .join(name)
    }

    /// The whole chain of an error, as `Error: ... Caused by: ...` prints it.
    fn said(e: &anyhow::Error) -> String {
        format!("{e:#}")
    }

    /// A value the command line makes wrong names the flags, not the file alone: the file's
    /// `stale:` window is fine until `--duration 5` ends the workload before it starts, and a
    /// file without `replicas:` gets its counts from `--replicas`.
    #[test]
    fn a_value_made_wrong_by_the_command_line_names_the_flags() {
        let stale = scenario("flow-stale-metrics-llama-8b.yaml");
        let cli = Cli::parse_from(["bench", "--duration", "5", "--seeds", "1"]);
        let e = said(&load(&stale, &cli.args).unwrap_err());
        assert!(
            e.starts_with(&format!(
                "{} cannot run with --seeds 1 --duration 5: ",
                stale.display()
            )),
            "{e}"
        );
        assert!(e.contains("stale window"), "{e}");

        let mixed = scenario("mixed-llama-8b.yaml");
        let cli = Cli::parse_from(["bench", "--replicas", "0"]);
        let e = said(&load(&mixed, &cli.args).unwrap_err());
        assert!(e.contains("cannot run with --replicas 0: "), "{e}");

        // Without overrides the same files load.
        let cli = Cli::parse_from(["bench"]);
        load(&stale, &cli.args).unwrap();
        load(&mixed, &cli.args).unwrap();
    }

    /// A live run asked for `infergate-precise` by `--policies` is refused naming the flag (the
    /// scenario's own check would blame its `policies` field and advise that very flag).
    #[tokio::test]
    async fn a_live_run_of_the_precise_policy_by_the_flag_names_the_flag() {
        let out = tempfile::tempdir().unwrap();
        let file = scenario("shared-prefix-llama-8b.yaml");
        let cli = Cli::parse_from([
            "bench".as_ref(),
            file.as_os_str(),
            "--mode".as_ref(),
            "live".as_ref(),
            "--policies".as_ref(),
            "infergate,infergate-precise".as_ref(),
            "--out".as_ref(),
            out.path().as_os_str(),
        ]);
        let e = said(&run(cli.args).await.unwrap_err());
        assert!(
            e.starts_with("--policies infergate-precise: runs in simulated mode only"),
            "{e}"
        );
    }

    /// `--tokenizer` is refused naming the flag and the directory, before any run: a
    /// directory that is not there, one whose tokenizer.json is not a tokenizer, and a
    /// simulated bench (which sends no text).
    #[tokio::test]
    async fn a_bad_tokenizer_is_refused_naming_the_flag() {
        let out = tempfile::tempdir().unwrap();
        let file = scenario("shared-prefix-llama-8b.yaml");
        let bench = |dir: &Path, mode: &str| {
            let cli = Cli::parse_from([
                "bench".as_ref(),
                file.as_os_str(),
                "--mode".as_ref(),
                mode.as_ref(),
                "--tokenizer".as_ref(),
                dir.as_os_str(),
                "--out".as_ref(),
                out.path().as_os_str(),
            ]);
            run(cli.args)
        };
        let missing = out.path().join("no-such-tokenizer");
        let e = said(&bench(&missing, "live").await.unwrap_err());
        assert!(
            e.starts_with(&format!("--tokenizer {}: ", missing.display())),
            "{e}"
        );
        assert!(e.contains("no-such-tokenizer"), "{e}");
        let bad = tempfile::tempdir().unwrap();
        std::fs::write(bad.path().join("tokenizer.json"), "{ not a tokenizer").unwrap();
        let e = said(&bench(bad.path(), "live").await.unwrap_err());
        assert!(
            e.starts_with(&format!("--tokenizer {}: ", bad.path().display()))
                && e.contains("tokenizer.json"),
            "{e}"
        );
        let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/fixtures/tiny");
        let e = said(&bench(&tiny, "simulated").await.unwrap_err());
        assert!(e.starts_with("--tokenizer sizes live runs' prompts"), "{e}");
        // Nothing ran.
        assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
    }
}
