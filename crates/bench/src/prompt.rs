//! Live requests' prompts sized in the model's own tokens (`infergate bench --mode live
//! --tokenizer DIR`).
//!
//! Without a tokenizer a live prompt is [`workload::prompt_text`]: `prompt_tokens × 4` bytes,
//! exact for the emulator's stand-in tokenizer (4 bytes a token) and nothing else — a real
//! tokenizer reads its runs of filler letters as far fewer tokens. With the model's tokenizer
//! ([`ModelPrompts`]) a prompt is built from words that are one token each in that tokenizer
//! (a space, then letters: a pre-token of its own in byte-level BPE and SentencePiece
//! vocabularies alike, so that a word's token does not depend on its neighbours), one word per
//! token: the arrival's `prompt_tokens` are the prompt's tokens, and its shared prefix the
//! first `prefix_tokens` of them, as the model counts them (but for a SentencePiece normalizer
//! that marks the start of a text, which may make the first word two tokens). The emulated pods are served with
//! the same tokenizer ([`crate::live`]), so they charge and cache those ids as vLLM would.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use infergate_tokenizer::{ModelTokenizer, Options};

use crate::BenchError;
use crate::workload::{self, Arrival};

/// Words looked for in the vocabulary, at most: enough that two requests' unique parts differ.
const MAX_WORDS: usize = 1024;

/// How a live run's prompts are made and counted: the model's tokenizer and the one-token
/// words prompts are built from.
#[derive(Debug)]
pub struct ModelPrompts {
    tokenizer: Arc<ModelTokenizer>,
    dir: PathBuf,
    words: Vec<String>,
}

impl ModelPrompts {
    /// Loads the tokenizer directory `dir` (the format of the gateway's
    /// `precisePrefix.tokenizer` and of `infergate sim --tokenizer`: `tokenizer.json`, and
    /// `tokenizer_config.json` and `chat_template.jinja` where present) with
    /// [`ModelTokenizer::from_dir`].
    pub fn load(dir: &Path) -> Result<Self, BenchError> {
        let tokenizer = ModelTokenizer::from_dir(dir, Options::default()).map_err(|source| {
            BenchError::Tokenizer {
                dir: dir.to_owned(),
                source,
            }
        })?;
        Self::new(Arc::new(tokenizer), dir)
    }

    /// Prompts for `tokenizer`, loaded from `dir` (named in errors and in the report). Refused
    /// when the tokenizer has no chat template (live runs send chat requests, which a pod
    /// serving with it could not render) or no one-token words to build prompts from.
    pub fn new(tokenizer: Arc<ModelTokenizer>, dir: &Path) -> Result<Self, BenchError> {
        let unfit = |why: &'static str| BenchError::TokenizerUnfit {
            dir: dir.to_owned(),
            why,
        };
        if !tokenizer.has_chat_template() {
            return Err(unfit(
                "has no chat template, and live runs send chat requests (add chat_template.jinja, or a chat_template in tokenizer_config.json)",
            ));
        }
        let words = one_token_words(&tokenizer);
        if words.is_empty() {
            return Err(unfit(
                "has no token that is a space and letters (Ġword, ▁word), to build prompts from",
            ));
        }
        Ok(ModelPrompts {
            tokenizer,
            dir: dir.to_owned(),
            words,
        })
    }

    /// The tokenizer, for the pods to serve with.
    pub fn tokenizer(&self) -> &Arc<ModelTokenizer> {
        &self.tokenizer
    }

    /// The directory it was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The prompt of arrival `a`: `prompt_tokens` words, one token each, the first
    /// `prefix_tokens` of them its prefix group's (the same for every request of the group), the
    /// rest its own.
    pub fn text(&self, a: &Arrival) -> Arc<str> {
        let shared = a.prefix_tokens.min(a.prompt_tokens);
        let mut s = String::new();
        if let Some(g) = a.prefix_group {
            self.push_words(&mut s, (1 << 32) | u64::from(g), shared);
        }
        let own = a.prompt_tokens - if a.prefix_group.is_some() { shared } else { 0 };
        self.push_words(&mut s, (2 << 32) ^ a.id.rotate_left(17), own);
        s.into()
    }

    /// The tokens of `text` as the model counts a prompt's text (no special tokens).
    pub fn count(&self, text: &str) -> Result<u32, BenchError> {
        let mut ids = Vec::new();
        self.tokenizer
            .encode_completion(text, false, &mut ids)
            .map_err(|source| BenchError::Tokenizer {
                dir: self.dir.clone(),
                source,
            })?;
        Ok(u32::try_from(ids.len()).unwrap_or(u32::MAX))
    }

    /// Appends `n` words chosen by `key` (seeded, so a group's prefix is the same every time).
    fn push_words(&self, s: &mut String, key: u64, n: u32) {
        let mut state = key;
        for _ in 0..n {
            let r = splitmix64(&mut state);
            s.push_str(&self.words[(r % self.words.len() as u64) as usize]);
        }
    }
}

/// The prompt of arrival `a` for a live run: the model's words with `prompts`, the stand-in's
/// bytes without.
pub fn text(prompts: Option<&ModelPrompts>, a: &Arrival) -> Arc<str> {
    match prompts {
        Some(p) => p.text(a),
        None => workload::prompt_text(a),
    }
}

