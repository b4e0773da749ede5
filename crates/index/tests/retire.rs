//! Retired tables: kept through their grace period, freed after it, never while current.

mod common;

use std::time::{Duration, Instant};

use common::*;
use dinomo_index::{Index, IndexConfig};

fn allocated(pool: &dinomo_pool::Pool, offset: u64) -> bool {
    pool.allocated().iter().any(|e| e.offset == offset)
}

/// An index on `pool` that resizes early and keeps replaced tables for `grace`.
fn index_with_grace(pool: &std::sync::Arc<dinomo_pool::Pool>, grace: Duration) -> Index {
    Index::create(
        pool.clone(),
        &IndexConfig {
            retire_grace: grace,
            ..tiny(0.25)
        },
    )
    .unwrap()
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
    let index = index_with_grace(&pool, grace);
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

/// Inserts keys from `*next` until an insert is refused for lack of space; returns the refusal.
fn fill_until_refused(index: &Index, next: &mut u64) -> dinomo_index::IndexError {
    loop {
        let k = *next;
        match index.upsert(hash_of(k), eref(k, 1), |e| key_of(e) == k) {
            Ok(_) => *next += 1,
            Err(e) => return e,
        }
        assert!(*next < 1_000_000, "never ran out of space");
    }
}

/// A pool too full for the next table frees the tables still in their grace period rather than refuse: lookups
/// never trust a table that stopped being current, so the grace only spares them a restart. A long grace then
/// costs no capacity: the index holds as many keys as with no grace at all.
#[test]
fn a_full_pool_frees_tables_in_their_grace_before_refusing_growth() {
    let capacity = |grace: Duration| {
        // Segments of 1 MiB, as a memory node's log segments are large next to the tables: each table takes one,
        // and a retired one keeps it.
        let pool = std::sync::Arc::new(dinomo_pool::Pool::anonymous(12 << 20, 1 << 20).unwrap());
        let index = index_with_grace(&pool, grace);
        let mut next = 0;
        let err = fill_until_refused(&index, &mut next);
        assert!(
            matches!(err, dinomo_index::IndexError::OutOfSpace { .. }),
            "{err}"
        );
        for k in (0..next).step_by(7) {
            assert_eq!(index.get(hash_of(k), |e| key_of(e) == k), Some(eref(k, 1)));
        }
        (next, index.stats())
    };
    let (without_grace, _) = capacity(Duration::ZERO);
    let (with_grace, stats) = capacity(Duration::from_secs(3600));
    assert!(stats.resizes >= 5, "{stats:?}");
    assert_eq!(with_grace, without_grace, "{stats:?}");

    // `reclaim_retired_now` frees within the grace, and never the current table.
    let pool = anon_pool(32 << 20);
    let index = index_with_grace(&pool, Duration::from_secs(3600));
    let mut next = 0;
    let mut old = Vec::new();
    for _ in 0..3 {
        old.push(index.current().table);
        force_resize(&index, &mut next);
    }
    assert_eq!(index.reclaim_retired(), 0);
    assert!(old.iter().all(|&t| allocated(&pool, t)));
    assert_eq!(index.reclaim_retired_now(), 3);
    assert!(old.iter().all(|&t| !allocated(&pool, t)));
    assert!(allocated(&pool, index.current().table));
    assert_eq!(index.stats().retired_tables, 0);
    assert_eq!(index.reclaim_retired_now(), 0);
    for k in 0..next {
        assert_eq!(index.get(hash_of(k), |e| key_of(e) == k), Some(eref(k, 1)));
    }
}

/// A table that could not grow refuses new keys; once space is back and the retry pause has passed, `check_room`
/// grows it itself. Nothing else would: the merges that grow tables follow the segment grants it refuses.
#[test]
fn check_room_grows_a_blocked_table_once_space_returns() {
    let pool = anon_pool(1 << 20);
    let index = Index::create(pool.clone(), &tiny(1.0)).unwrap();
    // Leave room for a few small tables only.
    let free = pool.space().free_bytes();
    let filler = pool
        .alloc_bytes(free - 48 * 4096, dinomo_log::tags::LOG_SEGMENT)
        .unwrap();
    let mut next = 0u64;
    while index.check_room().is_ok() {
        let _ = index.grow_early();
        index
            .upsert(hash_of(next), eref(next, 1), |e| key_of(e) == next)
            .unwrap();
        next += 1;
        assert!(next < 1_000_000, "the table never ran out of room");
    }
    // Record a failed growth now, so that the retry pause starts here.
    let failed_at = Instant::now();
    assert!(matches!(
        index.grow_early(),
        Err(dinomo_index::IndexError::OutOfSpace { .. })
    ));
    let blocked = index.stats();
    pool.free(filler.offset).unwrap();
    // Within the retry pause the refusal stands, and nothing is walked or built.
    let within_pause = index.check_room();
    if failed_at.elapsed() < Duration::from_millis(900) {
        assert!(
            matches!(
                within_pause,
                Err(dinomo_index::IndexError::OutOfSpace { .. })
            ),
            "{within_pause:?}"
        );
        assert_eq!(index.stats().resizes, blocked.resizes);
    }
    std::thread::sleep(Duration::from_millis(1100));
    index.check_room().unwrap();
    let grown = index.stats();
    assert_eq!(grown.resizes, blocked.resizes + 1);
    assert!(grown.buckets > blocked.buckets);
    for k in 0..next {
        assert_eq!(index.get(hash_of(k), |e| key_of(e) == k), Some(eref(k, 1)));
    }
}
