//! `infergate operator`: reconciles `InferenceGatewayConfig` objects into Gateway API and
//! Envoy Gateway objects; several replicas elect one leader through a Lease.

use std::time::Duration;

use anyhow::Context as _;
use infergate_operator::metrics_auth::MetricsAuth;
use infergate_operator::render::RenderOptions;
use infergate_operator::scope::{WatchScope, check_namespace};
use infergate_operator::serve::{MetricsTls, ServeOptions, serve};
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
    /// This replica's identity in the Lease; it must differ per replica (default: the host
    /// name, which is the pod's name in Kubernetes, else one made up at start).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Lease duration in seconds (at least 3); the leader renews every third of it.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(3..))]
    lease_seconds: u64,
    /// Address serving `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_addr: std::net::SocketAddr,
    /// Who may read `/metrics`: `kubernetes`, a bearer token the API server authenticates (a
    /// TokenReview) and allows to get the non-resource URL /metrics (a SubjectAccessReview);
    /// `none`, anyone who reaches the port. `/healthz` and `/readyz` are always open.
    #[arg(long, value_enum, default_value_t = MetricsAuth::Kubernetes)]
    metrics_auth: MetricsAuth,
    /// Serve `--metrics-addr` over HTTPS (`true`) or plain HTTP (`false`). Default: HTTPS with
    /// `--metrics-auth=kubernetes` (scrapes carry a bearer token), plain with `none`; HTTPS
    /// whenever `--metrics-tls-cert-file` is given. Without certificate files the certificate is
    /// self-signed, made at start (scrapers skip verification, as kubelet probes do).
    #[arg(long, env = "INFERGATE_METRICS_TLS", value_name = "BOOL", num_args = 1, action = clap::ArgAction::Set)]
    metrics_tls: Option<bool>,
    /// Serve `--metrics-addr` over HTTPS with this PEM certificate chain (leaf first), reloaded
    /// when the file changes (a mounted Secret's `tls.crt`); needs `--metrics-tls-key-file`.
    #[arg(
        long,
        env = "INFERGATE_METRICS_TLS_CERT_FILE",
        requires = "metrics_tls_key_file"
    )]
    metrics_tls_cert_file: Option<std::path::PathBuf>,
    /// The PEM private key of `--metrics-tls-cert-file` (a mounted Secret's `tls.key`).
    #[arg(
        long,
        env = "INFERGATE_METRICS_TLS_KEY_FILE",
        requires = "metrics_tls_cert_file"
    )]
    metrics_tls_key_file: Option<std::path::PathBuf>,
    /// Run without leader election (one replica only, for development).
    #[arg(long)]
    no_leader_election: bool,
    /// Watch and write only in these namespaces (comma-separated), each through its own
    /// namespaced API paths, as a Role and RoleBinding in each of them allow (the chart's
    /// `watchNamespaces`); a config in another namespace is never seen. Default: every
    /// namespace, as a ClusterRole allows.
    #[arg(
        long,
        env = "INFERGATE_WATCH_NAMESPACES",
        value_name = "NAMESPACE,...",
        value_delimiter = ',',
        value_parser = namespace_name
    )]
    watch_namespaces: Vec<String>,
}

/// A `--watch-namespaces` (or `delete-configs --namespaces`) entry: a namespace's name, checked
/// at start, since a misspelt one would watch nothing and say nothing.
pub(crate) fn namespace_name(s: &str) -> Result<String, String> {
    check_namespace(s)
        .map(|()| s.to_owned())
        .map_err(|e| e.to_string())
}

/// Runs `infergate operator`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut render = RenderOptions::default();
    if let Some(image) = args.image {
        render.image = image;
    }
    args.pull.apply(&mut render);
    let identity = args.identity.unwrap_or_else(default_identity);
    let files = args.metrics_tls_cert_file.zip(args.metrics_tls_key_file);
    let metrics_tls = MetricsTls::choose(
        args.metrics_auth,
        args.metrics_tls,
        files,
        MetricsTls::self_signed_names(&identity, args.metrics_addr),
    )?;
    let scope = WatchScope::from_names(args.watch_namespaces)?;
    let admin = TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.metrics_addr))?;
    serve(
        ServeOptions {
            render,
            scope,
            leader_election: !args.no_leader_election,
            lease_namespace: args.lease_namespace,
            lease_name: args.lease_name,
            identity,
            lease_duration: Duration::from_secs(args.lease_seconds),
            metrics_auth: args.metrics_auth,
            metrics_tls,
        },
        Some(admin),
        shutdown_signal(),
    )
    .await?;
    Ok(())
}

/// An identity for a replica started without `--identity` or `POD_NAME`: the host name (a pod's
/// own name in Kubernetes), else `infergate-operator-` and a value unlikely to repeat. A fixed
/// default let two such replicas take each other's Lease renewals for their own, and both lead.
fn default_identity() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    identity_from(std::env::var("HOSTNAME").ok(), std::process::id(), nanos)
}

