//! The decoder against payloads vLLM's own classes encoded (both encodings), round trips through
//! the encoder, and hostile bytes.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a failed test

use infergate_kvevents::DecodeError;
use infergate_kvevents::event::{
    Batch, Encoding, Event, ExtraKey, Removed, Stored, decode_batch, encode_batch,
};
use infergate_kvevents::msgpack::Writer;

fn expected_events(bytes_hash: u64) -> Vec<Event> {
    vec![
        Event::Stored(Stored {
            block_hashes: vec![(1u64 << 63) + 12345, 7, (-42i64) as u64],
            parent: None,
            token_ids: (100..148).collect(),
            block_size: 16,
            lora_name: None,
            lora_id: None,
            medium: Some("GPU".into()),
            extra_keys: vec![],
            group_idx: None,
            kv_cache_spec_kind: None,
        }),
        Event::Stored(Stored {
            block_hashes: vec![bytes_hash],
            parent: Some(7),
            token_ids: (200..216).collect(),
            block_size: 16,
            lora_name: Some("sql-lora".into()),
            lora_id: Some(3),
            medium: Some("GPU".into()),
            extra_keys: vec![],
            group_idx: Some(0),
            kv_cache_spec_kind: None,
        }),
        Event::Removed(Removed {
            block_hashes: vec![7],
            medium: Some("GPU".into()),
            group_idx: None,
        }),
        Event::AllCleared,
    ]
}

#[test]
fn vllm_keyed_and_positional_payloads_decode_to_the_same_events() {
    let keyed = decode_batch(include_bytes!("fixtures/keyed.msgpack")).unwrap();
    let positional = decode_batch(include_bytes!("fixtures/positional.msgpack")).unwrap();
    let Event::Stored(s) = &keyed.events[1] else {
        panic!("{:?}", keyed.events[1]);
    };
    let bytes_hash = s.block_hashes[0];
    let mut want = expected_events(bytes_hash);
    assert_eq!(keyed.ts, 1767225600.5);
    assert_eq!(keyed.data_parallel_rank, Some(0));
    assert_eq!(keyed.events, want);
    // The positional layout has no group_idx field.
    if let Event::Stored(s) = &mut want[1] {
        s.group_idx = None;
    }
    assert_eq!(positional.events, want);
    assert_eq!(positional.ts, keyed.ts);
    assert_eq!((keyed.unknown_events, positional.unknown_events), (0, 0));
}

#[test]
fn both_encodings_round_trip() {
    let batch = Batch {
        ts: 12.25,
        events: expected_events(99),
        data_parallel_rank: Some(2),
        unknown_events: 0,
    };
    for enc in [Encoding::Keyed, Encoding::Positional] {
        let got = decode_batch(&encode_batch(&batch, enc)).unwrap();
        assert_eq!(got, batch, "{enc:?}");
    }
}

/// A map-shaped batch, unknown keys, an unknown event type and trailing positional fields.
#[test]
fn unknown_keys_types_and_fields_are_skipped() {
    use infergate_kvevents::msgpack::Writer;
    let mut w = Writer::default();
    w.map(4)
        .str("ts")
        .float(1.0)
        .str("future_key")
        .array(2)
        .str("x")
        .nil();
    w.str("events").array(3);
    // Keyed, with a key from a later release holding a nested value.
    w.map(6)
        .str("type")
        .str("BlockRemoved")
        .str("block_hashes")
        .array(1)
        .uint(5);
    w.str("medium").nil().str("locality").str("LOCAL");
    w.str("new_thing").map(1).str("a").array(1).float(2.0);
    w.str("group_idx").uint(0);
    // An event type from the future.
    w.map(2)
        .str("type")
        .str("BlockPinned")
        .str("block_hashes")
        .array(1)
        .uint(1);
    // Positional with two trailing fields a later release appended.
    w.array(5)
        .str("BlockRemoved")
        .array(1)
        .uint(6)
        .str("GPU")
        .uint(0)
        .str("extra");
    w.str("data_parallel_rank").nil();
    let b = decode_batch(&w.buf).unwrap();
    assert_eq!(b.unknown_events, 1);
    assert_eq!(b.events.len(), 2);
    assert_eq!(
        b.events[1],
        Event::Removed(Removed {
            block_hashes: vec![6],
            medium: Some("GPU".into()),
            group_idx: Some(0)
        })
    );
}

