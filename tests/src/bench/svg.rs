//! Small, dependency-free SVG plots: line charts (with horizontal lines and
//! markers) and grouped bar charts on a log scale.

use std::fmt::Write as _;

const W: f64 = 900.0;
const H: f64 = 480.0;
const L: f64 = 80.0;
const R: f64 = 190.0;
const T: f64 = 40.0;
const B: f64 = 60.0;
const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A marker at (x, y): a circle with a label.
pub struct Marker {
    pub label: String,
    pub x: f64,
    pub y: f64,
    pub series: usize,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn nice_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
        return vec![lo];
    }
    let raw = (hi - lo) / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(mag * 10.0);
    let mut t = (lo / step).ceil() * step;
    let mut out = vec![];
    while t <= hi + step * 1e-9 {
        out.push(t);
        t += step;
    }
    out
}

fn frame(svg: &mut String, title: &str, x_label: &str, y_label: &str) {
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{}</text><text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(18,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (L + W - R) / 2.0,
        esc(title),
        (L + W - R) / 2.0,
        H - 15.0,
        esc(x_label),
        (T + H - B) / 2.0,
        esc(y_label)
    );
}

/// A line chart with optional horizontal reference lines and markers.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    hlines: &[(String, f64)],
    markers: &[Marker],
) -> String {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).chain(hlines.iter().map(|h| h.1));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (y0, y1) = ys.fold((0f64, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (x0, x1) = if x1 > x0 { (x0, x1) } else { (0.0, 1.0) };
    let y1 = if y1 > y0 { y1 * 1.05 } else { 1.0 };
    let px = |x: f64| L + (x - x0) / (x1 - x0) * (W - L - R);
    let py = |y: f64| H - B - (y - y0) / (y1 - y0) * (H - T - B);
    let mut svg = String::new();
    frame(&mut svg, title, x_label, y_label);
    for t in nice_ticks(x0, x1, 8) {
        let _ = write!(
            svg,
            r##"<line x1="{0}" x2="{0}" y1="{1}" y2="{2}" stroke="#eee"/><text x="{0}" y="{3}" text-anchor="middle">{4}</text>"##,
            px(t),
            T,
            H - B,
            H - B + 16.0,
            trim(t)
        );
    }
    for t in nice_ticks(y0, y1, 6) {
        let _ = write!(
            svg,
            r##"<line x1="{1}" x2="{2}" y1="{0}" y2="{0}" stroke="#eee"/><text x="{3}" y="{4}" text-anchor="end">{5}</text>"##,
            py(t),
            L,
            W - R,
            L - 6.0,
            py(t) + 4.0,
            trim(t)
        );
    }
    let _ = write!(
        svg,
        r##"<rect x="{L}" y="{T}" width="{}" height="{}" fill="none" stroke="#333"/>"##,
        W - L - R,
        H - T - B
    );
    for (name, y) in hlines {
        let _ = write!(
            svg,
            r##"<line x1="{L}" x2="{}" y1="{1}" y2="{1}" stroke="#000" stroke-dasharray="6,4"/><text x="{2}" y="{3}">{4}</text>"##,
            W - R,
            py(*y),
            L + 4.0,
            py(*y) - 4.0,
            esc(name)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<String> = s.points.iter().map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y))).collect();
        let _ = write!(svg, r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#, pts.join(" "));
        let ly = T + 14.0 + i as f64 * 18.0;
        let _ = write!(
            svg,
            r#"<rect x="{}" y="{}" width="12" height="12" fill="{c}"/><text x="{}" y="{}">{}</text>"#,
            W - R + 10.0,
            ly - 10.0,
            W - R + 28.0,
            ly,
            esc(&s.name)
        );
    }
    for m in markers {
        let c = COLORS[m.series % COLORS.len()];
        let _ = write!(
            svg,
            r##"<circle cx="{0}" cy="{1}" r="5" fill="none" stroke="{c}" stroke-width="2"/><text x="{2}" y="{3}" fill="{c}">{4}</text>"##,
            px(m.x),
            py(m.y),
            px(m.x) + 7.0,
            py(m.y) - 7.0,
            esc(&m.label)
        );
    }
    svg.push_str("</svg>");
    svg
}

/// Grouped bars on a log10 scale: `groups` of (group label, [(series, value)]).
pub fn log_bars(title: &str, y_label: &str, groups: &[(String, Vec<(String, f64)>)]) -> String {
    let vals = groups.iter().flat_map(|g| g.1.iter().map(|v| v.1)).filter(|v| *v > 0.0);
    let (lo, hi) = vals.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let (lo, hi) =
        if hi >= lo { (lo.log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0)) } else { (0.0, 1.0) };
    let py = |v: f64| H - B - (v.max(10f64.powf(lo)).log10() - lo) / (hi - lo) * (H - T - B);
    let mut svg = String::new();
    frame(&mut svg, title, "", y_label);
    let mut e = lo;
    while e <= hi {
        let _ = write!(
            svg,
            r##"<line x1="{L}" x2="{}" y1="{1}" y2="{1}" stroke="#eee"/><text x="{2}" y="{3}" text-anchor="end">{4}</text>"##,
            W - R,
            py(10f64.powf(e)),
            L - 6.0,
            py(10f64.powf(e)) + 4.0,
            trim(10f64.powf(e))
        );
        e += 1.0;
    }
    let gw = (W - L - R) / groups.len().max(1) as f64;
    let mut names: Vec<String> = vec![];
    for g in groups {
        for (s, _) in &g.1 {
            if !names.contains(s) {
                names.push(s.clone());
            }
        }
    }
    let bw = gw * 0.8 / names.len().max(1) as f64;
    for (gi, (label, bars)) in groups.iter().enumerate() {
        let gx = L + gi as f64 * gw + gw * 0.1;
        for (s, v) in bars {
            let si = names.iter().position(|n| n == s).unwrap_or(0);
            let x = gx + si as f64 * bw;
            let y = py(*v);
            let _ = write!(
                svg,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                bw * 0.9,
                (H - B - y).max(0.0),
                COLORS[si % COLORS.len()],
                esc(s),
                trim(*v)
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            gx + gw * 0.4,
            H - B + 16.0,
            esc(label)
        );
    }
    for (i, n) in names.iter().enumerate() {
        let ly = T + 14.0 + i as f64 * 18.0;
        let _ = write!(
            svg,
            r#"<rect x="{}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            W - R + 10.0,
            ly - 10.0,
            COLORS[i % COLORS.len()],
            W - R + 28.0,
            ly,
            esc(n)
        );
    }
    let _ = write!(
        svg,
        r##"<rect x="{L}" y="{T}" width="{}" height="{}" fill="none" stroke="#333"/></svg>"##,
        W - L - R,
        H - T - B
    );
    svg
}

fn trim(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_are_well_formed() {
        let s = line_chart(
            "t",
            "x",
            "y",
            &[Series { name: "a<b".into(), points: vec![(0.0, 1.0), (1.0, 3.0)] }],
            &[("line".into(), 2.0)],
            &[Marker { label: "kill".into(), x: 1.0, y: 3.0, series: 0 }],
        );
        assert!(s.starts_with("<svg") && s.ends_with("</svg>") && s.contains("a&lt;b") && s.contains("polyline"));
        let b = log_bars("t", "µs", &[("g".into(), vec![("p50".into(), 10.0), ("p99".into(), 1000.0)])]);
        assert!(b.contains("<rect") && b.ends_with("</svg>"));
        assert_eq!(nice_ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
    }
}
