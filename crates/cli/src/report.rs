//! How a command that fails says why on its way out.
//!
//! The text is `anyhow`'s own layout — `Error: …`, then `Caused by:` and one line per cause,
//! numbered when there are several — without the stack trace `anyhow` appends when
//! `RUST_BACKTRACE` or `RUST_LIB_BACKTRACE` is set. Those variables are often set on pods for
//! the sake of panics; a refused configuration or a port already in use is an answer to the
//! person who started the process, and a trace of the binary's own frames would bury it.
//! Panics (bugs) still print their backtrace as the variables ask.

use std::fmt::Write as _;

/// The report of `error`: its message, then each cause, outermost first, ending in a newline.
pub(crate) fn error_report(error: &anyhow::Error) -> String {
    let mut out = format!("Error: {error}\n");
    let causes: Vec<String> = error.chain().skip(1).map(ToString::to_string).collect();
    if causes.is_empty() {
        return out;
    }
    out.push_str("\nCaused by:\n");
    let numbered = causes.len() > 1;
    for (n, cause) in causes.iter().enumerate() {
        // A cause of several lines keeps its later lines under its first.
        let (first, indent) = if numbered {
            (format!("{n:>5}: "), "       ")
        } else {
            ("    ".to_owned(), "    ")
        };
        out.push_str(&first);
        for (i, line) in cause.lines().enumerate() {
            if i > 0 {
                out.push('\n');
                out.push_str(indent);
            }
            out.push_str(line);
        }
        let _ = writeln!(out);
    }
    out
}

#[cfg(test)]
mod tests {
    use anyhow::{Context as _, anyhow};

    use super::error_report;

    /// `anyhow`'s own `Debug` text with no backtrace captured: what the report must equal.
    fn anyhow_layout(e: &anyhow::Error) -> String {
        let text = format!("Error: {e:?}\n");
        let cut = text.find("\n\nStack backtrace:").unwrap_or(text.len() - 1);
        format!("{}\n", &text[..cut])
    }

    #[test]
    fn the_report_is_anyhows_layout_without_a_backtrace() {
        let one: anyhow::Error = anyhow!("port 8080 is in use");
        let two = Err::<(), _>(anyhow!("unknown field `bogus`"))
            .context("invalid gateway configuration g.yaml")
            .unwrap_err();
        let three = Err::<(), _>(anyhow!("no such file"))
            .context("reading ca.pem")
            .context("loading `tls.clientCaFile`")
            .unwrap_err();
        let multi_line = Err::<(), _>(anyhow!("line one\nline two\n\nline four"))
            .context("outer")
            .context("outermost")
            .unwrap_err();
        let single_multi_line = Err::<(), _>(anyhow!("first\nsecond"))
            .context("outer")
            .unwrap_err();
        for e in [one, two, three, multi_line, single_multi_line] {
            let report = error_report(&e);
            assert!(!report.contains("backtrace"), "{report}");
            // Compared with anyhow's text when it captured no backtrace (the test may run with
            // RUST_BACKTRACE set: the comparison cuts the trace off anyhow's side).
            assert_eq!(report, anyhow_layout(&e), "{e:?}");
        }
        let three = Err::<(), _>(anyhow!("no such file"))
            .context("reading ca.pem")
            .context("loading `tls.clientCaFile`")
            .unwrap_err();
        assert_eq!(
            error_report(&three),
            "Error: loading `tls.clientCaFile`\n\nCaused by:\n    0: reading ca.pem\n    1: no such file\n"
        );
    }
}
