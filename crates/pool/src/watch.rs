//! Polling a file a process reloads: the gateway's and the global router's configuration, the
//! endpoint picker's model rewrites. The file is read whole at each interval and compared with
//! the last read: a few KB, cheaper than anything cleverer, and blind to how it was replaced
//! (rewritten in place, renamed over, a mounted ConfigMap's symlink swapped).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::ErrorChain;

/// Reads `path` every `interval()` (asked again each time, so that the setting in force
/// applies; zero ends the watch) and calls `reload` when its contents changed, until `shutdown`
/// completes. `what` names the file's contents in the log (`configuration`, `model rewrites`);
/// a refused reload is logged as an error, and what stays in force is `reload`'s business.
pub fn watch_file<E: std::error::Error + Send + 'static>(
    path: PathBuf,
    what: &'static str,
    interval: impl Fn() -> Duration + Send + 'static,
    reload: impl Fn(&Path) -> Result<(), E> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    // Read before returning, so a change made right after this call is seen as a change.
    // A config file is a few KB on a local disk: reading it inline is cheaper than a thread hop.
    let mut last = std::fs::read(&path).ok();
    tokio::spawn(async move {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let interval = interval();
            if interval.is_zero() {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = &mut shutdown => return,
            }
            let now = std::fs::read(&path).ok();
            if now.is_none() || now == last {
                continue;
            }
            last = now;
            match reload(&path) {
                Ok(()) => tracing::info!(path = %path.display(), "{what} reloaded"),
                Err(e) => tracing::error!(
                    path = %path.display(),
                    error = %ErrorChain(&e),
                    "{what} reload rejected; what was in force stays"
                ),
            }
        }
    })
}
