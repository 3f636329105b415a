#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use infergate_scheduler::{CacheConfig, EngineType, LoraState, Timestamp};
use proptest::prelude::*;

use super::*;

const VLLM_IDLE: &str = include_str!("../../tests/fixtures/vllm-idle.txt");
const VLLM_QUEUED: &str = include_str!("../../tests/fixtures/vllm-queued-lora.txt");
const VLLM_AFTER: &str = include_str!("../../tests/fixtures/vllm-after-load.txt");
const SGLANG_BUSY: &str = include_str!("../../tests/fixtures/sglang-busy.txt");
const SGLANG_IDLE: &str = include_str!("../../tests/fixtures/sglang-idle.txt");
const SGLANG_DP2: &str = include_str!("../../tests/fixtures/sglang-dp2.txt");
const TGI_BUSY: &str = include_str!("../../tests/fixtures/tgi-busy.txt");
const TGI_IDLE: &str = include_str!("../../tests/fixtures/tgi-idle.txt");

const ALL: [(EngineType, &str); 8] = [
    (EngineType::Vllm, VLLM_IDLE),
    (EngineType::Vllm, VLLM_QUEUED),
    (EngineType::Vllm, VLLM_AFTER),
    (EngineType::Sglang, SGLANG_BUSY),
    (EngineType::Sglang, SGLANG_IDLE),
    (EngineType::Sglang, SGLANG_DP2),
    (EngineType::Tgi, TGI_BUSY),
    (EngineType::Tgi, TGI_IDLE),
];

