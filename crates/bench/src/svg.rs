//! Minimal SVG line and bar charts, so that benchmark results come with a picture and no plotting dependency.

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
/// The plot area of a panel.
const PW: f64 = W - LEFT - RIGHT;
const PH: f64 = H - TOP - BOTTOM;

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
    document(panels.len(), H, |out| {
        for (i, p) in panels.iter().enumerate() {
            panel(out, p, W * i as f64);
        }
    })
}

/// An SVG document `panels` panels wide and `height` high, on white, around what `draw` writes.
fn document(panels: usize, height: f64, draw: impl FnOnce(&mut String)) -> String {
    let width = W * panels as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="{width}" height="{height}" fill="white"/>"#
    );
    draw(&mut out);
    out.push_str("</svg>\n");
    out
}

/// What every panel at `x0` has: its title, its frame, horizontal grid lines from 0 to a round value at or above
/// `ymax` with their values (as `value` writes them), and the y axis's label. Returns the top of the y axis.
fn frame(
    out: &mut String,
    x0: f64,
    title: &str,
    y_label: &str,
    ymax: f64,
    value: fn(f64) -> String,
) -> f64 {
    let step = nice_step(if ymax > 0.0 { ymax } else { 1.0 });
    let ytop = (ymax / step).ceil().max(1.0) * step;
    let _ = writeln!(
        out,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
        x0 + LEFT + PW / 2.0,
        esc(title)
    );
    let _ = writeln!(
        out,
        r##"<rect x="{}" y="{TOP}" width="{PW}" height="{PH}" fill="none" stroke="#444"/>"##,
        x0 + LEFT
    );
    let mut y = 0.0;
    while y <= ytop + step / 2.0 {
        let yy = TOP + PH - y / ytop * PH;
        let _ = writeln!(
            out,
            r##"<line x1="{}" x2="{}" y1="{yy}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            x0 + LEFT,
            x0 + LEFT + PW,
            x0 + LEFT - 6.0,
            yy + 4.0,
            value(y)
        );
        y += step;
    }
    let _ = writeln!(
        out,
        r#"<text transform="translate({},{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        x0 + 16.0,
        TOP + PH / 2.0,
        esc(y_label)
    );
    ytop
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
    let ytop = frame(out, x0, p.title, p.y_label, ymax, trim);
    let px = |x: f64| x0 + LEFT + (xs(x) - xmin) / (xmax - xmin) * PW;
    let py = |y: f64| TOP + PH - y / ytop * PH;
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
            TOP + PH + 16.0,
            trim(x)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        x0 + LEFT + PW / 2.0,
        H - 12.0,
        esc(p.x_label)
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
        legend(out, x0, i, c, Swatch::Line, &s.name);
    }
}

/// One series of a bar chart: a value per category (`None`: no bar).
pub struct BarSeries {
    /// Legend entry.
    pub name: String,
    /// One value per category of the panel, in its order.
    pub values: Vec<Option<f64>>,
}

/// A horizontal mark across one category's bars: a target or a reference level.
pub struct BarMark {
    /// Index of the category.
    pub category: usize,
    /// Height of the mark.
    pub value: f64,
}

/// A bar-chart panel: for each category, one bar per series side by side.
pub struct BarPanel<'a> {
    /// Title above the panel.
    pub title: &'a str,
    /// Label of the y axis.
    pub y_label: &'a str,
    /// The categories along the x axis.
    pub categories: &'a [String],
    /// The bars.
    pub series: &'a [BarSeries],
    /// Dashed marks drawn across categories' bars, such as a target per category.
    pub marks: &'a [BarMark],
    /// Legend entry of the marks (when there are any).
    pub marks_label: &'a str,
    /// Digits after the point in the value written above each bar.
    pub label_digits: usize,
}

