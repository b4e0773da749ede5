//! Unit tests pinning the policies.

use super::*;

/// Bytes of a shortcut entry with a one-byte key.
fn se() -> u64 {
    Dac::shortcut_entry_bytes(1)
}

/// Bytes of a value entry with a one-byte key and a value of `len` bytes.
fn ve(len: usize) -> u64 {
    Dac::value_entry_bytes(1, len)
}

fn cache(policy: Policy, budget_bytes: u64) -> Dac {
    Dac::new(CacheConfig {
        budget_bytes,
        policy,
        initial_miss_cost: 2.0,
        miss_cost_weight: 0.25,
        remember_absent: true,
    })
}

fn sc(n: u64) -> Shortcut {
    Shortcut { ptr: n, seq: n + 1 }
}

fn val(len: usize, fill: u8) -> Vec<u8> {
    vec![fill; len]
}

fn kinds(dac: &Dac, keys: &[u8]) -> Vec<Option<EntryKind>> {
    keys.iter().map(|k| dac.contains(&[*k])).collect()
}

const V: Option<EntryKind> = Some(EntryKind::Value);
const S: Option<EntryKind> = Some(EntryKind::Shortcut);

/// Fills keys with a value too large to be cached as a value, so they become shortcuts.
fn fill_shortcuts(dac: &mut Dac, keys: &[u8]) {
    let huge = val(usize::try_from(dac.stats().budget_bytes).unwrap() + 1, 0);
    for &k in keys {
        dac.fill(&[k], &huge, sc(u64::from(k)));
        assert_eq!(dac.contains(&[k]), S);
    }
}

#[cfg(target_pointer_width = "64")]
#[test]
fn entry_overhead_is_derived_from_the_structures() {
    assert_eq!(size_of::<Node>(), 56);
    assert_eq!(size_of::<lfu::Item>(), 16);
    assert_eq!(ENTRY_OVERHEAD, 89);
    assert_eq!(Dac::shortcut_entry_bytes(8), 8 + 16 + 89);
    assert_eq!(Dac::value_entry_bytes(8, 64), 8 + 64 + 16 + 89);
}

#[test]
fn values_are_cached_first_while_space_lasts() {
    let mut dac = cache(Policy::Adaptive, 3 * ve(100));
    for k in 0..3u8 {
        dac.fill(&[k], &val(100, k), sc(u64::from(k)));
    }
    assert_eq!(kinds(&dac, &[0, 1, 2]), [V, V, V]);
    let st = dac.stats();
    assert_eq!(
        (st.values, st.shortcuts, st.used_bytes),
        (3, 0, 3 * ve(100))
    );
    assert_eq!(
        dac.lookup(&[1]),
        Lookup::Value {
            value: &val(100, 1),
            shortcut: sc(1)
        }
    );
    // No room left for a value: the new key becomes a shortcut.
    dac.fill(&[3], &val(100, 3), sc(3));
    assert_eq!(dac.contains(&[3]), S);
    assert_eq!(dac.lookup(&[3]), Lookup::Shortcut(sc(3)));
    dac.check_invariants();
}

#[test]
fn miss_on_a_full_cache_demotes_the_lru_value() {
    let mut dac = cache(Policy::Adaptive, 3 * ve(200));
    for k in 0..3u8 {
        dac.fill(&[k], &val(200, k), sc(u64::from(k)));
    }
    // Key 0 becomes the most recently used; key 1 is now the least recently used.
    assert!(matches!(dac.lookup(&[0]), Lookup::Value { .. }));
    dac.fill(&[3], &val(200, 3), sc(3));
    assert_eq!(kinds(&dac, &[0, 1, 2, 3]), [V, S, V, S]);
    assert_eq!(dac.stats().demotions, 1);
    assert_eq!(dac.stats().evictions, 0);
    assert_eq!(dac.lookup(&[1]), Lookup::Shortcut(sc(1)));
    // Demoting one value freed enough room for one shortcut only; the next miss demotes the next least recently used value, key 2.
    dac.fill(&[4], &val(200, 4), sc(4));
    assert_eq!(kinds(&dac, &[0, 1, 2, 3, 4]), [V, S, S, S, S]);
    dac.check_invariants();
}

