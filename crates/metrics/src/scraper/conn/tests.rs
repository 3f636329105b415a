#![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

const PAGE: &[u8] = include_bytes!("../../../tests/fixtures/vllm-queued-lora.txt");
const CAP: usize = 1 << 20;

/// What the scripted server does after reading one request.
#[derive(Clone)]
enum Step {
    /// Write these bytes and keep the connection.
    Send(Vec<u8>),
    /// Write these bytes and close the connection.
    SendClose(Vec<u8>),
}

/// A server on 127.0.0.1 that answers the n-th request (over all connections) with `script[n]`
/// (the last step repeats) and counts connections and requests.
struct Scripted {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    requests_seen: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

async fn scripted(script: Vec<Step>) -> Scripted {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let requests_seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let script = Arc::new(script);
    let (c, r, seen) = (
        Arc::clone(&connections),
        Arc::clone(&requests),
        Arc::clone(&requests_seen),
    );
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            let (script, r, seen) = (Arc::clone(&script), Arc::clone(&r), Arc::clone(&seen));
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 1024];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    seen.lock().unwrap().push(buf.drain(..end).collect());
                    let n = r.fetch_add(1, Ordering::SeqCst);
                    let step = script[n.min(script.len() - 1)].clone();
                    match step {
                        Step::Send(bytes) => {
                            if stream.write_all(&bytes).await.is_err() {
                                return;
                            }
                        }
                        Step::SendClose(bytes) => {
                            let _ = stream.write_all(&bytes).await;
                            return;
                        }
                    }
                }
            });
        }
    });
    Scripted {
        addr,
        connections,
        requests,
        requests_seen,
    }
}

fn with_length(page: &[u8], extra_headers: &str) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 200 OK\r\ndate: Mon, 30 Nov 2026 06:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: {}\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n{extra_headers}\r\n",
        page.len()
    )
    .into_bytes();
    out.extend_from_slice(page);
    out
}

fn chunked(page: &[u8], chunk: usize) -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for c in page.chunks(chunk) {
        out.extend_from_slice(format!("{:x};ext=1\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\nx-trailer: yes\r\n\r\n");
    out
}

fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::new(addr, &"/metrics".parse().unwrap(), None)
}

/// Bounds a step so that a client waiting forever fails the test instead of hanging it.
async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .unwrap()
}

/// One fetch with the cap `CAP`, bounded so that a client waiting forever fails the test.
async fn get(
    conn: &mut Option<Conn>,
    ep: &Endpoint,
    buf: &mut Vec<u8>,
) -> Result<Vec<u8>, ScrapeError> {
    let range = within(fetch(conn, ep, buf, CAP)).await?;
    Ok(buf[range].to_vec())
}

#[tokio::test]
async fn content_length_pages_reuse_one_connection() {
    let server = scripted(vec![Step::Send(with_length(PAGE, ""))]).await;
    let ep = endpoint(server.addr);
    let (mut conn, mut buf) = (None, Vec::new());
    for _ in 0..3 {
        assert_eq!(get(&mut conn, &ep, &mut buf).await.unwrap(), PAGE);
        assert!(conn.is_some());
    }
    assert_eq!(server.connections.load(Ordering::SeqCst), 1);
    assert_eq!(server.requests.load(Ordering::SeqCst), 3);
    let request = server.requests_seen.lock().unwrap()[0].clone();
    let request = String::from_utf8(request).unwrap();
    assert!(
        request.starts_with("GET /metrics HTTP/1.1\r\n"),
        "{request}"
    );
    assert!(
        request.contains(&format!("host: {}\r\n", server.addr)),
        "{request}"
    );
}

#[tokio::test]
async fn chunked_pages_are_decoded_in_place() {
    // Many chunks: each later chunk moves down onto the page.
    let server = scripted(vec![Step::Send(chunked(PAGE, 1000))]).await;
    let ep = endpoint(server.addr);
    let (mut conn, mut buf) = (None, Vec::new());
    for _ in 0..2 {
        assert_eq!(get(&mut conn, &ep, &mut buf).await.unwrap(), PAGE);
    }
    assert!(conn.is_some(), "trailers read: the connection stays usable");
    assert_eq!(server.connections.load(Ordering::SeqCst), 1);

    // One chunk: the page is returned where it arrived, not moved.
    let server = scripted(vec![Step::Send(chunked(PAGE, PAGE.len()))]).await;
    let ep = endpoint(server.addr);
    let (mut conn, mut buf) = (None, Vec::new());
    let range = within(fetch(&mut conn, &ep, &mut buf, CAP)).await.unwrap();
    let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".len();
    let size_line = format!("{:x};ext=1\r\n", PAGE.len()).len();
    assert_eq!(range.start, head + size_line);
    assert_eq!(&buf[range], PAGE);
}

