//! A bounded MessagePack reader: just what the KV-event payloads need, never trusting a length.
//!
//! The reader walks a borrowed buffer; every length is checked against the bytes that remain
//! before anything is read or allocated, and nesting is limited, so a hostile payload costs at
//! most one pass over its own bytes.

use crate::error::DecodeError;

/// Deepest nesting [`Reader::skip`] follows (vLLM's payloads nest four levels).
pub const MAX_DEPTH: u32 = 32;

/// A value's kind, as its leading byte says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `nil`.
    Nil,
    /// `true` / `false`.
    Bool,
    /// Any integer.
    Int,
    /// `float 32` / `float 64`.
    Float,
    /// A UTF-8 string.
    Str,
    /// Raw bytes.
    Bin,
    /// An array.
    Array,
    /// A map.
    Map,
    /// An extension type.
    Ext,
}

/// An integer or a byte string: how vLLM encodes a block hash (`int | bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntOrBytes<'a> {
    /// An integer (its two's-complement low 64 bits).
    Int(u64),
    /// Raw bytes.
    Bytes(&'a [u8]),
}

/// A cursor over one MessagePack buffer.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = *self.buf.get(self.pos).ok_or(DecodeError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for b in self.take(n)? {
            v = (v << 8) | u64::from(*b);
        }
        Ok(v)
    }

    /// The next value's kind, without consuming it.
    pub fn peek(&self) -> Result<Kind, DecodeError> {
        let b = *self.buf.get(self.pos).ok_or(DecodeError::Truncated)?;
        Ok(match b {
            0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => Kind::Int,
            0x80..=0x8f | 0xde | 0xdf => Kind::Map,
            0x90..=0x9f | 0xdc | 0xdd => Kind::Array,
            0xa0..=0xbf | 0xd9..=0xdb => Kind::Str,
            0xc0 => Kind::Nil,
            0xc2 | 0xc3 => Kind::Bool,
            0xc4..=0xc6 => Kind::Bin,
            0xca | 0xcb => Kind::Float,
            0xc7..=0xc9 | 0xd4..=0xd8 => Kind::Ext,
            0xc1 => return Err(DecodeError::Malformed("reserved byte 0xc1")),
        })
    }

    /// Consumes a `nil` if one is next; true when it did.
    pub fn nil(&mut self) -> Result<bool, DecodeError> {
        if self.peek()? == Kind::Nil {
            self.pos += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// An array header: its element count (each element at least one byte, so the count is
    /// checked against what remains).
    pub fn array(&mut self) -> Result<usize, DecodeError> {
        let b = self.byte()?;
        let n = match b {
            0x90..=0x9f => usize::from(b & 0x0f),
            0xdc => self.be(2)? as usize,
            0xdd => self.be(4)? as usize,
            _ => return Err(DecodeError::Unexpected("an array")),
        };
        self.fits(n)
    }

    /// A map header: its entry count (checked against what remains, two bytes an entry).
    pub fn map(&mut self) -> Result<usize, DecodeError> {
        let b = self.byte()?;
        let n = match b {
            0x80..=0x8f => usize::from(b & 0x0f),
            0xde => self.be(2)? as usize,
            0xdf => self.be(4)? as usize,
            _ => return Err(DecodeError::Unexpected("a map")),
        };
        self.fits(n.saturating_mul(2)).map(|_| n)
    }

    fn fits(&self, items: usize) -> Result<usize, DecodeError> {
        if items > self.remaining() {
            return Err(DecodeError::Truncated);
        }
        Ok(items)
    }

    /// A string (UTF-8 checked).
    pub fn str(&mut self) -> Result<&'a str, DecodeError> {
        let b = self.byte()?;
        let n = match b {
            0xa0..=0xbf => usize::from(b & 0x1f),
            0xd9 => self.be(1)? as usize,
            0xda => self.be(2)? as usize,
            0xdb => self.be(4)? as usize,
            _ => return Err(DecodeError::Unexpected("a string")),
        };
        std::str::from_utf8(self.take(n)?).map_err(|_| DecodeError::Malformed("string not UTF-8"))
    }

    /// Raw bytes.
    pub fn bin(&mut self) -> Result<&'a [u8], DecodeError> {
        let b = self.byte()?;
        let n = match b {
            0xc4 => self.be(1)? as usize,
            0xc5 => self.be(2)? as usize,
            0xc6 => self.be(4)? as usize,
            _ => return Err(DecodeError::Unexpected("bytes")),
        };
        self.take(n)
    }

    /// An integer, as its two's-complement low 64 bits (so a negative `int64` hash keeps its
    /// bits).
    pub fn int(&mut self) -> Result<u64, DecodeError> {
        let b = self.byte()?;
        Ok(match b {
            0x00..=0x7f => u64::from(b),
            0xe0..=0xff => i64::from(b as i8) as u64,
            0xcc => self.be(1)?,
            0xcd => self.be(2)?,
            0xce => self.be(4)?,
            0xcf => self.be(8)?,
            0xd0 => i64::from(self.be(1)? as u8 as i8) as u64,
            0xd1 => i64::from(self.be(2)? as u16 as i16) as u64,
            0xd2 => i64::from(self.be(4)? as u32 as i32) as u64,
            0xd3 => self.be(8)?,
            _ => return Err(DecodeError::Unexpected("an integer")),
        })
    }

    /// An unsigned integer that must fit `u32` (token ids, sizes).
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        let neg = matches!(self.peek_byte(), Some(0xe0..=0xff | 0xd0..=0xd3));
        let v = self.int()?;
        if neg && (v as i64) < 0 {
            return Err(DecodeError::Malformed(
                "negative where a count was expected",
            ));
        }
        u32::try_from(v).map_err(|_| DecodeError::Malformed("integer above u32"))
    }

    fn peek_byte(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    /// A float (or an integer, read as one).
    pub fn float(&mut self) -> Result<f64, DecodeError> {
        match self.peek_byte() {
            Some(0xca) => {
                self.pos += 1;
                Ok(f64::from(f32::from_bits(self.be(4)? as u32)))
            }
            Some(0xcb) => {
                self.pos += 1;
                Ok(f64::from_bits(self.be(8)?))
            }
            _ if self.peek()? == Kind::Int => Ok(self.int()? as i64 as f64),
            _ => Err(DecodeError::Unexpected("a number")),
        }
    }

    /// An integer or bytes (a block hash).
    pub fn int_or_bytes(&mut self) -> Result<IntOrBytes<'a>, DecodeError> {
        match self.peek()? {
            Kind::Int => Ok(IntOrBytes::Int(self.int()?)),
            Kind::Bin => Ok(IntOrBytes::Bytes(self.bin()?)),
            Kind::Str => Ok(IntOrBytes::Bytes(self.str()?.as_bytes())),
            _ => Err(DecodeError::Unexpected("a block hash (int or bytes)")),
        }
    }

    /// Skips one value of any kind, nested ones included.
    pub fn skip(&mut self) -> Result<(), DecodeError> {
        self.skip_depth(0)
    }

    fn skip_depth(&mut self, depth: u32) -> Result<(), DecodeError> {
        if depth > MAX_DEPTH {
            return Err(DecodeError::Malformed("nested too deeply"));
        }
        match self.peek()? {
            Kind::Nil | Kind::Bool => {
                self.pos += 1;
            }
            Kind::Int => {
                self.int()?;
            }
            Kind::Float => {
                self.float()?;
            }
            Kind::Str => {
                let b = self.byte()?;
                let n = match b {
                    0xa0..=0xbf => usize::from(b & 0x1f),
                    0xd9 => self.be(1)? as usize,
                    0xda => self.be(2)? as usize,
                    _ => self.be(4)? as usize,
                };
                self.take(n)?;
            }
            Kind::Bin => {
                self.bin()?;
            }
            Kind::Array => {
                for _ in 0..self.array()? {
                    self.skip_depth(depth + 1)?;
                }
            }
            Kind::Map => {
                for _ in 0..self.map()? {
                    self.skip_depth(depth + 1)?;
                    self.skip_depth(depth + 1)?;
                }
            }
            Kind::Ext => {
                let b = self.byte()?;
                let n = match b {
                    0xd4 => 1,
                    0xd5 => 2,
                    0xd6 => 4,
                    0xd7 => 8,
                    0xd8 => 16,
                    0xc7 => self.be(1)? as usize,
                    0xc8 => self.be(2)? as usize,
                    _ => self.be(4)? as usize,
                };
                self.take(n.saturating_add(1))?;
            }
        }
        Ok(())
    }

    /// The raw bytes of the next value (skipped), for hashing values the index does not read.
    pub fn raw(&mut self) -> Result<&'a [u8], DecodeError> {
        let start = self.pos;
        self.skip()?;
        Ok(&self.buf[start..self.pos])
    }
}