#[test]
fn eviction_picks_the_lfu_shortcut() {
    let mut dac = cache(Policy::Adaptive, 3 * se());
    fill_shortcuts(&mut dac, &[0, 1, 2]);
    for (k, n) in [(0u8, 3), (1, 1), (2, 2)] {
        for _ in 0..n {
            assert_eq!(dac.lookup(&[k]), Lookup::Shortcut(sc(u64::from(k))));
        }
    }
    // Hits: 0 → 4, 1 → 2, 2 → 3. Key 1 goes, although key 0 is the least recently used.
    fill_shortcuts(&mut dac, &[3]);
    assert_eq!(kinds(&dac, &[0, 1, 2, 3]), [S, None, S, S]);
    // The newcomer has the fewest hits and goes next.
    fill_shortcuts(&mut dac, &[4]);
    assert_eq!(kinds(&dac, &[0, 1, 2, 3, 4]), [S, None, S, None, S]);
    assert_eq!(dac.stats().evictions, 2);
    dac.check_invariants();
}

#[test]
fn frequency_ties_evict_the_least_recently_touched_shortcut() {
    let mut dac = cache(Policy::Adaptive, 3 * se());
    fill_shortcuts(&mut dac, &[0, 1, 2]);
    for k in [1u8, 0, 2] {
        dac.lookup(&[k]);
    }
    fill_shortcuts(&mut dac, &[3]);
    assert_eq!(kinds(&dac, &[0, 1, 2, 3]), [S, None, S, S]);
}

#[test]
fn demoted_values_keep_their_access_count() {
    let mut dac = cache(Policy::Adaptive, ve(100) + se());
    dac.fill(&[0], &val(100, 0), sc(0));
    for _ in 0..5 {
        dac.lookup(&[0]);
    }
    fill_shortcuts(&mut dac, &[1]);
    assert_eq!(kinds(&dac, &[0, 1]), [V, S]);
    // Key 2 needs room: value 0 is demoted with its 6 hits, which frees too little, so the
    // least frequently used shortcut, key 1 (1 hit), is evicted rather than key 0.
    fill_shortcuts(&mut dac, &[2]);
    assert_eq!(kinds(&dac, &[0, 1, 2]), [S, None, S]);
    let st = dac.stats();
    assert_eq!((st.demotions, st.evictions), (1, 1));
    fill_shortcuts(&mut dac, &[3]);
    assert_eq!(kinds(&dac, &[0, 2, 3]), [S, None, S]);
    assert_eq!(dac.lookup(&[0]), Lookup::Shortcut(sc(0)));
}

/// Four shortcuts fill the cache; `P` (key 0) has `hits` hits, and its value needs the room
/// of exactly two other shortcuts: key 1 (1 hit) and key 2 (2 hits), sum 3. Key 3 has 3 hits.
fn promotion_case(hits: u32, samples: &[u32]) -> Dac {
    let mut dac = cache(Policy::Adaptive, 4 * se());
    for &rts in samples {
        dac.record_miss_round_trips(rts);
    }
    fill_shortcuts(&mut dac, &[0, 1, 2, 3]);
    dac.lookup(&[2]);
    dac.lookup(&[3]);
    dac.lookup(&[3]);
    for _ in 1..hits {
        assert_eq!(dac.lookup(&[0]), Lookup::Shortcut(sc(0)));
    }
    let value = val(usize::try_from(se()).unwrap() + 1, 7);
    dac.shortcut_hit(&[0], &value, sc(10));
    dac.check_invariants();
    dac
}

