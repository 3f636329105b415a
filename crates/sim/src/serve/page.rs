//! `/metrics` pages in each engine's real names, types and label sets.
//!
//! The vLLM page follows a real vLLM 0.32 page family by family (the fixture pages in the shared
//! reference folder): `engine="0"` and `model_name=<base model>` labels on every engine series,
//! a `_created` gauge beside every counter and histogram, `lora_requests_info` keeping one series
//! per state seen (value = last time seen; empty labels when idle; `waiting_lora_adapters` listing
//! every adapter with any request), `cache_config_info` with `block_size` and `num_gpu_blocks`,
//! and the Python process and HTTP families around them.

use std::fmt::Write;

use crate::Profile;
use crate::engine::{EngineView, Histograms, Stats};
use crate::histogram::Histogram;

/// Everything a page is rendered from.
#[derive(Debug, Clone)]
pub struct PageInput<'a> {
    /// Served (base) model name.
    pub model: &'a str,
    /// The pod's profile.
    pub profile: &'a Profile,
    /// Engine view now.
    pub view: &'a EngineView,
    /// Counters and histograms.
    pub stats: &'a Stats,
    /// Unix time the pod started (s).
    pub start_unix: f64,
    /// Unix time now (s).
    pub now_unix: f64,
    /// vLLM `lora_requests_info` series seen so far: (running, waiting, last seen unix time).
    pub lora_series: &'a [(String, String, f64)],
    /// HTTP requests per (handler, status class).
    pub http: &'a [(&'static str, &'static str, u64)],
}

fn num(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    let s = format!("{v:?}");
    s
}

struct W {
    out: String,
}

impl W {
    fn head(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
    fn sample(&mut self, name: &str, labels: &str, v: f64) {
        if labels.is_empty() {
            let _ = writeln!(self.out, "{name} {}", num(v));
        } else {
            let _ = writeln!(self.out, "{name}{{{labels}}} {}", num(v));
        }
    }
    /// A counter the way prometheus_client (Python) writes it: `_total` plus a `_created` gauge.
    fn counter(&mut self, base: &str, help: &str, series: &[(String, f64)], created: f64) {
        self.head(&format!("{base}_total"), help, "counter");
        for (l, v) in series {
            self.sample(&format!("{base}_total"), l, *v);
        }
        self.head(&format!("{base}_created"), help, "gauge");
        for (l, _) in series {
            self.sample(&format!("{base}_created"), l, created);
        }
    }
    fn gauge(&mut self, name: &str, help: &str, series: &[(String, f64)]) {
        self.head(name, help, "gauge");
        for (l, v) in series {
            self.sample(name, l, *v);
        }
    }
    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &str,
        h: &Histogram,
        created: Option<f64>,
    ) {
        self.head(name, help, "histogram");
        let sep = if labels.is_empty() { "" } else { "," };
        let bounds = h
            .bounds()
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY));
        for (b, c) in bounds.zip(h.cumulative()) {
            let _ = writeln!(
                self.out,
                "{name}_bucket{{{labels}{sep}le=\"{}\"}} {}",
                num(b),
                num(c as f64)
            );
        }
        self.sample(&format!("{name}_count"), labels, h.count() as f64);
        self.sample(&format!("{name}_sum"), labels, h.sum());
        if let Some(c) = created {
            self.head(&format!("{name}_created"), help, "gauge");
            self.sample(&format!("{name}_created"), labels, c);
        }
    }
}

fn one(labels: &str, v: f64) -> Vec<(String, f64)> {
    vec![(labels.to_owned(), v)]
}

fn empty_histograms() -> Histograms {
    // Pages need histograms even when the engine was built without them.
    crate::engine::Histograms::empty()
}

