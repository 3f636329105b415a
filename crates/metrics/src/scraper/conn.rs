//! One pod's keep-alive HTTP/1.1 connection and the fetch of one page over it.
//!
//! A client for exactly this job, not a general one: the request is built once per target and
//! written with one syscall; the answer is read straight into the caller's (pooled, reused) page
//! buffer with large reads, so the page is copied once, by the kernel, and never again. The head is
//! parsed with `httparse`; the body is framed by `Content-Length`, by chunked coding (de-chunked in
//! place: a page sent as one chunk, as most servers do, is not moved at all) or by the end of the
//! connection. What comes back to the caller is the range of the buffer that holds the page.
//!
//! Anything the client does not understand is a typed [`HttpError`], and any failure drops the
//! connection, so the next scrape starts on a clean one.

use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{StatusCode, Uri};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::{HttpError, ScrapeError};
use crate::tls::{ClientTls, Stream};

/// Largest response head (status line and headers) accepted.
pub(super) const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Most headers accepted in one response head.
const MAX_HEADERS: usize = 32;
/// Longest chunk-size line (size and extensions) accepted.
const MAX_CHUNK_LINE: usize = 1024;
/// Free buffer space offered to each read: a whole page of the usual size (vLLM's are 50–80 KB)
/// arrives in one `recv`.
const READ_SPACE: usize = 128 * 1024;

/// Where and how to fetch one target's page: the address and the request, built once.
pub(super) struct Endpoint {
    pub(super) addr: SocketAddr,
    request: Box<[u8]>,
    /// HTTPS when set.
    tls: Option<ClientTls>,
    /// Set once the scrape in flight has a connection to the server (an open kept-alive one, or
    /// a new one past its connect): a scrape that is slow from then on is late, not failed. The
    /// scraper clears it before each scrape.
    pub(super) connected: AtomicBool,
}

impl Endpoint {
    /// The endpoint for `path` (already checked to be a valid URI) on `addr`, over HTTPS when
    /// `tls` is set.
    pub(super) fn new(addr: SocketAddr, path: &Uri, tls: Option<ClientTls>) -> Self {
        let target = path.path_and_query().map_or("/", |p| p.as_str());
        let target = if target.is_empty() { "/" } else { target };
        let request = format!(
            "GET {target} HTTP/1.1\r\nhost: {addr}\r\naccept: text/plain\r\nuser-agent: infergate-metrics\r\n\r\n"
        );
        Endpoint {
            addr,
            request: request.into_bytes().into_boxed_slice(),
            tls,
            connected: AtomicBool::new(false),
        }
    }
}

/// A kept-alive connection, idle between scrapes. Dropping it closes the socket.
pub(super) struct Conn {
    stream: Stream,
}

