//! What the scheduler needs to know about one request, borrowed from the parsed body.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// How important a request is when the pool is saturated.
///
/// Sheddable requests are rejected first, Standard ones only when the pool is overloaded, and
/// Critical ones never while any endpoint remains.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Never shed while capacity remains.
    Critical,
    /// The default: shed only when every candidate is overloaded.
    #[default]
    Standard,
    /// Shed as soon as every candidate is saturated.
    Sheddable,
}

impl Priority {
    /// Lowercase name, as used in configuration, headers and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Standard => "standard",
            Priority::Sheddable => "sheddable",
        }
    }
}

/// One request as the scheduler sees it. Everything is borrowed from the caller's parsed request:
/// building a context copies nothing.
///
/// The prompt is a slice of text segments (for chat requests, each message's role and content in
/// order; for completions, the prompt). The prefix hasher streams across segment boundaries, so the
/// blocks it produces are the same as for the concatenation of the segments.
///
/// ```
/// use infergate_scheduler::{Priority, RequestContext};
/// let prompt = ["system", "You are terse.", "user", "Hello"];
/// let cx = RequestContext::new("llama-3-8b", 12)
///     .with_prompt(&prompt)
///     .with_lora(Some("sql-adapter"))
///     .with_priority(Priority::Sheddable);
/// assert_eq!(cx.model, "llama-3-8b");
/// ```
#[derive(Copy, Clone, Debug)]
#[non_exhaustive]
pub struct RequestContext<'a> {
    /// The target model (the base model name the pool serves).
    pub model: &'a str,
    /// The LoRA adapter the request asks for, if any.
    pub lora_adapter: Option<&'a str>,
    /// The request's `cache_salt`: vLLM shares prefix-cache blocks only between requests with
    /// the same salt, so prefixes are matched under it ([`crate::prefix::request_seed`]).
    pub cache_salt: Option<&'a str>,
    /// Prompt text segments, hashed as if concatenated.
    pub prompt: &'a [&'a str],
    /// Estimated prompt tokens (the shell's estimate; e.g. bytes / 4).
    pub prompt_tokens: u32,
    /// Expected output tokens (`max_tokens` or a typical value); used by in-flight token accounting.
    pub output_tokens: u32,
    /// Importance when the pool is saturated.
    pub priority: Priority,
    /// Only these endpoints may be chosen (Envoy's subset hint). `Some(&[])` admits none.
    pub subset: Option<&'a [SocketAddr]>,
    /// The caller queues requests (flow control): when every candidate is saturated the pick is
    /// [`Rejection::Shed`](crate::Rejection::Shed) whatever the priority, so the request can
    /// wait for headroom instead of being sent to a saturated pod.
    pub queue_when_saturated: bool,
    /// With `queue_when_saturated`: candidates with no prefill ahead (clear) this request must
    /// leave to others (flow control's headroom reservation, [`crate::flow::Headroom`]). It is
    /// not sent to a clear candidate when fewer than this many would be left, nor anywhere
    /// while fewer are clear (at most the candidates minus one are kept); when that leaves no
    /// candidate the pick is [`Rejection::Shed`](crate::Rejection::Shed). 0: no reservation.
    pub reserved_endpoints: u16,
    /// Exact prompt tokens each listed endpoint holds in its KV cache, from the engine's own
    /// KV-cache events (precise prefix routing). A listed endpoint's match replaces the
    /// approximate prefix index's guess for it, a listed 0 included; endpoints not listed (no
    /// event feed) keep the approximate match. `None`: approximate matching only.
    pub cached: Option<&'a [(SocketAddr, u32)]>,
}

impl<'a> RequestContext<'a> {
    /// Output tokens assumed when the caller gives no hint.
    pub const DEFAULT_OUTPUT_TOKENS: u32 = 256;

    /// A Standard-priority request for `model` with an empty prompt and no adapter or subset.
    pub const fn new(model: &'a str, prompt_tokens: u32) -> Self {
        RequestContext {
            model,
            lora_adapter: None,
            cache_salt: None,
            prompt: &[],
            prompt_tokens,
            output_tokens: Self::DEFAULT_OUTPUT_TOKENS,
            priority: Priority::Standard,
            subset: None,
            queue_when_saturated: false,
            reserved_endpoints: 0,
            cached: None,
        }
    }

    /// Sets the prompt segments used for prefix affinity.
    pub const fn with_prompt(mut self, prompt: &'a [&'a str]) -> Self {
        self.prompt = prompt;
        self
    }

    /// Sets the LoRA adapter.
    pub const fn with_lora(mut self, adapter: Option<&'a str>) -> Self {
        self.lora_adapter = adapter;
        self
    }

    /// Sets the `cache_salt` (`None`, or empty: unsalted).
    pub const fn with_cache_salt(mut self, salt: Option<&'a str>) -> Self {
        self.cache_salt = salt;
        self
    }

    /// Sets the priority.
    pub const fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the exact cached prompt tokens per endpoint (see [`RequestContext::cached`]).
    pub const fn with_cached(mut self, cached: Option<&'a [(SocketAddr, u32)]>) -> Self {
        self.cached = cached;
        self
    }

    /// Restricts the pick to these endpoints.
    pub const fn with_subset(mut self, subset: Option<&'a [SocketAddr]>) -> Self {
        self.subset = subset;
        self
    }

    /// Asks for [`Rejection::Shed`](crate::Rejection::Shed) at every priority when every
    /// candidate is saturated (the caller will queue the request).
    pub const fn with_queueing(mut self, queue: bool) -> Self {
        self.queue_when_saturated = queue;
        self
    }

    /// Sets the candidates with no prefill ahead that the pick must leave to others (with
    /// [`RequestContext::with_queueing`]; see [`RequestContext::reserved_endpoints`]).
    pub const fn with_reserved_endpoints(mut self, n: u16) -> Self {
        self.reserved_endpoints = n;
        self
    }

    /// Sets the expected number of output tokens.
    pub const fn with_output_tokens(mut self, output_tokens: u32) -> Self {
        self.output_tokens = output_tokens;
        self
    }
}
