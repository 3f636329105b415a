//! The access log (`accessLog:`): one JSON line per request, written off the request path.
//!
//! The writer is shared by the front doors: [`AccessLog<R>`] takes a front door's own record
//! type `R` (the gateway's `Note`, the global router's), [`AccessLogConfig`] and [`check`] are
//! its configuration and `--check`, [`LineCounters`] its counters, registered under each front
//! door's prefix (`infergate_gateway_access_log_lines_total`,
//! `infergate_global_access_log_lines_total`); [`Arrival`] and [`Measured`] are the fields
//! every front door's line starts and ends with, flattened into its own.
//!
//! A request carries a record (only when the log is on: otherwise nothing is built) that the
//! request path fills as it learns things — at the gateway the model asked for, the tenant, the
//! endpoint and attempt, the status, the first token, the usage — and hands to the log when the
//! request is over: at once for an answer the front door gives itself, when the response body
//! is dropped for one passed through (read to its end, broken off, or abandoned by the client).
//! The record goes to a bounded channel; one writer thread per log formats it and writes it,
//! flushing whenever the channel runs empty. A full channel (a destination slower than the
//! traffic) drops the line rather than slow a request, and a failed write is skipped: both are
//! counted (`..._access_log_lines_total{result}`), and the front door serves on.
//!
//! A file survives rename rotation (logrotate's default: the file renamed, a new one created):
//! before a batch, at most once a second (and every 1,024 lines of a batch that does not end),
//! the writer compares the device and inode of the file it holds with those of its path, and
//! when the path is gone or names another file, opens the path again and writes there. A reopen
//! that fails (the folder gone) keeps the file it holds; both are counted
//! (`..._access_log_reopens_total{result}`), a failure warned of once until a reopen succeeds.
//! `copytruncate` needs nothing: the file is appended to, so its writes follow the truncation.

use std::borrow::Cow;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant, SystemTime};

use http::uri::PathAndQuery;
use http::{HeaderValue, Method, Uri};
use infergate_openai::Usage;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::{Serialize, Serializer};

pub use crate::config::AccessLogConfig;

/// How long a front door's `wait` lets the access log write its last lines at shutdown.
pub const FLUSH_AT_SHUTDOWN: Duration = Duration::from_secs(5);

/// Lines that may wait for the writer; more are dropped (and counted).
const QUEUE: usize = 8192;

/// The longest request path logged; longer ones are cut (a path is the client's to choose).
const MAX_PATH: usize = 256;

/// How often, at most, a file's writer checks that its path still names the file it holds.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// Lines of one batch between two such checks, for a queue that never runs empty.
const FOLLOW_LINES: u32 = 1024;

/// Where the access log goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessLogPath {
    /// The process's standard output (`path: stdout`), apart from the diagnostic log on stderr.
    Stdout,
    /// Standard error (`path: stderr`), interleaved with the diagnostic log.
    Stderr,
    /// A file, appended to (created if missing).
    File(PathBuf),
}

impl AccessLogPath {
    /// `stdout`, `stderr` or a file path.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "" => Err("`accessLog.path` must be `stdout`, `stderr` or a file path".into()),
            "stdout" => Ok(AccessLogPath::Stdout),
            "stderr" => Ok(AccessLogPath::Stderr),
            file => Ok(AccessLogPath::File(PathBuf::from(file))),
        }
    }
}

/// An access log that cannot be opened.
#[derive(Debug, thiserror::Error)]
#[error("accessLog.path {}: cannot open it for appending", path.display())]
pub struct AccessLogError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

/// What `--check` verifies without writing anything: an existing file can be opened for
/// appending, or a missing one's folder exists.
pub fn check(config: Option<&AccessLogConfig>) -> Result<(), AccessLogError> {
    let Some(AccessLogPath::File(path)) = config.map(|c| &c.path) else {
        return Ok(());
    };
    let err = |source| AccessLogError {
        path: path.clone(),
        source,
    };
    if path.exists() {
        return OpenOptions::new()
            .append(true)
            .open(path)
            .map(drop)
            .map_err(err);
    }
    missing_folder(path).map_or(Ok(()), |e| Err(err(e)))
}

/// The error for a file whose folder does not exist, naming the folder (the OS says only
/// `No such file or directory`); `None` when the folder is there. `--check` and the start say
/// the same.
fn missing_folder(path: &Path) -> Option<std::io::Error> {
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    (!folder.is_dir()).then(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no folder {}", folder.display()),
        )
    })
}

