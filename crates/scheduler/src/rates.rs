//! Online learning of each endpoint's prefill and decode speed.
//!
//! Rates are smoothed in log space (a geometric EWMA), so one request that was oddly fast or slow
//! moves the estimate by a bounded factor, and a 5× faster pod is 5× apart in the estimate however
//! noisy the samples. Early samples are averaged with weight 1/n so a new pod converges after a few
//! requests; later ones with weight `rates.minAlpha` so the estimate keeps tracking drift.
//!
//! Until an endpoint has a sample, it is assumed to run at the pool's typical rate: the geometric
//! mean over endpoints that have samples, or the configured prior when none has. That way a pod
//! that has just joined is neither starved (as it would be with a low prior) nor flooded. The
//! typical rate is kept per reference GPU: each sample enters it divided by its endpoint's GPU
//! factor, and an endpoint without samples gets it times its own ([`crate::gpu`]; 1 for an
//! unknown GPU, so a pool without GPU types works as before).

/// The least work, in tokens (the prefill queued ahead at the pick plus the request's own prompt
/// tokens not served from the prefix cache), a first token must have waited for to teach an
/// endpoint's *bulk* prefill rate: its speed on long prompts, what a prompt of hundreds of tokens
/// is extrapolated with (the heartbeat's `estimatedTtftMs`). Below it the time to first token is
/// mostly the server's fixed cost per request (a forward pass, its scheduling step, the HTTP
/// exchange: 35 ms on the emulated A10G, 20 ms on the H100), so `work / ttft` measures that
/// cost: seven-token prompts answered in 40 ms read as 175 tokens/s on an A10G that prefills
/// 4,000. At 256 tokens a sample is within a factor of 1.6 of the emulated rate on both GPUs
/// (A10G 35 + 64 ms, H100 20 + 8 ms). The scorer's rate learns from every sample: each request
/// queued on a pod pays that fixed cost too, and leaving short samples out of it made queues of
/// short requests look cheap (eviction-heavy's TTFT P99 1.14 → 3.61 s, multi-LoRA's 1.28 → 1.99 s
/// on seeds 1–3).
pub(crate) const MIN_PREFILL_SAMPLE_TOKENS: f64 = 256.0;

/// The most work, in tokens, a first token may have waited for to teach an endpoint's fixed cost
/// per request: the time to first token less the work at the endpoint's bulk rate (the prior
/// before there is one). Once the fixed cost is learned, bulk samples are taken without it, so the
/// bulk rate is the pod's speed per token alone (on the emulated A10G, 4,000 tokens/s rather than
/// the 3,100 a 512-token first token in 165 ms reads as) and a short sample less its work at that
/// rate is the fixed cost itself (35 ms there); the first samples, taken against a bulk rate that
/// still held some of it, err low by at most the work's share (64 tokens: 4 ms). The heartbeat
/// adds it to each request's prefill (its `fixedCostMs`): what a router adds to a short request's
/// estimate, which the rate alone puts at a few milliseconds.
pub(crate) const MAX_FIXED_COST_SAMPLE_TOKENS: f64 = 64.0;

/// The least fixed cost a sample teaches, seconds: a geometric mean needs a positive value.
pub(crate) const MIN_FIXED_COST_SECS: f64 = 1e-4;

/// The least share of a long prompt's time to first token taken as its prefill once the fixed
/// cost is subtracted: a fixed cost learned under load must not make a bulk sample infinitely
/// fast.
pub(crate) const MIN_PREFILL_SHARE: f64 = 0.1;

/// A geometric EWMA of a positive rate.
#[derive(Copy, Clone, Debug, Default)]
pub(crate) struct LogEwma {
    ln: f64,
    /// `exp(ln)` and its inverse, cached: the pick reads them for every candidate.
    rate: f64,
    inv: f64,
    samples: u32,
}

impl LogEwma {
    pub(crate) fn get(&self) -> Option<f64> {
        (self.samples > 0).then_some(self.rate)
    }

