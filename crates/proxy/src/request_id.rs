//! Request ids (`x-request-id`): the client's when it sent a usable one, else one made up here,
//! passed to the model server (or cluster) and returned, so that one request's lines in every
//! access log and server log along the way carry the same id.

use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, HeaderName, HeaderValue};

/// The request and response header carrying the request id.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

static X_REQUEST_ID: HeaderName = HeaderName::from_static(REQUEST_ID_HEADER);

/// The longest client-sent id kept; a longer (or empty) one is replaced.
const MAX_CLIENT_ID: usize = 200;

/// Generates request ids: 32 lowercase hex digits, a per-generator prefix and a counter, so ids
/// are unique without a lock (each gateway worker has its own generator).
pub struct RequestIds {
    prefix: u64,
    next: AtomicU64,
}

impl RequestIds {
    /// Generator number `worker` of a front door seeded with `seed`.
    pub fn new(seed: u64, worker: usize) -> Self {
        // Mix the start time in so that two gateways (or two runs) do not repeat ids; the worker
        // index keeps the workers of one gateway apart (the multiplication is a bijection, so
        // different inputs give different prefixes).
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        RequestIds {
            prefix: (t ^ seed.rotate_left(32) ^ (worker as u64).rotate_left(48))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15),
            next: AtomicU64::new(0),
        }
    }

    /// The request's id: the client's `x-request-id` when it is 1 to 200 bytes, else a new one.
    pub fn of(&self, headers: &HeaderMap) -> HeaderValue {
        match headers.get(&X_REQUEST_ID) {
            Some(v) if !v.is_empty() && v.len() <= MAX_CLIENT_ID => v.clone(),
            _ => self.next(),
        }
    }

    /// A new id.
    pub fn next(&self) -> HeaderValue {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut buf = [0u8; 32];
        for (i, v) in [self.prefix, n].into_iter().enumerate() {
            for j in 0..16 {
                buf[i * 16 + j] = HEX[((v >> (60 - 4 * j)) & 0xf) as usize];
            }
        }
        // 32 lowercase hex digits are always a valid header value.
        HeaderValue::from_bytes(&buf).unwrap_or_else(|_| HeaderValue::from_static("0"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_32_hex_digits_and_differ_across_workers_and_requests() {
        let a = RequestIds::new(7, 0);
        let b = RequestIds::new(7, 1);
        let (a1, a2, b1) = (a.next(), a.next(), b.next());
        for id in [&a1, &a2, &b1] {
            assert_eq!(id.len(), 32);
            assert!(id.as_bytes().iter().all(u8::is_ascii_hexdigit));
        }
        assert_ne!(a1, a2);
        assert_ne!(a1, b1);
        assert_ne!(a1.as_bytes()[..16], b1.as_bytes()[..16]);
    }

    #[test]
    fn a_usable_client_id_is_kept_and_another_replaced() {
        let ids = RequestIds::new(1, 0);
        let mut h = HeaderMap::new();
        h.insert(&X_REQUEST_ID, HeaderValue::from_static("abc"));
        assert_eq!(ids.of(&h), "abc");
        for bad in [String::new(), "x".repeat(201)] {
            h.insert(&X_REQUEST_ID, HeaderValue::try_from(bad).unwrap());
            assert_eq!(ids.of(&h).len(), 32);
        }
    }
}