fn parse(engine: EngineType, page: &str) -> Result<ParsedPage, ParseError> {
    parse_page(engine, page.as_bytes(), None, Timestamp::from_millis(7))
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn fixtures_are_complete_pages() {
    // Guard against someone trimming a fixture to the lines the parser reads.
    for (engine, page) in ALL {
        let families = page.lines().filter(|l| l.starts_with("# TYPE")).count();
        assert!(
            families >= 20,
            "{engine} fixture has only {families} families"
        );
        assert!(page.lines().count() >= 250, "{engine} fixture is trimmed");
    }
}

#[test]
fn vllm_queued_lora_page() {
    let p = parse(EngineType::Vllm, VLLM_QUEUED).unwrap();
    let s = &p.snapshot;
    assert_eq!(s.sampled_at, Timestamp::from_millis(7));
    assert_eq!((s.waiting, s.running), (6, 2));
    assert_eq!(s.kv_cache_usage, Some(0.000_244_170_430_960_810_6));
    // Newest series: running lora-a; waiting repeats it, so nothing is left waiting.
    assert_eq!(
        s.lora,
        Some(LoraState {
            max_lora: 2,
            running: strings(&["lora-a"]),
            waiting: vec![],
        })
    );
    assert_eq!(
        s.cache,
        Some(CacheConfig {
            block_size: 128,
            num_blocks: 8192
        })
    );
    // First scrape: lifetime ratio (0 hits of 16 queried tokens).
    assert_eq!(s.prefix_cache_hit_rate, Some(0.0));
    assert_eq!(
        p.counters,
        Some(PrefixCounters {
            queries: 16.0,
            hits: 0.0,
            hit_rate: Some(0.0)
        })
    );
}

#[test]
fn vllm_after_load_takes_newest_lora_series() {
    let s = parse(EngineType::Vllm, VLLM_AFTER).unwrap().snapshot;
    assert_eq!((s.waiting, s.running), (0, 12));
    let lora = s.lora.unwrap();
    assert_eq!(lora.running, strings(&["lora-a", "lora-b"]));
    assert!(lora.waiting.is_empty());
}

#[test]
fn vllm_idle_newest_series_is_the_empty_one() {
    let s = parse(EngineType::Vllm, VLLM_IDLE).unwrap().snapshot;
    assert_eq!((s.waiting, s.running), (0, 0));
    assert_eq!(s.kv_cache_usage, Some(0.0));
    assert_eq!(
        s.lora,
        Some(LoraState {
            max_lora: 2,
            running: vec![],
            waiting: vec![],
        })
    );
}

#[test]
fn vllm_hit_rate_is_per_interval() {
    // idle page: 1148 queries / 512 hits; after-load: 1246 / 512 → 98 new queries, 0 new hits.
    let idle = parse(EngineType::Vllm, VLLM_IDLE).unwrap();
    let first = idle.counters.unwrap();
    assert_eq!(first.hit_rate, Some(512.0 / 1148.0));
    let after = parse_page(
        EngineType::Vllm,
        VLLM_AFTER.as_bytes(),
        Some(&first),
        Timestamp::from_millis(57),
    )
    .unwrap();
    assert_eq!(after.snapshot.prefix_cache_hit_rate, Some(0.0));
    // No new queries: the last rate stands.
    let again = parse_page(
        EngineType::Vllm,
        VLLM_AFTER.as_bytes(),
        after.counters.as_ref(),
        Timestamp::from_millis(107),
    )
    .unwrap();
    assert_eq!(again.snapshot.prefix_cache_hit_rate, Some(0.0));
    // A counter that went down is an engine restart: the new totals are the interval.
    let restarted = PrefixCounters {
        queries: 5000.0,
        hits: 4000.0,
        hit_rate: Some(0.8),
    };
    let p = parse_page(
        EngineType::Vllm,
        VLLM_IDLE.as_bytes(),
        Some(&restarted),
        Timestamp::ZERO,
    )
    .unwrap();
    assert_eq!(p.snapshot.prefix_cache_hit_rate, Some(512.0 / 1148.0));
}

#[test]
fn hit_rate_edge_cases() {
    assert_eq!(hit_rate(0.0, 0.0, None), None);
    let prev = PrefixCounters {
        queries: 100.0,
        hits: 10.0,
        hit_rate: Some(0.1),
    };
    assert_eq!(hit_rate(200.0, 60.0, Some(&prev)), Some(0.5));
    assert_eq!(hit_rate(100.0, 10.0, Some(&prev)), Some(0.1));
    // Hits counted before their queries (scrape race) never give a rate above 1.
    assert_eq!(hit_rate(110.0, 30.0, Some(&prev)), Some(1.0));
}

#[test]
fn vllm_older_kv_name_is_read_when_the_current_one_is_absent() {
    let page = "vllm:num_requests_waiting 1\nvllm:num_requests_running 2\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.25\n";
    let s = parse(EngineType::Vllm, page).unwrap().snapshot;
    assert_eq!(s.kv_cache_usage, Some(0.25));
    // Both present: the current name wins.
    let both = format!("{page}vllm:kv_cache_usage_perc 0.5\n");
    assert_eq!(
        parse(EngineType::Vllm, &both)
            .unwrap()
            .snapshot
            .kv_cache_usage,
        Some(0.5)
    );
}

#[test]
fn vllm_minimal_page_reports_only_what_it_has() {
    let page = "vllm:num_requests_waiting 1\nvllm:num_requests_running 2\n";
    let p = parse(EngineType::Vllm, page).unwrap();
    let s = p.snapshot;
    assert_eq!((s.waiting, s.running), (1, 2));
    assert_eq!(s.kv_cache_usage, None);
    assert_eq!(s.lora, None);
    assert_eq!(s.cache, None);
    assert_eq!(s.prefix_cache_hit_rate, None);
    assert_eq!(p.counters, None);
}

#[test]
fn vllm_cache_config_none_before_profiling() {
    let page = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1.0\n";
    assert_eq!(parse(EngineType::Vllm, page).unwrap().snapshot.cache, None);
}

#[test]
fn sglang_pages() {
    let s = parse(EngineType::Sglang, SGLANG_BUSY).unwrap().snapshot;
    assert_eq!((s.waiting, s.running), (7, 24));
    assert_eq!(s.kv_cache_usage, Some(0.63));
    assert_eq!(s.prefix_cache_hit_rate, Some(0.41));
    assert_eq!((s.lora.clone(), s.cache), (None, None));
    let s = parse(EngineType::Sglang, SGLANG_IDLE).unwrap().snapshot;
    assert_eq!((s.waiting, s.running, s.kv_cache_usage), (0, 0, Some(0.0)));
}

#[test]
fn sglang_data_parallel_ranks_are_aggregated() {
    let s = parse(EngineType::Sglang, SGLANG_DP2).unwrap().snapshot;
    // Counts summed over the two ranks, KV the fullest rank, hit rate the mean.
    assert_eq!((s.waiting, s.running), (4, 16));
    assert_eq!(s.kv_cache_usage, Some(0.5));
    assert_eq!(s.prefix_cache_hit_rate, Some(0.3));
}

#[test]
fn tgi_pages_have_no_kv_gauge() {
    let s = parse(EngineType::Tgi, TGI_BUSY).unwrap().snapshot;
    assert_eq!((s.waiting, s.running), (5, 12));
    assert_eq!(
        s.kv_cache_usage, None,
        "TGI has no KV gauge: unknown, not zero"
    );
    assert_eq!(s.prefix_cache_hit_rate, None);
    let s = parse(EngineType::Tgi, TGI_IDLE).unwrap().snapshot;
    assert_eq!((s.waiting, s.running), (0, 0));
}

#[test]
fn reading_a_page_as_the_wrong_engine_is_a_missing_family() {
    let err = parse(EngineType::Tgi, VLLM_IDLE).unwrap_err();
    assert_eq!(
        err,
        ParseError::MissingFamily {
            engine: EngineType::Tgi,
            family: "tgi_queue_size"
        }
    );
    assert!(err.to_string().contains("tgi_queue_size"));
    assert!(matches!(
        parse(EngineType::Vllm, SGLANG_BUSY),
        Err(ParseError::MissingFamily { .. })
    ));
}

#[test]
fn missing_running_family_is_an_error() {
    let err = parse(EngineType::Vllm, "vllm:num_requests_waiting 1\n").unwrap_err();
    assert_eq!(
        err,
        ParseError::MissingFamily {
            engine: EngineType::Vllm,
            family: "vllm:num_requests_running"
        }
    );
}

#[test]
fn empty_and_garbage_pages() {
    assert!(matches!(
        parse(EngineType::Vllm, ""),
        Err(ParseError::MissingFamily { .. })
    ));
    let garbage: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    let err = parse_page(EngineType::Vllm, &garbage, None, Timestamp::ZERO).unwrap_err();
    assert_eq!(err, ParseError::Truncated);
    let mut garbage = garbage;
    garbage.push(b'\n');
    assert!(parse_page(EngineType::Vllm, &garbage, None, Timestamp::ZERO).is_err());
    assert!(matches!(
        parse(
            EngineType::Tgi,
            "<html><body>502 Bad Gateway</body></html>\n"
        ),
        Err(ParseError::MissingFamily { .. })
    ));
}

#[test]
fn truncated_last_line_is_rejected() {
    // "12.0" cut to "1" would read as one request: the missing newline gives it away.
    let cut = VLLM_AFTER.find("vllm:num_requests_running").unwrap()
        + "vllm:num_requests_running{engine=\"0\",model_name=\"tiny\"} 1".len();
    assert_eq!(
        parse(EngineType::Vllm, &VLLM_AFTER[..cut]),
        Err(ParseError::Truncated)
    );
}

#[test]
fn impossible_values_are_rejected() {
    let cases = [
        ("vllm:num_requests_waiting NaN\n", "not finite"),
        ("vllm:num_requests_waiting +Inf\n", "not finite"),
        ("vllm:num_requests_waiting -Inf\n", "not finite"),
        ("vllm:num_requests_waiting -1\n", "negative"),
        ("vllm:kv_cache_usage_perc 1.5\n", "above 1 for a fraction"),
        ("vllm:kv_cache_usage_perc -0.1\n", "negative"),
        ("vllm:prefix_cache_hits_total -3\n", "negative"),
        (
            "vllm:lora_requests_info{max_lora=\"1\"} NaN\n",
            "not finite",
        ),
    ];
    for (line, reason) in cases {
        let page = format!("vllm:num_requests_running 1\n{line}vllm:num_requests_waiting 0\n");
        match parse(EngineType::Vllm, &page) {
            Err(ParseError::InvalidValue {
                reason: r, line, ..
            }) => {
                assert_eq!(r, reason, "{page}");
                assert_eq!(line, 2);
            }
            other => panic!("{page}: {other:?}"),
        }
    }
}

#[test]
fn duplicate_series_are_rejected() {
    let page = "tgi_queue_size 1\ntgi_batch_current_size 2\ntgi_queue_size 3\n";
    assert_eq!(
        parse(EngineType::Tgi, page),
        Err(ParseError::DuplicateSeries {
            family: "tgi_queue_size",
            line: 3
        })
    );
    // Different label sets are different series, and are summed.
    let page =
        "tgi_queue_size{shard=\"0\"} 1\ntgi_queue_size{shard=\"1\"} 3\ntgi_batch_current_size 2\n";
    assert_eq!(parse(EngineType::Tgi, page).unwrap().snapshot.waiting, 4);
}

#[test]
fn malformed_lines_in_read_families_are_rejected_with_their_line() {
    let cases = [
        ("tgi_queue_size{a=\"1\" 3\n", "label set is not closed"),
        ("tgi_queue_size\n", "sample has no value"),
        ("tgi_queue_size abc\n", "sample value is not a number"),
        (
            "tgi_queue_size 1 2 3\n",
            "unexpected text after the sample value",
        ),
    ];
    for (line, reason) in cases {
        let page = format!("tgi_batch_current_size 2\n{line}");
        assert_eq!(
            parse(EngineType::Tgi, &page),
            Err(ParseError::Malformed { line: 2, reason }),
            "{page}"
        );
    }
    // A timestamp after the value is valid exposition format.
    let page = "tgi_batch_current_size 2 1700000000000\ntgi_queue_size 1\n";
    assert_eq!(parse(EngineType::Tgi, page).unwrap().snapshot.running, 2);
}

#[test]
fn malformed_lines_in_other_families_are_skipped() {
    let page =
        "garbage{{{ line\nsome_other_metric NaN\ntgi_queue_size 1\ntgi_batch_current_size 2\n";
    assert_eq!(parse(EngineType::Tgi, page).unwrap().snapshot.waiting, 1);
}

#[test]
fn lora_labels_are_parsed_with_escapes_and_bad_max_lora_is_an_error() {
    let page = "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\n\
        vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"a,b\\\"q\",waiting_lora_adapters=\"a,c\"} 20\n\
        vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"old\",waiting_lora_adapters=\"\"} 10\n";
    let lora = parse(EngineType::Vllm, page)
        .unwrap()
        .snapshot
        .lora
        .unwrap();
    assert_eq!(lora.max_lora, 4);
    assert_eq!(lora.running, strings(&["a", "b\"q"]));
    assert_eq!(lora.waiting, strings(&["c"]));

    let bad = "vllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:lora_requests_info{max_lora=\"many\"} 1\n";
    assert!(matches!(
        parse(EngineType::Vllm, bad),
        Err(ParseError::InvalidLabel {
            label: "max_lora",
            line: 3,
            ..
        })
    ));
}

#[test]
fn crlf_and_windows_line_ends_are_accepted() {
    let page = "tgi_queue_size 1\r\ntgi_batch_current_size 2\r\n";
    assert_eq!(parse(EngineType::Tgi, page).unwrap().snapshot.running, 2);
}

#[test]
fn error_labels_are_stable() {
    assert_eq!(ParseError::Truncated.metric_label(), "parse_truncated");
    assert_eq!(
        ParseError::MissingFamily {
            engine: EngineType::Tgi,
            family: "x"
        }
        .metric_label(),
        "parse_missing_family"
    );
}

/// The fields a snapshot claims must all come from the given page text.
fn claims_only_what_it_read(engine: EngineType, full: &ParsedPage, part: &ParsedPage) {
    let (f, p) = (&full.snapshot, &part.snapshot);
    // Required families are on every successful parse; the values may differ only if the cut page
    // holds fewer series of a summed family, which these fixtures do not (one series each) except
    // SGLang's data-parallel page, whose ranks are summed.
    if engine != EngineType::Sglang {
        assert_eq!((p.waiting, p.running), (f.waiting, f.running));
    }
    for (got, all) in [
        (p.kv_cache_usage, f.kv_cache_usage),
        (p.prefix_cache_hit_rate, f.prefix_cache_hit_rate),
    ] {
        if let Some(v) = got {
            assert!((0.0..=1.0).contains(&v));
            assert!(all.is_some(), "claims a field the full page does not have");
        }
    }
    if let Some(c) = p.cache {
        assert_eq!(Some(c), f.cache);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096), engine in 0usize..3) {
        let _ = parse_page(EngineType::ALL[engine], &bytes, None, Timestamp::ZERO);
    }

    #[test]
    fn arbitrary_lines_of_read_families_never_panic(
        lines in proptest::collection::vec(
            ("(vllm:num_requests_waiting|vllm:num_requests_running|vllm:lora_requests_info|vllm:cache_config_info|vllm:kv_cache_usage_perc)",
             "[{}=\",a-z0-9 .+\\-\\\\]{0,40}"),
            0..12),
    ) {
        let page: String = lines.iter().map(|(n, rest)| format!("{n}{rest}\n")).collect();
        let _ = parse_page(EngineType::Vllm, page.as_bytes(), None, Timestamp::ZERO);
    }

    #[test]
    fn truncated_fixtures_give_an_error_or_only_what_they_read(which in 0usize..8, cut in 0.0f64..1.0) {
        let (engine, page) = ALL[which];
        let full = parse(engine, page).unwrap();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let at = (cut * page.len() as f64) as usize;
        match parse_page(engine, &page.as_bytes()[..at], None, Timestamp::ZERO) {
            Err(_) => {}
            Ok(part) => claims_only_what_it_read(engine, &full, &part),
        }
    }
}