impl Conn {
    /// Whether the idle connection can carry another request. Nothing arrives on an idle
    /// connection unasked, so any readiness means the server closed it (or wrote something out of
    /// turn); either way it is not reused. Costs a syscall only when readiness was signalled.
    ///
    /// Over TLS the socket is peeked, not read: a byte taken from under the TLS layer would break
    /// its record stream.
    fn still_open(&self) -> bool {
        let mut probe = [0u8; 1];
        match &self.stream {
            Stream::Plain(s) => {
                matches!(s.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            Stream::Tls(s) => {
                let mut buf = tokio::io::ReadBuf::new(&mut probe);
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                s.get_ref().0.poll_peek(&mut cx, &mut buf).is_pending()
            }
        }
    }
}

/// Fetches the page into `buf` (cleared first) and returns the range of `buf` that holds it,
/// reusing `conn` when it is still open and leaving it open when the server allows.
///
/// Any failure leaves `conn` empty. A reused connection that turns out to be closed before any
/// byte of the answer arrived (the server's keep-alive timeout raced the request) is replaced by a
/// new one and the request is sent again, once.
pub(super) async fn fetch(
    conn: &mut Option<Conn>,
    endpoint: &Endpoint,
    buf: &mut Vec<u8>,
    cap: usize,
) -> Result<Range<usize>, ScrapeError> {
    let reused = match conn.take() {
        Some(c) if c.still_open() => c,
        _ => return fetch_new(conn, endpoint, buf, cap).await,
    };
    endpoint.connected.store(true, Ordering::Relaxed);
    match exchange(reused, endpoint, buf, cap).await {
        Ok((page, keep)) => {
            *conn = keep;
            Ok(page)
        }
        Err(Failure { retry: true, .. }) => fetch_new(conn, endpoint, buf, cap).await,
        Err(Failure { error, .. }) => Err(error),
    }
}

async fn fetch_new(
    conn: &mut Option<Conn>,
    endpoint: &Endpoint,
    buf: &mut Vec<u8>,
    cap: usize,
) -> Result<Range<usize>, ScrapeError> {
    let stream = TcpStream::connect(endpoint.addr)
        .await
        .map_err(ScrapeError::Connect)?;
    // Small request, then nothing until the next one: waiting to coalesce only adds latency.
    stream.set_nodelay(true).map_err(ScrapeError::Connect)?;
    let stream = match &endpoint.tls {
        None => Stream::Plain(stream),
        Some(tls) => tls
            .connect(endpoint.addr, stream)
            .await
            .map_err(ScrapeError::Tls)?,
    };
    endpoint.connected.store(true, Ordering::Relaxed);
    let (page, keep) = exchange(Conn { stream }, endpoint, buf, cap)
        .await
        .map_err(|f| f.error)?;
    *conn = keep;
    Ok(page)
}

/// A failed exchange; `retry` when the connection was found closed before any answer.
struct Failure {
    error: ScrapeError,
    retry: bool,
}

impl From<ScrapeError> for Failure {
    fn from(error: ScrapeError) -> Self {
        Failure {
            error,
            retry: false,
        }
    }
}

impl From<HttpError> for Failure {
    fn from(error: HttpError) -> Self {
        ScrapeError::Protocol(error).into()
    }
}

/// Sends the request and reads the answer; returns the page and the connection if reusable.
async fn exchange(
    mut conn: Conn,
    endpoint: &Endpoint,
    buf: &mut Vec<u8>,
    cap: usize,
) -> Result<(Range<usize>, Option<Conn>), Failure> {
    buf.clear();
    if let Err(e) = conn.stream.write_all(&endpoint.request).await {
        return Err(Failure {
            retry: is_closed(&e),
            error: ScrapeError::Io(e),
        });
    }
    // The head.
    let head = loop {
        match read_more(&mut conn.stream, buf, READ_SPACE).await {
            Ok(0) => {
                return Err(Failure {
                    retry: buf.is_empty(),
                    error: ScrapeError::Closed,
                });
            }
            Ok(_) => {}
            Err(e) => {
                return Err(Failure {
                    retry: buf.is_empty() && is_closed(&e),
                    error: ScrapeError::Io(e),
                });
            }
        }
        if let Some(head) = parse_head(buf)? {
            break head;
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Err(HttpError::HeadTooLarge {
                limit: MAX_HEAD_BYTES,
            }
            .into());
        }
    };
    if !head.status.is_success() {
        return Err(ScrapeError::Status(head.status).into());
    }
    let (page, clean_end) = match head.framing {
        Framing::Empty => (head.len..head.len, buf.len() == head.len),
        Framing::Length(len) => read_sized(&mut conn.stream, buf, head.len, len, cap).await?,
        Framing::Chunked => read_chunked(&mut conn.stream, buf, head.len, cap).await?,
        Framing::UntilClose => {
            let page = read_to_close(&mut conn.stream, buf, head.len, cap).await?;
            return Ok((page, None));
        }
    };
    // Bytes after the answer mean the two sides no longer agree where a message starts.
    let keep = (head.keep_alive && clean_end).then_some(conn);
    Ok((page, keep))
}

/// Reads into the free space of `buf`, first making at least `space` bytes free. Returns how many
/// bytes arrived (0: the server closed its side).
async fn read_more(stream: &mut Stream, buf: &mut Vec<u8>, space: usize) -> io::Result<usize> {
    // `reserve` grows the pooled buffer once; later pages of the same size find the room there.
    buf.reserve(space);
    // The read is offered all the free space, more than the server has left to send, so a read
    // that drains the socket comes back short and tokio forgets the readiness without an extra
    // `recv` that would only say "would block".
    stream.read_buf(buf).await
}

fn is_closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

/// The parts of a response head the client acts on.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    /// Bytes of the head, blank line included.
    len: usize,
    status: StatusCode,
    framing: Framing,
    keep_alive: bool,
}

/// How the body of a response is delimited (RFC 9112, section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body (204, 304).
    Empty,
    /// `Content-Length` bytes.
    Length(usize),
    /// Chunked transfer coding.
    Chunked,
    /// Until the server closes the connection.
    UntilClose,
}