#[test]
fn equation_1_promotes_exactly_at_the_threshold() {
    // M = 2: promote iff hits(P) ≥ 3 × 2 = 6.
    let below = promotion_case(5, &[]);
    assert_eq!(kinds(&below, &[0, 1, 2, 3]), [S, S, S, S]);
    assert_eq!(below.stats().promotions, 0);
    assert_eq!(below.stats().evictions, 0);

    let mut at = promotion_case(6, &[]);
    assert_eq!(kinds(&at, &[0, 1, 2, 3]), [V, None, None, S]);
    let st = at.stats();
    assert_eq!((st.promotions, st.evictions), (1, 2));
    assert_eq!(st.used_bytes, ve(usize::try_from(se()).unwrap() + 1) + se());
    assert_eq!(
        at.lookup(&[0]),
        Lookup::Value {
            value: &val(usize::try_from(se()).unwrap() + 1, 7),
            shortcut: sc(10)
        }
    );

    // M = 2 + 0.25 × (4 − 2) = 2.5: the threshold becomes 7.5.
    let below = promotion_case(7, &[4]);
    assert_eq!(below.miss_cost(), 2.5);
    assert_eq!(kinds(&below, &[0, 1, 2, 3]), [S, S, S, S]);
    let at = promotion_case(8, &[4]);
    assert_eq!(kinds(&at, &[0, 1, 2, 3]), [V, None, None, S]);
}

#[test]
fn promotion_uses_free_space_without_evicting() {
    let mut dac = cache(Policy::Adaptive, 10 * se());
    fill_shortcuts(&mut dac, &[0, 1]);
    dac.shortcut_hit(&[0], &val(50, 5), sc(20));
    assert_eq!(kinds(&dac, &[0, 1]), [V, S]);
    let st = dac.stats();
    assert_eq!((st.promotions, st.evictions, st.demotions), (1, 0, 0));
    assert_eq!(
        dac.lookup(&[0]),
        Lookup::Value {
            value: &val(50, 5),
            shortcut: sc(20)
        }
    );
}

#[test]
fn no_promotion_when_evicting_every_shortcut_is_not_enough() {
    // A value (key 9) and two shortcuts (keys 0 and 1) fill the cache. Promoting key 0 can
    // only evict key 1: a value needing more than one shortcut entry of extra room stays a
    // shortcut however hot it is, and the value is not demoted for it.
    let one = usize::try_from(se()).unwrap();
    for (len, promoted) in [(one + 1, false), (one, true)] {
        let mut dac = cache(Policy::Adaptive, ve(100) + 2 * se());
        dac.fill(&[9], &val(100, 9), sc(9));
        fill_shortcuts(&mut dac, &[0, 1]);
        for _ in 0..100 {
            dac.lookup(&[0]);
        }
        dac.shortcut_hit(&[0], &val(len, 1), sc(30));
        dac.check_invariants();
        if promoted {
            assert_eq!(kinds(&dac, &[0, 1, 9]), [V, None, V]);
        } else {
            assert_eq!(kinds(&dac, &[0, 1, 9]), [S, S, V]);
            assert_eq!(dac.stats().evictions, 0);
            // The shortcut itself is refreshed.
            assert_eq!(dac.lookup(&[0]), Lookup::Shortcut(sc(30)));
        }
    }
}

#[test]
fn value_only_never_holds_shortcuts() {
    let mut dac = cache(Policy::ValueOnly, 3 * ve(100));
    for k in 0..10u8 {
        dac.fill(&[k], &val(100, k), sc(u64::from(k)));
        dac.lookup(&[k / 2]);
        dac.shortcut_hit(&[k / 3], &val(100, k), sc(u64::from(k)));
        let st = dac.stats();
        assert_eq!(st.shortcuts, 0);
        assert!(st.values <= 3);
        dac.check_invariants();
    }
    // Least recently used values are dropped.
    let mut dac = cache(Policy::ValueOnly, 3 * ve(100));
    for k in 7..10u8 {
        dac.fill(&[k], &val(100, k), sc(u64::from(k)));
    }
    dac.lookup(&[7]);
    dac.fill(&[20], &val(100, 0), sc(0));
    assert_eq!(kinds(&dac, &[7, 8, 9, 20]), [V, None, V, V]);
    assert_eq!(dac.stats().evictions, 1);
    // A value larger than the budget is not cached at all.
    dac.fill(&[21], &val(usize::try_from(3 * ve(100)).unwrap(), 0), sc(0));
    assert_eq!(dac.contains(&[21]), None);
}

