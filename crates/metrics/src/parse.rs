//! Turning one engine's `/metrics` page into a [`MetricsSnapshot`].
//!
//! [`parse_page`] is pure: engine, page bytes, the previous counters (for rates) and the sample time
//! in; a snapshot and the new counters, or a typed [`ParseError`], out. It reads only the families
//! listed in [`families`]: the sample lines of any other family are jumped over in one search for
//! the next `#` line, and nothing is allocated except a LoRA adapter list. A family's samples are
//! expected in its own block (after its `# TYPE` line, as every exporter writes them); a sample
//! placed in another family's block is not seen, which can only make a field "not reported".
//!
//! Aggregation when a family has several series (data-parallel engines label each rank):
//! queue and running counts are summed, KV use takes the fullest rank, SGLang's hit rate the mean.

use infergate_scheduler::{CacheConfig, EngineType, LoraState, MetricsSnapshot, Timestamp};

use crate::error::ParseError;

mod text;

/// Prefix-cache counters carried from one scrape of a pod to the next, to turn them into a rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefixCounters {
    /// Cumulative prefix-cache queries (tokens) at the last scrape.
    pub queries: f64,
    /// Cumulative prefix-cache hits (tokens) at the last scrape.
    pub hits: f64,
    /// The hit rate reported at the last scrape, kept while no new queries arrive.
    pub hit_rate: Option<f64>,
}

/// The result of parsing one page.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedPage {
    /// The normalised endpoint state.
    pub snapshot: MetricsSnapshot,
    /// Counters to pass to the next [`parse_page`] call for the same pod (`None` if not reported).
    pub counters: Option<PrefixCounters>,
}

/// The quantity a metric family feeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Waiting,
    Running,
    Kv,
    KvLegacy,
    LoraInfo,
    CacheConfig,
    PrefixQueries,
    PrefixHits,
    PrefixQueriesLegacy,
    PrefixHitsLegacy,
    HitRate,
}

const FIELDS: usize = 11;

impl Field {
    const fn index(self) -> usize {
        self as usize
    }
}

/// One metric family read from an engine's page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Family {
    /// The sample name as it appears on the page.
    pub name: &'static str,
    /// What infergate does with it.
    pub meaning: &'static str,
    field: Field,
}

const fn family(name: &'static str, meaning: &'static str, field: Field) -> Family {
    Family {
        name,
        meaning,
        field,
    }
}

const VLLM: &[Family] = &[
    family(
        "vllm:num_requests_waiting",
        "queue length (required)",
        Field::Waiting,
    ),
    family(
        "vllm:num_requests_running",
        "running batch (required)",
        Field::Running,
    ),
    family(
        "vllm:kv_cache_usage_perc",
        "KV-cache use, fraction 0-1",
        Field::Kv,
    ),
    family(
        "vllm:gpu_cache_usage_perc",
        "KV-cache use, name before vLLM 0.10; used when the current name is absent",
        Field::KvLegacy,
    ),
    family(
        "vllm:lora_requests_info",
        "LoRA residency; the series with the highest value (a timestamp) wins",
        Field::LoraInfo,
    ),
    family(
        "vllm:cache_config_info",
        "KV geometry from labels block_size and num_gpu_blocks",
        Field::CacheConfig,
    ),
    family(
        "vllm:prefix_cache_queries_total",
        "prefix-cache queries, turned into a hit rate per interval",
        Field::PrefixQueries,
    ),
    family(
        "vllm:prefix_cache_hits_total",
        "prefix-cache hits, turned into a hit rate per interval",
        Field::PrefixHits,
    ),
    family(
        "vllm:gpu_prefix_cache_queries_total",
        "older name of the prefix-cache queries counter",
        Field::PrefixQueriesLegacy,
    ),
    family(
        "vllm:gpu_prefix_cache_hits_total",
        "older name of the prefix-cache hits counter",
        Field::PrefixHitsLegacy,
    ),
];

const SGLANG: &[Family] = &[
    family(
        "sglang:num_queue_reqs",
        "queue length (required)",
        Field::Waiting,
    ),
    family(
        "sglang:num_running_reqs",
        "running batch (required)",
        Field::Running,
    ),
    family(
        "sglang:token_usage",
        "KV-cache (token pool) use, fraction 0-1",
        Field::Kv,
    ),
    family(
        "sglang:cache_hit_rate",
        "prefix-cache hit rate, fraction 0-1",
        Field::HitRate,
    ),
];

const TGI: &[Family] = &[
    family("tgi_queue_size", "queue length (required)", Field::Waiting),
    family(
        "tgi_batch_current_size",
        "running batch (required)",
        Field::Running,
    ),
];

/// The metric families read for `engine`, in the order documented in `docs/metrics.md`.
pub fn families(engine: EngineType) -> &'static [Family] {
    match engine {
        EngineType::Vllm => VLLM,
        EngineType::Sglang => SGLANG,
        EngineType::Tgi => TGI,
    }
}

/// How many distinct label sets per family are checked for duplicates (enough for any data-parallel
/// width seen in practice; beyond it series are still aggregated, just not compared).
const DUPLICATE_WINDOW: usize = 16;