fn identity_from(hostname: Option<String>, pid: u32, nanos: u32) -> String {
    match hostname.as_deref().map(str::trim) {
        Some(h) if !h.is_empty() => h.to_owned(),
        _ => format!("infergate-operator-{pid:x}-{nanos:x}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

    use clap::Parser as _;

    use infergate_operator::metrics_auth::MetricsAuth;

    use super::identity_from;
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

    #[test]
    fn metrics_are_authenticated_unless_turned_off_by_name() {
        let parse = |extra: &[&str]| {
            let cli = Cli::try_parse_from([&["infergate", "operator"], extra].concat()).unwrap();
            let Command::Operator(args) = cli.command else {
                panic!("not the operator command");
            };
            args.metrics_auth
        };
        assert_eq!(parse(&[]), MetricsAuth::Kubernetes);
        assert_eq!(parse(&["--metrics-auth=none"]), MetricsAuth::None);
        assert_eq!(
            parse(&["--metrics-auth=kubernetes"]),
            MetricsAuth::Kubernetes
        );
        let err = Cli::try_parse_from(["infergate", "operator", "--metrics-auth=off"]).unwrap_err();
        assert!(err.to_string().contains("none"), "{err}");
    }

    #[test]
    fn metrics_tls_follows_the_auth_unless_told_and_names_both_files() {
        use infergate_operator::serve::MetricsTls;
        use infergate_pool::tls::Certificate;
        let parse = |extra: &[&str]| {
            let cli = Cli::try_parse_from([&["infergate", "operator"], extra].concat())?;
            let Command::Operator(args) = cli.command else {
                panic!("not the operator command");
            };
            let files = args.metrics_tls_cert_file.zip(args.metrics_tls_key_file);
            Ok::<_, clap::Error>(
                MetricsTls::choose(args.metrics_auth, args.metrics_tls, files, vec!["n".into()])
                    .map_err(|e| e.to_string()),
            )
        };
        let self_signed = Ok(MetricsTls::Https(Certificate::SelfSigned {
            names: vec!["n".into()],
        }));
        assert_eq!(parse(&[]).unwrap(), self_signed);
        assert_eq!(parse(&["--metrics-tls=true"]).unwrap(), self_signed);
        assert_eq!(
            parse(&["--metrics-tls", "false"]).unwrap(),
            Ok(MetricsTls::Plain)
        );
        assert_eq!(
            parse(&["--metrics-auth=none"]).unwrap(),
            Ok(MetricsTls::Plain)
        );
        assert_eq!(
            parse(&["--metrics-auth=none", "--metrics-tls=true"]).unwrap(),
            self_signed
        );
        let files = [
            "--metrics-tls-cert-file=/t/tls.crt",
            "--metrics-tls-key-file=/t/tls.key",
        ];
        let from_files = Ok(MetricsTls::Https(Certificate::Files {
            cert: "/t/tls.crt".into(),
            key: "/t/tls.key".into(),
        }));
        assert_eq!(parse(&files).unwrap(), from_files);
        assert_eq!(
            parse(&[&files[..], &["--metrics-auth=none"]].concat()).unwrap(),
            from_files
        );
        let refused = parse(&[&files[..], &["--metrics-tls=false"]].concat()).unwrap();
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("--metrics-tls=false") && e.contains("drop")),
            "{refused:?}"
        );
        // One file without the other, or a value that is not a boolean, is clap's refusal.
        let err = parse(&files[..1]).unwrap_err();
        assert!(err.to_string().contains("--metrics-tls-key-file"), "{err}");
        let err = parse(&["--metrics-tls=yes"]).unwrap_err();
        assert!(err.to_string().contains("--metrics-tls"), "{err}");
    }

    #[test]
    fn watch_namespaces_take_a_comma_list_and_refuse_a_bad_name() {
        use infergate_operator::scope::WatchScope;
        let parse = |extra: &[&str]| {
            let cli = Cli::try_parse_from([&["infergate", "operator"], extra].concat())?;
            let Command::Operator(args) = cli.command else {
                panic!("not the operator command");
            };
            Ok::<_, clap::Error>(WatchScope::from_names(args.watch_namespaces).unwrap())
        };
        assert_eq!(parse(&[]).unwrap(), WatchScope::Cluster);
        let two = WatchScope::from_names(["team-a".to_owned(), "team-b".to_owned()]).unwrap();
        assert_eq!(parse(&["--watch-namespaces=team-a,team-b"]).unwrap(), two);
        assert_eq!(
            parse(&[
                "--watch-namespaces",
                "team-b",
                "--watch-namespaces",
                "team-a"
            ])
            .unwrap(),
            two
        );
        for bad in [
            "--watch-namespaces=",
            "--watch-namespaces=team-a,,team-b",
            "--watch-namespaces=Team-A",
        ] {
            let err = parse(&[bad]).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad}: {err}");
            assert!(
                err.to_string().contains("--watch-namespaces"),
                "{bad}: {err}"
            );
        }
        let err = parse(&["--watch-namespaces=team_a"]).unwrap_err();
        assert!(
            err.to_string().contains("`team_a` is not a namespace name"),
            "{err}"
        );
    }

    #[test]
    fn replicas_without_an_identity_get_distinct_ones() {
        assert_eq!(identity_from(Some("op-7c9d-x2".into()), 1, 2), "op-7c9d-x2");
        let a = identity_from(None, 41, 5);
        let b = identity_from(Some("  ".into()), 42, 5);
        assert!(a.starts_with("infergate-operator-") && a != b, "{a} {b}");
    }
}