/// A MessagePack writer: what the emulator and the tests publish.
#[derive(Debug, Default)]
pub struct Writer {
    /// The bytes written.
    pub buf: Vec<u8>,
}

impl Writer {
    /// Writes an array header.
    pub fn array(&mut self, n: usize) -> &mut Self {
        if n < 16 {
            self.buf.push(0x90 | n as u8);
        } else if n <= usize::from(u16::MAX) {
            self.buf.push(0xdc);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.buf.push(0xdd);
            self.buf.extend_from_slice(&(n as u32).to_be_bytes());
        }
        self
    }

    /// Writes a map header.
    pub fn map(&mut self, n: usize) -> &mut Self {
        if n < 16 {
            self.buf.push(0x80 | n as u8);
        } else if n <= usize::from(u16::MAX) {
            self.buf.push(0xde);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.buf.push(0xdf);
            self.buf.extend_from_slice(&(n as u32).to_be_bytes());
        }
        self
    }

    /// Writes a string.
    pub fn str(&mut self, s: &str) -> &mut Self {
        let n = s.len();
        if n < 32 {
            self.buf.push(0xa0 | n as u8);
        } else if n < 256 {
            self.buf.extend_from_slice(&[0xd9, n as u8]);
        } else if n <= usize::from(u16::MAX) {
            self.buf.push(0xda);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.buf.push(0xdb);
            self.buf.extend_from_slice(&(n as u32).to_be_bytes());
        }
        self.buf.extend_from_slice(s.as_bytes());
        self
    }

