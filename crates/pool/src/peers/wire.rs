//! The peer exchange's wire format: an authenticated handshake, then HMAC-tagged report frames.
//!
//! Every integer is big-endian; every string is a `u16` length and its UTF-8 bytes.
//!
//! ```text
//! server → client  MAGIC (8) | server nonce (32) | server replica
//! client → server  client nonce (32) | client replica | pool | hello mac (32)
//! server → client  ACCEPTED (1) | accept mac (32)        or   REFUSED (1) | reason (1)
//! client → server  frames: length u32 | payload (length bytes) | tag (32), repeated
//! ```
//!
//! The macs are HMAC-SHA256 under the replicas' shared key over a label, both nonces and the
//! three names, so each side proves it holds the key without sending it, and a recorded
//! handshake cannot be replayed against a fresh nonce. Each frame's tag is HMAC-SHA256 under a
//! session key (HMAC of both nonces under the shared key) over the frame's sequence number
//! (counted from 0 by both sides, never sent) and the payload: a frame injected, reordered,
//! replayed or altered on the way fails its tag and closes the connection. Payloads are not
//! encrypted: they hold request counts per pod address, nothing of the requests themselves.

use ring::hmac;
use serde::{Deserialize, Serialize};

use infergate_scheduler::{PeerLoad, RateSample};

/// First bytes the server sends: the protocol and its version.
pub const MAGIC: &[u8; 8] = b"IGPEER01";
/// Bytes of each nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of each mac and tag (HMAC-SHA256).
pub const MAC_LEN: usize = 32;
/// Longest replica or pool name accepted (a Kubernetes DNS name fits).
pub const MAX_NAME: usize = 253;
/// Largest report payload accepted (a report of a few thousand endpoints fits many times over).
pub const MAX_FRAME: usize = 1 << 20;
/// Shortest shared key accepted, in bytes.
pub const MIN_KEY_LEN: usize = 16;

/// The handshake's answer byte: accepted.
pub const ACCEPTED: u8 = 0;
/// The handshake's answer byte: refused (a reason byte follows).
pub const REFUSED: u8 = 1;

/// Why a server refused a client's hello.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The hello's mac does not verify: the client holds another key.
    BadMac,
    /// The client serves another pool.
    OtherPool,
    /// The client is the server itself (its own address, found through DNS).
    SameReplica,
    /// The server already holds reports from as many peers as it keeps.
    TooManyPeers,
}

impl Refusal {
    /// The reason byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            Refusal::BadMac => 1,
            Refusal::OtherPool => 2,
            Refusal::SameReplica => 3,
            Refusal::TooManyPeers => 4,
        }
    }

    /// The refusal a reason byte stands for (`None`: unknown).
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Refusal::BadMac,
            2 => Refusal::OtherPool,
            3 => Refusal::SameReplica,
            4 => Refusal::TooManyPeers,
            _ => return None,
        })
    }

    /// The `reason` label of `infergate_peer_connection_failures_total`, and of the logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::BadMac => "bad-mac",
            Refusal::OtherPool => "other-pool",
            Refusal::SameReplica => "same-replica",
            Refusal::TooManyPeers => "too-many-peers",
        }
    }
}

/// A malformed message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The first bytes are not [`MAGIC`]: not an infergate peer, or another version.
    #[error("not an infergate peer exchange (version 1) stream")]
    BadMagic,
    /// A name is empty, too long or not UTF-8.
    #[error("bad {what}: {reason}")]
    BadName {
        /// Which name.
        what: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A frame announces more than [`MAX_FRAME`] bytes.
    #[error("frame of {len} bytes exceeds the limit of {MAX_FRAME}")]
    FrameTooLarge {
        /// The announced length.
        len: usize,
    },
    /// A frame's tag does not verify.
    #[error("frame {seq} fails its tag (altered, replayed, reordered or another key)")]
    BadTag {
        /// The frame's sequence number.
        seq: u64,
    },
    /// A payload does not decode as a report.
    #[error("report does not decode: {0}")]
    BadReport(String),
}

/// One replica's report to a peer: its own load on every endpoint it has load on, and the rate
/// samples it learned since its previous report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Report {
    /// The sender's own load (endpoints not named carry none of it).
    pub loads: Vec<PeerLoad>,
    /// Rate samples learned from the sender's completions since its previous report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<RateSample>,
}

