//! The Redis-protocol comparison of `scripts/bench-redis` as a picture: its results file (one row per test and
//! pipeline depth, dinomo's and redis-server's medians side by side) drawn as bars of throughput, of dinomo's
//! throughput as a fraction of Redis's beside the target for each test, and of server CPU per request.

use anyhow::{Context, bail, ensure};

use crate::svg;

/// The header line the results file starts with (after any comment lines).
pub const REDIS_CSV_HEADER: &str =
    "test,pipeline,dinomo_ops,redis_ops,dinomo_p50_ms,redis_p50_ms,dinomo_cpu_us,redis_cpu_us";

/// One case of the comparison: a redis-benchmark test at one pipeline depth against both servers.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisCase {
    /// redis-benchmark's test, upper case (GET, SET, ...).
    pub test: String,
    /// Requests each client keeps in flight (redis-benchmark `-P`).
    pub pipeline: u32,
    /// dinomo's throughput, requests per second.
    pub dinomo_ops: f64,
    /// redis-server's throughput, requests per second.
    pub redis_ops: f64,
    /// dinomo's median latency, ms.
    pub dinomo_p50_ms: f64,
    /// redis-server's median latency, ms.
    pub redis_p50_ms: f64,
    /// dinomo's CPU time per request (its whole process), µs.
    pub dinomo_cpu_us: f64,
    /// redis-server's CPU time per request, µs.
    pub redis_cpu_us: f64,
}

impl RedisCase {
    /// dinomo's throughput as a fraction of Redis's.
    pub fn ratio(&self) -> f64 {
        if self.redis_ops > 0.0 {
            self.dinomo_ops / self.redis_ops
        } else {
            0.0
        }
    }

    /// The smallest ratio to Redis this test should reach: Redis's throughput for reads, 0.8 of it for writes
    /// (each of dinomo's is logged in the persistent pool; Redis appends to its AOF and syncs it every second).
    pub fn target(&self) -> Option<f64> {
        match self.test.as_str() {
            "GET" => Some(1.0),
            "SET" => Some(0.8),
            _ => None,
        }
    }

    fn label(&self) -> String {
        format!("{} P{}", self.test, self.pipeline)
    }
}

/// A results file: its title (a `# title: ...` line) and its cases.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisComparison {
    /// What the run was (machine, settings); empty when the file names none.
    pub title: String,
    /// The cases, in the file's order.
    pub cases: Vec<RedisCase>,
}

/// Reads a results file: `#` lines are comments (`# title: T` names the run), then [`REDIS_CSV_HEADER`], then one
/// line per case.
pub fn parse_redis_csv(text: &str) -> anyhow::Result<RedisComparison> {
    let mut title = String::new();
    let mut header_seen = false;
    let mut cases = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        let at = n + 1;
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            if let Some(t) = comment.trim().strip_prefix("title:") {
                title = t.trim().to_string();
            }
            continue;
        }
        if !header_seen {
            ensure!(
                line == REDIS_CSV_HEADER,
                "line {at}: expected the header {REDIS_CSV_HEADER:?}, found {line:?}"
            );
            header_seen = true;
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != 8 {
            bail!("line {at}: expected 8 fields, found {}", fields.len());
        }
        let number = |i: usize| -> anyhow::Result<f64> {
            let v: f64 = fields[i].parse().with_context(|| {
                format!(
                    "line {at}: field {} is not a number: {:?}",
                    i + 1,
                    fields[i]
                )
            })?;
            ensure!(
                v.is_finite() && v >= 0.0,
                "line {at}: field {} must be a finite number, at least 0 (got {v})",
                i + 1
            );
            Ok(v)
        };
        ensure!(!fields[0].is_empty(), "line {at}: no test name");
        let pipeline: u32 = fields[1].parse().with_context(|| {
            format!(
                "line {at}: the pipeline depth is not a whole number: {:?}",
                fields[1]
            )
        })?;
        cases.push(RedisCase {
            test: fields[0].to_ascii_uppercase(),
            pipeline,
            dinomo_ops: number(2)?,
            redis_ops: number(3)?,
            dinomo_p50_ms: number(4)?,
            redis_p50_ms: number(5)?,
            dinomo_cpu_us: number(6)?,
            redis_cpu_us: number(7)?,
        });
    }
    ensure!(header_seen, "no header line {REDIS_CSV_HEADER:?}");
    ensure!(!cases.is_empty(), "no cases after the header");
    Ok(RedisComparison { title, cases })
}

