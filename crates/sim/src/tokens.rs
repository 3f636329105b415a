//! A deterministic tokenizer stand-in and the prompt block hashes that prefix caching keys on.
//!
//! Real tokenizers average about four bytes of English per token; the emulator uses exactly
//! [`BYTES_PER_TOKEN`] so that a prompt's text fixes its token count and its block hashes, on every
//! pod and in both clocks. Block hashes are a chain (each block's hash is seeded with the previous
//! one), as in vLLM, so equal hashes mean equal prefixes. The chain of a LoRA request starts from
//! a seed mixed with the adapter's name ([`lora_seed`]), as vLLM keys every block of such a
//! request by the adapter: prompts under different adapters never share cached blocks.
//!
//! Token ids (what the emulated `/tokenize` answers) come from the same pieces: each piece's
//! bytes, the last one padded with `0xFF` (a byte UTF-8 never uses), form a 32-bit number that a
//! fixed four-round Feistel permutation scrambles into the id. The map is one-to-one, so ids
//! decode back to their text without any table, equal text has equal ids on every pod, and a
//! block of `block_size` ids covers exactly the bytes of one prefix-cache block. The stand-in's
//! vocabulary is therefore the whole `u32` range, not a real tokenizer's ~128k ids.

use std::sync::Arc;

use xxhash_rust::xxh64::xxh64;

use crate::SimError;

/// Bytes of prompt text per token.
pub const BYTES_PER_TOKEN: usize = 4;

/// Seed of the first block of every chain; mixed with the model name by [`chain_seed`].
const CHAIN_SEED: u64 = 0x1f6e_7a61_7465_0001;

/// Mixed into a chain seed with an adapter's name by [`lora_seed`].
const LORA_TAG: u64 = 0x6c6f_7261_0000_0001;

/// Mixed into a chain seed with a request's `cache_salt` by [`salt_seed`].
const SALT_TAG: u64 = 0x7361_6c74_0000_0001;

/// Byte that pads the last, shorter piece of a prompt to [`BYTES_PER_TOKEN`] bytes: UTF-8 text
/// never contains it, so padding and text cannot be confused.
const PAD: u8 = 0xFF;

/// Round keys of the permutation from a piece's bytes to its token id.
const ID_KEYS: [u64; 4] = [
    0x7a3c_91d2_4e6b_0f15,
    0x1b5f_e8a0_c3d7_6249,
    0xd46e_2b1f_907c_a583,
    0x6f09_b7c4_e25a_18d3,
];

/// What a request asks the model to read.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Prompt text; tokens are [`BYTES_PER_TOKEN`]-byte pieces of it.
    Text(Arc<str>),
    /// A synthetic prompt of `tokens` tokens whose first `prefix_tokens` are shared by every
    /// request with the same `prefix_group`; the rest is unique to the request. Cheap: nothing
    /// is allocated or hashed per token.
    Tokens {
        /// Prompt length in tokens.
        tokens: u32,
        /// Requests with the same group share their first `prefix_tokens` tokens.
        prefix_group: u64,
        /// Length of the shared part (0 = nothing shared).
        prefix_tokens: u32,
    },
    /// A prompt already tokenized by the model's own tokenizer (`infergate sim --tokenizer`):
    /// these ids are what the engine counts and caches, block by block ([`ids_block_hashes`]).
    Ids(Arc<[u32]>),
}

impl Prompt {
    /// A synthetic prompt with nothing shared.
    pub fn tokens(tokens: u32) -> Self {
        Prompt::Tokens {
            tokens,
            prefix_group: 0,
            prefix_tokens: 0,
        }
    }

    /// Number of prompt tokens.
    pub fn token_count(&self) -> u32 {
        match self {
            Prompt::Text(text) => count_tokens(text),
            Prompt::Tokens { tokens, .. } => *tokens,
            Prompt::Ids(ids) => u32::try_from(ids.len()).unwrap_or(u32::MAX),
        }
    }
}

