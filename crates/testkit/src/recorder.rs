//! A model server that records the request heads reaching it, byte for byte, and answers with
//! response headers the test chooses: for checking what a proxy passes on in each direction
//! (hop-by-hop headers, credentials) as it crossed the wire, not as a parser rebuilt it.
//!
//! It speaks plain HTTP/1.1 with keep-alive and `content-length` request bodies (what the
//! gateway and the global router send). Every request is answered `200 application/json`:
//! `GET /metrics` with [`vllm_page`]`(0)`, `GET /v1/models` with a list holding the model `m`,
//! anything else with [`CHAT_JSON`] and the chosen headers, after recording its head.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::pages::vllm_page;

/// The body of every model answer: a chat completion for the model `m`, with usage.
pub const CHAT_JSON: &str = r#"{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#;

const MODELS_JSON: &str =
    r#"{"object":"list","data":[{"id":"m","object":"model","owned_by":"test"}]}"#;

/// Request headers for a hop-by-hop check: two `Connection` lines (one in mixed case) naming
/// `x-foo` and `x-bar`, and `x-kept`, which must be forwarded. See
/// [`Recorder::assert_hop_by_hop_dropped`].
pub const HOP_REQUEST_HEADERS: [(&str, &str); 5] = [
    ("connection", "keep-alive, X-Foo"),
    ("x-foo", "1"),
    ("connection", "x-bar"),
    ("x-bar", "2"),
    ("x-kept", "3"),
];

/// Response headers for a hop-by-hop check, to start a [`Recorder`] with: two `Connection`
/// lines naming `x-up-hop` and `x-up-hop-2`, and `x-up-kept`, which must be passed back.
pub const HOP_RESPONSE_HEADERS: [(&str, &str); 5] = [
    ("connection", "keep-alive, X-Up-Hop"),
    ("x-up-hop", "1"),
    ("connection", "x-up-hop-2"),
    ("x-up-hop-2", "2"),
    ("x-up-kept", "3"),
];

/// The longest request head it reads; a longer one closes the connection.
const MAX_HEAD: usize = 64 * 1024;

/// A running recorder on a free loopback port; it stops with the runtime.
pub struct Recorder {
    /// Where it listens.
    pub addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    /// Starts a recorder whose model answers carry `headers` (name, value), in this order,
    /// besides `content-type` and `content-length`. A name may repeat.
    ///
    /// # Panics
    /// When no loopback port can be bound (a test cannot go on without it).
    pub async fn start(headers: &[(&str, &str)]) -> Recorder {
        #[allow(
            clippy::expect_used,
            reason = "a test helper: a panic is a failed test"
        )]
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port for the recorder");
        #[allow(
            clippy::expect_used,
            reason = "a test helper: a panic is a failed test"
        )]
        let addr = listener.local_addr().expect("the bound address");
        let extra: String = headers
            .iter()
            .map(|(n, v)| format!("{n}: {v}\r\n"))
            .collect();
        let answer: Arc<str> = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{CHAT_JSON}",
            CHAT_JSON.len()
        )
        .into();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&heads);
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve(s, Arc::clone(&answer), Arc::clone(&recorded)));
            }
        });
        Recorder { addr, heads }
    }

    /// The heads of the model requests received so far (not `/metrics` or `/v1/models`), each
    /// as sent: request line and header lines, CRLF-separated, without the final empty line.
    pub fn heads(&self) -> Vec<String> {
        self.heads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The header names of the last model request, lowercased, in the order sent (repeated
    /// names repeated); empty before the first.
    pub fn last_header_names(&self) -> Vec<String> {
        self.heads()
            .last()
            .map(|head| {
                head.split("\r\n")
                    .skip(1)
                    .filter_map(|line| line.split_once(':'))
                    .map(|(name, _)| name.trim().to_ascii_lowercase())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Checks a hop-by-hop exchange: the last model request carried [`HOP_REQUEST_HEADERS`]
    /// through a proxy to this recorder, started with [`HOP_RESPONSE_HEADERS`], and `response`
    /// is what the client got back. Neither the headers `Connection` names nor `Connection` and
    /// `Keep-Alive` themselves crossed the proxy, either way; `x-kept` and `x-up-kept` did.
    ///
    /// # Panics
    /// When one did or did not, naming it and what was sent (a failed check is a failed test).
    pub fn assert_hop_by_hop_dropped(&self, response: &http::HeaderMap) {
        let sent = self.last_header_names();
        for hop in ["x-foo", "x-bar", "connection", "keep-alive"] {
            assert!(
                !sent.iter().any(|n| n == hop),
                "{hop} was forwarded: {:?}",
                self.heads()
            );
        }
        assert!(
            sent.iter().any(|n| n == "x-kept"),
            "x-kept was not forwarded: {:?}",
            self.heads()
        );
        for hop in ["x-up-hop", "x-up-hop-2"] {
            assert!(
                !response.contains_key(hop),
                "{hop} was passed back: {response:?}"
            );
        }
        assert!(
            response.get("x-up-kept").is_some_and(|v| v == "3"),
            "x-up-kept was not passed back: {response:?}"
        );
    }
}

/// Answers the requests of one connection until the client closes it.
async fn serve(mut s: TcpStream, answer: Arc<str>, heads: Arc<Mutex<Vec<String>>>) {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            if buf.len() > MAX_HEAD {
                return;
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let length = crate::content_length(&head);
        let whole = end + 4 + length;
        while buf.len() < whole {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..whole);
        let line = head.split("\r\n").next().unwrap_or_default();
        let reply = if line.starts_with("GET /metrics ") {
            let page = vllm_page(0);
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{page}",
                page.len()
            )
        } else if line.starts_with("GET /v1/models ") {
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{MODELS_JSON}",
                MODELS_JSON.len()
            )
        } else {
            heads
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(head);
            answer.to_string()
        };
        if s.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}
