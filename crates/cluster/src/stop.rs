//! A stop flag that sleeping threads wake up for. The cluster's periodic threads (the M-node's checks, the routing
//! node's refresh, the supervisor of a local cluster) wait out their configured period on it, so stopping takes
//! effect at once, however long that period is.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Set once; every [`StopSignal::wait`] in progress returns when it is.
#[derive(Debug, Default)]
pub(crate) struct StopSignal {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl StopSignal {
    /// Sets the flag and wakes every waiter.
    pub(crate) fn stop(&self) {
        *self.stopped.lock().expect("stop lock") = true;
        self.wake.notify_all();
    }

    /// Whether [`StopSignal::stop`] was called.
    pub(crate) fn is_stopped(&self) -> bool {
        *self.stopped.lock().expect("stop lock")
    }

    /// Waits `period`, or less if the flag is set meanwhile; whether it is set.
    pub(crate) fn wait(&self, period: Duration) -> bool {
        let stopped = self.stopped.lock().expect("stop lock");
        let (stopped, _) = self
            .wake
            .wait_timeout_while(stopped, period, |stopped| !*stopped)
            .expect("stop lock");
        *stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_wait_returns_when_its_period_ends_or_at_once_when_stopped() {
        let s = Arc::new(StopSignal::default());
        let start = Instant::now();
        assert!(!s.wait(Duration::from_millis(20)));
        assert!(start.elapsed() >= Duration::from_millis(20));

        // A waiter with a period that would outlive the test is woken by the stop.
        let waiter = {
            let s = s.clone();
            std::thread::spawn(move || s.wait(Duration::from_secs(1_000_000_000)))
        };
        std::thread::sleep(Duration::from_millis(10));
        s.stop();
        assert!(waiter.join().unwrap());
        assert!(s.is_stopped());
        // Once stopped, waits do not wait.
        assert!(s.wait(Duration::MAX));
    }
}
