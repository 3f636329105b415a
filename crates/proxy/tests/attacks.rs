//! Hostile clients against the gateway on 127.0.0.1, over real sockets: each attack is closed or
//! refused within its configured limit, memory stays bounded, and a normal client is served
//! meanwhile. The limits are set small (1–3 s timeouts) so that the tests are quick; the
//! defaults are in `docs/security.md`.
//!
//! These run on the real clock (loopback IO does not mix with tokio's paused time); each
//! asserts the moment a connection ended within a window around the configured limit.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a failed unwrap is a failed test"
)]

#[path = "common/upstream.rs"]
mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use infergate_proxy::{Gateway, GatewayConfig, WorkerListeners, serve_workers};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;
use upstream::{Behaviour, Upstream};

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

struct Running {
    gw: Gateway,
    _stop: oneshot::Sender<()>,
}

impl Running {
    fn addr(&self) -> SocketAddr {
        self.gw.http_addr()
    }
}

/// The gateway as `infergate gateway` runs it (two workers sharing the process-wide limits) in
/// front of `up`, with `limits` as the `limits:` section; returns once a request is served.
async fn start(up: &Upstream, limits: &str) -> Running {
    let yaml = format!(
        "auth: none\nlimits: {limits}\ntimeouts: {{ firstByteMs: 20000 }}\nmodels:\n  - name: m\n    \
         scheduler: {{ preset: round-robin }}\n    endpoints: [{}]\n",
        up.addr
    );
    let config = GatewayConfig::from_yaml(&yaml).unwrap();
    let local = "127.0.0.1:0".parse().unwrap();
    let listeners = WorkerListeners::bind(local, Some(local), 2).unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let gw = serve_workers(config, listeners, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let running = Running { gw, _stop: tx };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !chat_ok(running.addr()).await {
        assert!(Instant::now() < deadline, "the gateway never served");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running
}

/// Whether a normal client gets its chat answered (on a fresh connection).
async fn chat_ok(addr: SocketAddr) -> bool {
    match infergate_testkit::try_post(addr, "/v1/chat/completions", "application/json", CHAT).await
    {
        Ok(r) => r.status == 200,
        Err(_) => false,
    }
}

/// A gateway series' value from the admin port (0 when absent).
async fn metric(gw: &Running, name: &str) -> f64 {
    let page = infergate_testkit::get(gw.gw.admin_addr().unwrap(), "/metrics")
        .await
        .text();
    page.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .map_or(0.0, |v| v.parse().unwrap())
}

async fn eventually_metric(gw: &Running, name: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = metric(gw, name).await;
        if v == want {
            return;
        }
        assert!(Instant::now() < deadline, "{name} is {v}, never {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads until the server closes the connection (EOF or reset), returning what arrived and
/// when it closed, or panics after `within`.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (Vec<u8>, Instant) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => panic!(
                "still open after {within:?}; received {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => return (got, Instant::now()),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// The status code of an HTTP/1.1 response's first line.
fn status_of(response: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(response);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"))
}

fn assert_within(what: &str, elapsed: Duration, lo: Duration, hi: Duration) {
    assert!(
        elapsed >= lo && elapsed <= hi,
        "{what}: {elapsed:?} is outside {lo:?}..={hi:?}"
    );
}

#[tokio::test]
async fn a_client_that_sends_nothing_is_closed_within_the_header_timeout() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&up, "{ headerReadTimeoutMs: 1000 }").await;
    let before = metric(&gw, "infergate_gateway_header_timeouts_total").await;
    let opened = Instant::now();
    let mut silent = TcpStream::connect(gw.addr()).await.unwrap();
    // Served meanwhile.
    assert!(chat_ok(gw.addr()).await);
    let (got, closed) = read_until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    assert_within(
        "silent connection closed",
        closed - opened,
        Duration::from_millis(950),
        Duration::from_millis(2500),
    );
    eventually_metric(&gw, "infergate_gateway_header_timeouts_total", before + 1.0).await;
    assert_eq!(
        up.requests(),
        2,
        "only the normal client's requests reached the model server"
    );
}

#[tokio::test]
async fn an_h2_client_that_sends_only_its_preface_is_closed_within_the_header_timeout() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&up, "{ headerReadTimeoutMs: 1000 }").await;
    let opened = Instant::now();
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    s.write_all(h2::PREFACE).await.unwrap();
    s.write_all(&h2::frame(h2::SETTINGS, 0, 0, &[]))
        .await
        .unwrap();
    let (_, closed) = read_until_closed(&mut s, Duration::from_secs(5)).await;
    assert_within(
        "h2 connection without a stream closed",
        closed - opened,
        Duration::from_millis(950),
        Duration::from_millis(2500),
    );
    assert!(chat_ok(gw.addr()).await);
}