/// Parses the response head at the start of `buf`: `None` while it is incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(buf).map_err(HttpError::Head)? {
        httparse::Status::Partial => return Ok(None),
        httparse::Status::Complete(len) => len,
    };
    if len > MAX_HEAD_BYTES {
        return Err(HttpError::HeadTooLarge {
            limit: MAX_HEAD_BYTES,
        });
    }
    let code = response.code.unwrap_or(0);
    let status =
        StatusCode::from_u16(code).map_err(|_| HttpError::Head(httparse::Error::Status))?;
    let http11 = response.version == Some(1);
    let mut length: Option<usize> = None;
    let mut chunked = false;
    let mut close = !http11;
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = parse_length(h.value).ok_or(HttpError::ContentLength)?;
            if length.is_some_and(|l| l != n) {
                return Err(HttpError::ContentLength);
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // The only coding this client undoes is chunked, and it must come last.
            for coding in tokens(h.value) {
                if chunked || !coding.eq_ignore_ascii_case(b"chunked") {
                    return Err(HttpError::TransferEncoding);
                }
                chunked = true;
            }
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in tokens(h.value) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && !http11 {
                    close = false;
                }
            }
        }
    }
    let framing = if code == 204 || code == 304 {
        Framing::Empty
    } else if chunked {
        // A length beside chunked coding is to be ignored, but it is also how request smuggling
        // starts; an endpoint that sends both is not trusted.
        if length.is_some() {
            return Err(HttpError::ContentLength);
        }
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    Ok(Some(Head {
        len,
        status,
        framing,
        keep_alive: !close,
    }))
}

/// A decimal `Content-Length` value (digits only, no sign, no list).
fn parse_length(value: &[u8]) -> Option<usize> {
    let value = value.trim_ascii();
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value.iter().try_fold(0usize, |n, d| {
        n.checked_mul(10)?.checked_add(usize::from(d - b'0'))
    })
}

/// The comma-separated tokens of a header value, trimmed, empty ones left out.
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Reads a body of `len` bytes that starts at `start`. Returns its range and whether nothing
/// followed it.
async fn read_sized(
    stream: &mut Stream,
    buf: &mut Vec<u8>,
    start: usize,
    len: usize,
    cap: usize,
) -> Result<(Range<usize>, bool), Failure> {
    if len > cap {
        return Err(ScrapeError::BodyTooLarge { limit: cap }.into());
    }
    let end = start + len;
    while buf.len() < end {
        // One byte more than is missing, so that the read that completes the body is short.
        let missing = end - buf.len();
        match read_more(stream, buf, missing + 1).await {
            Ok(0) => return Err(ScrapeError::Closed.into()),
            Ok(_) => {}
            Err(e) => return Err(ScrapeError::Io(e).into()),
        }
    }
    Ok((start..end, buf.len() == end))
}

