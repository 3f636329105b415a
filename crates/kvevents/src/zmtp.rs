//! A minimal ZMTP 3 peer over TCP: what subscribing to an engine's event publisher needs.
//!
//! vLLM publishes KV events on a ZeroMQ `PUB` socket and serves replays on a `ROUTER` socket.
//! Both speak ZMTP 3 (RFC 23/ZMTP) with the NULL mechanism: a 64-byte greeting each way, a
//! `READY` command naming the socket type, then frames. This module implements that much — the
//! `SUB` and `DEALER` sides for the subscriber, and the `PUB` and `ROUTER` sides for the emulator
//! and tests — with every size checked against a limit before anything is allocated. It
//! announces ZMTP 3.0, so a subscription is the 3.0 message form (`0x01` + topic) that every
//! libzmq since 4.0 accepts; a `PING` from a 3.1 peer is answered with `PONG`.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;

use crate::error::ZmtpError;

/// ZMTP socket types this module speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketType {
    /// Subscriber (to a `PUB`).
    Sub,
    /// Publisher.
    Pub,
    /// Dealer (to a `ROUTER`).
    Dealer,
    /// Router.
    Router,
}

impl SocketType {
    fn as_str(self) -> &'static str {
        match self {
            SocketType::Sub => "SUB",
            SocketType::Pub => "PUB",
            SocketType::Dealer => "DEALER",
            SocketType::Router => "ROUTER",
        }
    }

    /// The peer types this one may talk to (RFC 23's compatibility table).
    fn accepts(self, peer: &[u8]) -> bool {
        let ok: &[&[u8]] = match self {
            SocketType::Sub => &[b"PUB", b"XPUB"],
            SocketType::Pub => &[b"SUB", b"XSUB"],
            SocketType::Dealer => &[b"ROUTER", b"DEALER", b"REP"],
            SocketType::Router => &[b"DEALER", b"REQ", b"ROUTER"],
        };
        ok.contains(&peer)
    }
}

/// Limits on what a peer may send.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The largest frame accepted.
    pub max_frame: u64,
    /// The most frames in one message.
    pub max_frames: usize,
    /// How long the greeting and `READY` may take.
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame: 16 << 20,
            max_frames: 8,
            handshake_timeout: Duration::from_secs(5),
        }
    }
}

const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;

/// One ZMTP connection after its handshake.
pub struct Connection {
    io: BufStream<TcpStream>,
    limits: Limits,
    peer_type: SocketType,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer_type", &self.peer_type)
            .finish_non_exhaustive()
    }
}

fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3; // major
    g[11] = 0; // minor: 3.0
    g[12..16].copy_from_slice(b"NULL");
    g
}

impl Connection {
    /// Runs the handshake on a connected stream as a `ours` socket.
    pub async fn handshake(
        stream: TcpStream,
        ours: SocketType,
        limits: Limits,
    ) -> Result<Connection, ZmtpError> {
        let _ = stream.set_nodelay(true);
        let mut conn = Connection {
            io: BufStream::new(stream),
            limits,
            peer_type: ours,
        };
        let timeout = limits.handshake_timeout;
        let peer = tokio::time::timeout(timeout, conn.handshake_inner(ours))
            .await
            .map_err(|_| ZmtpError::Timeout(timeout.as_millis() as u64, "in the handshake"))??;
        conn.peer_type = peer;
        Ok(conn)
    }

