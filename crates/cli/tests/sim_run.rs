//! `infergate sim` with `--tokenizer`: a directory that is not a tokenizer is refused at the
//! start (and by `--check`), naming the flag and what is wrong with which file, each once.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::path::Path;

#[path = "common/printed_error.rs"]
mod printed_error;
use printed_error::{assert_said_once, outcome, printed_chain};

/// Runs `infergate sim ARGS`, without the fleet variable or a backtrace.
fn sim<I: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = I>) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg("sim")
        .args(args)
        .env_remove("INFERGATE_SIM_FLEET")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("the infergate binary runs")
}

/// Runs `infergate sim --fleet <fleet> --tokenizer <dir> ARGS`: whether it succeeded, and what
/// it printed.
fn sim_with_tokenizer(dir: &Path, args: &[&str]) -> (bool, String) {
    let fleet = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sim/fleets/three-engines.yaml");
    let mut all = vec![
        "--fleet".into(),
        fleet.into_os_string(),
        "--tokenizer".into(),
        dir.into(),
    ];
    all.extend(args.iter().map(Into::into));
    outcome(&sim(all))
}

#[test]
fn a_directory_that_is_no_tokenizer_is_refused_naming_the_flag_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let broken = dir.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    std::fs::write(broken.join("tokenizer.json"), "{\"not\": \"a tokenizer\"}").unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    for (path, says) in [
        (
            missing.clone(),
            format!(
                "the tokenizer directory {} does not exist",
                missing.display()
            ),
        ),
        (
            empty.clone(),
            format!("no tokenizer.json in {}", empty.display()),
        ),
        (
            broken.clone(),
            format!(
                "{} is not a tokenizer the `tokenizers` library can load",
                broken.join("tokenizer.json").display()
            ),
        ),
    ] {
        // `--check` refuses what the start would, before serving anything.
        for args in [&["--check"][..], &[][..]] {
            let (ok, text) = sim_with_tokenizer(&path, args);
            assert!(!ok, "{args:?} {}: {text}", path.display());
            let chain = printed_chain(&text);
            assert_eq!(
                chain[0],
                format!("--tokenizer {}", path.display()),
                "{text}"
            );
            assert!(chain[1].starts_with(&says), "{text}");
            assert_said_once(&chain, &text);
        }
    }
    // The tiny real tokenizer passes.
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/tests/fixtures/tiny");
    let (ok, text) = sim_with_tokenizer(&tiny, &["--check"]);
    assert!(ok, "{text}");
}

/// `infergate sim --list-profiles` prints its table on stdout, so that it can be piped
/// (`| grep a10g`), and nothing else there.
#[test]
fn the_profile_list_is_printed_on_stdout() {
    let out = sim(["--list-profiles"]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let ids: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(ids.contains(&"llama-3.1-8b/h100"), "{stdout:?}");
    assert!(ids.contains(&"llama-3.1-8b/a10g"), "{stdout:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("llama-3.1-8b/h100"),
        "the list went to stderr too"
    );
}

/// `--kv-events-port` over a fleet without a vLLM pod is refused (by `--check` too): SGLang and
/// TGI pods publish no KV events, so it would open no port and say nothing.
#[test]
fn kv_events_over_a_fleet_without_vllm_pods_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("sglang.yaml");
    std::fs::write(
        &fleet,
        "seed: 1\npods:\n  - { name: s, profile: llama-3.1-8b/h100, engine: sglang }\n",
    )
    .unwrap();
    let (ok, said) = outcome(&sim([
        "--check".as_ref(),
        "--kv-events-port".as_ref(),
        "6000".as_ref(),
        "--fleet".as_ref(),
        fleet.as_os_str(),
    ]));
    assert!(!ok, "{said}");
    assert!(
        said.contains(&format!(
            "--kv-events-port: the fleet {} has no vLLM pod",
            fleet.display()
        )),
        "{said}"
    );
}
