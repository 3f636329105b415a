//! A zero-copy tokenizer for the Prometheus text exposition format.
//!
//! It splits a page into lines and, for the lines the caller asks about, into name, raw label text
//! and value. Lines of families nobody reads are only scanned for their newline, which is what
//! makes a full vLLM page cheap to read every 50 ms.

use crate::error::ParseError;

/// One sample line, borrowed from the page.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SampleLine<'a> {
    /// Label text between the braces, as written (empty when there are none).
    pub(crate) labels: &'a [u8],
    /// The sample value.
    pub(crate) value: f64,
    /// Where the line starts (a byte offset until the error path makes it a line number).
    pub(crate) line: usize,
}

/// The family named by a `# TYPE <name> <type>` line, or `None` for any other line.
pub(crate) fn type_line_family(line: &[u8]) -> Option<&[u8]> {
    let rest = trim_start(trim_start(line).strip_prefix(b"#")?);
    let rest = rest.strip_prefix(b"TYPE")?;
    if !rest.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
        return None;
    }
    let rest = trim_start(rest);
    let end = memchr::memchr2(b' ', b'\t', rest).unwrap_or(rest.len());
    let name = &rest[..end];
    (!name.is_empty()).then_some(name)
}

/// Jumps over the blocks of families that are not read: the offset of the line after the next
/// `# TYPE` line at or after `from` whose family `read` accepts, or the page length.
///
/// Only the page's `Y` bytes are visited (on an exporter's page, one per `# TYPE` line): sample
/// lines and `# HELP` lines are never split into lines at all, which is most of a vLLM page.
pub(crate) fn skip_to_read_block(page: &[u8], from: usize, read: impl Fn(&[u8]) -> bool) -> usize {
    let Some(rest) = page.get(from..) else {
        return page.len();
    };
    for i in memchr::memchr_iter(b'Y', rest) {
        let y = from + i;
        // `TYPE` around it, then at least one blank.
        let Some(t) = y.checked_sub(1) else { continue };
        if page.get(t..y + 3) != Some(b"TYPE".as_slice())
            || !page.get(y + 3).is_some_and(|b| *b == b' ' || *b == b'\t')
        {
            continue;
        }
        // Before it: `#`, blanks around it, and nothing else back to the start of the line.
        let Some(hash) = page[..t].iter().rposition(|&b| b != b' ' && b != b'\t') else {
            continue;
        };
        if page[hash] != b'#'
            || page[..hash]
                .iter()
                .rposition(|&b| b != b' ' && b != b'\t')
                .is_some_and(|b| page[b] != b'\n')
        {
            continue;
        }
        let name_start = y
            + 3
            + page[y + 3..]
                .iter()
                .take_while(|&&b| b == b' ' || b == b'\t')
                .count();
        let tail = &page[name_start..];
        let name_len = memchr::memchr3(b' ', b'\t', b'\n', tail).unwrap_or(tail.len());
        let name = &tail[..name_len];
        let name = name.strip_suffix(b"\r").unwrap_or(name);
        if !name.is_empty() && read(name) {
            let end = name_start + name_len;
            return memchr::memchr(b'\n', &page[end..]).map_or(page.len(), |e| end + e + 1);
        }
    }
    page.len()
}

/// The metric name at the start of a sample line, or `None` for comments and blank lines.
pub(crate) fn metric_name(line: &[u8]) -> Option<&[u8]> {
    let line = trim_start(line);
    match line.first() {
        None | Some(b'#') => None,
        Some(_) => {
            let end = memchr::memchr3(b'{', b' ', b'\t', line).unwrap_or(line.len());
            Some(&line[..end])
        }
    }
}