#[test]
fn shortcut_only_never_holds_values_and_evicts_lru() {
    let mut dac = cache(Policy::ShortcutOnly, 3 * se());
    for k in 0..3u8 {
        dac.fill(&[k], &val(10, k), sc(u64::from(k)));
    }
    dac.lookup(&[0]);
    dac.lookup(&[0]);
    dac.lookup(&[1]);
    dac.lookup(&[2]);
    dac.lookup(&[0]);
    // Key 1 is the least recently used (key 0 is also the most frequent).
    dac.fill(&[3], &val(0, 0), sc(3));
    assert_eq!(kinds(&dac, &[0, 1, 2, 3]), [S, None, S, S]);
    dac.shortcut_hit(&[2], &val(1, 1), sc(12));
    dac.write(&[0], &val(1, 1), sc(13));
    let st = dac.stats();
    assert_eq!((st.values, st.shortcuts, st.promotions), (0, 3, 0));
    assert_eq!(dac.lookup(&[2]), Lookup::Shortcut(sc(12)));
    assert_eq!(dac.lookup(&[0]), Lookup::Shortcut(sc(13)));
    dac.check_invariants();
}

#[test]
fn static_25_keeps_values_within_a_quarter_of_the_budget() {
    let budget = 4 * ve(100);
    let mut dac = cache(Policy::Static { value_percent: 25 }, budget);
    dac.fill(&[0], &val(100, 0), sc(0));
    dac.fill(&[1], &val(100, 1), sc(1));
    // The value share holds one value: key 0 was demoted into the shortcut share.
    assert_eq!(kinds(&dac, &[0, 1]), [S, V]);
    assert_eq!(dac.stats().demotions, 1);
    // A shortcut hit moves key 0 back into the value share, demoting key 1.
    dac.shortcut_hit(&[0], &val(100, 9), sc(9));
    assert_eq!(kinds(&dac, &[0, 1]), [V, S]);
    assert_eq!(dac.stats().promotions, 1);
    for k in 2..40u8 {
        let len = usize::from(k) * 7 % 150;
        dac.fill(&[k], &val(len, k), sc(u64::from(k)));
        dac.lookup(&[k / 2]);
        let st = dac.stats();
        assert!(st.value_bytes <= budget / 4, "{st:?}");
        assert!(st.shortcut_bytes <= budget - budget / 4, "{st:?}");
        dac.check_invariants();
    }
    let st = dac.stats();
    assert!(st.values >= 1 && st.shortcuts >= 1, "{st:?}");
}

#[test]
fn miss_cost_moving_average_moves_toward_samples() {
    let mut dac = cache(Policy::Adaptive, 1000);
    assert_eq!(dac.miss_cost(), 2.0);
    dac.record_miss_round_trips(10);
    assert_eq!(dac.miss_cost(), 4.0);
    dac.record_miss_round_trips(10);
    assert_eq!(dac.miss_cost(), 5.5);
    for _ in 0..100 {
        dac.record_miss_round_trips(10);
    }
    assert!((dac.miss_cost() - 10.0).abs() < 1e-9);
    dac.record_miss_round_trips(2);
    assert!((dac.miss_cost() - 8.0).abs() < 1e-9);

    let defaults = Dac::new(CacheConfig::default());
    assert_eq!(defaults.miss_cost(), 2.0);
    let bad = Dac::new(CacheConfig {
        initial_miss_cost: f64::NAN,
        miss_cost_weight: 0.0,
        ..CacheConfig::default()
    });
    assert_eq!(bad.miss_cost(), 2.0);
}

