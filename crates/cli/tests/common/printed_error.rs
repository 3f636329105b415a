//! The error the binary printed on its way out (`anyhow`'s `Error: …` and `Caused by:`), read
//! back, for the tests of refused starts.
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the helpers"
)]

/// The messages of the error the binary printed (`Error: …`, then each `Caused by:` line),
/// outermost first.
pub fn printed_chain(text: &str) -> Vec<String> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with("Error: "));
    let Some(first) = lines.next() else {
        panic!("no error printed: {text}");
    };
    let mut chain = vec![first.trim_start_matches("Error: ").to_owned()];
    let causes = lines
        .skip_while(|l| l.trim() != "Caused by:")
        .skip(1)
        .take_while(|l| l.starts_with(' '));
    for line in causes {
        let line = line.trim();
        // `0: …` when there are several causes.
        let line = match line.split_once(": ") {
            Some((n, rest)) if n.chars().all(|c| c.is_ascii_digit()) => rest,
            _ => line,
        };
        chain.push(line.to_owned());
    }
    chain
}

/// Asserts that no message of `chain` repeats one of its causes.
pub fn assert_said_once(chain: &[String], text: &str) {
    assert!(chain.len() >= 2, "no cause printed: {text}");
    for (i, outer) in chain.iter().enumerate() {
        for inner in &chain[i + 1..] {
            assert!(
                !outer.contains(inner.as_str()),
                "`{outer}` repeats its cause `{inner}`:\n{text}"
            );
        }
    }
}

/// Whether a finished run of the binary succeeded, and its standard output then standard error.
pub fn outcome(out: &std::process::Output) -> (bool, String) {
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Runs `infergate SUBCOMMAND --config FILE ARGS` with `env` set and `unset` removed (the
/// subcommand's own config variable, so the file given is the one read), and without a
/// backtrace unless `env` asks for one: whether it succeeded, and what it printed.
pub fn run_with_config(
    subcommand: &str,
    file: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
    unset: &str,
) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg(subcommand)
        .arg("--config")
        .arg(file)
        .args(args)
        .env_remove(unset)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .envs(env.iter().copied())
        .output()
        .expect("the infergate binary runs");
    outcome(&out)
}

/// `accessLog.path` in a folder that does not exist: `--check` and the start both refuse it,
/// naming the path once, before binding anything; a path in an existing folder passes `--check`
/// without being created (`--check` writes nothing). `run(body, args)` runs the subcommand on a
/// configuration `body`; `config(path)` is a configuration whose `accessLog.path` is `path`.
pub fn assert_access_log_checked(
    dir: &std::path::Path,
    config: impl Fn(&std::path::Path) -> String,
    run: impl Fn(&str, &[&str]) -> (bool, String),
) {
    let missing = dir.join("no-such-folder/access.log");
    let mut chains = Vec::new();
    for args in [&["--check"][..], &[]] {
        let (ok, text) = run(&config(&missing), args);
        assert!(!ok, "{args:?} passed: {text}");
        assert!(text.contains("accessLog.path"), "{args:?}: {text}");
        assert!(
            text.contains("no-such-folder/access.log"),
            "{args:?}: {text}"
        );
        assert!(!text.contains("binding"), "{args:?}: {text}");
        let chain = printed_chain(&text);
        assert_said_once(&chain, &text);
        chains.push(chain);
    }
    // `--check` stops on the error the start stops on, word for word (the start may say what it
    // was doing first): the missing folder named.
    assert!(chains[1].ends_with(&chains[0]), "{chains:?}");
    assert!(
        chains[1]
            .iter()
            .any(|l| l.contains("no folder") && l.contains("no-such-folder")),
        "{:?}",
        chains[1]
    );
    let fine = dir.join("access.log");
    let (ok, text) = run(&config(&fine), &["--check"]);
    assert!(ok, "{text}");
    assert!(!fine.exists(), "--check created {}", fine.display());
}
