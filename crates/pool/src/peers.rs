//! Active-active replicas of one pool: each replica pushes its own in-flight load to its peers
//! over standing TCP connections, so that every replica's picks count the requests the others
//! have in flight (see `infergate_scheduler::peers` for what is shared and how it is counted).
//!
//! - **Reporter**: woken by every change of the replica's own load (a pick, a first token, a
//!   release), it reads the load per endpoint and the rate samples learned, and encodes one
//!   [`wire::Report`] for every peer: at once when the previous report is older than
//!   [`PeerSettings::interval`] (5 ms by default), else at the end of that interval, so changes
//!   coalesce to at most one report per interval; an idle replica sends the same report every
//!   [`PeerSettings::keepalive`].
//! - **Dialers**: one task per peer address keeps a connection open and writes the newest report
//!   on it (a slow peer skips to the newest: loads replace, they do not add up; rate samples of a
//!   skipped report are lost, which costs learning speed only). Reconnects back off from 100 ms
//!   to 5 s. Peer addresses are listed or resolved from a DNS name (a headless Service: every
//!   replica's pod IP, this one's included — a replica that finds itself at an address, by the
//!   name in the server's greeting, stops dialing it).
//! - **Listener**: accepts peers' connections and applies each report as that peer's newest
//!   ([`Scheduler::apply_peer_loads`](infergate_scheduler::Scheduler::apply_peer_loads)); a peer
//!   silent for [`PeerSettings::expire_after`] is dropped.
//!
//! Connections are authenticated both ways by a shared key and every frame is tagged
//! ([`wire`]): a port reachable by others accepts nothing from a sender without the key.

pub mod wire;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::LivePool;
use wire::{
    ACCEPTED, MAC_LEN, MAGIC, MAX_NAME, NONCE_LEN, REFUSED, Refusal, Report, Transcript, WireError,
};

/// Default port of the peer exchange.
pub const DEFAULT_PEER_PORT: u16 = 9006;
/// Default shortest time between two reports (changes within it are coalesced into one).
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(5);
/// Default longest time between two reports, changed or not.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_millis(250);
/// Default silence after which a peer's load stops counting.
pub const DEFAULT_EXPIRE_AFTER: Duration = Duration::from_millis(1500);
/// Default time between two resolutions of DNS peer names.
pub const DEFAULT_RESOLVE_EVERY: Duration = Duration::from_secs(5);
/// Deadline of a connection attempt and of the handshake, and of writing one frame.
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Inbound connections held at once (a handful of replicas, each reconnecting now and then).
const MAX_INBOUND: usize = 2 * infergate_scheduler::MAX_PEERS;

/// Where a peer replica listens: an address, or a DNS name resolved now and then (a headless
/// Service's name gives every ready replica's pod address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerTarget {
    /// One address.
    Addr(SocketAddr),
    /// Every address the name resolves to, on `port`.
    Dns {
        /// The name.
        host: String,
        /// The port.
        port: u16,
    },
}

impl FromStr for PeerTarget {
    type Err = String;

    /// `10.0.0.7:9006`, `[fd00::7]:9006` or `pickers.ns.svc.cluster.local:9006`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(PeerTarget::Addr(a));
        }
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("peer `{s}`: expected HOST:PORT or IP:PORT"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| format!("peer `{s}`: port `{port}` is not a number in 1..=65535"))?;
        let valid = !host.is_empty()
            && host.len() <= MAX_NAME
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !valid || port == 0 {
            return Err(format!(
                "peer `{s}`: `{host}` is not a DNS name (letters, digits, `-`, `.`) or the port is 0"
            ));
        }
        Ok(PeerTarget::Dns {
            host: host.to_owned(),
            port,
        })
    }
}

impl fmt::Display for PeerTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerTarget::Addr(a) => write!(f, "{a}"),
            PeerTarget::Dns { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// The shared key every replica of a pool holds. Its bytes never leave the process.
#[derive(Clone)]
pub struct PeerKey(hmac::Key);

impl PeerKey {
    /// The key from a key file's bytes (surrounding whitespace trimmed); `None` when fewer than
    /// [`wire::MIN_KEY_LEN`] bytes remain.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        wire::key_from_bytes(bytes).map(PeerKey)
    }
}

impl fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PeerKey(..)")
    }
}