impl Report {
    /// The payload of a frame carrying this report.
    pub fn encode(&self) -> Vec<u8> {
        // A report is plain numbers and addresses: serialising it cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a frame's payload.
    pub fn decode(payload: &[u8]) -> Result<Self, WireError> {
        serde_json::from_slice(payload).map_err(|e| WireError::BadReport(e.to_string()))
    }
}

/// Appends `name` as a length-prefixed string.
pub fn put_name(out: &mut Vec<u8>, name: &str) {
    let bytes = name.as_bytes();
    let len = bytes.len().min(MAX_NAME);
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(&bytes[..len]);
}

/// Checks a name read from the wire.
pub fn check_name(what: &'static str, bytes: &[u8]) -> Result<String, WireError> {
    if bytes.is_empty() {
        return Err(WireError::BadName {
            what,
            reason: "empty",
        });
    }
    if bytes.len() > MAX_NAME {
        return Err(WireError::BadName {
            what,
            reason: "longer than 253 bytes",
        });
    }
    let s = std::str::from_utf8(bytes).map_err(|_| WireError::BadName {
        what,
        reason: "not UTF-8",
    })?;
    if s.chars().any(char::is_control) {
        return Err(WireError::BadName {
            what,
            reason: "control characters",
        });
    }
    Ok(s.to_owned())
}

/// What both handshake macs cover.
pub struct Transcript<'a> {
    /// The server's nonce.
    pub server_nonce: &'a [u8; NONCE_LEN],
    /// The client's nonce.
    pub client_nonce: &'a [u8; NONCE_LEN],
    /// The client replica's name.
    pub client: &'a str,
    /// The pool the client serves.
    pub pool: &'a str,
    /// The server replica's name.
    pub server: &'a str,
}

impl Transcript<'_> {
    fn message(&self, label: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(label.len() + 2 * NONCE_LEN + 3 * 8 + 3 * MAX_NAME);
        m.extend_from_slice(label);
        m.extend_from_slice(self.server_nonce);
        m.extend_from_slice(self.client_nonce);
        for name in [self.client, self.pool, self.server] {
            m.extend_from_slice(&(name.len() as u64).to_be_bytes());
            m.extend_from_slice(name.as_bytes());
        }
        m
    }

    /// The client's proof (sent in its hello).
    pub fn hello_mac(&self, key: &hmac::Key) -> hmac::Tag {
        hmac::sign(key, &self.message(HELLO))
    }

    /// The server's proof (sent with its acceptance).
    pub fn accept_mac(&self, key: &hmac::Key) -> hmac::Tag {
        hmac::sign(key, &self.message(ACCEPT))
    }

    /// Verifies `mac` as the client's proof (ring compares in constant time).
    pub fn verify_hello(&self, key: &hmac::Key, mac: &[u8]) -> bool {
        hmac::verify(key, &self.message(HELLO), mac).is_ok()
    }

    /// Verifies `mac` as the server's proof (ring compares in constant time).
    pub fn verify_accept(&self, key: &hmac::Key, mac: &[u8]) -> bool {
        hmac::verify(key, &self.message(ACCEPT), mac).is_ok()
    }

    /// The key that tags this connection's frames.
    pub fn session_key(&self, key: &hmac::Key) -> hmac::Key {
        let tag = hmac::sign(key, &self.message(SESSION));
        hmac::Key::new(hmac::HMAC_SHA256, tag.as_ref())
    }
}

const HELLO: &[u8] = b"infergate-peer-hello";
const ACCEPT: &[u8] = b"infergate-peer-accept";
const SESSION: &[u8] = b"infergate-peer-session";

/// The tag of frame `seq` carrying `payload`.
pub fn frame_tag(session: &hmac::Key, seq: u64, payload: &[u8]) -> hmac::Tag {
    let mut ctx = hmac::Context::with_key(session);
    ctx.update(&seq.to_be_bytes());
    ctx.update(payload);
    ctx.sign()
}

/// Writes frame `seq` (header, payload, tag) into `out` (cleared first).
pub fn encode_frame(session: &hmac::Key, seq: u64, payload: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(frame_tag(session, seq, payload).as_ref());
}

/// The payload length a frame header announces, checked against [`MAX_FRAME`].
pub fn frame_len(header: [u8; 4]) -> Result<usize, WireError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(WireError::FrameTooLarge { len });
    }
    Ok(len)
}

/// Verifies frame `seq`'s tag over `payload` (ring compares in constant time).
pub fn verify_frame(
    session: &hmac::Key,
    seq: u64,
    payload: &[u8],
    tag: &[u8],
) -> Result<(), WireError> {
    let mut msg = Vec::with_capacity(8 + payload.len());
    msg.extend_from_slice(&seq.to_be_bytes());
    msg.extend_from_slice(payload);
    hmac::verify(session, &msg, tag).map_err(|_| WireError::BadTag { seq })
}

