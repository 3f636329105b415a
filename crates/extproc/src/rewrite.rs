//! Model-name rewriting on the response path, chunk by chunk.
//!
//! When the picker rewrites a request's `model` (the client's name → the name the model server
//! serves), responses name the server's model; [`ModelRewriter`] turns `"model":"<served>"` back
//! into `"model":"<requested>"` as chunks pass, whatever the chunk boundaries. It holds back at
//! most one pattern's length minus one byte between chunks.

/// Streaming replacement of one JSON `model` value.
#[derive(Clone, Debug)]
pub struct ModelRewriter {
    from: Vec<u8>,
    to: Vec<u8>,
    carry: Vec<u8>,
}

impl ModelRewriter {
    /// Rewrites `"model":"<served>"` (and `"model": "<served>"`) into the requested name.
    pub fn new(served: &str, requested: &str) -> Self {
        let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
        ModelRewriter {
            from: format!("\"model\":{}", quote(served)).into_bytes(),
            to: format!("\"model\":{}", quote(requested)).into_bytes(),
            carry: Vec::new(),
        }
    }

    /// The rewritten bytes of `chunk` that can be sent now; at `end_of_stream`, everything.
    pub fn feed(&mut self, chunk: &[u8], end_of_stream: bool) -> Vec<u8> {
        let mut data = std::mem::take(&mut self.carry);
        data.extend_from_slice(chunk);
        // Servers write `"model": "x"` as often as `"model":"x"`; normalise that one space.
        let spaced = [&b"\"model\": "[..], &self.from[8..]].concat();
        let mut out = Vec::with_capacity(data.len());
        let mut i = 0;
        while i < data.len() {
            if data[i..].starts_with(&self.from) {
                out.extend_from_slice(&self.to);
                i += self.from.len();
            } else if data[i..].starts_with(&spaced) {
                out.extend_from_slice(&self.to);
                i += spaced.len();
            } else {
                out.push(data[i]);
                i += 1;
            }
        }
        if !end_of_stream {
            // Hold back a tail that could be the start of a match split across chunks.
            let keep = (1..spaced.len())
                .rev()
                .find(|&n| {
                    n <= out.len()
                        && (self.from.starts_with(&out[out.len() - n..])
                            || spaced.starts_with(&out[out.len() - n..]))
                })
                .unwrap_or(0);
            self.carry = out.split_off(out.len() - keep);
        }
        out
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

    #[test]
    fn other_models_and_plain_text_pass_unchanged() {
        let mut r = ModelRewriter::new("a", "b");
        let input = br#"{"model":"ab","text":"\"model\":\"a"}"#;
        assert_eq!(r.feed(input, true), input.to_vec());
    }
}
