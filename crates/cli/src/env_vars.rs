//! The environment variables the command line reads (each flag's `env = "INFERGATE_..."`), and
//! two checks a user who sets them by hand needs, since the shell takes any name silently:
//!
//! - a variable that looks like one of them but is not (a typo, lower case) is named in a warning
//!   with the one it resembles ([`resembling`]): misspelt, it would simply be ignored;
//! - a bad value read from a variable is reported by clap under the flag's name only, so the
//!   error gets a note naming the variable it came from ([`source_of_invalid_value`]).
//!
//! Names are compared after `INFERGATE_`; a variable a configuration file names for a secret
//! (`redis.passwordEnv`, say) may be called anything, so only near misses are reported.

use std::collections::BTreeMap;
use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// The prefix of every variable infergate reads.
const PREFIX: &str = "INFERGATE_";

/// Most single-character edits (insert, delete, replace, swap two neighbours) between a set
/// variable and a known one for the set one to count as a misspelling of it.
const MAX_EDITS: usize = 2;

/// Every variable a flag of `cmd` (or of its subcommands) reads, with the flag (`--name`):
/// infergate's own `INFERGATE_*` and the Kubernetes names the picker and the operator read
/// (`POD_NAME`, `POOL_NAME`, …).
pub fn known(cmd: &clap::Command) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    collect(cmd, &mut out);
    out
}

fn collect(cmd: &clap::Command, out: &mut BTreeMap<String, String>) {
    for arg in cmd.get_arguments() {
        if let (Some(env), Some(long)) = (arg.get_env(), arg.get_long())
            && let Some(env) = env.to_str()
        {
            out.insert(env.to_owned(), format!("--{long}"));
        }
    }
    for sub in cmd.get_subcommands() {
        collect(sub, out);
    }
}

