//! YAML that kubectl, Helm and Argo CD read with the types it was written with.
//!
//! serde_yaml writes YAML 1.2, where `on`, `no`, `y`, `1_000` or `0b1` are plain strings and
//! need no quotes. The tools a rendered manifest is handed to read YAML 1.1 (Go's `yaml.v2`,
//! behind `sigs.k8s.io/yaml`), where the same words are booleans and numbers: a label value `on`
//! reached the API server as `true` and the object was refused (`cannot unmarshal bool into
//! Go struct field ... of type string`), and a key `no` became `false`. Strings that YAML 1.1
//! would read as something else are therefore written single-quoted.

use serde_yaml::{Mapping, Value};

/// `value` as a YAML document whose strings every YAML 1.1 reader reads as strings.
pub fn to_string<T: serde::Serialize>(value: &T) -> Result<String, serde_yaml::Error> {
    let mut tree = serde_yaml::to_value(value)?;
    // A token that cannot occur in the document: a plain scalar serde_yaml writes as it is.
    let plain = serde_yaml::to_string(&tree)?;
    let mut prefix = String::from("infergatequotedstring");
    while plain.contains(&prefix) {
        prefix.push('x');
    }
    let mut quoted = Vec::new();
    mark(&mut tree, &prefix, &mut quoted);
    let mut out = serde_yaml::to_string(&tree)?;
    for (i, s) in quoted.iter().enumerate() {
        out = out.replace(
            &placeholder(&prefix, i),
            &format!("'{}'", s.replace('\'', "''")),
        );
    }
    Ok(out)
}

/// Replaces every string (key or value) YAML 1.1 would not read as a string by a placeholder,
/// keeping the order of mappings; `quoted[i]` is the string of placeholder `i`.
fn mark(v: &mut Value, prefix: &str, quoted: &mut Vec<String>) {
    match v {
        Value::String(s) => swap(s, prefix, quoted),
        Value::Sequence(items) => items.iter_mut().for_each(|i| mark(i, prefix, quoted)),
        Value::Mapping(map) => {
            let mut out = Mapping::with_capacity(map.len());
            for (mut k, mut item) in std::mem::take(map) {
                if let Value::String(s) = &mut k {
                    swap(s, prefix, quoted);
                }
                mark(&mut item, prefix, quoted);
                out.insert(k, item);
            }
            *map = out;
        }
        Value::Tagged(t) => mark(&mut t.value, prefix, quoted),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// `s` becomes the next placeholder if YAML 1.1 would not read it as a string.
fn swap(s: &mut String, prefix: &str, quoted: &mut Vec<String>) {
    if !yaml11_reads_as_string(s) {
        let token = placeholder(prefix, quoted.len());
        quoted.push(std::mem::replace(s, token));
    }
}

/// The placeholder `i`; a digit never follows another placeholder's number, so no placeholder
/// is a prefix of another.
fn placeholder(prefix: &str, i: usize) -> String {
    format!("{prefix}{i}q")
}

/// Whether a YAML 1.1 reader (Go's `yaml.v2`, PyYAML) reads the plain scalar `s` as a string:
/// not one of its booleans or nulls, the merge key `<<` or the value key `=`, and not an
/// integer, float, sexagesimal number or date.
fn yaml11_reads_as_string(s: &str) -> bool {
    const WORDS: &[&str] = &[
        "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false",
        "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF", "~", "null", "Null", "NULL",
        ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF", ".nan",
        ".NaN", ".NAN", "=", "<<",
    ];
    if s.is_empty() || WORDS.contains(&s) {
        return false;
    }
    let digits = s.replace('_', "");
    let unsigned = digits.strip_prefix(['-', '+']).unwrap_or(&digits);
    let all = |t: &str, f: fn(char) -> bool| !t.is_empty() && t.chars().all(f);
    let int = all(unsigned, |c| c.is_ascii_digit())
        || ["0x", "0X"].iter().any(|p| {
            unsigned
                .strip_prefix(p)
                .is_some_and(|t| all(t, |c| c.is_ascii_hexdigit()))
        })
        || ["0o", "0b"].iter().any(|p| {
            unsigned
                .strip_prefix(p)
                .is_some_and(|t| all(t, |c| c.is_ascii_digit()))
        });
    !(int || is_float(unsigned) || is_sexagesimal(unsigned) || is_date(s))
}

/// `(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`, yaml.v2's float, without its sign.
fn is_float(s: &str) -> bool {
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let digits = |t: &str| !t.is_empty() && t.chars().all(|c| c.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", frac)) => digits(frac),
        Some((int, frac)) => digits(int) && frac.chars().all(|c| c.is_ascii_digit()),
        None => digits(mantissa),
    };
    mantissa_ok && exponent.is_none_or(|e| digits(e.strip_prefix(['-', '+']).unwrap_or(e)))
}

/// YAML 1.1's base-60 numbers, e.g. `1:20` or `190:20:30.15`, without the sign.
fn is_sexagesimal(s: &str) -> bool {
    let whole = s.split_once('.').map_or(s, |(w, _)| w);
    let mut parts = whole.split(':');
    let first = parts.next().unwrap_or_default();
    let rest: Vec<&str> = parts.collect();
    !rest.is_empty()
        && !first.is_empty()
        && first.chars().all(|c| c.is_ascii_digit())
        && rest
            .iter()
            .all(|p| (1..=2).contains(&p.len()) && p.chars().all(|c| c.is_ascii_digit()))
}

/// A YAML 1.1 timestamp starts with a date, `YYYY-M-D`.
fn is_date(s: &str) -> bool {
    let mut parts = s.splitn(3, '-');
    let (Some(y), Some(m), Some(d)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let day: String = d.chars().take_while(char::is_ascii_digit).collect();
    y.len() == 4
        && y.chars().all(|c| c.is_ascii_digit())
        && (1..=2).contains(&m.len())
        && m.chars().all(|c| c.is_ascii_digit())
        && (1..=2).contains(&day.len())
}
