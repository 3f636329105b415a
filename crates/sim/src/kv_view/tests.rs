//! The event-fed view against the engines' truth.

#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use super::*;
use crate::fleet::Request;
use crate::spec::FleetSpec;
use crate::tokens::text_block_hashes;
use crate::{Catalog, EngineKind, Profile};

/// An A10G with 64 KV blocks of 16 tokens, so a few prompts fill it.
fn small() -> Profile {
    let mut p = Catalog::builtin()
        .unwrap()
        .get("llama-3.1-8b/a10g")
        .unwrap()
        .clone();
    p.kv_capacity_tokens = 16 * 64;
    p.max_model_len = 1024;
    p
}

fn fleet(pods: usize) -> Fleet {
    Fleet::new(&FleetSpec::uniform(&small(), EngineKind::Vllm, "pod", pods).unwrap()).unwrap()
}

/// `tokens` tokens of text, distinct per `tag`.
fn text(tag: &str, tokens: usize) -> Prompt {
    let mut s = format!("<{tag}>");
    while s.len() < tokens * 4 {
        s.push('x');
    }
    Prompt::Text(s.into())
}

fn send(f: &mut Fleet, pod: usize, id: u64, prompt: &Prompt) {
    let at = f.now();
    let req = Request {
        id,
        arrival: at,
        prompt: prompt.clone(),
        max_tokens: 4,
        lora: None,
    };
    f.submit(pod, req).unwrap();
    f.run_until_idle();
}

fn seen(view: &mut KvView, prompt: &Prompt) -> Vec<u32> {
    let mut out = Vec::new();
    view.cached_tokens(prompt, None, &mut out);
    out
}

#[test]
fn a_stored_prompt_is_seen_after_the_lag_and_an_evicted_one_is_removed() {
    let mut f = fleet(2);
    // A long lag, so that the whole request runs before its events are delivered.
    let lag = 1.0;
    let mut view = KvView::new(&mut f, lag);
    // 31 full blocks.
    let a = text("a", 31 * 16);
    send(&mut f, 0, 1, &a);
    view.sync(&mut f);
    assert_eq!(
        seen(&mut view, &a),
        [0, 0],
        "published at the step's end, not delivered yet"
    );
    f.advance_to(f.now() + lag);
    view.sync(&mut f);
    assert_eq!(seen(&mut view, &a), [31 * 16, 0]);
    assert_eq!(f.engine(0).unwrap().held_prefix_tokens(&a, None), 31 * 16);

    // Two 56-block prompts need the whole pool: `a` is evicted, its tail first.
    let (b, c) = (text("b", 56 * 16), text("c", 56 * 16));
    send(&mut f, 0, 2, &b);
    let mut hashes = Vec::new();
    let e = f.engine(0).unwrap();
    let bs = e.profile().block_size;
    let Prompt::Text(at) = &a else { unreachable!() };
    text_block_hashes(at, bs, e.prefix_seed(), &mut hashes);
    // The view sees exactly the part of `a` the pool still holds.
    f.advance_to(f.now() + lag);
    view.sync(&mut f);
    let held = f.engine(0).unwrap().held_prefix_tokens(&a, None);
    assert!(held > 0 && held < 31 * 16, "{held}");
    assert_eq!(seen(&mut view, &a)[0], held);
    send(&mut f, 0, 3, &c);
    f.advance_to(f.now() + lag);
    view.sync(&mut f);
    assert_eq!(f.engine(0).unwrap().held_prefix_tokens(&a, None), 0);
    assert_eq!(seen(&mut view, &a), [0, 0]);
    assert!(hashes.iter().all(|h| !view.holds(0, *h)));
    assert!(view.held_blocks(0) > 0 && view.held_blocks(0) <= 64);
    // A reset reaches the view as one cleared event.
    assert!(f.reset_prefix_cache(0).unwrap());
    f.advance_to(f.now() + lag);
    view.sync(&mut f);
    assert_eq!(view.held_blocks(0), 0);
    assert_eq!(seen(&mut view, &c), [0, 0]);
}

