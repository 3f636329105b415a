//! Envoy's data plane in miniature: routes a request through the picker's ext_proc stream, then
//! forwards it to the chosen endpoint over HTTP/1.1 and streams the response back through the
//! stream, as Envoy does with FULL_DUPLEX_STREAMED bodies.
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the helpers"
)]

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use infergate_extproc::wire;
use tokio::net::TcpStream;

use super::harness::*;

/// What came back.
#[derive(Debug)]
pub struct Forwarded {
    /// The endpoint list the picker answered.
    pub destination: String,
    /// The endpoint the request was sent to.
    pub endpoint: SocketAddr,
    /// The model server's status.
    pub status: u16,
    /// The pod that answered (the emulator's `x-infergate-pod`).
    pub pod: String,
    /// The response body as the client would see it (after the ext_proc echo).
    pub body: Vec<u8>,
    /// The request body as the picker sent it on (after any model rewrite).
    pub sent: Vec<u8>,
}

/// Routes and forwards one request. `body_chunk` is the size Envoy splits the body into.
pub async fn forward(envoy: &Envoy, path: &str, body: &[u8], body_chunk: usize) -> Forwarded {
    forward_with(envoy, path, &[], body, body_chunk).await
}

/// As [`forward`], with extra request headers.
pub async fn forward_with(
    envoy: &Envoy,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    body_chunk: usize,
) -> Forwarded {
    let mut ex = envoy.open().await;
    ex.send(request_headers(path, headers, false)).await;
    let chunks = split(body, &[body_chunk]);
    let last = chunks.len() - 1;
    for (i, c) in chunks.iter().enumerate() {
        ex.send(request_body(c, i == last)).await;
    }
    let route = headers_answer(&ex.next().await);
    let destination = route
        .header(wire::DESTINATION_HEADER)
        .expect("no destination")
        .to_owned();
    let resent: Vec<u8> = ex
        .streamed_body(true, usize::MAX)
        .await
        .into_iter()
        .flat_map(|(b, _)| b)
        .collect();
    let endpoint: SocketAddr = destination.split(',').next().unwrap().parse().unwrap();

    let stream = TcpStream::connect(endpoint).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method("POST")
        .uri(path)
        .header("host", "upstream")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(resent.clone())))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let pod = resp
        .headers()
        .get(infergate_sim::POD_HEADER)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let mut headers = response_headers(status, &content_type, false);
    headers.metadata_context = Some(wire::served_metadata(endpoint));
    ex.send(headers).await;
    let answer = ex.next().await;
    // Continue, or (a rewritten model name changes the length) drop `content-length`.
    assert!(
        is_response_headers_continue(&answer) || removes_content_length(&answer),
        "{answer:?}"
    );
    let mut out = Vec::new();
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame.unwrap().data_ref() {
            ex.send(response_body(data, false)).await;
            let echoed = ex.next().await;
            out.extend_from_slice(streamed(&echoed, false).0);
        }
    }
    ex.send(response_body(b"", true)).await;
    assert_eq!(streamed(&ex.next().await, false), (&b""[..], true));
    Forwarded {
        destination,
        endpoint,
        status,
        pod,
        body: out,
        sent: resent,
    }
}

fn removes_content_length(
    a: &envoy_types::pb::envoy::service::ext_proc::v3::ProcessingResponse,
) -> bool {
    use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
    matches!(&a.response, Some(Response::ResponseHeaders(h))
        if h.response.as_ref().and_then(|c| c.header_mutation.as_ref())
            .is_some_and(|m| m.remove_headers == ["content-length"] && m.set_headers.is_empty()))
}
