//! The crate's error types: one enum per failure domain, causes kept as sources.

use std::time::Duration;

use infergate_scheduler::{EngineType, UnknownEngineError};

/// Why a metrics page could not be turned into a snapshot.
///
/// The parser never guesses: a page that is cut off, malformed on a line it reads, or carries an
/// impossible value for a field it reports is rejected as a whole, so a pod is never refreshed with
/// data the engine did not send.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    /// The page does not end with a newline, so its last line may have been cut short.
    #[error("metrics page is cut off: it does not end with a newline")]
    Truncated,
    /// A line of a family the parser reads does not follow the Prometheus text format.
    #[error("metrics page line {line}: {reason}")]
    Malformed {
        /// 1-based line number in the page.
        line: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A label value the parser reads is not valid UTF-8.
    #[error("metrics page line {line}: label value is not valid UTF-8")]
    InvalidUtf8 {
        /// 1-based line number in the page.
        line: usize,
        /// The decoding failure.
        #[source]
        source: std::str::Utf8Error,
    },
    /// A sample of a family the parser reads has a value that family cannot take.
    #[error("metrics page line {line}: {family} has value {value}, which is {reason}")]
    InvalidValue {
        /// The metric name.
        family: &'static str,
        /// 1-based line number in the page.
        line: usize,
        /// The value as parsed.
        value: f64,
        /// Why it was rejected (e.g. "not finite", "negative", "above 1").
        reason: &'static str,
    },
    /// The same series (same name and label text) appears twice.
    #[error("metrics page line {line}: {family} repeats a series already on the page")]
    DuplicateSeries {
        /// The metric name.
        family: &'static str,
        /// 1-based line number of the repeat.
        line: usize,
    },
    /// A label the parser needs has a value it cannot read.
    #[error("metrics page line {line}: label {label} of {family} has unreadable value {value:?}")]
    InvalidLabel {
        /// The metric name.
        family: &'static str,
        /// The label name.
        label: &'static str,
        /// The label value as written.
        value: String,
        /// 1-based line number in the page.
        line: usize,
    },
    /// A family the engine always exports, and routing cannot do without, is not on the page.
    #[error("{engine} metrics page has no {family} samples")]
    MissingFamily {
        /// The engine the page was read as.
        engine: EngineType,
        /// The missing metric name.
        family: &'static str,
    },
}

impl ParseError {
    /// Turns the byte offset the scan keeps in `line` into a 1-based line number of `page`.
    pub(crate) fn offset_to_line(mut self, page: &[u8]) -> Self {
        match &mut self {
            ParseError::Malformed { line, .. }
            | ParseError::InvalidUtf8 { line, .. }
            | ParseError::InvalidValue { line, .. }
            | ParseError::DuplicateSeries { line, .. }
            | ParseError::InvalidLabel { line, .. } => {
                let offset = (*line).min(page.len());
                *line = memchr::memchr_iter(b'\n', &page[..offset]).count() + 1;
            }
            ParseError::Truncated | ParseError::MissingFamily { .. } => {}
        }
        self
    }

    /// A short, stable label for metrics (`reason` of the scrape error counter).
    pub const fn metric_label(&self) -> &'static str {
        match self {
            ParseError::Truncated => "parse_truncated",
            ParseError::Malformed { .. } | ParseError::InvalidUtf8 { .. } => "parse_malformed",
            ParseError::InvalidValue { .. } | ParseError::InvalidLabel { .. } => {
                "parse_invalid_value"
            }
            ParseError::DuplicateSeries { .. } => "parse_duplicate_series",
            ParseError::MissingFamily { .. } => "parse_missing_family",
        }
    }
}