#[tokio::test]
async fn a_client_that_drips_its_headers_is_closed_within_the_header_timeout() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&up, "{ headerReadTimeoutMs: 2000 }").await;
    let opened = Instant::now();
    let s = TcpStream::connect(gw.addr()).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    // One byte a second of a head that never ends.
    let drip = tokio::spawn(async move {
        let head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Slow: aaaaaaaaaaaaaaaa";
        for b in head {
            if wr.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let mut buf = [0u8; 1024];
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(6), rd.read(&mut buf)).await {
            Err(_) => panic!("the dripping client is still connected after 6 s"),
            Ok(Ok(0)) | Ok(Err(_)) => break Instant::now(),
            // hyper may answer the timeout before closing; either way the connection ends.
            Ok(Ok(_)) => {}
        }
    };
    assert_within(
        "dripping client closed",
        closed - opened,
        Duration::from_millis(1900),
        Duration::from_millis(3500),
    );
    drip.abort();
    assert!(chat_ok(gw.addr()).await);
    assert_eq!(
        up.requests(),
        2,
        "the dripped request never reached the model server"
    );
}

#[tokio::test]
async fn a_body_dripped_one_byte_every_5_s_is_answered_408_at_the_body_timeout() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&up, "{ bodyReadTimeoutMs: 2000 }").await;
    let s = TcpStream::connect(gw.addr()).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    wr.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n\
          Content-Length: 1000\r\n\r\n",
    )
    .await
    .unwrap();
    let sent_head = Instant::now();
    let drip = tokio::spawn(async move {
        for _ in 0..1000 {
            if wr.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    });
    // A normal client is served while the body drips.
    assert!(chat_ok(gw.addr()).await);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = sent_head + Duration::from_secs(6);
    while !String::from_utf8_lossy(&got).contains("request_timeout") {
        match tokio::time::timeout_at(deadline, rd.read(&mut buf)).await {
            Err(_) => panic!("no 408 within 6 s: {:?}", String::from_utf8_lossy(&got)),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
    let answered = sent_head.elapsed();
    assert_eq!(status_of(&got), 408, "{}", String::from_utf8_lossy(&got));
    let text = String::from_utf8_lossy(&got).to_lowercase();
    assert!(text.contains("content-type: application/json"), "{text}");
    assert!(text.contains(r#""code":"request_timeout""#), "{text}");
    assert_within(
        "408",
        answered,
        Duration::from_millis(1950),
        Duration::from_millis(3500),
    );
    drip.abort();
    assert_eq!(
        up.requests(),
        2,
        "the dripped request never reached the model server"
    );
}

#[tokio::test]
async fn a_thousand_idle_connections_are_refused_beyond_max_connections_while_clients_are_served() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&up, "{ maxConnections: 500, headerReadTimeoutMs: 3000 }").await;
    // A client that connected before the flood keeps its keep-alive connection busy: a chat
    // every 100 ms, all through the flood.
    let stream = TcpStream::connect(gw.addr()).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
    let steady = tokio::spawn(async move {
        let mut statuses = Vec::new();
        loop {
            let req = http::Request::post("/v1/chat/completions")
                .header("host", "gw")
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(bytes::Bytes::from_static(
                    CHAT.as_bytes(),
                )))
                .unwrap();
            let status = match sender.send_request(req).await {
                Ok(r) => {
                    let s = r.status().as_u16();
                    http_body_util::BodyExt::collect(r.into_body())
                        .await
                        .unwrap();
                    s
                }
                Err(_) => 0,
            };
            statuses.push(status);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = &mut stop_rx => return statuses,
            }
        }
    });
    eventually_metric(&gw, "infergate_gateway_connections_open", 1.0).await;
    let refused_before = metric(&gw, "infergate_gateway_connections_refused_total").await;

    let flood_started = Instant::now();
    let mut idle = Vec::with_capacity(1000);
    for _ in 0..1000 {
        idle.push(TcpStream::connect(gw.addr()).await.unwrap());
    }
    // Each idle connection: closed at once (refused) or held until the head timeout.
    let watchers: Vec<_> = idle
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let (_, closed) = read_until_closed(&mut s, Duration::from_secs(8)).await;
                closed
            })
        })
        .collect();
    eventually_metric(&gw, "infergate_gateway_connections_open", 500.0).await;
    eventually_metric(
        &gw,
        "infergate_gateway_connections_refused_total",
        refused_before + 501.0,
    )
    .await;
    // A new client is refused while the gateway is full.
    assert!(!chat_ok(gw.addr()).await);
    let mut closes = Vec::new();
    for w in watchers {
        closes.push(w.await.unwrap() - flood_started);
    }
    closes.sort();
    let at_once = closes
        .iter()
        .filter(|d| **d < Duration::from_millis(2500))
        .count();
    // 500 slots: one for the steady client, 499 for idle ones, 501 refused (the new client
    // above was one more refusal, on its own connection).
    assert_eq!(at_once, 501, "closed at once: {:?}", &closes[..3]);
    // The 499 admitted idle ones end at the head timeout (3 s after each was accepted).
    let last = *closes.last().unwrap();
    assert_within(
        "last idle connection closed",
        last,
        Duration::from_millis(2900),
        Duration::from_millis(6000),
    );
    eventually_metric(&gw, "infergate_gateway_connections_open", 1.0).await;
    // New clients are served again; the steady client was served throughout.
    assert!(chat_ok(gw.addr()).await);
    stop_tx.send(()).unwrap();
    let statuses = steady.await.unwrap();
    assert!(statuses.len() >= 20, "{statuses:?}");
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
}

