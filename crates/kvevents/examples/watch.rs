//! Subscribes to one engine's KV-event feed and prints what the index learns.
//!
//! `cargo run -p infergate-kvevents --example watch -- 127.0.0.1:5557 [REPLAY_ADDR] [SECONDS]`

use std::net::SocketAddr;
use std::time::Duration;

use infergate_kvevents::{KvEvents, SubscriberConfig};
use prometheus_client::registry::Registry;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let events: SocketAddr = args
        .next()
        .ok_or("usage: watch PUB_ADDR [REPLAY_ADDR] [SECONDS]")?
        .parse()?;
    let replay: Option<SocketAddr> = match args.next() {
        Some(a) if a != "-" => Some(a.parse()?),
        _ => None,
    };
    let secs: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let kv = KvEvents::new(SubscriberConfig::default());
    kv.add_pod_at(events, events, replay);
    for _ in 0..secs * 2 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let s = kv.index().stats();
        eprintln!(
            "synced={} blocks={} entries={} bytes={}",
            s.synced_pods, s.blocks, s.entries, s.bytes
        );
    }
    let mut r = Registry::default();
    kv.register(&mut r);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r)?;
    for line in out.lines().filter(|l| !l.starts_with('#')) {
        eprintln!("{line}");
    }
    Ok(())
}