#[test]
fn set_budget_shrink_respects_the_new_budget() {
    for policy in [
        Policy::Adaptive,
        Policy::Static { value_percent: 50 },
        Policy::ValueOnly,
        Policy::ShortcutOnly,
    ] {
        let mut dac = cache(policy, 20 * ve(100));
        for k in 0..40u8 {
            dac.fill(&[k], &val(100, k), sc(u64::from(k)));
        }
        for budget in [10 * ve(100), 3 * ve(100) + 1, se(), se() - 1, 0] {
            dac.set_budget(budget);
            let st = dac.stats();
            assert_eq!(st.budget_bytes, budget);
            assert!(st.used_bytes <= budget, "{policy}: {st:?}");
            dac.check_invariants();
        }
        assert!(dac.is_empty());
        dac.set_budget(5 * ve(100));
        dac.fill(&[1], &val(100, 1), sc(1));
        assert!(dac.contains(&[1]).is_some(), "{policy}");
    }
}

#[test]
fn adaptive_shrink_demotes_values_before_evicting() {
    let mut dac = cache(Policy::Adaptive, 4 * ve(100));
    for k in 0..4u8 {
        dac.fill(&[k], &val(100, k), sc(u64::from(k)));
    }
    dac.lookup(&[0]);
    // Room for one value and three shortcuts: the three least recently used are demoted.
    dac.set_budget(ve(100) + 3 * se());
    assert_eq!(kinds(&dac, &[0, 1, 2, 3]), [V, S, S, S]);
    assert_eq!(dac.stats().evictions, 0);
    dac.set_budget(2 * se());
    assert_eq!(dac.len(), 2);
    assert_eq!(dac.stats().values, 0);
    dac.check_invariants();
}

#[test]
fn shrinking_compacts_the_slab() {
    let mut dac = cache(Policy::Adaptive, 1000 * ve(8));
    for k in 0..1000u32 {
        dac.fill(&k.to_le_bytes(), &k.to_be_bytes(), sc(u64::from(k)));
    }
    dac.set_budget(10 * Dac::shortcut_entry_bytes(4));
    assert_eq!(dac.nodes.len(), dac.len());
    dac.check_invariants();
    for k in 0..1000u32 {
        match dac.lookup(&k.to_le_bytes()) {
            Lookup::Miss => {}
            Lookup::Shortcut(s) => assert_eq!(s, sc(u64::from(k))),
            Lookup::Value { .. } | Lookup::Absent => panic!("no value fits"),
        }
    }
    assert_eq!(dac.stats().shortcut_hits, 10);
    dac.check_invariants();
}

#[test]
fn writes_never_leave_an_old_value_behind() {
    let mut dac = cache(Policy::Adaptive, 2 * ve(100));
    dac.fill(b"a", &val(100, 1), sc(1));
    let before = dac.nodes[dac.find(b"a").unwrap() as usize].buf.as_ptr();
    dac.write(b"a", &val(100, 2), sc(2));
    // Same length: updated in place.
    assert_eq!(
        dac.nodes[dac.find(b"a").unwrap() as usize].buf.as_ptr(),
        before
    );
    assert_eq!(
        dac.lookup(b"a"),
        Lookup::Value {
            value: &val(100, 2),
            shortcut: sc(2)
        }
    );
    // Shorter.
    dac.write(b"a", &val(3, 3), sc(3));
    assert_eq!(
        dac.lookup(b"a"),
        Lookup::Value {
            value: &val(3, 3),
            shortcut: sc(3)
        }
    );
    // Larger than the free space: the entry becomes a shortcut to the new value.
    dac.fill(b"b", &val(100, 4), sc(4));
    dac.write(b"a", &val(150, 5), sc(5));
    assert_eq!(dac.lookup(b"a"), Lookup::Shortcut(sc(5)));
    assert_eq!(dac.stats().demotions, 1);
    // A shortcut written while there is room becomes a value again.
    dac.invalidate(b"b");
    dac.write(b"a", &val(150, 6), sc(6));
    assert_eq!(
        dac.lookup(b"a"),
        Lookup::Value {
            value: &val(150, 6),
            shortcut: sc(6)
        }
    );
    // A new key is handled like a fill.
    dac.write(b"c", &val(0, 0), sc(7));
    assert_eq!(
        dac.lookup(b"c"),
        Lookup::Value {
            value: &[],
            shortcut: sc(7)
        }
    );
    dac.check_invariants();
}