#[tokio::test]
async fn the_gateway_wide_request_slot_is_taken_before_the_body_is_read() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&up, "{ maxRequestsInFlight: 2, bodyReadTimeoutMs: 3000 }").await;
    // Two requests whose bodies never come hold both slots.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(gw.addr()).await.unwrap();
        s.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000\r\n\r\n{",
        )
        .await
        .unwrap();
        held.push(s);
    }
    eventually_metric(&gw, "infergate_gateway_requests_in_flight", 2.0).await;
    let r =
        infergate_testkit::post(gw.addr(), "/v1/chat/completions", "application/json", CHAT).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(
        r.text().contains(r#""code":"gateway_busy""#),
        "{}",
        r.text()
    );
    assert!(r.text().len() < 2048);
    // Once the held ones time out (408), the slots are free again.
    for mut s in held {
        let (got, _) = read_until_closed(&mut s, Duration::from_secs(6)).await;
        assert_eq!(status_of(&got), 408);
    }
    eventually_metric(&gw, "infergate_gateway_requests_in_flight", 0.0).await;
    assert!(chat_ok(gw.addr()).await);
}

#[tokio::test]
async fn an_oversized_head_is_431_and_a_1_mib_model_name_gets_a_small_404() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&up, "{ maxHeaderBytes: 16384 }").await;
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    let big = "a".repeat(20_000);
    s.write_all(
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Big: {big}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let (got, _) = read_until_closed(&mut s, Duration::from_secs(5)).await;
    assert_eq!(status_of(&got), 431);

    let name = "m".repeat(1 << 20);
    let body = format!(r#"{{"model":"{name}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    let r =
        infergate_testkit::post(gw.addr(), "/v1/chat/completions", "application/json", &body).await;
    assert_eq!(r.status, 404);
    assert!(r.body.len() < 2048, "{} bytes", r.body.len());
    assert!(
        r.text().contains(r#""code":"model_not_found""#),
        "{}",
        r.text()
    );
    assert!(r.text().contains('…'), "{}", r.text());
    assert_eq!(up.requests(), 1);
}

#[tokio::test]
async fn one_h2_connection_opening_streams_without_end_is_bounded_by_max_concurrent_streams() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(
        &up,
        "{ bodyReadTimeoutMs: 2000, http2: { maxConcurrentStreams: 4 } }",
    )
    .await;
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    s.write_all(h2::PREFACE).await.unwrap();
    s.write_all(&h2::frame(h2::SETTINGS, 0, 0, &[]))
        .await
        .unwrap();
    let mut reader = h2::Reader::default();
    // The server's settings: acknowledged, so that its stream limit is in force.
    let settings = reader.next(&mut s).await;
    assert_eq!(settings.kind, h2::SETTINGS);
    let limit = settings
        .payload
        .chunks(6)
        .find(|c| u16::from_be_bytes([c[0], c[1]]) == 3)
        .map(|c| u32::from_be_bytes([c[2], c[3], c[4], c[5]]));
    assert_eq!(limit, Some(4), "SETTINGS_MAX_CONCURRENT_STREAMS");
    s.write_all(&h2::frame(h2::SETTINGS, h2::ACK, 0, &[]))
        .await
        .unwrap();
    loop {
        let f = reader.next(&mut s).await;
        if f.kind == h2::SETTINGS && f.flags & h2::ACK != 0 {
            break;
        }
    }
    // Ten streams whose bodies never end.
    let opened = Instant::now();
    for i in 0..10u32 {
        s.write_all(&h2::frame(
            h2::HEADERS,
            h2::END_HEADERS,
            2 * i + 1,
            &h2::chat_headers(),
        ))
        .await
        .unwrap();
    }
    // Served meanwhile.
    assert!(chat_ok(gw.addr()).await);
    let mut refused = Vec::new();
    let mut answered = std::collections::BTreeMap::new();
    while answered.len() < 4 || refused.len() < 6 {
        let f = tokio::time::timeout(Duration::from_secs(6), reader.next(&mut s))
            .await
            .expect("the h2 connection went quiet");
        match f.kind {
            h2::RST_STREAM => {
                let code = u32::from_be_bytes(f.payload[..4].try_into().unwrap());
                if code == h2::REFUSED_STREAM {
                    refused.push(f.stream);
                }
            }
            h2::HEADERS => {
                answered.entry(f.stream).or_insert(opened.elapsed());
            }
            h2::DATA => {
                let text = String::from_utf8_lossy(&f.payload).into_owned();
                assert!(text.contains("request_timeout"), "{text}");
            }
            h2::GOAWAY => panic!("the connection was closed: {:?}", f.payload),
            _ => {}
        }
    }
    refused.sort_unstable();
    assert_eq!(
        refused,
        vec![9, 11, 13, 15, 17, 19],
        "streams beyond the limit"
    );
    assert_eq!(
        answered.keys().copied().collect::<Vec<_>>(),
        vec![1, 3, 5, 7]
    );
    for (stream, at) in &answered {
        // Each accepted stream is answered (408) when its body timeout expires.
        assert_within(
            &format!("stream {stream} answered"),
            *at,
            Duration::from_millis(1900),
            Duration::from_millis(4000),
        );
    }
    assert_eq!(
        up.requests(),
        2,
        "no stream without a body reached the model server"
    );
}

#[tokio::test]
async fn an_h2_client_that_stops_answering_pings_is_closed_after_the_keep_alive_timeout() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(
        &up,
        "{ http2: { keepAliveIntervalMs: 500, keepAliveTimeoutMs: 500 } }",
    )
    .await;
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    s.write_all(h2::PREFACE).await.unwrap();
    s.write_all(&h2::frame(h2::SETTINGS, 0, 0, &[]))
        .await
        .unwrap();
    s.write_all(&h2::frame(h2::SETTINGS, h2::ACK, 0, &[]))
        .await
        .unwrap();
    // One complete request (an empty body: 400), so the connection is past its first request.
    // The keep-alive clock runs from the gateway's last read (this request), which is after
    // `sent` and may be well before the test reads the answer on a loaded machine.
    let sent = Instant::now();
    s.write_all(&h2::frame(
        h2::HEADERS,
        h2::END_HEADERS | h2::END_STREAM,
        1,
        &h2::chat_headers(),
    ))
    .await
    .unwrap();
    let mut reader = h2::Reader::default();
    loop {
        let f = reader.next(&mut s).await;
        if f.kind == h2::HEADERS && f.stream == 1 {
            break;
        }
    }
    // From here the client reads but never acknowledges a ping.
    let mut pings = 0;
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(5), reader.try_next(&mut s)).await {
            Err(_) => panic!("still open 5 s after the client stopped answering pings"),
            Ok(None) => break Instant::now(),
            Ok(Some(f)) => pings += usize::from(f.kind == h2::PING && f.flags & h2::ACK == 0),
        }
    };
    assert!(pings >= 1, "the gateway sent no ping");
    assert_within(
        "unresponsive h2 connection closed",
        closed - sent,
        Duration::from_millis(900),
        Duration::from_millis(3000),
    );
    assert!(chat_ok(gw.addr()).await);
}

