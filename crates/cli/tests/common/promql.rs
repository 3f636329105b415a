//! Reading PromQL for the checks that hold the chart's dashboard and alerting rules to what the
//! binaries export: the metric names an expression selects, and the label names (and values)
//! its selectors match on.
#![allow(
    dead_code,
    reason = "each test binary uses a different part of the helpers"
)]

use std::collections::BTreeSet;

/// Identifiers of PromQL (and Grafana's templating functions) that are not metric names. A name
/// directly followed by `(` is a function and skipped anyway; this list covers the keywords and
/// aggregations that are followed by something else (`sum by (le) (...)`, `a or b`).
pub const NOT_METRICS: &[&str] = &[
    "abs",
    "absent",
    "and",
    "atan2",
    "avg",
    "avg_over_time",
    "bool",
    "bottomk",
    "by",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "count",
    "count_values",
    "delta",
    "deriv",
    "floor",
    "group",
    "group_left",
    "group_right",
    "histogram_quantile",
    "idelta",
    "ignoring",
    "increase",
    "inf",
    "irate",
    "label_join",
    "label_replace",
    "label_values",
    "le",
    "max",
    "max_over_time",
    "min",
    "min_over_time",
    "nan",
    "offset",
    "on",
    "or",
    "quantile",
    "quantile_over_time",
    "query_result",
    "rate",
    "resets",
    "round",
    "scalar",
    "sort",
    "sort_desc",
    "stddev",
    "stdvar",
    "sum",
    "sum_over_time",
    "time",
    "timestamp",
    "topk",
    "unless",
    "vector",
    "without",
];

/// Keywords followed by a parenthesised list of label names.
pub const LABEL_LIST_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// One series selector of an expression: the metric name and the label names its matchers
/// test (`a{b="x", c=~"y"}` is `a` with `b`, `c`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Selector {
    /// The metric name.
    pub name: String,
    /// The label names of its matchers.
    pub labels: BTreeSet<String>,
    /// Its matchers, in order.
    pub matchers: Vec<Matcher>,
}

/// One label matcher of a selector: `b=~"x|y"` is `b`, `=~`, `x|y`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Matcher {
    /// The label name.
    pub label: String,
    /// `=`, `!=`, `=~` or `!~`.
    pub op: String,
    /// The value as written between the quotes, escapes resolved.
    pub value: String,
}

impl Matcher {
    /// The label values this matcher accepts, when it says them one by one: the value of an
    /// `=`, the alternatives of an `=~` made of names only (`a|b_c`); `None` for a negative
    /// matcher or a regular expression with anything else in it.
    pub fn accepted_values(&self) -> Option<Vec<String>> {
        let plain = |v: &str| {
            !v.is_empty()
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        };
        match self.op.as_str() {
            "=" => Some(vec![self.value.clone()]),
            "=~" if self.value.split('|').all(plain) => {
                Some(self.value.split('|').map(str::to_owned).collect())
            }
            _ => None,
        }
    }
}

/// The metric names a PromQL expression references: identifiers outside label matchers, range
/// selectors, strings and label lists, that are neither keywords nor functions.
pub fn referenced(expr: &str) -> BTreeSet<String> {
    selectors(expr).into_iter().map(|s| s.name).collect()
}