/// Number of tokens in `text` (at least one: an empty prompt still has a BOS token).
pub fn count_tokens(text: &str) -> u32 {
    let n = text.len().div_ceil(BYTES_PER_TOKEN).max(1);
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Appends the token ids of `text` to `out`: [`count_tokens`] of them, one per
/// [`BYTES_PER_TOKEN`]-byte piece (the empty prompt's single token is [`bos_id`]).
pub fn token_ids(text: &str, out: &mut Vec<u32>) {
    if text.is_empty() {
        out.push(bos_id());
        return;
    }
    for chunk in text.as_bytes().chunks(BYTES_PER_TOKEN) {
        let mut piece = [PAD; BYTES_PER_TOKEN];
        piece[..chunk.len()].copy_from_slice(chunk);
        out.push(scramble(u32::from_be_bytes(piece)));
    }
}

/// The id of the token an empty prompt still has (it decodes to no text).
pub fn bos_id() -> u32 {
    scramble(u32::MAX)
}

/// The bytes of the piece behind token `id` (shorter than [`BYTES_PER_TOKEN`] for a prompt's
/// last piece, empty for [`bos_id`]), or `None` if no text produces `id`.
pub fn token_bytes(id: u32) -> Option<Vec<u8>> {
    let bytes = unscramble(id).to_be_bytes();
    let len = bytes.iter().rposition(|b| *b != PAD).map_or(0, |i| i + 1);
    let piece = &bytes[..len];
    // Bytes that never occur in UTF-8: such an id came from no text.
    if piece.iter().any(|b| matches!(b, 0xC0 | 0xC1 | 0xF5..=0xFF)) {
        return None;
    }
    Some(piece.to_vec())
}

/// The text of a sequence of token ids: the exact text for ids that [`token_ids`] produced.
/// Pieces that split a character (any sub-sequence may) decode to U+FFFD, as a real tokenizer's
/// partial bytes do.
pub fn detokenize(ids: &[u32]) -> Result<String, SimError> {
    let mut bytes = Vec::with_capacity(ids.len() * BYTES_PER_TOKEN);
    for &id in ids {
        bytes.extend(token_bytes(id).ok_or(SimError::UnknownToken(id))?);
    }
    Ok(match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// A keyed Feistel network on the two 16-bit halves: a fixed permutation of `u32`.
fn scramble(x: u32) -> u32 {
    let (mut l, mut r) = ((x >> 16) as u16, (x & 0xffff) as u16);
    for k in ID_KEYS {
        (l, r) = (r, l ^ feistel_round(r, k));
    }
    (u32::from(l) << 16) | u32::from(r)
}

/// The inverse of [`scramble`]: the rounds undone in reverse order.
fn unscramble(y: u32) -> u32 {
    let (mut l, mut r) = ((y >> 16) as u16, (y & 0xffff) as u16);
    for k in ID_KEYS.iter().rev() {
        (l, r) = (r ^ feistel_round(l, *k), l);
    }
    (u32::from(l) << 16) | u32::from(r)
}

fn feistel_round(half: u16, key: u64) -> u16 {
    (splitmix(u64::from(half) ^ key) & 0xffff) as u16
}

/// The chain seed of a model: prefix hashes never match across models.
pub fn chain_seed(model: &str) -> u64 {
    xxh64(model.as_bytes(), CHAIN_SEED)
}

/// The chain seed of a request to an engine whose chain seed is `seed`: `seed` itself for the
/// base model, mixed with the adapter's name for a LoRA request. vLLM puts a LoRA request's
/// adapter name in every block's hash (the block's extra keys), so the same prompt under two
/// adapters, or under an adapter and the base model, never shares a cached block; a chain
/// seeded by the adapter gives every block of the prompt that property at once.
pub fn lora_seed(seed: u64, adapter: Option<&str>) -> u64 {
    match adapter {
        None => seed,
        Some(name) => xxh64(name.as_bytes(), seed ^ LORA_TAG),
    }
}

/// The chain seed of a request with the `cache_salt` `salt`, from its chain seed without one
/// (`seed`, from [`lora_seed`]). vLLM adds the salt to the extra keys of a request's first
/// block only (`generate_block_hash_extra_keys` in `vllm/v1/core/kv_cache_utils.py`), and every
/// later block's hash chains through that one, so a salted prompt shares no cached block with
/// the same prompt under another salt or none; seeding the chain with the salt does the same.
/// An empty salt is no salt there (vLLM's API refuses one before).
pub fn salt_seed(seed: u64, salt: Option<&str>) -> u64 {
    match salt {
        None | Some("") => seed,
        Some(s) => xxh64(s.as_bytes(), seed ^ SALT_TAG),
    }
}

/// Appends the hash of every *full* block of `text` to `out`.
pub fn text_block_hashes(text: &str, block_size: u32, seed: u64, out: &mut Vec<u64>) {
    let block_bytes = block_size as usize * BYTES_PER_TOKEN;
    if block_bytes == 0 {
        return;
    }
    let mut prev = seed;
    for chunk in text.as_bytes().chunks_exact(block_bytes) {
        prev = xxh64(chunk, prev);
        out.push(prev);
    }
}

/// Appends the hash of every *full* block of token ids `ids` to `out`: a chain as
/// [`text_block_hashes`], over each block's ids as little-endian bytes.
pub fn ids_block_hashes(ids: &[u32], block_size: u32, seed: u64, out: &mut Vec<u64>) {
    if block_size == 0 {
        return;
    }
    let mut prev = seed;
    let mut bytes = Vec::with_capacity(block_size as usize * 4);
    for block in ids.chunks_exact(block_size as usize) {
        bytes.clear();
        bytes.extend(block.iter().flat_map(|id| id.to_le_bytes()));
        prev = xxh64(&bytes, prev);
        out.push(prev);
    }
}

/// Appends the hashes an engine caches `prompt`'s blocks under, in order: every full block of a
/// text prompt ([`text_block_hashes`]) or of a tokenized one ([`ids_block_hashes`]); the shared full blocks of a synthetic one (its unique rest
/// can never match another request, so it is never looked up).
pub fn prompt_block_hashes(prompt: &Prompt, block_size: u32, seed: u64, out: &mut Vec<u64>) {
    match prompt {
        Prompt::Text(text) => text_block_hashes(text, block_size, seed, out),
        Prompt::Ids(ids) => ids_block_hashes(ids, block_size, seed, out),
        Prompt::Tokens {
            tokens,
            prefix_group,
            prefix_tokens,
        } => {
            let shared = (*prefix_tokens).min(*tokens) / block_size.max(1);
            out.extend((0..shared).map(|i| synthetic_block_hash(seed, *prefix_group, i, true)));
        }
    }
}

/// Hash of block `index` of a synthetic prompt: shared blocks depend on the group only, the others
/// on `unique` (a per-request value), so they never match another request's.
pub fn synthetic_block_hash(seed: u64, group_or_unique: u64, index: u32, shared: bool) -> u64 {
    let tag: u64 = if shared {
        0x5348_0000_0000_0000
    } else {
        0x554e_0000_0000_0000
    };
    let mut z = seed
        ^ splitmix(group_or_unique ^ tag)
        ^ u64::from(index).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = splitmix(z);
    // 0 is reserved for "no hash"
    z.max(1)
}

/// SplitMix64's finaliser: a cheap, well-mixed 64-bit permutation.
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_round_up() {
        assert_eq!(count_tokens(""), 1);
        assert_eq!(count_tokens("abcd"), 1);
        assert_eq!(count_tokens("abcde"), 2);
    }

    #[test]
    fn ids_round_trip_and_match_the_charged_count() {
        for text in [
            "",
            "a",
            "abcd",
            "abcde",
            "héllo wörld, ünïcode ✓ 日本語",
            "x\u{0}y",
        ] {
            let mut ids = Vec::new();
            token_ids(text, &mut ids);
            assert_eq!(ids.len(), count_tokens(text) as usize, "{text:?}");
            assert_eq!(detokenize(&ids).unwrap(), text);
        }
        let mut ids = Vec::new();
        token_ids("", &mut ids);
        assert_eq!(ids, vec![bos_id()]);
    }

    proptest::proptest! {
        // Seeded: a failure reproduces on every run.
        #![proptest_config(proptest::test_runner::Config {
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x70c5),
            ..proptest::test_runner::Config::default()
        })]

        #[test]
        fn any_text_round_trips_with_the_charged_count(text in "\\PC{0,80}") {
            let mut ids = Vec::new();
            token_ids(&text, &mut ids);
            proptest::prop_assert_eq!(ids.len(), count_tokens(&text) as usize);
            proptest::prop_assert_eq!(detokenize(&ids).unwrap(), text);
        }

        #[test]
        fn any_ids_decode_or_name_the_unknown_one(ids in proptest::collection::vec(proptest::prelude::any::<u32>(), 0..16)) {
            match detokenize(&ids) {
                Ok(_) => proptest::prop_assert!(ids.iter().all(|id| token_bytes(*id).is_some())),
                Err(SimError::UnknownToken(id)) => {
                    proptest::prop_assert!(ids.contains(&id) && token_bytes(id).is_none());
                }
                Err(e) => proptest::prop_assert!(false, "unexpected error {e}"),
            }
        }
    }

    #[test]
    fn the_permutation_inverts() {
        for x in (0..=u32::MAX).step_by(65_521).chain([0, 1, u32::MAX]) {
            assert_eq!(unscramble(scramble(x)), x);
        }
    }

    #[test]
    fn ids_no_text_produces_are_unknown() {
        // A piece with a byte UTF-8 never uses, and one with padding before text.
        for raw in [0xC0_61_62_63u32, 0x61_FF_62_63] {
            let id = scramble(raw);
            assert!(token_bytes(id).is_none());
            assert!(matches!(detokenize(&[id]), Err(SimError::UnknownToken(i)) if i == id));
        }
    }

    #[test]
    fn shared_id_prefix_shares_block_hashes_and_counts_every_id() {
        let seed = chain_seed("m");
        let common: Vec<u32> = (0..48).collect();
        let ids = |tail: u32| -> Arc<[u32]> { common.iter().copied().chain([tail; 20]).collect() };
        let (a, b) = (Prompt::Ids(ids(7)), Prompt::Ids(ids(8)));
        assert_eq!(a.token_count(), 68);
        let (mut ha, mut hb) = (Vec::new(), Vec::new());
        prompt_block_hashes(&a, 16, seed, &mut ha);
        prompt_block_hashes(&b, 16, seed, &mut hb);
        // Four full blocks; the last four ids are no block.
        assert_eq!(ha.len(), 4);
        assert_eq!(ha[..3], hb[..3]);
        assert_ne!(ha[3], hb[3]);
        let mut other = Vec::new();
        ids_block_hashes(&common, 16, lora_seed(seed, Some("x")), &mut other);
        assert_ne!(other[0], ha[0], "an adapter's chain is its own");
    }

    #[test]
    fn shared_text_prefix_shares_block_hashes() {
        let seed = chain_seed("m");
        let common = "x".repeat(64 * 3);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        text_block_hashes(&format!("{common}{}", "a".repeat(64)), 16, seed, &mut a);
        text_block_hashes(&format!("{common}{}", "b".repeat(64)), 16, seed, &mut b);
        assert_eq!(a.len(), 4);
        assert_eq!(a[..3], b[..3]);
        assert_ne!(a[3], b[3]);
        let mut other_model = Vec::new();
        text_block_hashes(&common, 16, chain_seed("n"), &mut other_model);
        assert_ne!(other_model[0], a[0]);
    }
}
