//! `infergate global` with a configuration it refuses: `--check` refuses what the start would,
//! and the printed error says each thing once.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::path::Path;

#[path = "common/printed_error.rs"]
mod printed_error;
use printed_error::{assert_said_once, printed_chain};

const CLUSTER: &str = "clusters:\n  - { name: a, url: 'http://127.0.0.1:9', region: r, models: [m], cost: { inputPerMillion: 1 } }\n";

/// Runs `infergate global --config <dir>/global.yaml` (holding `body`) with `args` and `env`:
/// whether it succeeded, and what it printed.
fn global_with(dir: &Path, body: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let file = dir.join("global.yaml");
    std::fs::write(&file, body).unwrap();
    printed_error::run_with_config("global", &file, args, env, "INFERGATE_GLOBAL_CONFIG")
}

/// `listen` and `admin` on one port passed `--check`, and the start then failed binding the
/// admin port with "Address already in use", taken by its own front door. Both the file's pair
/// and the command line's are refused, by `--check` and by the start, before binding anything.
#[test]
fn listen_and_admin_on_one_port_are_refused_before_binding() {
    let dir = tempfile::tempdir().unwrap();
    for (listen, admin) in [
        ("127.0.0.1:29190", "127.0.0.1:29190"),
        ("0.0.0.0:29190", "127.0.0.1:29190"),
    ] {
        let body = format!("auth: none\nlisten: {listen}\nadmin: {admin}\n{CLUSTER}");
        for args in [&["--check"][..], &[]] {
            let (ok, text) = global_with(dir.path(), &body, args, &[]);
            assert!(!ok, "{listen} and {admin} {args:?} passed: {text}");
            assert!(text.contains("both take port 29190"), "{text}");
            assert!(!text.contains("binding"), "{text}");
            assert_said_once(&printed_chain(&text), &text);
        }
    }
    let body = format!("auth: none\nlisten: 127.0.0.1:29190\nadmin: 127.0.0.1:29191\n{CLUSTER}");
    let (ok, text) = global_with(dir.path(), &body, &["--check"], &[]);
    assert!(ok, "{text}");
    for flags in [
        &["--admin", "127.0.0.1:29190"][..],
        &["--listen", "127.0.0.1:29191"],
    ] {
        for check in [true, false] {
            let mut args = flags.to_vec();
            if check {
                args.push("--check");
            }
            let (ok, text) = global_with(dir.path(), &body, &args, &[]);
            assert!(!ok, "{args:?} passed: {text}");
            assert!(text.contains("--listen/--admin"), "{args:?}: {text}");
            assert!(!text.contains("binding"), "{args:?}: {text}");
        }
    }
}

/// The quota service's and tenancy's errors name their field; the printed error said it twice
/// (`quotas: `quotas.redis.passwordEnv`: …`, `tenancy: tenancy.tenantHeader: …`).
#[test]
fn a_sections_error_names_its_field_once() {
    let dir = tempfile::tempdir().unwrap();
    let quotas = format!(
        "auth: none\nquotas:\n  default: {{ requestsPerMinute: 60 }}\n  redis: {{ address: '127.0.0.1:9', passwordEnv: INFERGATE_TEST_UNSET_PASSWORD }}\n{CLUSTER}"
    );
    let tenancy = format!("auth: none\ntenancy: {{ tenantHeader: 'a b' }}\n{CLUSTER}");
    for (body, field) in [
        (quotas, "quotas.redis.passwordEnv"),
        (tenancy, "tenancy.tenantHeader"),
    ] {
        let (ok, text) = global_with(dir.path(), &body, &["--check"], &[]);
        assert!(!ok, "{body} passed: {text}");
        assert!(text.contains(field), "{text}");
        let section = field.split('.').next().unwrap();
        assert_eq!(text.matches(section).count(), 1, "{text}");
    }
}

/// A file the parser refuses: its message (field and line) follows the file's name directly,
/// without an "invalid configuration" line between them saying nothing more.
#[test]
fn a_parse_error_is_printed_once_after_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!("auth: none\nroutng: {{ policy: latency }}\n{CLUSTER}");
    let (ok, text) = global_with(dir.path(), &body, &["--check"], &[]);
    assert!(!ok, "{text}");
    let chain = printed_chain(&text);
    assert_eq!(chain.len(), 2, "{text}");
    assert!(chain[0].contains("global.yaml"), "{text}");
    assert!(
        chain[1].contains("unknown field `routng`") && chain[1].contains("line 2"),
        "{text}"
    );
    assert_said_once(&chain, &text);
}

/// `accessLog.path` in a folder that does not exist is refused by `--check` and the start;
/// `--check` creates no file.
#[test]
fn check_and_start_refuse_an_access_log_they_cannot_open() {
    let dir = tempfile::tempdir().unwrap();
    printed_error::assert_access_log_checked(
        dir.path(),
        |path| {
            format!(
                "auth: none\nlisten: 127.0.0.1:29192\nadmin: 127.0.0.1:29193\naccessLog: {{ path: '{}' }}\n{CLUSTER}",
                path.display()
            )
        },
        |body, args| global_with(dir.path(), body, args, &[]),
    );
}
