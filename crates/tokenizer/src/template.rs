//! The chat template, rendered as transformers renders it (`transformers/utils/
//! chat_template_utils.py`, `_compile_jinja_template` and `render_jinja_template`): Jinja with
//! `trim_blocks` and `lstrip_blocks`, loop controls, Python's string and dict methods, a `tojson`
//! filter that writes what Python's `json.dumps` writes (no HTML escaping, `", "` and `": "`
//! separators), and the globals `raise_exception` and `strftime_now`.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, ErrorKind, Value};

use crate::Error;

/// The name the template is stored under in its environment.
const NAME: &str = "chat";
/// Prefix of the message `raise_exception` puts in its error, to tell a template's refusal from
/// an engine error.
const REFUSAL: &str = "raise_exception: ";

/// A compiled chat template with the special-token variables it is rendered with.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    /// The template's source (for content-format and developer-role detection).
    pub(crate) source: String,
    /// `bos_token`, `eos_token`, ... (transformers passes `special_tokens_map`).
    specials: Vec<(&'static str, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_bytes", &self.source.len())
            .field("specials", &self.specials)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source` (from `origin`, named in errors).
    pub(crate) fn new(
        source: String,
        origin: &str,
        specials: Vec<(&'static str, String)>,
    ) -> Result<Self, Error> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|source| Error::TemplateSyntax {
                origin: origin.to_owned(),
                source,
            })?;
        env.set_syntax(syntax);
        // Jinja's default `Undefined`: prints as empty, iterates as empty, is falsy.
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Lenient);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, without_generation_tags(&source))
            .map_err(|source| Error::TemplateSyntax {
                origin: origin.to_owned(),
                source,
            })?;
        Ok(Self {
            env,
            source,
            specials,
        })
    }

    /// Renders `messages` (already converted as vLLM converts them).
    pub(crate) fn render(
        &self,
        messages: Vec<Value>,
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|source| Error::Render { source })?;
        let mut ctx: Vec<(&str, Value)> = Vec::with_capacity(self.specials.len() + 4);
        for (k, v) in &self.specials {
            ctx.push((k, Value::from(v.as_str())));
        }
        ctx.push(("messages", Value::from(messages)));
        // transformers passes both, as None, when the request has neither.
        ctx.push(("tools", Value::from(())));
        ctx.push(("documents", Value::from(())));
        ctx.push(("add_generation_prompt", Value::from(add_generation_prompt)));
        template
            .render(crate::chat::map(ctx))
            .map_err(|source| match refusal(&source) {
                Some(message) => Error::TemplateRefused { message },
                None => Error::Render { source },
            })
    }
}

/// transformers' `{% generation %}` ... `{% endgeneration %}` marks the assistant's tokens for
/// training masks and renders its body unchanged; here it becomes `{% if true %}` ... `{% endif %}`,
/// whitespace-control marks kept.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start + 2]);
        rest = &rest[start + 2..];
        let mark = rest
            .chars()
            .next()
            .filter(|c| *c == '-' || *c == '+')
            .map_or(0, char::len_utf8);
        out.push_str(&rest[..mark]);
        rest = &rest[mark..];
        let body = rest.trim_start();
        let spaces = &rest[..rest.len() - body.len()];
        for (tag, with) in [("endgeneration", "endif"), ("generation", "if true")] {
            if let Some(after) = body.strip_prefix(tag)
                && after
                    .trim_start()
                    .trim_start_matches(['-', '+'])
                    .starts_with("%}")
            {
                out.push_str(spaces);
                out.push_str(with);
                rest = after;
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The message of a `raise_exception` call, if that is what failed.
fn refusal(err: &minijinja::Error) -> Option<String> {
    let mut e: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(cur) = e {
        if let Some(mj) = cur.downcast_ref::<minijinja::Error>()
            && let Some(detail) = mj.detail()
            && let Some(msg) = detail.strip_prefix(REFUSAL)
        {
            return Some(msg.to_owned());
        }
        e = cur.source();
    }
    None
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{REFUSAL}{message}"),
    ))
}

/// Python's `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// with the keyword arguments transformers' filter accepts.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            (None, Some(s)) => Some(s.to_owned()),
            _ => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ));
            }
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let a = v.get_item_by_index(0)?;
            let b = v.get_item_by_index(1)?;
            match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => (a.to_owned(), b.to_owned()),
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ));
                }
            }
        }
        // Python's defaults: ", " without indent, "," with it.
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let opts = JsonOpts {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    dump(&value, &opts, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct JsonOpts {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn dump(v: &Value, o: &JsonOpts, depth: usize, out: &mut String) -> Result<(), minijinja::Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(i) = v.as_i64() {
                let _ = write!(out, "{i}");
            } else if let Ok(f) = f64::try_from(v.clone()) {
                out.push_str(&py_float(f));
            } else {
                let _ = write!(out, "{v}");
            }
        }
        ValueKind::String => string(v.as_str().unwrap_or_default(), o.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            container(out, o, depth, '[', ']', &items, |item, out| {
                dump(item, o, depth + 1, out)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if o.sort_keys {
                keys.sort_by_cached_key(|k| k.to_string());
            }
            container(out, o, depth, '{', '}', &keys, |k, out| {
                match k.as_str() {
                    Some(s) => string(s, o.ensure_ascii, out),
                    None => string(&k.to_string(), o.ensure_ascii, out),
                }
                out.push_str(&o.key_sep);
                dump(&v.get_item(k)?, o, depth + 1, out)
            })?;
        }
        _ => string(&v.to_string(), o.ensure_ascii, out),
    }
    Ok(())
}

fn container<T>(
    out: &mut String,
    o: &JsonOpts,
    depth: usize,
    open: char,
    close: char,
    items: &[T],
    mut each: impl FnMut(&T, &mut String) -> Result<(), minijinja::Error>,
) -> Result<(), minijinja::Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&o.item_sep);
        }
        if let Some(ind) = &o.indent {
            out.push('\n');
            for _ in 0..=depth {
                out.push_str(ind);
            }
        }
        each(item, out)?;
    }
    if let Some(ind) = &o.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
    out.push(close);
    Ok(())
}

