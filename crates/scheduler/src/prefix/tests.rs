use super::*;

fn hashes(seed: u64, segs: &[&str], block: usize) -> Vec<u64> {
    let mut v = Vec::new();
    hash_blocks(seed, segs, block, 1024, &mut v);
    v
}

#[test]
fn segments_hash_like_their_concatenation() {
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(20);
    let whole = hashes(7, &[text.as_str()], 64);
    assert_eq!(whole.len(), text.len() / 64);
    for cut in [1, 63, 64, 65, 100, 500] {
        let (a, b) = text.split_at(cut);
        assert_eq!(hashes(7, &[a, b], 64), whole, "cut at {cut}");
    }
    let pieces: Vec<&str> = text
        .as_bytes()
        .chunks(7)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    assert_eq!(hashes(7, &pieces, 64), whole);
}

#[test]
fn models_and_adapters_do_not_share_blocks() {
    let text = "x".repeat(256);
    let a = hashes(model_seed("m1", None), &[text.as_str()], 64);
    let b = hashes(model_seed("m2", None), &[text.as_str()], 64);
    let c = hashes(model_seed("m1", Some("lora")), &[text.as_str()], 64);
    assert!(a.iter().all(|h| !b.contains(h) && !c.contains(h)));
    // Chained: equal blocks at different depths hash differently.
    assert_eq!(a.len(), 4);
    assert!(a[0] != a[1] && a[1] != a[2]);
}

#[test]
fn partial_blocks_and_the_block_limit() {
    let mut v = Vec::new();
    assert_eq!(hash_blocks(1, &["short"], 64, 10, &mut v), 0);
    let text = "y".repeat(64 * 10 + 5);
    assert_eq!(hash_blocks(1, &[text.as_str()], 64, 3, &mut v), 3);
    assert_eq!(v.len(), 3);
}

fn cfg(budget: u64, default_blocks: u32) -> PrefixConfig {
    PrefixConfig {
        byte_budget: budget,
        default_endpoint_blocks: default_blocks,
        ..PrefixConfig::default()
    }
}

fn matched(ix: &PrefixIndex, hashes: &[u64], slots: usize) -> Vec<u32> {
    let mut m = vec![0; slots];
    let mut touched = Vec::new();
    ix.match_prefix(hashes, &mut m, &mut touched);
    m
}

#[test]
fn match_counts_leading_blocks_per_endpoint() {
    let mut ix = PrefixIndex::new(cfg(1 << 20, 1000));
    ix.set_endpoint(0, None);
    ix.set_endpoint(1, None);
    ix.insert(0, &[1, 2, 3, 4]);
    ix.insert(1, &[1, 2, 9]);
    assert_eq!(matched(&ix, &[1, 2, 3, 4, 5], 2), [4, 2]);
    assert_eq!(matched(&ix, &[7, 2, 3], 2), [0, 0]);
    ix.remove_endpoint(0);
    assert_eq!(matched(&ix, &[1, 2, 3, 4], 2), [0, 2]);
    assert_eq!(ix.stats().entries, 3);
}

#[test]
fn withdraw_takes_back_one_insert_but_not_what_was_held_or_touched_since() {
    let mut ix = PrefixIndex::new(cfg(1 << 20, 1000));
    ix.set_endpoint(0, None);
    ix.set_endpoint(1, None);
    // Endpoint 0 held blocks 1 and 2 before; the request adds 3 and 4.
    ix.insert(0, &[1, 2]);
    let r = ix.insert(0, &[1, 2, 3, 4]);
    assert_eq!(r.held, 2);
    assert_eq!(matched(&ix, &[1, 2, 3, 4], 2), [4, 0]);
    ix.withdraw(0, &[1, 2, 3, 4], r);
    assert_eq!(matched(&ix, &[1, 2, 3, 4], 2), [2, 0]);
    assert_eq!(ix.stats().entries, 2);
    assert_eq!(
        ix.stats().blocks,
        2,
        "a block no endpoint holds leaves the map"
    );
    // A block recorded again by a later request stays.
    let r = ix.insert(1, &[5, 6, 7]);
    assert_eq!(r.held, 0);
    ix.insert(1, &[5, 6]);
    ix.withdraw(1, &[5, 6, 7], r);
    assert_eq!(matched(&ix, &[5, 6, 7], 2), [0, 2]);
    // Nothing recorded, or a withdrawal repeated: nothing changes.
    ix.withdraw(1, &[5, 6], Recorded::NOTHING);
    ix.withdraw(1, &[5, 6, 7], r);
    assert_eq!(matched(&ix, &[5, 6, 7], 2), [0, 2]);
    // The stale LRU records are skipped on eviction: the counts stay exact.
    assert_eq!(ix.endpoints[0].count, 2);
    assert_eq!(ix.endpoints[1].count, 2);
    assert_eq!(ix.stats().entries, 4);
}

#[test]
fn per_endpoint_lru_evicts_the_least_recently_used() {
    let mut ix = PrefixIndex::new(cfg(1 << 20, 3));
    ix.set_endpoint(0, None);
    ix.insert(0, &[1, 2, 3]);
    ix.insert(0, &[1]); // touch 1
    ix.insert(0, &[4]); // evicts 2, the oldest untouched
    assert_eq!(ix.stats().entries, 3);
    assert_eq!(matched(&ix, &[1], 1), [1]);
    assert_eq!(matched(&ix, &[2], 1), [0]);
    assert_eq!(matched(&ix, &[4], 1), [1]);
    // Repeated touches do not grow the record queue without bound.
    for _ in 0..10_000 {
        ix.insert(0, &[1, 3, 4]);
    }
    assert!(ix.endpoints[0].order.len() <= 2 * 3 + 64 + 1);
}

#[test]
fn the_byte_budget_bounds_the_whole_index() {
    let budget = 64 * BYTES_PER_ENTRY;
    let mut ix = PrefixIndex::new(cfg(budget, 1_000_000));
    for slot in 0..4 {
        ix.set_endpoint(slot, None);
    }
    let mut h = 0u64;
    for round in 0..1000u64 {
        let slot = (round % 4) as u32;
        let blocks: Vec<u64> = (0..10)
            .map(|_| {
                h += 1;
                h
            })
            .collect();
        ix.insert(slot, &blocks);
        let s = ix.stats();
        assert!(s.entries <= s.max_entries, "{s:?}");
        assert!(s.estimated_bytes <= budget);
    }
    assert_eq!(ix.stats().entries, 64);
}

#[test]
fn a_block_remembers_at_most_a_few_endpoints() {
    let mut ix = PrefixIndex::new(cfg(1 << 20, 1000));
    let n = ENDPOINTS_PER_BLOCK as u32 + 3;
    for slot in 0..n {
        ix.set_endpoint(slot, None);
        ix.insert(slot, &[42]);
    }
    let m = matched(&ix, &[42], n as usize);
    assert_eq!(m.iter().sum::<u32>(), ENDPOINTS_PER_BLOCK as u32);
    // The most recent ones are kept.
    assert_eq!(m[n as usize - 1], 1);
    assert_eq!(m[0], 0);
    assert_eq!(ix.stats().entries, ENDPOINTS_PER_BLOCK);
}