#[test]
fn stale_shortcut_counts_a_miss_and_drops_the_entry() {
    let mut dac = cache(Policy::Adaptive, 3 * se());
    fill_shortcuts(&mut dac, &[0]);
    assert_eq!(dac.lookup(&[0]), Lookup::Shortcut(sc(0)));
    dac.stale_shortcut(&[0]);
    assert_eq!(dac.contains(&[0]), None);
    let st = dac.stats();
    assert_eq!((st.value_hits, st.shortcut_hits, st.misses), (0, 0, 1));
    assert_eq!(st.shortcuts, 0);
    // A value entry for the key is kept.
    dac.fill(&[1], &[1], sc(1));
    assert_eq!(dac.contains(&[1]), V);
    dac.stale_shortcut(&[1]);
    assert_eq!(dac.contains(&[1]), V);
    // With no shortcut hit counted, the counters stay as they are.
    assert_eq!(dac.stats().misses, 1);
}

#[test]
fn lookups_count_hits_and_misses() {
    let mut dac = cache(Policy::Adaptive, ve(10) + se());
    assert_eq!(dac.lookup(b"x"), Lookup::Miss);
    dac.fill(b"x", &val(10, 1), sc(1));
    dac.fill(b"y", &val(10, 2), sc(2));
    assert_eq!(kinds(&dac, b"xy"), [V, S]);
    dac.lookup(b"x");
    dac.lookup(b"x");
    dac.lookup(b"y");
    dac.lookup(b"z");
    let st = dac.stats();
    assert_eq!((st.value_hits, st.shortcut_hits, st.misses), (2, 1, 2));
    dac.invalidate(b"x");
    assert_eq!(dac.lookup(b"x"), Lookup::Miss);
}

#[test]
fn entries_too_large_for_the_budget_are_not_cached() {
    let mut dac = cache(Policy::Adaptive, se() - 1);
    dac.fill(&[0], &[], sc(0));
    dac.write(&[1], &[], sc(1));
    dac.shortcut_hit(&[2], &[], sc(2));
    assert!(dac.is_empty());
    assert_eq!(dac.stats().used_bytes, 0);
    // A key that fits only as a shortcut is cached as one.
    let mut dac = cache(Policy::Adaptive, se());
    dac.fill(&[0], &[1], sc(0));
    assert_eq!(dac.contains(&[0]), S);
    dac.check_invariants();
}

#[test]
fn clear_empties_the_cache_but_keeps_counters() {
    let mut dac = cache(Policy::Adaptive, 10 * ve(10));
    for k in 0..20u8 {
        dac.fill(&[k], &val(10, k), sc(u64::from(k)));
        dac.lookup(&[k]);
    }
    let before = dac.stats();
    dac.clear();
    let st = dac.stats();
    assert_eq!((st.values, st.shortcuts, st.used_bytes), (0, 0, 0));
    assert_eq!(
        st.value_hits + st.shortcut_hits,
        before.value_hits + before.shortcut_hits
    );
    assert_eq!(dac.lookup(&[0]), Lookup::Miss);
    dac.fill(&[0], &val(10, 0), sc(0));
    assert_eq!(dac.contains(&[0]), V);
    dac.check_invariants();
}

