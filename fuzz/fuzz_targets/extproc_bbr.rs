//! The body-based router's ext_proc state machine, fed any sequence of Envoy's messages. It
//! never panics, and:
//! - at most one immediate response, always the last answer, exactly when the stream closes;
//! - the request body comes back byte-identical (a prefix while some is still buffered; on
//!   streams with one request headers message, as Envoy sends), the response passes byte for
//!   byte, and no body is ever replaced;
//! - a routed request names a model of the table in `x-gateway-model-name`, its base model in
//!   `x-gateway-base-model-name`, and a `content-length` equal to the body re-sent;
//! - every request-headers answer removes each routing header the client sent (any letter case).
#![no_main]

use std::collections::BTreeMap;

use infergate_extproc::bbr::ModelsFile;
use infergate_extproc::fuzzing::Bbr;
use infergate_fuzz::{
    Kind, Mode, ROUTING_HEADERS, check_immediates, decode, is_request_headers, kind, removes,
    replaced_body, request_common, set_value, streamed_chunk,
};
use libfuzzer_sys::fuzz_target;

fn models() -> ModelsFile {
    ModelsFile {
        models: BTreeMap::from([
            (
                String::from("llama-3-8b"),
                vec![String::from("sql-lora"), String::from("chat-lora")],
            ),
            (String::from("qwen-2.5-7b"), Vec::new()),
            (String::from("m\"é"), vec![String::from("a")]),
        ]),
    }
}

fuzz_target!(|data: &[u8]| {
    let (setup, inputs) = decode(data);
    let table = models();
    let router = table.router().expect("the model table is valid");
    let mut bbr = Bbr::new(router, setup.max_body_bytes);
    let mut out = Vec::new();
    let (mut closed, mut mode_changed) = (false, false);
    // Envoy sends one request headers message per stream; after a second one (a new request on
    // the same stream, which Envoy never does) the bytes of the first need not reappear.
    let mut request_headers = 0;
    let (mut req_in, mut resp_in) = (Vec::new(), Vec::new());
    let mut last_request = None;
    let mut sent_routing: Vec<&str> = Vec::new();
    for input in inputs {
        mode_changed |= input.mode_change;
        let (k, body) = kind(&input.msg);
        match k {
            Kind::RequestHeaders(_) => {
                request_headers += 1;
                sent_routing = input.routing_headers.clone();
                last_request = Some(k);
            }
            Kind::RequestBody(_) | Kind::RequestTrailers => {
                req_in.extend_from_slice(body);
                last_request = Some(k);
            }
            Kind::ResponseBody(_) => resp_in.extend_from_slice(body),
            _ => {}
        }
        let before = out.len();
        let now_closed = bbr.feed(input.msg, &mut out);
        check_immediates(&out, before, now_closed);
        closed |= now_closed;
        let batch = &out[before..];
        for (i, a) in batch.iter().enumerate() {
            let Some(common) = request_common(a) else {
                if is_request_headers(a) {
                    assert!(
                        sent_routing.is_empty(),
                        "client routing headers {sent_routing:?} kept"
                    );
                }
                continue;
            };
            if is_request_headers(a) || set_value(common, ROUTING_HEADERS[0]).is_some() {
                for name in &sent_routing {
                    assert!(removes(common, name), "client header {name} not removed");
                }
            }
            let Some(model) = set_value(common, ROUTING_HEADERS[0]) else {
                continue;
            };
            let model = std::str::from_utf8(model).expect("model header is not UTF-8");
            let base = set_value(common, ROUTING_HEADERS[1]).expect("no base model header");
            let known = table
                .models
                .iter()
                .find(|(b, adapters)| *b == model || adapters.iter().any(|a| a == model));
            let (b, _) = known.unwrap_or_else(|| panic!("routed to unknown model {model:?}"));
            assert_eq!(base, b.as_bytes(), "wrong base model for {model:?}");
            assert!(common.clear_route_cache);
            if setup.request_mode == Mode::FullDuplex && !mode_changed {
                let len = set_value(common, "content-length").expect("no content-length");
                let len: usize = std::str::from_utf8(len).unwrap().parse().unwrap();
                let sent: usize = batch[i + 1..]
                    .iter()
                    .filter_map(streamed_chunk)
                    .filter(|c| c.0)
                    .map(|c| c.1.len())
                    .sum();
                assert_eq!(len, sent, "content-length {len}, body re-sent {sent}");
            }
        }
        if closed {
            break;
        }
    }
    assert!(
        out.iter().filter_map(replaced_body).next().is_none(),
        "a body was replaced"
    );
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
        if setup.request_mode == Mode::FullDuplex && request_headers <= 1 {
            assert!(
                req_in.starts_with(&req_out),
                "the body re-sent is not the body received"
            );
            let flushed = matches!(
                last_request,
                Some(Kind::RequestBody(true) | Kind::RequestTrailers)
            );
            if flushed && !closed {
                assert_eq!(req_out, req_in, "body bytes held after its end");
            }
        }
        if setup.response_mode == Mode::FullDuplex && !closed {
            assert_eq!(resp_out, resp_in, "the response did not pass unchanged");
        }
    }
});
