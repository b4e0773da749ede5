//! The lookup paths (`primary`, `owners` for factors up to `OWNERS_INLINE`, `is_owner`, `replication`) do not touch
//! the heap. Counted with a global allocator that tallies allocations made by the current thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use dinomo_ring::{DEFAULT_VNODES, OWNERS_INLINE, Ring};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds the `GlobalAlloc` contract; the counter is a
// const-initialised thread-local `Cell`, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's guarantees for `alloc` are passed on as they are.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes through `alloc` above).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's guarantees for `realloc` are passed on as they are.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCS.with(Cell::get)
}

#[test]
fn lookups_do_not_allocate() {
    let mut ring = Ring::with_nodes(DEFAULT_VNODES, 0..16);
    let keys: Vec<Vec<u8>> = (0..1000).map(|i| format!("user{i}").into_bytes()).collect();
    let unreplicated = ring.clone();
    for k in keys.iter().step_by(4) {
        ring.set_replication(k, OWNERS_INLINE as u32);
    }

    let before = allocations();
    let mut seen = 0usize;
    for r in [&unreplicated, &ring] {
        for k in &keys {
            let p = r.primary(k).expect("non-empty");
            let o = r.owners(k);
            seen += o.len() + usize::from(r.is_owner(p, k)) + r.replication(k) as usize;
        }
    }
    let after = allocations();
    assert!(seen > 0);
    assert_eq!(
        after - before,
        0,
        "lookups allocated {} times",
        after - before
    );

    // The counter does see allocations: a factor beyond the inline capacity spills to the heap.
    ring.set_replication(&keys[1], OWNERS_INLINE as u32 + 1);
    let before = allocations();
    assert_eq!(ring.owners(&keys[1]).len(), OWNERS_INLINE + 1);
    assert!(allocations() > before);
}
