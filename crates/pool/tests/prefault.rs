//! The prefaulter: the lowest free segments are mapped before anyone writes them, allocations top it up, and
//! faulting in changes no byte.

use std::time::{Duration, Instant};

use dinomo_pool::{PAGE, PersistMode, Pool, PoolOptions};

const SEGMENT: u64 = 1 << 20;

fn new_pool(dir: &tempfile::TempDir) -> Pool {
    Pool::create(
        dir.path().join("pool"),
        &PoolOptions {
            size: 32 * SEGMENT,
            segment_size: SEGMENT,
            persist: PersistMode::Volatile,
        },
    )
    .unwrap()
}

/// How many pages of the `len` bytes at pool offset `offset` are mapped in this process's page tables: those a
/// write reaches without a page fault. (Not `mincore`, which tells whether the file's pages are cached: the kernel's
/// read-around caches megabytes of a file around any fault, mapped or not.)
fn mapped_pages(pool: &Pool, offset: u64, len: u64) -> usize {
    use std::os::unix::fs::FileExt;
    let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
    let first = (pool.as_ptr() as u64 + offset) / PAGE;
    (0..len.div_ceil(PAGE))
        .filter(|i| {
            let mut entry = [0u8; 8];
            pagemap.read_exact_at(&mut entry, (first + i) * 8).unwrap();
            // Bit 63: present.
            u64::from_le_bytes(entry) >> 63 == 1
        })
        .count()
}

fn wait_for_prefaulted(pool: &Pool, segments: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while pool.prefaulted_segments() < segments {
        assert!(
            Instant::now() < deadline,
            "only {} of {segments} segments were prefaulted",
            pool.prefaulted_segments()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn the_lowest_free_segments_are_faulted_in_and_allocations_top_them_up() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(&dir);
    let first = pool.layout().segment_offset(0);
    let seg = |i: u64| pool.layout().segment_offset(i);
    let all = (SEGMENT / PAGE) as usize;
    assert_eq!(
        mapped_pages(&pool, first, 8 * SEGMENT),
        0,
        "nothing of a new pool's data area is mapped"
    );

    assert!(pool.start_prefaulter(2 * SEGMENT).unwrap());
    wait_for_prefaulted(&pool, 2);
    assert_eq!(mapped_pages(&pool, seg(0), SEGMENT), all);
    assert_eq!(mapped_pages(&pool, seg(1), SEGMENT), all);
    // Only two ahead: a read fault also maps the cached pages around it (the kernel's fault-around, 64 KiB by
    // default), so the start of the next segment may be mapped, never a whole segment more.
    assert!(mapped_pages(&pool, seg(2), SEGMENT) < all / 2);
    assert_eq!(
        mapped_pages(&pool, seg(3), 5 * SEGMENT),
        0,
        "only two ahead"
    );

    // Each low allocation takes a faulted-in segment, and the next free one is faulted in behind it.
    for i in 0..3 {
        let e = pool.alloc(1, 1).unwrap();
        assert_eq!(e.offset, seg(i));
    }
    wait_for_prefaulted(&pool, 5);
    assert_eq!(mapped_pages(&pool, seg(3), 2 * SEGMENT), 2 * all);
    assert!(mapped_pages(&pool, seg(5), SEGMENT) < all / 2);
    assert_eq!(mapped_pages(&pool, seg(6), 5 * SEGMENT), 0);

    // A high allocation (index tables) is not where the log goes next: nothing more is faulted in.
    pool.alloc_high(2, 2).unwrap();
    // A freed segment below the others is handed out next; its pages are in memory already.
    pool.free(seg(1)).unwrap();
    assert_eq!(pool.alloc(1, 1).unwrap().offset, seg(1));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(pool.prefaulted_segments(), 5);

    assert!(
        !pool.start_prefaulter(SEGMENT).unwrap(),
        "one prefaulter per pool"
    );
}

#[test]
fn faulting_in_changes_no_byte() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(&dir);
    let seg0 = pool.layout().segment_offset(0);
    let pattern: Vec<u8> = (0..3 * PAGE).map(|i| (i % 251) as u8).collect();
    pool.write(seg0 + PAGE / 2, &pattern).unwrap();
    assert!(pool.start_prefaulter(4 * SEGMENT).unwrap());
    wait_for_prefaulted(&pool, 4);
    let mut back = vec![0u8; pattern.len()];
    pool.read(seg0 + PAGE / 2, &mut back).unwrap();
    assert_eq!(back, pattern);
    let mut zeros = vec![1u8; PAGE as usize];
    pool.read(pool.layout().segment_offset(3), &mut zeros)
        .unwrap();
    assert!(zeros.iter().all(|b| *b == 0));
}

#[test]
fn nothing_is_prefaulted_when_off_or_in_a_snapshot_or_after_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    {
        let pool = new_pool(&dir);
        assert!(!pool.start_prefaulter(0).unwrap(), "0 turns it off");
        pool.alloc(1, 1).unwrap();
        pool.close().unwrap();
        assert!(!pool.start_prefaulter(SEGMENT).unwrap(), "closed");
        assert_eq!(pool.prefaulted_segments(), 0);
    }
    let (snapshot, _) = Pool::open_snapshot(&path).unwrap();
    assert!(
        !snapshot.start_prefaulter(SEGMENT).unwrap(),
        "a copy-on-write snapshot would copy every page it faults in"
    );
    let seg1 = snapshot.layout().segment_offset(1);
    assert_eq!(mapped_pages(&snapshot, seg1, 4 * SEGMENT), 0);
}

