//! An HTTP/1.1 server whose every answer a test computes from the request: stands in for a
//! model server or a cluster that fails in a chosen way (a status, an error body), where an
//! emulated fleet or a real gateway would not fail on demand.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The answer to one request, given its head (request line and headers): status, content type
/// and body.
pub type Script = Arc<dyn Fn(&str) -> (u16, &'static str, String) + Send + Sync>;

/// Serves `script` to every HTTP/1.1 request on a free loopback port (keep-alive connections,
/// `content-length` request bodies read and dropped), until the runtime ends. Returns the
/// address.
///
/// # Panics
/// When no loopback port can be bound (a test cannot go on without it).
pub async fn scripted_server(script: Script) -> SocketAddr {
    crate::pages::serve_loopback("the scripted server", move |s| {
        answer(s, Arc::clone(&script))
    })
    .await
}

/// Answers the requests on `s` with `script` until the client closes.
async fn answer(mut s: TcpStream, script: Script) {
    let mut buf = vec![0u8; 65536];
    let mut got = 0;
    loop {
        match s.read(&mut buf[got..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => got += n,
        }
        let text = String::from_utf8_lossy(&buf[..got]).into_owned();
        let Some(end) = text.find("\r\n\r\n") else {
            if got == buf.len() {
                return;
            }
            continue;
        };
        let length = crate::content_length(&text[..end]);
        if got < end + 4 + length {
            if got == buf.len() {
                return;
            }
            continue;
        }
        // One request per read is all these tests send on a connection at a time.
        got = 0;
        let (status, content_type, body) = script(&text[..end]);
        let head = format!(
            "HTTP/1.1 {status} Scripted\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        if s.write_all(head.as_bytes()).await.is_err()
            || s.write_all(body.as_bytes()).await.is_err()
        {
            return;
        }
    }
}
