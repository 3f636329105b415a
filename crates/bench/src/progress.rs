//! Progress reporting while runs are going (on stderr, never on stdout, which carries results).

use std::io::{IsTerminal as _, Write};

/// Receives progress from a running benchmark.
pub trait Progress {
    /// A new run begins: `label` names it, `total` is its number of requests.
    fn start(&mut self, label: &str, total: u64);
    /// `done` of the current run's requests have been routed.
    fn advance(&mut self, done: u64);
    /// The current run ended.
    fn finish(&mut self);
    /// The current run failed and will not finish (an error follows).
    fn abort(&mut self) {}
    /// The current run failed for `why` and is recorded as failed; the benchmark goes on.
    fn fail(&mut self, why: &str) {
        let _ = why;
        self.abort();
    }
}

/// Reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;

impl Progress for Silent {
    fn start(&mut self, _label: &str, _total: u64) {}
    fn advance(&mut self, _done: u64) {}
    fn finish(&mut self) {}
}

/// A one-line progress bar on stderr, redrawn in place on a terminal. When stderr is a file or
/// a pipe (CI logs, `2> log`), it writes one line when a run starts and one when it ends instead
/// of a carriage-return redraw per step, which would make one line of thousands of bars.
#[derive(Debug)]
pub struct StderrBar {
    label: String,
    total: u64,
    shown: u64,
    terminal: bool,
}

impl Default for StderrBar {
    fn default() -> Self {
        Self::new(std::io::stderr().is_terminal())
    }
}

impl StderrBar {
    /// A bar redrawn in place when `terminal`, else written as start and end lines.
    pub fn new(terminal: bool) -> Self {
        Self {
            label: String::new(),
            total: 0,
            shown: 0,
            terminal,
        }
    }

    /// What the bar writes for `done` of `total` (no line end: a terminal's bar is redrawn).
    fn line(&self, done: u64) -> String {
        const WIDTH: u64 = 30;
        let filled = (done.min(self.total) * WIDTH)
            .checked_div(self.total)
            .unwrap_or(WIDTH);
        let bar: String = (0..WIDTH)
            .map(|i| if i < filled { '#' } else { '.' })
            .collect();
        format!("\r{:<40} [{bar}] {done}/{}", self.label, self.total)
    }

    fn draw(&self, done: u64) {
        // A failed write to stderr is not worth failing a benchmark for.
        let _ = write!(std::io::stderr(), "{}", self.line(done));
    }
}

impl Progress for StderrBar {
    fn start(&mut self, label: &str, total: u64) {
        self.label = label.to_owned();
        self.total = total;
        self.shown = 0;
        if self.terminal {
            self.draw(0);
        } else {
            let _ = writeln!(std::io::stderr(), "{label}: {total} requests");
        }
    }

    fn advance(&mut self, done: u64) {
        // Redraw about every 2% so the bar costs nothing next to the simulation.
        if self.terminal && (done >= self.shown + (self.total / 50).max(1) || done == self.total) {
            self.shown = done;
            self.draw(done);
        }
    }

    fn finish(&mut self) {
        if self.terminal {
            self.draw(self.total);
            let _ = writeln!(std::io::stderr());
        } else {
            let _ = writeln!(std::io::stderr(), "{}: done", self.label);
        }
    }

    fn abort(&mut self) {
        if self.terminal {
            // Ends the bar's line where it stopped, so the error starts a line of its own.
            let _ = writeln!(std::io::stderr());
        }
    }

    fn fail(&mut self, why: &str) {
        self.abort();
        // Said now, not only in the report: the bench may go on for a long time.
        let _ = writeln!(std::io::stderr(), "{}: failed: {why}", self.label);
    }
}
