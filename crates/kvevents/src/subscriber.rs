//! One subscriber per pod: connects to the engine's event publisher, keeps the batches in
//! sequence, and applies them to the shared [`KvIndex`].
//!
//! Sequence numbers (8-byte big-endian, one per batch) are checked: a gap is filled from the
//! engine's replay socket when it serves one, otherwise the pod's entries are dropped (events
//! were missed, so nothing known of its cache can be trusted). The same happens on a reconnect
//! (replay from the last batch seen, or a reset), on an engine restart (the sequence starts over,
//! or a reconnect's replay does not reach the last batch seen) and on a payload that does not
//! decode. While a pod's feed is down or catching up its match is not listed, so the
//! approximate prefix index stands in for it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;

use crate::error::ZmtpError;
use crate::event::{Batch, decode_batch};
use crate::index::{Applied, KvIndex, MatchScratch};
use crate::publish::END_SEQ;
use crate::zmtp::{self, Limits, SocketType};

/// Where and how to subscribe.
#[derive(Clone, Debug)]
pub struct SubscriberConfig {
    /// The engines' `PUB` port (vLLM's `--kv-events-config` `endpoint`, default `tcp://*:5557`).
    pub port: u16,
    /// The engines' replay (`ROUTER`) port, when they serve one (`replay_endpoint`).
    pub replay_port: Option<u16>,
    /// The topic subscribed to (a prefix; vLLM's default is empty: everything).
    pub topic: String,
    /// The index's byte budget, shared evenly by the pods.
    pub budget_bytes: u64,
    /// Frame and handshake limits.
    pub limits: Limits,
    /// First delay before reconnecting; doubled per failure up to `reconnect_max`.
    pub reconnect_min: Duration,
    /// Longest delay between reconnects.
    pub reconnect_max: Duration,
    /// How long a replay may take before it is abandoned (and the pod reset).
    pub replay_timeout: Duration,
}

impl Default for SubscriberConfig {
    fn default() -> Self {
        SubscriberConfig {
            port: 5557,
            replay_port: None,
            topic: String::new(),
            budget_bytes: 256 << 20,
            limits: Limits::default(),
            reconnect_min: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(5),
            replay_timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// The subscriber's series (`infergate_kv_events_*`, `infergate_kv_index_*`).
#[derive(Clone)]
struct Stats {
    batches: Counter,
    lag: Histogram,
    blocks: Family<KindLabels, Counter>,
    gaps: Counter,
    replays: Family<OutcomeLabels, Counter>,
    resets: Family<ReasonLabels, Counter>,
    decode_errors: Counter,
    other_topic: Counter,
    unknown: Counter,
    connect_failures: Counter,
    connected: Gauge,
    index_blocks: Gauge,
    index_entries: Gauge,
    index_bytes: Gauge,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            batches: Counter::default(),
            // 1 ms to ~33 s.
            lag: Histogram::new(exponential_buckets(1e-3, 2.0, 16)),
            blocks: Family::default(),
            gaps: Counter::default(),
            replays: Family::default(),
            resets: Family::default(),
            decode_errors: Counter::default(),
            other_topic: Counter::default(),
            unknown: Counter::default(),
            connect_failures: Counter::default(),
            connected: Gauge::default(),
            index_blocks: Gauge::default(),
            index_entries: Gauge::default(),
            index_bytes: Gauge::default(),
        }
    }
}

impl Stats {
    fn register(&self, r: &mut Registry) {
        r.register(
            "infergate_kv_events_batches",
            "KV-event batches applied",
            self.batches.clone(),
        );
        r.register(
            "infergate_kv_events_lag_seconds",
            "From a live batch's engine timestamp to its being applied (the clocks' skew included)",
            self.lag.clone(),
        );
        r.register(
            "infergate_kv_events_blocks",
            "Blocks by what the events did (stored, removed, unmatchable, over-budget, ignored: another medium or group) and AllBlocksCleared events (cleared)",
            self.blocks.clone(),
        );
        r.register(
            "infergate_kv_events_gaps",
            "Sequence gaps seen in a pod's event stream",
            self.gaps.clone(),
        );
        r.register(
            "infergate_kv_events_replays",
            "Replays requested from an engine's replay socket, by outcome",
            self.replays.clone(),
        );
        r.register(
            "infergate_kv_events_resets",
            "A pod's entries dropped, by reason (gap, reconnect, restart, decode-error, topic, cleared, removed)",
            self.resets.clone(),
        );
        r.register(
            "infergate_kv_events_decode_errors",
            "Event payloads or messages that did not decode",
            self.decode_errors.clone(),
        );
        r.register(
            "infergate_kv_events_other_topic",
            "Messages on another topic than the one subscribed to (the pod's feed is not used until it reconnects)",
            self.other_topic.clone(),
        );
        r.register(
            "infergate_kv_events_unknown",
            "Events of an unknown type, skipped",
            self.unknown.clone(),
        );
        r.register(
            "infergate_kv_events_connect_failures",
            "Connections to an engine's event publisher that failed or ended",
            self.connect_failures.clone(),
        );
        r.register(
            "infergate_kv_events_connected_pods",
            "Pods whose event feed is connected and in sequence",
            self.connected.clone(),
        );
        r.register(
            "infergate_kv_index_blocks",
            "Distinct token blocks the precise index holds",
            self.index_blocks.clone(),
        );
        r.register(
            "infergate_kv_index_entries",
            "(pod, block) entries in the precise index",
            self.index_entries.clone(),
        );
        r.register(
            "infergate_kv_index_bytes",
            "Estimated bytes of the precise index",
            self.index_bytes.clone(),
        );
    }

