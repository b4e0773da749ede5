//! An event loop's mailbox: other threads post it items (replies, connections to look at), the loop takes them
//! between its waits in mio's `poll`. A post wakes the loop only when it sleeps in `poll`, and only the first post
//! after it went to sleep does (see [`Doorbell`]): a busy loop takes posts with no system call on either side.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TryIter, unbounded};
use mio::{Events, Poll, Token, Waker};

use crate::Doorbell;

/// The posting side, shared by every thread that posts to one loop.
pub struct Mailbox<T> {
    items: Sender<T>,
    bell: Doorbell,
    waker: Waker,
}

/// The loop's side: takes the items and waits in `poll`.
pub struct Inbox<T> {
    mailbox: Arc<Mailbox<T>>,
    items: Receiver<T>,
    /// The posts whose items the loop has begun to take (all of them once `items` is empty).
    seen: u64,
}

impl<T> Mailbox<T> {
    /// A mailbox of the loop that waits on `poll`; its wakes arrive as events of `token`.
    pub fn new(poll: &Poll, token: Token) -> io::Result<(Arc<Mailbox<T>>, Inbox<T>)> {
        let (tx, items) = unbounded();
        let mailbox = Arc::new(Mailbox {
            items: tx,
            bell: Doorbell::new(),
            waker: Waker::new(poll.registry(), token)?,
        });
        let inbox = Inbox {
            mailbox: mailbox.clone(),
            items,
            seen: 0,
        };
        Ok((mailbox, inbox))
    }

    /// Posts `item`, waking the loop if it sleeps; false when the loop is gone.
    pub fn post(&self, item: T) -> bool {
        if self.items.send(item).is_err() {
            return false;
        }
        if self.bell.must_wake() {
            let _ = self.waker.wake();
        }
        true
    }

    /// Wakes the loop for something it finds elsewhere (a new connection, a stop).
    pub fn wake(&self) -> io::Result<()> {
        self.waker.wake()
    }
}

impl<T> Inbox<T> {
    /// Waits in `poll` for events, up to `timeout`, if `may_sleep` and nothing was posted since the loop last began
    /// to take its items ([`Inbox::take`]) and none is left; otherwise takes the events ready now without waiting.
    pub fn poll(
        &self,
        poll: &mut Poll,
        events: &mut Events,
        may_sleep: bool,
        timeout: Option<Duration>,
    ) -> io::Result<()> {
        self.wait_with(may_sleep, |parked| {
            poll.poll(
                events,
                if parked {
                    timeout
                } else {
                    Some(Duration::ZERO)
                },
            )
        })
    }

    /// Runs `wait` as the loop's wait when it waits elsewhere than in its `poll` (for sockets of its own), told
    /// whether it may sleep: only if `may_sleep` and nothing was posted since the loop last began to take its items
    /// and none is left. A sleeping `wait` must also wake when the poll's own descriptor turns readable, which a
    /// post makes it, and the loop then takes the wake's event from its `poll` without waiting.
    pub fn wait_with<R>(&self, may_sleep: bool, wait: impl FnOnce(bool) -> R) -> R {
        let bell = &self.mailbox.bell;
        let parked = may_sleep && self.items.is_empty() && bell.park(self.seen);
        let r = wait(parked);
        if parked {
            bell.unpark();
        }
        r
    }

    /// Whether something was posted since the loop last began to take its items.
    pub fn has_news(&self) -> bool {
        self.mailbox.bell.posts() != self.seen
    }

    /// The items posted so far, taken as the iterator is advanced (a loop may leave some for its next round).
    pub fn take(&mut self) -> TryIter<'_, T> {
        self.seen = self.mailbox.bell.posts();
        self.items.try_iter()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    const WAKER: Token = Token(0);

    #[test]
    fn a_post_wakes_a_loop_asleep_in_poll() {
        let mut poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(8);
        let (mailbox, mut inbox) = Mailbox::<u32>::new(&poll, WAKER).unwrap();
        let poster = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            assert!(mailbox.post(7));
        });
        let begun = Instant::now();
        inbox
            .poll(&mut poll, &mut events, true, Some(Duration::from_secs(30)))
            .unwrap();
        assert!(begun.elapsed() < Duration::from_secs(20), "not woken");
        poster.join().unwrap();
        assert!(inbox.has_news());
        assert_eq!(inbox.take().collect::<Vec<_>>(), vec![7]);
        assert!(!inbox.has_news());
    }

    #[test]
    fn a_loop_with_news_or_items_left_does_not_sleep() {
        let mut poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(8);
        let (mailbox, mut inbox) = Mailbox::<u32>::new(&poll, WAKER).unwrap();
        // Posted before the loop looked: no wake is owed (the loop is not asleep), yet it must not sleep.
        assert!(mailbox.post(1));
        assert!(mailbox.post(2));
        let long = Some(Duration::from_secs(30));
        let begun = Instant::now();
        inbox.poll(&mut poll, &mut events, true, long).unwrap();
        // Took one of two: the other is left, so again no sleep.
        assert_eq!(inbox.take().next(), Some(1));
        inbox.poll(&mut poll, &mut events, true, long).unwrap();
        assert!(
            begun.elapsed() < Duration::from_secs(20),
            "slept with items left"
        );
        assert_eq!(inbox.take().collect::<Vec<_>>(), vec![2]);
        // Nothing left and nothing new: it sleeps until the timeout.
        let begun = Instant::now();
        inbox
            .poll(
                &mut poll,
                &mut events,
                true,
                Some(Duration::from_millis(50)),
            )
            .unwrap();
        assert!(begun.elapsed() >= Duration::from_millis(50));
        // A loop that may not sleep returns at once.
        let begun = Instant::now();
        inbox.poll(&mut poll, &mut events, false, long).unwrap();
        assert!(begun.elapsed() < Duration::from_secs(20));
    }

    /// A loop that waits elsewhere (on sockets of its own beside the poll's descriptor) is told to sleep only with
    /// nothing posted, and a post while it sleeps wakes the poll, which is what that wait watches.
    #[test]
    fn a_wait_elsewhere_sleeps_only_without_news_and_a_post_ends_it() {
        let mut poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(8);
        let (mailbox, mut inbox) = Mailbox::<u32>::new(&poll, WAKER).unwrap();
        assert!(mailbox.post(1));
        assert!(
            !inbox.wait_with(true, |sleep| sleep),
            "told to sleep with an item waiting"
        );
        assert_eq!(inbox.take().collect::<Vec<_>>(), vec![1]);
        assert!(
            !inbox.wait_with(false, |sleep| sleep),
            "told to sleep when it may not"
        );
        let poster = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            assert!(mailbox.post(2));
        });
        let begun = Instant::now();
        let slept = inbox.wait_with(true, |sleep| {
            // The wait a loop with sockets of its own makes: any of them, or the poll's descriptor.
            poll.poll(&mut events, Some(Duration::from_secs(30)))
                .unwrap();
            sleep
        });
        assert!(slept);
        assert!(begun.elapsed() < Duration::from_secs(20), "not woken");
        assert!(events.iter().any(|e| e.token() == WAKER));
        poster.join().unwrap();
        assert_eq!(inbox.take().collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn a_post_to_a_loop_that_is_gone_says_so() {
        let poll = Poll::new().unwrap();
        let (mailbox, inbox) = Mailbox::<u32>::new(&poll, WAKER).unwrap();
        drop(inbox);
        assert!(!mailbox.post(1));
    }
}