/// Renders bar-chart panels side by side as one SVG document, with `note` (what was measured, empty for none)
/// in a line under them.
pub fn render_bars(panels: &[BarPanel<'_>], note: &str) -> String {
    let height = if note.is_empty() { H } else { H + 20.0 };
    document(panels.len(), height, |out| {
        for (i, p) in panels.iter().enumerate() {
            bar_panel(out, p, W * i as f64);
        }
        if !note.is_empty() {
            let _ = writeln!(
                out,
                r##"<text x="{LEFT}" y="{}" fill="#444">{}</text>"##,
                height - 12.0,
                esc(note)
            );
        }
    })
}

fn bar_panel(out: &mut String, p: &BarPanel<'_>, x0: f64) {
    let values = p.series.iter().flat_map(|s| s.values.iter().flatten());
    let ymax = values
        .copied()
        .chain(p.marks.iter().map(|m| m.value))
        .filter(|v| v.is_finite())
        .fold(0f64, f64::max)
        // Room above the tallest bar for its value.
        * 1.08;
    let ytop = frame(out, x0, p.title, p.y_label, ymax, axis_value);
    let py = |y: f64| TOP + PH - y.clamp(0.0, ytop) / ytop * PH;
    let n = p.categories.len().max(1) as f64;
    let group_w = PW / n;
    let bars = p.series.len().max(1) as f64;
    // A fifth of each group is the gap between groups.
    let bar_w = group_w * 0.8 / bars;
    let group_x = |c: usize| x0 + LEFT + group_w * c as f64 + group_w * 0.1;
    for (c, name) in p.categories.iter().enumerate() {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            group_x(c) + group_w * 0.4,
            TOP + PH + 16.0,
            esc(name)
        );
    }
    // Values are written after the marks, on a white halo, so that a mark near a bar's top does not hide them.
    let mut labels = String::new();
    for (i, s) in p.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        for (c, v) in s.values.iter().enumerate().take(p.categories.len()) {
            let Some(v) = v.filter(|v| v.is_finite()) else {
                continue;
            };
            let x = group_x(c) + bar_w * i as f64;
            let top = py(v);
            let _ = writeln!(
                out,
                r#"<rect class="bar" x="{x:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{color}"/>"#,
                bar_w * 0.92,
                TOP + PH - top,
            );
            let _ = writeln!(
                labels,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10" stroke="white" stroke-width="3" paint-order="stroke">{}</text>"#,
                x + bar_w * 0.46,
                top - 3.0,
                bar_label(v, p.label_digits)
            );
        }
        legend(out, x0, i, color, Swatch::Bar, &s.name);
    }
    for m in p.marks.iter().filter(|m| m.category < p.categories.len()) {
        let yy = py(m.value);
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="#000" stroke-width="1.5" stroke-dasharray="5,3"/>"##,
            group_x(m.category) - group_w * 0.05,
            group_x(m.category) + group_w * 0.85,
        );
    }
    if !p.marks.is_empty() {
        legend(
            out,
            x0,
            p.series.len(),
            "#000",
            Swatch::Dashed,
            p.marks_label,
        );
    }
    out.push_str(&labels);
}

/// What a legend entry shows of its series.
enum Swatch {
    /// A line chart's line.
    Line,
    /// A bar.
    Bar,
    /// A dashed mark.
    Dashed,
}

/// Legend entry `row` of the panel at `x0`, right of its plot area: a swatch of `color` and the series' name.
fn legend(out: &mut String, x0: f64, row: usize, color: &str, swatch: Swatch, name: &str) {
    let lx = x0 + LEFT + PW + 10.0;
    let ly = TOP + 10.0 + 18.0 * row as f64;
    let _ = match swatch {
        Swatch::Line => write!(
            out,
            r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"/>"#,
            lx + 18.0
        ),
        Swatch::Bar => writeln!(
            out,
            r#"<rect x="{lx}" y="{}" width="18" height="10" fill="{color}"/>"#,
            ly - 5.0
        ),
        Swatch::Dashed => writeln!(
            out,
            r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="1.5" stroke-dasharray="5,3"/>"#,
            lx + 18.0
        ),
    };
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}">{}</text>"#,
        lx + 24.0,
        ly + 4.0,
        esc(name)
    );
}

/// A value above a bar: thousands as k and millions as M, so that the labels fit.
fn bar_label(v: f64, digits: usize) -> String {
    if v.abs() >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v.abs() >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.digits$}")
    }
}

/// An axis tick value, in the same units as [`bar_label`] for large values.
fn axis_value(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if v.abs() >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
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

    #[test]
    fn bar_chart_draws_a_bar_per_value_and_the_marks() {
        let categories = vec!["GET 1".to_string(), "SET <16>".to_string()];
        let series = vec![
            BarSeries {
                name: "dinomo".into(),
                values: vec![Some(112_003.0), Some(445_614.0)],
            },
            BarSeries {
                name: "redis".into(),
                values: vec![Some(129_003.0), None],
            },
        ];
        let marks = [BarMark {
            category: 1,
            value: 0.8,
        }];
        let svg = render_bars(
            &[
                BarPanel {
                    title: "ops/s",
                    y_label: "ops/s",
                    categories: &categories,
                    series: &series,
                    marks: &[],
                    marks_label: "",
                    label_digits: 0,
                },
                BarPanel {
                    title: "ratio",
                    y_label: "dinomo / redis",
                    categories: &categories,
                    series: &series[..1],
                    marks: &marks,
                    marks_label: "target",
                    label_digits: 2,
                },
            ],
            "a <note>",
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains(">a &lt;note&gt;<"));
        // Three bars in the first panel (one value missing), two in the second, a legend swatch per series, and
        // the two frames and the background.
        assert_eq!(svg.matches("<rect").count(), 3 + 2 + 3 + 2 + 1);
        assert_eq!(svg.matches("stroke-dasharray").count(), 2);
        assert!(svg.contains(">112k<") && svg.contains(">446k<"));
        assert!(svg.contains("SET &lt;16&gt;") && !svg.contains("SET <16>"));
        // dinomo's bars in both panels; in the first, the larger value reaches further up.
        let tops: Vec<f64> = svg
            .lines()
            .filter(|l| l.starts_with("<rect class=\"bar\"") && l.contains("fill=\"#1f77b4\""))
            .map(|l| {
                let y = l.split("y=\"").nth(1).unwrap();
                y[..y.find('"').unwrap()].parse().unwrap()
            })
            .collect();
        assert_eq!(tops.len(), 4, "{svg}");
        assert!(tops[1] < tops[0]);
    }
}
