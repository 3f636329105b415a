//! vLLM's KV-cache event batches, decoded from either encoding.
//!
//! A batch is `KVEventBatch{ts, events, data_parallel_rank}`, an array (`msgspec`'s
//! `array_like`) or, from some publishers, a map. Each event is a tagged `msgspec` struct: since
//! mid-2026 a map with a `type` key (`{"type": "BlockStored", "block_hashes": …}`), before that an
//! array with the class name first (`["BlockStored", [hashes], parent, [token ids], 16, …]`).
//! Both shapes are decoded at both levels; unknown keys and trailing positional fields are
//! skipped, so fields added by later releases do not break the decoder.

use xxhash_rust::xxh64::xxh64;

use crate::error::DecodeError;
use crate::msgpack::{IntOrBytes, Kind, Reader};

/// An engine block hash as the index keys it: an integer hash as its low 64 bits, a byte hash
/// folded to 64 bits.
pub type EngineHash = u64;

fn engine_hash(h: IntOrBytes<'_>) -> EngineHash {
    match h {
        IntOrBytes::Int(v) => v,
        IntOrBytes::Bytes(b) => xxh64(b, 0x6b76_6576_656e_7473),
    }
}

/// One KV-cache event.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Full blocks that entered the prefix cache, in prompt order.
    Stored(Stored),
    /// Blocks evicted from the cache.
    Removed(Removed),
    /// The whole cache was reset.
    AllCleared,
}

/// `BlockStored`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stored {
    /// The engine's hash of each block.
    pub block_hashes: Vec<EngineHash>,
    /// The hash of the block before the first one, if the chain continues an earlier block.
    pub parent: Option<EngineHash>,
    /// The token ids of all the blocks, `block_size` per block.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// The LoRA adapter's name, when the blocks were computed under one.
    pub lora_name: Option<String>,
    /// The (deprecated) LoRA id, when no name is given.
    pub lora_id: Option<u64>,
    /// Where the blocks live (`GPU`, `CPU`, …); `None` means the GPU.
    pub medium: Option<String>,
    /// Per block, what vLLM mixed into the block's hash besides its tokens and parent (its
    /// `extra_keys`: `None` for a block with none); empty when the event has no `extra_keys`
    /// (vLLM omits the field when no block has any, and releases before 2026 never send it).
    /// vLLM's `generate_block_hash_extra_keys` (`vllm/v1/core/kv_cache_utils.py`) builds each
    /// tuple as the LoRA adapter's name, then multimodal identifiers, then the request's
    /// `cache_salt` (block 0 only), then prompt-embedding hashes.
    pub extra_keys: Vec<Option<Vec<ExtraKey>>>,
    /// The KV-cache group (hybrid models); `None` is group 0.
    pub group_idx: Option<u32>,
    /// The attention kind of that group's cache (`full_attention`, `sliding_window`, …), which
    /// vLLM 0.32 adds to every store (`KVCacheManager.take_events`); `None` when not sent.
    /// Keyed events only: no release sent it in the positional layout.
    pub kv_cache_spec_kind: Option<String>,
}

/// `BlockRemoved`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Removed {
    /// The engine's hashes of the evicted blocks.
    pub block_hashes: Vec<EngineHash>,
    /// Where the blocks lived; `None` means the GPU.
    pub medium: Option<String>,
    /// The KV-cache group; `None` is group 0.
    pub group_idx: Option<u32>,
}

/// A decoded `KVEventBatch`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// The engine's timestamp (seconds since the epoch).
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<Event>,
    /// The data-parallel rank that published it.
    pub data_parallel_rank: Option<u32>,
    /// Events of a type this decoder does not know, skipped.
    pub unknown_events: u32,
}

