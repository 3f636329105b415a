//! What the precise index costs: its memory per 100,000 blocks (measured with a counting
//! allocator, against the estimate `infergate_kv_index_bytes` reports) and the time to match a
//! 2,000-token prompt against it. (Tokenizing it: `crates/tokenizer/examples/cost.rs`.)
//!
//! `cargo run --release -p infergate-kvevents --example index_cost`

#![allow(
    clippy::print_stdout,
    reason = "a measurement command: its output is its report"
)]

use std::alloc::System;
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::Instant;

use infergate_kvevents::event::{Batch, Event, Stored};
use infergate_kvevents::index::{KvIndex, MatchScratch};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const BS: u32 = 16;

fn pod(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 8000))
}

/// `chains` prompts of `len` blocks each, stored on `pods` pods (chain `c` on pod `c % pods`,
/// and on `shared` further pods).
fn fill(ix: &mut KvIndex, pods: usize, chains: usize, len: usize, shared: usize) {
    for c in 0..chains {
        let tokens: Vec<u32> = (0..len as u32 * BS).map(|t| (c as u32) << 16 | t).collect();
        for k in 0..=shared {
            let p = (c + k) % pods;
            let ev = Event::Stored(Stored {
                block_hashes: (0..len as u64).map(|b| (c as u64) << 20 | b).collect(),
                token_ids: tokens.clone(),
                block_size: BS,
                ..Default::default()
            });
            ix.apply(
                pod(p),
                &Batch {
                    events: vec![ev],
                    ..Default::default()
                },
            );
        }
    }
}

fn memory(label: &str, pods: usize, chains: usize, len: usize, shared: usize) {
    let region = Region::new(GLOBAL);
    let mut ix = KvIndex::new(u64::MAX);
    fill(&mut ix, pods, chains, len, shared);
    let live = {
        let s = region.change();
        s.bytes_allocated as i64 - s.bytes_deallocated as i64
    };
    // What the batches themselves cost is freed again; what is live is the index.
    let st = ix.stats();
    let per_entry = live as f64 / st.entries as f64;
    println!(
        "{label:<44} blocks {:>7}  entries {:>7}  live {:>6.1} MiB  {:>5.1} B/entry  \
         per 100k blocks {:>5.1} MiB  (estimate {:.1} MiB)",
        st.blocks,
        st.entries,
        live as f64 / (1 << 20) as f64,
        per_entry,
        live as f64 / st.blocks as f64 * 1e5 / (1 << 20) as f64,
        st.bytes as f64 / (1 << 20) as f64,
    );
    black_box(ix);
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q) as usize]
}

fn main() {
    println!("== memory (16-token blocks)");
    memory("1 pod, 100k blocks (1,000 prompts x 100)", 1, 1000, 100, 0);
    memory("8 pods, 100k blocks, each on one pod", 8, 1000, 100, 0);
    memory("8 pods, 100k blocks, each on 4 pods", 8, 1000, 100, 3);
    memory("100 pods, 1M blocks, each on one pod", 100, 10_000, 100, 0);

    println!("== match a 2,000-token prompt");
    // 16 pods, each holding 2,000 other blocks; pod 3 holds this prompt's first 1,600 tokens.
    let prompt: Vec<u32> = (0..2000).map(|t| 7 << 24 | t).collect();
    let mut ix = KvIndex::new(u64::MAX);
    fill(&mut ix, 16, 320, 100, 0);
    let holder = pod(3);
    let n = 1600;
    ix.apply(
        holder,
        &Batch {
            events: vec![Event::Stored(Stored {
                block_hashes: (0..(n / BS as usize) as u64).map(|b| 1 << 60 | b).collect(),
                token_ids: prompt[..n].to_vec(),
                block_size: BS,
                ..Default::default()
            })],
            ..Default::default()
        },
    );
    for i in 0..16 {
        ix.set_synced(pod(i), true);
    }
    let (mut scratch, mut out) = (MatchScratch::default(), Vec::new());
    ix.match_tokens(None, None, &prompt, &mut scratch, &mut out);
    assert!(out.contains(&(holder, n as u32)), "{out:?}");
    let mut t_match = Vec::new();
    let region = Region::new(GLOBAL);
    for _ in 0..20_000 {
        let t = Instant::now();
        ix.match_tokens(None, None, black_box(&prompt), &mut scratch, &mut out);
        t_match.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let allocs = region.change().allocations;
    t_match.truncate(t_match.len());
    let mut v = t_match;
    println!(
        "16 pods, 33,700 blocks: p50 {:.2} us  p99 {:.2} us  ({} allocations in 20,000 matches, \
         the timing samples' own included)",
        percentile(&mut v, 0.5),
        percentile(&mut v, 0.99),
        allocs
    );
}