#[test]
fn an_eviction_publishes_a_removed_event_for_the_evicted_block() {
    let mut f = fleet(1);
    f.record_kv_events(true);
    let a = text("a", 31 * 16);
    send(&mut f, 0, 1, &a);
    let mut events = Vec::new();
    f.drain_kv_events(&mut events);
    let mut hashes = Vec::new();
    let e = f.engine(0).unwrap();
    let Prompt::Text(at) = &a else { unreachable!() };
    text_block_hashes(at, e.profile().block_size, e.prefix_seed(), &mut hashes);
    let stored: Vec<u64> = events
        .iter()
        .filter_map(|e| match e.event {
            KvEvent::Stored { hash } => Some(hash),
            _ => None,
        })
        .collect();
    assert_eq!(stored, hashes, "every full block stored, in order");
    assert!(events.iter().all(|e| e.pod == 0 && e.t <= f.now()));
    events.clear();
    send(&mut f, 0, 2, &text("b", 56 * 16));
    f.drain_kv_events(&mut events);
    let removed: Vec<u64> = events
        .iter()
        .filter_map(|e| match e.event {
            KvEvent::Removed { hash } => Some(hash),
            _ => None,
        })
        .collect();
    // The pool had 33 blocks free: 24 of `a`'s 31 go, from its end.
    let mut tail: Vec<u64> = hashes[7..].to_vec();
    tail.reverse();
    assert_eq!(removed, tail);
    let held = f.engine(0).unwrap().held_prefix_tokens(&a, None);
    assert_eq!(held, 7 * 16);
}

#[test]
fn a_reset_publishes_cleared_and_is_refused_while_busy() {
    let mut f = fleet(1);
    f.record_kv_events(true);
    let a = text("a", 20 * 16);
    send(&mut f, 0, 1, &a);
    // Busy: refused, nothing published.
    let at = f.now();
    f.submit(
        0,
        Request {
            id: 2,
            arrival: at,
            prompt: text("b", 100),
            max_tokens: 50,
            lora: None,
        },
    )
    .unwrap();
    assert!(!f.reset_prefix_cache(0).unwrap());
    f.run_until_idle();
    assert!(f.reset_prefix_cache(0).unwrap());
    let mut events = Vec::new();
    f.drain_kv_events(&mut events);
    let cleared = events
        .iter()
        .filter(|e| e.event == KvEvent::Cleared)
        .count();
    assert_eq!(cleared, 1);
    assert_eq!(events.last().map(|e| e.event), Some(KvEvent::Cleared));
    assert_eq!(f.engine(0).unwrap().held_prefix_tokens(&a, None), 0);
}

#[test]
fn nothing_is_recorded_unless_asked() {
    let mut f = fleet(1);
    send(&mut f, 0, 1, &text("a", 40 * 16));
    let mut events = Vec::new();
    f.drain_kv_events(&mut events);
    assert!(events.is_empty());
}

/// The engine keys a LoRA request's blocks by its adapter, as vLLM does, and so does the view: a
/// prompt computed under adapter `a` is cached for `a` only.
#[test]
fn the_view_keys_a_prompt_by_its_lora_adapter() {
    let mut spec = FleetSpec::uniform(&small(), EngineKind::Vllm, "pod", 1).unwrap();
    spec.pods[0].lora_adapters = vec!["a".into(), "b".into()];
    spec.pods[0].max_loras = 2;
    let mut f = Fleet::new(&spec).unwrap();
    let mut view = KvView::new(&mut f, 0.0);
    let p = text("shared", 20 * 16);
    let req = Request {
        id: 1,
        arrival: f.now(),
        prompt: p.clone(),
        max_tokens: 4,
        lora: Some("a".into()),
    };
    f.submit(0, req).unwrap();
    f.run_until_idle();
    view.sync(&mut f);
    let mut out = Vec::new();
    view.cached_tokens(&p, Some("a"), &mut out);
    assert_eq!(out, [20 * 16]);
    view.cached_tokens(&p, Some("b"), &mut out);
    assert_eq!(out, [0]);
    assert_eq!(seen(&mut view, &p), [0]);
    let e = f.engine(0).unwrap();
    assert_eq!(e.held_prefix_tokens(&p, Some("a")), 20 * 16);
    assert_eq!(e.held_prefix_tokens(&p, None), 0);
}
