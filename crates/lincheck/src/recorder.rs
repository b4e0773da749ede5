//! A thread-safe recorder of operations as concurrent clients see them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::history::{Event, History, Op, Outcome};

/// Distinguishes recorders so that a ticket presented to the wrong one is ignored instead of corrupting an event.
static NEXT_RECORDER: AtomicU64 = AtomicU64::new(0);

/// Records the invocation and response of every operation of concurrent clients against one monotonic clock.
///
/// A client calls [`Recorder::invoke`] just before sending an operation and [`Recorder::complete`] just after its
/// response arrives (or [`Recorder::unknown`] when none will), so each recorded interval contains the moment the
/// operation took effect. An operation whose [`Ticket`] is dropped without either call stays unknown, which is what
/// a client that died mid-operation means. Share it between threads by reference or in an `Arc`.
#[derive(Debug)]
pub struct Recorder {
    id: u64,
    start: Instant,
    /// Every invoked operation in invocation order; `None` once declared never applied.
    events: Mutex<Vec<Option<Event>>>,
}

/// The handle of one recorded operation, returned by [`Recorder::invoke`] and consumed by [`Recorder::complete`]
/// or [`Recorder::unknown`].
#[derive(Debug)]
#[must_use = "an operation whose ticket is dropped is recorded with an unknown outcome"]
pub struct Ticket {
    recorder: u64,
    index: usize,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn new() -> Self {
        Self {
            id: NEXT_RECORDER.fetch_add(1, Ordering::Relaxed),
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
        }
    }