#[tokio::test]
async fn connection_close_and_http_1_0_are_honoured() {
    for (response, keep) in [
        (with_length(PAGE, "connection: close\r\n"), false),
        (
            with_length(PAGE, "Connection: keep-alive, Close\r\n"),
            false,
        ),
        (
            b"HTTP/1.0 200 OK\r\ncontent-length: 3\r\n\r\nabc".to_vec(),
            false,
        ),
        (
            b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 3\r\n\r\nabc".to_vec(),
            true,
        ),
    ] {
        let server = scripted(vec![Step::Send(response)]).await;
        let ep = endpoint(server.addr);
        let (mut conn, mut buf) = (None, Vec::new());
        get(&mut conn, &ep, &mut buf).await.unwrap();
        assert_eq!(conn.is_some(), keep);
        get(&mut conn, &ep, &mut buf).await.unwrap();
        let expected = if keep { 1 } else { 2 };
        assert_eq!(server.connections.load(Ordering::SeqCst), expected);
    }
}

#[tokio::test]
async fn a_body_without_length_runs_to_the_close() {
    let mut response = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n".to_vec();
    response.extend_from_slice(PAGE);
    let server = scripted(vec![Step::SendClose(response)]).await;
    let ep = endpoint(server.addr);
    let (mut conn, mut buf) = (None, Vec::new());
    assert_eq!(get(&mut conn, &ep, &mut buf).await.unwrap(), PAGE);
    assert!(conn.is_none());
}

