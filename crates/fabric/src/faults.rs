//! Test hooks on a client endpoint: lose requests, delay or hold round trips, cut the connection.
//!
//! A [`FaultHooks`] is shared (`Arc`) so a test can change it from another thread while the endpoint is in use.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Faults to inject on the round trips of one endpoint.
#[derive(Debug, Default)]
pub struct FaultHooks {
    /// Set once any hook was used, so that an endpoint without faults pays one load per round trip.
    armed: AtomicBool,
    drop_next: AtomicU32,
    delay_ns: AtomicU64,
    cut: AtomicBool,
    /// While set, round trips wait before they go out (and before they are counted as begun).
    paused: AtomicBool,
    /// Round trips begun since a hook was first used.
    begun: AtomicU64,
    /// Round trips held back by `paused` now.
    waiting: AtomicU64,
}

/// The longest a round trip waits in [`FaultHooks::pause`], so that a test that never resumes still ends.
pub const MAX_PAUSE: Duration = Duration::from_secs(60);

/// What the endpoint must do with the next round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    None,
    /// The request is lost: nothing executes and the caller sees a timeout.
    Drop,
    /// The connection is gone.
    Cut,
}

impl FaultHooks {
    /// Loses the next `n` round trips (they are not executed; the caller gets [`crate::FabricError::Timeout`]).
    pub fn drop_next(&self, n: u32) {
        self.drop_next.store(n, Ordering::Release);
        self.armed.store(true, Ordering::Release);
    }

    /// Adds `delay` to every round trip until set back to zero.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ns
            .store(delay.as_nanos() as u64, Ordering::Release);
        self.armed.store(true, Ordering::Release);
    }

    /// Cuts the connection: every later round trip fails with [`crate::FabricError::Disconnected`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        self.armed.store(true, Ordering::Release);
    }

    /// Holds every round trip back (parked, not spinning) until [`FaultHooks::resume`], or [`MAX_PAUSE`] at most: a
    /// request that has passed its checks waits on its way to the memory node for as long as a test needs, as one
    /// held up by the network.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::Release);
        self.armed.store(true, Ordering::Release);
    }

    /// Lets paused round trips go on.
    pub fn resume(&self) {
        self.paused.store(false, Ordering::Release);
    }

    /// Round trips waiting in [`FaultHooks::pause`] now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Acquire)
    }

    /// True once any hook was used.
    #[inline(always)]
    pub(crate) fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed)
    }

    /// Round trips begun (including those then delayed, lost or cut) since a hook was first used: lets a test see
    /// that the code it drives has gone out to the memory node.
    pub fn round_trips_begun(&self) -> u64 {
        self.begun.load(Ordering::Acquire)
    }

    /// True once [`FaultHooks::cut`] was called.
    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }

    /// Applies delay and decides the fate of one round trip.
    #[inline]
    pub(crate) fn before_round_trip(&self) -> Fault {
        if !self.armed.load(Ordering::Relaxed) {
            return Fault::None;
        }
        if self.paused.load(Ordering::Acquire) {
            self.waiting.fetch_add(1, Ordering::AcqRel);
            let until = Instant::now() + MAX_PAUSE;
            while self.paused.load(Ordering::Acquire) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.waiting.fetch_sub(1, Ordering::AcqRel);
        }
        self.begun.fetch_add(1, Ordering::AcqRel);
        if self.cut.load(Ordering::Relaxed) {
            return Fault::Cut;
        }
        let delay = self.delay_ns.load(Ordering::Relaxed);
        if delay > 0 {
            spin_for(delay);
        }
        if self.drop_next.load(Ordering::Relaxed) > 0 {
            let prev = self
                .drop_next
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            if prev.is_ok() {
                return Fault::Drop;
            }
        }
        Fault::None
    }
}

/// Busy-waits `ns` nanoseconds: sleeping is far too coarse to emulate a microsecond fabric.
#[inline]
pub fn spin_for(ns: u64) {
    let until = Instant::now() + Duration::from_nanos(ns);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}