/// The counters of a front door's access log, each exported from the start, at 0:
/// `..._access_log_lines_total{result}` (the lines) and `..._access_log_reopens_total{result}`
/// (its file opened again after a rename rotation).
#[derive(Clone)]
pub struct LineCounters {
    family: Family<[(&'static str, &'static str); 1], Counter>,
    written: Counter,
    dropped: Counter,
    failed: Counter,
    reopens: Family<[(&'static str, &'static str); 1], Counter>,
    reopened: Counter,
    reopen_failed: Counter,
}

impl Default for LineCounters {
    fn default() -> Self {
        let result = |family: &Family<[(&'static str, &'static str); 1], Counter>, r| {
            family.get_or_create(&[("result", r)]).clone()
        };
        let (family, reopens) = (Family::default(), Family::default());
        LineCounters {
            written: result(&family, "written"),
            dropped: result(&family, "dropped"),
            failed: result(&family, "failed"),
            reopened: result(&reopens, "ok"),
            reopen_failed: result(&reopens, "error"),
            family,
            reopens,
        }
    }
}

impl LineCounters {
    /// Registers the families as `{prefix}_lines` and `{prefix}_reopens` (`access_log` in the
    /// gateway's prefixed registry, `infergate_global_access_log` in the router's).
    pub fn register(&self, registry: &mut Registry, prefix: &str) {
        registry.register(
            format!("{prefix}_lines"),
            "Access log lines (accessLog:), by result: written, dropped (the writer fell behind), failed (the write failed)",
            self.family.clone(),
        );
        registry.register(
            format!("{prefix}_reopens"),
            "Access log files opened again because their path named another file or none (a rename rotation), by result: ok, error (the file held is kept)",
            self.reopens.clone(),
        );
    }
}

/// A running access log of records `R`: the sending side of its writer thread's channel. The
/// thread ends when the log and every request still holding a record for it are gone.
pub struct AccessLog<R> {
    path: AccessLogPath,
    tx: SyncSender<Message<R>>,
    counters: LineCounters,
}

/// What the writer thread is handed.
enum Message<R> {
    /// A request's record, to write as a line.
    Record(Box<R>),
    /// Write out everything before this, then say so (shutdown).
    Flush(SyncSender<()>),
}

impl<R: Serialize + Send + 'static> AccessLog<R> {
    /// The log `config` asks for across a reload: `previous` when it writes to the same place
    /// (the same writer), else a new one (the old one ends once the requests still holding
    /// records for it have logged them); none without `accessLog:`.
    pub fn reloaded(
        config: Option<&AccessLogConfig>,
        previous: Option<&Arc<Self>>,
        counters: &LineCounters,
    ) -> Result<Option<Arc<Self>>, AccessLogError> {
        let Some(config) = config else {
            return Ok(None);
        };
        match previous {
            Some(log) if log.path == config.path => Ok(Some(Arc::clone(log))),
            _ => Self::start(config, counters).map(Some),
        }
    }

    /// Opens the destination and starts the writer thread.
    pub fn start(
        config: &AccessLogConfig,
        counters: &LineCounters,
    ) -> Result<Arc<Self>, AccessLogError> {
        let out = match &config.path {
            AccessLogPath::Stdout => Out::stream(std::io::stdout()),
            AccessLogPath::Stderr => Out::stream(std::io::stderr()),
            AccessLogPath::File(path) => Out::file(path)?,
        };
        let (tx, rx) = sync_channel(QUEUE);
        let writer_counters = counters.clone();
        let spawned = std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_lines(&rx, out, &writer_counters));
        if let Err(source) = spawned {
            return Err(AccessLogError {
                path: PathBuf::from(config.path.to_string()),
                source,
            });
        }
        Ok(Arc::new(AccessLog {
            path: config.path.clone(),
            tx,
            counters: counters.clone(),
        }))
    }

    /// Hands a request's record to the writer; dropped (and counted) when the queue is full.
    pub fn send(&self, record: Box<R>) {
        match self.tx.try_send(Message::Record(record)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped.inc();
            }
        }
    }

    /// Waits, at most `within`, until every record handed over so far is written and flushed:
    /// at shutdown, once the last request ended, so that the process does not exit with the
    /// last lines still queued. Returns whether they were (`false`: the destination did not
    /// take them in time, e.g. a stdout pipe nobody reads). Blocks the calling thread.
    pub fn flush(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let (ack_tx, ack_rx) = sync_channel(1);
        let mut message = Message::Flush(ack_tx);
        loop {
            match self.tx.try_send(message) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    message = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TrySendError::Full(_)) => return false,
            }
        }
        ack_rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .is_ok()
    }
}

