//! The doorbell between an event loop that sleeps in `poll` and the threads that post it work (replies, in the
//! servers). A post must wake the loop when the loop may sleep without having seen it, and should cost no system
//! call when the loop is busy and will see it anyway.
//!
//! One word holds the number of posts so far and a "parked" bit, and every step is a read-modify-write of it, so
//! they all fall into one order and no `SeqCst` reasoning is needed:
//! - the loop reads the count ([`Doorbell::posts`]) and then takes everything queued; before it waits, it parks
//!   with that count ([`Doorbell::park`]), which fails if anyone posted since, and then it takes the new work
//!   instead of waiting;
//! - a poster queues its work, then counts its post ([`Doorbell::must_wake`]): if the loop is parked, the first
//!   poster to clear the bit wakes it.

#[cfg(dinomo_loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(dinomo_loom))]
use std::sync::atomic::{AtomicU64, Ordering};

/// The parked bit; posts count in steps of [`POST`] above it.
const PARKED: u64 = 1;
const POST: u64 = 2;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct Doorbell {
    state: AtomicU64,
}

impl Doorbell {
    /// A doorbell of a loop that is running.
    pub fn new() -> Doorbell {
        Doorbell::default()
    }

    /// The posts so far (with the parked bit cleared). The loop reads this before it takes the queued work: every
    /// post counted here has its work in the queue already.
    pub fn posts(&self) -> u64 {
        self.state.load(Ordering::Acquire) & !PARKED
    }

    /// The loop is about to wait, having taken all the work of the `seen` posts ([`Doorbell::posts`]): true when
    /// no one posted since, and the loop may now wait for a wake; false when it must take the new work first.
    pub fn park(&self, seen: u64) -> bool {
        self.state
            .compare_exchange(seen, seen | PARKED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The loop runs again after a [`Doorbell::park`] that returned true (woken, or its wait timed out).
    pub fn unpark(&self) {
        self.state.fetch_and(!PARKED, Ordering::AcqRel);
    }

    /// A poster has queued its work: counts the post, and returns true when the loop is parked and this caller, the
    /// only one told so, must wake it.
    pub fn must_wake(&self) -> bool {
        let before = self.state.fetch_add(POST, Ordering::AcqRel);
        before & PARKED != 0 && self.state.fetch_and(!PARKED, Ordering::AcqRel) & PARKED != 0
    }
}

#[cfg(all(test, dinomo_loom))]
mod model {
    use super::{Doorbell, PARKED};
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::sync::{Arc, Notify};
    use loom::thread;

    /// Posts the model makes, spread over its posters.
    const POSTS: usize = 2;
    /// Preemptions per explored schedule.
    const PREEMPTIONS: usize = 3;

    /// Posters, each queueing work and ringing as the doorbell says, and a loop that takes the work and, whenever
    /// it parks, waits for a wake (a `Notify`, which keeps a wake sent before the wait, as an eventfd does). Loom
    /// runs every interleaving and every outcome the memory model allows; a lost wake-up leaves the loop waiting
    /// with work queued and no one to wake it, which loom reports as a deadlock. `park` is the doorbell's, or a
    /// broken one for the control test. With `block` false the loop stops at its first park instead of waiting,
    /// and the check is an assertion once the posters are done: a parked loop that no one woke must have nothing
    /// left to take.
    fn check(posters: usize, park: fn(&Doorbell, u64) -> bool, block: bool) {
        let mut model = loom::model::Builder::new();
        // Bounded as tokio bounds its models: every schedule with at most this many preemptions (the known
        // lost-wake-up bugs need one or two).
        model.preemption_bound = Some(PREEMPTIONS);
        model.check(move || {
            let bell = Arc::new(Doorbell::new());
            let queue = Arc::new(AtomicUsize::new(0));
            let wake = Arc::new(Notify::new());
            let wakes = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..posters)
                .map(|n| {
                    let (bell, queue, wake, wakes) =
                        (bell.clone(), queue.clone(), wake.clone(), wakes.clone());
                    thread::spawn(move || {
                        for _ in (n..POSTS).step_by(posters) {
                            queue.fetch_add(1, Ordering::Release);
                            if bell.must_wake() {
                                wakes.fetch_add(1, Ordering::Relaxed);
                                wake.notify();
                            }
                        }
                    })
                })
                .collect();
            let mut taken = 0;
            let mut parks = 0;
            let mut asleep = false;
            while taken < POSTS {
                let seen = bell.posts();
                taken += queue.swap(0, Ordering::Acquire);
                if taken < POSTS && park(&bell, seen) {
                    parks += 1;
                    if !block {
                        asleep = true;
                        break;
                    }
                    wake.wait();
                    bell.unpark();
                }
            }
            for t in threads {
                t.join().unwrap();
            }
            let wakes = wakes.load(Ordering::Relaxed);
            if asleep && wakes == 0 {
                assert_eq!(queue.load(Ordering::Acquire), 0, "lost wake-up");
            }
            // One wake per park at most: only the first poster after a park rings.
            assert!(wakes <= parks, "{wakes} wakes for {parks} parks");
        });
    }

    #[test]
    fn a_parked_loop_is_woken_by_one_poster() {
        check(1, Doorbell::park, true);
    }

    #[test]
    fn a_parked_loop_is_woken_by_either_of_two_posters() {
        check(2, Doorbell::park, true);
    }

    #[test]
    fn a_parked_loop_no_one_wakes_has_nothing_to_take() {
        check(1, Doorbell::park, false);
        check(2, Doorbell::park, false);
    }

    /// The model catches the bug the count prevents: a loop that parks without checking that nothing was posted
    /// since it took the queue sleeps through a post made in between.
    #[test]
    #[should_panic(expected = "lost wake-up")]
    fn parking_without_the_count_loses_a_wake_up() {
        check(
            1,
            |bell, _seen| {
                bell.state.fetch_or(PARKED, Ordering::AcqRel);
                true
            },
            false,
        );
    }
}

#[cfg(all(test, not(dinomo_loom)))]
mod tests {
    use super::Doorbell;

    #[test]
    fn only_the_first_post_after_a_park_wakes() {
        let bell = Doorbell::new();
        assert!(!bell.must_wake(), "a running loop needs no wake");
        let seen = bell.posts();
        assert!(bell.park(seen));
        assert!(bell.must_wake());
        assert!(!bell.must_wake(), "one wake per park");
        bell.unpark();
        assert_eq!(bell.posts(), seen + 4, "two posts since the count was read");
    }

    #[test]
    fn a_park_after_an_unseen_post_fails() {
        let bell = Doorbell::new();
        let seen = bell.posts();
        assert!(!bell.must_wake());
        assert!(!bell.park(seen), "a post came after the count was read");
        assert!(bell.park(bell.posts()));
        bell.unpark();
        assert!(!bell.must_wake(), "an unparked loop needs no wake");
    }
}
