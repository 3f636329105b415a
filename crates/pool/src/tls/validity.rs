//! The validity period of an X.509 certificate (RFC 5280, §4.1.2.5), read from its DER: enough
//! of the structure to reach `tbsCertificate.validity`, nothing else. The certificate is the
//! operator's own file, already accepted as PEM; a shape this reader does not expect gives
//! `None`, never a panic (every truncation of a real certificate is tested).

/// DER tags this reader looks at.
const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const VERSION: u8 = 0xA0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// A certificate's validity period, in Unix seconds (UTC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    /// `notBefore`: the certificate is not valid before this.
    pub not_before: i64,
    /// `notAfter`: the certificate is not valid after this.
    pub not_after: i64,
}

/// How a moment stands outside a certificate's validity ([`Validity::outside`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outside {
    /// Past its `notAfter`, by this many seconds.
    Expired {
        /// Seconds since `notAfter`.
        seconds_ago: i64,
    },
    /// Before its `notBefore`, by this many seconds.
    NotYetValid {
        /// Seconds until `notBefore`.
        in_seconds: i64,
    },
}

impl Validity {
    /// Where `now` (Unix seconds) falls outside the validity; `None` inside it.
    pub fn outside(&self, now: i64) -> Option<Outside> {
        if now > self.not_after {
            Some(Outside::Expired {
                seconds_ago: now - self.not_after,
            })
        } else if now < self.not_before {
            Some(Outside::NotYetValid {
                in_seconds: self.not_before - now,
            })
        } else {
            None
        }
    }

    /// The validity of the DER-encoded certificate `der`; `None` when it does not have a
    /// certificate's shape.
    pub fn of(der: &[u8]) -> Option<Validity> {
        let (tag, certificate, _) = tlv(der)?;
        if tag != SEQUENCE {
            return None;
        }
        let (tag, tbs, _) = tlv(certificate)?;
        if tag != SEQUENCE {
            return None;
        }
        // [0] version (absent in a v1 certificate), serialNumber, signature, issuer, validity.
        let (mut tag, _, mut rest) = tlv(tbs)?;
        if tag == VERSION {
            (tag, _, rest) = tlv(rest)?;
        }
        if tag != INTEGER {
            return None;
        }
        for _ in 0..2 {
            let (tag, _, after) = tlv(rest)?;
            if tag != SEQUENCE {
                return None;
            }
            rest = after;
        }
        let (tag, validity, _) = tlv(rest)?;
        if tag != SEQUENCE {
            return None;
        }
        let (tag, before, rest) = tlv(validity)?;
        let not_before = time(tag, before)?;
        let (tag, after, _) = tlv(rest)?;
        let not_after = time(tag, after)?;
        Some(Validity {
            not_before,
            not_after,
        })
    }
}

/// Now, in Unix seconds (0 on a clock set before 1970): what a [`Validity`] is compared with.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// One DER element at the start of `buf`: its tag, its content and what follows it.
fn tlv(buf: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = buf.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        // Long form: the next 1 to 4 bytes hold the length (a certificate is far smaller).
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, after) = rest.split_at(n);
        rest = after;
        bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b))
    };
    if rest.len() < len {
        return None;
    }
    let (content, rest) = rest.split_at(len);
    Some((tag, content, rest))
}

/// A `Time`: UTCTime `YYMMDDHHMMSSZ` (years 1950–2049) or GeneralizedTime `YYYYMMDDHHMMSSZ`, as
/// RFC 5280 requires them (UTC, seconds, no fractions), in Unix seconds.
fn time(tag: u8, text: &[u8]) -> Option<i64> {
    let (year, rest) = match tag {
        UTC_TIME if text.len() == 13 => {
            let yy = number(text.get(..2)?)?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, text.get(2..)?)
        }
        GENERALIZED_TIME if text.len() == 15 => (number(text.get(..4)?)?, text.get(4..)?),
        _ => return None,
    };
    if rest.get(10) != Some(&b'Z') {
        return None;
    }
    let field = |at: usize| number(rest.get(at..at + 2)?);
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Decimal digits as a number; `None` for anything else.
fn number(digits: &[u8]) -> Option<i64> {
    digits.iter().try_fold(0i64, |acc, c| {
        c.is_ascii_digit().then(|| acc * 10 + i64::from(c - b'0'))
    })
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    fn certificate(not_before: (i32, u8, u8), not_after: (i32, u8, u8)) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["example.test".to_owned()]).unwrap();
        params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn reads_both_time_forms() {
        // 2049 is written as UTCTime, 2050 on as GeneralizedTime (RFC 5280).
        let der = certificate((2024, 2, 29), (2049, 12, 31));
        assert_eq!(
            Validity::of(&der),
            Some(Validity {
                not_before: 1_709_164_800,
                not_after: 2_524_521_600,
            })
        );
        let der = certificate((1999, 12, 31), (2050, 1, 1));
        assert_eq!(
            Validity::of(&der),
            Some(Validity {
                not_before: 946_598_400,
                not_after: 2_524_608_000,
            })
        );
    }

    #[test]
    fn days_match_the_calendar() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(time(UTC_TIME, b"700101000000Z"), Some(0));
        assert_eq!(time(UTC_TIME, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(time(UTC_TIME, b"500101000000Z"), Some(-631_152_000));
        for bad in [
            &b"700101000000"[..],
            b"701301000000Z",
            b"700100000000Z",
            b"7001010000a0Z",
            b"700101240000Z",
            b"700101000000+",
        ] {
            assert_eq!(
                time(UTC_TIME, bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(time(GENERALIZED_TIME, b"700101000000Z"), None);
        assert_eq!(time(INTEGER, b"700101000000Z"), None);
    }

    #[test]
    fn any_truncation_or_garbage_is_none_not_a_panic() {
        let der = certificate((2024, 1, 1), (2030, 1, 1));
        for n in 0..der.len() {
            assert_eq!(Validity::of(&der[..n]), None, "truncated at {n}");
        }
        let mut flipped = der.clone();
        for i in 0..flipped.len().min(64) {
            flipped[i] ^= 0xff;
            let _ = Validity::of(&flipped);
            flipped[i] ^= 0xff;
        }
        assert_eq!(Validity::of(b"not a certificate"), None);
        assert_eq!(Validity::of(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }
}
