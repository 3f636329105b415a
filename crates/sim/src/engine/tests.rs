use super::*;
use crate::Catalog;

fn profile(id: &str) -> Arc<Profile> {
    Arc::new(Catalog::builtin().unwrap().get(id).unwrap().clone())
}

fn small_profile() -> Arc<Profile> {
    let mut p = (*profile("llama-3.1-8b/a10g")).clone();
    p.kv_capacity_tokens = 16 * 64; // 64 blocks
    p.max_model_len = 1024;
    Arc::new(p)
}

fn req(id: u64, arrival: f64, tokens: u32, out: u32) -> EngineRequest {
    EngineRequest {
        id,
        arrival,
        prompt: Prompt::tokens(tokens),
        max_tokens: out,
        lora: None,
        cache_salt: None,
    }
}

/// Runs the engine alone until idle, submitting `reqs` at their arrival times.
fn run(engine: &mut Engine, mut reqs: Vec<EngineRequest>, bulk: bool) -> Vec<Completion> {
    reqs.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
    let mut reqs: VecDeque<_> = reqs.into();
    let mut out = Vec::new();
    let mut now = 0.0f64;
    loop {
        let next_arrival = reqs.front().map(|r| r.arrival);
        match (engine.step_end(), next_arrival) {
            (Some(end), Some(a)) if a < end => {
                now = a;
                engine.submit(reqs.pop_front().unwrap()).unwrap();
                engine.interrupt_at(now);
            }
            (Some(_), _) => {
                now = engine.finish_step(&mut out).unwrap();
                engine.start_step(now, bulk);
            }
            (None, Some(a)) => {
                now = now.max(a);
                engine.submit(reqs.pop_front().unwrap()).unwrap();
                engine.start_step(now, bulk);
            }
            (None, None) => {
                if engine.has_work() {
                    assert!(
                        engine.start_step(now, bulk).is_some(),
                        "engine stalled with work"
                    );
                } else {
                    break;
                }
            }
        }
    }
    out
}

#[test]
fn bulk_and_single_steps_agree() {
    let p = profile("llama-3.1-8b/h100");
    let reqs: Vec<_> = (0..40)
        .map(|i| {
            req(
                i,
                i as f64 * 0.013,
                100 + (i as u32 * 37) % 900,
                5 + (i as u32 * 13) % 120,
            )
        })
        .collect();
    let mut a = Engine::new(p.clone(), vec![], 4, 1, false);
    let mut b = Engine::new(p, vec![], 4, 1, false);
    let mut ca = run(&mut a, reqs.clone(), false);
    let mut cb = run(&mut b, reqs, true);
    ca.sort_by_key(|c| c.id);
    cb.sort_by_key(|c| c.id);
    assert_eq!(ca.len(), 40);
    for (x, y) in ca.iter().zip(&cb) {
        assert_eq!(x.id, y.id);
        assert!((x.first_token - y.first_token).abs() < 1e-9, "{x:?} {y:?}");
        assert!((x.last_token - y.last_token).abs() < 1e-9, "{x:?} {y:?}");
    }
    assert!(b.stats().steps == a.stats().steps);
}

#[test]
fn preemption_under_kv_pressure_completes_everything_and_frees_all_blocks() {
    let p = small_profile();
    let reqs: Vec<_> = (0..30).map(|i| req(i, i as f64 * 0.05, 200, 150)).collect();
    let mut runs = Vec::new();
    for bulk in [false, true] {
        let mut e = Engine::new(p.clone(), vec![], 4, 1, true);
        let mut done = run(&mut e, reqs.clone(), bulk);
        done.sort_by_key(|c| c.id);
        runs.push(done.clone());
        assert_eq!(e.stats().bulk_steps > 0, bulk);
        assert_eq!(done.len(), 30);
        assert!(
            e.stats().preemptions > 0,
            "the workload must overflow 64 blocks"
        );
        assert!(done.iter().all(|c| c.output_tokens == 150));
        assert_eq!(e.pool.used(), 0);
        assert_eq!(e.view(1e9).kv_usage, 0.0);
    }
    // bulk decoding while admission is blocked by KV gives the same timings as single steps
    for (a, b) in runs[0].iter().zip(&runs[1]) {
        assert!(
            (a.first_token - b.first_token).abs() < 1e-9
                && (a.last_token - b.last_token).abs() < 1e-9,
            "{a:?} {b:?}"
        );
        assert_eq!(a.preemptions, b.preemptions);
    }
}