/// Running aggregate of one family's samples.
#[derive(Clone, Copy)]
struct Acc<'a> {
    family: &'static str,
    count: usize,
    sum: f64,
    max: f64,
    /// Labels and line of the series with the highest value (LoRA info) or the first (cache config).
    best: Option<(&'a [u8], usize, f64)>,
    seen: [&'a [u8]; DUPLICATE_WINDOW],
}

impl<'a> Acc<'a> {
    const fn new() -> Self {
        Acc {
            family: "",
            count: 0,
            sum: 0.0,
            max: f64::NEG_INFINITY,
            best: None,
            seen: [&[]; DUPLICATE_WINDOW],
        }
    }

    fn add(
        &mut self,
        family: &'static str,
        labels: &'a [u8],
        value: f64,
        line: usize,
    ) -> Result<(), ParseError> {
        let window = self.count.min(DUPLICATE_WINDOW);
        if self.seen[..window].contains(&labels) {
            return Err(ParseError::DuplicateSeries { family, line });
        }
        if let Some(slot) = self.seen.get_mut(self.count) {
            *slot = labels;
        }
        self.family = family;
        self.count += 1;
        self.sum += value;
        self.max = self.max.max(value);
        match self.best {
            Some((_, _, best)) if best > value => {}
            _ => self.best = Some((labels, line, value)),
        }
        Ok(())
    }

    fn present(&self) -> bool {
        self.count > 0
    }
}

/// Parses one `/metrics` page of `engine`.
///
/// `previous` is the [`ParsedPage::counters`] of the last successful parse of the same pod (or
/// `None`), used to turn cumulative prefix-cache counters into a hit rate over the last interval.
/// Fails on a page that is cut off (no final newline), a malformed line in a family it reads, an
/// impossible value (NaN, infinite, negative, a fraction above 1), a repeated series, or a missing
/// queue / running family. Other families missing give `None` fields ("not reported").
pub fn parse_page(
    engine: EngineType,
    page: &[u8],
    previous: Option<&PrefixCounters>,
    sampled_at: Timestamp,
) -> Result<ParsedPage, ParseError> {
    if !page.is_empty() && !page.ends_with(b"\n") {
        return Err(ParseError::Truncated);
    }
    parse_lines(engine, page, previous, sampled_at).map_err(|e| e.offset_to_line(page))
}

/// The scan. Positions inside errors are byte offsets of the line start until [`parse_page`]
/// turns them into line numbers: counting lines is only paid for on the error path.
fn parse_lines(
    engine: EngineType,
    page: &[u8],
    previous: Option<&PrefixCounters>,
    sampled_at: Timestamp,
) -> Result<ParsedPage, ParseError> {
    let wanted = families(engine);
    let mut acc = [Acc::new(); FIELDS];
    let mut pos = 0;
    while pos < page.len() {
        let rest = &page[pos..];
        let len = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
        let line = &rest[..len];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let offset = pos;
        pos += len + 1;
        let Some(name) = text::metric_name(line) else {
            if let Some(family) = text::type_line_family(line)
                && !is_read(wanted, family)
            {
                // The block of a family nobody reads (most of a vLLM page): jump from `# TYPE`
                // line to `# TYPE` line until one opens a block that is read.
                pos = text::skip_to_read_block(page, pos, |f| is_read(wanted, f));
            }
            continue;
        };
        let Some(fam) = wanted.iter().find(|f| f.name.as_bytes() == name) else {
            continue;
        };
        let sample = text::sample(offset, line, name.len())?;
        check_value(fam, sample.value, sample.line)?;
        acc[fam.field.index()].add(fam.name, sample.labels, sample.value, sample.line)?;
    }
    build(engine, &acc, previous, sampled_at)
}

/// Whether the block opened by `# TYPE family` may hold samples that are read. Errs towards
/// reading: a block is skipped only if no read name starts with its family name (an OpenMetrics
/// counter is typed without its `_total`).
fn is_read(wanted: &[Family], family: &[u8]) -> bool {
    let Some(&last) = family.last() else {
        return true;
    };
    wanted.iter().any(|f| {
        let name = f.name.as_bytes();
        // The byte where the family name would end tells most names apart without a comparison.
        name.get(family.len() - 1) == Some(&last) && name.starts_with(family)
    })
}

fn check_value(fam: &Family, value: f64, line: usize) -> Result<(), ParseError> {
    let invalid = |reason| ParseError::InvalidValue {
        family: fam.name,
        line,
        value,
        reason,
    };
    if !value.is_finite() {
        return Err(invalid("not finite"));
    }
    match fam.field {
        Field::LoraInfo | Field::CacheConfig => Ok(()),
        Field::Kv | Field::KvLegacy | Field::HitRate if value > 1.0 => {
            Err(invalid("above 1 for a fraction"))
        }
        _ if value < 0.0 => Err(invalid("negative")),
        _ => Ok(()),
    }
}

fn build(
    engine: EngineType,
    acc: &[Acc<'_>; FIELDS],
    previous: Option<&PrefixCounters>,
    sampled_at: Timestamp,
) -> Result<ParsedPage, ParseError> {
    let get = |f: Field| &acc[f.index()];
    let fams = families(engine);
    let count = |f: Field| -> Result<u32, ParseError> {
        let a = get(f);
        if !a.present() {
            let family = fams.iter().find(|x| x.field == f).map_or("", |x| x.name);
            return Err(ParseError::MissingFamily { engine, family });
        }
        // Values were checked finite and non-negative; `as` saturates above u32::MAX.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = a.sum.floor() as u32;
        Ok(n)
    };
    let waiting = count(Field::Waiting)?;
    let running = count(Field::Running)?;
    let kv_cache_usage = [Field::Kv, Field::KvLegacy]
        .into_iter()
        .map(get)
        .find(|a| a.present())
        .map(|a| a.max);
    let lora = lora_state(get(Field::LoraInfo))?;
    let cache = cache_config(get(Field::CacheConfig))?;
    let (prefix_cache_hit_rate, counters) = match engine {
        EngineType::Sglang => {
            let a = get(Field::HitRate);
            #[allow(clippy::cast_precision_loss)]
            let mean = a.present().then(|| a.sum / a.count as f64);
            (mean, None)
        }
        _ => {
            let pick = |cur: Field, old: Field| {
                [cur, old]
                    .into_iter()
                    .map(get)
                    .find(|a| a.present())
                    .map(|a| a.sum)
            };
            match (
                pick(Field::PrefixQueries, Field::PrefixQueriesLegacy),
                pick(Field::PrefixHits, Field::PrefixHitsLegacy),
            ) {
                (Some(queries), Some(hits)) => {
                    let hit_rate = hit_rate(queries, hits, previous);
                    (
                        hit_rate,
                        Some(PrefixCounters {
                            queries,
                            hits,
                            hit_rate,
                        }),
                    )
                }
                _ => (None, None),
            }
        }
    };
    Ok(ParsedPage {
        snapshot: MetricsSnapshot {
            sampled_at,
            waiting,
            running,
            kv_cache_usage,
            lora,
            cache,
            prefix_cache_hit_rate,
        },
        counters,
    })
}

/// Hit rate over the interval since `previous`; a counter that went down means the engine
/// restarted, so the whole new count is the interval's. With no new queries the last rate stands.
fn hit_rate(queries: f64, hits: f64, previous: Option<&PrefixCounters>) -> Option<f64> {
    let (dq, dh, carried) = match previous {
        None => (queries, hits, None),
        Some(p) if queries < p.queries || hits < p.hits => (queries, hits, None),
        Some(p) => (queries - p.queries, hits - p.hits, p.hit_rate),
    };
    if dq > 0.0 {
        Some((dh / dq).clamp(0.0, 1.0))
    } else {
        carried
    }
}

fn lora_state(acc: &Acc<'_>) -> Result<Option<LoraState>, ParseError> {
    let Some((labels, line, _)) = acc.best else {
        return Ok(None);
    };
    let family = acc.family;
    let max_lora = match text::label(labels, line, "max_lora")? {
        None => 0,
        Some(raw) => parse_number(raw).ok_or_else(|| ParseError::InvalidLabel {
            family,
            label: "max_lora",
            value: String::from_utf8_lossy(raw).into_owned(),
            line,
        })?,
    };
    let list = |name: &str| -> Result<Vec<String>, ParseError> {
        let Some(raw) = text::label(labels, line, name)? else {
            return Ok(Vec::new());
        };
        let text = text::unescape(raw, line)?;
        Ok(text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect())
    };
    let running = list("running_lora_adapters")?;
    // vLLM lists every adapter with any request as waiting, running ones included; an adapter that
    // is running is reported once, as running (the stronger affinity).
    let mut waiting = list("waiting_lora_adapters")?;
    waiting.retain(|a| !running.contains(a));
    Ok(Some(LoraState {
        max_lora,
        running,
        waiting,
    }))
}

fn cache_config(acc: &Acc<'_>) -> Result<Option<CacheConfig>, ParseError> {
    let Some((labels, line, _)) = acc.best else {
        return Ok(None);
    };
    let block = text::label(labels, line, "block_size")?;
    let blocks = text::label(labels, line, "num_gpu_blocks")?;
    // vLLM writes "None" before the cache is profiled: that is "not reported", not an error.
    Ok(
        match (
            block.and_then(parse_number::<u64>),
            blocks.and_then(parse_number::<u64>),
        ) {
            (Some(block_size), Some(num_blocks)) if block_size > 0 => Some(CacheConfig {
                block_size: u32::try_from(block_size).unwrap_or(u32::MAX),
                num_blocks,
            }),
            _ => None,
        },
    )
}

/// A non-negative integer label value, also accepting the `"8192.0"` form.
fn parse_number<T: TryFrom<u64>>(raw: &[u8]) -> Option<T> {
    let text = std::str::from_utf8(raw).ok()?.trim();
    let digits = text.strip_suffix(".0").unwrap_or(text);
    digits.parse::<u64>().ok().and_then(|n| T::try_from(n).ok())
}

#[cfg(test)]
mod tests;