    /// Writes bytes.
    pub fn bin(&mut self, b: &[u8]) -> &mut Self {
        let n = b.len();
        if n < 256 {
            self.buf.extend_from_slice(&[0xc4, n as u8]);
        } else if n <= usize::from(u16::MAX) {
            self.buf.push(0xc5);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.buf.push(0xc6);
            self.buf.extend_from_slice(&(n as u32).to_be_bytes());
        }
        self.buf.extend_from_slice(b);
        self
    }

    /// Writes an unsigned integer in its shortest form.
    pub fn uint(&mut self, v: u64) -> &mut Self {
        if v < 128 {
            self.buf.push(v as u8);
        } else if v <= u64::from(u8::MAX) {
            self.buf.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= u64::from(u16::MAX) {
            self.buf.push(0xcd);
            self.buf.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= u64::from(u32::MAX) {
            self.buf.push(0xce);
            self.buf.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            self.buf.push(0xcf);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
        self
    }

    /// Writes a signed 64-bit integer (as Python's msgspec writes a negative int).
    pub fn int(&mut self, v: i64) -> &mut Self {
        if v >= 0 {
            return self.uint(v as u64);
        }
        if v >= -32 {
            self.buf.push(v as i8 as u8);
        } else {
            self.buf.push(0xd3);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
        self
    }

    /// Writes a float 64.
    pub fn float(&mut self, v: f64) -> &mut Self {
        self.buf.push(0xcb);
        self.buf.extend_from_slice(&v.to_bits().to_be_bytes());
        self
    }

    /// Writes `nil`.
    pub fn nil(&mut self) -> &mut Self {
        self.buf.push(0xc0);
        self
    }

    /// Writes one value already encoded (as [`Reader::raw`] returned it).
    pub fn raw(&mut self, value: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(value);
        self
    }
}
