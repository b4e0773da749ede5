//! Histories generated from sequential executions (linearizable by construction), their mutations, a comparison with
//! a brute-force search on small histories, and a large history of the size the cluster tests produce.

use std::collections::HashMap;

use dinomo_lincheck::{CheckConfig, Event, History, Op, Outcome, Verdict, check, check_report};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

/// A fixed seed and no regression files: every run checks the same cases.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(0x4c49_4e43),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Values the generated operations write. Besides text they hold integers for `incr` (`"007"` is not one in the
/// Redis syntax the checker uses by default) and bytes that are not UTF-8.
const VALUES: &[&[u8]] = &[
    b"a",
    b"b",
    b"",
    b"0",
    b"7",
    b"-3",
    b"12",
    b"007",
    b"x\x00y",
    b"\xff\xfe",
];

/// A value no generated operation writes (and that no `incr` can produce).
const NEVER_WRITTEN: &[u8] = b"never written";

/// Nanoseconds between consecutive linearization points.
const SPACING: u64 = 1000;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Get,
    Set(usize),
    Insert(usize),
    Update(usize),
    Delete,
    Incr(i64),
    Take,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Known,
    /// Took effect, but the client never heard back.
    UnknownApplied,
    /// Never took effect, and the client never heard back.
    UnknownSkipped,
}

/// One operation of a sequential execution and how its interval is drawn around its linearization point.
#[derive(Clone, Copy, Debug)]
struct Spec {
    client: u32,
    key: usize,
    kind: Kind,
    /// How long before its linearization point the operation was invoked (at most).
    before: u64,
    /// How long after its linearization point the response arrived (at most).
    after: u64,
    fate: Fate,
}

fn key(k: usize) -> Vec<u8> {
    format!("k{k}").into_bytes()
}

/// The Redis reading of a value as an integer, written independently of the checker's: `0` or an optional `-`
/// followed by a non-zero digit and more digits, within `i64`.
fn redis_int(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?;
    let digits = s.strip_prefix('-').unwrap_or(s);
    let well_formed = s == "0"
        || (digits.bytes().all(|b| b.is_ascii_digit())
            && digits
                .bytes()
                .next()
                .is_some_and(|b| (b'1'..=b'9').contains(&b)));
    if well_formed { s.parse().ok() } else { None }
}

/// The reference register map: applies `op` and returns its response.
fn apply(map: &mut HashMap<Vec<u8>, Vec<u8>>, op: &Op) -> Outcome {
    match op {
        Op::Get(k) => Outcome::Value(map.get(k).cloned()),
        Op::Set(k, v) => {
            map.insert(k.clone(), v.clone());
            Outcome::Ok
        }
        Op::Insert(k, v) => Outcome::Applied(if map.contains_key(k) {
            false
        } else {
            map.insert(k.clone(), v.clone());
            true
        }),
        Op::Update(k, v) => Outcome::Applied(match map.get_mut(k) {
            Some(old) => {
                *old = v.clone();
                true
            }
            None => false,
        }),
        Op::Delete(k) => Outcome::Applied(map.remove(k).is_some()),
        Op::Take(k) => Outcome::Value(map.remove(k)),
        Op::Incr(k, d) => {
            let current = match map.get(k) {
                None => Some(0),
                Some(v) => redis_int(v),
            };
            match current.and_then(|c| c.checked_add(*d)) {
                Some(n) => {
                    map.insert(k.clone(), n.to_string().into_bytes());
                    Outcome::Int(n)
                }
                None => Outcome::Error,
            }
        }
    }
}

fn op_of(spec: &Spec) -> Op {
    let k = key(spec.key);
    match spec.kind {
        Kind::Get => Op::Get(k),
        Kind::Set(v) => Op::Set(k, VALUES[v].to_vec()),
        Kind::Insert(v) => Op::Insert(k, VALUES[v].to_vec()),
        Kind::Update(v) => Op::Update(k, VALUES[v].to_vec()),
        Kind::Delete => Op::Delete(k),
        Kind::Incr(d) => Op::Incr(k, d),
        Kind::Take => Op::Take(k),
    }
}