#[test]
fn oversized_and_empty_requests_are_rejected_with_reasons() {
    let mut e = Engine::new(small_profile(), vec!["a".into()], 1, 1, false);
    assert!(
        matches!(e.submit(req(1, 0.0, 2000, 10)), Err(SimError::Rejected(m)) if m.contains("maximum context length"))
    );
    assert!(matches!(
        e.submit(req(1, 0.0, 10, 0)),
        Err(SimError::Rejected(_))
    ));
    let mut bad = req(1, 0.0, 10, 10);
    bad.lora = Some(3);
    assert!(e.submit(bad).is_err());
    assert!(!e.has_work());
}

#[test]
fn chunked_prefill_splits_long_prompts_by_the_token_budget() {
    let p = profile("llama-3.1-8b/a10g"); // 2048-token budget
    let mut e = Engine::new(p.clone(), vec![], 4, 1, false);
    let done = run(&mut e, vec![req(1, 0.0, 5000, 2)], false);
    let want = p.nominal_ttft(5000);
    assert!((done[0].ttft() - want).abs() < 1e-9);
    // three prefill steps + one decode step
    assert_eq!(e.stats().steps, 4);
}

#[test]
fn lora_slots_limit_distinct_adapters_in_the_batch() {
    let adapters: Vec<Arc<str>> = vec!["a".into(), "b".into(), "c".into()];
    let mut e = Engine::new(profile("llama-3.1-8b/h100"), adapters, 2, 1, false);
    for (i, a) in [0u16, 1, 2].into_iter().enumerate() {
        let mut r = req(i as u64, 0.0, 64, 50);
        r.lora = Some(a);
        e.submit(r).unwrap();
    }
    e.start_step(0.0, false);
    let v = e.view(0.0);
    assert_eq!(v.running, 2);
    assert_eq!(v.waiting, 1);
    assert_eq!(&*v.waiting_loras[0], "c");
    assert_eq!(e.stats().lora_loads, 2);
    let done = run(&mut e, vec![], true);
    assert_eq!(done.len(), 3);
    assert_eq!(e.stats().lora_loads, 3);
}

/// vLLM keys every block of a LoRA request by the adapter's name: the same prompt under another
/// adapter, or under the base model, finds nothing cached; under the same adapter it hits.
#[test]
fn prefix_blocks_are_keyed_by_lora_adapter() {
    let text: Arc<str> = "the same system prompt, word for word. ".repeat(60).into();
    let synthetic = Prompt::Tokens {
        tokens: 600,
        prefix_group: 7,
        prefix_tokens: 512,
    };
    for prompt in [Prompt::Text(text), synthetic] {
        let mut e = Engine::new(
            profile("llama-3.1-8b/a10g"),
            vec!["a".into(), "b".into()],
            2,
            1,
            false,
        );
        let at = |id: u64, lora: Option<u16>| EngineRequest {
            id,
            arrival: id as f64 * 10.0,
            prompt: prompt.clone(),
            max_tokens: 4,
            lora,
            cache_salt: None,
        };
        let reqs = vec![at(0, Some(0)), at(1, Some(1)), at(2, None), at(3, Some(0))];
        let mut done = run(&mut e, reqs, false);
        done.sort_by_key(|c| c.id);
        let cached: Vec<u32> = done.iter().map(|c| c.cached_tokens).collect();
        assert_eq!(cached[..3], [0, 0, 0], "{prompt:?}: {cached:?}");
        assert!(cached[3] >= 500, "{prompt:?}: {cached:?}");
        // The engine's own answer agrees: each adapter (and the base model) holds its own copy.
        for lora in [Some("a"), Some("b"), None] {
            assert_eq!(e.held_prefix_tokens(&prompt, lora), cached[3], "{lora:?}");
        }
        assert_eq!(e.held_prefix_tokens(&prompt, Some("c")), 0);
    }
}
