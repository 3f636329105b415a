//! What the examples that start `infergate gateway` as a child process share: a free port to
//! give it, and stopping it as a user would (SIGTERM, then SIGKILL after 10 s).

use std::process::{Child, Command};
use std::time::Duration;

/// A port free on 127.0.0.1 now (another process may take it before the child binds it).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Sends `child` SIGTERM and waits up to 10 s for it to exit, then kills it.
pub fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    for _ in 0..100 {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}