    async fn handshake_inner(&mut self, ours: SocketType) -> Result<SocketType, ZmtpError> {
        self.io.write_all(&greeting()).await?;
        self.io.flush().await?;
        let mut g = [0u8; 64];
        self.io.read_exact(&mut g).await.map_err(eof)?;
        if g[0] != 0xff || g[9] & 0x01 != 0x01 {
            return Err(ZmtpError::Handshake(
                "not a ZMTP peer (bad signature)".into(),
            ));
        }
        if g[10] < 3 {
            return Err(ZmtpError::Handshake(format!(
                "ZMTP {}.{} peer; 3.0 or later is required",
                g[10], g[11]
            )));
        }
        let mech = &g[12..32];
        let name_end = mech.iter().position(|b| *b == 0).unwrap_or(mech.len());
        if &mech[..name_end] != b"NULL" {
            return Err(ZmtpError::Handshake(format!(
                "security mechanism {:?}; only NULL is supported",
                String::from_utf8_lossy(&mech[..name_end])
            )));
        }
        // READY with our socket type.
        let mut body = Vec::with_capacity(32);
        body.push(5);
        body.extend_from_slice(b"READY");
        push_property(&mut body, b"Socket-Type", ours.as_str().as_bytes());
        if ours == SocketType::Dealer {
            push_property(&mut body, b"Identity", b"");
        }
        self.write_frame(FLAG_COMMAND, &body).await?;
        self.io.flush().await?;
        let (flags, cmd) = self.read_frame().await?;
        if flags & FLAG_COMMAND == 0 {
            return Err(ZmtpError::Handshake(
                "expected the READY command, got a message".into(),
            ));
        }
        let peer = parse_ready(&cmd)?;
        if !ours.accepts(peer) {
            return Err(ZmtpError::Handshake(format!(
                "a {} socket cannot talk to a {} socket",
                ours.as_str(),
                String::from_utf8_lossy(peer)
            )));
        }
        Ok(match peer {
            b"PUB" | b"XPUB" => SocketType::Pub,
            b"SUB" | b"XSUB" => SocketType::Sub,
            b"ROUTER" => SocketType::Router,
            _ => SocketType::Dealer,
        })
    }

    /// The peer's socket type.
    pub fn peer_type(&self) -> SocketType {
        self.peer_type
    }

    async fn write_frame(&mut self, flags: u8, body: &[u8]) -> Result<(), ZmtpError> {
        if body.len() > 255 {
            self.io.write_u8(flags | FLAG_LONG).await?;
            self.io.write_u64(body.len() as u64).await?;
        } else {
            self.io.write_u8(flags).await?;
            self.io.write_u8(body.len() as u8).await?;
        }
        self.io.write_all(body).await?;
        Ok(())
    }

    async fn read_frame(&mut self) -> Result<(u8, BytesMut), ZmtpError> {
        let flags = self.io.read_u8().await.map_err(eof)?;
        if flags & !(FLAG_MORE | FLAG_LONG | FLAG_COMMAND) != 0 {
            return Err(ZmtpError::Handshake(format!(
                "frame flags {flags:#04x} have reserved bits set"
            )));
        }
        let size = if flags & FLAG_LONG != 0 {
            self.io.read_u64().await.map_err(eof)?
        } else {
            u64::from(self.io.read_u8().await.map_err(eof)?)
        };
        if size > self.limits.max_frame {
            return Err(ZmtpError::FrameTooLarge {
                size,
                limit: self.limits.max_frame,
            });
        }
        let mut body = BytesMut::zeroed(size as usize);
        self.io.read_exact(&mut body).await.map_err(eof)?;
        Ok((flags, body))
    }

    /// Sends one message of `frames`.
    pub async fn send(&mut self, frames: &[&[u8]]) -> Result<(), ZmtpError> {
        for (i, f) in frames.iter().enumerate() {
            let more = if i + 1 < frames.len() { FLAG_MORE } else { 0 };
            self.write_frame(more, f).await?;
        }
        self.io.flush().await?;
        Ok(())
    }

    /// Subscribes (a `SUB` socket) to messages whose first frame starts with `topic`.
    pub async fn subscribe(&mut self, topic: &[u8]) -> Result<(), ZmtpError> {
        let mut body = Vec::with_capacity(topic.len() + 1);
        body.push(1);
        body.extend_from_slice(topic);
        self.send(&[&body]).await
    }

    /// Receives the next message into `out` (cleared first), answering `PING`s and skipping other
    /// commands on the way.
    pub async fn recv(&mut self, out: &mut Vec<Bytes>) -> Result<(), ZmtpError> {
        out.clear();
        loop {
            let (flags, body) = self.read_frame().await?;
            if flags & FLAG_COMMAND != 0 {
                self.command(&body).await?;
                continue;
            }
            if out.len() >= self.limits.max_frames {
                return Err(ZmtpError::TooManyFrames(self.limits.max_frames));
            }
            out.push(body.freeze());
            if flags & FLAG_MORE == 0 {
                return Ok(());
            }
        }
    }

