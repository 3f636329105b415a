//! `infergate operator`: reconciles `InferenceGatewayConfig` objects into Gateway API and
//! Envoy Gateway objects; several replicas elect one leader through a Lease.

use std::time::Duration;

use anyhow::Context as _;
use infergate_operator::render::RenderOptions;
use infergate_operator::serve::{ServeOptions, serve};
use tokio::net::TcpListener;

use super::shutdown_signal;

/// Arguments of `infergate operator`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Image the body-based router and endpoint pickers run (default: this build's release).
    #[arg(long, env = "INFERGATE_IMAGE")]
    image: Option<String>,
    #[command(flatten)]
    pull: super::render::PullArgs,
    /// Namespace of the leader Lease (the operator's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "infergate-system")]
    lease_namespace: String,
    /// Name of the leader Lease.
    #[arg(long, default_value = "infergate-operator")]
    lease_name: String,
    /// This replica's identity in the Lease.
    #[arg(long, env = "POD_NAME", default_value = "infergate-operator")]
    identity: String,
    /// Lease duration in seconds (at least 3); the leader renews every third of it.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(3..))]
    lease_seconds: u64,
    /// Address serving `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_addr: std::net::SocketAddr,
    /// Run without leader election (one replica only, for development).
    #[arg(long)]
    no_leader_election: bool,
}

/// Runs `infergate operator`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut render = RenderOptions::default();
    if let Some(image) = args.image {
        render.image = image;
    }
    args.pull.apply(&mut render)?;
    let admin = TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.metrics_addr))?;
    serve(
        ServeOptions {
            render,
            leader_election: !args.no_leader_election,
            lease_namespace: args.lease_namespace,
            lease_name: args.lease_name,
            identity: args.identity,
            lease_duration: Duration::from_secs(args.lease_seconds),
        },
        Some(admin),
        shutdown_signal(),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

    use clap::Parser as _;

    use crate::{Cli, Command};

    #[test]
    fn a_lease_shorter_than_three_seconds_is_refused_not_silently_lengthened() {
        let err = Cli::try_parse_from(["infergate", "operator", "--lease-seconds=1"]).unwrap_err();
        assert!(err.to_string().contains("--lease-seconds"), "{err}");
        let cli = Cli::try_parse_from(["infergate", "operator", "--lease-seconds=3"]).unwrap();
        let Command::Operator(args) = cli.command else {
            panic!("not the operator command");
        };
        assert_eq!(args.lease_seconds, 3);
    }
}