/// VmRSS and VmHWM (peak) of this process, in KiB.
fn memory_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[tokio::test]
async fn two_hundred_concurrent_4_mib_uploads_fit_the_buffer_budget_or_get_503() {
    const MIB: usize = 1 << 20;
    const UPLOADS: usize = 200;
    // Room for 16 bodies of 4 MiB (16 x 4 = 64 <= 65, 17 x 4 = 68 > 65), and a small margin for
    // the normal clients served meanwhile.
    let budget = 65 * MIB;
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(
        &up,
        &format!(
            "{{ maxBufferedRequestBytes: {budget}, maxRequestBodyBytes: {} }}",
            5 * MIB
        ),
    )
    .await;
    // One body shared by every upload, so the clients' own memory stays at 4 MiB.
    let prefix = r#"{"model":"m","messages":[{"role":"user","content":""#;
    let suffix = r#""}]}"#;
    let mut body = String::with_capacity(4 * MIB);
    body.push_str(prefix);
    body.push_str(&"x".repeat(4 * MIB - prefix.len() - suffix.len()));
    body.push_str(suffix);
    let body = Arc::new(bytes::Bytes::from(body));
    assert_eq!(body.len(), 4 * MIB);

    let (rss_before, _) = memory_kib();
    // Every head is sent before any upload looks for an early answer, and none looks before
    // the gateway has judged them all (a loaded machine may take longer than the wait for an
    // early answer to get through 200 heads).
    let (go, judged) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let uploads: Vec<_> = (0..UPLOADS)
        .map(|_| {
            let (body, mut judged, addr) = (Arc::clone(&body), judged.clone(), gw.addr());
            tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                let head = format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: \
                     application/json\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                s.write_all(head.as_bytes()).await.unwrap();
                judged.wait_for(|j| *j).await.unwrap();
                // Refused uploads are answered on their head alone; the others wait for a body.
                let mut first = [0u8; 4096];
                let early =
                    tokio::time::timeout(Duration::from_millis(700), s.read(&mut first)).await;
                let mut got = match early {
                    Ok(Ok(n)) => first[..n].to_vec(),
                    Ok(Err(e)) => panic!("{e}"),
                    Err(_) => {
                        s.write_all(&body).await.unwrap();
                        Vec::new()
                    }
                };
                let sent_body = early.is_err();
                let mut buf = [0u8; 4096];
                // Both answers are one JSON object ending in `}}`.
                while !(got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"}}")) {
                    match tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf)).await {
                        Ok(Ok(0)) | Ok(Err(_)) => break,
                        Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                        Err(_) => panic!("no answer within 20 s"),
                    }
                }
                (sent_body, String::from_utf8_lossy(&got).into_owned())
            })
        })
        .collect();
    // 16 bodies fit the budget: the other 184 heads are refused, each counted before its
    // answer is written.
    let refused = r#"infergate_gateway_rejections_total{reason="buffer_budget_exhausted"}"#;
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&gw, refused).await < (UPLOADS - 16) as f64 {
        assert!(Instant::now() < deadline, "the heads were never all judged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    go.send(true).unwrap();
    // Normal clients are served while the uploads hold the budget.
    let meanwhile: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            v.push(chat_ok(gw.addr()).await);
        }
        v
    };
    let mut ok = 0;
    let mut busy = 0;
    for u in uploads {
        let (sent_body, text) = u.await.unwrap();
        match status_of(text.as_bytes()) {
            200 => {
                assert!(sent_body);
                ok += 1;
            }
            503 => {
                assert!(!sent_body, "refused only before the body is read");
                let lower = text.to_lowercase();
                assert!(lower.contains("retry-after: 1\r\n"), "{text}");
                assert!(
                    text.contains(r#""code":"buffer_budget_exhausted""#),
                    "{text}"
                );
                busy += 1;
            }
            other => panic!("status {other}: {text}"),
        }
    }
    let elapsed = started.elapsed();
    let (_, peak) = memory_kib();
    assert_eq!((ok, busy), (16, 184));
    assert_eq!(meanwhile, vec![true, true, true]);
    assert!(elapsed < Duration::from_secs(20), "{elapsed:?}");
    // Peak growth: the gateway holds at most the budget; the scripted model server holds each
    // body it reads twice (bytes and parsed JSON). Without the budget the gateway alone would
    // hold 800 MiB.
    let growth_mib = (peak.saturating_sub(rss_before)) / 1024;
    eprintln!("uploads: peak RSS growth {growth_mib} MiB, budget 65 MiB, {elapsed:?}");
    assert!(
        growth_mib < 195,
        "peak RSS grew by {growth_mib} MiB (limit 3 x budget)"
    );
    eventually_metric(&gw, "infergate_gateway_buffered_request_bytes", 0.0).await;
}

