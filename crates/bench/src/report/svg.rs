//! Plots as hand-written SVG: small, dependency-free, and they open in any browser.

use std::fmt::Write as _;

use super::{Report, RunResult, secs};

const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// Pods named in a load plot's legend.
const LEGEND_PODS: usize = 24;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Rough width in pixels of `s` at font-size 12 in a sans-serif face (about 7 px a character,
/// on the wide side), to size a legend so that no label is cut off.
fn text_width(s: &str) -> f64 {
    s.chars().count() as f64 * 7.0
}

/// The right margin that fits a legend of `labels` (a 38 px swatch, then the text).
fn legend_margin<'a>(labels: impl Iterator<Item = &'a str>) -> f64 {
    labels
        .map(|l| 38.0 + text_width(l) + 10.0)
        .fold(170.0, f64::max)
}

fn first_seed_runs(r: &Report) -> Vec<&RunResult> {
    let Some(seed) = r.scenario.seeds.first() else {
        return Vec::new();
    };
    r.runs.iter().filter(|x| x.seed == *seed).collect()
}

/// TTFT CDF per policy, log-scale time axis.
pub(super) fn ttft_cdf(r: &Report) -> String {
    // A run that completed nothing has no TTFT distribution to draw.
    let runs: Vec<&RunResult> = first_seed_runs(r)
        .into_iter()
        .filter(|x| x.completed > 0)
        .collect();
    let right = legend_margin(runs.iter().map(|x| x.policy.as_str()));
    let (left, top, bottom) = (70.0, 40.0, 50.0);
    let w = 590.0 + right;
    let h = (420.0f64).max(top + 10.0 + runs.len() as f64 * 18.0 + bottom);
    let values = runs.iter().flat_map(|x| x.ttft_cdf.iter().copied());
    let lo = values
        .clone()
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    // No run to draw (every one completed nothing): an empty plot on a 10 ms–100 ms axis, not
    // an infinite one whose decade marks would never end.
    let lo = if lo.is_finite() { lo.max(1e-4) } else { 1e-2 };
    let hi = values.fold(0.0f64, f64::max).max(lo * 10.0);
    let (l0, l1) = (lo.log10().floor(), hi.log10().ceil());
    let pw = w - left - right;
    let ph = h - top - bottom;
    let x = |v: f64| left + (v.max(lo).log10() - l0) / (l1 - l0) * pw;
    let y = |q: f64| top + (1.0 - q) * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="22" font-size="14">{} ({}): TTFT CDF per policy, seed {}</text>"#,
        esc(&r.scenario.name),
        r.mode,
        r.scenario.seeds.first().copied().unwrap_or(0)
    );
    let mut d = l0;
    while d <= l1 {
        let v = 10f64.powf(d);
        let xx = x(v);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{:.1}" stroke="#ddd"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            top + ph,
            top + ph + 16.0,
            secs(v)
        );
        d += 1.0;
    }
    // 0.99 sits a few pixels below 1: its line is dashed and labelled inside the plot, at the
    // right, under the line, so that no two labels overlap.
    for q in [0.0, 0.25, 0.5, 0.75, 0.95, 1.0] {
        let yy = y(q);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{q}</text>"##,
            left + pw,
            left - 6.0,
            yy + 4.0
        );
    }
    let y99 = y(0.99);
    let _ = writeln!(
        s,
        r##"<line x1="{left}" y1="{y99:.1}" x2="{:.1}" y2="{y99:.1}" stroke="#bbb" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#777" font-size="10">0.99</text>"##,
        left + pw,
        left + pw - 4.0,
        y99 + 12.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">time to first token (log scale)</text>"#,
        left + pw / 2.0,
        h - 10.0
    );
    for (i, run) in runs.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let n = run.ttft_cdf.len().max(1) as f64;
        let pts: Vec<String> = run
            .ttft_cdf
            .iter()
            .enumerate()
            .map(|(k, v)| format!("{:.1},{:.1}", x(*v), y((k + 1) as f64 / n)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = top + 10.0 + i as f64 * 18.0;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            left + pw + 12.0,
            left + pw + 32.0,
            left + pw + 38.0,
            ly + 4.0,
            esc(&run.policy)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Per-pod load (running + waiting) over time, one panel per policy, each on its own scale.
pub(super) fn load(r: &Report) -> String {
    let runs: Vec<&RunResult> = first_seed_runs(r)
        .into_iter()
        .filter(|x| x.load.is_some())
        .collect();
    // At most LEGEND_PODS pods are named; a last line counts the rest.
    let mut labels: Vec<String> = r
        .pods
        .iter()
        .take(LEGEND_PODS)
        .map(|p| format!("{} ({})", p.name, p.gpu))
        .collect();
    if r.pods.len() > LEGEND_PODS {
        labels.push(format!("… and {} more", r.pods.len() - LEGEND_PODS));
    }
    let right = legend_margin(labels.iter().map(String::as_str));
    let (panel_h, left, top) = (150.0, 60.0, 40.0);
    let w = 590.0 + right;
    let panels_h = top + runs.len() as f64 * (panel_h + 30.0) + 20.0;
    let legend_h = top + 30.0 + labels.len() as f64 * 16.0 + 10.0;
    let h = panels_h.max(legend_h);
    let pw = w - left - right;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="22" font-size="14">{} ({}): requests on each pod (running + waiting), seed {}</text>"#,
        esc(&r.scenario.name),
        r.mode,
        r.scenario.seeds.first().copied().unwrap_or(0)
    );
    for (pi, run) in runs.iter().enumerate() {
        let Some(load) = &run.load else { continue };
        // Each panel on its own scale (its peak is labelled): one overloaded policy would
        // otherwise flatten every other panel.
        let peak = load
            .pods
            .iter()
            .flatten()
            .copied()
            .max()
            .unwrap_or(1)
            .max(1);
        let y0 = top + pi as f64 * (panel_h + 30.0) + 20.0;
        let len = load.pods.iter().map(Vec::len).max().unwrap_or(1).max(2);
        let span = (len - 1) as f64 * load.every_s;
        let _ = writeln!(
            s,
            r##"<text x="{left}" y="{:.1}" font-weight="bold">{}</text><rect x="{left}" y="{y0:.1}" width="{pw}" height="{panel_h}" fill="none" stroke="#999"/><text x="{:.1}" y="{:.1}" text-anchor="end">{peak}</text><text x="{:.1}" y="{:.1}" text-anchor="end">0</text><text x="{:.1}" y="{:.1}" text-anchor="end">{:.0} s</text>"##,
            y0 - 4.0,
            esc(&run.policy),
            left - 6.0,
            y0 + 10.0,
            left - 6.0,
            y0 + panel_h,
            left + pw,
            y0 + panel_h + 14.0,
            span
        );
        for (k, series) in load.pods.iter().enumerate() {
            let color = COLORS[k % COLORS.len()];
            let pts: Vec<String> = series
                .iter()
                .enumerate()
                .map(|(t, v)| {
                    format!(
                        "{:.1},{:.1}",
                        left + t as f64 / (len - 1) as f64 * pw,
                        y0 + panel_h - f64::from(*v) / f64::from(peak) * panel_h
                    )
                })
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.2" points="{}"/>"#,
                pts.join(" ")
            );
        }
    }
    for (k, label) in labels.iter().enumerate() {
        let color = if k < LEGEND_PODS {
            COLORS[k % COLORS.len()]
        } else {
            "none"
        };
        let ly = top + 30.0 + k as f64 * 16.0;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            left + pw + 12.0,
            left + pw + 32.0,
            left + pw + 38.0,
            ly + 4.0,
            esc(label)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// One panel per `(title, unit, series)`, sharing the time axis (seconds): each series a named
/// polyline of `(t, value)` points. Used by the soak run for RSS, open fds and latency.
pub(super) fn time_series(title: &str, panels: &[super::Panel<'_>]) -> String {
    let (w, panel_h, left, right, top) = (760.0, 170.0, 70.0, 170.0, 40.0);
    let h = top + panels.len() as f64 * (panel_h + 40.0) + 20.0;
    let pw = w - left - right;
    let t_max = panels
        .iter()
        .flat_map(|p| p.series.iter().flat_map(|(_, pts)| pts.iter().map(|q| q.0)))
        .fold(1.0f64, f64::max);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="22" font-size="14">{}</text>"#,
        esc(title)
    );
    for (pi, panel) in panels.iter().enumerate() {
        let y0 = top + pi as f64 * (panel_h + 40.0) + 20.0;
        let v_max = panel
            .series
            .iter()
            .flat_map(|(_, pts)| pts.iter().map(|q| q.1))
            .fold(0.0f64, f64::max)
            .max(1e-9)
            * 1.1;
        let x = |t: f64| left + t / t_max * pw;
        let y = |v: f64| y0 + panel_h - v / v_max * panel_h;
        let _ = writeln!(
            s,
            r##"<text x="{left}" y="{:.1}" font-weight="bold">{} ({})</text><rect x="{left}" y="{y0:.1}" width="{pw}" height="{panel_h}" fill="none" stroke="#999"/><text x="{:.1}" y="{:.1}" text-anchor="end">{:.1}</text><text x="{:.1}" y="{:.1}" text-anchor="end">0</text><text x="{:.1}" y="{:.1}" text-anchor="end">{:.0} min</text>"##,
            y0 - 4.0,
            esc(panel.title),
            esc(panel.unit),
            left - 6.0,
            y0 + 10.0,
            v_max / 1.1,
            left - 6.0,
            y0 + panel_h,
            left + pw,
            y0 + panel_h + 14.0,
            t_max / 60.0,
        );
        for (si, (name, pts)) in panel.series.iter().enumerate() {
            let color = COLORS[si % COLORS.len()];
            let mut d = String::new();
            for (i, (t, v)) in pts.iter().enumerate() {
                let _ = write!(
                    d,
                    "{}{:.1},{:.1}",
                    if i == 0 { "M" } else { " L" },
                    x(*t),
                    y(*v)
                );
            }
            let _ = writeln!(
                s,
                r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.5"/><text x="{:.1}" y="{:.1}" fill="{color}">{}</text>"#,
                left + pw + 8.0,
                y0 + 14.0 + si as f64 * 16.0,
                esc(name)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}
