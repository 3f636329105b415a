//! A deterministic tokenizer stand-in and the prompt block hashes that prefix caching keys on.
//!
//! Real tokenizers average about four bytes of English per token; the emulator uses exactly
//! [`BYTES_PER_TOKEN`] so that a prompt's text fixes its token count and its block hashes, on every
//! pod and in both clocks. Block hashes are a chain (each block's hash is seeded with the previous
//! one), as in vLLM, so equal hashes mean equal prefixes.

use std::sync::Arc;

use xxhash_rust::xxh64::xxh64;

/// Bytes of prompt text per token.
pub const BYTES_PER_TOKEN: usize = 4;

/// Seed of the first block of every chain; mixed with the model name by [`chain_seed`].
const CHAIN_SEED: u64 = 0x1f6e_7a61_7465_0001;

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
        }
    }
}

/// Number of tokens in `text` (at least one: an empty prompt still has a BOS token).
pub fn count_tokens(text: &str) -> u32 {
    let n = text.len().div_ceil(BYTES_PER_TOKEN).max(1);
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The chain seed of a model: prefix hashes never match across models.
pub fn chain_seed(model: &str) -> u64 {
    xxh64(model.as_bytes(), CHAIN_SEED)
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