/// Just enough HTTP/2 framing (RFC 9113) to misbehave on purpose: no client library opens more
/// streams than the server allows.
/// A body over `maxRequestBodyBytes` is read to its end (up to twice the limit) before the 413
/// goes out: answered while the client still sends, the stream was reset after the answer
/// (`RST_STREAM`, NO_ERROR), which curl before 8 reports as "Stream error in the HTTP/2
/// framing layer" instead of the 413. A body declared larger than twice the limit is answered
/// at once.
#[tokio::test]
async fn an_h2_body_over_the_limit_is_answered_413_once_sent_without_a_reset() {
    let up = Upstream::start(Behaviour::Ok).await;
    let gw = start(&up, "{ maxRequestBodyBytes: 2048 }").await;
    let served = up.requests();
    // (declared length, whether the answer may come before the body's end)
    for (declared, early) in [(Some(3500), false), (None, false), (Some(5000), true)] {
        let (mut s, mut reader) = h2::connect(gw.addr()).await;
        let headers = declared.map_or_else(h2::chat_headers, h2::chat_headers_with_length);
        let chunk = vec![b' '; 1500];
        s.write_all(&h2::frame(h2::HEADERS, h2::END_HEADERS, 1, &headers))
            .await
            .unwrap();
        for _ in 0..2 {
            s.write_all(&h2::frame(h2::DATA, 0, 1, &chunk))
                .await
                .unwrap();
        }
        // The client pauses mid-body: nothing may be answered yet unless `early`.
        let mut frames = Vec::new();
        let pause = Instant::now() + Duration::from_millis(300);
        while let Ok(f) = tokio::time::timeout_at(pause, reader.next(&mut s)).await {
            frames.push(f);
        }
        let answered_early = frames
            .iter()
            .any(|f| f.stream == 1 && matches!(f.kind, h2::HEADERS | h2::RST_STREAM));
        let seen: Vec<(u8, String)> = frames
            .iter()
            .map(|f| (f.kind, String::from_utf8_lossy(&f.payload).into_owned()))
            .collect();
        assert_eq!(
            answered_early, early,
            "{declared:?}: answered during the pause: {seen:?}"
        );
        if early {
            continue;
        }
        s.write_all(&h2::frame(h2::DATA, h2::END_STREAM, 1, &chunk[..500]))
            .await
            .unwrap();
        // Up to the answer's end, then a PING's round trip for anything sent after it.
        loop {
            let f = tokio::time::timeout(Duration::from_secs(5), reader.next(&mut s))
                .await
                .expect("no answer");
            let end = f.stream == 1
                && (f.kind == h2::RST_STREAM
                    || (f.kind == h2::DATA && f.flags & h2::END_STREAM != 0));
            frames.push(f);
            if end {
                break;
            }
        }
        s.write_all(&h2::frame(h2::PING, 0, 0, b"drained!"))
            .await
            .unwrap();
        loop {
            let f = reader.next(&mut s).await;
            let ack = f.kind == h2::PING && f.flags & h2::ACK != 0;
            frames.push(f);
            if ack {
                break;
            }
        }
        let on_stream: Vec<u8> = frames
            .iter()
            .filter(|f| f.stream == 1 && f.kind != h2::WINDOW_UPDATE)
            .map(|f| f.kind)
            .collect();
        assert!(
            !on_stream.contains(&h2::RST_STREAM),
            "{declared:?}: the stream was reset: {on_stream:?}"
        );
        let body: Vec<u8> = frames
            .iter()
            .filter(|f| f.stream == 1 && f.kind == h2::DATA)
            .flat_map(|f| f.payload.clone())
            .collect();
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains("body_too_large"), "{declared:?}: {body}");
    }
    assert_eq!(up.requests(), served);
}

