//! Building and reading ext_proc messages: the protocol details in one pure module.
//!
//! Everything here is synchronous and allocation-light; the stream state machines in
//! [`crate::picker`] and [`crate::bbr`] decide *what* to answer, this module spells it in Envoy's
//! types.

use std::collections::HashMap;
use std::net::SocketAddr;

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption, Metadata};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpHeaders,
    ImmediateResponse, ProcessingResponse, StreamedBodyResponse, TrailersResponse, body_mutation,
    processing_response,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value};
use infergate_openai::ApiError;

/// Header (and `envoy.lb` metadata key) naming the chosen endpoint and its fallbacks.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// Dynamic metadata namespace Envoy's load balancer reads the destination from.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// Metadata namespace carrying the proxy's subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// Key of the subset hint list inside [`SUBSET_NAMESPACE`].
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// Key (namespace [`LB_NAMESPACE`]) under which the proxy reports the endpoint it really used.
pub const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";
/// Header set by the body-based router: the model the request names.
pub const MODEL_HEADER: &str = "x-gateway-model-name";
/// Header set by the body-based router: the base model of a LoRA adapter.
pub const BASE_MODEL_HEADER: &str = "x-gateway-base-model-name";
/// The largest body chunk sent back in one streamed body response (EPP protocol: 62,000 bytes,
/// below gRPC's default 64 KiB message size with room for framing).
pub const MAX_CHUNK: usize = 62_000;

/// How Envoy sends a body to the server (the filter's `BodySendMode`, as far as it matters here).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BodyMode {
    /// `FULL_DUPLEX_STREAMED`: chunks arrive as seen; answers are a free-running stream of
    /// header response then streamed body responses.
    FullDuplex,
    /// `BUFFERED` (or `BUFFERED_PARTIAL`): one body message, one answer per message.
    Buffered,
    /// `NONE` or `STREAMED`: the body is not available to route on; the server answers headers at
    /// once.
    HeadersOnly,
}

impl BodyMode {
    /// The mode for Envoy's `BodySendMode` enum value; unknown values count as full duplex,
    /// the mode the EPP protocol requires.
    pub fn from_envoy(value: i32) -> BodyMode {
        match BodySendMode::try_from(value) {
            Ok(BodySendMode::Buffered | BodySendMode::BufferedPartial) => BodyMode::Buffered,
            Ok(BodySendMode::None | BodySendMode::Streamed) => BodyMode::HeadersOnly,
            _ => BodyMode::FullDuplex,
        }
    }
}

/// A header's value: Envoy sends `raw_value` (bytes) in current versions and `value` in older
/// ones; both are read.
pub fn header_value(h: &HeaderValue) -> &[u8] {
    if h.raw_value.is_empty() {
        h.value.as_bytes()
    } else {
        &h.raw_value
    }
}

/// The value of header `name` (lowercase) in a headers message.
pub fn find_header<'h>(headers: &'h HttpHeaders, name: &str) -> Option<&'h [u8]> {
    headers
        .headers
        .as_ref()?
        .headers
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(header_value)
}

/// The last value of header `name` (lowercase) in a headers message. Envoy sends each value of
/// a repeated header as its own entry, in the order they were added, and its filters add a
/// value after those the client sent (the JWT filter's claim-to-header copy appends): for a
/// header a filter in front writes, the last value is that filter's.
pub fn find_last_header<'h>(headers: &'h HttpHeaders, name: &str) -> Option<&'h [u8]> {
    headers
        .headers
        .as_ref()?
        .headers
        .iter()
        .rfind(|h| h.key.eq_ignore_ascii_case(name))
        .map(header_value)
}

/// A header that replaces any existing value (`OVERWRITE_IF_EXISTS_OR_ADD`), sent as `raw_value`.
pub fn set_header(key: &str, value: impl Into<Vec<u8>>) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            value: String::new(),
            raw_value: value.into(),
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    }
}

/// The subset hint: `Some(list)` when the proxy sent one (possibly empty, which admits no
/// endpoint), `None` when it did not. Entries that are not `ip:port` are skipped.
pub fn subset_hint(metadata: Option<&Metadata>) -> Option<Vec<SocketAddr>> {
    let ns = metadata?.filter_metadata.get(SUBSET_NAMESPACE)?;
    let value = ns.fields.get(SUBSET_KEY)?;
    let mut out = Vec::new();
    match &value.kind {
        Some(value::Kind::ListValue(list)) => {
            for v in &list.values {
                if let Some(value::Kind::StringValue(s)) = &v.kind {
                    out.extend(s.parse::<SocketAddr>().ok());
                }
            }
        }
        // Tolerate a single comma-separated string as well.
        Some(value::Kind::StringValue(s)) => {
            out.extend(
                s.split(',')
                    .filter_map(|p| p.trim().parse::<SocketAddr>().ok()),
            );
        }
        _ => {}
    }
    Some(out)
}