/// The selectors of a PromQL expression, in order: each metric name (as [`referenced`] finds
/// them) with the label names of the matchers that follow it.
pub fn selectors(expr: &str) -> Vec<Selector> {
    let c: Vec<char> = expr.chars().collect();
    let ident = |ch: char| ch.is_ascii_alphanumeric() || ch == '_' || ch == ':';
    let skip_ws = |mut i: usize| {
        while i < c.len() && c[i].is_whitespace() {
            i += 1;
        }
        i
    };
    // Index just past the string quoted by `c[i]`.
    let skip_string = |mut i: usize| {
        let q = c[i];
        i += 1;
        while i < c.len() && c[i] != q {
            i += if c[i] == '\\' { 2 } else { 1 };
        }
        i + 1
    };
    // Index just past the `close` that ends the group opened at `i`, stepping over strings.
    let skip_group = |mut i: usize, close: char| {
        i += 1;
        while i < c.len() && c[i] != close {
            if matches!(c[i], '"' | '\'' | '`') {
                i = skip_string(i);
            } else {
                i += 1;
            }
        }
        i + 1
    };
    // The matchers in the group opened at `i` (`{a="x", b!~"y"}`).
    let matcher_list = |open: usize| {
        let end = skip_group(open, '}');
        let mut matchers = Vec::new();
        let mut i = open + 1;
        while i + 1 < end {
            if matches!(c[i], '"' | '\'' | '`') {
                i = skip_string(i);
            } else if ident(c[i]) {
                let start = i;
                while i < end && ident(c[i]) {
                    i += 1;
                }
                let label: String = c[start..i].iter().collect();
                let mut next = skip_ws(i);
                if !matches!(c.get(next), Some('=' | '!')) {
                    continue;
                }
                let op_start = next;
                while next < end && matches!(c[next], '=' | '!' | '~') {
                    next += 1;
                }
                let op: String = c[op_start..next].iter().collect();
                next = skip_ws(next);
                let mut value = String::new();
                if next < end && matches!(c[next], '"' | '\'' | '`') {
                    let q = c[next];
                    let mut j = next + 1;
                    while j < end && c[j] != q {
                        if c[j] == '\\' && q != '`' && j + 1 < end {
                            j += 1;
                        }
                        value.push(c[j]);
                        j += 1;
                    }
                    next = j + 1;
                }
                matchers.push(Matcher { label, op, value });
                i = next;
            } else {
                i += 1;
            }
        }
        (matchers, end)
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if matches!(ch, '"' | '\'' | '`') {
            i = skip_string(i);
        } else if ch == '{' {
            i = skip_group(i, '}');
        } else if ch == '[' {
            i = skip_group(i, ']');
        } else if ch == '$' {
            // A Grafana variable: `$__rate_interval`, `${datasource}`.
            i += 1;
            if i < c.len() && c[i] == '{' {
                i = skip_group(i, '}');
            }
            while i < c.len() && ident(c[i]) {
                i += 1;
            }
        } else if ch.is_ascii_digit()
            || (ch == '.' && c.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // A number or a duration (`0.95`, `1e-3`, `5m`).
            while i < c.len() && (ident(c[i]) || c[i] == '.') {
                i += 1;
            }
        } else if ch.is_ascii_alphabetic() || ch == '_' || ch == ':' {
            let start = i;
            while i < c.len() && ident(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let next = skip_ws(i);
            let lower = word.to_ascii_lowercase();
            if LABEL_LIST_KEYWORDS.contains(&lower.as_str()) {
                if c.get(next) == Some(&'(') {
                    i = skip_group(next, ')');
                }
            } else if NOT_METRICS.contains(&lower.as_str()) || c.get(next) == Some(&'(') {
                // A keyword or a function.
            } else if c.get(next) == Some(&'{') {
                let (matchers, end) = matcher_list(next);
                let labels = matchers.iter().map(|m| m.label.clone()).collect();
                out.push(Selector {
                    name: word,
                    labels,
                    matchers,
                });
                i = end;
            } else {
                out.push(Selector {
                    name: word,
                    labels: BTreeSet::new(),
                    matchers: Vec::new(),
                });
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The label names of an expression's `by (…)` and `without (…)` lists: what its aggregations
/// keep or drop (a misspelt one silently groups everything together).
pub fn grouping_labels(expr: &str) -> BTreeSet<String> {
    // The expression without its strings and matchers, where `by` may be written as data.
    let mut plain = String::new();
    let mut chars = expr.chars();
    while let Some(ch) = chars.next() {
        match ch {
            '"' | '\'' | '`' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if c == ch && !escaped {
                        break;
                    }
                    escaped = c == '\\' && !escaped;
                }
                plain.push(' ');
            }
            '{' => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                plain.push(' ');
            }
            c => plain.push(c),
        }
    }
    let mut out = BTreeSet::new();
    let mut rest = plain.as_str();
    while let Some(at) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        let len = rest[at..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len() - at);
        let word = &rest[at..at + len];
        rest = &rest[at + len..];
        if matches!(word, "by" | "without")
            && let Some(list) = rest.trim_start().strip_prefix('(')
        {
            let end = list.find(')').unwrap_or(list.len());
            out.extend(
                list[..end]
                    .split(',')
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned),
            );
        }
    }
    out
}
