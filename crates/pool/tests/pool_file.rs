//! Pool files: create, reopen, reject bad files untouched, allocator state across restarts.

use dinomo_pool::{PAGE, PersistMode, Pool, PoolError, PoolOptions, ROOT_SLOTS};
use proptest::prelude::*;

fn opts(size: u64, seg: u64) -> PoolOptions {
    PoolOptions {
        size,
        segment_size: seg,
        persist: PersistMode::Volatile,
    }
}

#[test]
fn create_write_reopen_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.pool");
    let (ext, big) = {
        let pool = Pool::create(&path, &opts(1 << 22, 1 << 16)).unwrap();
        let ext = pool.alloc(1, 9).unwrap();
        let big = pool.alloc(3, 10).unwrap();
        pool.write(ext.offset, b"hello pool").unwrap();
        pool.set_root(3, ext.offset).unwrap();
        pool.atomic_u64(big.offset)
            .unwrap()
            .fetch_add(41, std::sync::atomic::Ordering::SeqCst);
        (ext, big)
    };
    let (pool, report) = Pool::open(&path, PersistMode::Volatile).unwrap();
    assert!(report.was_clean);
    assert_eq!(report.generation, 2);
    let mut buf = [0u8; 10];
    pool.read(ext.offset, &mut buf).unwrap();
    assert_eq!(&buf, b"hello pool");
    assert_eq!(pool.root(3).unwrap(), ext.offset);
    assert_eq!(
        pool.atomic_u64(big.offset)
            .unwrap()
            .load(std::sync::atomic::Ordering::SeqCst),
        41
    );
    assert_eq!(pool.allocated(), vec![ext, big]);
    assert_eq!(pool.space().free_segments, pool.layout().segment_count - 4);
}

/// Child half of `unclean_shutdown_is_reported`: runs only when re-executed with the pool path in the environment.
#[test]
fn crash_child() {
    let Ok(path) = std::env::var("DINOMO_POOL_CRASH_CHILD") else {
        return;
    };
    let pool = Pool::create(&path, &opts(1 << 22, 1 << 16)).unwrap();
    let e = pool.alloc(2, 1).unwrap();
    pool.write(e.offset, b"before the crash").unwrap();
    // Die without closing, as a killed process does.
    std::process::abort();
}

#[test]
fn unclean_shutdown_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.pool");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env("DINOMO_POOL_CRASH_CHILD", &path)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child must die");
    let (pool, report) = Pool::open(&path, PersistMode::Volatile).unwrap();
    assert!(!report.was_clean);
    let allocated = pool.allocated();
    assert_eq!(allocated.len(), 1);
    let mut b = [0u8; 16];
    pool.read(allocated[0].offset, &mut b).unwrap();
    assert_eq!(&b, b"before the crash");
}

/// A pool closed while the layers above recover in it stays marked as after a crash: a start that fails halfway
/// must not make the next start, or a check, take the pool for cleanly closed. Once the recovery ends, a close
/// marks it clean again.
#[test]
fn a_pool_closed_during_a_recovery_stays_marked_unclean() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.pool");
    {
        let pool = Pool::create(&path, &opts(1 << 22, 1 << 16)).unwrap();
        pool.begin_recovery();
        let ext = pool.alloc(1, 9).unwrap();
        pool.write(ext.offset, b"half recovered").unwrap();
    }
    let (pool, report) = Pool::open(&path, PersistMode::Volatile).unwrap();
    assert!(!report.was_clean, "a recovery never ended");
    // The data written before the close is there all the same.
    let mut b = [0u8; 14];
    pool.read(pool.allocated()[0].offset, &mut b).unwrap();
    assert_eq!(&b, b"half recovered");
    pool.begin_recovery();
    pool.end_recovery();
    drop(pool);
    let (_, report) = Pool::open(&path, PersistMode::Volatile).unwrap();
    assert!(report.was_clean, "the recovery ended before the close");
}