/// vLLM 0.32's page.
pub fn vllm(p: &PageInput<'_>) -> String {
    let mut w = W {
        out: String::with_capacity(48 * 1024),
    };
    let s = p.stats;
    let v = p.view;
    let owned;
    let h: &Histograms = match &s.histograms {
        Some(h) => h,
        None => {
            owned = empty_histograms();
            &owned
        }
    };
    let created = p.start_unix;
    let l = format!("engine=\"0\",model_name=\"{}\"", p.model);
    let lr = |k: &str, val: &str| format!("engine=\"0\",model_name=\"{}\",{k}=\"{val}\"", p.model);

    // Python process collectors, as every prometheus_client page has them.
    let generations: Vec<(String, f64)> = (0..3)
        .map(|g| (format!("generation=\"{g}\""), 0.0))
        .collect();
    for (name, help) in [
        ("python_gc_objects_collected", "Objects collected during gc"),
        (
            "python_gc_objects_uncollectable",
            "Uncollectable objects found during GC",
        ),
        (
            "python_gc_collections",
            "Number of times this generation was collected",
        ),
    ] {
        w.counter(name, help, &generations, created);
        trim_created(&mut w, name);
    }
    w.gauge("python_info", "Python platform information",
        &one("implementation=\"CPython\",major=\"3\",minor=\"12\",patchlevel=\"0\",version=\"3.12.0\"", 1.0));
    w.gauge(
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
        &one("", 4.8e9),
    );
    w.gauge(
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
        &one("", 1.1e9),
    );
    w.gauge(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        &one("", p.start_unix),
    );
    w.head(
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        "counter",
    );
    w.sample(
        "process_cpu_seconds_total",
        "",
        (p.now_unix - p.start_unix).max(0.0) * 0.1,
    );
    w.gauge(
        "process_open_fds",
        "Number of open file descriptors.",
        &one("", 46.0),
    );
    w.gauge(
        "process_max_fds",
        "Maximum number of open file descriptors.",
        &one("", 1_048_576.0),
    );

    let mfu = "(for Model Flops Utilization calculations).";
    w.counter(
        "vllm:estimated_flops_per_gpu",
        &format!("Estimated number of floating point operations per GPU {mfu}"),
        &one(&l, 0.0),
        created,
    );
    w.counter(
        "vllm:estimated_read_bytes_per_gpu",
        &format!("Estimated number of bytes read from memory per GPU {mfu}"),
        &one(&l, 0.0),
        created,
    );
    w.counter(
        "vllm:estimated_write_bytes_per_gpu",
        &format!("Estimated number of bytes written to memory per GPU {mfu}"),
        &one(&l, 0.0),
        created,
    );
    w.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        &one(&l, f64::from(v.running)),
    );
    w.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        &one(&l, f64::from(v.waiting)),
    );
    w.gauge("vllm:num_requests_waiting_by_reason", "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
        &[(lr("reason", "capacity"), f64::from(v.waiting)), (lr("reason", "deferred"), 0.0)]);
    w.gauge("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        &[(lr("sleep_state", "awake"), 1.0), (lr("sleep_state", "weights_offloaded"), 0.0), (lr("sleep_state", "discard_all"), 0.0)]);
    w.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        &one(&l, v.kv_usage),
    );
    w.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        &one(&l, v.prefix_queries as f64),
        created,
    );
    w.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        &one(&l, v.prefix_hits as f64),
        created,
    );
    w.counter("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.", &one(&l, 0.0), created);
    w.counter("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.", &one(&l, 0.0), created);
    w.counter(
        "vllm:mm_cache_queries",
        "Multi-modal cache queries, in terms of number of queried items.",
        &one(&l, 0.0),
        created,
    );
    w.counter(
        "vllm:mm_cache_hits",
        "Multi-modal cache hits, in terms of number of cached items.",
        &one(&l, 0.0),
        created,
    );
    w.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        &one(&l, s.preemptions as f64),
        created,
    );
    let prompt_total = (s.prompt_tokens_computed + s.prompt_tokens_cached) as f64;
    w.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        &one(&l, prompt_total),
        created,
    );
    w.counter(
        "vllm:prompt_tokens_by_source",
        "Number of prompt tokens by source.",
        &[
            (
                lr("source", "local_compute"),
                s.prompt_tokens_computed as f64,
            ),
            (
                lr("source", "local_cache_hit"),
                s.prompt_tokens_cached as f64,
            ),
            (lr("source", "external_kv_transfer"), 0.0),
        ],
        created,
    );
    w.counter(
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        &one(&l, s.prompt_tokens_cached as f64),
        created,
    );
    w.counter("vllm:prompt_tokens_cached_by_source", "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.", &[
        (lr("source", "device"), s.prompt_tokens_cached as f64),
        (lr("source", "host"), 0.0),
        (lr("source", "p2p"), 0.0),
        (lr("source", "disk"), 0.0),
        (lr("source", "external_unspecified"), 0.0),
    ], created);
    w.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        &one(&l, s.generation_tokens as f64),
        created,
    );
    let lf = |r: &str| {
        format!(
            "engine=\"0\",finished_reason=\"{r}\",model_name=\"{}\"",
            p.model
        )
    };
    w.counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        &[
            (lf("stop"), 0.0),
            (lf("length"), s.requests_finished as f64),
            (lf("abort"), s.requests_aborted as f64),
            (lf("error"), 0.0),
            (lf("repetition"), 0.0),
        ],
        created,
    );
    let la = |r: &str| format!("model_name=\"{}\",reason=\"{r}\"", p.model);
    w.counter(
        "vllm:admission_rejections",
        "Number of admission attempts rejected by a queue limit, by reason.",
        &[
            (la("max_num_queued_reqs"), 0.0),
            (la("max_num_queued_tokens"), 0.0),
        ],
        created,
    );
    let hist = |w: &mut W, name: &str, help: &str, hh: &Histogram| {
        w.histogram(name, help, &l, hh, Some(created))
    };
    hist(
        &mut w,
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        &h.prompt_tokens,
    );
    hist(
        &mut w,
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        &h.generation_tokens,
    );
    hist(
        &mut w,
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        &h.iteration_tokens,
    );
    hist(
        &mut w,
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        &h.max_tokens,
    );
    hist(
        &mut w,
        "vllm:request_params_n",
        "Histogram of the n request parameter.",
        &h.params_n,
    );
    hist(
        &mut w,
        "vllm:request_params_max_tokens",
        "Histogram of the max_tokens request parameter.",
        &h.max_tokens,
    );
    hist(
        &mut w,
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &h.ttft,
    );
    hist(
        &mut w,
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &h.itl,
    );
    hist(
        &mut w,
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        &h.tpot,
    );
    hist(
        &mut w,
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &h.e2e,
    );
    hist(
        &mut w,
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        &h.queue,
    );
    hist(
        &mut w,
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        &h.inference,
    );
    hist(
        &mut w,
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        &h.prefill,
    );
    hist(
        &mut w,
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        &h.decode,
    );
    hist(
        &mut w,
        "vllm:request_num_preemptions",
        "Histogram of the number of times a request was preempted.",
        &h.num_preemptions,
    );
    hist(
        &mut w,
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        &h.prefill_kv_computed,
    );

    w.head(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        "gauge",
    );
    for (running, waiting, ts) in p.lora_series {
        w.sample("vllm:lora_requests_info",
            &format!("max_lora=\"{}\",running_lora_adapters=\"{running}\",waiting_lora_adapters=\"{waiting}\"", v.max_loras), *ts);
    }
    let prof = p.profile;
    let tokens = v.num_blocks * u64::from(v.block_size);
    let kv_bytes = tokens * prof.kv_bytes_per_token;
    w.head(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        "gauge",
    );
    w.sample("vllm:cache_config_info", &format!(
        "_block_size_resolved=\"True\",block_size=\"{bs}\",cache_dtype=\"auto\",cache_hit_alignment_tokens=\"None\",effective_attention_block_size=\"{bs}\",enable_mamba_shared_prefix_checkpoint=\"False\",enable_prefix_caching=\"True\",engine=\"0\",gpu_memory_utilization=\"0.9\",hash_block_size=\"None\",is_attention_free=\"False\",kv_cache_dtype_skip_layers=\"[]\",kv_cache_layout=\"None\",kv_cache_max_concurrency=\"{conc:.1}\",kv_cache_memory_bytes=\"{kv_bytes}\",kv_cache_size_tokens=\"{tokens}\",kv_offloading_backend=\"native\",kv_offloading_size=\"None\",kv_sharing_fast_prefill=\"False\",mamba_block_size=\"None\",mamba_cache_dtype=\"auto\",mamba_cache_mode=\"none\",mamba_page_size_padded=\"None\",mamba_ssm_cache_dtype=\"float32\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{nb}\",num_gpu_blocks_override=\"None\",prefix_cache_retention_interval=\"0\",prefix_caching_hash_algo=\"sha256\",prefix_match_unit=\"None\",replayssm_buffer_len=\"16\",skip_page_size_padded=\"None\",sliding_window=\"None\",swa_bounded_replay=\"True\",use_kda_recoverssm=\"False\",use_replayssm=\"False\",user_specified_block_size=\"False\"",
        bs = v.block_size, nb = v.num_blocks, conc = tokens as f64 / f64::from(prof.max_model_len.max(1))), 1.0);

    let hs: Vec<(String, f64)> = p
        .http
        .iter()
        .map(|(handler, status, n)| {
            (
                format!("handler=\"{handler}\",method=\"POST\",status=\"{status}\""),
                *n as f64,
            )
        })
        .collect();
    w.counter(
        "http_requests",
        "Total number of requests by method, status and handler.",
        &hs,
        created,
    );
    w.out
}

