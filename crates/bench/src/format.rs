//! Numbers for people, shared by the benchmarks' tables and summaries.

/// A rate with an SI suffix: "1.20G", "45.21M", "812.3k", "950".
pub(crate) fn rate(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}
