//! Model-server `/metrics` pages: `parse_page` never panics, and a page it accepts yields only
//! values the scheduler can use (finite, non-negative, fractions within 0..=1).
#![no_main]

use infergate_metrics::parse_page;
use infergate_scheduler::{EngineType, Timestamp};
use libfuzzer_sys::fuzz_target;

fn fraction(v: Option<f64>) -> bool {
    v.is_none_or(|x| x.is_finite() && (0.0..=1.0).contains(&x))
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, page)) = data.split_first() else {
        return;
    };
    let engine = match selector % 3 {
        0 => EngineType::Vllm,
        1 => EngineType::Sglang,
        _ => EngineType::Tgi,
    };
    let Ok(first) = parse_page(engine, page, None, Timestamp::from_millis(50)) else {
        return;
    };
    let s = &first.snapshot;
    assert_eq!(s.sampled_at, Timestamp::from_millis(50));
    assert!(fraction(s.kv_cache_usage), "kv {:?}", s.kv_cache_usage);
    assert!(
        fraction(s.prefix_cache_hit_rate),
        "hit rate {:?}",
        s.prefix_cache_hit_rate
    );
    if let Some(c) = &first.counters {
        assert!(c.queries.is_finite() && c.queries >= 0.0);
        assert!(c.hits.is_finite() && c.hits >= 0.0);
    }
    // The same page again, with the first parse's counters: still accepted, still sane.
    let second = match parse_page(
        engine,
        page,
        first.counters.as_ref(),
        Timestamp::from_millis(100),
    ) {
        Ok(p) => p,
        Err(e) => panic!("a page accepted once is refused the second time: {e}"),
    };
    assert!(fraction(second.snapshot.prefix_cache_hit_rate));
});
