//! Precise prefix routing: the request tokenized with the model's own tokenizer and matched
//! against what each pod's engine says it holds ([`infergate_kvevents`]).
//!
//! A pool with precise routing on subscribes to every endpoint's KV-event feed (the engine's
//! host, the configured port) and follows the pool's membership. Per request, a chat or
//! completions prompt is tokenized the way vLLM tokenizes it (chat template applied, see
//! [`infergate_tokenizer`]) and its blocks are looked up: the scheduler gets the exact cached
//! tokens of every pod whose feed is in sequence ([`RequestContext::with_cached`]) and the
//! exact prompt length. Anything it cannot tokenize (another API, a batch of prompts, token ids,
//! no chat template) keeps the approximate prefix index, as do pods whose feed is down.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use infergate_kvevents::{Feed, KvEvents, MatchScratch, SubscriberConfig};
use infergate_openai::{ApiKind, ParsedRequest};
use infergate_scheduler::{EndpointMeta, RequestContext};
use infergate_tokenizer::{ChatRequest, ModelTokenizer, Options};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

/// An endpoint label (or pod label) naming the port its engine publishes KV events on, when it
/// differs from the configured one (several engines on one host).
pub const EVENTS_PORT_LABEL: &str = "infergate.io/kv-events-port";

/// An endpoint label naming its engine's KV-event replay port.
pub const REPLAY_PORT_LABEL: &str = "infergate.io/kv-events-replay-port";

/// Refuses a [`EVENTS_PORT_LABEL`] or [`REPLAY_PORT_LABEL`] in an endpoint's configured
/// `labels` that is not a port (1 to 65535), saying which: read only at the pick, such a value
/// is a warning and the pod follows the configured port — with several engines on one host,
/// another engine's feed. For configuration files (the gateway's, the picker's endpoints file),
/// where a mistake can be refused at load; a pod's own label may be anything.
pub fn check_port_labels(
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<(), &'static str> {
    for (label, reason) in [
        (
            EVENTS_PORT_LABEL,
            "label infergate.io/kv-events-port must be a port, 1 to 65535",
        ),
        (
            REPLAY_PORT_LABEL,
            "label infergate.io/kv-events-replay-port must be a port, 1 to 65535",
        ),
    ] {
        if labels
            .get(label)
            .is_some_and(|v| !matches!(v.parse::<u16>(), Ok(p) if p > 0))
        {
            return Err(reason);
        }
    }
    Ok(())
}

/// Precise prefix routing settings (`precisePrefix` in the gateway's pool, the picker's
/// `--tokenizer` and `--kv-events-*` flags).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PreciseConfig {
    /// The model's tokenizer directory (`tokenizer.json`, `tokenizer_config.json`, optionally
    /// `chat_template.jinja`), e.g. a mounted ConfigMap.
    pub tokenizer: PathBuf,
    /// The engines' KV-event `PUB` port (vLLM `--kv-events-config` `endpoint`).
    #[serde(default = "default_events_port")]
    pub events_port: u16,
    /// The engines' replay port (`replay_endpoint`), when they serve one.
    #[serde(default)]
    pub replay_port: Option<u16>,
    /// The topic subscribed to (vLLM's `topic`; empty: all).
    #[serde(default)]
    pub topic: String,
    /// The index's memory bound in bytes, shared by the pods.
    #[serde(default = "default_budget")]
    pub byte_budget: u64,
    /// Longer request bodies are not tokenized (the approximate match stands): tokenizing
    /// costs about 1 ms of the picker's core per 1,000 tokens (docs/precise-prefix.md).
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
}

fn default_max_body() -> usize {
    64 << 10
}

impl PreciseConfig {
    /// The defaults (port 5557, no replay, every topic, 256 MiB) with the tokenizer at `dir`.
    pub fn new(tokenizer: PathBuf) -> Self {
        PreciseConfig {
            tokenizer,
            events_port: default_events_port(),
            replay_port: None,
            topic: String::new(),
            byte_budget: default_budget(),
            max_body_bytes: default_max_body(),
        }
    }
}

fn default_events_port() -> u16 {
    5557
}

fn default_budget() -> u64 {
    256 << 20
}