#[tokio::test]
async fn a_kept_alive_connection_the_server_closed_is_replaced_without_an_error() {
    // The server answers, then closes without saying so (its keep-alive timeout).
    let server = scripted(vec![Step::SendClose(with_length(PAGE, ""))]).await;
    let ep = endpoint(server.addr);
    let (mut conn, mut buf) = (None, Vec::new());
    for _ in 0..4 {
        assert_eq!(get(&mut conn, &ep, &mut buf).await.unwrap(), PAGE);
    }
    assert_eq!(server.connections.load(Ordering::SeqCst), 4);
    assert_eq!(server.requests.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_fresh_connection_closed_before_the_answer_is_an_error() {
    let server = scripted(vec![Step::SendClose(Vec::new())]).await;
    let ep = endpoint(server.addr);
    let (mut conn, mut buf) = (None, Vec::new());
    let err = get(&mut conn, &ep, &mut buf).await.unwrap_err();
    assert!(
        matches!(err, ScrapeError::Closed | ScrapeError::Io(_)),
        "{err:?}"
    );
    assert_eq!(err.metric_label(), "http");
    assert!(conn.is_none());
    assert_eq!(server.requests.load(Ordering::SeqCst), 1, "no retry");
}

#[tokio::test]
async fn cut_bodies_are_errors() {
    let mut short = with_length(PAGE, "");
    short.truncate(short.len() - 100);
    let mut cut_chunked = chunked(PAGE, 4096);
    cut_chunked.truncate(cut_chunked.len() - 20);
    for response in [
        short,
        cut_chunked,
        b"HTTP/1.1 200 OK\r\ncontent-le".to_vec(),
    ] {
        let server = scripted(vec![Step::SendClose(response)]).await;
        let ep = endpoint(server.addr);
        let (mut conn, mut buf) = (None, Vec::new());
        let err = get(&mut conn, &ep, &mut buf).await.unwrap_err();
        assert!(matches!(err, ScrapeError::Closed), "{err:?}");
        assert!(conn.is_none());
    }
}

/// Whether an error is the one a case expects.
type IsExpected = fn(&ScrapeError) -> bool;

#[tokio::test]
async fn bad_answers_are_typed_errors() {
    let oversized_head = format!(
        "HTTP/1.1 200 OK\r\nx-padding: {}\r\n\r\n",
        "a".repeat(MAX_HEAD_BYTES)
    );
    let many_headers = format!(
        "HTTP/1.1 200 OK\r\n{}content-length: 0\r\n\r\n",
        "x-h: 1\r\n".repeat(MAX_HEADERS + 1)
    );
    let cases: Vec<(Vec<u8>, IsExpected)> = vec![
        (
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 5\r\n\r\nerror".to_vec(),
            |e| matches!(e, ScrapeError::Status(s) if s.as_u16() == 500),
        ),
        (
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(),
            |e| matches!(e, ScrapeError::Status(s) if s.as_u16() == 404),
        ),
        (b"garbage\r\n\r\n".to_vec(), |e| {
            matches!(e, ScrapeError::Protocol(HttpError::Head(_)))
        }),
        (oversized_head.into_bytes(), |e| {
            matches!(e, ScrapeError::Protocol(HttpError::HeadTooLarge { .. }))
        }),
        (many_headers.into_bytes(), |e| {
            matches!(
                e,
                ScrapeError::Protocol(HttpError::Head(httparse::Error::TooManyHeaders))
            )
        }),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nabcdef".to_vec(),
            |e| matches!(e, ScrapeError::Protocol(HttpError::ContentLength)),
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n".to_vec(),
            |e| matches!(e, ScrapeError::Protocol(HttpError::ContentLength)),
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n".to_vec(),
            |e| matches!(e, ScrapeError::Protocol(HttpError::ContentLength)),
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n".to_vec(),
            |e| matches!(e, ScrapeError::Protocol(HttpError::TransferEncoding)),
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n".to_vec(),
            |e| matches!(e, ScrapeError::Protocol(HttpError::Chunk(_))),
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n"
                .to_vec(),
            |e| matches!(e, ScrapeError::Protocol(HttpError::Chunk(_))),
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffffff\r\n"
                .to_vec(),
            |e| matches!(e, ScrapeError::Protocol(HttpError::Chunk(_))),
        ),
    ];
    for (i, (response, check)) in cases.into_iter().enumerate() {
        let server = scripted(vec![Step::Send(response)]).await;
        let ep = endpoint(server.addr);
        let (mut conn, mut buf) = (None, Vec::new());
        let err = get(&mut conn, &ep, &mut buf).await.unwrap_err();
        assert!(check(&err), "case {i}: {err:?}");
        assert!(
            conn.is_none(),
            "case {i}: a failed exchange drops the connection"
        );
        assert!(!err.to_string().is_empty());
    }
}

#[tokio::test]
async fn pages_above_the_cap_are_refused_however_they_are_framed() {
    let cap = PAGE.len() - 1;
    let mut until_close = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
    until_close.extend_from_slice(PAGE);
    for response in [with_length(PAGE, ""), chunked(PAGE, 1000), until_close] {
        let server = scripted(vec![Step::SendClose(response)]).await;
        let ep = endpoint(server.addr);
        let (mut conn, mut buf) = (None, Vec::new());
        let err = within(fetch(&mut conn, &ep, &mut buf, cap))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ScrapeError::BodyTooLarge { limit } if limit == cap),
            "{err:?}"
        );
        // Refused before it was all read: the buffer never holds much more than the cap.
        assert!(buf.len() <= cap + MAX_HEAD_BYTES + READ_SPACE + 1);
    }
    // Exactly at the cap is fine.
    let server = scripted(vec![Step::Send(with_length(PAGE, ""))]).await;
    let ep = endpoint(server.addr);
    let (mut conn, mut buf) = (None, Vec::new());
    let page = within(fetch(&mut conn, &ep, &mut buf, PAGE.len()))
        .await
        .unwrap();
    assert_eq!(&buf[page], PAGE);
}

#[tokio::test]
async fn bytes_after_the_answer_drop_the_connection_but_not_the_page() {
    let mut response = with_length(PAGE, "");
    response.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    let server = scripted(vec![Step::Send(response)]).await;
    let ep = endpoint(server.addr);
    let (mut conn, mut buf) = (None, Vec::new());
    assert_eq!(get(&mut conn, &ep, &mut buf).await.unwrap(), PAGE);
    assert!(conn.is_none());
}

