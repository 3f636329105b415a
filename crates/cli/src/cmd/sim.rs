//! `infergate sim`: serve a fleet of emulated model servers (`infergate_sim`) on 127.0.0.1.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use infergate_sim::{
    Catalog, EngineKind, FleetSpec, KvEventsOptions, ServeOptions, serve_fleet_opts,
};
use infergate_tokenizer::{ModelTokenizer, Options};

/// Arguments of `infergate sim`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The fleet file (YAML): pods with profile, engine flavour, LoRA adapters, faults.
    /// Examples are in `crates/sim/fleets/`.
    #[arg(
        long,
        short,
        env = "INFERGATE_SIM_FLEET",
        required_unless_present = "list_profiles"
    )]
    fleet: Option<PathBuf>,
    /// Print the built-in performance profiles (on stdout) and exit.
    #[arg(long)]
    list_profiles: bool,
    /// Check the fleet file and exit.
    #[arg(long)]
    check: bool,
    /// Publish every vLLM pod's KV-cache events as vLLM does (ZeroMQ): pod `i` on
    /// `PORT + 2i`, its replay socket on `PORT + 2i + 1` (docs/precise-prefix.md).
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    kv_events_port: Option<u16>,
    /// The events' encoding: `keyed` (vLLM since mid-2026) or `positional` (earlier releases).
    #[arg(long, default_value = "keyed", value_parser = parse_encoding, requires = "kv_events_port")]
    kv_events_encoding: infergate_kvevents::event::Encoding,
    /// The model's tokenizer directory (tokenizer.json, tokenizer_config.json, and
    /// chat_template.jinja where present; the format of the gateway's `precisePrefix.tokenizer`):
    /// every pod tokenizes prompts with it as vLLM does — chat template and all — and counts,
    /// caches and publishes (`--kv-events-port`) those ids instead of the stand-in's.
    #[arg(long, value_name = "DIR")]
    tokenizer: Option<PathBuf>,
}

fn parse_encoding(s: &str) -> Result<infergate_kvevents::event::Encoding, String> {
    infergate_kvevents::event::Encoding::parse(s)
        .ok_or_else(|| format!("`{s}`: expected keyed or positional"))
}

/// Runs `infergate sim`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.list_profiles {
        let catalog = Catalog::builtin().context("built-in profiles")?;
        let mut out = String::new();
        for p in catalog.all() {
            out.push_str(&format!(
                "{:<30} {:<36} {} x{:<2} KV {:>7} tokens  decode {:>5.1} ms  prefill {:>6.0} tok/s\n",
                p.id,
                p.model,
                p.gpu,
                p.tensor_parallel,
                p.kv_capacity_tokens,
                p.decode_base_ms,
                1e6 / p.prefill_per_token_us,
            ));
        }
        // The listing is the command's output (to pipe into grep), not a log line.
        std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes())
            .context("cannot print the profiles")?;
        return Ok(());
    }
    let Some(path) = args.fleet else {
        anyhow::bail!("--fleet is required");
    };
    let spec = FleetSpec::from_file(&path)
        .with_context(|| format!("invalid fleet file {}", path.display()))?;
    let kv = args.kv_events_port.map(|port| KvEventsOptions {
        base_port: Some(port),
        encoding: args.kv_events_encoding,
        ..KvEventsOptions::default()
    });
    if let Some(kv) = &kv {
        kv.check(&spec)
            .with_context(|| format!("--kv-events-port with the fleet {}", path.display()))?;
        // SGLang and TGI pods publish no KV events: the flag would open no port at all.
        if !spec.pods.iter().any(|p| p.engine == EngineKind::Vllm) {
            anyhow::bail!(
                "--kv-events-port: the fleet {} has no vLLM pod, and only vLLM pods publish KV-cache events",
                path.display()
            );
        }
    }
    let tokenizer = match &args.tokenizer {
        Some(dir) => Some(Arc::new(
            ModelTokenizer::from_dir(dir, Options::default())
                .with_context(|| format!("--tokenizer {}", dir.display()))?,
        )),
        None => None,
    };
    if args.check {
        tracing::info!(pods = spec.pods.len(), "{} is valid", path.display());
        return Ok(());
    }
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let options = ServeOptions {
        kv_events: kv,
        tokenizer,
    };
    let fleet = serve_fleet_opts(
        &spec,
        |pod| std::net::SocketAddr::from(([127, 0, 0, 1], pod.port)),
        &options,
        shutdown,
    )
    .await
    .context("cannot serve the fleet")?;
    for pod in &fleet.pods {
        match pod.kv_events {
            Some((events, Some(replay))) => tracing::info!(pod = %pod.name, addr = %pod.addr,
                kv_events = %events, kv_replay = %replay, "serving"),
            Some((events, None)) => tracing::info!(pod = %pod.name, addr = %pod.addr,
                kv_events = %events, "serving"),
            None => tracing::info!(pod = %pod.name, addr = %pod.addr, "serving"),
        }
    }
    fleet.wait().await;
    Ok(())
}
