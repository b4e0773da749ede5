//! The DAC benchmark end to end at a tiny scale: counts, not timings. With a cache as large as the data, a
//! value-only cache answers every read locally and a shortcut-only cache with exactly one READ.

use std::time::Duration;

use dinomo_bench::{DacBenchOptions, run_dac};
use dinomo_cache::Policy;

#[test]
fn round_trips_per_read_follow_the_policy() -> anyhow::Result<()> {
    let opts = DacBenchOptions {
        keys: 4000,
        working_set_percent: 5.0,
        cache_percents: vec![0.0, 100.0],
        policies: vec![Policy::ValueOnly, Policy::ShortcutOnly, Policy::Adaptive],
        duration: Duration::from_millis(20),
        warmup_passes: 3.0,
        injected_latency_ns: 0,
        ..DacBenchOptions::default()
    };
    let report = run_dac(&opts, |_| {})?;
    assert_eq!(report.cases.len(), 6);
    assert_eq!(report.working_set_keys, 200);
    let case = |pct: f64, p: &str| {
        report
            .cases
            .iter()
            .find(|c| c.cache_percent == pct && c.policy == p)
            .unwrap()
    };
    for c in &report.cases {
        assert!(c.reads > 0, "{c:?}");
    }
    let v = case(100.0, "value-only");
    assert_eq!(
        (v.round_trips_per_read, v.value_hit_ratio),
        (0.0, 1.0),
        "{v:?}"
    );
    let s = case(100.0, "shortcut-only");
    assert_eq!(
        (s.round_trips_per_read, s.shortcut_hit_ratio),
        (1.0, 1.0),
        "{s:?}"
    );
    let d = case(100.0, "dac");
    assert_eq!(
        d.round_trips_per_read, 0.0,
        "DAC with room for every value caches values: {d:?}"
    );
    let none = case(0.0, "dac");
    assert_eq!(none.miss_ratio, 1.0);
    assert!(none.round_trips_per_read >= 2.0, "{none:?}");
    assert_eq!(report.dac_versus_best.len(), 2);
    let svg = report.to_svg();
    assert_eq!(svg.matches("<polyline").count(), 6);
    assert_eq!(report.to_csv().lines().count(), 7);
    Ok(())
}