    pub(crate) fn inv(&self) -> Option<f64> {
        (self.samples > 0).then_some(self.inv)
    }

    pub(crate) fn ln(&self) -> Option<f64> {
        (self.samples > 0).then_some(self.ln)
    }

    /// Back to no samples (the cold-start prior applies again).
    pub(crate) fn reset(&mut self) {
        *self = LogEwma::default();
    }

    pub(crate) fn samples(&self) -> u32 {
        self.samples
    }

    /// Adds a sample; returns the previous log value (if any) and the new one.
    pub(crate) fn update(&mut self, rate: f64, min_alpha: f64) -> (Option<f64>, f64) {
        let before = self.ln();
        let x = rate.max(1e-9).ln();
        self.samples = self.samples.saturating_add(1);
        let alpha = (1.0 / f64::from(self.samples)).max(min_alpha);
        self.ln = if before.is_some() {
            self.ln + alpha * (x - self.ln)
        } else {
            x
        };
        self.rate = self.ln.exp();
        self.inv = 1.0 / self.rate;
        (before, self.ln)
    }
}

/// Pool-wide aggregates used as priors and as typical request sizes.
#[derive(Copy, Clone, Debug)]
pub(crate) struct PoolRates {
    prefill_ln_sum: f64,
    prefill_n: u32,
    decode_ln_sum: f64,
    decode_n: u32,
    prior_prefill: f64,
    prior_decode: f64,
    /// EWMA of estimated prompt tokens per request.
    pub(crate) mean_prompt: f64,
    /// EWMA of reported output tokens per request.
    pub(crate) mean_output: f64,
}

impl PoolRates {
    pub(crate) fn new(prior_prefill: f64, prior_decode: f64) -> Self {
        PoolRates {
            prefill_ln_sum: 0.0,
            prefill_n: 0,
            decode_ln_sum: 0.0,
            decode_n: 0,
            prior_prefill,
            prior_decode,
            mean_prompt: 512.0,
            mean_output: 256.0,
        }
    }

    pub(crate) fn prefill_prior(&self) -> f64 {
        if self.prefill_n == 0 {
            self.prior_prefill
        } else {
            (self.prefill_ln_sum / f64::from(self.prefill_n)).exp()
        }
    }

    pub(crate) fn decode_prior(&self) -> f64 {
        if self.decode_n == 0 {
            self.prior_decode
        } else {
            (self.decode_ln_sum / f64::from(self.decode_n)).exp()
        }
    }

    pub(crate) fn prefill_changed(&mut self, before: Option<f64>, after: f64) {
        Self::changed(&mut self.prefill_ln_sum, &mut self.prefill_n, before, after);
    }

    pub(crate) fn decode_changed(&mut self, before: Option<f64>, after: f64) {
        Self::changed(&mut self.decode_ln_sum, &mut self.decode_n, before, after);
    }

    pub(crate) fn forget(&mut self, prefill: Option<f64>, decode: Option<f64>) {
        if let Some(p) = prefill {
            self.prefill_ln_sum -= p;
            self.prefill_n = self.prefill_n.saturating_sub(1);
        }
        if let Some(d) = decode {
            self.decode_ln_sum -= d;
            self.decode_n = self.decode_n.saturating_sub(1);
        }
        if self.prefill_n == 0 {
            self.prefill_ln_sum = 0.0;
        }
        if self.decode_n == 0 {
            self.decode_ln_sum = 0.0;
        }
    }

    fn changed(sum: &mut f64, n: &mut u32, before: Option<f64>, after: f64) {
        match before {
            Some(b) => *sum += after - b,
            None => {
                *sum += after;
                *n += 1;
            }
        }
    }

    pub(crate) fn observe_prompt(&mut self, tokens: u32) {
        self.mean_prompt += 0.02 * (f64::from(tokens) - self.mean_prompt);
    }

    pub(crate) fn observe_output(&mut self, tokens: u32) {
        self.mean_output += 0.02 * (f64::from(tokens) - self.mean_output);
    }
}