#[test]
fn hostile_payloads_are_refused_not_trusted() {
    use infergate_kvevents::msgpack::Writer;
    // A length of 2^32-1 elements in a 6-byte buffer: refused before anything is reserved.
    assert_eq!(
        decode_batch(&[0x92, 0xcb, 0, 0, 0, 0]).unwrap_err(),
        DecodeError::Truncated
    );
    let huge_array = [0x92u8, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff];
    assert_eq!(
        decode_batch(&huge_array).unwrap_err(),
        DecodeError::Truncated
    );
    // Nesting past the limit.
    let mut deep = vec![0x92, 0x00, 0x91, 0x92, 0xa4];
    deep.extend_from_slice(b"Bogu");
    deep.extend(std::iter::repeat_n(0x91, 100));
    deep.push(0xc0);
    assert!(decode_batch(&deep).is_err());
    // A token id that does not fit u32, a negative block size.
    let mut w = Writer::default();
    w.array(2).float(0.0).array(1);
    w.array(5)
        .str("BlockStored")
        .array(1)
        .uint(1)
        .nil()
        .array(1)
        .uint(1 << 40);
    w.uint(16);
    assert!(decode_batch(&w.buf).is_err());
    let mut w = Writer::default();
    w.array(2).float(0.0).array(1);
    w.array(5)
        .str("BlockStored")
        .array(0)
        .nil()
        .array(0)
        .int(-16);
    assert!(decode_batch(&w.buf).is_err());
    // A BlockStored map without its token ids; a map event without a type.
    let mut w = Writer::default();
    w.array(2).float(0.0).array(1);
    w.map(3)
        .str("type")
        .str("BlockStored")
        .str("block_hashes")
        .array(0);
    w.str("block_size").uint(16);
    assert!(decode_batch(&w.buf).is_err());
    let mut w = Writer::default();
    w.array(2)
        .float(0.0)
        .array(1)
        .map(1)
        .str("block_hashes")
        .array(0);
    assert!(decode_batch(&w.buf).is_err());
    // Bytes after the batch; invalid UTF-8; the reserved byte; nothing at all.
    let mut ok = encode_batch(&Batch::default(), Encoding::Keyed);
    assert!(decode_batch(&ok).is_ok());
    ok.push(0);
    assert!(decode_batch(&ok).is_err());
    assert!(decode_batch(&[0x92, 0x00, 0x91, 0x91, 0xa2, 0xff, 0xfe]).is_err());
    assert!(decode_batch(&[0xc1]).is_err());
    assert!(decode_batch(&[]).is_err());
    // Every prefix of a real payload fails cleanly.
    let real = include_bytes!("fixtures/keyed.msgpack");
    for n in 0..real.len() {
        assert!(decode_batch(&real[..n]).is_err(), "prefix of {n} bytes");
    }
}

/// A keyed `BlockStored` of two 4-token blocks (tokens 100..108, no parent) as vLLM publishes
/// it, optionally under the adapter `sql-lora` (id 3): every block's `extra_keys` entry holds
/// what vLLM folds into the block hash besides the tokens — the adapter's name (its id in
/// releases before the name) in every block, multimodal identifiers where there are any, the
/// request's `cache_salt` in block 0 only (`generate_block_hash_extra_keys`,
/// `vllm/v1/core/kv_cache_utils.py`).
fn stored_blocks(lora: bool, first: impl Fn(&mut Writer), second: impl Fn(&mut Writer)) -> Vec<u8> {
    let mut w = Writer::default();
    w.array(2).float(1.0).array(1);
    w.map(10).str("type").str("BlockStored");
    w.str("block_hashes").array(2).uint(11).uint(12);
    w.str("parent_block_hash").nil();
    w.str("token_ids").array(8);
    for t in 100..108 {
        w.uint(t);
    }
    w.str("block_size").uint(4);
    if lora {
        w.str("lora_id").uint(3);
        w.str("medium").str("GPU");
        w.str("lora_name").str("sql-lora");
    } else {
        w.str("lora_id").nil();
        w.str("medium").str("GPU");
        w.str("lora_name").nil();
    }
    w.str("extra_keys").array(2);
    first(&mut w);
    second(&mut w);
    w.str("group_idx").uint(0);
    w.buf
}

type Extra = fn(&mut Writer);

fn no_key(w: &mut Writer) {
    w.nil();
}
fn name_key(w: &mut Writer) {
    w.array(1).str("sql-lora");
}

/// Leading tokens of 100..110 that `blocks` give a request under `lora` with `salt`.
fn matched(blocks: &[u8], lora: Option<&str>, salt: Option<&str>) -> u32 {
    use infergate_kvevents::{KvIndex, MatchScratch};
    let pod = "10.0.0.7:8000".parse().unwrap();
    let tokens: Vec<u32> = (100..110).collect();
    let batch = decode_batch(blocks).unwrap();
    let mut ix = KvIndex::new(1 << 20);
    ix.apply(pod, &batch);
    ix.set_synced(pod, true);
    let mut out = Vec::new();
    ix.match_tokens(lora, salt, &tokens, &mut MatchScratch::default(), &mut out);
    assert_eq!(out.len(), 1);
    out[0].1
}

