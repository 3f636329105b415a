//! Shared pieces of the fuzz targets: how the ext_proc targets turn their input bytes into a
//! sequence of Envoy messages, and how they read the answers back.
//!
//! Input layout (every field is one byte unless said otherwise; a missing byte reads as 0):
//!
//! ```text
//! setup:    pool behaviour (bits 0-1), rewrite (bit 2), explain (bit 3),
//!           announced request body mode (bits 4-5: 0 none, 1 full duplex, 2 buffered, 3 streamed),
//!           announced response body mode (bits 6-7, same values)
//! limits:   body cap (bits 0-1: 64 B, 1 KiB, 64 KiB, 4 MiB), endpoint count - 1 (bits 2-4)
//! then messages until the input ends, each an op byte:
//!   bits 0-2 kind: 0 request headers, 1 request body, 2 request trailers, 3 response headers,
//!                  4 response body, 5 response trailers, 6 a large request body, 7 a body-mode
//!                  change carried by the next message
//!   bit 3    end_of_stream
//!   bits 4-7 argument
//! request headers: argument = path index (PATHS); then a flags byte: model header (bit 0),
//!   base-model header (bit 1), explain header (bit 2), routing headers in upper case (bit 3),
//!   subset hint (bits 4-5: none, empty, the first endpoints, junk); then each header value
//!   present as a length byte and that many bytes
//! request / response body: a 2-byte little-endian length and that many bytes
//! response headers: argument = status index (STATUSES), bit 3 of it = SSE content type; then a
//!   served-endpoint byte (0 none, 255 junk, n the n-th endpoint)
//! large request body: a byte n, then (n mod 32) × 4096 spaces
//! ```
//!
//! `make_seeds.py` writes seeds in this layout from real request and response bodies.

use std::collections::HashMap;
use std::net::SocketAddr;

use infergate_extproc::fuzzing::envoy_types::pb::envoy::config::core::v3::{
    HeaderMap, HeaderValue, Metadata,
};
use infergate_extproc::fuzzing::envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use infergate_extproc::fuzzing::envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use infergate_extproc::fuzzing::envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, CommonResponse, HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest,
    ProcessingResponse, ProtocolConfiguration, body_mutation,
};
use infergate_extproc::fuzzing::envoy_types::pb::google::protobuf::{
    ListValue, Struct, Value, value,
};
use infergate_extproc::fuzzing::{Behaviour, envoy_types};

pub use envoy_types::pb::envoy::service::ext_proc::v3 as pb;

/// Request paths a headers message can carry.
pub const PATHS: [&str; 8] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/models",
    "/v1/chat/completions?x=1",
    "",
    "/healthz",
];

/// Response statuses a headers message can carry (`"x"` is not a number).
pub const STATUSES: [&str; 8] = ["200", "200", "500", "503", "404", "429", "x", "100"];

/// Envoy's `BodySendMode` values for the two announcement bits.
const MODES: [i32; 4] = [4, 4, 2, 1];

/// The routing headers the body-based router owns.
pub const ROUTING_HEADERS: [&str; 2] = ["x-gateway-model-name", "x-gateway-base-model-name"];

/// The body modes of a stream, as the exchange sees them.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `FULL_DUPLEX_STREAMED` (also the default when nothing is announced).
    FullDuplex,
    /// `BUFFERED`.
    Buffered,
    /// `STREAMED` / `NONE`: the body is not used.
    HeadersOnly,
}

fn mode_of(bits: u8) -> Mode {
    match bits {
        2 => Mode::Buffered,
        3 => Mode::HeadersOnly,
        _ => Mode::FullDuplex,
    }
}

/// What the first two bytes set up.
#[derive(Clone, Debug)]
pub struct Setup {
    /// How the pool answers picks.
    pub behaviour: Behaviour,
    /// Whether the picker rewrites model names.
    pub rewrite: bool,
    /// Whether the picker honours the explain header.
    pub explain: bool,
    /// Request body mode for the whole stream (until a mode change).
    pub request_mode: Mode,
    /// Response body mode.
    pub response_mode: Mode,
    /// The request body cap.
    pub max_body_bytes: usize,
    /// The pool's endpoints.
    pub endpoints: Vec<SocketAddr>,
}

