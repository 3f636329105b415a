//! `infergate delete-configs`: deletes the `InferenceGatewayConfig`s matching a label selector
//! and waits until the operator has let them go. The Helm chart runs it as its `pre-delete`
//! hook, so `helm uninstall` leaves no config stuck on its finalizer.

use std::io::Write as _;
use std::time::Duration;

/// Arguments of `infergate delete-configs`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Label selector of the configs to delete (the chart passes
    /// `app.kubernetes.io/instance=<release>`). Required: an empty selector would match every
    /// config in the cluster.
    #[arg(long, value_parser = non_empty_selector)]
    selector: String,
    /// How long to wait for the operator to remove the configs' finalizers before failing with
    /// the list of those left.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_seconds: u64,
    /// Look for the configs only in these namespaces (comma-separated), each through its own
    /// namespaced API paths: the operator's `--watch-namespaces`, where the hook is granted its
    /// rights by a Role in each. Default: every namespace.
    #[arg(
        long,
        value_name = "NAMESPACE,...",
        value_delimiter = ',',
        value_parser = super::operator::namespace_name
    )]
    namespaces: Vec<String>,
}

fn non_empty_selector(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("an empty selector would match every config in the cluster".to_owned());
    }
    Ok(s.to_owned())
}

/// Runs `infergate delete-configs`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let scope = infergate_operator::scope::WatchScope::from_names(args.namespaces)?;
    let deleted = infergate_operator::uninstall::delete_and_wait_in_cluster(
        &args.selector,
        &scope,
        Duration::from_secs(args.timeout_seconds),
    )
    .await?;
    let mut out = std::io::stdout().lock();
    if deleted.is_empty() {
        writeln!(out, "no InferenceGatewayConfig matches `{}`", args.selector)?;
    } else {
        writeln!(
            out,
            "deleted {} InferenceGatewayConfig(s): {}",
            deleted.len(),
            deleted.join(", ")
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

    use clap::Parser as _;

    use crate::{Cli, Command};

    #[test]
    fn the_selector_is_required_and_not_empty_and_the_timeout_positive() {
        for bad in [
            &["infergate", "delete-configs"][..],
            &["infergate", "delete-configs", "--selector", " "],
            &[
                "infergate",
                "delete-configs",
                "--selector",
                "a=b",
                "--timeout-seconds",
                "0",
            ],
        ] {
            let err = Cli::try_parse_from(bad).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad:?}: {err}");
        }
        let cli = Cli::try_parse_from([
            "infergate",
            "delete-configs",
            "--selector",
            "app.kubernetes.io/instance=infergate",
            "--timeout-seconds",
            "120",
        ])
        .unwrap();
        let Command::DeleteConfigs(args) = cli.command else {
            panic!("not delete-configs");
        };
        assert_eq!(args.selector, "app.kubernetes.io/instance=infergate");
        assert_eq!(args.timeout_seconds, 120);
        assert!(args.namespaces.is_empty(), "every namespace by default");
    }

    #[test]
    fn namespaces_narrow_the_search_and_a_bad_name_is_refused() {
        let parse = |ns: &str| {
            Cli::try_parse_from(["infergate", "delete-configs", "--selector", "a=b", ns]).map(
                |cli| match cli.command {
                    Command::DeleteConfigs(args) => args.namespaces,
                    _ => panic!("not delete-configs"),
                },
            )
        };
        assert_eq!(
            parse("--namespaces=team-a,team-b").unwrap(),
            ["team-a", "team-b"]
        );
        for bad in ["--namespaces=", "--namespaces=Team-A"] {
            let err = parse(bad).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{bad}: {err}");
            assert!(err.to_string().contains("--namespaces"), "{bad}: {err}");
        }
    }
}
