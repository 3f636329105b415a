//! `infergate demo`, the README's first command, as the binary runs it: the built-in scenario
//! loads, both policies run, the table is printed and the report lands in `--out` (here on the
//! simulator, seconds instead of the live run's minutes; the live path is the bench's, tested in
//! `crates/bench/tests/live.rs`), and a Ctrl-C stops it as it stops a bench (what an interrupted
//! demo writes is tested beside its code, `src/cmd/demo.rs`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

use std::process::Command;

#[path = "common/signalled.rs"]
mod signalled;
use signalled::signalled;

#[test]
fn the_demo_runs_both_policies_and_writes_its_report_where_asked() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let run = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(["demo", "--simulated", "--out"])
        .arg(&out)
        .current_dir(dir.path())
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    for row in ["round-robin", "infergate", "clairvoyant floor"] {
        assert!(stdout.contains(row), "no {row} row: {stdout}");
    }
    let report = out.join("demo-simulated.md");
    assert!(
        stdout.contains(&report.display().to_string()),
        "the report's path is not printed: {stdout}"
    );
    let md = std::fs::read_to_string(&report).unwrap();
    assert!(md.contains("infergate"), "{md}");
    let svgs = std::fs::read_dir(&out)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "svg")
        })
        .count();
    assert!(svgs >= 2, "plots missing in {}", out.display());
    // Nothing is written into the working directory but what was asked for.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from("report")]);
}

/// Ctrl-C during the demo's first run (live, a minute of arrivals) stops it as it stops a
/// bench: nothing had completed, so no report is written; the demo says so, names the runs
/// not run, and exits 130.
#[test]
fn ctrl_c_stops_the_demo_as_it_stops_a_bench() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("report");
    let (out, stderr) = signalled(
        &["demo".as_ref(), "--out".as_ref(), out_dir.as_os_str()],
        |line| line.starts_with("demo live seed 1 (1/1) round-robin: "),
        std::time::Duration::from_secs(2),
        "-INT",
    );
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains(
            "interrupted during demo: no run had completed, so no report was written for it"
        ) && stderr.contains("not run: round-robin seed 1"),
        "{stderr}"
    );
    assert!(stderr.contains(", infergate seed 1"), "{stderr}");
    assert!(!out_dir.join("demo-live.md").exists());
}