    fn applied(&self, a: &Applied) {
        for (kind, n) in [
            ("stored", a.stored),
            ("removed", a.removed),
            ("unmatchable", a.unmatchable),
            ("over-budget", a.over_budget),
            ("ignored", a.ignored),
            ("cleared", a.cleared),
        ] {
            if n > 0 {
                self.blocks.get_or_create(&KindLabels { kind }).inc_by(n);
            }
        }
        if a.cleared > 0 {
            self.resets
                .get_or_create(&ReasonLabels { reason: "cleared" })
                .inc_by(a.cleared);
        }
    }

    fn reset(&self, reason: &'static str) {
        self.resets.get_or_create(&ReasonLabels { reason }).inc();
    }
}

struct Inner {
    cfg: SubscriberConfig,
    index: RwLock<KvIndex>,
    stats: Stats,
}

impl Inner {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, KvIndex> {
        self.index.write().unwrap_or_else(|p| p.into_inner())
    }

    fn publish_stats(&self, ix: &KvIndex) {
        let s = ix.stats();
        self.stats.index_blocks.set(s.blocks as i64);
        self.stats.index_entries.set(s.entries as i64);
        self.stats.index_bytes.set(s.bytes as i64);
        self.stats.connected.set(s.synced_pods as i64);
    }

    /// Applies a batch; `live` when it came from the `PUB` socket (a replayed batch is old by
    /// design, so only live ones measure the lag).
    fn apply(&self, pod: SocketAddr, batch: &Batch, live: bool) {
        let mut ix = self.write();
        let a = ix.apply(pod, batch);
        self.publish_stats(&ix);
        drop(ix);
        self.stats.batches.inc();
        if live
            && batch.ts.is_finite()
            && batch.ts > 0.0
            && let Ok(now) = SystemTime::now().duration_since(UNIX_EPOCH)
        {
            self.stats
                .lag
                .observe((now.as_secs_f64() - batch.ts).max(0.0));
        }
        self.stats.applied(&a);
        if batch.unknown_events > 0 {
            self.stats.unknown.inc_by(u64::from(batch.unknown_events));
        }
    }

    fn reset(&self, pod: SocketAddr, reason: &'static str) {
        let mut ix = self.write();
        ix.reset_pod(pod);
        self.publish_stats(&ix);
        drop(ix);
        self.stats.reset(reason);
        // A gap or a restart loses what a pod held without anything else saying so.
        if matches!(reason, "gap" | "restart") {
            tracing::info!(%pod, reason, "kv-events: pod's cache entries dropped");
        } else {
            tracing::debug!(%pod, reason, "kv-events: pod's cache entries dropped");
        }
    }

    fn set_synced(&self, pod: SocketAddr, synced: bool) {
        let mut ix = self.write();
        ix.set_synced(pod, synced);
        self.publish_stats(&ix);
    }
}

/// Where one pod's engine publishes its events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feed {
    /// The `PUB` socket.
    pub events: SocketAddr,
    /// The replay (`ROUTER`) socket, when served.
    pub replay: Option<SocketAddr>,
}

/// The precise prefix index and the subscribers that keep it.
pub struct KvEvents {
    inner: Arc<Inner>,
    /// Per pod: its subscriber and where it subscribes (publisher, replay).
    tasks: Mutex<HashMap<SocketAddr, (JoinHandle<()>, Feed)>>,
}