/// The set variables (`vars`: name and value, as `std::env::vars_os`) that are not in `known` but
/// resemble one of its names, each with the known name: the same name in another letter case,
/// or at most [`MAX_EDITS`] edits from it.
pub fn resembling(
    known: &BTreeMap<String, String>,
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<(String, &str)> {
    let mut out = Vec::new();
    for (name, _) in vars {
        let Some(name) = name.to_str() else { continue };
        if known.contains_key(name) {
            continue;
        }
        let upper = name.to_ascii_uppercase();
        // Only infergate's own names are checked: `POD_NAME` and its like are Kubernetes'.
        let Some(rest) = upper.strip_prefix(PREFIX) else {
            continue;
        };
        let nearest = known
            .keys()
            .filter_map(|k| {
                let k_rest = k.strip_prefix(PREFIX)?;
                let d = edits(rest, k_rest);
                (d <= MAX_EDITS).then_some((d, k.as_str()))
            })
            .min();
        if let Some((_, k)) = nearest {
            out.push((name.to_owned(), k));
        }
    }
    out
}

/// For a clap error about a value that could not be used, the variable it was read from: the
/// failing flag reads a variable that is set, and the flag itself is not on the command line
/// (`args`, program name included). Where several subcommands' variables for that flag name are
/// set, each is named (`A or B`).
pub fn source_of_invalid_value(
    err: &clap::Error,
    known: &BTreeMap<String, String>,
    args: &[OsString],
    is_set: impl Fn(&str) -> bool,
) -> Option<String> {
    if !matches!(
        err.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation | ErrorKind::InvalidUtf8
    ) {
        return None;
    }
    let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    // clap names the flag as `--name <VALUE>`.
    let flag = arg.split_whitespace().next()?;
    let on_command_line = args.iter().skip(1).any(|a| {
        a.to_str().is_some_and(|a| {
            a == flag
                || a.strip_prefix(flag)
                    .is_some_and(|rest| rest.starts_with('='))
        })
    });
    if on_command_line {
        return None;
    }
    // Two subcommands may give one flag name different variables (`--config`): name each set.
    let vars: Vec<&str> = known
        .iter()
        .filter(|(env, f)| f.as_str() == flag && is_set(env))
        .map(|(env, _)| env.as_str())
        .collect();
    (!vars.is_empty()).then(|| vars.join(" or "))
}

/// The optimal string alignment distance: single-character insertions, deletions, replacements
/// and swaps of neighbours, each counted once.
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // Rows i-2, i-1 and i of the distance table.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut row = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        row[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (prev[j] + 1).min(row[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(before[j - 2] + 1);
            }
            row[j] = d;
        }
        std::mem::swap(&mut before, &mut prev);
        std::mem::swap(&mut prev, &mut row);
    }
    prev[b.len()]
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    fn vars(names: &[&str]) -> Vec<(OsString, OsString)> {
        names
            .iter()
            .map(|n| (OsString::from(n), OsString::from("x")))
            .collect()
    }

    #[test]
    fn every_flag_variable_is_known_with_its_flag() {
        let known = known(&crate::Cli::command());
        assert_eq!(known["INFERGATE_LOG_FORMAT"], "--log-format");
        assert_eq!(known["INFERGATE_GATEWAY_WORKERS"], "--workers");
        assert_eq!(known["INFERGATE_PICKER_THREADS"], "--threads");
        // The operator's pods read Kubernetes' downward-API names too.
        assert_eq!(known["POD_NAME"], "--identity");
        assert!(known.len() > 10, "{known:?}");
    }

    #[test]
    fn near_misses_are_named_and_other_names_are_not() {
        let known = known(&crate::Cli::command());
        let found = resembling(
            &known,
            vars(&[
                "INFERGATE_LOG_FROMAT",     // two letters swapped
                "infergate_gateway_config", // lower case
                "INFERGATE_GATEWAY_WORKER", // one letter short
                "INFERGATE_LOG_FORMAT",     // right
                "INFERGATE_REDIS_PASSWORD", // a secret a config file names
                "INFERGATE_FRONT_PORT",     // set by the bench for a front's command
                "PATH",
            ]),
        );
        assert_eq!(
            found,
            vec![
                ("INFERGATE_LOG_FROMAT".to_owned(), "INFERGATE_LOG_FORMAT"),
                (
                    "infergate_gateway_config".to_owned(),
                    "INFERGATE_GATEWAY_CONFIG"
                ),
                (
                    "INFERGATE_GATEWAY_WORKER".to_owned(),
                    "INFERGATE_GATEWAY_WORKERS"
                ),
            ]
        );
    }

    #[test]
    fn edits_count_swaps_once() {
        assert_eq!(edits("FORMAT", "FORMAT"), 0);
        assert_eq!(edits("FROMAT", "FORMAT"), 1);
        assert_eq!(edits("FORMA", "FORMAT"), 1);
        assert_eq!(edits("", "AB"), 2);
        assert_eq!(edits("KITTEN", "SITTING"), 3);
    }

    #[test]
    fn a_bad_value_from_a_variable_names_the_variable() {
        let cmd = crate::Cli::command();
        let known = known(&cmd);
        let args: Vec<OsString> = ["infergate", "gateway", "--config", "g.yaml"]
            .map(OsString::from)
            .to_vec();
        let set = |name: &str| name == "INFERGATE_GATEWAY_WORKERS";
        // As clap reports a value read from the variable: under the flag's name.
        let err = cmd
            .clone()
            .try_get_matches_from([
                "infergate",
                "gateway",
                "--config",
                "g.yaml",
                "--workers",
                "0",
            ])
            .unwrap_err();
        assert_eq!(
            source_of_invalid_value(&err, &known, &args, set).as_deref(),
            Some("INFERGATE_GATEWAY_WORKERS")
        );
        // The flag given on the command line is the value's source, whatever the environment.
        let with_flag: Vec<OsString> = ["infergate", "gateway", "--workers=0"]
            .map(OsString::from)
            .to_vec();
        assert_eq!(source_of_invalid_value(&err, &known, &with_flag, set), None);
        // The variable not set: nothing to add.
        assert_eq!(
            source_of_invalid_value(&err, &known, &args, |_| false),
            None
        );
        // Other errors are left alone.
        let missing = cmd
            .try_get_matches_from(["infergate", "gateway", "--nope"])
            .unwrap_err();
        assert_eq!(source_of_invalid_value(&missing, &known, &args, set), None);
    }
}
