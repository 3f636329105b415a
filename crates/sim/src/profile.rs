//! Performance profiles: one model on one GPU layout, as data.
//!
//! The built-in tables live in `crates/sim/profiles/*.yaml` and are compiled in with
//! `include_str!`; `docs/simulator.md` shows where every number comes from. A profile turns a
//! step's composition into a duration with [`Profile::step_seconds`], the one cost model that both
//! clocks use.

use serde::{Deserialize, Serialize};

use crate::SimError;

/// The built-in profile tables, by file name.
const BUILTIN: [(&str, &str); 4] = [
    (
        "llama-3.1-8b.yaml",
        include_str!("../profiles/llama-3.1-8b.yaml"),
    ),
    ("qwen3-32b.yaml", include_str!("../profiles/qwen3-32b.yaml")),
    (
        "llama-3.1-70b.yaml",
        include_str!("../profiles/llama-3.1-70b.yaml"),
    ),
    (
        "qwen3-235b-a22b.yaml",
        include_str!("../profiles/qwen3-235b-a22b.yaml"),
    ),
];

/// One model served on one GPU layout: capacity and step-cost coefficients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Unique id, `model/gpu-layout`, e.g. `llama-3.1-8b/h100`.
    pub id: String,
    /// Served model name (what `/v1/models` lists and metrics are labelled with).
    pub model: String,
    /// GPU type, for documentation and labels.
    pub gpu: String,
    /// Number of GPUs the model is sharded over.
    pub tensor_parallel: u32,
    /// Weight memory in GB (documentation; capacity is given directly).
    pub weights_gb: f64,
    /// KV-cache bytes per token over the whole pod (after tensor-parallel replication).
    pub kv_bytes_per_token: u64,
    /// KV-cache capacity in tokens; blocks = this / `block_size`.
    pub kv_capacity_tokens: u64,
    /// Tokens per KV block (vLLM's default on GPUs is 16).
    pub block_size: u32,
    /// Most sequences in the running batch.
    pub max_num_seqs: u32,
    /// Token budget of one engine step (chunked prefill splits prompts over steps).
    pub max_num_batched_tokens: u32,
    /// Longest prompt + output a request may have.
    pub max_model_len: u32,
    /// Fixed cost of a step that contains prefill work (ms).
    pub prefill_overhead_ms: f64,
    /// Linear prefill cost per prompt token (µs).
    pub prefill_per_token_us: f64,
    /// Attention cost per (query token, context token) pair during prefill (ps): the quadratic term.
    pub prefill_pair_ps: f64,
    /// Fixed cost of a step that decodes at least one sequence (ms): one pass over the weights.
    pub decode_base_ms: f64,
    /// Extra decode cost per running sequence (µs).
    pub decode_per_seq_us: f64,
    /// Decode cost per KiB of KV cache read by the decoding sequences (ns).
    pub decode_per_kib_ns: f64,
    /// Time to load a non-resident LoRA adapter; it stalls the step that loads it (ms).
    pub lora_load_ms: f64,
    /// Resident LoRA adapter slots (vLLM `--max-loras`).
    pub max_loras: u32,
}

/// The work in one engine step, enough to price it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepShape {
    /// Prompt tokens computed in this step.
    pub prefill_tokens: u64,
    /// Σ over prefill chunks of chunk × (start offset + (chunk + 1) / 2): attention pairs.
    pub prefill_pairs: f64,
    /// Sequences producing a token by decoding in this step.
    pub decode_seqs: u64,
    /// Context tokens (KV) the decoding sequences read.
    pub decode_kv_tokens: u64,
    /// LoRA adapters loaded before this step.
    pub lora_loads: u32,
}

impl Profile {
    /// The server's GPUs as a label: `GPU` alone, `NxGPU` when sharded over N with tensor
    /// parallelism (what `infergate.dev/gpu` and an endpoint's `gpu` carry).
    pub fn gpu_label(&self) -> String {
        if self.tensor_parallel > 1 {
            format!("{}x{}", self.tensor_parallel, self.gpu)
        } else {
            self.gpu.clone()
        }
    }

    /// Number of KV blocks.
    pub fn num_blocks(&self) -> u64 {
        self.kv_capacity_tokens / u64::from(self.block_size.max(1))
    }