/// Starts a prefaulter `segments` ahead on a pool with nothing allocated, waits for it, and checks that the first
/// `segments` segments are wholly mapped.
fn prefault_the_first(pool: &Pool, segments: u64) {
    assert!(pool.start_prefaulter(segments * SEGMENT).unwrap());
    wait_for_prefaulted(pool, segments);
    assert_eq!(
        mapped_pages(pool, pool.layout().segment_offset(0), segments * SEGMENT),
        (segments * SEGMENT / PAGE) as usize
    );
}

#[test]
fn an_anonymous_pool_is_prefaulted_too() {
    let pool = Pool::anonymous(16 * SEGMENT, SEGMENT).unwrap();
    prefault_the_first(&pool, 3);
}

/// Kilobytes of the mapping that starts at `start` that are dirty (`Shared_Dirty` + `Private_Dirty` of
/// /proc/self/smaps): what the next msync would write back.
fn dirty_kib(start: *const u8) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let head = format!("{:x}-", start as usize);
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
    assert!(lines.next().is_some(), "no mapping at {head}");
    // This mapping's fields ("Key: value"), up to the next mapping's header ("start-end perms offset dev inode
    // path", whose device field has a colon too, so only its first word tells it apart).
    lines
        .take_while(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.ends_with(':'))
        })
        .filter(|l| l.starts_with("Shared_Dirty:") || l.starts_with("Private_Dirty:"))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap())
        .sum()
}

#[test]
fn a_files_pages_are_faulted_in_clean() {
    let dir = tempfile::tempdir().unwrap();
    let pool = new_pool(&dir);
    // Creation msyncs what it wrote, so this is normally nothing; later writeback can only lower it.
    let before = dirty_kib(pool.as_ptr());
    prefault_the_first(&pool, 8);
    let seg0 = pool.layout().segment_offset(0);
    // Eight mapped segments, none of them dirty: a periodic msync writes back only what the pool's users wrote.
    let after = dirty_kib(pool.as_ptr());
    assert!(
        after <= before,
        "{before} KiB dirty before prefaulting 8 MiB, {after} KiB after"
    );
    pool.write(seg0, &[7u8; PAGE as usize * 4]).unwrap();
    let written = dirty_kib(pool.as_ptr());
    assert!(
        written >= after + 16,
        "a write dirties its pages ({after} KiB, then {written} KiB)"
    );
}