/// One decoded message, with what the checks need to know about it.
#[derive(Clone, Debug)]
pub struct Input {
    /// The message as Envoy sends it.
    pub msg: ProcessingRequest,
    /// Whether it changes the body modes (only the first message's announcement keeps the
    /// simple byte-for-byte checks meaningful).
    pub mode_change: bool,
    /// The routing headers (lowercase names) a request headers message carries.
    pub routing_headers: Vec<&'static str>,
    /// The subset hint a request headers message carries, `None` when absent.
    pub subset: Option<Vec<SocketAddr>>,
}

struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    fn u16(&mut self) -> usize {
        usize::from(self.byte()) | usize::from(self.byte()) << 8
    }
}

fn header(key: &str, value: &[u8]) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value: String::new(),
        raw_value: value.to_vec(),
    }
}

fn headers(list: Vec<HeaderValue>, end_of_stream: bool) -> HttpHeaders {
    HttpHeaders {
        headers: Some(HeaderMap { headers: list }),
        end_of_stream,
        ..HttpHeaders::default()
    }
}

fn metadata(namespace: &str, key: &str, v: value::Kind) -> Metadata {
    let ns = Struct {
        fields: HashMap::from([(key.to_owned(), Value { kind: Some(v) })]),
    };
    Metadata {
        filter_metadata: HashMap::from([(namespace.to_owned(), ns)]),
        ..Metadata::default()
    }
}

fn string_list(items: &[String]) -> value::Kind {
    value::Kind::ListValue(ListValue {
        values: items
            .iter()
            .map(|s| Value {
                kind: Some(value::Kind::StringValue(s.clone())),
            })
            .collect(),
    })
}