impl std::fmt::Display for AccessLogPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AccessLogPath::Stdout => f.write_str("stdout"),
            AccessLogPath::Stderr => f.write_str("stderr"),
            AccessLogPath::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Opens `path` for appending (created if missing), with its device and inode.
fn open(path: &Path) -> std::io::Result<(File, (u64, u64))> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    let meta = file.metadata()?;
    Ok((file, (meta.dev(), meta.ino())))
}

/// Where the writer thread writes.
struct Out {
    writer: BufWriter<Box<dyn Write + Send>>,
    /// For a file: its path, followed across rename rotations; none for stdout and stderr,
    /// which are never opened again.
    followed: Option<Followed>,
}

/// A file's path and the file held for it.
struct Followed {
    path: PathBuf,
    /// The device and inode of the file held.
    id: (u64, u64),
    /// When the path was last compared with it.
    checked: Instant,
    /// A reopen failed and was warned of: the next failures are only counted, until one
    /// succeeds.
    failing: bool,
}

impl Out {
    fn stream(out: impl Write + Send + 'static) -> Out {
        Out {
            writer: BufWriter::new(Box::new(out)),
            followed: None,
        }
    }

    fn file(path: &Path) -> Result<Out, AccessLogError> {
        let (file, id) = open(path).map_err(|source| AccessLogError {
            path: path.to_owned(),
            source: match source.kind() {
                std::io::ErrorKind::NotFound => missing_folder(path).unwrap_or(source),
                _ => source,
            },
        })?;
        Ok(Out {
            writer: BufWriter::new(Box::new(file)),
            followed: Some(Followed {
                path: path.to_owned(),
                id,
                checked: Instant::now(),
                failing: false,
            }),
        })
    }

    /// At most every [`FOLLOW_EVERY`]: when the path no longer names the file held (renamed
    /// away, deleted, replaced), writes what is buffered to the file held and opens the path
    /// again; if that fails, keeps the file held (its lines are not lost, only misplaced) and
    /// tries again at the next check.
    fn follow(&mut self, now: Instant, counters: &LineCounters) {
        let Out { writer, followed } = self;
        let Some(f) = followed else {
            return;
        };
        if now.saturating_duration_since(f.checked) < FOLLOW_EVERY {
            return;
        }
        f.checked = now;
        if std::fs::metadata(&f.path).is_ok_and(|m| (m.dev(), m.ino()) == f.id) {
            return;
        }
        match open(&f.path) {
            Ok((file, id)) => {
                // A failed flush loses what was buffered, as at the end of a batch.
                let _ = writer.flush();
                *writer = BufWriter::new(Box::new(file));
                f.id = id;
                counters.reopened.inc();
                if std::mem::take(&mut f.failing) {
                    tracing::info!(path = %f.path.display(), "access log: the file is written again");
                }
            }
            Err(error) => {
                counters.reopen_failed.inc();
                if !std::mem::replace(&mut f.failing, true) {
                    tracing::warn!(
                        path = %f.path.display(),
                        %error,
                        "access log: the path names another file or none (rotated?) and cannot be opened again; writing on to the file held"
                    );
                }
            }
        }
    }
}

/// The writer thread: a line per note, flushed whenever no note is waiting; the path followed
/// before each batch and every [`FOLLOW_LINES`] lines of one ([`Out::follow`]).
fn write_lines<R: Serialize>(rx: &Receiver<Message<R>>, mut out: Out, counters: &LineCounters) {
    let mut line = Vec::with_capacity(512);
    while let Ok(first) = rx.recv() {
        out.follow(Instant::now(), counters);
        let mut next = Some(first);
        let mut flushed = Vec::new();
        let mut lines = 0u32;
        while let Some(message) = next {
            let record = match message {
                Message::Record(record) => record,
                Message::Flush(ack) => {
                    flushed.push(ack);
                    next = rx.try_recv().ok();
                    continue;
                }
            };
            line.clear();
            // Serializing plain fields into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut line, &record);
            line.push(b'\n');
            match out.writer.write_all(&line) {
                Ok(()) => counters.written.inc(),
                Err(_) => counters.failed.inc(),
            };
            lines += 1;
            if lines.is_multiple_of(FOLLOW_LINES) {
                out.follow(Instant::now(), counters);
            }
            next = rx.try_recv().ok();
        }
        // A failed flush loses what was buffered: those lines were counted written, and the
        // next batch tries again.
        let _ = out.writer.flush();
        for ack in flushed {
            let _ = ack.try_send(());
        }
    }
}

