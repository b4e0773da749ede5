//! How a backend tells an event loop that a connection's started operations made progress, so the loop never
//! blocks waiting for a store: it starts a connection's operations, serves other connections meanwhile, and
//! completes the connection when its [`Wake`] is rung.

use std::sync::Arc;
use std::sync::mpsc::Sender;

use dinomo_sync::Doorbell;
use mio::Waker;

/// An event loop's mailbox of connections to look at again. A post wakes the loop only when it waits in `poll`,
/// and only the first post after it parked does (see [`Doorbell`]): a busy loop takes posts with no system call on
/// either side.
pub(crate) struct LoopBell {
    pub(crate) woken: Sender<usize>,
    pub(crate) bell: Doorbell,
    pub(crate) waker: Arc<Waker>,
}

impl LoopBell {
    fn post(&self, slot: usize) {
        if self.woken.send(slot).is_ok() && self.bell.must_wake() {
            let _ = self.waker.wake();
        }
    }
}

/// Rings a connection's event loop: given to [`crate::Backend::connect`], rung by the backend (from any thread,
/// never blocking) whenever an operation [`crate::BackendConn::start`] began completes. A ring only asks the loop
/// to look: it then asks [`crate::BackendConn::is_complete`], so extra rings are harmless.
#[derive(Clone)]
pub struct Wake(Option<Arc<WakeTarget>>);

struct WakeTarget {
    bell: Arc<LoopBell>,
    slot: usize,
}

impl Wake {
    pub(crate) fn new(bell: Arc<LoopBell>, slot: usize) -> Wake {
        Wake(Some(Arc::new(WakeTarget { bell, slot })))
    }

    /// A handle that rings nothing, for a connection whose caller waits in [`crate::BackendConn::finish`] itself
    /// (tests, and any synchronous use of a backend).
    pub fn none() -> Wake {
        Wake(None)
    }

    /// Asks the loop to look at the connection again.
    pub fn wake(&self) {
        if let Some(t) = &self.0 {
            t.bell.post(t.slot);
        }
    }
}

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(t) => write!(f, "Wake(slot {})", t.slot),
            None => f.write_str("Wake(none)"),
        }
    }
}
