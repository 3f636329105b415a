//! `infergate`: one binary for every role — standalone gateway, ext_proc picker and body-based
//! router, Kubernetes operator (and its uninstall step), model-server emulator, benchmarks, the demo, CRD generation,
//! API-key hashing for the gateway's `auth.apiKeys`, and the model tokenizer's ids for a request.
//!
//! Each subcommand lives in `cmd/<name>.rs` and is a thin shell over its library crate.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};

mod cmd;
mod env_vars;
mod report;

/// GPU-aware inference gateway for Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "infergate", version, about, long_about = None)]
struct Cli {
    /// Log line format: `text` (human-readable) or `json` (one object per line). The operator
    /// sets it on the pods it runs from `spec.observability.logFormat`.
    #[arg(long, global = true, env = "INFERGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable text.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the standalone OpenAI-compatible gateway (no Kubernetes needed).
    Gateway(cmd::gateway::Args),
    /// Run the global router: one OpenAI-compatible front door over several clusters' gateways.
    Global(cmd::global::Args),
    /// Run the Envoy ext_proc endpoint picker for one InferencePool.
    Picker(Box<cmd::picker::Args>),
    /// Run the Envoy ext_proc body-based router.
    Bbr(cmd::bbr::Args),
    /// Run the Kubernetes operator.
    Operator(cmd::operator::Args),
    /// Delete the InferenceGatewayConfigs matching a label selector and wait until the operator
    /// has let them go (the Helm chart's uninstall hook).
    DeleteConfigs(cmd::delete_configs::Args),
    /// Serve a fleet of emulated model servers on 127.0.0.1.
    Sim(cmd::sim::Args),
    /// Run benchmark scenarios and write reports.
    ///
    /// Ctrl-C or SIGTERM, live or simulated, stops the run in progress (its figures are
    /// dropped) and writes the report of the runs that completed, marked interrupted and
    /// naming the runs that did not; the bench then exits 130 (SIGINT) or 143 (SIGTERM).
    Bench(cmd::bench::Args),
    /// Run the live demo: round-robin versus infergate on an emulated mixed-GPU fleet.
    ///
    /// Ctrl-C or SIGTERM stops it as it stops a bench: the report of the policy that completed
    /// is written, marked interrupted, and the demo exits 130 (SIGINT) or 143 (SIGTERM).
    Demo(cmd::demo::Args),
    /// Write the CustomResourceDefinitions to a folder.
    Crdgen(cmd::crdgen::Args),
    /// Print the objects the operator would apply for an InferenceGatewayConfig file.
    Render(cmd::render::Args),
    /// Print the SHA-256 of an API key read from standard input, for the gateway's `auth.apiKeys`.
    HashKey(cmd::hash_key::Args),
    /// Print the token ids the picker computes for a prompt or chat request with the model's
    /// tokenizer (the shape of vLLM's /tokenize answer).
    Tokenize(cmd::tokenize::Args),
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Best effort: with stderr gone there is no one to tell.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                report::error_report(&e).as_bytes(),
            );
            ExitCode::FAILURE
        }
    }
}

/// Parses the command line, sets up logging and runs the subcommand.
fn run() -> anyhow::Result<()> {
    let known_vars = env_vars::known(&Cli::command());
    let args: Vec<OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            // clap names the flag; a value that came from the environment says where it was set.
            if let Some(var) = env_vars::source_of_invalid_value(&e, &known_vars, &args, |name| {
                std::env::var_os(name).is_some()
            }) {
                let text = e.render().to_string();
                let note = format!(
                    "  (read from the environment variable {var}: the flag was not given)\n"
                );
                match text.find("\nFor more information") {
                    Some(at) => eprint!("{}{note}{}", &text[..at], &text[at..]),
                    None => eprint!("{text}{note}"),
                }
                std::process::exit(e.exit_code());
            }
            e.exit()
        }
    };
    // The demo and the benchmarks start emulated pods and gateways in-process, run after run:
    // their start-up lines say nothing the report does not, and would break the progress bar.
    // Their warnings still show; `RUST_LOG` overrides either default.
    let default_filter = match cli.command {
        Command::Demo(_) | Command::Bench(_) => {
            "info,infergate_sim=warn,infergate_proxy=warn,infergate_pool=warn"
        }
        _ => "info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    // A log line that cannot be written (stderr a closed pipe, a full disk) is dropped. By
    // default tracing-subscriber reports it with `eprintln!`, which panics when stderr fails:
    // the gateway exited at its first log line, and later a request's task or a pod's scrape
    // task died at its next warning (a scrape task gone stops judging its pod for good).
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match cli.log_format {
        LogFormat::Json => logs.json().init(),
        // Colour only on a terminal: logs captured to files or collectors stay plain text.
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
    }
    for (set, meant) in env_vars::resembling(&known_vars, std::env::vars_os()) {
        tracing::warn!(
            variable = %set,
            "the environment variable {set} is not one infergate reads, so it is ignored: did you mean {meant}?"
        );
    }
    let runtime = match cli.command {
        // The gateway serves on its own per-core worker threads (this runtime carries its control
        // plane: scrapes, admin port, reloads); the picker runs on a runtime of its own
        // (`--threads`) and this one only waits for it.
        Command::Gateway(_) | Command::Picker(_) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    }
    .enable_all()
    .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Gateway(args) => cmd::gateway::run(args).await,
            Command::Global(args) => cmd::global::run(args).await,
            Command::Picker(args) => cmd::picker::run(*args).await,
            Command::Bbr(args) => cmd::bbr::run(args).await,
            Command::Operator(args) => cmd::operator::run(args).await,
            Command::DeleteConfigs(args) => cmd::delete_configs::run(args).await,
            Command::Sim(args) => cmd::sim::run(args).await,
            Command::Bench(args) => cmd::bench::run(args).await,
            Command::Demo(args) => cmd::demo::run(args).await,
            Command::Crdgen(args) => cmd::crdgen::run(args).await,
            Command::Render(args) => cmd::render::run(args).await,
            Command::HashKey(args) => cmd::hash_key::run(args).await,
            Command::Tokenize(args) => cmd::tokenize::run(args).await,
        }
    })
}

#[cfg(test)]
mod tests;