impl std::fmt::Debug for KvEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvEvents")
            .field("cfg", &self.inner.cfg)
            .finish_non_exhaustive()
    }
}

impl Drop for KvEvents {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, (t, _)) in tasks.drain() {
            t.abort();
        }
    }
}

impl KvEvents {
    /// An index with no pod yet.
    pub fn new(cfg: SubscriberConfig) -> Self {
        KvEvents {
            inner: Arc::new(Inner {
                index: RwLock::new(KvIndex::new(cfg.budget_bytes)),
                cfg,
                stats: Stats::default(),
            }),
            tasks: Mutex::new(HashMap::new()),
        }
    }

    /// Registers the `infergate_kv_events_*` and `infergate_kv_index_*` series.
    pub fn register(&self, registry: &mut Registry) {
        self.inner.stats.register(registry);
    }

    /// The configuration in force.
    pub fn config(&self) -> &SubscriberConfig {
        &self.inner.cfg
    }

    /// Subscribes to the engine serving at `pod` (its events on the same host, at the
    /// configured ports). Must run inside a tokio runtime. Does nothing for a known pod.
    pub fn add_pod(&self, pod: SocketAddr) {
        let f = self.feed_of(pod, None, None);
        self.add_pod_at(pod, f.events, f.replay);
    }

    /// Subscribes to the engine serving at `pod` whose publisher is at `events` (and replay
    /// socket at `replay`).
    /// A pod already subscribed at another address is subscribed afresh.
    pub fn add_pod_at(&self, pod: SocketAddr, events: SocketAddr, replay: Option<SocketAddr>) {
        let feed = Feed { events, replay };
        let known = self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&pod)
            .map(|(_, f)| *f);
        match known {
            Some(f) if f == feed => return,
            Some(_) => self.remove_pod(pod),
            None => {}
        }
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        self.inner.write().pod(pod);
        let inner = self.inner.clone();
        let task = tokio::spawn(run_pod(inner, pod, events, replay));
        tasks.insert(pod, (task, feed));
    }

    /// The feed address of `pod` served at `pod`, with per-pod port overrides.
    pub fn feed_of(&self, pod: SocketAddr, port: Option<u16>, replay_port: Option<u16>) -> Feed {
        let cfg = &self.inner.cfg;
        Feed {
            events: SocketAddr::new(pod.ip(), port.unwrap_or(cfg.port)),
            replay: replay_port
                .or(cfg.replay_port)
                .map(|p| SocketAddr::new(pod.ip(), p)),
        }
    }

    /// Stops subscribing to `pod` and forgets its blocks.
    pub fn remove_pod(&self, pod: SocketAddr) {
        let task = self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&pod);
        if let Some((t, _)) = task {
            t.abort();
            let mut ix = self.inner.write();
            ix.remove_pod(pod);
            self.inner.publish_stats(&ix);
            drop(ix);
            self.inner.stats.reset("removed");
        }
    }

    /// Makes the subscribed pods exactly `pods`, each at the configured ports.
    pub fn sync_pods(&self, pods: &[SocketAddr]) {
        let feeds: Vec<(SocketAddr, Feed)> = pods
            .iter()
            .map(|p| (*p, self.feed_of(*p, None, None)))
            .collect();
        self.sync_feeds(&feeds);
    }

    /// Makes the subscribed pods exactly `pods`, each at its feed.
    pub fn sync_feeds(&self, pods: &[(SocketAddr, Feed)]) {
        let stale: Vec<SocketAddr> = self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|p| !pods.iter().any(|(q, _)| q == *p))
            .copied()
            .collect();
        for p in stale {
            self.remove_pod(p);
        }
        for (p, f) in pods {
            self.add_pod_at(*p, f.events, f.replay);
        }
    }

    /// The request's cached prompt tokens per in-sequence pod (see [`KvIndex::match_tokens`]).
    pub fn match_tokens(
        &self,
        lora: Option<&str>,
        salt: Option<&str>,
        tokens: &[u32],
        scratch: &mut MatchScratch,
        out: &mut Vec<(SocketAddr, u32)>,
    ) {
        self.index().match_tokens(lora, salt, tokens, scratch, out);
    }

    /// Pods whose feed is connected and in sequence, read without the index's lock: with none,
    /// a request need not be tokenized at all.
    pub fn pods_in_sequence(&self) -> usize {
        usize::try_from(self.inner.stats.connected.get()).unwrap_or(0)
    }

    /// The index, for reading.
    pub fn index(&self) -> RwLockReadGuard<'_, KvIndex> {
        self.inner.index.read().unwrap_or_else(|p| p.into_inner())
    }
}