#[test]
fn a_lora_requests_blocks_match_the_adapter_when_its_name_is_their_only_extra_key() {
    fn id(w: &mut Writer) {
        w.array(1).uint(3);
    }
    fn other(w: &mut Writer) {
        w.array(1).str("chat-lora");
    }
    fn mm(w: &mut Writer) {
        w.array(2).str("sql-lora").array(2).str("img-1").uint(0);
    }
    let cases: [(&str, Extra, Extra, u32); 5] = [
        ("the adapter's name", name_key, name_key, 8),
        ("the adapter's id", id, id, 8),
        ("no extra key", no_key, no_key, 8),
        ("another adapter's name", other, other, 0),
        ("a multimodal input", mm, mm, 0),
    ];
    for (what, first, second, want) in cases {
        let blocks = stored_blocks(true, first, second);
        assert_eq!(
            matched(&blocks, Some("sql-lora"), None),
            want,
            "extra keys: {what}"
        );
        assert_eq!(
            matched(&blocks, None, None),
            0,
            "a base-model request never matches: {what}"
        );
        assert_eq!(
            matched(&blocks, Some("sql-lora"), Some("salt")),
            0,
            "a salted request never matches unsalted blocks: {what}"
        );
    }
}

/// vLLM puts a request's `cache_salt` last in its first block's extra keys (after the adapter's
/// name); the index matches such blocks for a request with that salt (and that adapter) only.
#[test]
fn salted_blocks_match_requests_with_the_same_salt_only() {
    fn salt_a(w: &mut Writer) {
        w.array(1).str("tenant-a");
    }
    fn lora_salt_a(w: &mut Writer) {
        w.array(2).str("sql-lora").str("tenant-a");
    }
    fn two_strings(w: &mut Writer) {
        w.array(2).str("tenant-a").str("tenant-a");
    }
    // Base model, salted: block 0 carries the salt, block 1 nothing.
    let base = stored_blocks(false, salt_a, no_key);
    assert_eq!(matched(&base, None, Some("tenant-a")), 8);
    assert_eq!(matched(&base, None, Some("tenant-b")), 0, "another salt");
    assert_eq!(matched(&base, None, None), 0, "no salt");
    assert_eq!(matched(&base, None, Some("")), 0, "an empty salt is none");
    assert_eq!(matched(&base, Some("sql-lora"), Some("tenant-a")), 0);
    // Under an adapter: (name, salt) in block 0, the name alone after it.
    let lora = stored_blocks(true, lora_salt_a, name_key);
    assert_eq!(matched(&lora, Some("sql-lora"), Some("tenant-a")), 8);
    assert_eq!(matched(&lora, Some("sql-lora"), Some("tenant-b")), 0);
    assert_eq!(matched(&lora, Some("sql-lora"), None), 0);
    assert_eq!(matched(&lora, None, Some("tenant-a")), 0);
    // The salt alone under an adapter (the name missing), or a salt past block 0, are not what
    // vLLM sends for a salted text request: never matched.
    let no_name = stored_blocks(true, salt_a, name_key);
    assert_eq!(matched(&no_name, Some("sql-lora"), Some("tenant-a")), 0);
    let salt_later = stored_blocks(false, salt_a, salt_a);
    assert_eq!(
        matched(&salt_later, None, Some("tenant-a")),
        4,
        "block 0 only"
    );
    let two = stored_blocks(false, two_strings, no_key);
    assert_eq!(matched(&two, None, Some("tenant-a")), 0);
    // An unsalted unnamed block 0 still matches unsalted requests.
    let plain = stored_blocks(false, no_key, no_key);
    assert_eq!(matched(&plain, None, None), 8);
    assert_eq!(matched(&plain, None, Some("tenant-a")), 0);
}