/// Drops the `_created` family that [`W::counter`] wrote for `base` (Python's GC collectors have none).
fn trim_created(w: &mut W, base: &str) {
    let marker = format!("# HELP {base}_created");
    if let Some(i) = w.out.rfind(&marker) {
        w.out.truncate(i);
    }
}

/// SGLang's page (names from SGLang's production-metrics reference).
pub fn sglang(p: &PageInput<'_>) -> String {
    let mut w = W {
        out: String::with_capacity(16 * 1024),
    };
    let s = p.stats;
    let v = p.view;
    let owned;
    let h: &Histograms = match &s.histograms {
        Some(h) => h,
        None => {
            owned = empty_histograms();
            &owned
        }
    };
    let l = format!("model_name=\"{}\"", p.model);
    let counter = |w: &mut W, name: &str, help: &str, val: f64| {
        w.head(name, help, "counter");
        w.sample(name, &l, val);
    };
    counter(
        &mut w,
        "sglang:prompt_tokens_total",
        "Number of prefill tokens processed.",
        (s.prompt_tokens_computed + s.prompt_tokens_cached) as f64,
    );
    counter(
        &mut w,
        "sglang:generation_tokens_total",
        "Number of generation tokens processed.",
        s.generation_tokens as f64,
    );
    counter(
        &mut w,
        "sglang:cached_tokens_total",
        "Number of cached prompt tokens.",
        s.prompt_tokens_cached as f64,
    );
    counter(
        &mut w,
        "sglang:num_requests_total",
        "Number of requests processed.",
        s.requests_finished as f64,
    );
    let used_tokens = v.kv_usage * (v.num_blocks * u64::from(v.block_size)) as f64;
    w.gauge(
        "sglang:num_running_reqs",
        "The number of running requests.",
        &one(&l, f64::from(v.running)),
    );
    w.gauge(
        "sglang:num_used_tokens",
        "The number of used tokens.",
        &one(&l, used_tokens.round()),
    );
    w.gauge(
        "sglang:token_usage",
        "The token usage.",
        &one(&l, v.kv_usage),
    );
    w.gauge(
        "sglang:gen_throughput",
        "The generation throughput (token/s).",
        &one(&l, 0.0),
    );
    w.gauge(
        "sglang:num_queue_reqs",
        "The number of requests in the waiting queue.",
        &one(&l, f64::from(v.waiting)),
    );
    let hit_rate = if v.prefix_queries > 0 {
        v.prefix_hits as f64 / v.prefix_queries as f64
    } else {
        0.0
    };
    w.gauge(
        "sglang:cache_hit_rate",
        "The prefix cache hit rate.",
        &one(&l, hit_rate),
    );
    w.histogram(
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &l,
        &h.ttft,
        None,
    );
    w.histogram(
        "sglang:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &l,
        &h.itl,
        None,
    );
    w.histogram(
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds.",
        &l,
        &h.e2e,
        None,
    );
    w.out
}