/// A request as it arrived, which every front door's line starts with (flattened into it):
/// `time` (RFC 3339, UTC, milliseconds), `request_id`, `client`, `method` and `path` (cut at
/// 256 bytes when the line is written: a path is the client's to choose).
///
/// Nothing of the request is copied: the request id and the path are the request's own
/// reference-counted bytes (a `HeaderValue` and a `PathAndQuery` clone share them).
pub struct Arrival {
    at: SystemTime,
    request_id: Option<HeaderValue>,
    client: SocketAddr,
    method: Method,
    path: Option<PathAndQuery>,
}

impl Arrival {
    /// A request for `uri` arriving now.
    pub fn now(
        client: SocketAddr,
        method: &Method,
        uri: &Uri,
        request_id: Option<&HeaderValue>,
    ) -> Arrival {
        Arrival {
            at: SystemTime::now(),
            request_id: request_id.cloned(),
            client,
            method: method.clone(),
            path: uri.path_and_query().cloned(),
        }
    }

    /// The path without its query, cut at [`MAX_PATH`] bytes (on a character boundary).
    fn path(&self) -> &str {
        let path = self.path.as_ref().map_or("", PathAndQuery::path);
        let mut cut = path.len().min(MAX_PATH);
        while !path.is_char_boundary(cut) {
            cut -= 1;
        }
        &path[..cut]
    }
}

impl Serialize for Arrival {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Fields<'a> {
            time: String,
            request_id: Option<Cow<'a, str>>,
            client: SocketAddr,
            method: &'a str,
            path: &'a str,
        }
        Fields {
            time: jiff::Timestamp::try_from(self.at)
                .map(|t| format!("{t:.3}"))
                .unwrap_or_default(),
            request_id: self
                .request_id
                .as_ref()
                .map(|v| String::from_utf8_lossy(v.as_bytes())),
            client: self.client,
            method: self.method.as_str(),
            path: self.path(),
        }
        .serialize(s)
    }
}

/// What was measured of a request, which every front door's line ends with (flattened into
/// it): `ttft_ms`, `duration_ms` (to the microsecond) and the reported usage.
#[derive(Serialize)]
pub struct Measured {
    ttft_ms: Option<f64>,
    duration_ms: f64,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    cached_tokens: Option<u64>,
}

impl Measured {
    /// The first token `ttft` and the end `took` after arrival; `usage` when reported.
    pub fn new(ttft: Option<Duration>, took: Duration, usage: Option<Usage>) -> Measured {
        let ms = |d: Duration| (d.as_nanos() as f64 / 1e3).round() / 1e3;
        Measured {
            ttft_ms: ttft.map(ms),
            duration_ms: ms(took),
            prompt_tokens: usage.map(|u| u.prompt_tokens),
            completion_tokens: usage.map(|u| u.completion_tokens),
            cached_tokens: usage.map(|u| u.cached_tokens),
        }
    }
}

/// How a request ended, as the access log says it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// A 2xx answer of a model server, read to its end.
    Completed,
    /// A model server's 5xx, or an answer that broke off or stalled.
    Failed,
    /// A model server's other answer (a 4xx about the request).
    Refused,
    /// The gateway answered itself: an error, or `/v1/models`.
    Gateway,
    /// The client left (or its body broke off) before the answer ended.
    Cancelled,
}

/// What the log learns of one request as it goes. Built only when the log is on.
pub(crate) struct Note {
    log: Arc<AccessLog<Note>>,
    arrival: Arrival,
    pub(crate) tenant: Option<Arc<str>>,
    /// The name the body asked for: the served model's own name when it is one (shared, not
    /// copied), else a copy.
    pub(crate) model: Option<Arc<str>>,
    /// The served model's name, shared with its configuration.
    pub(crate) served_model: Option<Arc<str>>,
    pub(crate) stream: bool,
    pub(crate) endpoint: Option<SocketAddr>,
    pub(crate) attempts: u8,
    pub(crate) status: Option<u16>,
    pub(crate) error: Option<&'static str>,
    pub(crate) outcome: Outcome,
    pub(crate) ttft: Option<Duration>,
    pub(crate) usage: Option<Usage>,
    took: Duration,
}