/// A later event that continues a salted chain (its parent the salted block) stays under the
/// salt, as in vLLM, where only block 0 names it.
#[test]
fn blocks_that_continue_a_salted_chain_keep_its_salt() {
    use infergate_kvevents::{KvIndex, MatchScratch};
    let pod = "10.0.0.7:8000".parse().unwrap();
    let first = Stored {
        block_hashes: vec![21],
        token_ids: (0..4).collect(),
        block_size: 4,
        extra_keys: vec![Some(vec![ExtraKey::Str("t".into())])],
        ..Default::default()
    };
    let next = Stored {
        block_hashes: vec![22, 23],
        parent: Some(21),
        token_ids: (4..12).collect(),
        block_size: 4,
        ..Default::default()
    };
    let batch = Batch {
        events: vec![Event::Stored(first), Event::Stored(next)],
        ..Default::default()
    };
    let mut ix = KvIndex::new(1 << 20);
    ix.apply(
        pod,
        &decode_batch(&encode_batch(&batch, Encoding::Keyed)).unwrap(),
    );
    ix.set_synced(pod, true);
    let tokens: Vec<u32> = (0..12).collect();
    let mut out = Vec::new();
    let mut scratch = MatchScratch::default();
    ix.match_tokens(None, Some("t"), &tokens, &mut scratch, &mut out);
    assert_eq!(out, [(pod, 12)]);
    ix.match_tokens(None, None, &tokens, &mut scratch, &mut out);
    assert_eq!(out, [(pod, 0)]);
}

/// Extra keys survive the encoder in both encodings, as vLLM writes them: present only when
/// a block has any, each block's tuple an array (a block without keys `nil`).
#[test]
fn extra_keys_round_trip_in_both_encodings() {
    let mut raw = Writer::default();
    raw.array(2).str("img-1").uint(3);
    let stored = Stored {
        block_hashes: vec![1, 2, 3],
        token_ids: (0..12).collect(),
        block_size: 4,
        lora_id: Some(3),
        lora_name: Some("sql-lora".into()),
        medium: Some("GPU".into()),
        extra_keys: vec![
            Some(vec![
                ExtraKey::Str("sql-lora".into()),
                ExtraKey::Str("salt".into()),
            ]),
            Some(vec![ExtraKey::Int(3), ExtraKey::Other(raw.buf.clone())]),
            None,
        ],
        ..Default::default()
    };
    let batch = Batch {
        ts: 1.5,
        events: vec![Event::Stored(stored.clone())],
        data_parallel_rank: Some(0),
        unknown_events: 0,
    };
    for enc in [Encoding::Keyed, Encoding::Positional] {
        assert_eq!(
            decode_batch(&encode_batch(&batch, enc)).unwrap(),
            batch,
            "{enc:?}"
        );
    }
    // Without extra keys the field is left out, as msgspec leaves out a default.
    let plain = Batch {
        events: vec![Event::Stored(Stored {
            extra_keys: vec![],
            ..stored
        })],
        ..batch
    };
    let bytes = encode_batch(&plain, Encoding::Keyed);
    assert!(!bytes.windows(10).any(|w| w == b"extra_keys"));
    assert_eq!(decode_batch(&bytes).unwrap(), plain);
}

/// Extra keys that are not names or numbers vLLM writes — a lone string that is not UTF-8, a
/// negative number — are kept as they came, and what the encoder writes back (a lone element
/// wrapped in a tuple) decodes again. The fuzzer found a lone non-UTF-8 string that decoded,
/// whose re-encoding did not ("string not UTF-8"): read inside a tuple it was taken for a name.
#[test]
fn odd_extra_keys_survive_a_round_trip_through_the_encoder() {
    fn bad_utf8(w: &mut Writer) {
        // fixstr of two bytes, 0xff 0xfe: not UTF-8.
        w.raw(&[0xa2, 0xff, 0xfe]);
    }
    fn negative(w: &mut Writer) {
        w.array(2).int(-5).raw(&[0xa2, 0xff, 0xfe]);
    }
    let cases: [(&str, Extra, Extra); 3] = [
        ("a lone string that is not UTF-8", bad_utf8, no_key),
        (
            "a tuple with a negative number and such a string",
            negative,
            no_key,
        ),
        ("both", bad_utf8, negative),
    ];
    for (what, first, second) in cases {
        let batch = decode_batch(&stored_blocks(false, first, second)).expect(what);
        for enc in [Encoding::Keyed, Encoding::Positional] {
            let again = decode_batch(&encode_batch(&batch, enc))
                .unwrap_or_else(|e| panic!("{what}, {enc:?}: {e}"));
            assert_eq!(again.events.len(), batch.events.len(), "{what}");
            // Such keys make their blocks unmatchable, before and after.
            assert_eq!(matched(&encode_batch(&again, enc), None, None), 0, "{what}");
        }
    }
    // The input the fuzzer saved (fuzz/seeds/kv_events/extra-keys-not-utf8.msgpack).
    let saved = include_bytes!("../../../fuzz/seeds/kv_events/extra-keys-not-utf8.msgpack");
    let batch = decode_batch(saved).unwrap();
    for enc in [Encoding::Keyed, Encoding::Positional] {
        decode_batch(&encode_batch(&batch, enc)).unwrap();
    }
}