/// TGI's page (names from TGI's metrics reference; no model label, no KV-cache gauge).
pub fn tgi(p: &PageInput<'_>) -> String {
    let mut w = W {
        out: String::with_capacity(16 * 1024),
    };
    let s = p.stats;
    let v = p.view;
    let owned;
    let h: &Histograms = match &s.histograms {
        Some(h) => h,
        None => {
            owned = empty_histograms();
            &owned
        }
    };
    w.gauge(
        "tgi_queue_size",
        "Current queue size",
        &one("", f64::from(v.waiting)),
    );
    w.gauge(
        "tgi_batch_current_size",
        "Current batch size",
        &one("", f64::from(v.running)),
    );
    let used_tokens = v.kv_usage * (v.num_blocks * u64::from(v.block_size)) as f64;
    w.gauge(
        "tgi_batch_current_max_tokens",
        "Maximum tokens for the current batch",
        &one("", used_tokens.round()),
    );
    let c = |w: &mut W, name: &str, help: &str, val: f64| {
        w.head(name, help, "counter");
        w.sample(name, "", val);
    };
    let finished = s.requests_finished as f64;
    c(
        &mut w,
        "tgi_request_count",
        "Total number of requests",
        finished + f64::from(v.running) + f64::from(v.waiting),
    );
    c(
        &mut w,
        "tgi_request_success",
        "Number of successful requests",
        finished,
    );
    w.histogram(
        "tgi_request_duration",
        "Total time spent processing the request (e2e latency)",
        "",
        &h.e2e,
        None,
    );
    w.histogram(
        "tgi_request_queue_duration",
        "Time spent in the queue per request",
        "",
        &h.queue,
        None,
    );
    w.histogram(
        "tgi_request_inference_duration",
        "Request inference duration",
        "",
        &h.inference,
        None,
    );
    w.histogram(
        "tgi_request_mean_time_per_token_duration",
        "Mean time per token per request",
        "",
        &h.tpot,
        None,
    );
    w.histogram(
        "tgi_request_input_length",
        "Input token length per request",
        "",
        &h.prompt_tokens,
        None,
    );
    w.histogram(
        "tgi_request_generated_tokens",
        "Generated tokens per request",
        "",
        &h.generation_tokens,
        None,
    );
    w.out
}
