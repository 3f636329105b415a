//! A structural skim of a JSON object for its top-level `usage` value.
//!
//! The skim walks the top-level object's keys and steps over every value by its structure alone:
//! a string to its closing quote (escapes stepped over two bytes at a time), an object or array to
//! its matching close, a number or literal to the next separator. Nothing is decoded or
//! allocated. It answers [`Found::Unsure`] wherever JSON's own reading could differ from a plain
//! byte comparison of keys (a key with escapes, a repeated `usage`, a `response` object, a body
//! that is not an object), and the caller then parses the whole body.

/// What the skim found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Found<'a> {
    /// The bytes of the top-level `usage` value.
    Usage(&'a [u8]),
    /// No `usage` key, or a body that is not well-formed JSON.
    Nothing,
    /// The full parse must decide.
    Unsure,
}

/// Not well-formed JSON: serde would refuse the body too.
struct Malformed;

/// Skims `body` for its top-level `usage` value.
pub(super) fn usage(body: &[u8]) -> Found<'_> {
    object(body).unwrap_or(Found::Nothing)
}

fn object(b: &[u8]) -> Result<Found<'_>, Malformed> {
    let mut i = ws(b, 0);
    if b.get(i) != Some(&b'{') {
        // A top-level array also fills a struct in serde: leave such bodies to it.
        return Ok(Found::Unsure);
    }
    let mut usage = None;
    i = ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        i += 1;
    } else {
        loop {
            if b.get(i) != Some(&b'"') {
                return Err(Malformed);
            }
            let end = string_end(b, i)?;
            let key = &b[i + 1..end - 1];
            i = ws(b, end);
            if b.get(i) != Some(&b':') {
                return Err(Malformed);
            }
            let start = ws(b, i + 1);
            let stop = value_end(b, start)?;
            match key {
                b"usage" if usage.is_none() => usage = Some(&b[start..stop]),
                // A second `usage` (serde refuses it), the Responses API's nested `response`,
                // or a key spelled with escapes.
                b"usage" | b"response" => return Ok(Found::Unsure),
                k if k.contains(&b'\\') => return Ok(Found::Unsure),
                _ => {}
            }
            i = ws(b, stop);
            match b.get(i) {
                Some(b',') => i = ws(b, i + 1),
                Some(b'}') => {
                    i += 1;
                    break;
                }
                _ => return Err(Malformed),
            }
        }
    }
    if ws(b, i) != b.len() {
        return Err(Malformed);
    }
    Ok(usage.map_or(Found::Nothing, Found::Usage))
}

/// The first index at or after `i` that is not JSON whitespace.
fn ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// Just past the value that starts at `i`.
fn value_end(b: &[u8], i: usize) -> Result<usize, Malformed> {
    match b.get(i) {
        Some(b'"') => string_end(b, i),
        Some(b'{' | b'[') => container_end(b, i),
        Some(_) => {
            let len = b[i..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(b.len() - i);
            if len == 0 {
                Err(Malformed)
            } else {
                Ok(i + len)
            }
        }
        None => Err(Malformed),
    }
}

/// Just past the string whose opening quote is at `i`.
fn string_end(b: &[u8], i: usize) -> Result<usize, Malformed> {
    let mut j = i + 1;
    loop {
        let k = j + memchr::memchr2(b'"', b'\\', b.get(j..).ok_or(Malformed)?).ok_or(Malformed)?;
        if b[k] == b'"' {
            return Ok(k + 1);
        }
        // An escape: the next byte is part of it, whatever it is.
        j = k + 2;
    }
}

/// Just past the object or array that opens at `i`.
fn container_end(b: &[u8], i: usize) -> Result<usize, Malformed> {
    let mut depth = 0usize;
    let mut j = i;
    while let Some(&c) = b.get(j) {
        match c {
            b'"' => {
                j = string_end(b, j)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(j + 1);
                }
            }
            _ => {}
        }
        j += 1;
    }
    Err(Malformed)
}