/// In the `periodic` persist mode pages reach the file when the background msync writes them, so a power loss can
/// keep the allocation table's page holding an extent's head and lose the next, holding its continuations. The
/// head is the commit point: the open writes the continuations again instead of refusing the pool.
#[test]
fn an_extent_whose_continuations_read_free_is_completed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.pool");
    let (ext, layout) = {
        let pool = Pool::create(&path, &opts(1 << 22, 1 << 16)).unwrap();
        let ext = pool.alloc(3, 9).unwrap();
        pool.write(ext.offset, b"three segments").unwrap();
        (ext, *pool.layout())
    };
    // The power loss: the continuation words of the extent never reached the file.
    let mut bytes = std::fs::read(&path).unwrap();
    let head = layout.segment_index(ext.offset).unwrap();
    for i in head + 1..head + 3 {
        let at = (layout.alloc_table_offset + i * 8) as usize;
        bytes[at..at + 8].fill(0);
    }
    std::fs::write(&path, &bytes).unwrap();
    {
        let (pool, report) = Pool::open(&path, PersistMode::Volatile).unwrap();
        assert_eq!(report.completed_continuations, 2);
        assert_eq!(pool.allocated(), vec![ext]);
        let mut b = [0u8; 14];
        pool.read(ext.offset, &mut b).unwrap();
        assert_eq!(&b, b"three segments");
        // Its segments are not handed out again.
        let next = pool.alloc(2, 9).unwrap();
        assert!(next.offset >= ext.offset + ext.len || next.offset + next.len <= ext.offset);
    }
    let (_, report) = Pool::open(&path, PersistMode::Volatile).unwrap();
    assert_eq!(
        report.completed_continuations, 0,
        "the table was written back whole"
    );
}

#[test]
fn second_open_of_a_locked_pool_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.pool");
    let _pool = Pool::create(&path, &opts(1 << 22, 1 << 16)).unwrap();
    let err = Pool::open(&path, PersistMode::Volatile).unwrap_err();
    assert!(err.to_string().contains("locked"), "{err}");
}

/// A snapshot reads what the file holds, its writes (an allocation, data, the clean-shutdown flag) never reach
/// the file, it shares its lock with other snapshots, and it excludes a memory node both ways.
#[test]
fn a_snapshot_reads_the_file_and_never_changes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.pool");
    let ext = {
        let pool = Pool::create(&path, &opts(1 << 22, 1 << 16)).unwrap();
        let ext = pool.alloc(1, 9).unwrap();
        pool.write(ext.offset, b"on file").unwrap();
        let err = Pool::open_snapshot(&path).unwrap_err();
        assert!(err.to_string().contains("locked"), "{err}");
        ext
    };
    let before = std::fs::read(&path).unwrap();
    {
        let (snap, report) = Pool::open_snapshot(&path).unwrap();
        assert!(report.was_clean);
        let mut buf = [0u8; 7];
        snap.read(ext.offset, &mut buf).unwrap();
        assert_eq!(&buf, b"on file");
        assert_eq!(snap.allocated(), vec![ext]);
        let second = Pool::open_snapshot(&path).unwrap().0;
        let err = Pool::open(&path, PersistMode::Volatile).unwrap_err();
        assert!(err.to_string().contains("locked"), "{err}");
        snap.write(ext.offset, b"changed").unwrap();
        let more = snap.alloc(2, 3).unwrap();
        snap.write(more.offset, &[7; 64]).unwrap();
        snap.set_root(4, more.offset).unwrap();
        snap.persist(0, snap.len());
        snap.sync_all().unwrap();
        second.read(ext.offset, &mut buf).unwrap();
        assert_eq!(
            &buf, b"on file",
            "another snapshot sees the file, not this one's writes"
        );
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the file is untouched"
    );
    let (pool, report) = Pool::open(&path, PersistMode::Volatile).unwrap();
    assert_eq!(report.generation, 2, "snapshots do not count as opens");
    assert_eq!(pool.allocated(), vec![ext]);
}

#[test]
fn create_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.pool");
    drop(Pool::create(&path, &opts(1 << 22, 1 << 16)).unwrap());
    assert!(matches!(
        Pool::create(&path, &opts(1 << 22, 1 << 16)),
        Err(PoolError::AlreadyExists(_))
    ));
}

fn assert_rejected_untouched(path: &std::path::Path, check: impl Fn(&PoolError) -> bool) {
    let before = std::fs::read(path).unwrap();
    let err = Pool::open(path, PersistMode::Volatile).unwrap_err();
    assert!(check(&err), "unexpected error: {err}");
    assert_eq!(
        std::fs::read(path).unwrap(),
        before,
        "a rejected file must not change"
    );
}