/// Why precise routing could not start.
#[derive(Debug, thiserror::Error)]
pub enum PreciseError {
    /// The tokenizer did not load.
    #[error("precise prefix routing: tokenizer {dir}")]
    Tokenizer {
        /// The directory given.
        dir: PathBuf,
        /// What failed.
        source: Box<infergate_tokenizer::Error>,
    },
    /// A port of 0.
    #[error("precise prefix routing: {0} must be a port between 1 and 65535")]
    Port(&'static str),
    /// The replay port is the events port.
    #[error(
        "precise prefix routing: the replay port {0} (replayPort, --kv-events-replay-port) is the \
         events port too: the engine's publisher (PUB) and replay (ROUTER) sockets each need a \
         port of their own"
    )]
    SamePort(u16),
    /// A size outside what the index or the tokenizer can work with.
    #[error(
        "precise prefix routing: {field} must be between {min} and {max} bytes, not {value}{why}"
    )]
    Size {
        /// The field (`byteBudget`, `maxBodyBytes`).
        field: &'static str,
        /// The value given.
        value: u64,
        /// The smallest accepted.
        min: u64,
        /// The largest accepted.
        max: u64,
        /// What a value out of range would do.
        why: &'static str,
    },
}

/// The range of [`PreciseConfig::byte_budget`] (the CRD's `byteBudget`): 1 MiB to 64 GiB.
pub const BYTE_BUDGET_RANGE: (u64, u64) = (1 << 20, 64 << 30);

/// The range of [`PreciseConfig::max_body_bytes`] (the CRD's `maxBodyBytes`): 1 KiB to 256 MiB.
pub const MAX_BODY_BYTES_RANGE: (u64, u64) = (1 << 10, 256 << 20);

impl PreciseConfig {
    /// Checks the ports and sizes, with the bounds the CRD declares for the same fields.
    pub fn validate(&self) -> Result<(), PreciseError> {
        if self.events_port == 0 {
            return Err(PreciseError::Port("eventsPort"));
        }
        if self.replay_port == Some(0) {
            return Err(PreciseError::Port("replayPort"));
        }
        if self.replay_port == Some(self.events_port) {
            return Err(PreciseError::SamePort(self.events_port));
        }
        size_in(
            "byteBudget",
            self.byte_budget,
            BYTE_BUDGET_RANGE,
            ": a smaller index holds too few blocks to match a prompt",
        )?;
        let body = u64::try_from(self.max_body_bytes).unwrap_or(u64::MAX);
        size_in(
            "maxBodyBytes",
            body,
            MAX_BODY_BYTES_RANGE,
            ": a smaller bound leaves every request on the approximate match",
        )
    }
}

fn size_in(
    field: &'static str,
    value: u64,
    (min, max): (u64, u64),
    why: &'static str,
) -> Result<(), PreciseError> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    let why = if value < min { why } else { "" };
    Err(PreciseError::Size {
        field,
        value,
        min,
        max,
        why,
    })
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// Tokenizing and matching one request.
struct Stats {
    seconds: Histogram,
    requests: Family<OutcomeLabels, Counter>,
}

/// A pool's precise prefix routing: the tokenizer and the KV-event index.
pub struct Precise {
    tokenizer: Arc<ModelTokenizer>,
    max_body_bytes: usize,
    events: KvEvents,
    stats: Stats,
}

