//! Faulting in the pages of the segments the next allocations take, off the threads that write them.
//!
//! The first touch of a page of the pool that is not mapped yet is a page fault in which the kernel finds or
//! allocates the page and fills it: zeroes for a hole of a fresh pool file (its read-around zero-fills megabytes
//! at once), the old bytes from disk for a reopened one. Log segments are taken lowest first and written front to
//! back, so under a write-heavy load on a fresh pool those faults land on the processor thread that writes a new
//! segment's header while the KV node waits for the grant, and on the workers appending entries. The prefaulter
//! thread takes them instead, a segment at a time with `madvise(MADV_POPULATE_READ)` (`_WRITE` for anonymous
//! memory, see `Mapping::populate`), for the first few free segments (those [`crate::Pool::alloc`] hands out
//! next), topping up after every low allocation.
//!
//! Populating does not change a page's content, so it is safe on a segment that has been handed out meanwhile and
//! is being written. A segment is primed once per mapping: freed segments keep their pages.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::Mapping;

/// What the allocator and the prefaulter thread share.
struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Segments faulted in so far.
    faulted: AtomicU64,
}

#[derive(Default)]
struct Queue {
    /// Byte ranges (offset, length) of segments to fault in, in the order they were claimed.
    wanted: VecDeque<(u64, u64)>,
    stop: bool,
}

impl Shared {
    /// Takes no more ranges and drops those queued; the thread ends once the range it is faulting in is done.
    fn shut(&self) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.stop = true;
        q.wanted.clear();
        self.wake.notify_all();
    }
}

/// The prefaulter thread and its queue.
pub(crate) struct Prefaulter {
    /// How many of the lowest free segments are kept faulted in.
    pub(crate) ahead: u64,
    shared: Arc<Shared>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Prefaulter {
    pub(crate) fn start(map: Arc<Mapping>, ahead: u64) -> std::io::Result<Prefaulter> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            faulted: AtomicU64::new(0),
        });
        let thread_shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name("pool-prefault".into())
            .spawn(move || run(&map, &thread_shared))?;
        Ok(Prefaulter {
            ahead,
            shared,
            handle: Mutex::new(Some(handle)),
        })
    }

    /// Queues byte ranges for the thread.
    pub(crate) fn want(&self, ranges: impl IntoIterator<Item = (u64, u64)>) {
        let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.stop {
            return;
        }
        let before = q.wanted.len();
        q.wanted.extend(ranges);
        if q.wanted.len() > before {
            self.shared.wake.notify_one();
        }
    }

    /// Segments faulted in so far.
    pub(crate) fn faulted_segments(&self) -> u64 {
        self.shared.faulted.load(Ordering::Relaxed)
    }

    /// Stops the thread once the range it is faulting in is done, leaving the rest, and waits for it.
    pub(crate) fn stop(&self) {
        self.shared.shut();
        if let Some(h) = self.handle.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }
}

fn run(map: &Mapping, shared: &Shared) {
    loop {
        let (offset, len) = {
            let mut q = shared.queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if q.stop {
                    return;
                }
                if let Some(next) = q.wanted.pop_front() {
                    break next;
                }
                q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        match map.populate(offset, len) {
            Ok(()) => {
                shared.faulted.fetch_add(1, Ordering::Relaxed);
            }
            // Kernels before 5.14 do not know MADV_POPULATE_*: the writers fault the pages in themselves.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::info!(error = %e, "this kernel cannot prefault pool pages; writers fault them in");
                shared.shut();
                return;
            }
            Err(e) => {
                tracing::warn!(offset, len, error = %e, "prefaulting pool pages failed");
            }
        }
    }
}
