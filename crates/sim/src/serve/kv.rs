//! The emulated pods' KV-cache events, published as vLLM publishes them: a ZeroMQ `PUB` socket
//! sending `[topic, seq, payload]` per engine step (`BlockStored` with the blocks' token ids,
//! `BlockRemoved`, `AllBlocksCleared`), in either of vLLM's encodings, with an optional replay
//! socket. A subscriber (infergate's precise prefix routing, or any other consumer of vLLM's
//! events) runs against the emulator unchanged.
//!
//! Token ids are the emulator's tokenizer stand-in's ([`crate::tokens`]), or the model's own
//! tokenizer's when the fleet is served with one ([`super::ServeOptions::tokenizer`]): a router
//! that matches on them must tokenize the same way. A LoRA request's blocks are hashed under its
//! adapter and a salted request's under its `cache_salt`, as the engine hashes them, and their
//! `BlockStored` carries what vLLM's does: the adapter's `lora_id` and `lora_name`, and per block
//! the `extra_keys` vLLM mixed into its hash (`generate_block_hash_extra_keys` in
//! `vllm/v1/core/kv_cache_utils.py`) — the adapter's name in every block of a LoRA request, then
//! the salt in a salted request's first block.
//!
//! The keyed encoding is vLLM 0.32's, field for field (`vllm/distributed/kv_events.py`, checked
//! against batches a running vLLM 0.32 published, `tests/fixtures/vllm-0.32-*.msgpack`): a
//! `BlockStored` always has `extra_keys`, one entry per block (`nil` for a block without keys,
//! as `to_event_extra_keys` builds it), then `group_idx` 0 and `kv_cache_spec_kind`
//! `full_attention`; each evicted block is a `BlockRemoved` of its own with `group_idx` 0. The
//! positional encoding is the earlier releases': `extra_keys` only when a block has any, no
//! group fields.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use infergate_kvevents::event::{Batch, Encoding, Event, ExtraKey, Removed, Stored, encode_batch};
use infergate_kvevents::publish::Publisher;

use super::lock;
use crate::engine::KvEvent;
use crate::error::SimError;
use crate::spec::{EngineKind, FleetSpec};
use crate::tokens::{Prompt, ids_block_hashes, lora_seed, salt_seed, text_block_hashes, token_ids};

/// How the pods publish.
#[derive(Debug, Clone)]
pub struct KvEventsOptions {
    /// Pod `i` publishes on `base_port + 2i` (and replays on `base_port + 2i + 1`); `None`:
    /// ports the system picks.
    pub base_port: Option<u16>,
    /// Serve a replay socket.
    pub replay: bool,
    /// The events' encoding.
    pub encoding: Encoding,
    /// The topic frame.
    pub topic: String,
}

impl Default for KvEventsOptions {
    fn default() -> Self {
        KvEventsOptions {
            base_port: None,
            replay: true,
            encoding: Encoding::Keyed,
            topic: String::new(),
        }
    }
}

impl KvEventsOptions {
    /// Pod `index`'s `PUB` and replay ports: `base_port + 2 × index` and the one after (0 and 0,
    /// ports the system picks, without a base port).
    pub fn ports(&self, index: usize, pod: &str) -> Result<(u16, u16), SimError> {
        let Some(base) = self.base_port else {
            return Ok((0, 0));
        };
        let events = u64::from(base) + 2 * index as u64;
        let port = |p: u64| {
            u16::try_from(p).map_err(|_| SimError::KvPort {
                pod: pod.to_owned(),
                port: u32::try_from(p).unwrap_or(u32::MAX),
                reason: format!(
                    "past 65535 (pod {index} publishes on the base port {base} + 2 × {index}, \
                     and replays on the port after): choose a lower base port"
                ),
            })
        };
        Ok((port(events)?, port(events + 1)?))
    }