/// The endpoint the proxy reports having used (`envoy.lb` / [`SERVED_KEY`]), if any.
pub fn served_endpoint(metadata: Option<&Metadata>) -> Option<SocketAddr> {
    let ns = metadata?.filter_metadata.get(LB_NAMESPACE)?;
    match &ns.fields.get(SERVED_KEY)?.kind {
        Some(value::Kind::StringValue(s)) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Writes `a,b,c` into `out` (cleared first), each address as `Display` writes it.
pub fn write_endpoints(out: &mut String, endpoints: &[SocketAddr]) {
    out.clear();
    for (i, a) in endpoints.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_addr(out, a);
    }
}

/// Appends `a` as `Display` writes it. Every routing answer names its endpoints, and the
/// formatting machinery spent about 1,700 instructions on each IPv4 address; the numbers are
/// written with `itoa` here (IPv6 keeps `Display`: brackets, zero compression, scope).
fn push_addr(out: &mut String, a: &SocketAddr) {
    match a {
        SocketAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.ip().octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                out.push_str(digits.format(octet));
            }
            out.push(':');
            out.push_str(digits.format(v4.port()));
        }
        SocketAddr::V6(_) => {
            use std::fmt::Write as _;
            // Writing into a String cannot fail.
            let _ = write!(out, "{a}");
        }
    }
}

/// `dynamic_metadata` for a routing answer: `{"envoy.lb": {"x-gateway-destination-endpoint": v}}`.
pub fn destination_metadata(value: &str) -> Struct {
    let inner = Struct {
        fields: HashMap::from([(
            DESTINATION_HEADER.to_owned(),
            Value {
                kind: Some(value::Kind::StringValue(value.to_owned())),
            },
        )]),
    };
    Struct {
        fields: HashMap::from([(
            LB_NAMESPACE.to_owned(),
            Value {
                kind: Some(value::Kind::StructValue(inner)),
            },
        )]),
    }
}

/// A subset hint as Envoy sends it (used by test clients and the load example).
pub fn subset_metadata(endpoints: &[SocketAddr]) -> Metadata {
    let list = ListValue {
        values: endpoints
            .iter()
            .map(|a| Value {
                kind: Some(value::Kind::StringValue(a.to_string())),
            })
            .collect(),
    };
    let ns = Struct {
        fields: HashMap::from([(
            SUBSET_KEY.to_owned(),
            Value {
                kind: Some(value::Kind::ListValue(list)),
            },
        )]),
    };
    Metadata {
        filter_metadata: HashMap::from([(SUBSET_NAMESPACE.to_owned(), ns)]),
        ..Metadata::default()
    }
}

/// A served-endpoint report as Envoy sends it on the response path.
pub fn served_metadata(endpoint: SocketAddr) -> Metadata {
    let ns = Struct {
        fields: HashMap::from([(
            SERVED_KEY.to_owned(),
            Value {
                kind: Some(value::Kind::StringValue(endpoint.to_string())),
            },
        )]),
    };
    Metadata {
        filter_metadata: HashMap::from([(LB_NAMESPACE.to_owned(), ns)]),
        ..Metadata::default()
    }
}

/// A common response carrying header mutations (and `clear_route_cache` when asked).
pub fn common(set: Vec<HeaderValueOption>, clear_route_cache: bool) -> CommonResponse {
    CommonResponse {
        header_mutation: (!set.is_empty()).then(|| HeaderMutation {
            set_headers: set,
            remove_headers: Vec::new(),
        }),
        clear_route_cache,
        ..CommonResponse::default()
    }
}

/// A common response that removes the headers `remove` and sets `set`, with
/// `clear_route_cache` when asked. Envoy applies `remove_headers` before `set_headers`
/// (`MutationUtils::applyHeaderMutations`) and compares names case-insensitively, so a header
/// both removed and set ends with the set value only, whatever values it had before.
pub fn common_with_removals(
    set: Vec<HeaderValueOption>,
    remove: Vec<String>,
    clear_route_cache: bool,
) -> CommonResponse {
    CommonResponse {
        header_mutation: (!set.is_empty() || !remove.is_empty()).then_some(HeaderMutation {
            set_headers: set,
            remove_headers: remove,
        }),
        clear_route_cache,
        ..CommonResponse::default()
    }
}

/// `request_headers` answer.
pub fn request_headers(response: Option<CommonResponse>) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestHeaders(
            HeadersResponse { response },
        )),
        ..ProcessingResponse::default()
    }
}

/// `response_headers` answer that lets the response through unchanged.
pub fn response_headers_continue() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseHeaders(
            HeadersResponse { response: None },
        )),
        ..ProcessingResponse::default()
    }
}

/// Request header asking for the routing decision (`1`), and response header carrying it.
pub const EXPLAIN_HEADER: &str = "x-infergate-explain";