/// The shared key from a key file's bytes: surrounding whitespace (a trailing newline) is not
/// part of it; at least [`MIN_KEY_LEN`] bytes must remain.
pub fn key_from_bytes(bytes: &[u8]) -> Option<hmac::Key> {
    let trimmed = bytes.trim_ascii();
    (trimmed.len() >= MIN_KEY_LEN).then(|| hmac::Key::new(hmac::HMAC_SHA256, trimmed))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn key(s: &str) -> hmac::Key {
        key_from_bytes(s.as_bytes()).unwrap()
    }

    fn transcript<'a>(sn: &'a [u8; 32], cn: &'a [u8; 32]) -> Transcript<'a> {
        Transcript {
            server_nonce: sn,
            client_nonce: cn,
            client: "picker-a",
            pool: "llama",
            server: "picker-b",
        }
    }

    #[test]
    fn a_hello_verifies_only_under_the_same_key_nonces_and_names() {
        let (sn, cn) = ([1u8; 32], [2u8; 32]);
        let k = key("0123456789abcdef-shared");
        let t = transcript(&sn, &cn);
        let mac = t.hello_mac(&k);
        assert!(t.verify_hello(&k, mac.as_ref()));
        // Another key, another nonce, another name, the accept label, a truncated mac: refused.
        assert!(!t.verify_hello(&key("0123456789abcdef-other"), mac.as_ref()));
        let other_nonce = [3u8; 32];
        assert!(!transcript(&other_nonce, &cn).verify_hello(&k, mac.as_ref()));
        let renamed = Transcript {
            pool: "qwen",
            ..transcript(&sn, &cn)
        };
        assert!(!renamed.verify_hello(&k, mac.as_ref()));
        assert!(!t.verify_accept(&k, mac.as_ref()));
        assert!(!t.verify_hello(&k, &mac.as_ref()[..31]));
    }

    #[test]
    fn frames_fail_their_tag_when_altered_replayed_or_reordered() {
        let (sn, cn) = ([7u8; 32], [9u8; 32]);
        let session = transcript(&sn, &cn).session_key(&key("0123456789abcdef-shared"));
        let mut buf = Vec::new();
        encode_frame(&session, 0, b"{\"loads\":[]}", &mut buf);
        let len = frame_len(buf[..4].try_into().unwrap()).unwrap();
        let (payload, tag) = buf[4..].split_at(len);
        assert!(verify_frame(&session, 0, payload, tag).is_ok());
        assert_eq!(
            verify_frame(&session, 1, payload, tag),
            Err(WireError::BadTag { seq: 1 })
        );
        let mut altered = payload.to_vec();
        altered[2] ^= 1;
        assert!(verify_frame(&session, 0, &altered, tag).is_err());
        assert!(verify_frame(&session, 0, payload, &tag[..31]).is_err());
    }

    #[test]
    fn bad_names_lengths_keys_and_reports_are_refused() {
        assert!(check_name("replica", b"").is_err());
        assert!(check_name("replica", &[b'a'; 254]).is_err());
        assert!(check_name("replica", &[0xff, 0xfe]).is_err());
        assert!(check_name("replica", b"a\nb").is_err());
        assert_eq!(check_name("replica", b"picker-0").unwrap(), "picker-0");
        assert_eq!(
            frame_len((MAX_FRAME as u32 + 1).to_be_bytes()),
            Err(WireError::FrameTooLarge { len: MAX_FRAME + 1 })
        );
        assert!(key_from_bytes(b"short\n").is_none());
        assert!(key_from_bytes(b"  0123456789abcdef\n").is_some());
        for bad in [
            &b"not json"[..],
            b"{\"loads\":[{\"addr\":\"x\"}]}",
            b"{\"loads\":[],\"extra\":1}",
        ] {
            assert!(
                Report::decode(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let r = Report {
            loads: vec![PeerLoad {
                inflight: 3,
                pending: 1,
                pending_tokens: 400,
                ..PeerLoad::idle("10.0.0.1:8000".parse().unwrap())
            }],
            samples: vec![],
        };
        assert_eq!(Report::decode(&r.encode()).unwrap(), r);
    }

    #[test]
    fn refusal_codes_round_trip() {
        for r in [
            Refusal::BadMac,
            Refusal::OtherPool,
            Refusal::SameReplica,
            Refusal::TooManyPeers,
        ] {
            assert_eq!(Refusal::from_code(r.code()), Some(r));
        }
        assert_eq!(Refusal::from_code(0), None);
        assert_eq!(Refusal::from_code(200), None);
    }
}
