use super::*;
use proptest::prelude::*;

const STREAM: &str = concat!(
    "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n",
    "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n",
    "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\n\n",
    "data: {\"id\":\"1\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,\"total_tokens\":14,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n",
    "data: [DONE]\n\n",
);

fn expected() -> Usage {
    Usage {
        prompt_tokens: 12,
        completion_tokens: 2,
        cached_tokens: 8,
    }
}

#[test]
fn json_usage_is_read_with_cached_tokens() {
    let body = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}"#;
    assert_eq!(extract_usage(body), Some(expected()));
    let body = br#"{"usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
    assert_eq!(
        extract_usage(body),
        Some(Usage {
            prompt_tokens: 3,
            completion_tokens: 4,
            cached_tokens: 0
        })
    );
    // Responses API names.
    let body = br#"{"usage":{"input_tokens":5,"output_tokens":6,"input_tokens_details":{"cached_tokens":1}}}"#;
    assert_eq!(
        extract_usage(body),
        Some(Usage {
            prompt_tokens: 5,
            completion_tokens: 6,
            cached_tokens: 1
        })
    );
    assert_eq!(extract_usage(b"{}"), None);
    assert_eq!(extract_usage(b"garbage"), None);
    assert_eq!(extract_usage(br#"{"usage":"lots"}"#), None);
}

#[test]
fn stream_in_one_chunk() {
    let mut s = SseScanner::new();
    assert!(s.feed(STREAM.as_bytes()));
    s.finish();
    assert!(s.done() && s.saw_first_token());
    assert_eq!(s.usage(), Some(expected()));
    assert_eq!(s.events(), 4);
}

#[test]
fn role_only_chunk_is_not_the_first_token() {
    let mut s = SseScanner::new();
    let first_event_end = STREAM.find("\n\n").unwrap() + 2;
    assert!(!s.feed(&STREAM.as_bytes()[..first_event_end]));
    assert!(!s.saw_first_token());
    assert!(s.feed(&STREAM.as_bytes()[first_event_end..]));
}

#[test]
fn completions_text_and_crlf_lines() {
    let mut s = SseScanner::new();
    assert!(s.feed(b"data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\ndata: [DONE]\r\n"));
    assert!(s.done());
}

#[test]
fn final_line_without_newline_is_read_on_finish() {
    let mut s = SseScanner::new();
    s.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}");
    assert_eq!(s.usage(), None);
    s.finish();
    assert_eq!(s.usage().map(|u| u.prompt_tokens), Some(1));
}

#[test]
fn overlong_lines_are_skipped_and_reported() {
    let mut s = SseScanner::new();
    let big = vec![b'x'; MAX_SSE_LINE + 10];
    s.feed(b"data: ");
    s.feed(&big);
    s.feed(b"still the same line\n");
    assert!(s.overflowed());
    s.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n");
    assert!(
        s.saw_first_token(),
        "scanning resumes after the long line ends"
    );
}

#[test]
fn garbage_events_are_ignored() {
    let mut s = SseScanner::new();
    s.feed(b"data: {not json\n: comment\nevent: x\ndata: \"usage\"\n\n");
    assert!(!s.saw_first_token());
    assert_eq!(s.usage(), None);
}

proptest! {
    #[test]
    fn any_chunking_gives_the_same_result(cuts in proptest::collection::vec(0usize..STREAM.len(), 0..12)) {
        let mut cuts = cuts;
        cuts.sort_unstable();
        cuts.dedup();
        let bytes = STREAM.as_bytes();
        let mut s = SseScanner::new();
        let mut firsts = 0;
        let mut prev = 0;
        for c in cuts.into_iter().chain(std::iter::once(bytes.len())) {
            if s.feed(&bytes[prev..c]) { firsts += 1; }
            prev = c;
        }
        s.finish();
        prop_assert_eq!(firsts, 1);
        prop_assert_eq!(s.usage(), Some(expected()));
        prop_assert!(s.done());
    }

    #[test]
    fn arbitrary_bytes_never_panic(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8)) {
        let mut s = SseScanner::new();
        for c in &chunks { s.feed(c); }
        s.finish();
    }
}