/// Splits a sample line whose name is `name_len` bytes long into labels and value.
pub(crate) fn sample(
    line_no: usize,
    line: &[u8],
    name_len: usize,
) -> Result<SampleLine<'_>, ParseError> {
    let malformed = |reason| ParseError::Malformed {
        line: line_no,
        reason,
    };
    let line = trim_start(line);
    let mut rest = &line[name_len..];
    let mut labels: &[u8] = &[];
    if rest.first() == Some(&b'{') {
        let close = label_block_end(rest).ok_or(malformed("label set is not closed"))?;
        labels = &rest[1..close];
        rest = &rest[close + 1..];
    }
    let rest = trim_start(rest);
    let end = rest
        .iter()
        .position(|&b| b == b' ' || b == b'\t')
        .unwrap_or(rest.len());
    let (value, tail) = rest.split_at(end);
    if value.is_empty() {
        return Err(malformed("sample has no value"));
    }
    let value = std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or(malformed("sample value is not a number"))?;
    // An optional integer timestamp may follow; anything else is an error.
    let tail = trim_start(tail);
    if !tail.is_empty() {
        let ts = trim_end(tail);
        let digits = ts.strip_prefix(b"-").unwrap_or(ts);
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(malformed("unexpected text after the sample value"));
        }
    }
    Ok(SampleLine {
        labels,
        value,
        line: line_no,
    })
}

/// Index of the `}` closing the label block that starts at `block[0] == b'{'`, honouring quotes.
fn label_block_end(block: &[u8]) -> Option<usize> {
    let mut i = 1;
    loop {
        // Outside quotes: the next quote or the closing brace.
        i += memchr::memchr2(b'"', b'}', block.get(i..)?)?;
        if block[i] == b'}' {
            return Some(i);
        }
        i = closing_quote(block, i + 1)? + 1;
    }
}

/// Index of the unescaped `"` ending a quoted value whose text starts at `from`.
fn closing_quote(s: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    loop {
        i += memchr::memchr2(b'"', b'\\', s.get(i..)?)?;
        if s[i] == b'"' {
            return Some(i);
        }
        // A backslash escapes the next byte, whatever it is.
        i += 2;
    }
}

/// Iterates over `name="value"` pairs of a label block (without braces); values stay escaped.
pub(crate) struct Labels<'a> {
    rest: &'a [u8],
    line: usize,
}

impl<'a> Labels<'a> {
    pub(crate) fn new(block: &'a [u8], line: usize) -> Self {
        Labels { rest: block, line }
    }
}

impl<'a> Iterator for Labels<'a> {
    type Item = Result<(&'a [u8], &'a [u8]), ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        let malformed = ParseError::Malformed {
            line: self.line,
            reason: "label is not name=\"value\"",
        };
        let rest = trim_start(self.rest);
        let rest = rest.strip_prefix(b",").map(trim_start).unwrap_or(rest);
        if rest.is_empty() {
            self.rest = rest;
            return None;
        }
        let Some(eq) = rest.iter().position(|&b| b == b'=') else {
            self.rest = &[];
            return Some(Err(malformed));
        };
        let name = trim_end(&rest[..eq]);
        let after = trim_start(&rest[eq + 1..]);
        let Some(body) = after.strip_prefix(b"\"") else {
            self.rest = &[];
            return Some(Err(malformed));
        };
        let close = closing_quote(body, 0);
        let Some(close) = close else {
            self.rest = &[];
            return Some(Err(malformed));
        };
        if name.is_empty() {
            self.rest = &[];
            return Some(Err(malformed));
        }
        self.rest = &body[close + 1..];
        let next = trim_start(self.rest);
        if !(next.is_empty() || next.starts_with(b",")) {
            self.rest = &[];
            return Some(Err(malformed));
        }
        Some(Ok((name, &body[..close])))
    }
}

/// Finds one label's (escaped) value in a label block.
pub(crate) fn label<'a>(
    block: &'a [u8],
    line: usize,
    wanted: &str,
) -> Result<Option<&'a [u8]>, ParseError> {
    for pair in Labels::new(block, line) {
        let (name, value) = pair?;
        if name == wanted.as_bytes() {
            return Ok(Some(value));
        }
    }
    Ok(None)
}

/// Decodes an escaped label value (`\\`, `\"`, `\n`) into text.
pub(crate) fn unescape(raw: &[u8], line: usize) -> Result<String, ParseError> {
    let text =
        std::str::from_utf8(raw).map_err(|source| ParseError::InvalidUtf8 { line, source })?;
    if !text.contains('\\') {
        return Ok(text.to_owned());
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

fn trim_start(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(s.len());
    &s[start..]
}

fn trim_end(s: &[u8]) -> &[u8] {
    let end = s
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(0, |i| i + 1);
    &s[..end]
}
