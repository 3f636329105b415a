//! A pool's change signal: raised whenever room may have freed up (an in-flight entry released,
//! a metrics page applied, a peer's lower load), waited on by flow control.
//!
//! Every watcher sees every signal — unlike `Notify::notify_one`, which wakes one waiter, so a
//! second controller on the same pool (a gateway reload that changed `flowControl:` keeps the
//! pool and starts a new controller while the old one's requests still wait) would have taken
//! half of the first one's wake-ups — and no signal is lost while a watcher is busy: a signal
//! between two waits is seen by the next one (a version number, read after the waiter is
//! registered).

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

/// Raised when room may have freed up; see the [module documentation](self).
#[derive(Debug, Default)]
pub struct Changes {
    version: AtomicU64,
    notify: Notify,
}

impl Changes {
    /// A signal nobody has raised yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Room may have freed up: wakes every watcher.
    pub fn signal(&self) {
        self.version.fetch_add(1, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// The signals raised so far: pass it to the first [`Changes::changed`], taken before
    /// anything that must not miss a later signal.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Waits for a signal raised after the version `seen`, then moves `seen` to the current
    /// one. Returns at once when one was raised since.
    pub async fn changed(&self, seen: &mut u64) {
        loop {
            let mut notified = std::pin::pin!(self.notify.notified());
            // Registered before the version is read: a signal after the read wakes this wait.
            notified.as_mut().enable();
            let now = self.version.load(Ordering::Acquire);
            if now != *seen {
                *seen = now;
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn every_watcher_sees_one_signal() {
        let changes = Arc::new(Changes::new());
        let mut watchers = Vec::new();
        for _ in 0..3 {
            let c = Arc::clone(&changes);
            let mut seen = c.version();
            watchers.push(tokio::spawn(async move { c.changed(&mut seen).await }));
        }
        tokio::task::yield_now().await;
        changes.signal();
        for w in watchers {
            tokio::time::timeout(Duration::from_secs(1), w)
                .await
                .expect("a watcher missed the signal")
                .unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_while_the_watcher_is_busy_is_seen_at_its_next_wait() {
        let changes = Changes::new();
        let mut seen = changes.version();
        changes.signal();
        tokio::time::timeout(Duration::from_secs(1), changes.changed(&mut seen))
            .await
            .expect("a signal raised before the wait was lost");
        // Seen once: the next wait waits for a new one.
        assert!(
            tokio::time::timeout(Duration::from_secs(1), changes.changed(&mut seen))
                .await
                .is_err()
        );
    }
}
