//! A rendezvous of a known number of parties, each bringing a verdict: every party goes on only once all have
//! arrived and none refused, and all of them learn the same outcome (the KV nodes' transactions meet at one, a
//! party per worker).
//!
//! The outcome is decided under a lock, by the party whose arrival settles it (the last one, or the first that
//! refuses), by `refuse` from outside, or by a party whose wait ran out while some had not arrived; nothing changes
//! it afterwards. It is also published in one atomic word, which a waiting party watches for a while (spinning,
//! then yielding) before it sleeps on the condition variable: the other parties are usually microseconds away, and
//! a sleep costs each side a system call and a reschedule.

#[cfg(dinomo_loom)]
use loom::{
    hint::spin_loop,
    sync::atomic::{AtomicU8, Ordering},
    sync::{Condvar, Mutex, MutexGuard},
    thread::yield_now,
};
use std::time::{Duration, Instant};
#[cfg(not(dinomo_loom))]
use std::{
    hint::spin_loop,
    sync::atomic::{AtomicU8, Ordering},
    sync::{Condvar, Mutex, MutexGuard},
    thread::yield_now,
};

/// How a rendezvous ended for a party that did not go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parted<R> {
    /// A party refused, with this reason (the first refusal's).
    Refused(R),
    /// Not every party arrived within the wait.
    TimedOut(Duration),
}

/// See the module documentation.
pub struct Rendezvous<R> {
    parties: usize,
    wait: Duration,
    state: Mutex<State<R>>,
    changed: Condvar,
    /// The outcome as decided under `state`: [`UNDECIDED`], [`GO`] or [`PARTED`].
    decided: AtomicU8,
}

struct State<R> {
    arrived: usize,
    refused: Option<R>,
    timed_out: bool,
}

const UNDECIDED: u8 = 0;
const GO: u8 = 1;
const PARTED: u8 = 2;

/// Times a waiting party looks at the published outcome before it sleeps: half of them spinning, half yielding.
#[cfg(not(dinomo_loom))]
const LOOKS: u32 = 64;
/// Under the model checker, two looks are enough to cover both paths (decided while looking, or not) without
/// multiplying the schedules to explore.
#[cfg(dinomo_loom)]
const LOOKS: u32 = 2;

