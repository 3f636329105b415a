//! Model-name rewriting on the response path, chunk by chunk.
//!
//! When the picker or the gateway rewrites a request's `model` (the client's name → the name the
//! model server serves), responses name the server's model; [`ModelRewriter`] turns
//! `"model":"<served>"` back into `"model":"<requested>"` as chunks pass, whatever the chunk
//! boundaries. It holds back at most one pattern's length minus one byte between chunks.

/// Streaming replacement of one JSON `model` value.
#[derive(Clone, Debug)]
pub struct ModelRewriter {
    from: Vec<u8>,
    /// `from` with one space after the colon.
    spaced: Vec<u8>,
    to: Vec<u8>,
    /// Input not yet scanned: a tail that may be the start of a match ending in the next chunk.
    carry: Vec<u8>,
}

impl ModelRewriter {
    /// Rewrites `"model":"<served>"` (and `"model": "<served>"`) into the requested name.
    pub fn new(served: &str, requested: &str) -> Self {
        let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
        // Servers write `"model": "x"` as often as `"model":"x"`; both are matched.
        ModelRewriter {
            from: format!("\"model\":{}", quote(served)).into_bytes(),
            spaced: format!("\"model\": {}", quote(served)).into_bytes(),
            to: format!("\"model\":{}", quote(requested)).into_bytes(),
            carry: Vec::new(),
        }
    }

    /// The rewritten bytes of `chunk` that can be sent now; at `end_of_stream`, everything.
    ///
    /// What is held back is always unscanned *input* (a tail that could begin a match), never
    /// output: a replacement already made is not scanned again, so the result does not depend on
    /// where the chunks were cut.
    pub fn feed(&mut self, chunk: &[u8], end_of_stream: bool) -> Vec<u8> {
        let mut data = std::mem::take(&mut self.carry);
        data.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(data.len());
        let mut i = 0;
        while i < data.len() {
            let rest = &data[i..];
            if rest.starts_with(&self.from) {
                out.extend_from_slice(&self.to);
                i += self.from.len();
            } else if rest.starts_with(&self.spaced) {
                out.extend_from_slice(&self.to);
                i += self.spaced.len();
            } else if !end_of_stream
                && (self.from.starts_with(rest) || self.spaced.starts_with(rest))
            {
                // A match may start here and end in the next chunk.
                self.carry = rest.to_vec();
                break;
            } else {
                out.push(data[i]);
                i += 1;
            }
        }
        out
    }

    /// Bytes held back for the next chunk (for the fuzz target's bound on it).
    #[cfg(fuzzing)]
    pub fn held_back(&self) -> usize {
        self.carry.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_across_every_chunk_boundary() {
        let input = br#"data: {"id":"1","model":"meta/llama-8b","choices":[]}

data: {"model": "meta/llama-8b","x":"model"}

"#;
        let want = br#"data: {"id":"1","model":"llama","choices":[]}

data: {"model":"llama","x":"model"}

"#;
        for split in 1..input.len() {
            let mut r = ModelRewriter::new("meta/llama-8b", "llama");
            let mut out = r.feed(&input[..split], false);
            out.extend(r.feed(&input[split..], true));
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(want),
                "split at {split}"
            );
        }
        let mut r = ModelRewriter::new("meta/llama-8b", "llama");
        let mut out = Vec::new();
        for b in input.iter() {
            out.extend(r.feed(std::slice::from_ref(b), false));
        }
        out.extend(r.feed(b"", true));
        assert_eq!(out, want);
    }

    /// Found by the `model_rewrite` fuzz target: the rewriter held back the tail of its own
    /// output (the closing quote of a replacement), scanned it again with the next chunk and so
    /// rewrote `"model": "a"` after a rewritten value only when the chunks were cut there.
    #[test]
    fn a_replacement_is_never_scanned_again_whatever_the_cut() {
        let input = br#"{"model":"a"model": "a"}"#;
        let whole = ModelRewriter::new("a", "b").feed(input, true);
        assert_eq!(whole, br#"{"model":"b"model": "a"}"#.to_vec());
        for split in 0..=input.len() {
            let mut r = ModelRewriter::new("a", "b");
            let mut out = r.feed(&input[..split], false);
            assert!(r.carry.len() < r.spaced.len(), "split at {split}");
            out.extend(r.feed(&input[split..], true));
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&whole),
                "split at {split}"
            );
        }
    }

    #[test]
    fn other_models_and_plain_text_pass_unchanged() {
        let mut r = ModelRewriter::new("a", "b");
        let input = br#"{"model":"ab","text":"\"model\":\"a"}"#;
        assert_eq!(r.feed(input, true), input.to_vec());
    }
}