/// How a replica takes part in the exchange.
#[derive(Debug, Clone)]
pub struct PeerSettings {
    /// This replica's name, unique among the pool's replicas (its pod name).
    pub replica: String,
    /// The pool's name: a peer serving another pool is refused.
    pub pool: String,
    /// Where peers connect (`None`: this replica only sends).
    pub listen: Option<SocketAddr>,
    /// Where the peers listen.
    pub targets: Vec<PeerTarget>,
    /// The shared key.
    pub key: PeerKey,
    /// Shortest time between two reports: a change is pushed at once unless a report went out
    /// less than this ago (then at the end of it, with every change since).
    pub interval: Duration,
    /// Longest time between two reports.
    pub keepalive: Duration,
    /// Silence after which a peer's load stops counting.
    pub expire_after: Duration,
    /// Time between two resolutions of DNS targets.
    pub resolve_every: Duration,
}

impl PeerSettings {
    /// Settings with the defaults for everything but the names, addresses and key.
    pub fn new(
        replica: impl Into<String>,
        pool: impl Into<String>,
        listen: Option<SocketAddr>,
        targets: Vec<PeerTarget>,
        key: PeerKey,
    ) -> Self {
        PeerSettings {
            replica: replica.into(),
            pool: pool.into(),
            listen,
            targets,
            key,
            interval: DEFAULT_INTERVAL,
            keepalive: DEFAULT_KEEPALIVE,
            expire_after: DEFAULT_EXPIRE_AFTER,
            resolve_every: DEFAULT_RESOLVE_EVERY,
        }
    }

    /// Checks names and timings.
    pub fn validate(&self) -> Result<(), PeerSetupError> {
        let bad = |reason: String| Err(PeerSetupError::Invalid(reason));
        for (what, name) in [("replica name", &self.replica), ("pool name", &self.pool)] {
            if let Err(e) = wire::check_name(what, name.as_bytes()) {
                return bad(e.to_string());
            }
        }
        if self.listen.is_none() && self.targets.is_empty() {
            return bad("neither a listen address nor a peer: nothing to exchange".into());
        }
        if !(Duration::from_millis(1)..=Duration::from_secs(1)).contains(&self.interval) {
            return bad(format!(
                "interval {:?} must be within 1 ms..=1 s",
                self.interval
            ));
        }
        if self.keepalive < self.interval {
            return bad(format!(
                "keepalive {:?} must be at least the interval {:?}",
                self.keepalive, self.interval
            ));
        }
        if self.expire_after < 2 * self.keepalive {
            return bad(format!(
                "expire-after {:?} must be at least twice the keepalive {:?} (one lost report must not drop a peer)",
                self.expire_after, self.keepalive
            ));
        }
        if self.resolve_every < Duration::from_millis(100) {
            return bad(format!(
                "resolve-every {:?} must be at least 100 ms",
                self.resolve_every
            ));
        }
        Ok(())
    }
}

/// Why the exchange could not start.
#[derive(Debug, thiserror::Error)]
pub enum PeerSetupError {
    /// A setting is out of range.
    #[error("peer exchange: {0}")]
    Invalid(String),
    /// The listen address could not be bound.
    #[error("peer exchange: cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Why one connection ended.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("timed out")]
    Timeout,
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("refused by the peer: {}", .0.map_or("unknown reason", Refusal::as_str))]
    RefusedByPeer(Option<Refusal>),
    #[error("the peer's acceptance does not verify (it holds another key)")]
    BadAccept,
    #[error("refused: {}", .0.as_str())]
    Refused(Refusal),
    #[error("no random bytes for a nonce")]
    Random,
}