mod h2 {
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpStream;

    pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    pub const DATA: u8 = 0;
    pub const HEADERS: u8 = 1;
    pub const RST_STREAM: u8 = 3;
    pub const SETTINGS: u8 = 4;
    pub const PING: u8 = 6;
    pub const WINDOW_UPDATE: u8 = 8;
    pub const GOAWAY: u8 = 7;
    pub const ACK: u8 = 1;
    pub const END_STREAM: u8 = 1;
    pub const END_HEADERS: u8 = 4;
    pub const REFUSED_STREAM: u32 = 7;

    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).unwrap();
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.push(kind);
        f.push(flags);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// `POST /v1/chat/completions` in HPACK: indexed `:method POST` and `:scheme http`, and
    /// literals (without indexing, plain strings) for `:path` and `:authority`.
    pub fn chat_headers() -> Vec<u8> {
        let mut h = vec![0x83, 0x86];
        for (index, value) in [(4u8, "/v1/chat/completions"), (1, "gw")] {
            h.push(index);
            h.push(u8::try_from(value.len()).unwrap());
            h.extend_from_slice(value.as_bytes());
        }
        h
    }

    /// [`chat_headers`] and a `content-length` (HPACK static index 28, a literal without
    /// indexing).
    pub fn chat_headers_with_length(length: usize) -> Vec<u8> {
        let mut h = chat_headers();
        let value = length.to_string();
        h.extend_from_slice(&[0x0f, 28 - 15, u8::try_from(value.len()).unwrap()]);
        h.extend_from_slice(value.as_bytes());
        h
    }

    /// A connection past the preface and the settings exchange.
    pub async fn connect(addr: std::net::SocketAddr) -> (TcpStream, Reader) {
        use tokio::io::AsyncWriteExt;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(PREFACE).await.unwrap();
        s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
        let mut reader = Reader::default();
        let settings = reader.next(&mut s).await;
        assert_eq!(settings.kind, SETTINGS);
        s.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
        (s, reader)
    }

    pub struct Frame {
        pub kind: u8,
        pub flags: u8,
        pub stream: u32,
        pub payload: Vec<u8>,
    }

    #[derive(Default)]
    pub struct Reader {
        buf: Vec<u8>,
    }

    impl Reader {
        pub async fn next(&mut self, s: &mut TcpStream) -> Frame {
            self.try_next(s)
                .await
                .expect("the server closed the h2 connection")
        }

        /// The next frame, or `None` once the server closed the connection.
        pub async fn try_next(&mut self, s: &mut TcpStream) -> Option<Frame> {
            loop {
                if self.buf.len() >= 9 {
                    let len = u32::from_be_bytes([0, self.buf[0], self.buf[1], self.buf[2]]);
                    let len = usize::try_from(len).unwrap();
                    if self.buf.len() >= 9 + len {
                        let f = Frame {
                            kind: self.buf[3],
                            flags: self.buf[4],
                            stream: u32::from_be_bytes(self.buf[5..9].try_into().unwrap())
                                & 0x7fff_ffff,
                            payload: self.buf[9..9 + len].to_vec(),
                        };
                        self.buf.drain(..9 + len);
                        return Some(f);
                    }
                }
                let mut chunk = [0u8; 8192];
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                }
            }
        }
    }
}