/// Why one scrape of one target failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The TCP connection could not be opened.
    #[error("connecting to the metrics endpoint failed")]
    Connect(#[source] std::io::Error),
    /// The TLS handshake with the metrics endpoint failed (an untrusted certificate, a name
    /// that does not match, no TLS on that port).
    #[error("TLS handshake with the metrics endpoint failed")]
    Tls(#[source] std::io::Error),
    /// Writing the request or reading the answer failed (for example a reset connection).
    #[error("reading from or writing to the metrics endpoint failed")]
    Io(#[source] std::io::Error),
    /// The answer is not an HTTP/1.1 response this client can read.
    #[error("metrics endpoint sent an unreadable HTTP response")]
    Protocol(#[from] HttpError),
    /// The server closed the connection before the page arrived.
    #[error("metrics endpoint closed the connection before the page arrived")]
    Closed,
    /// The server answered with a non-success status.
    #[error("metrics endpoint answered HTTP {0}")]
    Status(http::StatusCode),
    /// The page is larger than the configured cap.
    #[error("metrics page exceeds the {limit}-byte cap")]
    BodyTooLarge {
        /// The configured cap in bytes.
        limit: usize,
    },
    /// The scrape did not finish within the per-scrape timeout.
    #[error("scrape did not finish within {0:?}")]
    Timeout(Duration),
    /// The page was read but could not be parsed.
    #[error("metrics page could not be parsed")]
    Parse(#[from] ParseError),
}

impl ScrapeError {
    /// Every [`ScrapeError::metric_label`], in a stable order: the scrape error counter exports
    /// each at 0 from the start, so `rate()` and dashboards see the series before the first
    /// failure of that kind.
    pub const REASONS: [&'static str; 11] = [
        "connect",
        "tls",
        "http",
        "status",
        "body_too_large",
        "timeout",
        "parse_truncated",
        "parse_malformed",
        "parse_invalid_value",
        "parse_duplicate_series",
        "parse_missing_family",
    ];

    /// A short, stable label for metrics (`reason` of the scrape error counter).
    pub const fn metric_label(&self) -> &'static str {
        match self {
            ScrapeError::Connect(_) => "connect",
            ScrapeError::Tls(_) => "tls",
            ScrapeError::Io(_) | ScrapeError::Protocol(_) | ScrapeError::Closed => "http",
            ScrapeError::Status(_) => "status",
            ScrapeError::BodyTooLarge { .. } => "body_too_large",
            ScrapeError::Timeout(_) => "timeout",
            ScrapeError::Parse(e) => e.metric_label(),
        }
    }
}

/// Why a metrics endpoint's answer could not be read as an HTTP/1.1 response.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The status line or a header is malformed.
    #[error("malformed response head")]
    Head(#[source] httparse::Error),
    /// The status line and headers do not end within the limit.
    #[error("response head exceeds {limit} bytes")]
    HeadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// `Content-Length` is not a number, is given twice with different values, or accompanies
    /// chunked coding.
    #[error("invalid or conflicting content-length")]
    ContentLength,
    /// A transfer coding other than chunked (this client decodes no compression).
    #[error("unsupported transfer-encoding")]
    TransferEncoding,
    /// The chunked body is malformed.
    #[error("malformed chunked body: {0}")]
    Chunk(&'static str),
}

/// Errors of the metrics crate that reach its callers: configuration and engine selection.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pod's engine label (or configured engine) names an engine infergate does not know.
    #[error("invalid engine for target {target}")]
    UnknownEngine {
        /// The target (pod) concerned.
        target: String,
        /// The unknown name.
        #[source]
        source: UnknownEngineError,
    },
    /// Neither the pod label nor the configuration says which engine serves the target.
    #[error(
        "target {target} has no engine: set the pod label {label} or a configured engine type",
        label = crate::ENGINE_LABEL
    )]
    MissingEngine {
        /// The target (pod) concerned.
        target: String,
    },
    /// A scraper setting is out of range.
    #[error("invalid scraper configuration: {0}")]
    InvalidConfig(&'static str),
    /// The scraper's own thread or runtime could not be started.
    #[error("starting the scraper's thread failed")]
    Runtime(#[source] std::io::Error),
    /// A scrape target's path is not a valid URI path.
    #[error("invalid metrics path {path:?}")]
    InvalidPath {
        /// The path given.
        path: String,
        /// Why it was rejected.
        #[source]
        source: http::uri::InvalidUri,
    },
}

/// An error and its causes on one line, `error: cause: root cause`, for a log field.
///
/// The errors of infergate's crates keep a cause out of their own message and return it from
/// `source()` (so that a printed chain, as `anyhow` prints one, says each thing once); a log
/// line of the error's message alone would drop the cause, this one keeps it.
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

impl std::fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One error of every variant, parse errors included.
    fn every_error() -> Vec<ScrapeError> {
        let io = || std::io::Error::other("x");
        let parse = [
            ParseError::Truncated,
            ParseError::Malformed {
                line: 1,
                reason: "x",
            },
            ParseError::InvalidUtf8 {
                line: 1,
                source: String::from_utf8(vec![0xff]).unwrap_err().utf8_error(),
            },
            ParseError::InvalidValue {
                family: "f",
                line: 1,
                value: -1.0,
                reason: "negative",
            },
            ParseError::DuplicateSeries {
                family: "f",
                line: 1,
            },
            ParseError::InvalidLabel {
                family: "f",
                label: "l",
                value: "v".into(),
                line: 1,
            },
            ParseError::MissingFamily {
                engine: EngineType::Vllm,
                family: "f",
            },
        ];
        let mut all = vec![
            ScrapeError::Connect(io()),
            ScrapeError::Tls(io()),
            ScrapeError::Io(io()),
            ScrapeError::Protocol(HttpError::ContentLength),
            ScrapeError::Closed,
            ScrapeError::Status(http::StatusCode::NOT_FOUND),
            ScrapeError::BodyTooLarge { limit: 1 },
            ScrapeError::Timeout(Duration::from_secs(1)),
        ];
        all.extend(parse.into_iter().map(ScrapeError::Parse));
        all
    }

    #[test]
    fn reasons_lists_every_label_once() {
        let labels: std::collections::BTreeSet<&str> = every_error()
            .iter()
            .map(ScrapeError::metric_label)
            .collect();
        let listed: std::collections::BTreeSet<&str> = ScrapeError::REASONS.into_iter().collect();
        assert_eq!(
            listed.len(),
            ScrapeError::REASONS.len(),
            "a reason listed twice"
        );
        assert_eq!(labels, listed);
    }
}
