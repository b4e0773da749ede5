//! The statistics a KV node keeps for the M-node's policy: busy time per monitoring epoch and per-epoch key-access
//! statistics, taken by `EpochStats` (which starts a new epoch).

use dinomo_kn::{Embedded, EmbeddedConfig, KeyStatsConfig, KnConfig};

fn store(key_stats: KeyStatsConfig) -> Embedded {
    Embedded::open(&EmbeddedConfig {
        pool_size: 128 << 20,
        kn: KnConfig {
            threads: 2,
            key_stats,
            ..KnConfig::default()
        },
        ..EmbeddedConfig::default()
    })
    .expect("open store")
}

#[test]
fn an_epoch_reports_its_accesses_and_busy_time_then_a_new_one_starts() {
    let s = store(KeyStatsConfig::default());
    let h = s.handle();
    h.epoch_stats().unwrap();
    // 2000 accesses: key "hot" 1000 times, 1000 other keys once each.
    for i in 0..1000u32 {
        h.set(format!("cold-{i}").as_bytes(), b"v").unwrap();
        h.get(b"hot").unwrap();
    }
    let epoch = h.epoch_stats().unwrap();
    assert_eq!(epoch.len(), 2, "one per worker");
    let mut merged = epoch[0].keys.clone().expect("key statistics are on");
    merged.merge(epoch[1].keys.as_ref().unwrap()).unwrap();
    assert_eq!(merged.accesses, 2000);
    assert_eq!(merged.heavy_hitters[0].key, b"hot");
    assert!(merged.heavy_hitters[0].count >= 1000 - merged.heavy_hitter_error);
    let f = merged.frequency();
    assert!(
        (f.distinct - 1001.0).abs() < 60.0,
        "distinct {}",
        f.distinct
    );
    assert!(
        f.heavy_hitters[0].count as f64 > f.mean() + 3.0 * f.stddev(),
        "the hot key stands out"
    );
    for e in &epoch {
        assert!(e.busy_ns > 0 && e.busy_ns <= e.wall_ns, "{e:?}");
    }
    // Busy time is cumulative in the counters as well.
    let stats = h.stats().unwrap();
    assert!(
        stats
            .iter()
            .all(|w| w.busy_ns > 0 && w.busy_ns <= w.wall_ns)
    );
    // The next epoch starts empty.
    let next = h.epoch_stats().unwrap();
    assert!(next.iter().all(|e| e.keys.as_ref().unwrap().accesses == 0));
}

#[test]
fn tracked_keys_are_counted_exactly_and_statistics_can_be_turned_off() {
    let s = store(KeyStatsConfig::default());
    let h = s.handle();
    h.track_keys(&[b"a".to_vec(), b"b".to_vec()]).unwrap();
    for _ in 0..7 {
        h.get(b"a").unwrap();
    }
    let epoch = h.epoch_stats().unwrap();
    let count = |k: &[u8]| -> u64 {
        epoch
            .iter()
            .flat_map(|e| &e.keys.as_ref().unwrap().tracked)
            .filter(|t| t.key == k)
            .map(|t| t.count)
            .sum()
    };
    assert_eq!(count(b"a"), 7);
    assert_eq!(count(b"b"), 0);
    drop(h);
    drop(s);

    let off = store(KeyStatsConfig {
        enabled: false,
        ..KeyStatsConfig::default()
    });
    let h = off.handle();
    h.get(b"a").unwrap();
    assert!(h.epoch_stats().unwrap().iter().all(|e| e.keys.is_none()));
}

#[test]
fn invalid_sketch_settings_are_refused_at_start() {
    let err = Embedded::open(&EmbeddedConfig {
        pool_size: 64 << 20,
        kn: KnConfig {
            key_stats: KeyStatsConfig {
                f2_width: 1000,
                ..KeyStatsConfig::default()
            },
            ..KnConfig::default()
        },
        ..EmbeddedConfig::default()
    })
    .err()
    .expect("refused");
    assert!(err.to_string().contains("f2_width"), "{err}");
}