async fn run_pod(
    inner: Arc<Inner>,
    pod: SocketAddr,
    events: SocketAddr,
    replay: Option<SocketAddr>,
) {
    let mut last: Option<u64> = None;
    let mut backoff = inner.cfg.reconnect_min;
    // The first failure after a start or a connection that reached sequence is a warning; the
    // retries that follow it are not.
    let mut warned = false;
    loop {
        let started = tokio::time::Instant::now();
        let mut in_sequence = false;
        let err = session(&inner, pod, events, replay, &mut last, &mut in_sequence).await;
        inner.set_synced(pod, false);
        inner.stats.connect_failures.inc();
        if in_sequence {
            warned = false;
        }
        if warned {
            tracing::debug!(%pod, %events, error = %err, "kv-events: feed still down");
        } else {
            tracing::warn!(%pod, %events, error = %err,
                "kv-events: feed down; the approximate index stands in until it is back");
            warned = true;
        }
        if started.elapsed() > inner.cfg.reconnect_max {
            backoff = inner.cfg.reconnect_min;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(inner.cfg.reconnect_max);
    }
}

/// One connection's life; returns why it ended.
async fn session(
    inner: &Inner,
    pod: SocketAddr,
    events: SocketAddr,
    replay: Option<SocketAddr>,
    last: &mut Option<u64>,
    in_sequence: &mut bool,
) -> ZmtpError {
    let cfg = &inner.cfg;
    let mut conn = match zmtp::connect(&events.to_string(), SocketType::Sub, cfg.limits).await {
        Ok(c) => c,
        Err(e) => return e,
    };
    // Everything is subscribed to and the topic checked here: a publisher on another topic
    // would otherwise be a silent feed, in sequence, whose replay (which knows no topics) had
    // filled the index with blocks no later event corrects.
    if let Err(e) = conn.subscribe(b"").await {
        return e;
    }
    let mut other_topic = false;
    // Catch up: replay what was missed (everything buffered on a first connect), or start over.
    let mut replayed_from: Option<u64> = None;
    match (replay, *last) {
        (Some(r), Some(l)) => {
            // Ask from the last batch applied, not the one after: an engine that kept running
            // still holds it and sends it again (skipped); one whose buffer holds nothing that
            // recent restarted, with an empty cache, while the feed was down.
            replayed_from = Some(l);
            if let Replayed::Newest(newest) = catch_up(inner, pod, r, l, last).await
                && newest.is_none_or(|n| n < l)
            {
                inner.reset(pod, "restart");
                *last = None;
                catch_up(inner, pod, r, 0, last).await;
                replayed_from = Some(0);
            }
        }
        (Some(r), None) => {
            catch_up(inner, pod, r, 0, last).await;
            replayed_from = Some(0);
        }
        (None, _) => {
            if last.take().is_some() {
                inner.reset(pod, "reconnect");
            }
        }
    }
    inner.set_synced(pod, true);
    *in_sequence = true;
    tracing::info!(%pod, %events, last_seq = ?*last, "kv-events: feed connected and in sequence");
    let mut frames: Vec<Bytes> = Vec::with_capacity(3);
    loop {
        if let Err(e) = conn.recv(&mut frames).await {
            return e;
        }
        let Some(seq) = message_seq(&frames) else {
            inner.stats.decode_errors.inc();
            continue;
        };
        if !frames[0].starts_with(cfg.topic.as_bytes()) {
            inner.stats.other_topic.inc();
            if !other_topic {
                other_topic = true;
                tracing::warn!(%pod, %events, topic = ?String::from_utf8_lossy(&frames[0]),
                    subscribed = ?cfg.topic,
                    "kv-events: the publisher sends another topic; the feed is not used");
                inner.set_synced(pod, false);
                inner.reset(pod, "topic");
                *last = None;
            }
            continue;
        }
        if other_topic {
            continue; // a feed of mixed topics stays unused until it reconnects
        }
        if let Some(l) = *last {
            if seq <= l {
                if replayed_from.is_some_and(|f| seq >= f) {
                    continue; // already applied by the replay
                }
                // The sequence started over: the engine restarted with an empty cache.
                inner.reset(pod, "restart");
                *last = None;
            } else if seq > l + 1 {
                inner.stats.gaps.inc();
                match replay {
                    Some(r) => {
                        catch_up(inner, pod, r, l + 1, last).await;
                        replayed_from = Some(l + 1);
                        if last.is_some_and(|l| seq <= l) {
                            continue;
                        }
                        if last.is_some_and(|l| seq > l + 1) {
                            inner.reset(pod, "gap");
                        }
                    }
                    None => inner.reset(pod, "gap"),
                }
            }
        }
        apply_payload(inner, pod, seq, &frames[2], last, true);
    }
}

/// The sequence number of a `[topic, seq, payload]` message.
fn message_seq(frames: &[Bytes]) -> Option<u64> {
    if frames.len() != 3 {
        return None;
    }
    let b: [u8; 8] = frames[1][..].try_into().ok()?;
    Some(u64::from_be_bytes(b))
}

fn apply_payload(
    inner: &Inner,
    pod: SocketAddr,
    seq: u64,
    payload: &[u8],
    last: &mut Option<u64>,
    live: bool,
) {
    match decode_batch(payload) {
        Ok(batch) => inner.apply(pod, &batch, live),
        Err(e) => {
            // The batch may have removed blocks: nothing of this pod can be trusted now.
            inner.stats.decode_errors.inc();
            tracing::warn!(%pod, seq, error = %e, "kv-events: batch did not decode; pod reset");
            inner.reset(pod, "decode-error");
        }
    }
    *last = Some(seq);
}

/// How a replay ended.
enum Replayed {
    /// It failed or timed out; the pod was reset.
    Failed,
    /// It ended; the newest sequence number the engine sent, if it sent any batch.
    Newest(Option<u64>),
}

/// Requests a replay from `from` and applies it; on failure the pod is reset.
async fn catch_up(
    inner: &Inner,
    pod: SocketAddr,
    replay: SocketAddr,
    from: u64,
    last: &mut Option<u64>,
) -> Replayed {
    let timeout = inner.cfg.replay_timeout;
    let r = tokio::time::timeout(timeout, replay_into(inner, pod, replay, from, last)).await;
    let (outcome, replayed) = match r {
        Ok(Ok(newest)) => ("ok", Replayed::Newest(newest)),
        Ok(Err(e)) => {
            tracing::warn!(%pod, %replay, from, error = %e,
                "kv-events: replay failed; the pod's entries are dropped");
            ("failed", Replayed::Failed)
        }
        Err(_) => {
            tracing::warn!(%pod, %replay, from, timeout_ms = timeout.as_millis() as u64,
                "kv-events: replay timed out; the pod's entries are dropped");
            ("timeout", Replayed::Failed)
        }
    };
    inner
        .stats
        .replays
        .get_or_create(&OutcomeLabels { outcome })
        .inc();
    if outcome != "ok" {
        inner.reset(pod, "gap");
        *last = None;
    }
    replayed
}

async fn replay_into(
    inner: &Inner,
    pod: SocketAddr,
    replay: SocketAddr,
    from: u64,
    last: &mut Option<u64>,
) -> Result<Option<u64>, ZmtpError> {
    let mut conn = zmtp::connect(&replay.to_string(), SocketType::Dealer, inner.cfg.limits).await?;
    conn.send(&[b"", &from.to_be_bytes()]).await?;
    let mut frames: Vec<Bytes> = Vec::with_capacity(4);
    let mut newest: Option<u64> = None;
    loop {
        conn.recv(&mut frames).await?;
        let Some((seq, payload)) = replay_message(&frames) else {
            inner.stats.decode_errors.inc();
            continue;
        };
        if seq == END_SEQ {
            return Ok(newest);
        }
        newest = newest.max(Some(seq));
        if last.is_some_and(|l| seq <= l) {
            continue;
        }
        if let Some(l) = *last
            && seq > l + 1
        {
            // The replay buffer no longer holds what was missed.
            inner.stats.gaps.inc();
            inner.reset(pod, "gap");
        }
        apply_payload(inner, pod, seq, payload, last, false);
    }
}

/// The sequence number and payload of a replayed batch. vLLM's `ROUTER` answers
/// `[empty delimiter, seq, payload]` (no topic; the end marker is `[empty, -1, empty]`); a
/// `[empty, topic, seq, payload]` message, as a publisher that copies its `PUB` frames would
/// send, is read too.
fn replay_message(frames: &[Bytes]) -> Option<(u64, &[u8])> {
    let body = match frames.split_first() {
        Some((d, rest)) if d.is_empty() => rest,
        _ => frames,
    };
    let (seq, payload) = match body {
        [seq, payload] | [_, seq, payload] => (seq, payload),
        _ => return None,
    };
    let b: [u8; 8] = seq[..].try_into().ok()?;
    Some((u64::from_be_bytes(b), &payload[..]))
}