/// Decodes `data` into the stream's setup and its messages.
pub fn decode(data: &[u8]) -> (Setup, Vec<Input>) {
    let mut r = Reader { data };
    let setup_byte = r.byte();
    let limits = r.byte();
    let endpoints: Vec<SocketAddr> = (0..=(limits >> 2) & 7)
        .map(|i| SocketAddr::from(([10, 0, 0, i + 1], 8000)))
        .collect();
    let announced = (setup_byte >> 4) & 3 != 0 || setup_byte >> 6 != 0;
    let mut setup = Setup {
        behaviour: match setup_byte & 3 {
            0 | 1 => Behaviour::Route,
            2 => Behaviour::Shed,
            _ => [Behaviour::NoEndpoints, Behaviour::Stale][usize::from(limits >> 7)],
        },
        rewrite: setup_byte & 4 != 0,
        explain: setup_byte & 8 != 0,
        request_mode: mode_of((setup_byte >> 4) & 3),
        response_mode: mode_of(setup_byte >> 6),
        max_body_bytes: [64, 1 << 10, 1 << 16, 4 << 20][usize::from(limits & 3)],
        endpoints,
    };
    let mut out = Vec::new();
    let mut pending_config = announced.then_some(ProtocolConfiguration {
        request_body_mode: MODES[usize::from((setup_byte >> 4) & 3)],
        response_body_mode: MODES[usize::from(setup_byte >> 6)],
        ..ProtocolConfiguration::default()
    });
    let mut mode_change = false;
    // A bound on messages keeps one input's work small (the exchanges are linear in it anyway).
    while !r.data.is_empty() && out.len() < 256 {
        let op = r.byte();
        let eos = op & 8 != 0;
        let arg = op >> 4;
        let mut routing_headers = Vec::new();
        let mut subset = None;
        let mut metadata_context = None;
        let request = match op & 7 {
            0 => {
                let flags = r.byte();
                let mut list = vec![
                    header(":method", b"POST"),
                    header(":path", PATHS[usize::from(arg & 7)].as_bytes()),
                    header("content-type", b"application/json"),
                ];
                for (bit, name) in [(1, ROUTING_HEADERS[0]), (2, ROUTING_HEADERS[1])] {
                    if flags & bit != 0 {
                        let n = usize::from(r.byte());
                        let v = r.bytes(n);
                        let key = if flags & 8 != 0 {
                            name.to_ascii_uppercase()
                        } else {
                            name.to_owned()
                        };
                        list.push(header(&key, v));
                        routing_headers.push(name);
                    }
                }
                if flags & 4 != 0 {
                    list.push(header("x-infergate-explain", b"1"));
                }
                match (flags >> 4) & 3 {
                    0 => {}
                    1 => subset = Some(Vec::new()),
                    2 => {
                        subset = Some(setup.endpoints[..setup.endpoints.len().div_ceil(2)].to_vec())
                    }
                    _ => {
                        subset = Some(Vec::new());
                        metadata_context = Some(metadata(
                            "envoy.lb.subset_hint",
                            "x-gateway-destination-endpoint-subset",
                            value::Kind::StringValue(String::from("not-an-address, 10.0.0.1:")),
                        ));
                    }
                }
                if metadata_context.is_none()
                    && let Some(s) = &subset
                {
                    let items: Vec<String> = s.iter().map(SocketAddr::to_string).collect();
                    metadata_context = Some(metadata(
                        "envoy.lb.subset_hint",
                        "x-gateway-destination-endpoint-subset",
                        string_list(&items),
                    ));
                }
                Msg::RequestHeaders(headers(list, eos))
            }
            1 => {
                let n = r.u16();
                Msg::RequestBody(HttpBody {
                    body: r.bytes(n).to_vec(),
                    end_of_stream: eos,
                    ..HttpBody::default()
                })
            }
            2 => Msg::RequestTrailers(HttpTrailers::default()),
            3 => {
                let mut list = vec![header(":status", STATUSES[usize::from(arg & 7)].as_bytes())];
                list.push(header(
                    "content-type",
                    if arg & 8 != 0 {
                        b"text/event-stream"
                    } else {
                        b"application/json"
                    },
                ));
                list.push(header("content-length", b"100"));
                let served = r.byte();
                if served != 0 {
                    let v = match setup.endpoints.get(usize::from(served - 1)) {
                        Some(a) => a.to_string(),
                        None => String::from("junk"),
                    };
                    metadata_context = Some(metadata(
                        "envoy.lb",
                        "x-gateway-destination-endpoint-served",
                        value::Kind::StringValue(v),
                    ));
                }
                Msg::ResponseHeaders(headers(list, eos))
            }
            4 => {
                let n = r.u16();
                Msg::ResponseBody(HttpBody {
                    body: r.bytes(n).to_vec(),
                    end_of_stream: eos,
                    ..HttpBody::default()
                })
            }
            5 => Msg::ResponseTrailers(HttpTrailers::default()),
            6 => {
                // Up to 124 KiB: past the 62,000-byte chunk limit, and cheap to run.
                let n = usize::from(r.byte() % 32) * 4096;
                Msg::RequestBody(HttpBody {
                    body: vec![b' '; n],
                    end_of_stream: eos,
                    ..HttpBody::default()
                })
            }
            _ => {
                pending_config = Some(ProtocolConfiguration {
                    request_body_mode: MODES[usize::from(arg & 3)],
                    response_body_mode: MODES[usize::from(arg >> 2)],
                    ..ProtocolConfiguration::default()
                });
                mode_change = !out.is_empty();
                if out.is_empty() {
                    // Still the first message's announcement: the stream's modes from the start.
                    setup.request_mode = mode_of(arg & 3);
                    setup.response_mode = mode_of(arg >> 2);
                }
                continue;
            }
        };
        let protocol_config = pending_config.take();
        out.push(Input {
            mode_change: mode_change && protocol_config.is_some(),
            msg: ProcessingRequest {
                request: Some(request),
                metadata_context,
                protocol_config,
                ..ProcessingRequest::default()
            },
            routing_headers,
            subset,
        });
        mode_change = false;
    }
    (setup, out)
}

/// A streamed body chunk's bytes and end-of-stream flag, with whether it is on the request path.
pub fn streamed_chunk(a: &ProcessingResponse) -> Option<(bool, &[u8], bool)> {
    let (request, br) = match a.response.as_ref()? {
        Answer::RequestBody(b) => (true, b),
        Answer::ResponseBody(b) => (false, b),
        _ => return None,
    };
    match br.response.as_ref()?.body_mutation.as_ref()? {
        BodyMutation {
            mutation: Some(body_mutation::Mutation::StreamedResponse(s)),
        } => Some((request, &s.body, s.end_of_stream)),
        _ => None,
    }
}