impl SessionError {
    fn reason(&self) -> &'static str {
        match self {
            SessionError::Io(_) => "io",
            SessionError::Timeout => "timeout",
            SessionError::Wire(WireError::BadMagic) => "bad-magic",
            SessionError::Wire(WireError::BadTag { .. }) => "bad-tag",
            SessionError::Wire(_) => "malformed",
            SessionError::RefusedByPeer(_) => "refused-by-peer",
            SessionError::BadAccept => "bad-mac",
            SessionError::Refused(r) => r.as_str(),
            SessionError::Random => "random",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// The exchange's series (`infergate_peer_*`).
#[derive(Clone, Default)]
struct Stats {
    sent: Counter,
    received: Counter,
    failures: Family<ReasonLabels, Counter>,
    outbound: Gauge,
    inbound: Gauge,
    peers: Gauge,
    expired: Counter,
}

impl Stats {
    fn register(&self, r: &mut Registry) {
        r.register(
            "infergate_peer_reports_sent",
            "Load reports written to peer replicas",
            self.sent.clone(),
        );
        r.register(
            "infergate_peer_reports_received",
            "Load reports from peer replicas applied",
            self.received.clone(),
        );
        r.register(
            "infergate_peer_connection_failures",
            "Peer connections that failed or were refused, by reason (bad-mac: another key; bad-tag: a frame altered or out of order; other-pool; timeout; io; ...)",
            self.failures.clone(),
        );
        r.register(
            "infergate_peer_connections_outbound",
            "Connections to peer replicas established",
            self.outbound.clone(),
        );
        r.register(
            "infergate_peer_connections_inbound",
            "Connections from peer replicas established",
            self.inbound.clone(),
        );
        r.register(
            "infergate_peer_replicas",
            "Peer replicas whose load currently counts in picks",
            self.peers.clone(),
        );
        r.register(
            "infergate_peer_expired",
            "Peer replicas dropped after a silence longer than expire-after",
            self.expired.clone(),
        );
    }

    fn failed(&self, e: &SessionError) {
        self.failures
            .get_or_create(&ReasonLabels { reason: e.reason() })
            .inc();
    }
}

struct Ctx {
    pool: LivePool,
    settings: PeerSettings,
    stats: Stats,
    rng: SystemRandom,
    /// Addresses found to be this replica itself.
    selves: Mutex<HashSet<SocketAddr>>,
}

impl Ctx {
    fn nonce(&self) -> Result<[u8; NONCE_LEN], SessionError> {
        let mut n = [0u8; NONCE_LEN];
        self.rng.fill(&mut n).map_err(|_| SessionError::Random)?;
        Ok(n)
    }

    fn selves(&self) -> std::sync::MutexGuard<'_, HashSet<SocketAddr>> {
        self.selves.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running exchange; dropping it (or [`PeerExchange::shutdown`]) stops every task.
pub struct PeerExchange {
    tasks: Vec<JoinHandle<()>>,
    local_addr: Option<SocketAddr>,
}

impl PeerExchange {
    /// Starts the exchange for `pool`: binds the listen address (its error is returned here),
    /// then runs the reporter, listener, dialers, resolver and expiry in the background. Series
    /// (`infergate_peer_*`) go into `registry` when one is given. Must run inside a tokio runtime.
    pub async fn start(
        pool: LivePool,
        settings: PeerSettings,
        registry: Option<&mut Registry>,
    ) -> Result<Self, PeerSetupError> {
        settings.validate()?;
        let listener = match settings.listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| PeerSetupError::Bind { addr, source })?,
            ),
            None => None,
        };
        let local_addr = listener.as_ref().and_then(|l| l.local_addr().ok());
        let stats = Stats::default();
        if let Some(r) = registry {
            stats.register(r);
        }
        let (ctx_replica, ctx_pool) = (settings.replica.clone(), settings.pool.clone());
        let targets: Vec<String> = settings.targets.iter().map(ToString::to_string).collect();
        let ctx = Arc::new(Ctx {
            pool,
            settings,
            stats,
            rng: SystemRandom::new(),
            selves: Mutex::new(HashSet::new()),
        });
        let (tx, rx) = watch::channel(Arc::new(Vec::new()));
        let mut tasks = vec![
            tokio::spawn(report(Arc::clone(&ctx), tx)),
            tokio::spawn(expire(Arc::clone(&ctx))),
        ];
        if !ctx.settings.targets.is_empty() {
            tasks.push(tokio::spawn(resolve(Arc::clone(&ctx), rx)));
        }
        if let Some(l) = listener {
            tasks.push(tokio::spawn(listen(ctx, l)));
        }
        // The address as text, or no field when this replica does not listen; the peers as one
        // comma-separated field (Debug would log `Some(…)` and a quoted list).
        tracing::info!(
            replica = %ctx_replica,
            pool = %ctx_pool,
            listen = local_addr.map(tracing::field::display),
            peers = %targets.join(","),
            "peer exchange started"
        );
        Ok(PeerExchange { tasks, local_addr })
    }