/// Reads until the server closes the connection.
async fn read_to_close(
    stream: &mut Stream,
    buf: &mut Vec<u8>,
    start: usize,
    cap: usize,
) -> Result<Range<usize>, Failure> {
    loop {
        if buf.len() - start > cap {
            return Err(ScrapeError::BodyTooLarge { limit: cap }.into());
        }
        match read_more(stream, buf, READ_SPACE).await {
            Ok(0) => return Ok(start..buf.len()),
            Ok(_) => {}
            Err(e) => return Err(ScrapeError::Io(e).into()),
        }
    }
}

/// Reads a chunked body whose first chunk-size line starts at `start`, and de-chunks it in place.
async fn read_chunked(
    stream: &mut Stream,
    buf: &mut Vec<u8>,
    start: usize,
    cap: usize,
) -> Result<(Range<usize>, bool), Failure> {
    let mut dechunk = Dechunk::new(start, cap);
    loop {
        if dechunk.advance(buf)? {
            return Ok((dechunk.page(), dechunk.scan == buf.len()));
        }
        match read_more(stream, buf, READ_SPACE).await {
            Ok(0) => return Err(ScrapeError::Closed.into()),
            Ok(_) => {}
            Err(e) => return Err(ScrapeError::Io(e).into()),
        }
    }
}

/// In-place decoder of a chunked body.
///
/// The buffer holds, in order: the head, the decoded page (`page_start..page_end`), a gap of
/// chunk framing already read past, and the raw bytes not yet decoded (`scan..`). The first
/// chunk's data stays where it arrived; each later chunk's data is moved down onto the end of the
/// page, and the undecoded tail is moved down whenever the gap grows, so that memory stays bounded
/// by the page, not by the framing.
#[derive(Debug)]
struct Dechunk {
    cap: usize,
    page_start: usize,
    page_end: usize,
    scan: usize,
    state: ChunkState,
    /// Trailer bytes seen so far (bounded like a head).
    trailer: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Before a chunk-size line.
    Size { first: bool },
    /// Inside a chunk's data, with this many bytes still to come.
    Data { left: usize },
    /// After a chunk's data, before its line end.
    DataEnd,
    /// After the last (zero-size) chunk: trailer fields until a blank line.
    Trailers,
}

impl Dechunk {
    fn new(start: usize, cap: usize) -> Self {
        Dechunk {
            cap,
            page_start: start,
            page_end: start,
            scan: start,
            state: ChunkState::Size { first: true },
            trailer: 0,
        }
    }

    fn page(&self) -> Range<usize> {
        self.page_start..self.page_end
    }

    /// Decodes what `buf` holds; `Ok(true)` once the body is complete.
    fn advance(&mut self, buf: &mut Vec<u8>) -> Result<bool, ScrapeError> {
        let done = self.decode(buf)?;
        if !done && self.scan > self.page_end {
            // Only undecoded bytes move: a partial size line or line end, never page data.
            buf.copy_within(self.scan.., self.page_end);
            buf.truncate(self.page_end + (buf.len() - self.scan));
            self.scan = self.page_end;
        }
        Ok(done)
    }