/// Runs the specs in order against the reference map (operation `i` takes effect at `(i + 1) * SPACING`) and
/// records each with an interval around that instant. One client's intervals never overlap: an operation starts
/// after the client's previous one returned (or was given up on) and returns before the client's next one takes
/// effect.
fn build(specs: &[Spec], initial: &[Option<usize>]) -> History {
    let mut map = HashMap::new();
    let mut history = History::new(Vec::new());
    for (k, v) in initial.iter().enumerate() {
        if let Some(v) = v {
            map.insert(key(k), VALUES[*v].to_vec());
            history = history.with_initial(key(k), VALUES[*v].to_vec());
        }
    }
    let at = |i: usize| (i as u64 + 1) * SPACING;
    let mut next_of_client = vec![None; specs.len()];
    let mut last_seen: HashMap<u32, usize> = HashMap::new();
    for (i, s) in specs.iter().enumerate().rev() {
        next_of_client[i] = last_seen.insert(s.client, i);
    }
    let mut free_at: HashMap<u32, u64> = HashMap::new();
    for (i, s) in specs.iter().enumerate() {
        let op = op_of(s);
        let outcome = if s.fate == Fate::UnknownSkipped {
            Outcome::Unknown
        } else {
            apply(&mut map, &op)
        };
        let earliest = free_at.get(&s.client).copied().unwrap_or(0);
        let invoked = at(i).saturating_sub(s.before).max(earliest);
        let latest = next_of_client[i].map_or(u64::MAX, |j| at(j) - 1);
        let returned = (at(i) + s.after).min(latest);
        free_at.insert(s.client, returned + 1);
        let (returned, outcome) = match s.fate {
            Fate::Known => (Some(returned), outcome),
            Fate::UnknownApplied | Fate::UnknownSkipped => (None, Outcome::Unknown),
        };
        history.push(Event {
            client: s.client,
            op,
            invoked,
            returned,
            outcome,
        });
    }
    history
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => Just(Kind::Get),
        2 => (0..VALUES.len()).prop_map(Kind::Set),
        1 => (0..VALUES.len()).prop_map(Kind::Insert),
        1 => (0..VALUES.len()).prop_map(Kind::Update),
        1 => Just(Kind::Delete),
        2 => (-3i64..=3).prop_map(Kind::Incr),
        1 => Just(Kind::Take),
    ]
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![8 => Just(Fate::Known), 1 => Just(Fate::UnknownApplied), 1 => Just(Fate::UnknownSkipped)]
}

/// Sequential executions of up to 80 operations on 1 to 4 keys by 1 to 6 clients, with initial values.
fn execution() -> impl Strategy<Value = (Vec<Spec>, Vec<Option<usize>>)> {
    (1..=4usize, 1..=6u32).prop_flat_map(|(keys, clients)| {
        let spread = 6 * SPACING;
        let spec = (0..clients, 0..keys, kind(), 0..spread, 0..spread, fate()).prop_map(
            |(client, key, kind, before, after, fate)| Spec {
                client,
                key,
                kind,
                before,
                after,
                fate,
            },
        );
        (
            prop::collection::vec(spec, 1..80),
            prop::collection::vec(prop::option::weighted(0.3, 0..VALUES.len()), keys),
        )
    })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn histories_of_sequential_executions_are_linearizable((specs, initial) in execution()) {
        let history = build(&specs, &initial);
        history.validate().unwrap();
        let verdict = check(&history, &CheckConfig::default()).unwrap();
        prop_assert_eq!(&verdict, &Verdict::Linearizable, "{}", verdict);
        // A saved and reloaded history is the same history.
        let reloaded = History::from_json(&history.to_json().unwrap()).unwrap();
        prop_assert_eq!(reloaded, history);
    }

    #[test]
    fn a_read_of_a_value_never_written_is_caught(
        (specs, initial) in execution(),
        pick in any::<prop::sample::Index>(),
    ) {
        let mut history = build(&specs, &initial);
        let reads: Vec<usize> = history
            .events()
            .iter()
            .enumerate()
            .filter(|(_, e)| e.op.is_read() && !e.outcome.is_unknown())
            .map(|(i, _)| i)
            .collect();
        prop_assume!(!reads.is_empty());
        let victim = reads[pick.index(reads.len())];
        let mut events = history.events().to_vec();
        events[victim].outcome = Outcome::Value(Some(NEVER_WRITTEN.to_vec()));
        let victim_key = events[victim].op.key().to_vec();
        let initial = history.initial().clone();
        history = History::new(events);
        for (k, v) in initial {
            history = history.with_initial(k, v);
        }
        match check(&history, &CheckConfig::default()).unwrap() {
            Verdict::NotLinearizable { key, explanation } => {
                prop_assert_eq!(key, victim_key);
                let expected = format!("#{victim} client");
                prop_assert!(explanation.contains(&expected), "{}", explanation);
            }
            other => prop_assert!(false, "expected a violation, got {other:?}"),
        }
    }
}