#[test]
fn family_blocks_decide_what_is_scanned() {
    // OpenMetrics-style counter TYPE (no `_total`) is still read; an unread family's block is
    // jumped over, including a stray sample of a read family placed inside it.
    let page = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3\n\
        # TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 4\n\
        # TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total 10\n\
        # TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total 5\n\
        # TYPE vllm:num_requests_waiting_by_reason gauge\n\
        vllm:num_requests_waiting_by_reason{reason=\"capacity\"} 9\n\
        vllm:kv_cache_usage_perc NaN\n";
    let p = parse(EngineType::Vllm, page).unwrap();
    assert_eq!((p.snapshot.waiting, p.snapshot.running), (3, 4));
    assert_eq!(p.snapshot.prefix_cache_hit_rate, Some(0.5));
    assert_eq!(p.snapshot.kv_cache_usage, None);
}

#[test]
fn type_lines_are_recognised() {
    assert_eq!(
        text::type_line_family(b"# TYPE vllm:x gauge"),
        Some(&b"vllm:x"[..])
    );
    assert_eq!(text::type_line_family(b"#TYPE\tx counter"), Some(&b"x"[..]));
    assert_eq!(text::type_line_family(b"# HELP x TYPE y"), None);
    assert_eq!(text::type_line_family(b"# TYPEx y"), None);
    assert_eq!(text::type_line_family(b"# TYPE "), None);
}

#[test]
fn skipping_finds_every_form_of_type_line_and_nothing_else() {
    let page = b"# TYPE skipped gauge\nskipped{y=\"TYPE x\"} 1\n# HELP x TYPE wanted\n\
        YY TYPE wanted\n  #  TYPE other counter\n#TYPE\twanted gauge\r\nwanted 1\n";
    let read = |f: &[u8]| f == b"wanted";
    let after = text::skip_to_read_block(page, 0, read);
    assert_eq!(&page[after..], b"wanted 1\n");
    // An indented TYPE line is found too, and a family that is never read runs to the end.
    let other = |f: &[u8]| f == b"other";
    let after = text::skip_to_read_block(page, 0, other);
    assert!(page[after..].starts_with(b"#TYPE\twanted"));
    assert_eq!(text::skip_to_read_block(page, 0, |_| false), page.len());
    assert_eq!(
        text::skip_to_read_block(page, page.len() + 5, read),
        page.len()
    );
    // A TYPE line at the very end without a newline.
    assert_eq!(
        text::skip_to_read_block(b"x 1\n# TYPE wanted", 0, read),
        b"x 1\n# TYPE wanted".len()
    );
}
