//! Progress reporting while runs are going (on stderr, never on stdout, which carries results).

use std::io::Write;

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
}

/// Reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;

impl Progress for Silent {
    fn start(&mut self, _label: &str, _total: u64) {}
    fn advance(&mut self, _done: u64) {}
    fn finish(&mut self) {}
}

/// A one-line progress bar on stderr, redrawn in place.
#[derive(Debug, Default)]
pub struct StderrBar {
    label: String,
    total: u64,
    shown: u64,
}

impl StderrBar {
    fn draw(&self, done: u64) {
        const WIDTH: u64 = 30;
        let filled = (done.min(self.total) * WIDTH)
            .checked_div(self.total)
            .unwrap_or(WIDTH);
        let bar: String = (0..WIDTH)
            .map(|i| if i < filled { '#' } else { '.' })
            .collect();
        // A failed write to stderr is not worth failing a benchmark for.
        let _ = write!(
            std::io::stderr(),
            "\r{:<40} [{bar}] {done}/{}",
            self.label,
            self.total
        );
    }
}

impl Progress for StderrBar {
    fn start(&mut self, label: &str, total: u64) {
        self.label = label.to_owned();
        self.total = total;
        self.shown = 0;
        self.draw(0);
    }

    fn advance(&mut self, done: u64) {
        // Redraw about every 2% so the bar costs nothing next to the simulation.
        if done >= self.shown + (self.total / 50).max(1) || done == self.total {
            self.shown = done;
            self.draw(done);
        }
    }

    fn finish(&mut self) {
        self.draw(self.total);
        let _ = writeln!(std::io::stderr());
    }

    fn abort(&mut self) {
        // Ends the bar's line where it stopped, so the error starts a line of its own.
        let _ = writeln!(std::io::stderr());
    }
}
