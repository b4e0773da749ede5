//! How busy a worker is: the time it spends serving (from taking a batch off its queue to finishing that batch's
//! group commit) against the time it exists. The paper's KN occupancy (§3.5) is the busy share of an interval.

use std::time::Instant;

/// A worker's busy-time clock: one `Instant::now()` when a batch starts and one when it ends.
pub(crate) struct Occupancy {
    started: Instant,
    busy_ns: u64,
    /// When the batch being served started; `None` while waiting for work.
    batch_started: Option<Instant>,
    /// Busy and wall nanoseconds when the current monitoring epoch started.
    epoch_busy_ns: u64,
    epoch_wall_ns: u64,
}

impl Occupancy {
    pub(crate) fn new() -> Occupancy {
        Occupancy {
            started: Instant::now(),
            busy_ns: 0,
            batch_started: None,
            epoch_busy_ns: 0,
            epoch_wall_ns: 0,
        }
    }

    /// A batch was taken off the queue.
    #[inline]
    pub(crate) fn begin_batch(&mut self) {
        self.batch_started = Some(Instant::now());
    }

    /// The batch is served and committed.
    #[inline]
    pub(crate) fn end_batch(&mut self) {
        if let Some(t) = self.batch_started.take() {
            self.busy_ns += t.elapsed().as_nanos() as u64;
        }
    }

    /// Cumulative (busy, wall) nanoseconds since the worker started, the batch in progress included.
    pub(crate) fn totals(&self) -> (u64, u64) {
        let now = Instant::now();
        let running = self
            .batch_started
            .map_or(0, |t| now.saturating_duration_since(t).as_nanos() as u64);
        (
            self.busy_ns + running,
            now.saturating_duration_since(self.started).as_nanos() as u64,
        )
    }

    /// (busy, wall) nanoseconds of the monitoring epoch that ends now; the next one starts.
    pub(crate) fn take_epoch(&mut self) -> (u64, u64) {
        let (busy, wall) = self.totals();
        // A batch reported in part while in progress is complete later: never count time twice.
        let busy = busy.max(self.epoch_busy_ns);
        let epoch = (
            busy - self.epoch_busy_ns,
            wall.saturating_sub(self.epoch_wall_ns),
        );
        self.epoch_busy_ns = busy;
        self.epoch_wall_ns = wall;
        epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn busy_time_counts_batches_only_and_epochs_partition_it() {
        let mut o = Occupancy::new();
        std::thread::sleep(Duration::from_millis(20));
        o.begin_batch();
        std::thread::sleep(Duration::from_millis(10));
        o.end_batch();
        let (busy, wall) = o.totals();
        assert!(busy >= 10_000_000, "{busy}");
        assert!(wall >= 30_000_000 && wall > busy, "{wall}");
        let (eb, ew) = o.take_epoch();
        assert_eq!(eb, busy);
        assert!(ew >= wall);
        // A batch in progress counts up to now, and the rest of it goes to the next epoch: the epochs partition
        // the busy time.
        o.begin_batch();
        std::thread::sleep(Duration::from_millis(5));
        let (eb2, ew2) = o.take_epoch();
        assert!(eb2 >= 5_000_000 && eb2 <= ew2, "{eb2} {ew2}");
        o.end_batch();
        let (eb3, _) = o.take_epoch();
        assert_eq!(eb + eb2 + eb3, o.totals().0);
    }
}