#[tokio::test]
async fn an_unreachable_endpoint_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let (mut conn, mut buf) = (None, Vec::new());
    let err = get(&mut conn, &endpoint(addr), &mut buf).await.unwrap_err();
    assert!(matches!(err, ScrapeError::Connect(_)), "{err:?}");
    assert_eq!(err.metric_label(), "connect");
}

#[test]
fn heads_are_parsed_into_framing_and_keep_alive() {
    let head = |s: &str| parse_head(s.as_bytes()).unwrap().unwrap();
    let h = head("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n");
    assert_eq!(
        (h.status.as_u16(), h.framing, h.keep_alive),
        (200, Framing::Length(12), true)
    );
    assert_eq!(h.len, 39);
    let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n");
    assert_eq!(h.framing, Framing::Chunked);
    let h = head("HTTP/1.1 204 No Content\r\n\r\n");
    assert_eq!(h.framing, Framing::Empty);
    let h = head("HTTP/1.0 200 OK\r\n\r\n");
    assert_eq!((h.framing, h.keep_alive), (Framing::UntilClose, false));
    // The same length twice is allowed; surrounding blanks are trimmed.
    let h = head("HTTP/1.1 200 OK\r\ncontent-length: 7\r\ncontent-length:  7 \r\n\r\n");
    assert_eq!(h.framing, Framing::Length(7));
    assert!(
        parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 1")
            .unwrap()
            .is_none()
    );
    assert!(parse_head(b"").unwrap().is_none());
    assert!(
        parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n").is_err()
    );
}

#[test]
fn chunk_sizes() {
    assert_eq!(chunk_size(b"1a\r").unwrap(), 26);
    assert_eq!(chunk_size(b"FF; name=value").unwrap(), 255);
    assert_eq!(chunk_size(b"0").unwrap(), 0);
    assert!(chunk_size(b"").is_err());
    assert!(chunk_size(b";x").is_err());
    assert!(chunk_size(b"-1").is_err());
    assert!(chunk_size(b"10000000000000000").is_err());
}

/// Feeds a chunked body to the decoder one byte at a time: every partial state is visited.
#[test]
fn dechunking_survives_any_split() {
    let page: Vec<u8> = (0..3000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut raw = Vec::new();
    for (i, c) in page.chunks(700).enumerate() {
        // Mixed line ends and extensions.
        let end = if i % 2 == 0 { "\r\n" } else { "\n" };
        raw.extend_from_slice(format!("{:X};i={i}{end}", c.len()).as_bytes());
        raw.extend_from_slice(c);
        raw.extend_from_slice(end.as_bytes());
    }
    raw.extend_from_slice(b"0\r\nt: 1\r\n\r\n");
    let head = b"HEAD".to_vec();
    let mut buf = head.clone();
    let mut d = Dechunk::new(head.len(), CAP);
    let mut done = false;
    for (i, b) in raw.iter().enumerate() {
        assert!(!done, "finished early at byte {i}");
        buf.push(*b);
        done = d.advance(&mut buf).unwrap();
        // Framing never piles up: the buffer holds the page so far plus a partial line.
        assert!(buf.len() <= head.len() + page.len() + MAX_CHUNK_LINE);
    }
    assert!(done);
    assert_eq!(&buf[d.page()], page.as_slice());
    assert_eq!(d.scan, buf.len());

    // The cap counts decoded bytes.
    let mut buf = raw.clone();
    let mut d = Dechunk::new(0, 1000);
    assert!(matches!(
        d.advance(&mut buf),
        Err(ScrapeError::BodyTooLarge { limit: 1000 })
    ));
}

#[test]
fn long_chunk_lines_and_trailers_are_refused() {
    let mut buf = vec![b'1'; MAX_CHUNK_LINE + 1];
    assert!(Dechunk::new(0, CAP).advance(&mut buf).is_err());
    let mut buf = b"0\r\n".to_vec();
    buf.extend(std::iter::repeat_n(b'x', MAX_HEAD_BYTES + 1));
    assert!(matches!(
        Dechunk::new(0, CAP).advance(&mut buf),
        Err(ScrapeError::Protocol(HttpError::HeadTooLarge { .. }))
    ));
}
