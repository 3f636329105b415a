//! `infergate global` with a configuration it refuses: `--check` refuses what the start would,
//! and the printed error says each thing once.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::path::Path;

#[path = "common/checked_files.rs"]
mod checked_files;
#[path = "common/printed_error.rs"]
mod printed_error;
use checked_files::CheckedFiles;
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

/// `--listen 8080` (a port alone) or a host name was refused by clap with "invalid socket
/// address syntax"; the flags now say what to write, as the file's `listen` does.
#[test]
fn a_port_alone_on_the_command_line_says_what_to_write() {
    let dir = tempfile::tempdir().unwrap();
    let body = format!("auth: none\n{CLUSTER}");
    for (flag, value) in [("--listen", "8080"), ("--admin", "localhost:9091")] {
        let (ok, text) = global_with(dir.path(), &body, &[flag, value, "--check"], &[]);
        assert!(!ok, "{flag} {value} passed: {text}");
        assert!(
            text.contains(&format!(
                "`{value}` is not an address: write an IP address and a port"
            )),
            "{text}"
        );
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

/// Every file a configuration can name, missing or unusable — the front door's certificate, key
/// and client CA bundle, a cluster's CA bundle, client certificate and token, the API key file:
/// `--check` refused none of them, and the start then stopped on it. Now `--check` refuses each
/// with the error the start stops on (the same printed chain, under the start's context), passes
/// once the files are good, and `--check --no-files` reads none of them.
#[test]
fn check_loads_every_file_the_configuration_names_as_the_start_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let CheckedFiles {
        cert,
        key,
        ca: ca_file,
        other_key,
        keys,
        missing,
    } = CheckedFiles::write(d);
    let [token, empty] = [("token", "secret\n"), ("empty", "\n")].map(|(name, text)| {
        let path = d.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    });
    let front = |c: &str, k: &str, client_ca: Option<&str>| {
        let client_ca = client_ca.map_or(String::new(), |f| format!(", clientCaFile: \"{f}\""));
        format!("tls: {{ certFile: \"{c}\", keyFile: \"{k}\"{client_ca} }}\n")
    };
    let cluster = |extra: &str| {
        format!(
            "clusters:\n  - {{ name: a, url: 'https://127.0.0.1:9', region: r, models: [m], \
             cost: {{ inputPerMillion: 1 }}{extra} }}\n"
        )
    };
    let cluster_ca = |f: &str| cluster(&format!(", tls: {{ caFile: \"{f}\" }}"));
    let client_cert = |c: &str, k: &str| {
        cluster(&format!(
            ", tls: {{ caFile: \"{ca_file}\", certFile: \"{c}\", keyFile: \"{k}\" }}"
        ))
    };
    let bearer = |f: &str| cluster(&format!(", credentials: {{ bearerTokenFile: \"{f}\" }}"));
    let none = "auth: none\n";
    let api_keys = |f: &str| format!("auth:\n  apiKeys: {{ file: \"{f}\" }}\n");
    let plain = cluster("");
    let bad = [
        (
            "tls.certFile missing",
            format!("{none}{}{plain}", front(&missing, &key, None)),
            "cannot read",
        ),
        (
            "tls.keyFile missing",
            format!("{none}{}{plain}", front(&cert, &missing, None)),
            "cannot read",
        ),
        (
            "tls.keyFile of another certificate",
            format!("{none}{}{plain}", front(&cert, &other_key, None)),
            "does not match",
        ),
        (
            "tls.clientCaFile missing",
            format!("{none}{}{plain}", front(&cert, &key, Some(&missing))),
            "cannot read",
        ),
        (
            "tls.clientCaFile without a certificate",
            format!("{none}{}{plain}", front(&cert, &key, Some(&keys))),
            "no PEM certificate",
        ),
        (
            "clusters[0].tls.caFile missing",
            format!("{none}{}", cluster_ca(&missing)),
            "tls.caFile",
        ),
        (
            "clusters[0].tls.caFile without a certificate",
            format!("{none}{}", cluster_ca(&keys)),
            "tls.caFile",
        ),
        (
            "clusters[0].tls.certFile missing",
            format!("{none}{}", client_cert(&missing, &key)),
            "tls.certFile",
        ),
        (
            "clusters[0].tls.keyFile of another certificate",
            format!("{none}{}", client_cert(&cert, &other_key)),
            "does not match",
        ),
        (
            "clusters[0].credentials.bearerTokenFile missing",
            format!("{none}{}", bearer(&missing)),
            "credentials.bearerTokenFile",
        ),
        (
            "clusters[0].credentials.bearerTokenFile empty",
            format!("{none}{}", bearer(&empty)),
            "it is empty",
        ),
        (
            "auth.apiKeys.file missing",
            format!("{}{plain}", api_keys(&missing)),
            "auth.apiKeys",
        ),
    ];
    let ports = ["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
    // Each error names its field (the cause names the file).
    let field = |what: &str| match what.split_whitespace().next().unwrap_or_default() {
        f if f.starts_with("tls.") => "tls: the front door's",
        "clusters[0].tls.caFile" => "cluster `a`: tls.caFile",
        f if f.starts_with("clusters[0].tls.") => "cluster `a`: tls.certFile/tls.keyFile",
        f if f.starts_with("clusters[0].credentials") => "cluster `a`: credentials.bearerTokenFile",
        _ => "auth.apiKeys",
    };
    for (what, body, expected) in &bad {
        let (ok, checked) = global_with(d, body, &["--check"], &[]);
        assert!(!ok, "{what}: --check passed: {checked}");
        assert!(checked.contains(expected), "{what}: {checked}");
        assert!(checked.contains(field(what)), "{what}: {checked}");
        assert_said_once(&printed_chain(&checked), &checked);
        let (ok, started) = global_with(d, body, &ports, &[]);
        assert!(!ok, "{what}: started: {started}");
        let mut start_chain = printed_chain(&started);
        assert_eq!(
            start_chain.remove(0),
            "starting the global router",
            "{started}"
        );
        assert_eq!(
            printed_chain(&checked),
            start_chain,
            "{what}: --check and the start print different errors"
        );
        let (ok, text) = global_with(d, body, &["--check", "--no-files"], &[]);
        assert!(ok, "{what}: --check --no-files: {text}");
        assert!(text.contains("were not read"), "{what}: {text}");
    }
    let good = [
        format!("{none}{}{plain}", front(&cert, &key, Some(&ca_file))),
        format!("{none}{}", client_cert(&cert, &key)),
        format!("{none}{}", bearer(&token)),
        format!("{}{plain}", api_keys(&keys)),
    ];
    for body in &good {
        let (ok, text) = global_with(d, body, &["--check"], &[]);
        assert!(ok, "{body}: {text}");
        assert!(text.contains("is valid"), "{body}: {text}");
    }
    // `--no-files` is a modifier of `--check`, not a way to start without reading them.
    let (ok, text) = global_with(d, &good[0], &["--no-files"], &[]);
    assert!(!ok, "{text}");
    assert!(text.contains("--check"), "{text}");
}

/// A port another process holds: the start's error names the address and the setting that chose
/// it (`listen` or `admin`, and the flag over it), not the address alone.
#[test]
fn a_port_in_use_names_the_setting_that_chose_it() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let body = format!("auth: none\n{CLUSTER}");
    for (flag, other, setting) in [
        ("--listen", "--admin", "(`listen`, or --listen)"),
        ("--admin", "--listen", "(`admin`, or --admin)"),
    ] {
        let args = [flag, port.as_str(), other, "127.0.0.1:0"];
        let (ok, text) = global_with(dir.path(), &body, &args, &[]);
        assert!(!ok, "{args:?} started: {text}");
        assert!(
            text.contains(&port) && text.contains(setting),
            "{args:?}: {text}"
        );
        assert_said_once(&printed_chain(&text), &text);
    }
}

/// A cluster's token sent to an `http://` URL on another machine is warned of at start; `--check`
/// called the file valid without a word. It now gives the start's warning, with and without
/// `--no-files`, and still passes: a warning is not a refusal.
#[test]
fn check_gives_the_starts_warning_of_a_token_in_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "secret\n").unwrap();
    let body = format!(
        "auth: none\nclusters:\n  - {{ name: far, url: 'http://10.0.0.1:8080', region: r, models: [m], cost: {{ inputPerMillion: 1 }}, credentials: {{ bearerTokenFile: \"{}\" }} }}\n",
        token.display()
    );
    for args in [&["--check"][..], &["--check", "--no-files"]] {
        let (ok, text) = global_with(dir.path(), &body, args, &[]);
        assert!(ok, "{args:?}: {text}");
        let warnings: Vec<&str> = text.lines().filter(|l| l.contains(" WARN ")).collect();
        assert_eq!(warnings.len(), 1, "{args:?}: {text}");
        assert!(
            warnings[0].contains("crosses the network in plaintext")
                && warnings[0].contains("cluster=far"),
            "{args:?}: {text}"
        );
    }
}
