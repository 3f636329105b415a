//! Errors of the KV-event subscriber, each saying what went wrong and where.

use std::io;

/// A payload, frame or handshake that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes end inside a value.
    #[error("truncated: the payload ends inside a value")]
    Truncated,
    /// A value of another kind than the format requires.
    #[error("expected {0}")]
    Unexpected(&'static str),
    /// A value that can never be valid here.
    #[error("malformed: {0}")]
    Malformed(&'static str),
    /// An event whose type this decoder does not know; counted and skipped by the subscriber.
    #[error("unknown event type {0:?}")]
    UnknownEvent(String),
}

/// Why a connection to an engine's event publisher failed or ended.
#[derive(Debug, thiserror::Error)]
pub enum ZmtpError {
    /// A socket error.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer does not speak ZMTP 3 with the NULL mechanism.
    #[error("handshake: {0}")]
    Handshake(String),
    /// A frame over the size limit.
    #[error("frame of {size} bytes over the {limit}-byte limit")]
    FrameTooLarge {
        /// The announced size.
        size: u64,
        /// The configured limit.
        limit: u64,
    },
    /// A message with more frames than any KV-event message has.
    #[error("message of more than {0} frames")]
    TooManyFrames(usize),
    /// The peer did not answer in time.
    #[error("timed out after {0} ms {1}")]
    Timeout(u64, &'static str),
    /// The peer closed the connection.
    #[error("connection closed by the publisher")]
    Closed,
}