    async fn command(&mut self, body: &[u8]) -> Result<(), ZmtpError> {
        let Some((&n, rest)) = body.split_first() else {
            return Ok(());
        };
        let n = usize::from(n);
        if rest.len() < n {
            return Ok(());
        }
        if &rest[..n] == b"PING" {
            // PING: ttl (2 bytes), context; PONG echoes the context.
            let ctx = rest.get(n + 2..).unwrap_or(&[]);
            let mut pong = Vec::with_capacity(5 + ctx.len());
            pong.push(4);
            pong.extend_from_slice(b"PONG");
            pong.extend_from_slice(&ctx[..ctx.len().min(16)]);
            self.write_frame(FLAG_COMMAND, &pong).await?;
            self.io.flush().await?;
        }
        Ok(())
    }
}

fn eof(e: std::io::Error) -> ZmtpError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        ZmtpError::Closed
    } else {
        ZmtpError::Io(e)
    }
}

fn push_property(body: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    body.push(name.len() as u8);
    body.extend_from_slice(name);
    body.extend_from_slice(&(value.len() as u32).to_be_bytes());
    body.extend_from_slice(value);
}

/// The `Socket-Type` of a `READY` command.
fn parse_ready(cmd: &[u8]) -> Result<&[u8], ZmtpError> {
    let bad = |why: &str| ZmtpError::Handshake(format!("bad READY command: {why}"));
    let (&n, rest) = cmd.split_first().ok_or_else(|| bad("empty"))?;
    let n = usize::from(n);
    if rest.len() < n || &rest[..n] != b"READY" {
        return Err(bad("not READY"));
    }
    let mut p = &rest[n..];
    let mut socket_type = None;
    while !p.is_empty() {
        let (&kn, r) = p.split_first().ok_or_else(|| bad("property"))?;
        let kn = usize::from(kn);
        if r.len() < kn + 4 {
            return Err(bad("truncated property"));
        }
        let (k, r) = r.split_at(kn);
        let (len, r) = r.split_at(4);
        let vn = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if r.len() < vn {
            return Err(bad("truncated property value"));
        }
        let (v, r) = r.split_at(vn);
        if k.eq_ignore_ascii_case(b"Socket-Type") {
            socket_type = Some(v);
        }
        p = r;
    }
    socket_type.ok_or_else(|| bad("no Socket-Type"))
}

/// Connects to `addr` as `ours` and runs the handshake.
pub async fn connect(
    addr: &str,
    ours: SocketType,
    limits: Limits,
) -> Result<Connection, ZmtpError> {
    let timeout = limits.handshake_timeout;
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| ZmtpError::Timeout(timeout.as_millis() as u64, "connecting"))??;
    keep_alive(&stream)?;
    Connection::handshake(stream, ours, limits).await
}

/// Idle time before the first keepalive probe on a connection infergate opens.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);

/// Between keepalive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// TCP keepalive: a subscriber only reads, and an idle engine publishes nothing, so without
/// probes a publisher whose host or path vanished without a FIN or RST (a node lost, a NAT or
/// conntrack entry expired) would leave its feed in sequence forever, missing every event since.
/// With them the connection fails within about half a minute, and the feed is caught up anew.
fn keep_alive(stream: &TcpStream) -> std::io::Result<()> {
    let ka = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL);
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "macos"))]
    let ka = ka.with_retries(3);
    socket2::SockRef::from(stream).set_tcp_keepalive(&ka)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_opened_probe_their_peer() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let peer = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            Connection::handshake(s, SocketType::Pub, Limits::default()).await
        });
        let conn = connect(&addr, SocketType::Sub, Limits::default())
            .await
            .unwrap();
        peer.await.unwrap().unwrap();
        let sock = socket2::SockRef::from(conn.io.get_ref());
        assert!(sock.keepalive().unwrap());
        #[cfg(target_os = "linux")]
        {
            assert_eq!(sock.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
            assert_eq!(sock.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
            assert_eq!(sock.tcp_keepalive_retries().unwrap(), 3);
        }
    }

    #[test]
    fn ready_properties_are_parsed_and_bounded() {
        let mut body = vec![5];
        body.extend_from_slice(b"READY");
        push_property(&mut body, b"Identity", b"x");
        push_property(&mut body, b"Socket-Type", b"PUB");
        assert_eq!(parse_ready(&body).unwrap(), b"PUB");
        // A value length past the end is refused, not read.
        let mut bad = vec![5];
        bad.extend_from_slice(b"READY");
        bad.push(11);
        bad.extend_from_slice(b"Socket-Type");
        bad.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_ready(&bad).is_err());
        assert!(parse_ready(b"").is_err());
        assert!(parse_ready(b"\x05HELLO").is_err());
    }
}
