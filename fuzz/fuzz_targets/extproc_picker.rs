//! The endpoint picker's ext_proc state machine, fed any sequence of Envoy's messages (request
//! headers with subset hints, body chunks, trailers, response headers with the served endpoint,
//! response bodies; announced and changed body modes) on a scripted pool. It never panics, and:
//! - at most one immediate response, always the last answer, exactly when the stream closes;
//! - every destination list is non-empty, distinct, from the pool and within the subset hint;
//! - a routing answer's `content-length` is the length of the body chunks that follow it, each
//!   at most 62,000 bytes, only the last of them ending the stream;
//! - without a model rewrite the body re-sent is the body received (a prefix while some is
//!   still buffered; checked on streams with one request headers message, as Envoy sends) and the response passes byte for byte; with a rewrite to a shorter name
//!   the response never grows;
//! - every in-flight entry ends exactly once (completed, failed or cancelled), at most one is
//!   held at a time, and none signals its first token twice.
#![no_main]

use std::collections::HashMap;
use std::net::SocketAddr;

use infergate_extproc::fuzzing::{Picker, PickerOptions};
use infergate_fuzz::{
    Kind, Mode, check_immediates, decode, kind, replaced_body, request_common, set_value,
    streamed_chunk,
};
use libfuzzer_sys::fuzz_target;

const MAX_CHUNK: usize = 62_000;

fuzz_target!(|data: &[u8]| {
    let (setup, inputs) = decode(data);
    let model_rewrites = if setup.rewrite {
        // Requested names shorter than the served ones: a rewritten response only shrinks.
        HashMap::from([
            (
                String::from("llama-3-8b"),
                String::from("meta/llama-3-8b-instruct"),
            ),
            (String::from("m"), String::from("model-\"quoted\"")),
        ])
    } else {
        HashMap::new()
    };
    let mut picker = Picker::new(PickerOptions {
        behaviour: setup.behaviour,
        endpoints: setup.endpoints.clone(),
        max_body_bytes: setup.max_body_bytes,
        model_rewrites,
        explain_header: setup.explain,
    });
    let mut out = Vec::new();
    let (mut closed, mut mode_changed) = (false, false);
    // Envoy sends one request headers message per stream; after a second one (a new request on
    // the same stream, which Envoy never does) the bytes of the first need not reappear.
    let mut request_headers = 0;
    let (mut req_in, mut resp_in) = (Vec::new(), Vec::new());
    let (mut resp_msgs, mut last_request) = (0_usize, None);
    let mut subset: Option<Vec<SocketAddr>> = None;
    for input in inputs {
        mode_changed |= input.mode_change;
        let (k, body) = kind(&input.msg);
        match k {
            Kind::RequestHeaders(_) => {
                request_headers += 1;
                subset = input.subset.clone();
                last_request = Some(k);
            }
            Kind::RequestBody(_) | Kind::RequestTrailers => {
                req_in.extend_from_slice(body);
                last_request = Some(k);
            }
            Kind::ResponseBody(_) => {
                resp_in.extend_from_slice(body);
                resp_msgs += 1;
            }
            _ => {}
        }
        let before = out.len();
        let now_closed = picker.feed(input.msg, &mut out);
        check_immediates(&out, before, now_closed);
        closed |= now_closed;
        let batch = &out[before..];
        check_batch(
            batch,
            &setup.endpoints,
            subset.as_deref(),
            setup.request_mode,
            mode_changed,
        );
        let live = picker.stats().live;
        assert!(live <= 1, "{live} in-flight entries held by one stream");
        if closed {
            break;
        }
    }

    if !mode_changed {
        let chunks = || out.iter().filter_map(streamed_chunk);
        // Joined slice by slice: a byte-wise iterator costs seconds on a 16 MB body here.
        let (mut req_out, mut resp_out) = (Vec::new(), Vec::new());
        for (request, body, _) in chunks() {
            if request {
                req_out.extend_from_slice(body);
            } else {
                resp_out.extend_from_slice(body);
            }
        }
        if setup.request_mode == Mode::FullDuplex && !setup.rewrite && request_headers <= 1 {
            assert!(
                req_in.starts_with(&req_out),
                "the body re-sent is not the body received"
            );
            let flushed = matches!(
                last_request,
                Some(Kind::RequestBody(true) | Kind::RequestTrailers)
            );
            if flushed && !closed {
                assert_eq!(req_out.len(), req_in.len(), "body bytes held after its end");
            }
        }
        if setup.response_mode == Mode::FullDuplex {
            if setup.rewrite {
                assert!(
                    resp_out.len() <= resp_in.len(),
                    "a rewrite to a shorter name grew the response"
                );
            } else if !closed {
                assert_eq!(resp_out, resp_in, "the response did not pass unchanged");
                assert!(
                    chunks().filter(|c| !c.0).count() >= resp_msgs,
                    "a response chunk unanswered"
                );
            }
        }
        if !setup.rewrite {
            assert!(
                out.iter().filter_map(replaced_body).next().is_none(),
                "a body replaced without a rewrite"
            );
        }
    }

    let stats = picker.end();
    assert_eq!(stats.live, 0, "an in-flight entry outlived its stream");
    assert_eq!(
        stats.picks,
        stats.completed + stats.failed + stats.cancelled,
        "entries not ended exactly once: {stats:?}"
    );
    assert!(
        stats.max_first_tokens <= 1,
        "a first token signalled twice: {stats:?}"
    );
});

fn check_batch(
    batch: &[infergate_fuzz::pb::ProcessingResponse],
    pool: &[SocketAddr],
    subset: Option<&[SocketAddr]>,
    mode: Mode,
    mode_changed: bool,
) {
    for (i, a) in batch.iter().enumerate() {
        if let Some((_, body, _)) = streamed_chunk(a) {
            assert!(body.len() <= MAX_CHUNK, "a chunk of {} bytes", body.len());
        }
        let Some(common) = request_common(a) else {
            continue;
        };
        let Some(dest) = set_value(common, "x-gateway-destination-endpoint") else {
            continue;
        };
        let dest = std::str::from_utf8(dest).expect("destination is not UTF-8");
        let list: Vec<SocketAddr> = dest
            .split(',')
            .map(|s| s.parse().expect("destination entry is not ip:port"))
            .collect();
        assert!(!list.is_empty());
        for (j, e) in list.iter().enumerate() {
            assert!(pool.contains(e), "{e} is not in the pool");
            assert!(
                subset.is_none_or(|s| s.contains(e)),
                "{e} is outside the subset hint"
            );
            assert!(!list[..j].contains(e), "{e} listed twice");
        }
        assert!(
            common.clear_route_cache,
            "a routing answer without clear_route_cache"
        );
        if mode == Mode::FullDuplex
            && !mode_changed
            && let Some(len) = set_value(common, "content-length")
        {
            let len: usize = std::str::from_utf8(len).unwrap().parse().unwrap();
            let chunks: Vec<_> = batch[i + 1..]
                .iter()
                .filter_map(streamed_chunk)
                .filter(|c| c.0)
                .collect();
            let sent: usize = chunks.iter().map(|c| c.1.len()).sum();
            assert_eq!(len, sent, "content-length {len}, body re-sent {sent}");
            for (j, c) in chunks.iter().enumerate() {
                assert!(
                    !c.2 || j + 1 == chunks.len(),
                    "end of stream before the last chunk"
                );
            }
        }
    }
}