#[test]
fn retain_drops_rejected_keys_of_both_kinds_and_frees_their_bytes() {
    for policy in [Policy::Adaptive, Policy::Static { value_percent: 50 }] {
        let mut dac = cache(policy, 4 * ve(10) + 4 * se());
        dac.fill(&[1], &val(10, 1), sc(1));
        dac.fill(&[2], &val(10, 2), sc(2));
        fill_shortcuts(&mut dac, &[3, 4]);
        let before = dac.stats().used_bytes;
        assert_eq!(dac.retain(|k| k[0] % 2 == 1), 2, "{policy:?}");
        assert_eq!(kinds(&dac, &[1, 2, 3, 4]), vec![V, None, S, None]);
        assert_eq!(dac.stats().used_bytes, before - ve(10) - se());
        assert_eq!(dac.len(), 2);
        // The dropped keys can be cached again.
        dac.fill(&[2], &val(10, 2), sc(2));
        assert_eq!(dac.contains(&[2]), V);
    }
}

#[test]
fn a_record_of_absence_answers_until_the_key_is_written() {
    for policy in [Policy::Adaptive, Policy::Static { value_percent: 50 }] {
        let mut dac = cache(policy, 8 * ve(8));
        assert_eq!(dac.lookup(b"k"), Lookup::Miss);
        dac.fill_absent(b"k");
        assert_eq!(dac.contains(b"k"), Some(EntryKind::Absent));
        assert_eq!(dac.lookup(b"k"), Lookup::Absent);
        let st = dac.stats();
        assert_eq!(
            (st.absent_hits, st.absents, st.values, st.misses),
            (1, 1, 0, 1)
        );
        assert_eq!(st.value_bytes, ve(0));
        // An empty value written over it is a value, not a record of absence.
        dac.write(b"k", b"", sc(1));
        assert_eq!(
            dac.lookup(b"k"),
            Lookup::Value {
                value: b"",
                shortcut: sc(1)
            }
        );
        assert_eq!((dac.stats().absents, dac.stats().values), (0, 1));
        dac.invalidate(b"k");
        dac.fill_absent(b"k");
        dac.write(b"k", b"value", sc(2));
        assert_eq!(
            dac.lookup(b"k"),
            Lookup::Value {
                value: b"value",
                shortcut: sc(2)
            }
        );
        // A key cached meanwhile keeps its entry.
        dac.fill_absent(b"k");
        assert_eq!(dac.contains(b"k"), Some(EntryKind::Value));
        dac.invalidate(b"k");
        dac.fill_absent(b"k");
        dac.invalidate(b"k");
        assert_eq!(dac.lookup(b"k"), Lookup::Miss);
        assert_eq!(dac.stats().absents, 0);
        dac.check_invariants();
    }
}

#[test]
fn a_record_of_absence_takes_only_free_space_and_is_dropped_not_demoted() {
    let mut dac = cache(Policy::Adaptive, 2 * ve(8));
    dac.fill(b"a", &val(8, 1), sc(1));
    dac.fill(b"b", &val(8, 2), sc(2));
    // No room: nothing is demoted for it, and it is not recorded.
    dac.fill_absent(b"c");
    assert_eq!(dac.contains(b"c"), None);
    let st = dac.stats();
    assert_eq!((st.values, st.demotions, st.evictions), (2, 0, 0));
    dac.check_invariants();

    dac.set_budget(2 * ve(8) + ve(0));
    dac.fill_absent(b"c");
    assert_eq!(dac.contains(b"c"), Some(EntryKind::Absent));
    // The record is the least recently used value entry once a and b are read; a new key needing its room (as a
    // shortcut, the adaptive policy's way with no free space) drops it rather than turning it into a shortcut to
    // nothing.
    assert!(matches!(dac.lookup(b"a"), Lookup::Value { .. }));
    assert!(matches!(dac.lookup(b"b"), Lookup::Value { .. }));
    dac.fill(b"d", &val(0, 0), sc(4));
    assert_eq!(dac.contains(b"c"), None);
    assert_eq!(dac.contains(b"d"), Some(EntryKind::Shortcut));
    assert_eq!(dac.stats().values, 2);
    let st = dac.stats();
    assert_eq!((st.absents, st.demotions, st.evictions), (0, 0, 1));
    dac.check_invariants();
}