/// Whether some order of the operations, consistent with real time, reproduces every known response on the
/// reference map. Exhaustive, without any of the checker's pruning; unknown reads are left out, unknown writes
/// may be placed anywhere after their invocation or left out.
fn brute_force(events: &[Event], initial: &HashMap<Vec<u8>, Vec<u8>>) -> bool {
    fn search(events: &[&Event], placed: &mut Vec<bool>, map: &HashMap<Vec<u8>, Vec<u8>>) -> bool {
        let open_known = |i: usize| !placed[i] && events[i].returned.is_some();
        if !(0..events.len()).any(open_known) {
            return true;
        }
        for i in 0..events.len() {
            if placed[i] {
                continue;
            }
            // Every operation that returned before this one was invoked must already be placed.
            let ready = (0..events.len())
                .filter(|&j| j != i && !placed[j])
                .all(|j| events[j].returned.is_none_or(|r| r >= events[i].invoked));
            if !ready {
                continue;
            }
            let mut next = map.clone();
            let response = apply(&mut next, &events[i].op);
            if events[i].returned.is_some() && response != events[i].outcome {
                continue;
            }
            placed[i] = true;
            let found = search(events, placed, &next);
            placed[i] = false;
            if found {
                return true;
            }
        }
        false
    }
    let kept: Vec<&Event> = events
        .iter()
        .filter(|e| !(e.op.is_read() && e.outcome.is_unknown()))
        .collect();
    search(&kept, &mut vec![false; kept.len()], initial)
}

/// Small histories with arbitrary (often touching) intervals; responses come from running the operations in the
/// order of a point drawn inside each interval, then some are replaced with other responses of the right kind.
fn small_history() -> impl Strategy<Value = History> {
    let op = (
        0..2usize,
        kind(),
        0..12u64,
        0..8u64,
        0..=8u64,
        0..10u8,
        -2i64..=4,
        0..VALUES.len() + 1,
    );
    (
        prop::collection::vec(op, 1..=8),
        prop::option::of(0..VALUES.len()),
    )
        .prop_map(|(ops, initial)| {
            let mut map = HashMap::new();
            if let Some(v) = initial {
                map.insert(key(0), VALUES[v].to_vec());
            }
            let mut drawn: Vec<(u64, usize)> = ops
                .iter()
                .enumerate()
                .map(|(i, &(_, _, invoked, len, point, ..))| (invoked + point.min(len), i))
                .collect();
            drawn.sort();
            let mut events: Vec<Option<Event>> = vec![None; ops.len()];
            for (_, i) in drawn {
                let (k, kind, invoked, len, _, roll, int, value) = ops[i];
                let spec = Spec {
                    client: i as u32,
                    key: k,
                    kind,
                    before: 0,
                    after: 0,
                    fate: Fate::Known,
                };
                let op = op_of(&spec);
                let mut outcome = apply(&mut map, &op);
                let mut returned = Some(invoked + len);
                match roll {
                    // A different response of the same kind.
                    0 | 1 => {
                        outcome = match outcome {
                            Outcome::Value(_) => {
                                Outcome::Value(VALUES.get(value).map(|v| v.to_vec()))
                            }
                            Outcome::Applied(b) => Outcome::Applied(!b),
                            Outcome::Int(_) if value == 0 => Outcome::Error,
                            Outcome::Int(_) | Outcome::Error => Outcome::Int(int),
                            other => other,
                        }
                    }
                    // No response.
                    2 | 3 => {
                        returned = None;
                        outcome = Outcome::Unknown;
                    }
                    _ => {}
                }
                events[i] = Some(Event {
                    client: i as u32,
                    op,
                    invoked,
                    returned,
                    outcome,
                });
            }
            let mut history = History::new(events.into_iter().flatten().collect());
            if let Some(v) = initial {
                history = history.with_initial(key(0), VALUES[v].to_vec());
            }
            history
        })
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn agrees_with_brute_force_on_small_histories(history in small_history()) {
        let expected = brute_force(history.events(), &history.initial().clone().into_iter().collect());
        let verdict = check(&history, &CheckConfig::default()).unwrap();
        let inconclusive = matches!(verdict, Verdict::Inconclusive { .. });
        prop_assert!(!inconclusive, "{}", verdict);
        prop_assert_eq!(verdict.is_linearizable(), expected, "{}\n{:?}", verdict, history);
    }
}