    fn decode(&mut self, buf: &mut [u8]) -> Result<bool, ScrapeError> {
        loop {
            let rest = &buf[self.scan..];
            match self.state {
                ChunkState::Size { first } => {
                    let Some(nl) = memchr::memchr(b'\n', rest) else {
                        if rest.len() > MAX_CHUNK_LINE {
                            return Err(HttpError::Chunk("chunk-size line too long").into());
                        }
                        return Ok(false);
                    };
                    if nl > MAX_CHUNK_LINE {
                        return Err(HttpError::Chunk("chunk-size line too long").into());
                    }
                    let size = chunk_size(&rest[..nl])?;
                    self.scan += nl + 1;
                    if size == 0 {
                        self.state = ChunkState::Trailers;
                        continue;
                    }
                    let total = (self.page_end - self.page_start).saturating_add(size);
                    if total > self.cap {
                        return Err(ScrapeError::BodyTooLarge { limit: self.cap });
                    }
                    if first {
                        // The first chunk's data stays where it is.
                        self.page_start = self.scan;
                        self.page_end = self.scan;
                    }
                    self.state = ChunkState::Data { left: size };
                }
                ChunkState::Data { left } => {
                    let take = left.min(rest.len());
                    if take == 0 {
                        return Ok(false);
                    }
                    if self.scan != self.page_end {
                        buf.copy_within(self.scan..self.scan + take, self.page_end);
                    }
                    self.page_end += take;
                    self.scan += take;
                    self.state = if take == left {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data { left: left - take }
                    };
                }
                ChunkState::DataEnd => {
                    let skip = match rest {
                        [b'\r', b'\n', ..] => 2,
                        [b'\n', ..] => 1,
                        [] | [b'\r'] => return Ok(false),
                        _ => return Err(HttpError::Chunk("chunk data longer than its size").into()),
                    };
                    self.scan += skip;
                    self.state = ChunkState::Size { first: false };
                }
                ChunkState::Trailers => {
                    let Some(nl) = memchr::memchr(b'\n', rest) else {
                        if self.trailer + rest.len() > MAX_HEAD_BYTES {
                            return Err(HttpError::HeadTooLarge {
                                limit: MAX_HEAD_BYTES,
                            }
                            .into());
                        }
                        return Ok(false);
                    };
                    self.trailer += nl + 1;
                    if self.trailer > MAX_HEAD_BYTES {
                        return Err(HttpError::HeadTooLarge {
                            limit: MAX_HEAD_BYTES,
                        }
                        .into());
                    }
                    let line = &rest[..nl];
                    self.scan += nl + 1;
                    if line.is_empty() || line == b"\r" {
                        return Ok(true);
                    }
                }
            }
        }
    }
}

/// The size on a chunk-size line (hex digits, then optional `;extensions`, then optional `\r`).
fn chunk_size(line: &[u8]) -> Result<usize, HttpError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let digits = match memchr::memchr(b';', line) {
        Some(i) => &line[..i],
        None => line,
    };
    let digits = digits.trim_ascii();
    if digits.is_empty() {
        return Err(HttpError::Chunk("chunk size is missing"));
    }
    digits.iter().try_fold(0usize, |n, &d| {
        let v = char::from(d)
            .to_digit(16)
            .ok_or(HttpError::Chunk("chunk size is not hexadecimal"))?;
        n.checked_mul(16)
            .and_then(|n| n.checked_add(v as usize))
            .ok_or(HttpError::Chunk("chunk size overflows"))
    })
}

#[cfg(test)]
mod tests;

/// Entry points for the fuzz targets in `fuzz/`: the response-head parser and the in-place chunked
/// decoder, fed from memory instead of a socket. Built only with `--cfg fuzzing`.
#[cfg(fuzzing)]
pub mod fuzzing {
    use super::{Dechunk, HttpError, ScrapeError, parse_head};

    /// What [`parse_head`] made of `buf`: `None` while incomplete, else the head's length,
    /// status code and whether the connection stays open.
    pub fn head(buf: &[u8]) -> Result<Option<(usize, u16, bool)>, HttpError> {
        Ok(parse_head(buf)?.map(|h| (h.len, h.status.as_u16(), h.keep_alive)))
    }

    /// Decodes a chunked body arriving as `reads`, as the scraper does with socket reads: the
    /// page once complete, `None` if the reads end first.
    pub fn dechunk(reads: &[&[u8]], cap: usize) -> Result<Option<Vec<u8>>, ScrapeError> {
        let mut buf = Vec::new();
        let mut d = Dechunk::new(0, cap);
        for read in reads {
            buf.extend_from_slice(read);
            if d.advance(&mut buf)? {
                return Ok(Some(buf[d.page()].to_vec()));
            }
        }
        Ok(None)
    }
}
