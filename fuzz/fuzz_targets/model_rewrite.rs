//! The response-path model-name rewriter: it never panics, its output does not depend on how the
//! response is cut into chunks, it holds back less than one pattern between chunks, a response
//! without `"model":` passes unchanged, and a rewrite to a name no longer than the served one
//! never grows the response.
#![no_main]

use infergate_extproc::rewrite::ModelRewriter;
use libfuzzer_sys::fuzz_target;

/// (served, requested) pairs: quotes and escapes, non-ASCII, a name inside the other, equal
/// names, an empty name.
const PAIRS: [(&str, &str); 8] = [
    ("meta/llama-3-8b-instruct", "llama-3-8b"),
    ("llama", "meta/llama-3-8b-instruct"),
    ("a", "b"),
    ("m\"q\\", "é"),
    ("same", "same"),
    ("x", "xx"),
    ("", "empty"),
    ("model", "\"model\":\"model\""),
];

fn name(data: &mut &[u8]) -> String {
    let Some((&n, rest)) = data.split_first() else {
        return String::new();
    };
    let n = usize::from(n % 16).min(rest.len());
    let s = String::from_utf8_lossy(&rest[..n]).into_owned();
    *data = &rest[n..];
    s
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, mut data)) = data.split_first() else {
        return;
    };
    let (served, requested) = if selector & 0x80 == 0 {
        let (s, r) = PAIRS[usize::from(selector & 7)];
        (s.to_owned(), r.to_owned())
    } else {
        (name(&mut data), name(&mut data))
    };
    let Some((&cut, body)) = data.split_first() else {
        return;
    };
    let quoted = |s: &str| serde_json::to_string(s).unwrap();
    let pattern_len = "\"model\": ".len() + quoted(&served).len();

    let whole = ModelRewriter::new(&served, &requested).feed(body, true);

    let mut r = ModelRewriter::new(&served, &requested);
    let mut split = Vec::new();
    let mut rest = body;
    let mut step = usize::from(cut % 17) + 1;
    let mut fed = 0;
    while !rest.is_empty() {
        let n = step.min(rest.len());
        split.extend(r.feed(&rest[..n], false));
        rest = &rest[n..];
        fed += n;
        assert!(
            r.held_back() < pattern_len,
            "held back {} bytes",
            r.held_back()
        );
        step = (step * 7 + usize::from(cut)) % 41 + 1;
    }
    split.extend(r.feed(&[], true));
    assert_eq!(r.held_back(), 0, "bytes held after the end of stream");
    assert_eq!(fed, body.len());
    assert_eq!(
        String::from_utf8_lossy(&split),
        String::from_utf8_lossy(&whole),
        "the output depends on the chunk boundaries"
    );

    if !body.windows(8).any(|w| w == b"\"model\":") {
        assert_eq!(whole, body, "a body without \"model\": changed");
    }
    if quoted(&requested).len() <= quoted(&served).len() {
        assert!(
            whole.len() <= body.len(),
            "a rewrite to a shorter name grew the body"
        );
    }
});