/// The vocabulary's word-start tokens (`Ġword` in byte-level BPE, `▁word` in SentencePiece
/// vocabularies: a space and at least two ASCII letters) that the tokenizer gives back alone for
/// the space and letters after other text, in id order, at most [`MAX_WORDS`]. Checked after a
/// word rather than alone: a SentencePiece normalizer marks the start of a text with a space of
/// its own, which no word of a prompt but the first meets.
fn one_token_words(tok: &ModelTokenizer) -> Vec<String> {
    const ANCHOR: &str = "x";
    let mut anchor = Vec::new();
    if tok.encode_completion(ANCHOR, false, &mut anchor).is_err() {
        return Vec::new();
    }
    let mut words = Vec::new();
    let mut ids = Vec::new();
    for id in 0..u32::try_from(tok.vocab_size()).unwrap_or(u32::MAX) {
        let Some(piece) = tok.token_str(id) else {
            continue;
        };
        let Some(letters) = piece.strip_prefix('Ġ').or_else(|| piece.strip_prefix('▁')) else {
            continue;
        };
        if letters.len() < 2 || !letters.bytes().all(|b| b.is_ascii_alphabetic()) {
            continue;
        }
        let word = format!(" {letters}");
        let after = format!("{ANCHOR}{word}");
        if tok.encode_completion(&after, false, &mut ids).is_ok()
            && ids.len() == anchor.len() + 1
            && ids.starts_with(&anchor)
            && ids.last() == Some(&id)
        {
            words.push(word);
            if words.len() == MAX_WORDS {
                break;
            }
        }
    }
    words
}

/// SplitMix64: a fast, well-mixed sequence from any seed.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use infergate_scheduler::Priority;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tokenizer/tests/fixtures")
            .join(name)
    }

    fn arrival(id: u64, prompt_tokens: u32, group: Option<(u32, u32)>) -> Arrival {
        Arrival {
            id,
            at: 0.0,
            prompt_tokens,
            prefix_group: group.map(|g| g.0),
            prefix_tokens: group.map_or(0, |g| g.1),
            output_tokens: 4,
            lora: None,
            priority: Priority::default(),
            tenant: 0,
        }
    }

    /// With the tiny tokenizer a prompt has exactly the arrival's tokens, and its group's
    /// prefix exactly the prefix's; the stand-in's text of the same arrival is another count
    /// altogether in the model's tokens.
    #[test]
    fn prompts_have_the_arrivals_tokens_in_the_models_tokenizer() {
        let p = ModelPrompts::load(&fixture("tiny")).unwrap();
        for (id, tokens, group) in [
            (0, 1, None),
            (1, 300, None),
            (2, 300, Some((7, 120))),
            (3, 500, Some((7, 120))),
            (4, 50, Some((7, 120))),
        ] {
            let a = arrival(id, tokens, group);
            let text = p.text(&a);
            assert_eq!(p.count(&text).unwrap(), tokens, "{id}");
            let standin = workload::prompt_text(&a);
            assert_ne!(p.count(&standin).unwrap(), tokens, "{id}: {standin}");
        }
        // Requests of one group share the prefix's text, and only that.
        let (a, b) = (
            p.text(&arrival(2, 300, Some((7, 120)))),
            p.text(&arrival(3, 500, Some((7, 120)))),
        );
        let prefix = p.text(&arrival(9, 120, Some((7, 120))));
        assert!(a.starts_with(&*prefix) && b.starts_with(&*prefix));
        assert_ne!(
            a[prefix.len()..a.len().min(b.len())],
            b[prefix.len()..a.len().min(b.len())]
        );
        assert_ne!(
            p.text(&arrival(5, 300, None)),
            p.text(&arrival(6, 300, None))
        );
    }

    /// A vocabulary laid out as Llama 2's (word-start pieces `▁word`, a normalizer that marks
    /// the start of the text): words are found too, and a prompt has the arrival's tokens, but
    /// for the start marker the first word may carry.
    #[test]
    fn prompts_are_sized_in_a_sentencepiece_vocabulary_too() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sentencepiece");
        let p = ModelPrompts::load(&dir).unwrap();
        assert!(p.words.len() >= 8, "{:?}", p.words);
        for (id, tokens, group) in [(1, 300, None), (2, 300, Some((7, 120)))] {
            let a = arrival(id, tokens, group);
            let n = p.count(&p.text(&a)).unwrap();
            assert!((tokens..=tokens + 1).contains(&n), "{id}: {n} for {tokens}");
        }
    }

    /// A directory that is not a tokenizer is refused naming it; a tokenizer without a chat
    /// template is refused saying why.
    #[test]
    fn a_missing_tokenizer_or_one_without_a_chat_template_is_refused() {
        let missing = fixture("no-such-tokenizer");
        let e = ModelPrompts::load(&missing).unwrap_err().with_causes();
        assert!(e.contains("no-such-tokenizer"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            fixture("tiny/tokenizer.json"),
            dir.path().join("tokenizer.json"),
        )
        .unwrap();
        let e = ModelPrompts::load(dir.path()).unwrap_err().with_causes();
        assert!(e.contains("no chat template"), "{e}");
        std::fs::write(dir.path().join("tokenizer.json"), "{ not json").unwrap();
        let e = ModelPrompts::load(dir.path()).unwrap_err().with_causes();
        assert!(e.contains("tokenizer.json"), "{e}");
    }
}
