//! A small HTTP/1.1 model-server stand-in on 127.0.0.1 whose behaviour tests switch at runtime.
//!
//! Written on raw TCP so that it can misbehave in ways a real HTTP library would not let it:
//! accept and never answer, drip one byte a second, promise more than it sends.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the server answers the next request.
#[derive(Clone, Debug)]
pub enum Mode {
    /// 200 with this page and a content-length.
    Page(Arc<Vec<u8>>),
    /// 200 with this page in chunked encoding (no length up front).
    Chunked(Arc<Vec<u8>>),
    /// 200 with this page, then the server closes the connection (without saying so).
    PageThenClose(Arc<Vec<u8>>),
    /// 500 with a short body.
    Status500,
    /// Reads the request and never answers.
    Hang,
    /// Sends headers promising 100 bytes, then one byte a second.
    Drip,
    /// Reads the request and closes the connection unanswered (a process that died).
    Close,
}

/// A running test server.
pub struct TestServer {
    pub addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    pub async fn start(mode: Mode) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(Mutex::new(mode));
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let (mode, connections, requests) = (
                Arc::clone(&mode),
                Arc::clone(&connections),
                Arc::clone(&requests),
            );
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    connections.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(serve(stream, Arc::clone(&mode), Arc::clone(&requests)));
                }
            }
        });
        TestServer {
            addr,
            mode,
            connections,
            requests,
            task,
        }
    }

    /// Closes the listening socket: new connections are refused (the served ones go on).
    pub fn stop_listening(&self) {
        self.task.abort();
    }

    pub fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// An address nothing listens on.
pub async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

async fn serve(mut stream: TcpStream, mode: Arc<Mutex<Mode>>, requests: Arc<AtomicUsize>) {
    let mut buf = Vec::with_capacity(1024);
    loop {
        // Read one request head (GET, no body).
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 1024];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        buf.drain(..head_end);
        requests.fetch_add(1, Ordering::SeqCst);
        let mode = mode.lock().unwrap().clone();
        let ok = match mode {
            Mode::Page(page) => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n",
                    page.len()
                );
                stream.write_all(head.as_bytes()).await.is_ok()
                    && stream.write_all(&page).await.is_ok()
            }
            Mode::PageThenClose(page) => {
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", page.len());
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&page).await;
                // Let the client see the whole answer before the close.
                tokio::time::sleep(Duration::from_millis(5)).await;
                false
            }
            Mode::Chunked(page) => {
                let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                for chunk in page.chunks(8192) {
                    out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    out.extend_from_slice(chunk);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
                stream.write_all(&out).await.is_ok()
            }
            Mode::Status500 => stream
                .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 5\r\n\r\nerror")
                .await
                .is_ok(),
            Mode::Close => false,
            Mode::Hang => {
                std::future::pending::<()>().await;
                false
            }
            Mode::Drip => {
                let mut ok = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
                    .await
                    .is_ok();
                while ok {
                    ok = stream.write_all(b"#").await.is_ok();
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                false
            }
        };
        if !ok {
            return;
        }
    }
}