/// Decodes one batch payload (either encoding, at both levels).
pub fn decode_batch(payload: &[u8]) -> Result<Batch, DecodeError> {
    let mut r = Reader::new(payload);
    let mut batch = Batch::default();
    match r.peek()? {
        Kind::Array => {
            let n = r.array()?;
            if n < 2 {
                return Err(DecodeError::Malformed("a batch array needs ts and events"));
            }
            batch.ts = r.float()?;
            decode_events(&mut r, &mut batch)?;
            if n >= 3 {
                batch.data_parallel_rank = opt_u32(&mut r)?;
            }
            for _ in 3..n {
                r.skip()?;
            }
        }
        Kind::Map => {
            let mut events = false;
            for _ in 0..r.map()? {
                match key(&mut r)? {
                    "ts" => batch.ts = r.float()?,
                    "events" => {
                        decode_events(&mut r, &mut batch)?;
                        events = true;
                    }
                    "data_parallel_rank" => batch.data_parallel_rank = opt_u32(&mut r)?,
                    _ => r.skip()?,
                }
            }
            if !events {
                return Err(DecodeError::Malformed("a batch map without events"));
            }
        }
        _ => return Err(DecodeError::Unexpected("a batch (array or map)")),
    }
    if r.remaining() != 0 {
        return Err(DecodeError::Malformed("bytes after the batch"));
    }
    Ok(batch)
}

fn key<'a>(r: &mut Reader<'a>) -> Result<&'a str, DecodeError> {
    r.str()
}

fn opt_u32(r: &mut Reader<'_>) -> Result<Option<u32>, DecodeError> {
    if r.nil()? {
        return Ok(None);
    }
    r.u32().map(Some)
}

fn opt_str(r: &mut Reader<'_>) -> Result<Option<String>, DecodeError> {
    if r.nil()? {
        return Ok(None);
    }
    r.str().map(|s| Some(s.to_owned()))
}

fn opt_u64(r: &mut Reader<'_>) -> Result<Option<u64>, DecodeError> {
    if r.nil()? {
        return Ok(None);
    }
    r.int().map(Some)
}

fn hashes(r: &mut Reader<'_>, out: &mut Vec<EngineHash>) -> Result<(), DecodeError> {
    let n = r.array()?;
    out.reserve(n);
    for _ in 0..n {
        out.push(engine_hash(r.int_or_bytes()?));
    }
    Ok(())
}

fn opt_hash(r: &mut Reader<'_>) -> Result<Option<EngineHash>, DecodeError> {
    if r.nil()? {
        return Ok(None);
    }
    Ok(Some(engine_hash(r.int_or_bytes()?)))
}

fn tokens(r: &mut Reader<'_>, out: &mut Vec<u32>) -> Result<(), DecodeError> {
    let n = r.array()?;
    out.reserve(n);
    for _ in 0..n {
        out.push(r.u32()?);
    }
    Ok(())
}

/// One element of a block's extra keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtraKey {
    /// A string: a LoRA adapter's name, a request's `cache_salt` (or, in some releases, a
    /// multimodal input's identifier).
    Str(String),
    /// An integer: a LoRA adapter's id (releases before the adapter's name was used).
    Int(u64),
    /// Anything else (a multimodal `(identifier, offset)` pair, prompt-embedding bytes), as its
    /// MessagePack bytes: it makes the block unmatchable, and the encoder writes it back as it
    /// came.
    Other(Vec<u8>),
}

fn extra_keys(r: &mut Reader<'_>, out: &mut Vec<Option<Vec<ExtraKey>>>) -> Result<(), DecodeError> {
    if r.nil()? {
        return Ok(());
    }
    let n = r.array()?;
    out.reserve(n);
    for _ in 0..n {
        if r.nil()? {
            out.push(None);
            continue;
        }
        // msgspec writes a tuple as an array; anything else is kept whole, as one element.
        if r.peek()? != Kind::Array {
            out.push(Some(vec![ExtraKey::Other(r.raw()?.to_vec())]));
            continue;
        }
        let k = r.array()?;
        let mut keys = Vec::with_capacity(k.min(8));
        for _ in 0..k {
            // Read whole first, then as a name or a number where it is one: a string that is not
            // UTF-8, or a negative number, is kept as it came (`Other`, matching nothing) rather
            // than failing the batch. So what the encoder writes back, which wraps a lone
            // element in a tuple, decodes again whatever the element was.
            let raw = r.raw()?;
            let mut one = Reader::new(raw);
            let key = match one.peek()? {
                Kind::Str => one.str().ok().map(|s| ExtraKey::Str(s.to_owned())),
                Kind::Int => one.int().ok().map(ExtraKey::Int),
                _ => None,
            };
            keys.push(key.unwrap_or_else(|| ExtraKey::Other(raw.to_vec())));
        }
        out.push(Some(keys));
    }
    Ok(())
}

