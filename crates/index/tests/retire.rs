//! Retired tables: kept through their grace period, freed after it, never while current.

mod common;

use std::time::{Duration, Instant};

use common::*;
use dinomo_index::{Index, IndexConfig};

fn allocated(pool: &dinomo_pool::Pool, offset: u64) -> bool {
    pool.allocated().iter().any(|e| e.offset == offset)
}

/// Inserts keys from `*next` until the table is replaced.
fn force_resize(index: &Index, next: &mut u64) {
    let before = index.stats().resizes;
    while index.stats().resizes == before {
        let k = *next;
        *next += 1;
        index
            .upsert(hash_of(k), eref(k, 1), |e| key_of(e) == k)
            .unwrap();
    }
}

#[test]
fn retired_tables_are_freed_after_the_grace_and_not_before() {
    let pool = anon_pool(32 << 20);
    let grace = Duration::from_millis(400);
    let index = Index::create(
        pool.clone(),
        &IndexConfig {
            retire_grace: grace,
            ..tiny(0.25)
        },
    )
    .unwrap();
    let mut next = 0;
    let old = index.current().table;
    let retired_at = Instant::now();
    force_resize(&index, &mut next);
    assert_ne!(index.current().table, old);
    assert_eq!(index.stats().retired_tables, 1);
    assert!(allocated(&pool, old));
    // Before the grace: nothing is freed, neither explicitly nor by writers.
    assert_eq!(index.reclaim_retired(), 0);
    index
        .upsert(hash_of(next), eref(next, 1), |_| false)
        .unwrap();
    next += 1;
    if retired_at.elapsed() < grace {
        assert!(allocated(&pool, old));
        assert_eq!(index.stats().retired_tables, 1);
    }
    std::thread::sleep(grace + Duration::from_millis(50));
    assert_eq!(index.reclaim_retired(), 1);
    assert!(!allocated(&pool, old));
    assert_eq!(index.stats().retired_tables, 0);
    // The current table is never freed.
    assert!(allocated(&pool, index.current().table));

    // Writers reclaim opportunistically once the grace has passed.
    let old = index.current().table;
    force_resize(&index, &mut next);
    assert!(allocated(&pool, old));
    std::thread::sleep(grace + Duration::from_millis(50));
    index
        .upsert(hash_of(next), eref(next, 1), |_| false)
        .unwrap();
    assert!(!allocated(&pool, old));
    assert_eq!(index.stats().retired_tables, 0);
}

#[test]
fn zero_grace_frees_at_once_and_stats_add_up() {
    let pool = anon_pool(32 << 20);
    let index = Index::create(pool.clone(), &tiny(0.25)).unwrap();
    let mut next = 0;
    for _ in 0..5 {
        let old = index.current().table;
        force_resize(&index, &mut next);
        assert!(!allocated(&pool, old));
    }
    let s = index.stats();
    assert_eq!(s.resizes, 5);
    assert_eq!(s.retired_tables, 0);
    assert_eq!(s.entries, next);
    assert_eq!(s.generation, 6);
    assert!(s.overflow_used <= s.overflow_capacity);
    assert_eq!(s.table_bytes, 64 + 64 * (s.buckets + s.overflow_capacity));
}

#[test]
fn full_pool_fills_the_table_then_reports_out_of_space() {
    // About 250 segments of 4 KiB: tables stop growing long before keys run out.
    let pool = anon_pool(1 << 20);
    let index = Index::create(pool.clone(), &tiny(0.25)).unwrap();
    let mut inserted = 0u64;
    let err = loop {
        let k = inserted;
        match index.upsert(hash_of(k), eref(k, 1), |e| key_of(e) == k) {
            Ok(None) => inserted += 1,
            Ok(Some(_)) => unreachable!("fresh key"),
            Err(e) => break e,
        }
        assert!(inserted < 1_000_000, "never ran out of space");
    };
    assert!(
        matches!(err, dinomo_index::IndexError::OutOfSpace { .. }),
        "{err}"
    );
    let s = index.stats();
    // The last table was filled past max_load before giving up.
    assert!(s.entries as f64 > 0.75 * (3 * s.buckets) as f64, "{s:?}");
    assert_eq!(s.entries, inserted);
    for k in (0..inserted).step_by(11) {
        assert_eq!(index.get(hash_of(k), |e| key_of(e) == k), Some(eref(k, 1)));
    }
    // Updates and removes still work, and a removed key's slot can be reused.
    let k = 0;
    assert_eq!(
        index
            .upsert(hash_of(k), eref(k, 2), |e| key_of(e) == k)
            .unwrap(),
        Some(eref(k, 1))
    );
    assert_eq!(
        index.remove(hash_of(k), |e| key_of(e) == k),
        Some(eref(k, 2))
    );
    assert_eq!(
        index
            .upsert(hash_of(k), eref(k, 3), |e| key_of(e) == k)
            .unwrap(),
        None
    );
}

/// `grow_early` grows a table close to its load limit and leaves one well below it alone; `check_room` lets new
/// keys in until the table is close to its limit and cannot grow, and changes nothing.
#[test]
fn a_table_grows_early_and_refuses_new_keys_while_it_cannot() {
    let pool = anon_pool(32 << 20);
    let index = Index::create(
        pool.clone(),
        &IndexConfig {
            initial_buckets: 64,
            ..tiny(1.0)
        },
    )
    .unwrap();
    let slots = |i: &Index| 3 * i.stats().buckets;
    let insert = |index: &Index, k: u64| {
        index
            .upsert(hash_of(k), eref(k, 1), |e| key_of(e) == k)
            .unwrap();
    };
    // Well below the limit: nothing happens.
    let mut next = 0u64;
    while (next as f64) < 0.5 * slots(&index) as f64 {
        insert(&index, next);
        next += 1;
    }
    index.grow_early().unwrap();
    index.check_room().unwrap();
    assert_eq!(index.stats().resizes, 0);
    // Within an eighth of the limit (below it, where an insert would grow the table): room is there to grow
    // into, and it grows now.
    while (next as f64) < 0.70 * slots(&index) as f64 {
        insert(&index, next);
        next += 1;
    }
    assert_eq!(index.stats().resizes, 0);
    index.check_room().unwrap();
    index.grow_early().unwrap();
    assert_eq!(index.stats().resizes, 1);
    for k in (0..next).step_by(7) {
        assert_eq!(index.get(hash_of(k), |e| key_of(e) == k), Some(eref(k, 1)));
    }

    // A pool with no room for the next table: new keys are refused before the load limit.
    let small = anon_pool(1 << 20);
    let index = Index::create(small.clone(), &tiny(1.0)).unwrap();
    let mut next = 0u64;
    while index.check_room().is_ok() {
        let _ = index.grow_early();
        insert(&index, next);
        next += 1;
        assert!(
            next < 1_000_000,
            "the pool never ran out of room for the table"
        );
    }
    let before = index.stats();
    for _ in 0..2 {
        assert!(matches!(
            index.check_room(),
            Err(dinomo_index::IndexError::OutOfSpace { .. })
        ));
    }
    let after = index.stats();
    assert_eq!(
        (after.entries, after.resizes, after.table_bytes),
        (before.entries, before.resizes, before.table_bytes)
    );
    assert!(
        (after.entries as f64) < 0.75 * (3 * after.buckets) as f64,
        "{after:?}"
    );
    // The slots left still take keys already on their way.
    for k in next..next + after.buckets / 8 {
        insert(&index, k);
    }
    for k in (0..next).step_by(7) {
        assert_eq!(index.get(hash_of(k), |e| key_of(e) == k), Some(eref(k, 1)));
    }
}