    /// KiB of KV per token.
    pub fn kv_kib_per_token(&self) -> f64 {
        self.kv_bytes_per_token as f64 / 1024.0
    }

    /// Duration of a step of the given shape, in seconds.
    pub fn step_seconds(&self, s: &StepShape) -> f64 {
        let mut t = 0.0;
        if s.prefill_tokens > 0 {
            t += self.prefill_overhead_ms * 1e-3
                + s.prefill_tokens as f64 * self.prefill_per_token_us * 1e-6
                + s.prefill_pairs * self.prefill_pair_ps * 1e-12;
        }
        if s.decode_seqs > 0 {
            t += self.decode_base_ms * 1e-3
                + s.decode_seqs as f64 * self.decode_per_seq_us * 1e-6
                + s.decode_kv_tokens as f64
                    * self.kv_kib_per_token()
                    * self.decode_per_kib_ns
                    * 1e-9;
        }
        t + f64::from(s.lora_loads) * self.lora_load_ms * 1e-3
    }

    /// Nominal time to first token of a lone request with an uncached prompt (s): one or more
    /// prefill steps, the last of which yields the first token.
    pub fn nominal_ttft(&self, prompt_tokens: u64) -> f64 {
        let mut t = 0.0;
        let mut done = 0u64;
        let budget = u64::from(self.max_num_batched_tokens.max(1));
        while done < prompt_tokens {
            let chunk = budget.min(prompt_tokens - done);
            t += self.step_seconds(&StepShape {
                prefill_tokens: chunk,
                prefill_pairs: pairs(done, chunk),
                ..StepShape::default()
            });
            done += chunk;
        }
        t
    }

    /// Checks that the numbers can drive a simulation.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |reason: &str| {
            Err(SimError::ProfileInvalid {
                id: self.id.clone(),
                reason: reason.to_owned(),
            })
        };
        if self.block_size == 0 || self.num_blocks() < 2 {
            return bad("block_size must be > 0 and the cache must hold at least two blocks");
        }
        if self.max_num_seqs == 0 || self.max_num_batched_tokens == 0 {
            return bad("max_num_seqs and max_num_batched_tokens must be > 0");
        }
        let costs = [
            self.prefill_overhead_ms,
            self.prefill_per_token_us,
            self.prefill_pair_ps,
            self.decode_base_ms,
            self.decode_per_seq_us,
            self.decode_per_kib_ns,
            self.lora_load_ms,
        ];
        if costs.iter().any(|c| !c.is_finite() || *c < 0.0) {
            return bad("costs must be finite and not negative");
        }
        if self.decode_base_ms <= 0.0 || self.prefill_per_token_us <= 0.0 {
            return bad("decode_base_ms and prefill_per_token_us must be > 0");
        }
        Ok(())
    }
}

/// Attention pairs of a prefill chunk of `chunk` tokens starting at `offset`.
pub fn pairs(offset: u64, chunk: u64) -> f64 {
    chunk as f64 * (offset as f64 + (chunk as f64 + 1.0) / 2.0)
}

/// A set of profiles, looked up by id.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    profiles: Vec<Profile>,
}

impl Catalog {
    /// The built-in profiles.
    pub fn builtin() -> Result<Self, SimError> {
        let mut catalog = Catalog::default();
        for (name, text) in BUILTIN {
            catalog.add_yaml(name, text)?;
        }
        Ok(catalog)
    }

    /// Adds (or replaces, by id) the profiles of a YAML list.
    pub fn add_yaml(&mut self, name: &str, text: &str) -> Result<(), SimError> {
        let list: Vec<Profile> =
            serde_yaml::from_str(text).map_err(|source| SimError::ProfileYaml {
                name: name.to_owned(),
                source,
            })?;
        for p in list {
            p.validate()?;
            self.profiles.retain(|q| q.id != p.id);
            self.profiles.push(p);
        }
        Ok(())
    }

    /// Looks a profile up by id.
    pub fn get(&self, id: &str) -> Result<&Profile, SimError> {
        self.profiles.iter().find(|p| p.id == id).ok_or_else(|| {
            let known: Vec<&str> = self.profiles.iter().map(|p| p.id.as_str()).collect();
            SimError::UnknownProfile(id.to_owned(), known.join(", "))
        })
    }

    /// All profiles.
    pub fn all(&self) -> &[Profile] {
        &self.profiles
    }
}