/// `extra_keys`, or `nil` when the event has none (a positional field before a set one).
fn write_extra_keys_or_nil(w: &mut crate::msgpack::Writer, keys: &[Option<Vec<ExtraKey>>]) {
    if keys.is_empty() {
        w.nil();
    } else {
        write_extra_keys(w, keys);
    }
}

fn write_extra_keys(w: &mut crate::msgpack::Writer, keys: &[Option<Vec<ExtraKey>>]) {
    w.array(keys.len());
    for block in keys {
        match block {
            None => {
                w.nil();
            }
            Some(k) => {
                w.array(k.len());
                for key in k {
                    match key {
                        ExtraKey::Str(s) => w.str(s),
                        ExtraKey::Int(v) => w.uint(*v),
                        ExtraKey::Other(raw) => w.raw(raw),
                    };
                }
            }
        }
    }
}

fn decode_events(r: &mut Reader<'_>, batch: &mut Batch) -> Result<(), DecodeError> {
    let n = r.array()?;
    batch.events.reserve(n);
    for _ in 0..n {
        match decode_event(r) {
            Ok(e) => batch.events.push(e),
            Err(DecodeError::UnknownEvent(_)) => batch.unknown_events += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Decodes one event (either shape). An unknown type is consumed and reported as
/// [`DecodeError::UnknownEvent`].
fn decode_event(r: &mut Reader<'_>) -> Result<Event, DecodeError> {
    match r.peek()? {
        Kind::Array => positional(r),
        Kind::Map => keyed(r),
        _ => Err(DecodeError::Unexpected("an event (array or map)")),
    }
}

fn positional(r: &mut Reader<'_>) -> Result<Event, DecodeError> {
    let n = r.array()?;
    if n == 0 {
        return Err(DecodeError::Malformed("an event array without its type"));
    }
    let tag = r.str()?;
    let fields = n - 1;
    let mut read = 0usize;
    // Reads the next positional field when the array has it.
    macro_rules! next {
        ($e:expr) => {
            if read < fields {
                read += 1;
                $e;
            }
        };
    }
    let event = match tag {
        "BlockStored" => {
            let mut s = Stored::default();
            next!(hashes(r, &mut s.block_hashes)?);
            next!(s.parent = opt_hash(r)?);
            next!(tokens(r, &mut s.token_ids)?);
            next!(s.block_size = r.u32()?);
            next!(s.lora_id = opt_u64(r)?);
            next!(s.medium = opt_str(r)?);
            next!(s.lora_name = opt_str(r)?);
            next!(extra_keys(r, &mut s.extra_keys)?);
            next!(s.group_idx = opt_u32(r)?);
            if read < 4 {
                return Err(DecodeError::Malformed(
                    "BlockStored without hashes, parent, token ids and block size",
                ));
            }
            Event::Stored(s)
        }
        "BlockRemoved" => {
            let mut s = Removed::default();
            next!(hashes(r, &mut s.block_hashes)?);
            next!(s.medium = opt_str(r)?);
            next!(s.group_idx = opt_u32(r)?);
            if read < 1 {
                return Err(DecodeError::Malformed("BlockRemoved without hashes"));
            }
            Event::Removed(s)
        }
        "AllBlocksCleared" => Event::AllCleared,
        other => {
            let other = other.to_owned();
            for _ in 0..fields {
                r.skip()?;
            }
            return Err(DecodeError::UnknownEvent(other));
        }
    };
    for _ in read..fields {
        r.skip()?;
    }
    Ok(event)
}

fn keyed(r: &mut Reader<'_>) -> Result<Event, DecodeError> {
    let n = r.map()?;
    // The `type` key comes first from msgspec, but nothing requires it: read the fields of
    // both kinds and decide at the end.
    let mut tag: Option<&str> = None;
    let mut s = Stored::default();
    let mut seen_hashes = false;
    let mut seen_tokens = false;
    let mut seen_size = false;
    for _ in 0..n {
        match key(r)? {
            "type" => tag = Some(r.str()?),
            "block_hashes" => {
                s.block_hashes.clear();
                hashes(r, &mut s.block_hashes)?;
                seen_hashes = true;
            }
            "parent_block_hash" => s.parent = opt_hash(r)?,
            "token_ids" => {
                s.token_ids.clear();
                tokens(r, &mut s.token_ids)?;
                seen_tokens = true;
            }
            "block_size" => {
                s.block_size = r.u32()?;
                seen_size = true;
            }
            "lora_id" => s.lora_id = opt_u64(r)?,
            "medium" => s.medium = opt_str(r)?,
            "lora_name" => s.lora_name = opt_str(r)?,
            "extra_keys" => {
                s.extra_keys.clear();
                extra_keys(r, &mut s.extra_keys)?;
            }
            "group_idx" => s.group_idx = opt_u32(r)?,
            "kv_cache_spec_kind" => s.kv_cache_spec_kind = opt_str(r)?,
            _ => r.skip()?,
        }
    }
    match tag {
        Some("BlockStored") => {
            if !(seen_hashes && seen_tokens && seen_size) {
                return Err(DecodeError::Malformed(
                    "BlockStored without block_hashes, token_ids or block_size",
                ));
            }
            Ok(Event::Stored(s))
        }
        Some("BlockRemoved") => {
            if !seen_hashes {
                return Err(DecodeError::Malformed("BlockRemoved without block_hashes"));
            }
            Ok(Event::Removed(Removed {
                block_hashes: s.block_hashes,
                medium: s.medium,
                group_idx: s.group_idx,
            }))
        }
        Some("AllBlocksCleared") => Ok(Event::AllCleared),
        Some(other) => Err(DecodeError::UnknownEvent(other.to_owned())),
        None => Err(DecodeError::Malformed("an event map without a type")),
    }
}

/// How events are encoded: vLLM's current keyed maps or the positional arrays of earlier
/// releases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encoding {
    /// `{"type": "BlockStored", "block_hashes": …}` (vLLM since mid-2026).
    #[default]
    Keyed,
    /// `["BlockStored", [hashes], parent, …]` (earlier releases).
    Positional,
}

impl Encoding {
    /// Parses `keyed` / `positional`.
    pub fn parse(s: &str) -> Option<Encoding> {
        match s {
            "keyed" | "map" => Some(Encoding::Keyed),
            "positional" | "array" => Some(Encoding::Positional),
            _ => None,
        }
    }
}

/// Encodes a batch as vLLM does (the batch itself an array), its events in `encoding`. Engine
/// hashes are written as integers, vLLM's default. Fields with a default in vLLM's classes
/// (`extra_keys`, `group_idx`, `kv_cache_spec_kind`) are left out when unset, as msgspec's
/// `omit_defaults` leaves them out (from an array, only when no later field is set).
pub fn encode_batch(batch: &Batch, encoding: Encoding) -> Vec<u8> {
    use crate::msgpack::Writer;
    let mut w = Writer::default();
    let dp = batch.data_parallel_rank;
    w.array(if dp.is_some() { 3 } else { 2 });
    w.float(batch.ts);
    w.array(batch.events.len());
    for e in &batch.events {
        match (e, encoding) {
            (Event::Stored(s), Encoding::Keyed) => {
                let extra = !s.extra_keys.is_empty();
                let (group, kind) = (s.group_idx.is_some(), s.kv_cache_spec_kind.is_some());
                let n = 8 + usize::from(extra) + usize::from(group) + usize::from(kind);
                w.map(n).str("type").str("BlockStored");
                w.str("block_hashes").array(s.block_hashes.len());
                for h in &s.block_hashes {
                    w.uint(*h);
                }
                w.str("parent_block_hash");
                match s.parent {
                    Some(p) => w.uint(p),
                    None => w.nil(),
                };
                w.str("token_ids").array(s.token_ids.len());
                for t in &s.token_ids {
                    w.uint(u64::from(*t));
                }
                w.str("block_size").uint(u64::from(s.block_size));
                w.str("lora_id");
                match s.lora_id {
                    Some(id) => w.uint(id),
                    None => w.nil(),
                };
                w.str("medium");
                match &s.medium {
                    Some(m) => w.str(m),
                    None => w.nil(),
                };
                w.str("lora_name");
                match &s.lora_name {
                    Some(n) => w.str(n),
                    None => w.nil(),
                };
                if extra {
                    w.str("extra_keys");
                    write_extra_keys(&mut w, &s.extra_keys);
                }
                if let Some(g) = s.group_idx {
                    w.str("group_idx").uint(u64::from(g));
                }
                if let Some(k) = &s.kv_cache_spec_kind {
                    w.str("kv_cache_spec_kind").str(k);
                }
            }
            (Event::Stored(s), Encoding::Positional) => {
                // msgspec leaves trailing fields at their default out of an array: each optional
                // field only when it or a later one is set. (No release sent this layout with
                // `kv_cache_spec_kind`, so it is keyed only.)
                let trailing = if s.group_idx.is_some() {
                    2
                } else {
                    usize::from(!s.extra_keys.is_empty())
                };
                w.array(8 + trailing)
                    .str("BlockStored")
                    .array(s.block_hashes.len());
                for h in &s.block_hashes {
                    w.uint(*h);
                }
                match s.parent {
                    Some(p) => w.uint(p),
                    None => w.nil(),
                };
                w.array(s.token_ids.len());
                for t in &s.token_ids {
                    w.uint(u64::from(*t));
                }
                w.uint(u64::from(s.block_size));
                match s.lora_id {
                    Some(id) => w.uint(id),
                    None => w.nil(),
                };
                match &s.medium {
                    Some(m) => w.str(m),
                    None => w.nil(),
                };
                match &s.lora_name {
                    Some(n) => w.str(n),
                    None => w.nil(),
                };
                if trailing >= 1 {
                    write_extra_keys_or_nil(&mut w, &s.extra_keys);
                }
                if let Some(g) = s.group_idx {
                    w.uint(u64::from(g));
                }
            }
            (Event::Removed(r), Encoding::Keyed) => {
                w.map(3 + usize::from(r.group_idx.is_some()))
                    .str("type")
                    .str("BlockRemoved");
                w.str("block_hashes").array(r.block_hashes.len());
                for h in &r.block_hashes {
                    w.uint(*h);
                }
                w.str("medium");
                match &r.medium {
                    Some(m) => w.str(m),
                    None => w.nil(),
                };
                if let Some(g) = r.group_idx {
                    w.str("group_idx").uint(u64::from(g));
                }
            }
            (Event::Removed(r), Encoding::Positional) => {
                w.array(3 + usize::from(r.group_idx.is_some()))
                    .str("BlockRemoved")
                    .array(r.block_hashes.len());
                for h in &r.block_hashes {
                    w.uint(*h);
                }
                match &r.medium {
                    Some(m) => w.str(m),
                    None => w.nil(),
                };
                if let Some(g) = r.group_idx {
                    w.uint(u64::from(g));
                }
            }
            (Event::AllCleared, Encoding::Keyed) => {
                w.map(1).str("type").str("AllBlocksCleared");
            }
            (Event::AllCleared, Encoding::Positional) => {
                w.array(1).str("AllBlocksCleared");
            }
        }
    }
    if let Some(dp) = dp {
        w.uint(u64::from(dp));
    }
    w.buf
}