    /// The bound listen address (port 0 resolved), if listening.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Stops every task; peers drop this replica's load after their expire-after.
    pub fn shutdown(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Drop for PeerExchange {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Publishes this replica's report when its load changed — at once, unless a report went out
/// less than an interval ago, then at the end of that interval (changes in between coalesce) —
/// and at least every keepalive.
async fn report(ctx: Arc<Ctx>, tx: watch::Sender<Arc<Vec<u8>>>) {
    let s = &ctx.settings;
    let shared = &ctx.pool.shared;
    shared.peer_wake_on.store(true, Ordering::Relaxed);
    let mut report = Report::default();
    let mut previous = Vec::new();
    let mut last = Instant::now();
    let mut first = true;
    loop {
        if !first {
            tokio::select! {
                () = shared.peer_wake.notified() => {}
                () = tokio::time::sleep_until(last + s.keepalive) => {}
            }
            // At most one report per interval.
            tokio::time::sleep_until(last + s.interval).await;
        }
        ctx.pool.with_scheduler(|sch| {
            sch.peer_loads(&mut report.loads);
            sch.take_rate_samples(&mut report.samples);
        });
        let due = last.elapsed() >= s.keepalive;
        if !first && !due && report.loads == previous && report.samples.is_empty() {
            continue;
        }
        first = false;
        last = Instant::now();
        tx.send_replace(Arc::new(report.encode()));
        std::mem::swap(&mut previous, &mut report.loads);
    }
}

/// Drops peers that went silent, and keeps the peer gauge current.
async fn expire(ctx: Arc<Ctx>) {
    let after = ctx.settings.expire_after;
    let mut tick = tokio::time::interval(after / 4);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let now = ctx.pool.clock().now();
        let (dropped, left) = ctx
            .pool
            .with_scheduler(|s| (s.expire_peers(now, after), s.peer_count()));
        if dropped > 0 {
            tracing::info!(dropped, left, "peer replicas silent for {after:?} dropped");
            ctx.stats.expired.inc_by(dropped as u64);
        }
        ctx.stats.peers.set(left as i64);
    }
}

/// Keeps one dialer per peer address, resolving DNS targets every `resolve_every`.
async fn resolve(ctx: Arc<Ctx>, rx: watch::Receiver<Arc<Vec<u8>>>) {
    let mut dialers: HashMap<SocketAddr, JoinHandle<()>> = HashMap::new();
    // The addresses each DNS name gave last; kept while a lookup fails.
    let mut resolved: HashMap<String, Vec<SocketAddr>> = HashMap::new();
    let mut tick = tokio::time::interval(ctx.settings.resolve_every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let mut want = HashSet::new();
        for t in &ctx.settings.targets {
            match t {
                PeerTarget::Addr(a) => {
                    want.insert(*a);
                }
                PeerTarget::Dns { host, port } => {
                    match tokio::net::lookup_host((host.as_str(), *port)).await {
                        Ok(addrs) => {
                            resolved.insert(host.clone(), addrs.collect());
                        }
                        Err(e) => tracing::warn!(
                            peer = %t,
                            error = %e,
                            "peer name does not resolve; keeping its previous addresses"
                        ),
                    }
                    want.extend(resolved.get(host).into_iter().flatten().copied());
                }
            }
        }
        {
            let selves = ctx.selves();
            want.retain(|a| !selves.contains(a));
        }
        dialers.retain(|addr, task| {
            let keep = want.contains(addr) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        for addr in want {
            dialers
                .entry(addr)
                .or_insert_with(|| tokio::spawn(dial(Arc::clone(&ctx), addr, rx.clone())));
        }
    }
}

/// Keeps a connection to the peer at `addr` and writes every new report on it.
async fn dial(ctx: Arc<Ctx>, addr: SocketAddr, mut rx: watch::Receiver<Arc<Vec<u8>>>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let started = Instant::now();
        match send_to(&ctx, addr, &mut rx).await {
            Ok(()) => return,
            Err(SessionError::Refused(Refusal::SameReplica)) => {
                tracing::info!(
                    %addr,
                    replica = %ctx.settings.replica,
                    "the peer at this address has this replica's name: taken to be this replica \
                     itself and not dialed again (if it is another process, give each replica its \
                     own --replica-name)"
                );
                ctx.selves().insert(addr);
                return;
            }
            Err(e) => {
                ctx.stats.failed(&e);
                tracing::warn!(%addr, error = %e, "connection to peer replica lost; retrying in {backoff:?}");
            }
        }
        if started.elapsed() > Duration::from_secs(10) {
            backoff = Duration::from_millis(100);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn timed<T>(
    f: impl std::future::Future<Output = std::io::Result<T>>,
) -> Result<T, SessionError> {
    tokio::time::timeout(IO_TIMEOUT, f)
        .await
        .map_err(|_| SessionError::Timeout)?
        .map_err(SessionError::from)
}

async fn read_name(s: &mut TcpStream, what: &'static str) -> Result<String, SessionError> {
    let len = timed(s.read_u16()).await? as usize;
    if len > MAX_NAME {
        return Err(WireError::BadName {
            what,
            reason: "longer than 253 bytes",
        }
        .into());
    }
    let mut buf = vec![0u8; len];
    timed(s.read_exact(&mut buf)).await?;
    Ok(wire::check_name(what, &buf)?)
}

/// One connection to a peer: handshake, then reports until the reporter stops (`Ok`).
async fn send_to(
    ctx: &Ctx,
    addr: SocketAddr,
    rx: &mut watch::Receiver<Arc<Vec<u8>>>,
) -> Result<(), SessionError> {
    let s = &ctx.settings;
    let mut stream = timed(TcpStream::connect(addr)).await?;
    stream.set_nodelay(true)?;
    let mut magic = [0u8; 8];
    timed(stream.read_exact(&mut magic)).await?;
    if &magic != MAGIC {
        return Err(WireError::BadMagic.into());
    }
    let mut server_nonce = [0u8; NONCE_LEN];
    timed(stream.read_exact(&mut server_nonce)).await?;
    let server = read_name(&mut stream, "server replica name").await?;
    if server == s.replica {
        return Err(SessionError::Refused(Refusal::SameReplica));
    }
    let client_nonce = ctx.nonce()?;
    let t = Transcript {
        server_nonce: &server_nonce,
        client_nonce: &client_nonce,
        client: &s.replica,
        pool: &s.pool,
        server: &server,
    };
    let mut hello = Vec::with_capacity(NONCE_LEN + 2 * (2 + MAX_NAME) + MAC_LEN);
    hello.extend_from_slice(&client_nonce);
    wire::put_name(&mut hello, &s.replica);
    wire::put_name(&mut hello, &s.pool);
    hello.extend_from_slice(t.hello_mac(&s.key.0).as_ref());
    timed(stream.write_all(&hello)).await?;
    match timed(stream.read_u8()).await? {
        ACCEPTED => {}
        REFUSED => {
            let code = timed(stream.read_u8()).await.ok();
            return Err(SessionError::RefusedByPeer(
                code.and_then(Refusal::from_code),
            ));
        }
        _ => return Err(WireError::BadMagic.into()),
    }
    let mut mac = [0u8; MAC_LEN];
    timed(stream.read_exact(&mut mac)).await?;
    if !t.verify_accept(&s.key.0, &mac) {
        return Err(SessionError::BadAccept);
    }
    let session = t.session_key(&s.key.0);
    ctx.stats.outbound.inc();
    let _connected = on_drop(|| {
        ctx.stats.outbound.dec();
    });
    tracing::info!(%addr, peer = %server, "connected to peer replica");
    let (mut read, mut write) = stream.into_split();
    let mut frame = Vec::new();
    let mut seq = 0u64;
    let mut byte = [0u8; 2];
    // The newest report at once, then each new one.
    rx.mark_changed();
    loop {
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
            // The server sends nothing after its acceptance but a refusal; a read that returns
            // is the connection ending (or refused), noticed without waiting for a write to fail.
            r = read.read(&mut byte) => {
                return Err(match r {
                    Ok(n) if n >= 1 && byte[0] == REFUSED => {
                        let code = if n == 2 { Some(byte[1]) } else { read.read_u8().await.ok() };
                        SessionError::RefusedByPeer(code.and_then(Refusal::from_code))
                    }
                    Ok(_) => SessionError::Io(std::io::ErrorKind::UnexpectedEof.into()),
                    Err(e) => SessionError::Io(e),
                });
            }
        }
        let payload = Arc::clone(&rx.borrow_and_update());
        wire::encode_frame(&session, seq, &payload, &mut frame);
        timed(write.write_all(&frame)).await?;
        seq += 1;
        ctx.stats.sent.inc();
    }
}

/// Runs `f` when dropped.
fn on_drop(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// Accepts peers' connections.
async fn listen(ctx: Arc<Ctx>, listener: TcpListener) {
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "peer listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if open.load(std::sync::atomic::Ordering::Relaxed) >= MAX_INBOUND {
            tracing::warn!(%from, "peer listener: {MAX_INBOUND} connections open; closing this one");
            continue;
        }
        open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (ctx, open) = (Arc::clone(&ctx), Arc::clone(&open));
        tokio::spawn(async move {
            if let Err(e) = receive_from(&ctx, stream).await {
                ctx.stats.failed(&e);
                tracing::warn!(%from, error = %e, "peer connection closed");
            }
            open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        });
    }
}

/// One peer's connection: handshake, then its reports until it closes.
async fn receive_from(ctx: &Ctx, mut stream: TcpStream) -> Result<(), SessionError> {
    let s = &ctx.settings;
    stream.set_nodelay(true)?;
    let server_nonce = ctx.nonce()?;
    let mut greeting = Vec::with_capacity(8 + NONCE_LEN + 2 + MAX_NAME);
    greeting.extend_from_slice(MAGIC);
    greeting.extend_from_slice(&server_nonce);
    wire::put_name(&mut greeting, &s.replica);
    timed(stream.write_all(&greeting)).await?;
    let mut client_nonce = [0u8; NONCE_LEN];
    // A connection closed before its hello is no peer's failure: a TCP probe, or a replica that
    // found itself at this address (it reads the greeting's name and leaves).
    let first = timed(stream.read(&mut client_nonce)).await?;
    if first == 0 {
        return Ok(());
    }
    timed(stream.read_exact(&mut client_nonce[first..])).await?;
    let client = read_name(&mut stream, "client replica name").await?;
    let pool = read_name(&mut stream, "pool name").await?;
    let mut mac = [0u8; MAC_LEN];
    timed(stream.read_exact(&mut mac)).await?;
    let t = Transcript {
        server_nonce: &server_nonce,
        client_nonce: &client_nonce,
        client: &client,
        pool: &pool,
        server: &s.replica,
    };
    let refusal = if !t.verify_hello(&s.key.0, &mac) {
        Some(Refusal::BadMac)
    } else if pool != s.pool {
        Some(Refusal::OtherPool)
    } else if client == s.replica {
        Some(Refusal::SameReplica)
    } else {
        None
    };
    if let Some(r) = refusal {
        // Best effort: the refusal is for the client's logs.
        let _ = timed(stream.write_all(&[REFUSED, r.code()])).await;
        return Err(SessionError::Refused(r));
    }
    let mut accept = Vec::with_capacity(1 + MAC_LEN);
    accept.push(ACCEPTED);
    accept.extend_from_slice(t.accept_mac(&s.key.0).as_ref());
    timed(stream.write_all(&accept)).await?;
    let session = t.session_key(&s.key.0);
    ctx.stats.inbound.inc();
    let _connected = on_drop(|| {
        ctx.stats.inbound.dec();
    });
    tracing::info!(peer = %client, "peer replica connected");
    // A peer sends at least every keepalive; a connection silent for the expiry is dead.
    let idle = s.expire_after.max(IO_TIMEOUT);
    let mut payload = Vec::new();
    let mut tag = [0u8; MAC_LEN];
    let mut seq = 0u64;
    loop {
        let mut header = [0u8; 4];
        match tokio::time::timeout(idle, stream.read_exact(&mut header)).await {
            Err(_) => return Err(SessionError::Timeout),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                tracing::info!(peer = %client, "peer replica disconnected");
                return Ok(());
            }
            Ok(r) => r?,
        };
        let len = wire::frame_len(header)?;
        payload.resize(len, 0);
        timed(stream.read_exact(&mut payload)).await?;
        timed(stream.read_exact(&mut tag)).await?;
        wire::verify_frame(&session, seq, &payload, &tag)?;
        seq += 1;
        let report = Report::decode(&payload)?;
        let now = ctx.pool.clock().now();
        let applied = ctx.pool.with_scheduler(|sch| {
            sch.apply_peer_loads(&client, &report.loads, now)
                .map(|()| sch.learn_from_peer(&report.samples))
        });
        if applied.is_err() {
            let _ = timed(stream.write_all(&[REFUSED, Refusal::TooManyPeers.code()])).await;
            return Err(SessionError::Refused(Refusal::TooManyPeers));
        }
        ctx.stats.received.inc();
        // Lower peer load may leave room for a queued request.
        ctx.pool.shared.changes.signal();
    }
}
