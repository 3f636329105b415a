//! What in-process tokenization costs per request, and with the KV-event index match after it.
//!
//! ```text
//! cargo run --release -p infergate-tokenizer --example cost [-- --tokenizer DIR] [--tokens N]
//!     [--iterations N] [--pods N] [--block-size N]
//! ```
//!
//! Times, over many iterations on one thread: encoding a completions prompt of about `--tokens`
//! tokens (default 2,000), a chat request carrying the same text (template render + encode), and
//! each followed by `KvIndex::match_tokens` against `--pods` pods (default 8) that each hold a
//! different share of the prompt's blocks, and the prompts of `DIR/expected.json` joined into one
//! text (real, mixed text rather than repeated words). Prints median, p99 and ns per token.
//!
//! `DIR` defaults to the committed tiny fixture (vocabulary 500, not representative: few merges,
//! short tokens). `examples/make_large_tokenizer.py` trains a Llama-3-shaped 32k one into
//! target/. When `DIR` holds an `expected.json` (both do), every case in it is checked to give the
//! Python stack's ids before anything is timed.

#![allow(clippy::print_stdout, reason = "an example prints its report")]

use std::hint::black_box;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use infergate_kvevents::event::{Batch, Event, Stored};
use infergate_kvevents::{KvIndex, MatchScratch};
use infergate_tokenizer::{ChatMessage, ChatRequest, Content, ModelTokenizer, Options};

struct Args {
    tokenizer: PathBuf,
    tokens: usize,
    iterations: usize,
    pods: usize,
    block_size: usize,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        tokenizer: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny"),
        tokens: 2000,
        iterations: 2000,
        pods: 8,
        block_size: 16,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--tokenizer" => a.tokenizer = value.into(),
            "--tokens" => a.tokens = value.parse()?,
            "--iterations" => a.iterations = value.parse()?,
            "--pods" => a.pods = value.parse()?,
            "--block-size" => a.block_size = value.parse()?,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

/// Checks every case of `dir/expected.json` (if there is one) against this crate's ids; returns
/// how many agreed and the case prompts joined by newlines (the "mixed text" timing).
fn check_parity(tok: &ModelTokenizer, dir: &Path) -> anyhow::Result<(usize, String)> {
    let path = dir.join("expected.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok((0, String::new()));
    };
    let mut joined = String::new();
    let exp: serde_json::Value = serde_json::from_str(&text)?;
    let cases = exp["cases"]
        .as_array()
        .context("expected.json has no cases")?;
    let mut out = Vec::new();
    let mut n = 0;
    for case in cases {
        let Some(want) = case["ids"].as_array() else {
            continue;
        };
        let want: Vec<u32> = want
            .iter()
            .filter_map(|v| v.as_u64().and_then(|i| u32::try_from(i).ok()))
            .collect();
        if let Some(p) = case["prompt"].as_str() {
            tok.encode_completion(p, true, &mut out)?;
            if !joined.is_empty() {
                joined.push('\n');
            }
            joined.push_str(p);
        } else {
            let req = ChatRequest::from_json(&serde_json::to_vec(&case["messages"])?)?;
            tok.encode_chat(&req, &mut out)?;
        }
        if out != want {
            bail!(
                "{}: case {} differs from the Python stack ({} ids here, {} there)",
                path.display(),
                case["name"],
                out.len(),
                want.len()
            );
        }
        n += 1;
    }
    Ok((n, joined))
}

/// Text of about `tokens` tokens: varied English-like words, numbers and punctuation.
fn prompt_text(tok: &ModelTokenizer, tokens: usize) -> anyhow::Result<String> {
    const WORDS: &[&str] = &[
        "the",
        "gateway",
        "routes",
        "each",
        "request",
        "to",
        "a",
        "pod",
        "whose",
        "prefix",
        "cache",
        "already",
        "holds",
        "most",
        "of",
        "its",
        "prompt;",
        "latency",
        "drops",
        "when",
        "blocks",
        "are",
        "reused,",
        "and",
        "throughput",
        "rises",
        "because",
        "prefill",
        "is",
        "skipped.",
        "Models",
        "like",
        "Llama",
        "3.1",
        "8B",
        "serve",
        "2048",
        "tokens",
        "per",
        "second",
    ];
    let mut text = String::new();
    let mut out = Vec::new();
    let mut i = 0usize;
    loop {
        for _ in 0..64 {
            text.push_str(WORDS[(i * 7 + i / 5) % WORDS.len()]);
            text.push(if i % 17 == 16 { '\n' } else { ' ' });
            i += 1;
        }
        tok.encode_completion(&text, true, &mut out)?;
        if out.len() >= tokens {
            return Ok(text);
        }
    }
}

struct Stats {
    median_ns: u128,
    p99_ns: u128,
}

fn time(iterations: usize, mut f: impl FnMut()) -> Stats {
    for _ in 0..iterations / 10 + 1 {
        f();
    }
    let mut samples: Vec<u128> = (0..iterations)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos()
        })
        .collect();
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        median_ns: at(0.5),
        p99_ns: at(0.99),
    }
}

