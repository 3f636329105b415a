//! Hop-by-hop headers (RFC 9110 §7.6.1): what describes one connection, not the message, and
//! so is never forwarded, by the gateway or the global router, in either direction.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// The headers that are always hop-by-hop; those a `Connection` header names are too.
pub static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes the hop-by-hop headers from `headers`: those of [`HOP_BY_HOP`] and every header named
/// in any `Connection` field line (a message may carry several, each a comma-separated list).
/// Without any of [`HOP_BY_HOP`] present (the usual case) it is one pass over the names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if !headers.keys().any(|k| HOP_BY_HOP.contains(k)) {
        return;
    }
    // The `Connection` lines are copied out (a reference count each; collecting none or one
    // line into the `Vec` allocates nothing) and the names they list removed by `&str`, which
    // looks a name up without building a `HeaderName`.
    let mut lines = headers.get_all(header::CONNECTION).iter();
    let first = lines.next().cloned();
    let rest: Vec<HeaderValue> = lines.cloned().collect();
    for line in first.iter().chain(&rest) {
        for token in line.as_bytes().split(|b| *b == b',') {
            if let Ok(name) = std::str::from_utf8(token.trim_ascii())
                && !name.is_empty()
            {
                headers.remove(name);
            }
        }
    }
    for h in &HOP_BY_HOP {
        headers.remove(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn every_connection_line_names_hop_by_hop_headers() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Foo ,"),
            ("x-foo", "1"),
            ("connection", "x-bar"),
            ("x-bar", "2"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("x-kept", "3"),
        ]);
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn a_message_without_hop_by_hop_headers_is_left_alone() {
        let mut h = map(&[("x-foo", "1"), ("content-type", "application/json")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
    }
}