    /// Checks the KV-event ports of every vLLM pod of `spec`: within range, and none a pod's
    /// fixed HTTP port.
    pub fn check(&self, spec: &FleetSpec) -> Result<(), SimError> {
        let vllm = spec.pods.iter().enumerate();
        for (i, pod) in vllm.filter(|(_, p)| p.engine == EngineKind::Vllm) {
            let (events, replay) = self.ports(i, &pod.name)?;
            for p in [events, replay].into_iter().filter(|p| *p != 0) {
                if let Some(other) = spec.pods.iter().find(|o| o.port == p) {
                    return Err(SimError::KvPort {
                        pod: pod.name.clone(),
                        port: u32::from(p),
                        reason: format!("pod {} serves HTTP on it", other.name),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Blocks remembered for the events at most (a bound on prompts whose blocks never got stored).
const MAX_KNOWN_BLOCKS: usize = 1 << 20;

/// What `BlockStored` says of one block besides its hash.
#[derive(Debug, Clone)]
struct BlockInfo {
    /// The block before it (`None` for a prompt's first block).
    parent: Option<u64>,
    ids: Vec<u32>,
    /// The LoRA adapter it was computed under.
    lora: Option<Adapter>,
    /// The request's `cache_salt`, for a prompt's first block only: vLLM lists it in that
    /// block's extra keys alone.
    salt: Option<Arc<str>>,
}

impl BlockInfo {
    /// The block's `extra_keys` entry as vLLM builds it: the adapter's name, then the salt.
    fn extra_keys(&self) -> Option<Vec<ExtraKey>> {
        let keys: Vec<ExtraKey> = self
            .lora
            .iter()
            .map(|a| ExtraKey::Str(a.name.to_string()))
            .chain(self.salt.iter().map(|s| ExtraKey::Str(s.to_string())))
            .collect();
        (!keys.is_empty()).then_some(keys)
    }
}

/// A LoRA adapter as `BlockStored` names it: vLLM's integer `lora_id` (the emulator numbers a
/// pod's adapters from 1 in the order it lists them) and `lora_name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Adapter {
    pub(crate) id: u64,
    pub(crate) name: Arc<str>,
}

/// The KV-cache group of every block: the emulated models have one full-attention group.
const GROUP: u32 = 0;

/// vLLM's `KVCacheSpecKind` of that group.
const FULL_ATTENTION: &str = "full_attention";

/// One pod's publisher and what it needs to describe a block.
#[derive(Debug)]
pub(crate) struct Feed {
    publisher: Publisher,
    encoding: Encoding,
    block_size: u32,
    /// Block hash → (parent hash, token ids), learned from the prompts submitted.
    blocks: Mutex<HashMap<u64, BlockInfo>>,
}

impl Feed {
    /// Binds the sockets of pod `index`, named `pod`, on `ip`.
    pub(crate) async fn bind(
        o: &KvEventsOptions,
        ip: IpAddr,
        index: usize,
        pod: &str,
    ) -> Result<Feed, SimError> {
        let (events, replay) = o.ports(index, pod)?;
        let events = SocketAddr::new(ip, events);
        let replay = o.replay.then(|| SocketAddr::new(ip, replay));
        let publisher = Publisher::bind(events, replay, &o.topic, 10_000)
            .await
            .map_err(|source| SimError::KvBind {
                pod: pod.to_owned(),
                events: events.port(),
                replay: replay.map(|r| r.port()),
                source,
            })?;
        Ok(Feed {
            publisher,
            encoding: o.encoding,
            block_size: 0,
            blocks: Mutex::new(HashMap::new()),
        })
    }

    /// Sets the engine's block size (before the first prompt).
    pub(crate) fn with_block_size(mut self, bs: u32) -> Self {
        self.block_size = bs;
        self
    }

    /// The `PUB` address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.publisher.addr()
    }

    /// The replay address.
    pub(crate) fn replay_addr(&self) -> Option<SocketAddr> {
        self.publisher.replay_addr()
    }

    /// Remembers the full blocks of a prompt under `lora` and `salt` (hashed as the engine
    /// hashes them: `seed` is the pod's chain seed, mixed here with the adapter's name and the
    /// salt), so that their `BlockStored` can carry their token ids, adapter and extra keys. A
    /// synthetic prompt has no ids.
    pub(crate) fn note_prompt(
        &self,
        prompt: &Prompt,
        seed: u64,
        lora: Option<Adapter>,
        salt: Option<Arc<str>>,
    ) {
        let bs = self.block_size;
        if bs == 0 {
            return;
        }
        let salt = salt.filter(|s| !s.is_empty());
        let seed = salt_seed(
            lora_seed(seed, lora.as_ref().map(|a| &*a.name)),
            salt.as_deref(),
        );
        let mut hashes = Vec::new();
        let mut text_ids = Vec::new();
        // A block is `bs` tokens: block i's ids are ids[i*bs..(i+1)*bs] (for text, whole
        // 4-byte pieces, so the same bytes the engine hashed).
        let ids: &[u32] = match prompt {
            Prompt::Text(text) => {
                token_ids(text, &mut text_ids);
                text_block_hashes(text, bs, seed, &mut hashes);
                &text_ids
            }
            Prompt::Ids(ids) => {
                ids_block_hashes(ids, bs, seed, &mut hashes);
                ids
            }
            Prompt::Tokens { .. } => return,
        };
        let mut blocks = lock(&self.blocks);
        if blocks.len() > MAX_KNOWN_BLOCKS {
            blocks.clear();
        }
        let bs = bs as usize;
        let mut parent = None;
        for (i, hash) in hashes.into_iter().enumerate() {
            if let Some(block) = ids.get(i * bs..(i + 1) * bs) {
                blocks.entry(hash).or_insert_with(|| BlockInfo {
                    parent,
                    ids: block.to_vec(),
                    lora: lora.clone(),
                    salt: if i == 0 { salt.clone() } else { None },
                });
            }
            parent = Some(hash);
        }
    }

    /// Publishes one step's events (`ts`: seconds since the epoch) as one batch; `events` is
    /// drained.
    pub(crate) fn publish(&self, ts: f64, events: &mut Vec<(f64, KvEvent)>) {
        if events.is_empty() {
            return;
        }
        // vLLM 0.32 (keyed) lists every block's extra keys and names the cache group; earlier
        // releases (positional) only the keys, and only when a block has any.
        let current = self.encoding == Encoding::Keyed;
        let group = current.then_some(GROUP);
        let mut out: Vec<Event> = Vec::with_capacity(events.len());
        {
            let mut blocks = lock(&self.blocks);
            for (_, e) in events.drain(..) {
                match e {
                    KvEvent::Stored { hash } => {
                        let Some(b) = blocks.get(&hash).cloned() else {
                            continue; // a synthetic prompt's block: no text, no ids
                        };
                        let extra = b.extra_keys();
                        // Consecutive blocks of one chain (so of one adapter) go in one event,
                        // as vLLM sends them.
                        if let Some(Event::Stored(s)) = out.last_mut()
                            && s.block_hashes.last().copied() == b.parent
                            && b.parent.is_some()
                        {
                            // Earlier releases: an entry per block once any block has one.
                            if extra.is_some() && s.extra_keys.is_empty() {
                                s.extra_keys.resize(s.block_hashes.len(), None);
                            }
                            if current || !s.extra_keys.is_empty() {
                                s.extra_keys.push(extra);
                            }
                            s.block_hashes.push(hash);
                            s.token_ids.extend_from_slice(&b.ids);
                            continue;
                        }
                        let extra_keys = if current || extra.is_some() {
                            vec![extra]
                        } else {
                            Vec::new()
                        };
                        out.push(Event::Stored(Stored {
                            block_hashes: vec![hash],
                            parent: b.parent,
                            token_ids: b.ids,
                            block_size: self.block_size,
                            lora_id: b.lora.as_ref().map(|a| a.id),
                            lora_name: b.lora.map(|a| a.name.to_string()),
                            medium: Some("GPU".into()),
                            extra_keys,
                            group_idx: group,
                            kv_cache_spec_kind: current.then(|| FULL_ATTENTION.to_owned()),
                        }));
                    }
                    KvEvent::Removed { hash } => {
                        // vLLM sends an event per evicted block (`_emit_block_removed_events`).
                        blocks.remove(&hash);
                        out.push(Event::Removed(Removed {
                            block_hashes: vec![hash],
                            medium: Some("GPU".into()),
                            group_idx: group,
                        }));
                    }
                    KvEvent::Cleared => out.push(Event::AllCleared),
                }
            }
        }
        if out.is_empty() {
            return;
        }
        let batch = Batch {
            ts,
            events: out,
            data_parallel_rank: Some(0),
            unknown_events: 0,
        };
        self.publisher.publish(encode_batch(&batch, self.encoding));
    }
}