fn report(what: &str, tokens: usize, s: &Stats) {
    println!(
        "{what:<34} median {:>9.1} µs  p99 {:>9.1} µs  {:>7.1} ns/token (median)",
        s.median_ns as f64 / 1e3,
        s.p99_ns as f64 / 1e3,
        s.median_ns as f64 / tokens as f64
    );
}

/// An index where pod k of `pods` holds the first (k+1)/pods of the prompt's blocks.
fn index(ids: &[u32], pods: usize, block_size: usize) -> anyhow::Result<KvIndex> {
    let mut ix = KvIndex::new(64 << 20);
    let full = ids.len() / block_size;
    for k in 0..pods {
        let addr: SocketAddr = format!("10.0.0.{}:8000", k + 1).parse()?;
        let blocks = full * (k + 1) / pods;
        let stored = Stored {
            block_hashes: (0..blocks as u64).map(|b| (k as u64) << 32 | b).collect(),
            token_ids: ids[..blocks * block_size].to_vec(),
            block_size: u32::try_from(block_size)?,
            ..Default::default()
        };
        ix.apply(
            addr,
            &Batch {
                events: vec![Event::Stored(stored)],
                ..Default::default()
            },
        );
        ix.set_synced(addr, true);
    }
    Ok(ix)
}

fn main() -> anyhow::Result<()> {
    let a = args()?;
    let t0 = Instant::now();
    let tok = ModelTokenizer::from_dir(&a.tokenizer, Options::default())?;
    let load = t0.elapsed();
    let (checked, mixed) = check_parity(&tok, &a.tokenizer)?;
    println!(
        "tokenizer {} (vocabulary {}), loaded in {:.1} ms; {checked} expected.json cases agree",
        a.tokenizer.display(),
        tok.vocab_size(),
        load.as_secs_f64() * 1e3
    );
    let text = prompt_text(&tok, a.tokens)?;
    let mut ids = Vec::new();
    tok.encode_completion(&text, true, &mut ids)?;
    let request = ChatRequest::new(vec![
        ChatMessage {
            role: "system".into(),
            content: Some(Content::Text("You answer briefly.".into())),
            name: None,
            reasoning: None,
            tool_call_id: None,
            tool_calls: None,
        },
        ChatMessage {
            role: "user".into(),
            content: Some(Content::Text(text.clone())),
            name: None,
            reasoning: None,
            tool_call_id: None,
            tool_calls: None,
        },
    ]);
    let mut chat_ids = Vec::new();
    tok.encode_chat(&request, &mut chat_ids)?;
    println!(
        "prompt: {} bytes, {} tokens (completion), {} tokens (chat); {} iterations; {} pods, \
         block size {}",
        text.len(),
        ids.len(),
        chat_ids.len(),
        a.iterations,
        a.pods,
        a.block_size
    );
    let ix = index(&ids, a.pods, a.block_size)?;
    let ix_chat = index(&chat_ids, a.pods, a.block_size)?;
    let (mut scratch, mut matched) = (MatchScratch::default(), Vec::new());
    ix.match_tokens(None, None, &ids, &mut scratch, &mut matched);
    let best = matched.iter().map(|(_, n)| *n).max().unwrap_or(0);

    let mut out = Vec::with_capacity(ids.len() + 16);
    let s = time(a.iterations, || {
        let _ = tok.encode_completion(black_box(&text), true, &mut out);
        black_box(&out);
    });
    report("encode completion", ids.len(), &s);
    let s = time(a.iterations, || {
        let _ = tok.encode_chat(black_box(&request), &mut out);
        black_box(&out);
    });
    report("encode chat (render + encode)", chat_ids.len(), &s);
    let s = time(a.iterations, || {
        let _ = black_box(tok.render_chat(black_box(&request)));
    });
    report("  of which render", chat_ids.len(), &s);
    let s = time(a.iterations, || {
        ix.match_tokens(None, None, black_box(&ids), &mut scratch, &mut matched);
        black_box(&matched);
    });
    report(&format!("match alone ({} pods)", a.pods), ids.len(), &s);
    let s = time(a.iterations, || {
        let _ = tok.encode_completion(black_box(&text), true, &mut out);
        ix.match_tokens(None, None, &out, &mut scratch, &mut matched);
        black_box(&matched);
    });
    report("encode completion + match", ids.len(), &s);
    let s = time(a.iterations, || {
        let _ = tok.encode_chat(black_box(&request), &mut out);
        ix_chat.match_tokens(None, None, &out, &mut scratch, &mut matched);
        black_box(&matched);
    });
    report("encode chat + match", chat_ids.len(), &s);
    if !mixed.is_empty() {
        let mut mixed_ids = Vec::new();
        tok.encode_completion(&mixed, true, &mut mixed_ids)?;
        let s = time(a.iterations / 10 + 1, || {
            let _ = tok.encode_completion(black_box(&mixed), true, &mut out);
            black_box(&out);
        });
        report(
            &format!("expected.json prompts joined ({} B)", mixed.len()),
            mixed_ids.len(),
            &s,
        );
    }
    println!(
        "(best pod holds {best} of the prompt's {} tokens)",
        ids.len()
    );
    Ok(())
}
