//! A KV-event publisher speaking vLLM's protocol: a `PUB` socket sending `[topic, seq, payload]`
//! and an optional `ROUTER` socket replaying buffered batches as `[seq, payload]`. The emulator's
//! pods publish with it, and the tests drive the subscriber against it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::zmtp::{Connection, Limits, SocketType};

/// The sequence number the replay socket sends after the last buffered batch (−1).
pub const END_SEQ: u64 = u64::MAX;

struct Shared {
    seq: u64,
    buffer: VecDeque<(u64, Bytes)>,
    capacity: usize,
}

/// A running publisher; dropping it stops the listeners.
pub struct Publisher {
    topic: Bytes,
    shared: Arc<Mutex<Shared>>,
    tx: broadcast::Sender<(u64, Bytes)>,
    addr: SocketAddr,
    replay_addr: Option<SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("addr", &self.addr)
            .field("replay_addr", &self.replay_addr)
            .finish_non_exhaustive()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Publisher {
    /// Binds the `PUB` socket on `addr` and, with `replay`, the `ROUTER` socket on it, keeping the
    /// last `buffer` batches for replay.
    pub async fn bind(
        addr: SocketAddr,
        replay: Option<SocketAddr>,
        topic: &str,
        buffer: usize,
    ) -> std::io::Result<Publisher> {
        let (tx, _) = broadcast::channel(1024);
        let shared = Arc::new(Mutex::new(Shared {
            seq: 0,
            buffer: VecDeque::new(),
            capacity: buffer,
        }));
        let topic = Bytes::copy_from_slice(topic.as_bytes());
        let pub_listener = TcpListener::bind(addr).await?;
        let bound = pub_listener.local_addr()?;
        let mut tasks = vec![tokio::spawn(serve_pub(
            pub_listener,
            tx.clone(),
            topic.clone(),
        ))];
        let mut replay_addr = None;
        if let Some(r) = replay {
            let l = TcpListener::bind(r).await?;
            replay_addr = Some(l.local_addr()?);
            tasks.push(tokio::spawn(serve_replay(l, shared.clone())));
        }
        Ok(Publisher {
            topic,
            shared,
            tx,
            addr: bound,
            replay_addr,
            tasks,
        })
    }

    /// The `PUB` socket's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The `ROUTER` socket's address, when replay is served.
    pub fn replay_addr(&self) -> Option<SocketAddr> {
        self.replay_addr
    }

    /// Publishes one encoded batch with the next sequence number; returns the number.
    pub fn publish(&self, payload: Vec<u8>) -> u64 {
        let payload = Bytes::from(payload);
        let seq = {
            let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
            let seq = s.seq;
            s.seq += 1;
            if s.capacity > 0 {
                if s.buffer.len() >= s.capacity {
                    s.buffer.pop_front();
                }
                s.buffer.push_back((seq, payload.clone()));
            }
            seq
        };
        let _ = self.tx.send((seq, payload));
        seq
    }

    /// Skips `n` sequence numbers as if those batches were lost in transit (they stay in the
    /// replay buffer only when `keep` is set). For tests of gap handling.
    pub fn lose(&self, payloads: Vec<Vec<u8>>, keep: bool) {
        let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        for p in payloads {
            let seq = s.seq;
            s.seq += 1;
            if keep && s.capacity > 0 {
                if s.buffer.len() >= s.capacity {
                    s.buffer.pop_front();
                }
                s.buffer.push_back((seq, Bytes::from(p)));
            }
        }
    }

    /// The topic frame.
    pub fn topic(&self) -> &[u8] {
        &self.topic
    }
}

async fn serve_pub(l: TcpListener, tx: broadcast::Sender<(u64, Bytes)>, topic: Bytes) {
    loop {
        let Ok((stream, _)) = l.accept().await else {
            continue;
        };
        let rx = tx.subscribe();
        let topic = topic.clone();
        tokio::spawn(async move {
            let Ok(conn) = Connection::handshake(stream, SocketType::Pub, Limits::default()).await
            else {
                return;
            };
            let _ = pub_conn(conn, rx, topic).await;
        });
    }
}

async fn pub_conn(
    mut conn: Connection,
    mut rx: broadcast::Receiver<(u64, Bytes)>,
    topic: Bytes,
) -> Result<(), crate::ZmtpError> {
    // Wait for the subscription (a message `0x01` + prefix) before sending, as libzmq does.
    let mut prefixes: Vec<Bytes> = Vec::new();
    let mut msg = Vec::new();
    while prefixes.is_empty() {
        conn.recv(&mut msg).await?;
        if let Some(f) = msg.first()
            && f.first() == Some(&1)
        {
            prefixes.push(f.slice(1..));
        }
    }
    // Later subscription changes are not followed: one prefix is all a subscriber sends.
    let wanted = prefixes.iter().any(|p| topic.starts_with(p));
    loop {
        match rx.recv().await {
            Ok((seq, payload)) => {
                if wanted {
                    conn.send(&[&topic, &seq.to_be_bytes(), &payload]).await?;
                }
            }
            // A slow subscriber loses batches, as over a PUB socket at its high-water mark.
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return Ok(()),
        }
    }
}

async fn serve_replay(l: TcpListener, shared: Arc<Mutex<Shared>>) {
    loop {
        let Ok((stream, _)) = l.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let Ok(mut conn) =
                Connection::handshake(stream, SocketType::Router, Limits::default()).await
            else {
                return;
            };
            let mut msg = Vec::new();
            loop {
                if conn.recv(&mut msg).await.is_err() {
                    return;
                }
                // From a DEALER: [empty delimiter, start seq]; vLLM ignores other shapes.
                let Some(start) = msg.last().and_then(|f| <[u8; 8]>::try_from(&f[..]).ok()) else {
                    continue;
                };
                let start = u64::from_be_bytes(start);
                let items: Vec<(u64, Bytes)> = {
                    let s = shared.lock().unwrap_or_else(|p| p.into_inner());
                    s.buffer
                        .iter()
                        .filter(|(q, _)| *q >= start)
                        .cloned()
                        .collect()
                };
                // As vLLM answers: `[delimiter, seq, payload]` per batch (no topic), then the
                // end marker `[delimiter, -1, empty]`.
                for (seq, payload) in items {
                    if conn
                        .send(&[b"", &seq.to_be_bytes(), &payload])
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                if conn
                    .send(&[b"", &END_SEQ.to_be_bytes(), b""])
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
}