/// `response_headers` answer with header mutations: `set`, and `content-length` removed when
/// `drop_length` (see [`response_headers_drop_length`]).
pub fn response_headers_with(set: Vec<HeaderValueOption>, drop_length: bool) -> ProcessingResponse {
    let remove = if drop_length {
        vec![String::from("content-length")]
    } else {
        Vec::new()
    };
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseHeaders(
            HeadersResponse {
                response: Some(CommonResponse {
                    header_mutation: Some(HeaderMutation {
                        set_headers: set,
                        remove_headers: remove,
                    }),
                    ..CommonResponse::default()
                }),
            },
        )),
        ..ProcessingResponse::default()
    }
}

/// `response_headers` answer that removes `content-length` (the picker is about to change the
/// body's length by rewriting the model name; Envoy then frames the body itself).
pub fn response_headers_drop_length() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseHeaders(
            HeadersResponse {
                response: Some(CommonResponse {
                    header_mutation: Some(HeaderMutation {
                        set_headers: Vec::new(),
                        remove_headers: vec![String::from("content-length")],
                    }),
                    ..CommonResponse::default()
                }),
            },
        )),
        ..ProcessingResponse::default()
    }
}

/// One streamed body chunk (FULL_DUPLEX_STREAMED), on the request or the response path.
pub fn streamed_chunk(request: bool, body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    let br = BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(
                    StreamedBodyResponse {
                        body,
                        end_of_stream,
                        ..StreamedBodyResponse::default()
                    },
                )),
            }),
            ..CommonResponse::default()
        }),
    };
    ProcessingResponse {
        response: Some(if request {
            processing_response::Response::RequestBody(br)
        } else {
            processing_response::Response::ResponseBody(br)
        }),
        ..ProcessingResponse::default()
    }
}

/// Appends `body` to `out` as streamed chunks of at most [`MAX_CHUNK`] bytes; the last one carries
/// `end_of_stream`. An empty body becomes one empty chunk so that the end of stream is still sent.
///
/// The body's own buffer becomes the first chunk: a body of up to [`MAX_CHUNK`] bytes (nearly
/// every chat request) is moved, not copied; a longer one copies only what follows the first
/// chunk.
pub fn push_chunks(out: &mut Vec<ProcessingResponse>, request: bool, mut body: Vec<u8>, eos: bool) {
    if body.len() <= MAX_CHUNK {
        out.push(streamed_chunk(request, body, eos));
        return;
    }
    let n = body.len().div_ceil(MAX_CHUNK);
    let first = out.len();
    // Placeholder for the first chunk, filled once the rest has been copied out of `body`.
    out.push(ProcessingResponse::default());
    for (i, chunk) in body[MAX_CHUNK..].chunks(MAX_CHUNK).enumerate() {
        out.push(streamed_chunk(request, chunk.to_vec(), eos && i + 2 == n));
    }
    body.truncate(MAX_CHUNK);
    out[first] = streamed_chunk(request, body, false);
}

/// A buffered-mode body answer: optional header mutations, optional whole-body replacement.
pub fn buffered_body(
    request: bool,
    mut common: CommonResponse,
    body: Option<Vec<u8>>,
) -> ProcessingResponse {
    if let Some(b) = body {
        common.body_mutation = Some(BodyMutation {
            mutation: Some(body_mutation::Mutation::Body(b)),
        });
    }
    let br = BodyResponse {
        response: Some(common),
    };
    ProcessingResponse {
        response: Some(if request {
            processing_response::Response::RequestBody(br)
        } else {
            processing_response::Response::ResponseBody(br)
        }),
        ..ProcessingResponse::default()
    }
}

/// A trailers answer that changes nothing.
pub fn trailers_continue(request: bool) -> ProcessingResponse {
    let tr = TrailersResponse {
        header_mutation: None,
    };
    ProcessingResponse {
        response: Some(if request {
            processing_response::Response::RequestTrailers(tr)
        } else {
            processing_response::Response::ResponseTrailers(tr)
        }),
        ..ProcessingResponse::default()
    }
}

/// The client-visible error as an `ImmediateResponse`: its status, `content-type:
/// application/json`, `Retry-After` and the reason header when it has them, and the
/// OpenAI-style JSON body.
pub fn immediate_error(err: &ApiError) -> ProcessingResponse {
    let mut set = vec![set_header("content-type", "application/json")];
    if let Some(secs) = err.retry_after_secs() {
        set.push(set_header("retry-after", secs.to_string()));
    }
    if let Some(reason) = err.reason() {
        set.push(set_header(infergate_openai::REASON_HEADER, reason));
    }
    ProcessingResponse {
        response: Some(processing_response::Response::ImmediateResponse(
            ImmediateResponse {
                status: Some(HttpStatus {
                    code: i32::from(err.status()),
                }),
                headers: Some(HeaderMutation {
                    set_headers: set,
                    remove_headers: Vec::new(),
                }),
                body: err.to_json(),
                grpc_status: None,
                details: err.metric_label().to_owned(),
            },
        )),
        ..ProcessingResponse::default()
    }
}

#[cfg(test)]
mod tests;