impl<R: Clone> Rendezvous<R> {
    /// A rendezvous of `parties` parties, each waiting at most `wait` for the others.
    pub fn new(parties: usize, wait: Duration) -> Rendezvous<R> {
        Rendezvous {
            parties,
            wait,
            state: Mutex::new(State {
                arrived: 0,
                refused: None,
                timed_out: false,
            }),
            changed: Condvar::new(),
            decided: AtomicU8::new(UNDECIDED),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<R>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Decides the outcome (under the lock) and wakes every party waiting for it.
    fn decide(&self, outcome: u8) {
        self.decided.store(outcome, Ordering::Release);
        self.changed.notify_all();
    }

    /// Refuses on behalf of a party that will never arrive (it could not be reached): the parties that arrive, or
    /// are waiting, part. Refusing after every party arrived without a refusal changes nothing.
    pub fn refuse(&self, reason: R) {
        let mut s = self.state();
        if s.arrived == self.parties && s.refused.is_none() && !s.timed_out {
            return;
        }
        s.refused.get_or_insert(reason);
        self.decide(PARTED);
    }

    /// Arrives with this party's `verdict` and waits for the others: `Ok` when every party arrived and none
    /// refused, the same for every party.
    pub fn arrive(&self, verdict: Result<(), R>) -> Result<(), Parted<R>> {
        let mut s = self.state();
        s.arrived += 1;
        if let Err(reason) = verdict {
            s.refused.get_or_insert(reason);
        }
        if s.refused.is_some() {
            self.decide(PARTED);
        } else if s.arrived == self.parties && !s.timed_out {
            self.decide(GO);
        }
        if self.decided.load(Ordering::Acquire) == UNDECIDED {
            drop(s);
            for look in 0..LOOKS {
                match self.decided.load(Ordering::Acquire) {
                    // Decided under the lock, and nothing changes a decision: every party gets the same.
                    GO => return Ok(()),
                    UNDECIDED if look < LOOKS / 2 => spin_loop(),
                    UNDECIDED => yield_now(),
                    _ => break,
                }
            }
            s = self.state();
        }
        let deadline = Instant::now() + self.wait;
        loop {
            // A refusal or a time-out is only ever recorded while some party has not arrived, so once every party
            // has arrived without either, every party sees the same `Ok`.
            if let Some(reason) = &s.refused {
                return Err(Parted::Refused(reason.clone()));
            }
            if s.timed_out {
                return Err(Parted::TimedOut(self.wait));
            }
            if s.arrived == self.parties {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                s.timed_out = true;
                self.decide(PARTED);
                return Err(Parted::TimedOut(self.wait));
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(all(test, not(dinomo_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn run(
        r: &Arc<Rendezvous<String>>,
        verdicts: Vec<Result<(), String>>,
    ) -> Vec<Result<(), Parted<String>>> {
        let threads: Vec<_> = verdicts
            .into_iter()
            .map(|v| {
                let r = r.clone();
                std::thread::spawn(move || r.arrive(v))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn every_party_goes_on_once_all_arrived() {
        let r = Arc::new(Rendezvous::new(3, Duration::from_secs(10)));
        assert_eq!(run(&r, vec![Ok(()), Ok(()), Ok(())]), vec![Ok(()); 3]);
    }

    #[test]
    fn one_refusal_parts_every_party() {
        let r = Arc::new(Rendezvous::new(3, Duration::from_secs(10)));
        let parted = Err(Parted::Refused("moved".to_string()));
        assert_eq!(
            run(&r, vec![Ok(()), Err("moved".into()), Ok(())]),
            vec![parted.clone(), parted.clone(), parted]
        );
    }

    #[test]
    fn a_party_that_never_comes_parts_the_others_after_the_wait_and_a_late_one_too() {
        let wait = Duration::from_millis(50);
        let r = Arc::new(Rendezvous::<String>::new(3, wait));
        let started = Instant::now();
        assert_eq!(
            run(&r, vec![Ok(()), Ok(())]),
            vec![Err(Parted::TimedOut(wait)); 2]
        );
        assert!(started.elapsed() >= wait);
        // The third arrives after the others gave up: it must not go on alone.
        assert_eq!(r.arrive(Ok(())), Err(Parted::TimedOut(wait)));
    }

    #[test]
    fn a_refusal_from_outside_parts_the_parties_already_waiting() {
        let r = Arc::new(Rendezvous::new(2, Duration::from_secs(10)));
        let waiting = {
            let r = r.clone();
            std::thread::spawn(move || r.arrive(Ok(())))
        };
        r.refuse("stopped".to_string());
        assert_eq!(
            waiting.join().unwrap(),
            Err(Parted::Refused("stopped".into()))
        );
    }

    #[test]
    fn a_refusal_from_outside_after_everyone_went_on_changes_nothing() {
        let r = Rendezvous::new(1, Duration::from_secs(10));
        assert_eq!(r.arrive(Ok(())), Ok(()));
        r.refuse("late".to_string());
        assert_eq!(r.decided.load(Ordering::Acquire), GO);
    }
}

#[cfg(all(test, dinomo_loom))]
mod model {
    use super::{Parted, Rendezvous};
    use loom::sync::Arc;
    use loom::thread;
    use std::time::Duration;

    /// Long enough never to run out in a model (loom's condition variable does not time out anyway).
    const WAIT: Duration = Duration::from_secs(3600);

    /// Every party gets the outcome `want`, whatever the interleaving; a lost wake-up would leave a party asleep,
    /// which loom reports as a deadlock.
    fn check(verdicts: &'static [Result<(), u8>], refuse: bool, want: Result<(), Parted<u8>>) {
        let mut model = loom::model::Builder::new();
        model.preemption_bound = Some(3);
        model.check(move || {
            let r = Arc::new(Rendezvous::new(verdicts.len() + usize::from(refuse), WAIT));
            let parties: Vec<_> = verdicts
                .iter()
                .map(|v| {
                    let (r, v) = (r.clone(), v.clone());
                    thread::spawn(move || r.arrive(v))
                })
                .collect();
            if refuse {
                r.refuse(9);
            }
            for p in parties {
                assert_eq!(p.join().unwrap(), want);
            }
        });
    }

    #[test]
    fn all_arrive() {
        check(&[Ok(()), Ok(())], false, Ok(()));
    }

    #[test]
    fn one_refuses() {
        check(&[Ok(()), Err(1)], false, Err(Parted::Refused(1)));
    }

    #[test]
    fn refused_from_outside() {
        check(&[Ok(()), Ok(())], true, Err(Parted::Refused(9)));
    }
}
