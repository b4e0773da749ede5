//! A run of failures of a step that is retried on a short period (the M-node's reconfiguration): it decides which
//! failures are worth a log line, so that a cause that lasts (a pool out of space, an unreachable node) is logged
//! when it starts, when it changes and then every [`REPEAT_EVERY`], not on every retry; and it keeps the latest cause
//! for whoever waits on the step to succeed.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a failure that keeps repeating unchanged is logged again.
pub(crate) const REPEAT_EVERY: Duration = Duration::from_secs(10);

/// What to log about one failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    /// Nothing: the same failure was logged less than [`REPEAT_EVERY`] ago.
    Quiet,
    /// Log it, saying how many identical failures went unlogged since the last line.
    Log { unlogged: u64 },
}

/// The end of a run of failures: how many there were and how long the run lasted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recovered {
    pub failures: u64,
    pub lasted: Duration,
}

#[derive(Debug, Default)]
struct State {
    /// Failures since the process started.
    total: u64,
    /// Failures since the last success.
    streak: u64,
    streak_since: Option<Instant>,
    /// The latest failure of the streak.
    latest: Option<String>,
    last_logged: Option<Instant>,
    unlogged: u64,
}

/// The failures of a retried step (shared between the thread that retries it and those that read it).
#[derive(Debug, Default)]
pub(crate) struct FailureStreak {
    state: Mutex<State>,
}

impl FailureStreak {
    /// Records a failure with `cause` at `now`; whether to log it.
    pub(crate) fn failed(&self, cause: String, now: Instant) -> Report {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.total += 1;
        s.streak += 1;
        s.streak_since.get_or_insert(now);
        let changed = s.latest.as_deref() != Some(cause.as_str());
        let due = s
            .last_logged
            .is_none_or(|t| now.saturating_duration_since(t) >= REPEAT_EVERY);
        s.latest = Some(cause);
        if changed || due {
            s.last_logged = Some(now);
            Report::Log {
                unlogged: std::mem::take(&mut s.unlogged),
            }
        } else {
            s.unlogged += 1;
            Report::Quiet
        }
    }

    /// Records a success at `now`; the run of failures it ends, if any.
    pub(crate) fn succeeded(&self, now: Instant) -> Option<Recovered> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.streak == 0 {
            return None;
        }
        let recovered = Recovered {
            failures: s.streak,
            lasted: s
                .streak_since
                .map_or(Duration::ZERO, |t| now.saturating_duration_since(t)),
        };
        s.streak = 0;
        s.streak_since = None;
        s.latest = None;
        s.last_logged = None;
        s.unlogged = 0;
        Some(recovered)
    }

    /// The cause of the latest failure, while the step has not succeeded since.
    pub(crate) fn latest(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .latest
            .clone()
    }

    /// Failures since the last success.
    pub(crate) fn streak(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).streak
    }

    /// Failures since the process started.
    pub(crate) fn total(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lasting_failure_is_logged_when_it_starts_changes_and_every_repeat_period() {
        let f = FailureStreak::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(f.failed("no space".into(), t0), Report::Log { unlogged: 0 });
        for i in 1..=100 {
            assert_eq!(f.failed("no space".into(), t0 + ms(5 * i)), Report::Quiet);
        }
        // The cause changes: logged at once, with the repeats of the old one counted.
        assert_eq!(
            f.failed("node 2 unreachable".into(), t0 + ms(600)),
            Report::Log { unlogged: 100 }
        );
        assert_eq!(
            f.failed("node 2 unreachable".into(), t0 + ms(700)),
            Report::Quiet
        );
        assert_eq!(f.latest().as_deref(), Some("node 2 unreachable"));
        // Unchanged for a whole repeat period: logged again.
        assert_eq!(
            f.failed("node 2 unreachable".into(), t0 + ms(600) + REPEAT_EVERY),
            Report::Log { unlogged: 1 }
        );
        assert_eq!(f.total(), 104);

        let back = f.succeeded(t0 + ms(600) + REPEAT_EVERY + ms(5));
        assert_eq!(
            back,
            Some(Recovered {
                failures: 104,
                lasted: ms(605) + REPEAT_EVERY,
            })
        );
        assert_eq!(f.latest(), None, "a success clears the cause");
        assert_eq!(f.succeeded(t0 + REPEAT_EVERY * 2), None, "no run to end");
        // A new run starts afresh: its first failure is logged even though the cause is the old one.
        let later = t0 + REPEAT_EVERY * 3;
        assert_eq!(
            f.failed("node 2 unreachable".into(), later),
            Report::Log { unlogged: 0 }
        );
        assert_eq!(f.total(), 105);
    }
}
