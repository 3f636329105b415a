//! Candidate sampling for large pools (crate-internal): a pick over hundreds of endpoints scores a
//! random sample of them instead of all (`candidateSample`, "power of k choices").
//!
//! Over a large pool of equal pods the best of all candidates is decided by the noise in each
//! pod's learned rates: the minimum of hundreds of estimates is the luckiest one, and traffic
//! piles onto the few pods whose samples happened to read fast while the rest idle. The best of a
//! fresh random sample per pick spreads the load the way the least-loaded of a few random choices
//! does, and the pick costs a sample's views instead of the whole pool's.
//!
//! What the sample always holds: the pods holding a prefix of the prompt and the pods where the
//! request's adapter runs, is resident or waits (affinity would otherwise be lost at random) —
//! `k` of them at most, the adapter's best first (running, resident, waiting, running while
//! another adapter waits for the slot), then the longest prefix, ties at random, so that a hot
//! adapter or system prompt held by hundreds of pods does not bring the whole pool back into
//! every pick; the others of them are drawn like any pod — and, per GPU speed, `k` pods of each
//! type (or all of them), so that a few fast pods among many slow ones are always in the
//! running. When the sample cannot take the request — no candidate left after the filters, no
//! fresh one, every one saturated, admission would shed it, or flow control's headroom reserve
//! held pods in it back (the reserve counts the pool's clear pods) — the pick is made again over
//! every candidate (`Scheduler::pick`), so sampling never turns away or crowds a request the pool
//! had room for.

use rand::Rng;

use crate::lora;
use crate::table::EndpointTable;

/// GPU speed classes told apart in one pick; pods of further classes share the last one.
const CLASSES: usize = 8;

/// Whether a pick over `candidates` endpoints samples, for the configured sample size `k`
/// (0 = never): only when the pool is over four times the sample, so small pools are scored
/// whole.
pub(crate) fn applies(k: u32, candidates: usize) -> bool {
    k > 0 && candidates > 4 * k as usize
}

/// Whether the sample keeps `slot` ahead of the draw, and with which preference (the larger the
/// better, the low 32 bits left for a random tie-break): it holds a prefix of the prompt, or
/// knows the request's adapter (running, resident or waiting there). The adapter's level comes
/// first, then the blocks matched.
fn keep(
    table: &EndpointTable,
    slot: u32,
    matched: &[u32],
    adapter: Option<(&str, u64)>,
) -> Option<u64> {
    let blocks = matched.get(slot as usize).copied().unwrap_or(0);
    let level = adapter
        .and_then(|(name, hash)| table.get(slot)?.lora_affinity(name, hash))
        .map_or(0, |a| match a {
            lora::RUNNING => 4,
            lora::RESIDENT => 3,
            lora::WAITING => 2,
            lora::RUNNING_BLOCKED => 1,
            _ => 0,
        });
    (blocks > 0 || level > 0).then(|| (level << 61) | (u64::from(blocks.min((1 << 29) - 1)) << 32))
}

/// The speed class of `slot`: its GPU's prefill factor, as bits.
fn class_key(table: &EndpointTable, slot: u32) -> u64 {
    table
        .get(slot)
        .map_or(0, |ep| ep.speed.ln_prefill.to_bits())
}

/// Index of `key` among the classes seen so far, adding it while there is room.
fn class_of(keys: &mut [u64; CLASSES], n: &mut usize, key: u64) -> usize {
    if let Some(i) = keys[..*n].iter().position(|&k| k == key) {
        return i;
    }
    if *n < CLASSES {
        keys[*n] = key;
        *n += 1;
        return *n - 1;
    }
    CLASSES - 1
}

/// Fills `out` with the sample of `candidates` one pick scores: up to `k` of the pods [`keep`]
/// names, the preferred first, then up to `k` pods of each GPU speed class drawn at random
/// without replacement from the rest. `order` and `kept` are scratch space (the pods that may be
/// drawn, shuffled as far as the draw goes; the kept pods with their preference).
#[allow(clippy::too_many_arguments, reason = "scratch buffers of the caller")]
pub(crate) fn draw<R: Rng + ?Sized>(
    table: &EndpointTable,
    candidates: &[u32],
    matched: &[u32],
    adapter: Option<(&str, u64)>,
    k: usize,
    rng: &mut R,
    order: &mut Vec<u32>,
    kept: &mut Vec<(u64, u32)>,
    out: &mut Vec<u32>,
) {
    out.clear();
    order.clear();
    kept.clear();
    // Sized for every candidate once (the pods kept grow with what the pool learns), so that
    // later picks do not allocate.
    kept.reserve(candidates.len());
    let mut keys = [0u64; CLASSES];
    let mut classes = 0usize;
    // Per class: pods that may be drawn, and pods drawn so far.
    let mut size = [0usize; CLASSES];
    let mut taken = [0usize; CLASSES];
    let mut drawable = |slot: u32, order: &mut Vec<u32>| {
        let c = class_of(&mut keys, &mut classes, class_key(table, slot));
        size[c] += 1;
        order.push(slot);
    };
    for &slot in candidates {
        match keep(table, slot, matched, adapter) {
            Some(preference) => kept.push((preference, slot)),
            None => drawable(slot, order),
        }
    }
    if kept.len() > k {
        // The `k` preferred, ties at random; the others may still be drawn.
        for e in kept.iter_mut() {
            e.0 |= u64::from(rng.random::<u32>());
        }
        if k > 0 {
            kept.select_nth_unstable_by(k - 1, |a, b| b.0.cmp(&a.0));
        }
        for &(_, slot) in &kept[k..] {
            drawable(slot, order);
        }
        kept.truncate(k);
    }
    out.extend(kept.iter().map(|&(_, slot)| slot));
    let mut wanted: usize = (0..classes).map(|c| size[c].min(k)).sum();
    let n = order.len();
    let mut i = 0;
    while wanted > 0 && i < n {
        let j = rng.random_range(i..n);
        order.swap(i, j);
        let slot = order[i];
        i += 1;
        let c = class_of(&mut keys, &mut classes, class_key(table, slot));
        if taken[c] < k {
            taken[c] += 1;
            wanted -= 1;
            out.push(slot);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;
