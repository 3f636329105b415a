//! A cluster's files rotated in place: its `credentials.bearerTokenFile`, `tls.caFile`, and
//! `tls.certFile` and `tls.keyFile` are mounted Secrets in Kubernetes, rewritten under a running
//! router when they are rotated.
//!
//! One task of the front door reads every cluster's files each [`check_interval`] and compares
//! them with what it read the time before ([`Seen`]), as the gateway's certificate poller does: a
//! few hundred bytes from a local disk, cheaper than anything cleverer and blind to how the file
//! was replaced (rewritten in place, renamed over, a Secret's symlink swapped). A file that
//! changed is loaded by its cluster (`Cluster::check_files`), which swaps the new token or
//! connector in for the next request and keeps everything else — health, slow start, measured
//! TTFT, ejection, and for a token its connection pool. A file that changed into something
//! unusable keeps the last good value; since only a change is acted on, it is warned of once, not
//! at every check.

use std::io;
use std::time::Duration;

/// How often the files are checked when `reloadIntervalMs` is 0: turning the configuration's
/// reload off does not freeze a token the cluster will stop accepting (the gateway polls its
/// own certificate every second whatever its `reloadIntervalMs`).
pub(crate) const CHECK_WHEN_RELOAD_OFF: Duration = Duration::from_secs(1);

/// How often the clusters' files are read, given `reloadIntervalMs`.
pub(crate) fn check_interval(reload_interval_ms: u64) -> Duration {
    match reload_interval_ms {
        0 => CHECK_WHEN_RELOAD_OFF,
        ms => Duration::from_millis(ms),
    }
}

/// What a file held when it was last read, or how reading it failed (by kind: a file missing at
/// two checks in a row is no change).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Seen(Result<Vec<u8>, io::ErrorKind>);

impl Seen {
    /// What a read gave.
    pub(crate) fn new(read: &io::Result<Vec<u8>>) -> Seen {
        Seen(match read {
            Ok(bytes) => Ok(bytes.clone()),
            Err(e) => Err(e.kind()),
        })
    }

    /// The file as read now: handed back (and remembered) when it differs from the last read,
    /// `None` when it is the same.
    pub(crate) fn changed(&mut self, now: io::Result<Vec<u8>>) -> Option<io::Result<Vec<u8>>> {
        let same = match (&self.0, &now) {
            (Ok(before), Ok(bytes)) => before == bytes,
            (Err(before), Err(e)) => *before == e.kind(),
            _ => false,
        };
        if same {
            return None;
        }
        *self = Seen::new(&now);
        Some(now)
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::time::Duration;

    use super::{Seen, check_interval};

    fn missing() -> io::Result<Vec<u8>> {
        Err(io::Error::from(io::ErrorKind::NotFound))
    }

    #[test]
    fn only_a_change_is_handed_back() {
        let mut seen = Seen::new(&Ok(b"a".to_vec()));
        assert!(seen.changed(Ok(b"a".to_vec())).is_none());
        let now = seen.changed(Ok(b"b".to_vec()));
        assert_eq!(now.map(Result::ok), Some(Some(b"b".to_vec())));
        assert!(seen.changed(Ok(b"b".to_vec())).is_none());
    }

    /// A file gone stays one change however many checks it stays gone (warned of once), and its
    /// return with the old contents is a change too (loaded, so its value is in force again).
    #[test]
    fn a_failed_read_is_one_change_until_the_file_changes_again() {
        let mut seen = Seen::new(&Ok(b"a".to_vec()));
        assert!(seen.changed(missing()).is_some_and(|r| r.is_err()));
        assert!(seen.changed(missing()).is_none());
        let denied = Err(io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(seen.changed(denied).is_some());
        assert!(seen.changed(Ok(b"a".to_vec())).is_some());
        assert!(seen.changed(Ok(b"a".to_vec())).is_none());
    }

    #[test]
    fn reload_off_still_checks_every_second() {
        assert_eq!(check_interval(0), Duration::from_secs(1));
        assert_eq!(check_interval(50), Duration::from_millis(50));
    }
}
