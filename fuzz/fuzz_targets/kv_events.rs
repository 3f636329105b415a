//! vLLM KV-event batches, as a pod's publisher sends them: `decode_batch` never panics, a batch
//! it accepts applies to the index without breaking its accounting (a cleared pod holds nothing),
//! and what it decoded re-encodes into both encodings and decodes again.
#![no_main]

use infergate_kvevents::event::{Batch, Encoding, Event, decode_batch, encode_batch};
use infergate_kvevents::index::{KvIndex, MatchScratch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(batch) = decode_batch(data) else {
        return;
    };
    let pod = "10.0.0.1:8000".parse().unwrap();
    let mut ix = KvIndex::new(1 << 20);
    ix.apply(pod, &batch);
    ix.set_synced(pod, true);
    let s = ix.stats();
    assert!(s.blocks <= s.entries, "{s:?}");
    assert_eq!(ix.pod_blocks(pod), s.entries);
    // A request made of the stored tokens matches at most what was stored.
    let tokens: Vec<u32> = batch
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Stored(s) => Some(s.token_ids.iter().copied()),
            _ => None,
        })
        .flatten()
        .take(4096)
        .collect();
    let (mut scratch, mut out) = (MatchScratch::default(), Vec::new());
    ix.match_tokens(None, None, &tokens, &mut scratch, &mut out);
    assert_eq!(out.len(), 1);
    for enc in [Encoding::Keyed, Encoding::Positional] {
        let again = decode_batch(&encode_batch(&batch, enc)).expect("re-encoded batch decodes");
        assert_eq!(again.events.len(), batch.events.len());
    }
    ix.apply(
        pod,
        &Batch {
            events: vec![Event::AllCleared],
            ..Default::default()
        },
    );
    let s = ix.stats();
    assert_eq!((s.blocks, s.entries), (0, 0), "{s:?}");
});