impl Note {
    /// A note for a request just arrived.
    pub(crate) fn new(
        log: &Arc<AccessLog<Note>>,
        client: SocketAddr,
        method: &Method,
        uri: &Uri,
        request_id: &HeaderValue,
    ) -> Box<Note> {
        Box::new(Note {
            log: Arc::clone(log),
            arrival: Arrival::now(client, method, uri, Some(request_id)),
            tenant: None,
            model: None,
            served_model: None,
            stream: false,
            endpoint: None,
            attempts: 0,
            status: None,
            error: None,
            outcome: Outcome::Gateway,
            ttft: None,
            usage: None,
            took: Duration::ZERO,
        })
    }

    /// The request is over, `took` after it arrived: the line goes to the log.
    pub(crate) fn done(mut self: Box<Self>, took: Duration) {
        self.took = took;
        let log = Arc::clone(&self.log);
        log.send(self);
    }

    fn line(&self) -> Line<'_> {
        Line {
            arrival: &self.arrival,
            status: self.status,
            outcome: self.outcome,
            error: self.error,
            tenant: self.tenant.as_deref(),
            model: self.model.as_deref(),
            served_model: self.served_model.as_deref(),
            stream: self.stream,
            endpoint: self.endpoint,
            attempts: self.attempts,
            measured: Measured::new(self.ttft, self.took, self.usage),
        }
    }
}

impl Serialize for Note {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.line().serialize(s)
    }
}

/// One line of the gateway's log, as written.
#[derive(Serialize)]
struct Line<'a> {
    #[serde(flatten)]
    arrival: &'a Arrival,
    status: Option<u16>,
    outcome: Outcome,
    error: Option<&'static str>,
    tenant: Option<&'a str>,
    model: Option<&'a str>,
    served_model: Option<&'a str>,
    stream: bool,
    endpoint: Option<SocketAddr>,
    attempts: u8,
    #[serde(flatten)]
    measured: Measured,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

    use std::io::Read;

    use super::*;

    /// The path is logged without its query and cut at 256 bytes, on a character boundary,
    /// when the line is written (the request keeps its own).
    #[test]
    fn a_long_path_is_cut_when_the_line_is_written() {
        let client = "127.0.0.1:1".parse().unwrap();
        let logged = |uri: &str| {
            let uri: Uri = uri.parse().unwrap();
            let arrival = Arrival::now(client, &Method::POST, &uri, None);
            serde_json::to_value(&arrival).unwrap()["path"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        let long = format!("/v1/{}", "a".repeat(300));
        assert_eq!(logged(&format!("{long}?key=secret")), long[..MAX_PATH]);
        // 'é' is two bytes: the 256th byte would split one.
        let accented = format!("/v1{}", "é".repeat(200));
        let path = logged(&accented);
        assert_eq!(path, accented[..MAX_PATH - 1]);
        assert_eq!(logged("/v1/models?x=1"), "/v1/models");
    }

    /// `flush` returns once every record handed over is written, even when the destination is
    /// slow: here a FIFO whose reader takes 1 KiB every millisecond, behind 200 lines of 1 KiB
    /// (three times a pipe's buffer), so the writer is still blocked on it when `flush` is
    /// called.
    #[test]
    fn flush_waits_until_every_line_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let reader = std::thread::spawn({
            let fifo = fifo.clone();
            move || {
                let mut f = File::open(fifo).unwrap();
                let (mut buf, mut read) = ([0u8; 1024], 0usize);
                loop {
                    match f.read(&mut buf).unwrap() {
                        0 => return read,
                        n => read += n,
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        let config = AccessLogConfig {
            path: AccessLogPath::File(fifo),
        };
        let counters = LineCounters::default();
        let log = AccessLog::<String>::start(&config, &counters).unwrap();
        for _ in 0..200 {
            log.send(Box::new("x".repeat(1021)));
        }
        assert!(log.flush(Duration::from_secs(10)));
        assert_eq!(counters.written.get(), 200);
        assert_eq!(counters.dropped.get(), 0);
        drop(log);
        // Each line: the 1,021 characters, their quotes and the newline.
        assert_eq!(reader.join().unwrap(), 200 * 1024);
    }
}