/// A whole-body replacement (buffered mode), with whether it is on the request path.
pub fn replaced_body(a: &ProcessingResponse) -> Option<(bool, &[u8])> {
    let (request, br) = match a.response.as_ref()? {
        Answer::RequestBody(b) => (true, b),
        Answer::ResponseBody(b) => (false, b),
        _ => return None,
    };
    match br.response.as_ref()?.body_mutation.as_ref()? {
        BodyMutation {
            mutation: Some(body_mutation::Mutation::Body(b)),
        } => Some((request, b)),
        _ => None,
    }
}

/// The common response of a request-path answer (headers, or a buffered body), if any.
pub fn request_common(a: &ProcessingResponse) -> Option<&CommonResponse> {
    match a.response.as_ref()? {
        Answer::RequestHeaders(h) => h.response.as_ref(),
        Answer::RequestBody(b) => b.response.as_ref(),
        _ => None,
    }
}

/// The value a common response sets for `name`.
pub fn set_value<'c>(common: &'c CommonResponse, name: &str) -> Option<&'c [u8]> {
    common
        .header_mutation
        .as_ref()?
        .set_headers
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == name)
        .map(|h| h.raw_value.as_slice())
}

/// Whether a common response removes `name`.
pub fn removes(common: &CommonResponse, name: &str) -> bool {
    common
        .header_mutation
        .as_ref()
        .is_some_and(|m| m.remove_headers.iter().any(|r| r == name))
}

/// The stream-closing invariant, checked on the answers one message produced (`out[before..]`):
/// a message that closes the stream ends with exactly one immediate response, last; any other
/// produces none.
pub fn check_immediates(out: &[ProcessingResponse], before: usize, now_closed: bool) {
    let immediates = out[before..]
        .iter()
        .filter(|a| immediate_status(a).is_some())
        .count();
    if now_closed {
        assert_eq!(
            immediates, 1,
            "a closed stream ends with one immediate response"
        );
        assert!(
            out.last().and_then(immediate_status).is_some(),
            "not the last answer"
        );
    } else {
        assert_eq!(
            immediates, 0,
            "an immediate response that does not close the stream"
        );
    }
}

/// Whether an answer is an immediate response, and its status.
pub fn immediate_status(a: &ProcessingResponse) -> Option<i32> {
    match a.response.as_ref()? {
        Answer::ImmediateResponse(i) => Some(i.status.as_ref().map_or(0, |s| s.code)),
        _ => None,
    }
}

/// Whether an answer is a request-headers answer.
pub fn is_request_headers(a: &ProcessingResponse) -> bool {
    matches!(a.response, Some(Answer::RequestHeaders(_)))
}

/// What a message is, for the checks.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Request headers (with their end_of_stream).
    RequestHeaders(bool),
    /// A request body chunk (with its end_of_stream).
    RequestBody(bool),
    /// Request trailers.
    RequestTrailers,
    /// Response headers.
    ResponseHeaders(bool),
    /// A response body chunk.
    ResponseBody(bool),
    /// Response trailers.
    ResponseTrailers,
}

/// The kind of a decoded message, and the body bytes it carries.
pub fn kind(msg: &ProcessingRequest) -> (Kind, &[u8]) {
    match &msg.request {
        Some(Msg::RequestHeaders(h)) => (Kind::RequestHeaders(h.end_of_stream), &[]),
        Some(Msg::RequestBody(b)) => (Kind::RequestBody(b.end_of_stream), &b.body),
        Some(Msg::RequestTrailers(_)) => (Kind::RequestTrailers, &[]),
        Some(Msg::ResponseHeaders(h)) => (Kind::ResponseHeaders(h.end_of_stream), &[]),
        Some(Msg::ResponseBody(b)) => (Kind::ResponseBody(b.end_of_stream), &b.body),
        Some(Msg::ResponseTrailers(_)) | None => (Kind::ResponseTrailers, &[]),
    }
}
