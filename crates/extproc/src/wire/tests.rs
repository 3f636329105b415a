use super::*;

use envoy_types::pb::envoy::config::core::v3::HeaderMap;

fn chunk_of(r: &ProcessingResponse) -> (&[u8], bool) {
    match &r.response {
        Some(processing_response::Response::RequestBody(b)) => {
            match b.response.as_ref().and_then(|c| c.body_mutation.as_ref()) {
                Some(BodyMutation {
                    mutation: Some(body_mutation::Mutation::StreamedResponse(s)),
                }) => (&s.body, s.end_of_stream),
                other => panic!("not a streamed chunk: {other:?}"),
            }
        }
        other => panic!("not a request body response: {other:?}"),
    }
}

#[test]
fn chunks_are_at_most_62000_bytes_and_only_the_last_ends_the_stream() {
    for len in [
        0,
        1,
        MAX_CHUNK - 1,
        MAX_CHUNK,
        MAX_CHUNK + 1,
        3 * MAX_CHUNK + 17,
    ] {
        let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        // An answer already queued (the headers response) stays first.
        let mut out = vec![request_headers(None)];
        push_chunks(&mut out, true, body.clone(), true);
        assert_eq!(out.len(), 1 + len.div_ceil(MAX_CHUNK).max(1), "len {len}");
        let out = &out[1..];
        let mut joined = Vec::new();
        for (i, r) in out.iter().enumerate() {
            let (b, eos) = chunk_of(r);
            assert!(b.len() <= MAX_CHUNK);
            assert_eq!(eos, i + 1 == out.len(), "len {len} chunk {i}");
            joined.extend_from_slice(b);
        }
        assert_eq!(joined, body);
    }
    for len in [3, 2 * MAX_CHUNK + 1] {
        let mut out = Vec::new();
        push_chunks(&mut out, true, vec![7; len], false);
        assert!(
            out.iter().all(|r| !chunk_of(r).1),
            "trailers follow: no end of stream"
        );
    }
}

#[test]
fn the_first_chunk_is_the_bodys_own_buffer() {
    for len in [1_000, MAX_CHUNK, 2 * MAX_CHUNK + 5] {
        let body = vec![1_u8; len];
        let ptr = body.as_ptr();
        let mut out = Vec::new();
        push_chunks(&mut out, true, body, true);
        assert_eq!(chunk_of(&out[0]).0.as_ptr(), ptr, "len {len}: copied");
    }
}

#[test]
fn subset_hint_reads_lists_and_skips_junk() {
    let a: SocketAddr = "10.0.0.1:8000".parse().unwrap();
    let b: SocketAddr = "[::1]:9".parse().unwrap();
    assert_eq!(
        subset_hint(Some(&subset_metadata(&[a, b]))),
        Some(vec![a, b])
    );
    assert_eq!(subset_hint(Some(&subset_metadata(&[]))), Some(vec![]));
    assert_eq!(subset_hint(None), None);
    assert_eq!(subset_hint(Some(&Metadata::default())), None);
    let mut md = subset_metadata(&[a]);
    if let Some(ns) = md.filter_metadata.get_mut(SUBSET_NAMESPACE) {
        ns.fields.insert(
            SUBSET_KEY.to_owned(),
            Value {
                kind: Some(value::Kind::StringValue("10.0.0.1:8000, bogus".into())),
            },
        );
    }
    assert_eq!(subset_hint(Some(&md)), Some(vec![a]));
}

#[test]
fn served_endpoint_round_trips() {
    let a: SocketAddr = "10.1.2.3:80".parse().unwrap();
    assert_eq!(served_endpoint(Some(&served_metadata(a))), Some(a));
    assert_eq!(served_endpoint(None), None);
}

#[test]
fn headers_are_read_from_raw_value_or_value() {
    let h = HttpHeaders {
        headers: Some(HeaderMap {
            headers: vec![
                HeaderValue {
                    key: ":path".into(),
                    value: String::new(),
                    raw_value: b"/v1/completions".to_vec(),
                },
                HeaderValue {
                    key: "X-Gateway-Model-Name".into(),
                    value: "m".into(),
                    raw_value: Vec::new(),
                },
            ],
        }),
        ..HttpHeaders::default()
    };
    assert_eq!(find_header(&h, ":path"), Some(&b"/v1/completions"[..]));
    assert_eq!(find_header(&h, MODEL_HEADER), Some(&b"m"[..]));
    assert_eq!(find_header(&h, "absent"), None);
}

#[test]
fn destination_metadata_is_namespaced_under_envoy_lb() {
    let md = destination_metadata("10.0.0.1:80,10.0.0.2:80");
    let Some(Value {
        kind: Some(value::Kind::StructValue(ns)),
    }) = md.fields.get(LB_NAMESPACE)
    else {
        panic!("no envoy.lb namespace: {md:?}");
    };
    assert_eq!(
        ns.fields
            .get(DESTINATION_HEADER)
            .and_then(|v| v.kind.clone()),
        Some(value::Kind::StringValue("10.0.0.1:80,10.0.0.2:80".into()))
    );
}

#[test]
fn immediate_errors_carry_status_json_and_retry_after() {
    let err = ApiError::Overloaded {
        model: "m".into(),
        retry_after: std::time::Duration::from_millis(1500),
    };
    let Some(processing_response::Response::ImmediateResponse(ir)) = immediate_error(&err).response
    else {
        panic!("not an immediate response");
    };
    assert_eq!(ir.status.map(|s| s.code), Some(429));
    let headers = ir.headers.unwrap().set_headers;
    let get = |k: &str| {
        headers
            .iter()
            .filter_map(|h| h.header.as_ref())
            .find(|h| h.key == k)
            .map(|h| h.raw_value.clone())
    };
    assert_eq!(get("retry-after"), Some(b"2".to_vec()));
    assert_eq!(get("content-type"), Some(b"application/json".to_vec()));
    let v: serde_json::Value = serde_json::from_slice(&ir.body).unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
}

#[test]
fn body_modes_follow_envoy_enum() {
    assert_eq!(
        BodyMode::from_envoy(BodySendMode::Buffered as i32),
        BodyMode::Buffered
    );
    assert_eq!(
        BodyMode::from_envoy(BodySendMode::None as i32),
        BodyMode::HeadersOnly
    );
    assert_eq!(
        BodyMode::from_envoy(BodySendMode::FullDuplexStreamed as i32),
        BodyMode::FullDuplex
    );
    assert_eq!(BodyMode::from_envoy(99), BodyMode::FullDuplex);
}

#[test]
fn endpoint_lists_are_written_as_display_writes_each_address() {
    let addrs: Vec<SocketAddr> = [
        "0.0.0.0:0",
        "10.0.0.7:8000",
        "255.255.255.255:65535",
        "192.168.10.1:9",
        "127.0.0.1:80",
        "[::1]:8000",
        "[fe80::1%2]:443",
        "[2001:db8::ff00:42:8329]:65535",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    let mut out = String::from("left over");
    write_endpoints(&mut out, &addrs);
    let expected: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    assert_eq!(out, expected.join(","));
    write_endpoints(&mut out, &addrs[1..2]);
    assert_eq!(out, "10.0.0.7:8000");
    write_endpoints(&mut out, &[]);
    assert_eq!(out, "");
    // Every octet and a spread of ports, against Display.
    for n in (0..=255u32).chain([256, 999, 1000, 8080, 9999, 10000, 65535]) {
        let a = SocketAddr::from(([n as u8, 1, 10, 100], n as u16));
        write_endpoints(&mut out, &[a]);
        assert_eq!(out, a.to_string());
    }
}
