//! How a backend tells an event loop that a connection's started operations made progress, so the loop never
//! blocks waiting for a store: it starts a connection's operations, serves other connections meanwhile, and
//! completes the connection when its [`Wake`] is rung.

use std::sync::Arc;

use dinomo_sync::Mailbox;

/// Rings a connection's event loop: given to [`crate::Backend::connect`], rung by the backend (from any thread,
/// never blocking) whenever an operation [`crate::BackendConn::start`] began completes. A ring posts the
/// connection's slot to the loop's mailbox, which costs a system call only when the loop sleeps in `poll`. It only
/// asks the loop to look: the loop then asks [`crate::BackendConn::is_complete`], so extra rings are harmless.
#[derive(Clone)]
pub struct Wake(Option<(Arc<Mailbox<usize>>, usize)>);

impl Wake {
    pub(crate) fn new(mailbox: Arc<Mailbox<usize>>, slot: usize) -> Wake {
        Wake(Some((mailbox, slot)))
    }

    /// A handle that rings nothing, for a connection whose caller waits in [`crate::BackendConn::finish`] itself
    /// (tests, and any synchronous use of a backend).
    pub fn none() -> Wake {
        Wake(None)
    }

    /// Asks the loop to look at the connection again.
    pub fn wake(&self) {
        if let Some((mailbox, slot)) = &self.0 {
            mailbox.post(*slot);
        }
    }
}

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some((_, slot)) => write!(f, "Wake(slot {slot})"),
            None => f.write_str("Wake(none)"),
        }
    }
}