    /// Nanoseconds since the recorder started (saturating after about 584 years).
    pub fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Option<Event>>> {
        // A client thread that panicked while pushing leaves a consistent Vec; keep recording.
        self.events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records that `client` is about to issue `op`. Call it before the request leaves the client.
    pub fn invoke(&self, client: u32, op: Op) -> Ticket {
        let invoked = self.now();
        let mut events = self.lock();
        let index = events.len();
        events.push(Some(Event {
            client,
            op,
            invoked,
            returned: None,
            outcome: Outcome::Unknown,
        }));
        Ticket {
            recorder: self.id,
            index,
        }
    }

    /// Records the response of the ticket's operation. Call it after the response has arrived.
    /// [`Outcome::Unknown`] is the same as [`Recorder::unknown`].
    pub fn complete(&self, ticket: Ticket, outcome: Outcome) {
        // The clock is read before taking the lock so that waiting for it does not widen the interval.
        let returned = self.now();
        if ticket.recorder != self.id {
            tracing::warn!(
                index = ticket.index,
                "lincheck: ticket of another recorder ignored"
            );
            return;
        }
        let mut events = self.lock();
        let Some(Some(event)) = events.get_mut(ticket.index) else {
            tracing::warn!(
                index = ticket.index,
                "lincheck: ticket out of range ignored"
            );
            return;
        };
        if outcome.is_unknown() {
            event.returned = None;
        } else {
            // The clock is monotonic, but a clamp keeps the event well formed whatever happens.
            event.returned = Some(returned.max(event.invoked));
        }
        event.outcome = outcome;
    }

    /// Records that the ticket's operation will never get a response (timeout, dropped connection, dead node): it
    /// may have taken effect at any time after its invocation, or never.
    pub fn unknown(&self, ticket: Ticket) {
        self.complete(ticket, Outcome::Unknown);
    }

    /// Records that the ticket's operation certainly never took effect (say, the client refused it before sending,
    /// or every node rejected it before applying anything), and leaves it out of the history. Unlike
    /// [`Recorder::unknown`] this shrinks the search; declaring an operation that did take effect makes a correct
    /// store look wrong.
    pub fn not_applied(&self, ticket: Ticket) {
        if ticket.recorder != self.id {
            tracing::warn!(
                index = ticket.index,
                "lincheck: ticket of another recorder ignored"
            );
            return;
        }
        if let Some(slot) = self.lock().get_mut(ticket.index) {
            *slot = None;
        }
    }

    /// The number of operations recorded so far (not counting those declared never applied).
    pub fn len(&self) -> usize {
        self.lock().iter().flatten().count()
    }

    /// Whether nothing has been recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of everything recorded so far, in invocation order; operations still in flight appear with unknown
    /// outcomes.
    pub fn history(&self) -> History {
        History::new(self.lock().iter().flatten().cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn records_intervals_outcomes_and_unknowns() {
        let rec = Recorder::new();
        assert!(rec.is_empty());
        let a = rec.invoke(1, Op::Set(b"k".to_vec(), b"v".to_vec()));
        let b = rec.invoke(2, Op::Get(b"k".to_vec()));
        let c = rec.invoke(3, Op::Delete(b"k".to_vec()));
        let d = rec.invoke(4, Op::Incr(b"n".to_vec(), 1));
        let refused = rec.invoke(5, Op::Delete(b"gone".to_vec()));
        rec.complete(a, Outcome::Ok);
        rec.unknown(b);
        rec.complete(c, Outcome::Unknown);
        drop(d);
        rec.not_applied(refused);
        let h = rec.history();
        h.validate().unwrap();
        assert_eq!(rec.len(), 4);
        assert_eq!(h.len(), 4);
        assert!(h.events().iter().all(|e| e.client != 5));
        let e = h.events();
        assert_eq!(e[0].client, 1);
        assert_eq!(e[0].outcome, Outcome::Ok);
        let returned = e[0].returned.unwrap();
        assert!(returned >= e[0].invoked);
        assert!(e[1].invoked >= e[0].invoked);
        for unknown in &e[1..] {
            assert_eq!(unknown.returned, None);
            assert_eq!(unknown.outcome, Outcome::Unknown);
        }
    }

    #[test]
    fn foreign_tickets_are_ignored() {
        let one = Recorder::new();
        let two = Recorder::new();
        let t = one.invoke(1, Op::Get(b"k".to_vec()));
        two.complete(t, Outcome::Value(None));
        let t = two.invoke(1, Op::Get(b"k".to_vec()));
        let u = two.invoke(1, Op::Get(b"k".to_vec()));
        drop(t);
        one.complete(u, Outcome::Value(None));
        for rec in [&one, &two] {
            assert!(
                rec.history()
                    .events()
                    .iter()
                    .all(|e| e.outcome.is_unknown())
            );
        }
    }

    #[test]
    fn concurrent_clients_share_one_clock() {
        let rec = Recorder::new();
        std::thread::scope(|s| {
            for client in 0..4u32 {
                let rec = &rec;
                s.spawn(move || {
                    for i in 0..50 {
                        let t = rec.invoke(client, Op::Incr(b"n".to_vec(), i));
                        rec.complete(t, Outcome::Int(i));
                    }
                });
            }
        });
        let h = rec.history();
        assert_eq!(h.len(), 200);
        h.validate().unwrap();
        for client in 0..4 {
            let mine: Vec<_> = h.events().iter().filter(|e| e.client == client).collect();
            assert_eq!(mine.len(), 50);
            // One client's operations are sequential on the shared clock.
            for w in mine.windows(2) {
                assert!(w[0].returned.unwrap() <= w[1].invoked);
            }
        }
    }

    /// A map behind one lock, each operation applied while its client holds the lock: linearizable by
    /// construction, whatever the interleaving.
    fn locked_apply(map: &Mutex<HashMap<Vec<u8>, Vec<u8>>>, op: &Op) -> Outcome {
        let mut map = map.lock().unwrap();
        match op {
            Op::Get(k) => Outcome::Value(map.get(k).cloned()),
            Op::Set(k, v) => {
                map.insert(k.clone(), v.clone());
                Outcome::Ok
            }
            Op::Insert(..) | Op::Update(..) => {
                unreachable!("the clients issue only gets, sets, deletes, getdels and increments")
            }
            Op::Delete(k) => Outcome::Applied(map.remove(k).is_some()),
            Op::Take(k) => Outcome::Value(map.remove(k)),
            Op::Incr(k, d) => {
                // Only decimal values are ever written, so every stored value parses.
                let n = map.get(k).map_or(0, |v| {
                    String::from_utf8_lossy(v).parse::<i64>().unwrap_or(0)
                }) + d;
                map.insert(k.clone(), n.to_string().into_bytes());
                Outcome::Int(n)
            }
        }
    }

    #[test]
    fn a_locked_map_under_concurrent_clients_is_linearizable() {
        let rec = Recorder::new();
        let map = Mutex::new(HashMap::new());
        std::thread::scope(|s| {
            for client in 0..6u32 {
                let (rec, map) = (&rec, &map);
                s.spawn(move || {
                    let mut x = u64::from(client) * 7919 + 1;
                    for i in 0..150u64 {
                        x = x
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        let key = format!("k{}", (x >> 60) % 3).into_bytes();
                        let op = match (x >> 40) % 5 {
                            0 => Op::Get(key),
                            1 => Op::Set(key, ((x >> 20) % 50).to_string().into_bytes()),
                            2 => Op::Delete(key),
                            3 => Op::Take(key),
                            _ => Op::Incr(key, ((x >> 8) % 5) as i64 - 2),
                        };
                        let t = rec.invoke(client, op.clone());
                        match i % 23 {
                            // The response is lost after the operation took effect.
                            0 => {
                                locked_apply(map, &op);
                                rec.unknown(t);
                            }
                            // The request is lost before it took effect.
                            1 => rec.unknown(t),
                            _ => rec.complete(t, locked_apply(map, &op)),
                        }
                    }
                });
            }
        });
        let h = rec.history();
        assert_eq!(h.len(), 900);
        let verdict = crate::check(&h, &crate::CheckConfig::default()).unwrap();
        assert_eq!(verdict, crate::Verdict::Linearizable, "{verdict}");
    }

    #[test]
    fn a_stale_read_through_the_recorder_is_caught() {
        let rec = Recorder::new();
        let t = rec.invoke(1, Op::Set(b"k".to_vec(), b"new".to_vec()));
        rec.complete(t, Outcome::Ok);
        // Make sure the read starts strictly after the write returned on the recorder's clock.
        std::thread::sleep(std::time::Duration::from_micros(50));
        let t = rec.invoke(2, Op::Get(b"k".to_vec()));
        rec.complete(t, Outcome::Value(None));
        let verdict = crate::check(&rec.history(), &crate::CheckConfig::default()).unwrap();
        assert!(
            matches!(verdict, crate::Verdict::NotLinearizable { .. }),
            "{verdict}"
        );
    }
}
