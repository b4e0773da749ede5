//! Minimal SVG line charts, so that benchmark results come with a picture and no plotting dependency.

use std::fmt::Write;

/// One line of a chart.
pub struct Series {
    /// Legend entry.
    pub name: String,
    /// Points (x, y), in x order.
    pub points: Vec<(f64, f64)>,
}

/// A chart panel.
pub struct Panel<'a> {
    /// Title above the panel.
    pub title: &'a str,
    /// Label of the x axis.
    pub x_label: &'a str,
    /// Label of the y axis.
    pub y_label: &'a str,
    /// Logarithmic (base 2) x axis.
    pub log2_x: bool,
    /// The lines.
    pub series: &'a [Series],
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];
const W: f64 = 520.0;
const H: f64 = 340.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn nice_step(span: f64) -> f64 {
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

/// Renders panels side by side as one SVG document.
pub fn render(panels: &[Panel<'_>]) -> String {
    let total_w = W * panels.len() as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="{total_w}" height="{H}" fill="white"/>"#
    );
    for (i, p) in panels.iter().enumerate() {
        panel(&mut out, p, W * i as f64);
    }
    out.push_str("</svg>\n");
    out
}

fn panel(out: &mut String, p: &Panel<'_>, x0: f64) {
    let xs = |x: f64| {
        if p.log2_x {
            x.max(f64::MIN_POSITIVE).log2()
        } else {
            x
        }
    };
    let pts = p.series.iter().flat_map(|s| s.points.iter());
    let (mut xmin, mut xmax, mut ymax) = (f64::INFINITY, f64::NEG_INFINITY, 0f64);
    for &(x, y) in pts {
        xmin = xmin.min(xs(x));
        xmax = xmax.max(xs(x));
        ymax = ymax.max(y);
    }
    if !xmin.is_finite() {
        (xmin, xmax) = (0.0, 1.0);
    }
    if xmax <= xmin {
        xmax = xmin + 1.0;
    }
    let step = nice_step(if ymax > 0.0 { ymax } else { 1.0 });
    let ytop = (ymax / step).ceil().max(1.0) * step;
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let px = |x: f64| x0 + LEFT + (xs(x) - xmin) / (xmax - xmin) * pw;
    let py = |y: f64| TOP + ph - y / ytop * ph;
    let _ = writeln!(
        out,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
        x0 + LEFT + pw / 2.0,
        esc(p.title)
    );
    let _ = writeln!(
        out,
        r##"<rect x="{}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##,
        x0 + LEFT
    );
    let mut y = 0.0;
    while y <= ytop + step / 2.0 {
        let yy = py(y);
        let _ = writeln!(
            out,
            r##"<line x1="{}" x2="{}" y1="{yy}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            x0 + LEFT,
            x0 + LEFT + pw,
            x0 + LEFT - 6.0,
            yy + 4.0,
            trim(y)
        );
        y += step;
    }
    let mut ticks: Vec<f64> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for x in ticks {
        let xx = px(x);
        let _ = writeln!(
            out,
            r#"<text x="{xx}" y="{}" text-anchor="middle">{}</text>"#,
            TOP + ph + 16.0,
            trim(x)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        x0 + LEFT + pw / 2.0,
        H - 12.0,
        esc(p.x_label)
    );
    let _ = writeln!(
        out,
        r#"<text transform="translate({},{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        x0 + 16.0,
        TOP + ph / 2.0,
        esc(p.y_label)
    );
    for (i, s) in p.series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for &(x, y) in &s.points {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                px(x),
                py(y)
            );
        }
        let ly = TOP + 10.0 + 18.0 * i as f64;
        let lx = x0 + LEFT + pw + 10.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{c}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            lx + 18.0,
            lx + 24.0,
            ly + 4.0,
            esc(&s.name)
        );
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_series_and_escapes_text() {
        let series = vec![
            Series {
                name: "a<b".into(),
                points: vec![(1.0, 2.0), (2.0, 3.0), (4.0, 1.0)],
            },
            Series {
                name: "c".into(),
                points: vec![(1.0, 0.5)],
            },
        ];
        let svg = render(&[Panel {
            title: "t",
            x_label: "x",
            y_label: "y",
            log2_x: true,
            series: &series,
        }]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains("a&lt;b") && !svg.contains("a<b"));
        let empty = render(&[Panel {
            title: "e",
            x_label: "x",
            y_label: "y",
            log2_x: false,
            series: &[],
        }]);
        assert!(empty.contains("</svg>"));
    }
}