/// splitmix64, for a reproducible large history without a random-number dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A reproducible large history: `ops` operations on `keys` keys by `clients` clients, 2% of them unknown.
fn large_history(seed: u64, ops: usize, keys: u64, clients: u64) -> History {
    let mut rng = Rng(seed);
    let specs: Vec<Spec> = (0..ops)
        .map(|_| {
            let kind = match rng.below(10) {
                0..=3 => Kind::Get,
                4 | 5 => Kind::Set(rng.below(VALUES.len() as u64) as usize),
                6 => Kind::Insert(rng.below(VALUES.len() as u64) as usize),
                7 => Kind::Update(rng.below(VALUES.len() as u64) as usize),
                8 => Kind::Delete,
                _ => Kind::Incr(rng.below(7) as i64 - 3),
            };
            let fate = match rng.below(100) {
                0 => Fate::UnknownApplied,
                1 => Fate::UnknownSkipped,
                _ => Fate::Known,
            };
            Spec {
                client: rng.below(clients) as u32,
                key: rng.below(keys) as usize,
                kind,
                // Intervals spanning up to 32 other operations: with 16 clients each one overlaps many others.
                before: rng.below(32 * SPACING),
                after: rng.below(32 * SPACING),
                fate,
            }
        })
        .collect();
    build(&specs, &[])
}

#[test]
fn twenty_thousand_operations_on_a_hundred_keys_by_sixteen_clients() {
    const OPS: usize = 20_000;
    let history = large_history(0x5eed, OPS, 100, 16);
    assert_eq!(history.len(), OPS);
    let started = std::time::Instant::now();
    let report = check_report(&history, &CheckConfig::default()).unwrap();
    let elapsed = started.elapsed();
    assert_eq!(report.verdict, Verdict::Linearizable, "{}", report.verdict);
    assert_eq!(report.keys, 100);
    assert!(report.unknown_writes > 0, "{report:?}");
    println!("checked {OPS} operations in {elapsed:?}: {report:?}");
    // The search stays close to one configuration per operation; a regression in the pruning shows up here
    // whatever the machine's speed.
    assert!(report.states < 2 * OPS as u64, "{report:?}");
}

#[test]
fn hot_keys_with_sixteen_concurrent_clients() {
    const OPS: usize = 4_000;
    let history = large_history(0x407, OPS, 2, 16);
    let started = std::time::Instant::now();
    let report = check_report(&history, &CheckConfig::default()).unwrap();
    let elapsed = started.elapsed();
    assert_eq!(report.verdict, Verdict::Linearizable, "{}", report.verdict);
    println!("checked {OPS} operations in {elapsed:?}: {report:?}");
    assert!(report.states < 8 * OPS as u64, "{report:?}");
}
