//! Model-server responses: `extract_usage` never panics, and what `SseScanner` reports about a
//! stream does not depend on how the stream is cut into chunks.
#![no_main]

use infergate_openai::{SseScanner, extract_usage};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = extract_usage(data);

    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    let mut whole = SseScanner::new();
    whole.feed(stream);
    whole.finish();

    let mut parts = SseScanner::new();
    let mut first_token_signals = 0;
    let mut step = usize::from(cut % 31) + 1;
    let mut rest = stream;
    while !rest.is_empty() {
        let n = step.min(rest.len());
        if parts.feed(&rest[..n]) {
            first_token_signals += 1;
        }
        rest = &rest[n..];
        step = (step * 7 + usize::from(cut)) % 61 + 1;
    }
    parts.finish();

    assert!(first_token_signals <= 1, "first token signalled twice");
    assert!(first_token_signals == 0 || parts.saw_first_token());
    assert_eq!(whole.usage(), parts.usage());
    assert_eq!(whole.saw_first_token(), parts.saw_first_token());
    assert_eq!(whole.done(), parts.done());
    assert_eq!(whole.events(), parts.events());
    // Inputs here stay far below the line cap, so no line is ever skipped.
    assert!(!parts.overflowed());
});