/// A JSON string as Python's json module writes it.
fn string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)` for the common cases (`1.0`, `0.5`, `1e+20`, `NaN`, `Infinity`).
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    let s = format!("{f:?}");
    if let Some((mant, exp)) = s.split_once('e') {
        let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
        return format!("{mant}e{sign}{digits:0>2}");
    }
    s
}

const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// transformers' `strftime_now(format)`: the current time, formatted. Times are UTC (what an
/// engine's container runs in); the directives templates use are supported and any other one
/// is an error rather than a guess.
fn strftime_now(format: String) -> Result<Value, minijinja::Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs).map(Value::from)
}

fn strftime(format: &str, unix_secs: u64) -> Result<String, minijinja::Error> {
    let days = i64::try_from(unix_secs / 86_400).unwrap_or(0);
    let secs = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = usize::try_from((days + 3).rem_euclid(7)).unwrap_or(0);
    let month = usize::try_from(m - 1).unwrap_or(0);
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => write!(out, "{y}"),
            Some('y') => write!(out, "{:02}", y.rem_euclid(100)),
            Some('m') => write!(out, "{m:02}"),
            Some('d') => write!(out, "{d:02}"),
            Some('e') => write!(out, "{d:>2}"),
            Some('j') => write!(out, "{yday:03}"),
            Some('H') => write!(out, "{hh:02}"),
            Some('I') => write!(out, "{:02}", (hh + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if hh < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{mm:02}"),
            Some('S') => write!(out, "{ss:02}"),
            Some('B') => write!(out, "{}", MONTHS[month]),
            Some('b') => write!(out, "{}", &MONTHS[month][..3]),
            Some('A') => write!(out, "{}", DAYS[weekday]),
            Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
            Some('%') => write!(out, "%"),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: directive %{} is not supported",
                        other.map_or(String::new(), String::from)
                    ),
                ));
            }
        }
        .map_err(|_| minijinja::Error::new(ErrorKind::InvalidOperation, "strftime_now"))?;
    }
    Ok(out)
}

/// Howard Hinnant's days-to-civil (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, messages: Vec<Value>) -> Result<String, Error> {
        ChatTemplate::new(src.to_owned(), "test", vec![("bos_token", "<s>".into())])?
            .render(messages, true)
    }

    #[test]
    fn tojson_writes_what_python_writes() {
        let msg = crate::chat::map([
            ("role", Value::from("user")),
            ("content", Value::from("<b>é\"\n")),
        ]);
        let out = render("{{ messages[0] | tojson }}", vec![msg.clone()]).unwrap();
        // Keys in insertion order, as Python's dicts keep them.
        assert_eq!(out, r#"{"role": "user", "content": "<b>é\"\n"}"#);
        let out = render(
            "{{ messages[0] | tojson(indent=2, ensure_ascii=true) }}",
            vec![msg],
        )
        .unwrap();
        assert_eq!(
            out,
            "{\n  \"role\": \"user\",\n  \"content\": \"<b>\\u00e9\\\"\\n\"\n}"
        );
        assert_eq!(
            render("{{ [1, 2.5, none, true, 1e20] | tojson }}", vec![]).unwrap(),
            "[1, 2.5, null, true, 1e+20]"
        );
    }

    #[test]
    fn raise_exception_is_a_refusal_with_its_message() {
        let err = render("{{ raise_exception('no system role') }}", vec![]).unwrap_err();
        assert!(
            matches!(&err, Error::TemplateRefused { message } if message == "no system role"),
            "{err:?}"
        );
    }

    #[test]
    fn python_methods_blocks_and_specials() {
        let out = render(
            "{{ bos_token }}\n{% if tools is none and documents is none %}\n  {{ ' x '.strip() }}\n{% endif %}\n{{ add_generation_prompt }}",
            vec![],
        )
        .unwrap();
        // What Python's Jinja renders (checked with jinja2 3.1): blocks trimmed, a variable tag's
        // indentation and newline kept, booleans as Python prints them.
        assert_eq!(out, "<s>\n  x\nTrue");
    }

    #[test]
    fn generation_tags_render_their_body() {
        assert_eq!(
            without_generation_tags(
                "a{%- generation -%} b {% endgeneration %}{% if x %}{% endif %}"
            ),
            "a{%- if true -%} b {% endif %}{% if x %}{% endif %}"
        );
        // A variable or block merely named like the tag is left alone.
        assert_eq!(
            without_generation_tags("{% set generation_x = 1 %}{{ generation }}"),
            "{% set generation_x = 1 %}{{ generation }}"
        );
    }

    #[test]
    fn strftime_formats_utc() {
        // 2024-07-26T13:05:09Z, a Friday, day 208.
        let t = 1_721_999_109;
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %A %j %y %B %I%p %%", t).unwrap(),
            "26 Jul 2024 13:05:09 Friday 208 24 July 01PM %"
        );
        assert!(strftime("%Z", t).is_err());
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }
}
