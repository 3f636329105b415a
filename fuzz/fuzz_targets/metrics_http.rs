//! The scraper's HTTP/1.1 client, fed from memory: the response-head parser never panics, and
//! the in-place chunked decoder gives the same answer however the body is cut into reads, and
//! a page it decodes decodes again unchanged when sent as one chunk.
#![no_main]

use infergate_metrics::scraper::fuzzing::{dechunk, head};
use libfuzzer_sys::fuzz_target;

const CAP: usize = 1 << 16;

fn outcome(r: Result<Option<Vec<u8>>, impl std::fmt::Display>) -> Result<Option<Vec<u8>>, ()> {
    r.map_err(|_| ())
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, body)) = data.split_first() else {
        return;
    };
    if let Ok(Some((len, status, _))) = head(body) {
        assert!(len <= body.len(), "head longer than its input");
        assert!((100..=999).contains(&status), "status {status}");
    }

    let whole = outcome(dechunk(&[body], CAP));
    let mut reads = Vec::new();
    let mut rest = body;
    let mut step = usize::from(cut % 13) + 1;
    while !rest.is_empty() {
        let n = step.min(rest.len());
        reads.push(&rest[..n]);
        rest = &rest[n..];
        step = (step * 5 + usize::from(cut)) % 29 + 1;
    }
    let split = outcome(dechunk(&reads, CAP));
    assert_eq!(whole, split, "the answer depends on how the body was read");

    if let Ok(Some(page)) = whole
        && !page.is_empty()
    {
        let mut again = format!("{:x}\r\n", page.len()).into_bytes();
        again.extend_from_slice(&page);
        again.extend_from_slice(b"\r\n0\r\n\r\n");
        assert_eq!(outcome(dechunk(&[&again], CAP)), Ok(Some(page)));
    }
});