#[test]
fn rejects_foreign_truncated_and_corrupt_files() {
    let dir = tempfile::tempdir().unwrap();
    // Not a pool at all.
    let other = dir.path().join("other.pool");
    std::fs::write(&other, vec![7u8; 3 * PAGE as usize]).unwrap();
    assert_rejected_untouched(&other, |e| matches!(e, PoolError::NotAPool { .. }));
    // Empty file.
    let empty = dir.path().join("empty.pool");
    std::fs::write(&empty, b"").unwrap();
    assert_rejected_untouched(&empty, |e| matches!(e, PoolError::NotAPool { .. }));

    let path = dir.path().join("a.pool");
    drop(Pool::create(&path, &opts(1 << 22, 1 << 16)).unwrap());
    let good = std::fs::read(&path).unwrap();

    // Future format version: a whole header (its checksum matches) of another version.
    let mut v = good.clone();
    v[8] = 99;
    let crc = crc32c::crc32c(&v[..120]);
    v[120..124].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &v).unwrap();
    assert_rejected_untouched(&path, |e| {
        matches!(e, PoolError::UnsupportedVersion { found: 99, .. })
    });
    // A flipped bit in the version field is damage, not another format.
    let mut v = good.clone();
    v[8] ^= 0x04;
    std::fs::write(&path, &v).unwrap();
    assert_rejected_untouched(
        &path,
        |e| matches!(e, PoolError::CorruptSuperblock { reason, .. } if reason.contains("version field reads 5")),
    );

    // A flipped bit in the header.
    let mut v = good.clone();
    v[30] ^= 0x10;
    std::fs::write(&path, &v).unwrap();
    assert_rejected_untouched(&path, |e| matches!(e, PoolError::CorruptSuperblock { .. }));

    // Truncated file.
    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    assert_rejected_untouched(&path, |e| matches!(e, PoolError::CorruptSuperblock { .. }));

    // Garbage in the allocation table.
    let mut v = good.clone();
    let table = 2 * PAGE as usize;
    v[table..table + 8].copy_from_slice(&0xdead_beef_dead_beefu64.to_le_bytes());
    std::fs::write(&path, &v).unwrap();
    assert_rejected_untouched(&path, |e| matches!(e, PoolError::CorruptAllocTable { .. }));

    // And the good image still opens.
    std::fs::write(&path, &good).unwrap();
    Pool::open(&path, PersistMode::Volatile).unwrap();
}

#[test]
fn interrupted_allocation_is_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.pool");
    drop(Pool::create(&path, &opts(1 << 22, 1 << 16)).unwrap());
    // Write the continuation words of a 3-segment extent at segments 5..8 without its head, as a crash between the
    // two steps of `alloc` leaves them.
    let mut v = std::fs::read(&path).unwrap();
    let table = 2 * PAGE as usize;
    for (j, back) in [(6usize, 1u64), (7, 2)] {
        let word = (2u64 << 62) | back;
        v[table + j * 8..table + j * 8 + 8].copy_from_slice(&word.to_le_bytes());
    }
    std::fs::write(&path, &v).unwrap();
    let (pool, report) = Pool::open(&path, PersistMode::Volatile).unwrap();
    assert_eq!(report.reclaimed_orphans, 2);
    assert_eq!(pool.space().free_segments, pool.layout().segment_count);
    // The reclaimed segments can be allocated again.
    let all = pool.alloc(pool.layout().segment_count, 1).unwrap();
    assert_eq!(all.segments, pool.layout().segment_count);
}

#[test]
fn bounds_alignment_and_roots_are_checked() {
    let pool = Pool::anonymous(1 << 20, PAGE).unwrap();
    let len = pool.len();
    assert!(matches!(
        pool.read(len - 4, &mut [0u8; 8]),
        Err(PoolError::OutOfBounds { .. })
    ));
    assert!(matches!(
        pool.write(u64::MAX - 2, b"abcd"),
        Err(PoolError::OutOfBounds { .. })
    ));
    assert!(matches!(
        pool.atomic_u64(pool.layout().data_offset + 4),
        Err(PoolError::Misaligned(_))
    ));
    assert!(matches!(pool.root(ROOT_SLOTS), Err(PoolError::BadRoot(_))));
    assert_eq!(pool.cas_root(1, 0, 5).unwrap(), 0);
    assert_eq!(pool.cas_root(1, 0, 6).unwrap(), 5);
    assert_eq!(pool.root(1).unwrap(), 5);
    assert!(matches!(
        pool.free(pool.layout().data_offset),
        Err(PoolError::NotAllocated(_))
    ));
    assert!(matches!(pool.free(12345), Err(PoolError::NotAllocated(_))));
}

#[test]
fn out_of_space_is_an_error() {
    let pool = Pool::anonymous(1 << 20, 1 << 16).unwrap();
    let n = pool.layout().segment_count;
    let a = pool.alloc(n, 1).unwrap();
    assert!(matches!(
        pool.alloc(1, 1),
        Err(PoolError::OutOfSpace { .. })
    ));
    assert!(matches!(
        pool.alloc(0, 1),
        Err(PoolError::OutOfSpace { .. })
    ));
    pool.free(a.offset).unwrap();
    pool.alloc(1, 1).unwrap();
}