impl std::fmt::Debug for Precise {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Precise")
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

thread_local! {
    static SCRATCH: RefCell<(Vec<u32>, MatchScratch)> = RefCell::new((Vec::new(), MatchScratch::default()));
}

impl Precise {
    /// Loads the tokenizer and prepares the index (no subscription until endpoints are set).
    pub fn new(cfg: &PreciseConfig, registry: Option<&mut Registry>) -> Result<Self, PreciseError> {
        cfg.validate()?;
        let tokenizer =
            ModelTokenizer::from_dir(&cfg.tokenizer, Options::default()).map_err(|source| {
                PreciseError::Tokenizer {
                    dir: cfg.tokenizer.clone(),
                    source: Box::new(source),
                }
            })?;
        let events = KvEvents::new(SubscriberConfig {
            port: cfg.events_port,
            replay_port: cfg.replay_port,
            topic: cfg.topic.clone(),
            budget_bytes: cfg.byte_budget,
            ..Default::default()
        });
        let stats = Stats {
            // 10 µs to ~80 ms: a 2,000-token prompt tokenizes in well under a millisecond.
            seconds: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                1e-5, 2.0, 14,
            )),
            requests: Family::default(),
        };
        if let Some(r) = registry {
            events.register(r);
            r.register(
                "infergate_precise_prefix_duration_seconds",
                "Time to tokenize a request and match it against the KV-event index",
                stats.seconds.clone(),
            );
            r.register(
                "infergate_precise_prefix_requests",
                "Requests by how their prefix was matched (exact; or approximate, and why: unsupported, too-long, tokenize-error, no-feed)",
                stats.requests.clone(),
            );
        }
        Ok(Precise {
            tokenizer: Arc::new(tokenizer),
            max_body_bytes: cfg.max_body_bytes,
            events,
            stats,
        })
    }

    /// The KV-event index and its subscribers.
    pub fn events(&self) -> &KvEvents {
        &self.events
    }

    /// Follows the pool's membership: each endpoint's feed is on its host at the configured
    /// ports, or at the ports its labels [`EVENTS_PORT_LABEL`] / [`REPLAY_PORT_LABEL`] name.
    pub(crate) fn set_endpoints<'a>(&self, endpoints: impl Iterator<Item = &'a EndpointMeta>) {
        let port = |m: &EndpointMeta, key: &str| {
            let v = m.labels.get(key)?;
            match v.parse::<u16>() {
                Ok(p) if p > 0 => Some(p),
                _ => {
                    tracing::warn!(endpoint = %m.addr, label = key, value = %v,
                        "precise prefix: label is not a port; the configured port is used");
                    None
                }
            }
        };
        let feeds: Vec<(SocketAddr, Feed)> = endpoints
            .map(|m| {
                let f = self.events.feed_of(
                    m.addr,
                    port(m, EVENTS_PORT_LABEL),
                    port(m, REPLAY_PORT_LABEL),
                );
                (m.addr, f)
            })
            .collect();
        self.events.sync_feeds(&feeds);
    }

    fn count(&self, outcome: &'static str) {
        self.stats
            .requests
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Tokenizes the request in `body` (already parsed as `parsed`) and fills `cached` with each
    /// in-sequence pod's cached prompt tokens; returns the prompt's token count, or `None` when
    /// the request keeps the approximate match.
    pub fn lookup(
        &self,
        parsed: &ParsedRequest<'_>,
        body: &[u8],
        lora: Option<&str>,
        cached: &mut Vec<(SocketAddr, u32)>,
    ) -> Option<u32> {
        if body.len() > self.max_body_bytes {
            self.count("too-long");
            return None;
        }
        // Every feed down (or none yet): the tokenizer's cost would buy nothing.
        if self.events.pods_in_sequence() == 0 {
            self.count("no-feed");
            return None;
        }
        let started = Instant::now();
        let r = SCRATCH.with(|s| {
            let (tokens, scratch) = &mut *s.borrow_mut();
            let encoded = match parsed.kind {
                ApiKind::Completions if parsed.prompt_token_ids == 0 && parsed.prompt.len() == 1 => {
                    self.tokenizer.encode_completion(&parsed.prompt[0], true, tokens)
                }
                ApiKind::ChatCompletions if self.tokenizer.has_chat_template() => {
                    ChatRequest::from_json(body).and_then(|c| self.tokenizer.encode_chat(&c, tokens))
                }
                _ => {
                    self.count("unsupported");
                    return None;
                }
            };
            if let Err(e) = encoded {
                tracing::debug!(error = %e, "precise prefix: request not tokenized; approximate match");
                self.count("tokenize-error");
                return None;
            }
            // vLLM keys a salted request's blocks by its salt: it is matched against those only.
            // (A salt that is not a string was refused by the parse, as vLLM refuses it.)
            self.events
                .match_tokens(lora, parsed.cache_salt.as_deref(), tokens, scratch, cached);
            if cached.is_empty() {
                self.count("no-feed");
                return None;
            }
            self.count("exact");
            Some(u32::try_from(tokens.len()).unwrap_or(u32::MAX))
        });
        self.stats.seconds.observe(started.elapsed().as_secs_f64());
        r
    }
}

/// `cx` with the exact matches of precise routing, when the pool has it and the request can be
/// tokenized (`cached` holds them for the pick).
pub fn refine<'a>(
    cx: RequestContext<'a>,
    precise: Option<&Precise>,
    parsed: &ParsedRequest<'_>,
    body: &[u8],
    cached: &'a mut Vec<(SocketAddr, u32)>,
) -> RequestContext<'a> {
    let Some(p) = precise else {
        return cx;
    };
    match p.lookup(parsed, body, cx.lora_adapter, cached) {
        Some(tokens) => {
            let mut cx = cx.with_cached(Some(cached.as_slice()));
            cx.prompt_tokens = tokens.max(1);
            cx
        }
        None => cx,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_port_that_is_the_events_port_is_refused() {
        let mut cfg = PreciseConfig::new(PathBuf::from("/t"));
        cfg.replay_port = Some(5558);
        assert!(cfg.validate().is_ok());
        cfg.replay_port = Some(cfg.events_port);
        let e = cfg.validate().map_err(|e| e.to_string());
        assert_eq!(
            e,
            Err("precise prefix routing: the replay port 5557 (replayPort, \
                 --kv-events-replay-port) is the events port too: the engine's publisher (PUB) \
                 and replay (ROUTER) sockets each need a port of their own"
                .to_owned())
        );
    }
}