/// Three panels: throughput of both servers, dinomo's fraction of Redis's with each test's target, and CPU per
/// request of both.
pub fn plot_redis(c: &RedisComparison) -> String {
    let categories: Vec<String> = c.cases.iter().map(RedisCase::label).collect();
    let both = |d: fn(&RedisCase) -> f64, r: fn(&RedisCase) -> f64| {
        vec![
            svg::BarSeries {
                name: "dinomo".into(),
                values: c.cases.iter().map(|x| Some(d(x))).collect(),
            },
            svg::BarSeries {
                name: "redis-server".into(),
                values: c.cases.iter().map(|x| Some(r(x))).collect(),
            },
        ]
    };
    let throughput = both(|x| x.dinomo_ops, |x| x.redis_ops);
    let cpu = both(|x| x.dinomo_cpu_us, |x| x.redis_cpu_us);
    let ratio = vec![svg::BarSeries {
        name: "dinomo / Redis".into(),
        values: c.cases.iter().map(|x| Some(x.ratio())).collect(),
    }];
    let marks: Vec<svg::BarMark> = c
        .cases
        .iter()
        .enumerate()
        .filter_map(|(i, x)| x.target().map(|value| svg::BarMark { category: i, value }))
        .collect();
    svg::render_bars(
        &[
            svg::BarPanel {
                title: "Throughput",
                y_label: "requests/s",
                categories: &categories,
                series: &throughput,
                marks: &[],
                marks_label: "",
                label_digits: 0,
            },
            svg::BarPanel {
                title: "dinomo / Redis",
                y_label: "dinomo throughput / Redis throughput",
                categories: &categories,
                series: &ratio,
                marks: &marks,
                marks_label: "target",
                label_digits: 2,
            },
            svg::BarPanel {
                title: "Server CPU per request",
                y_label: "CPU µs per request",
                categories: &categories,
                series: &cpu,
                marks: &[],
                marks_label: "",
                label_digits: 1,
            },
        ],
        &c.title,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "# a comment\n# title: 16 cores\n\
        test,pipeline,dinomo_ops,redis_ops,dinomo_p50_ms,redis_p50_ms,dinomo_cpu_us,redis_cpu_us\n\
        SET,1,114473,92081,0.407,0.491,14.45,11.00\n\
        get,16,604046,453924,1.219,1.567,3.00,2.20\n";

    #[test]
    fn reads_the_title_and_every_case() {
        let c = parse_redis_csv(SAMPLE).unwrap();
        assert_eq!(c.title, "16 cores");
        assert_eq!(c.cases.len(), 2);
        assert_eq!(c.cases[1].test, "GET");
        assert_eq!(c.cases[1].pipeline, 16);
        assert!((c.cases[0].ratio() - 114473.0 / 92081.0).abs() < 1e-12);
        assert_eq!(c.cases[0].target(), Some(0.8));
        assert_eq!(c.cases[1].target(), Some(1.0));
    }

    #[test]
    fn the_plot_has_a_bar_per_case_and_server_and_a_target_per_case() {
        let svg = plot_redis(&parse_redis_csv(SAMPLE).unwrap());
        assert!(svg.contains("SET P1") && svg.contains("GET P16"));
        // Two cases: 4 throughput bars, 2 ratio bars, 4 CPU bars, each with its value.
        assert_eq!(
            svg.matches(r#"text-anchor="middle" font-size="10""#)
                .count(),
            10
        );
        assert_eq!(svg.matches("stroke-dasharray").count(), 2 + 1);
        assert!(svg.contains(">1.24<") && svg.contains(">1.33<"), "{svg}");
        assert!(svg.contains(">16 cores<"));
    }

    #[test]
    fn malformed_files_are_refused_with_the_line() {
        let e = |text: &str| parse_redis_csv(text).unwrap_err().to_string();
        assert!(e("").contains("no header"));
        assert!(e("test,ops\n").contains("line 1: expected the header"));
        let header = REDIS_CSV_HEADER;
        assert!(e(&format!("{header}\n")).contains("no cases"));
        assert!(e(&format!("{header}\nGET,1,2\n")).contains("line 2: expected 8 fields"));
        assert!(e(&format!("{header}\nGET,x,1,1,1,1,1,1\n")).contains("pipeline depth"));
        assert!(e(&format!("{header}\nGET,1,1,abc,1,1,1,1\n")).contains("field 4 is not a number"));
        assert!(e(&format!("{header}\nGET,1,1,NaN,1,1,1,1\n")).contains("finite"));
        assert!(e(&format!("{header}\n,1,1,1,1,1,1,1\n")).contains("no test name"));
    }
}