#[test]
fn every_persist_mode_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    for (i, mode) in [
        PersistMode::Volatile,
        PersistMode::Periodic { interval_ms: 5 },
        PersistMode::Durable,
        PersistMode::Dax,
    ]
    .into_iter()
    .enumerate()
    {
        let path = dir.path().join(format!("{i}.pool"));
        let mut o = opts(1 << 21, 1 << 16);
        o.persist = mode;
        let pool = Pool::create(&path, &o).unwrap();
        let e = pool.alloc(1, 2).unwrap();
        pool.write(e.offset + 100, b"durable?").unwrap();
        pool.persist(e.offset + 100, 8);
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(pool);
        let (pool, _) = Pool::open(&path, mode).unwrap();
        let mut b = [0u8; 8];
        pool.read(e.offset + 100, &mut b).unwrap();
        assert_eq!(&b, b"durable?", "{mode:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Random alloc/free sequences survive close and reopen: the allocated set is exactly what was left live.
    #[test]
    fn allocator_state_survives_reopen(ops in proptest::collection::vec((any::<bool>(), 1u64..4, any::<u16>(), any::<prop::sample::Index>()), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.pool");
        let pool = Pool::create(&path, &opts(1 << 21, PAGE * 4)).unwrap();
        let mut live = Vec::new();
        for (alloc, n, tag, pick) in ops {
            if alloc || live.is_empty() {
                if let Ok(e) = pool.alloc(n, tag) { live.push(e); }
            } else {
                let e = live.swap_remove(pick.index(live.len()));
                pool.free(e.offset).unwrap();
            }
        }
        drop(pool);
        let (pool, report) = Pool::open(&path, PersistMode::Volatile).unwrap();
        prop_assert!(report.was_clean);
        live.sort_by_key(|e| e.offset);
        prop_assert_eq!(pool.allocated(), live.clone());
        let used: u64 = live.iter().map(|e| e.segments).sum();
        prop_assert_eq!(pool.space().free_segments, pool.layout().segment_count - used);
    }
}

/// A child forked by another thread shares our descriptors, and with them the pool lock, until it execs. Reopening
/// a pool while other threads spawn processes must not report it as locked.
#[test]
fn reopen_while_other_threads_spawn_processes() {
    let dir = tempfile::tempdir().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spawner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while !stop.load(std::sync::atomic::Ordering::Relaxed)
                && std::time::Instant::now() < deadline
            {
                let _ = std::process::Command::new("true").status();
            }
        })
    };
    for i in 0..200 {
        let path = dir.path().join(format!("{i}.pool"));
        drop(Pool::create(&path, &opts(1 << 20, 1 << 16)).unwrap());
        let reopened = Pool::open(&path, PersistMode::Volatile);
        assert!(reopened.is_ok(), "reopen {i}: {}", reopened.unwrap_err());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    spawner.join().unwrap();
}

/// High allocations take the highest free run; a kept run is skipped by low allocations only, until its guard
/// drops; both kinds of extent are found again after a reopen.
#[test]
fn high_allocations_and_kept_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("high.pool");
    let (low, high, segments) = {
        let pool = Pool::create(&path, &opts(1 << 22, 1 << 16)).unwrap();
        let n = pool.layout().segment_count;
        let at = |i: u64| pool.layout().segment_offset(i);
        let high = pool.alloc_high(3, 7).unwrap();
        assert_eq!(high.offset, at(n - 3));
        let low = pool.alloc(1, 8).unwrap();
        assert_eq!(low.offset, at(0));
        // Keep segments 1..5 for a high allocation: low ones go past them, high ones still take the top.
        let kept = pool.keep_for_high(at(1), 4).unwrap();
        assert!(
            pool.keep_for_high(at(10), 1).is_none(),
            "one kept run at a time"
        );
        let past = pool.alloc(2, 8).unwrap();
        assert_eq!(past.offset, at(5));
        let top = pool.alloc_bytes_high(1 << 16, 7).unwrap();
        assert_eq!(top.offset, at(n - 4));
        drop(kept);
        assert_eq!(pool.alloc(1, 8).unwrap().offset, at(1));
        assert!(
            pool.keep_for_high(at(0) + 1, 1).is_none(),
            "not a segment's start"
        );
        pool.free(past.offset).unwrap();
        pool.free(top.offset).unwrap();
        (low, high, n)
    };
    let (pool, _) = Pool::open(&path, PersistMode::Volatile).unwrap();
    let allocated = pool.allocated();
    assert!(allocated.contains(&low) && allocated.contains(&high));
    assert_eq!(pool.space().free_segments, segments - 5);
}
