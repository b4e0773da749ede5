//! Hand-written histories with known verdicts.

use super::*;
use crate::history::{Op, Outcome};

const K: &[u8] = b"k";

fn ev(client: u32, op: Op, invoked: u64, returned: Option<u64>, outcome: Outcome) -> Event {
    Event {
        client,
        op,
        invoked,
        returned,
        outcome,
    }
}

fn get(c: u32, inv: u64, ret: u64, v: Option<&str>) -> Event {
    ev(
        c,
        Op::Get(K.to_vec()),
        inv,
        Some(ret),
        Outcome::Value(v.map(|v| v.as_bytes().to_vec())),
    )
}

fn get_of(key: &str, c: u32, inv: u64, ret: u64, v: Option<&str>) -> Event {
    let mut e = get(c, inv, ret, v);
    e.op = Op::Get(key.as_bytes().to_vec());
    e
}

fn set(c: u32, inv: u64, ret: u64, v: &str) -> Event {
    ev(
        c,
        Op::Set(K.to_vec(), v.as_bytes().to_vec()),
        inv,
        Some(ret),
        Outcome::Ok,
    )
}

fn set_of(key: &str, c: u32, inv: u64, ret: u64, v: &str) -> Event {
    ev(
        c,
        Op::Set(key.as_bytes().to_vec(), v.as_bytes().to_vec()),
        inv,
        Some(ret),
        Outcome::Ok,
    )
}

fn set_unknown(c: u32, inv: u64, v: &str) -> Event {
    ev(
        c,
        Op::Set(K.to_vec(), v.as_bytes().to_vec()),
        inv,
        None,
        Outcome::Unknown,
    )
}

fn insert(c: u32, inv: u64, ret: u64, v: &str, applied: bool) -> Event {
    ev(
        c,
        Op::Insert(K.to_vec(), v.as_bytes().to_vec()),
        inv,
        Some(ret),
        Outcome::Applied(applied),
    )
}

fn update(c: u32, inv: u64, ret: u64, v: &str, applied: bool) -> Event {
    ev(
        c,
        Op::Update(K.to_vec(), v.as_bytes().to_vec()),
        inv,
        Some(ret),
        Outcome::Applied(applied),
    )
}

fn delete(c: u32, inv: u64, ret: u64, applied: bool) -> Event {
    ev(
        c,
        Op::Delete(K.to_vec()),
        inv,
        Some(ret),
        Outcome::Applied(applied),
    )
}

fn incr(c: u32, inv: u64, ret: u64, delta: i64, outcome: Outcome) -> Event {
    ev(c, Op::Incr(K.to_vec(), delta), inv, Some(ret), outcome)
}

fn verdict(events: Vec<Event>) -> Verdict {
    check(&History::new(events), &CheckConfig::default()).unwrap()
}

fn assert_lin(events: Vec<Event>) {
    let v = verdict(events);
    assert_eq!(v, Verdict::Linearizable, "{v}");
}

/// Asserts a violation on `key` and returns the explanation.
fn assert_not_lin_on(key: &[u8], events: Vec<Event>) -> String {
    match verdict(events) {
        Verdict::NotLinearizable {
            key: k,
            explanation,
        } => {
            assert_eq!(k, key, "{explanation}");
            explanation
        }
        other => panic!("expected a violation, got {other:?}"),
    }
}

fn assert_not_lin(events: Vec<Event>) -> String {
    assert_not_lin_on(K, events)
}

#[test]
fn empty_and_unknown_only_histories_are_linearizable() {
    assert_lin(vec![]);
    assert_lin(vec![
        set_unknown(1, 0, "a"),
        ev(2, Op::Get(K.to_vec()), 5, None, Outcome::Unknown),
        ev(3, Op::Incr(K.to_vec(), 1), 7, None, Outcome::Unknown),
    ]);
}

#[test]
fn sequential_history_of_every_operation() {
    assert_lin(vec![
        get(1, 0, 1, None),
        update(1, 2, 3, "x", false),
        delete(1, 4, 5, false),
        insert(1, 6, 7, "a", true),
        insert(1, 8, 9, "b", false),
        get(1, 10, 11, Some("a")),
        update(1, 12, 13, "b", true),
        get(1, 14, 15, Some("b")),
        incr(1, 16, 17, 1, Outcome::Error),
        get(1, 18, 19, Some("b")),
        set(1, 20, 21, "41"),
        incr(1, 22, 23, 1, Outcome::Int(42)),
        get(1, 24, 25, Some("42")),
        incr(1, 26, 27, -50, Outcome::Int(-8)),
        delete(1, 28, 29, true),
        incr(1, 30, 31, 3, Outcome::Int(3)),
        get(1, 32, 33, Some("3")),
        set(1, 34, 35, "3"),
        get(1, 36, 37, Some("3")),
    ]);
}

#[test]
fn sequential_history_with_wrong_answers() {
    assert_not_lin(vec![set(1, 0, 1, "a"), get(1, 2, 3, Some("b"))]);
    assert_not_lin(vec![set(1, 0, 1, "a"), delete(1, 2, 3, false)]);
    assert_not_lin(vec![delete(1, 2, 3, true)]);
    assert_not_lin(vec![update(1, 2, 3, "b", true)]);
    assert_not_lin(vec![set(1, 0, 1, "a"), update(1, 2, 3, "b", false)]);
    assert_not_lin(vec![set(1, 0, 1, "5"), incr(1, 2, 3, 1, Outcome::Int(5))]);
    assert_not_lin(vec![set(1, 0, 1, "5"), incr(1, 2, 3, 1, Outcome::Error)]);
    assert_not_lin(vec![set(1, 0, 1, "x"), incr(1, 2, 3, 1, Outcome::Int(1))]);
    assert_not_lin(vec![
        incr(1, 0, 1, 2, Outcome::Int(2)),
        get(1, 2, 3, Some("3")),
    ]);
}

#[test]
fn stale_read_after_a_completed_write() {
    let explanation = assert_not_lin(vec![
        set(1, 0, 10, "a"),
        set(1, 20, 30, "b"),
        get(2, 40, 50, Some("a")),
    ]);
    assert!(
        explanation.contains("#2 client 2 [40, 50] get -> \"a\""),
        "{explanation}"
    );
    assert!(
        explanation.contains("it read \"a\" but the value is \"b\""),
        "{explanation}"
    );
    assert!(
        explanation.contains("at most 2 of its 3 operations"),
        "{explanation}"
    );
    // The same read overlapping the second write may see either value.
    assert_lin(vec![
        set(1, 0, 10, "a"),
        set(1, 20, 30, "b"),
        get(2, 25, 50, Some("a")),
    ]);
    assert_lin(vec![
        set(1, 0, 10, "a"),
        set(1, 20, 30, "b"),
        get(2, 25, 50, Some("b")),
    ]);
}

#[test]
fn reads_observing_concurrent_writes_in_opposite_orders() {
    let writes = || vec![set(1, 0, 100, "a"), set(2, 0, 100, "b")];
    let mut events = writes();
    events.extend([get(3, 10, 20, Some("a")), get(3, 30, 40, Some("b"))]);
    events.extend([get(4, 10, 20, Some("b")), get(4, 30, 40, Some("a"))]);
    assert_not_lin(events);
    // Both readers agreeing on one order is fine.
    let mut events = writes();
    events.extend([get(3, 10, 20, Some("a")), get(3, 30, 40, Some("b"))]);
    events.extend([get(4, 10, 20, Some("a")), get(4, 30, 40, Some("b"))]);
    assert_lin(events);
}

#[test]
fn read_of_a_value_never_written() {
    assert_not_lin(vec![set(1, 0, 10, "a"), get(2, 5, 15, Some("zz"))]);
    assert_not_lin(vec![get(2, 5, 15, Some(""))]);
}

#[test]
fn insert_succeeding_twice() {
    assert_not_lin(vec![
        insert(1, 0, 10, "a", true),
        insert(2, 20, 30, "b", true),
    ]);
    // Even when concurrent: only one of them can find the key absent.
    assert_not_lin(vec![
        insert(1, 0, 10, "a", true),
        insert(2, 0, 10, "b", true),
    ]);
    // A delete between them, or concurrent with both, makes it possible.
    assert_lin(vec![
        insert(1, 0, 10, "a", true),
        delete(3, 12, 18, true),
        insert(2, 20, 30, "b", true),
    ]);
    assert_lin(vec![
        insert(1, 0, 10, "a", true),
        delete(3, 5, 25, true),
        insert(2, 20, 30, "b", true),
    ]);
    // But not a delete that reports finding nothing.
    assert_not_lin(vec![
        insert(1, 0, 10, "a", true),
        delete(3, 5, 25, false),
        insert(2, 20, 30, "b", true),
    ]);
}

#[test]
fn overlapping_writes_ordered_by_what_reads_saw() {
    // The later-invoked write must go first for the read to see "a".
    assert_lin(vec![
        set(1, 0, 100, "a"),
        set(2, 10, 100, "b"),
        get(3, 150, 160, Some("a")),
    ]);
    // The read pins the order a, b; a second read then cannot see "a" again.
    assert_not_lin(vec![
        set(1, 0, 100, "a"),
        set(2, 10, 100, "b"),
        get(3, 50, 60, Some("a")),
        get(3, 150, 160, Some("b")),
        get(3, 170, 180, Some("a")),
    ]);
    // Concurrent increments may take effect in the opposite order to their invocations.
    assert_lin(vec![
        incr(1, 0, 50, 1, Outcome::Int(2)),
        incr(2, 10, 40, 1, Outcome::Int(1)),
        get(3, 60, 70, Some("2")),
    ]);
    assert_not_lin(vec![
        incr(1, 0, 50, 1, Outcome::Int(2)),
        incr(2, 10, 40, 1, Outcome::Int(2)),
    ]);
    // An insert seen as done by one read and not yet by an overlapping one.
    assert_lin(vec![
        insert(1, 0, 100, "v", true),
        get(2, 10, 20, Some("v")),
        get(3, 5, 90, None),
        update(4, 30, 40, "w", true),
        get(2, 50, 60, Some("w")),
    ]);
}

#[test]
fn touching_intervals_count_as_concurrent() {
    // The read is invoked at the very nanosecond the write returned.
    assert_lin(vec![set(1, 0, 10, "a"), get(2, 10, 20, None)]);
    assert_not_lin(vec![set(1, 0, 10, "a"), get(2, 11, 20, None)]);
}

#[test]
fn unknown_write_that_must_have_taken_effect() {
    assert_lin(vec![
        set_unknown(1, 0, "a"),
        get(2, 5, 8, None),
        get(2, 10, 20, Some("a")),
    ]);
    // After its effect has been seen it cannot be undone.
    assert_not_lin(vec![
        set_unknown(1, 0, "a"),
        get(2, 10, 20, Some("a")),
        get(2, 30, 40, None),
    ]);
    // Nor can it take effect before its invocation.
    assert_not_lin(vec![get(2, 0, 5, Some("a")), set_unknown(1, 10, "a")]);
    // An unknown increment applies once, at most.
    let unknown_incr = ev(1, Op::Incr(K.to_vec(), 1), 0, None, Outcome::Unknown);
    assert_lin(vec![unknown_incr.clone(), get(2, 10, 20, Some("1"))]);
    assert_not_lin(vec![unknown_incr.clone(), get(2, 10, 20, Some("2"))]);
    assert_not_lin(vec![
        unknown_incr,
        get(2, 10, 20, Some("1")),
        get(2, 30, 40, None),
    ]);
}

#[test]
fn unknown_write_that_must_not_have_taken_effect() {
    assert_lin(vec![
        set(1, 0, 10, "1"),
        set_unknown(2, 20, "2"),
        get(3, 30, 40, Some("1")),
        get(3, 50, 60, Some("1")),
    ]);
    // An unknown insert on a key that later reads absent never happened (or happens after everything seen).
    let unknown_insert = ev(
        2,
        Op::Insert(K.to_vec(), b"v".to_vec()),
        0,
        None,
        Outcome::Unknown,
    );
    assert_lin(vec![
        unknown_insert.clone(),
        get(3, 30, 40, None),
        insert(4, 50, 60, "w", true),
    ]);
    assert_not_lin(vec![
        unknown_insert,
        get(3, 30, 40, Some("v")),
        get(3, 50, 60, None),
    ]);
    // An unknown delete leaves the value alone when it is read again later.
    let unknown_delete = ev(2, Op::Delete(K.to_vec()), 15, None, Outcome::Unknown);
    assert_lin(vec![
        set(1, 0, 10, "a"),
        unknown_delete.clone(),
        get(3, 30, 40, Some("a")),
    ]);
    assert_lin(vec![
        set(1, 0, 10, "a"),
        unknown_delete,
        get(3, 30, 40, None),
        set(1, 50, 60, "b"),
    ]);
}

#[test]
fn unknown_write_applies_only_once() {
    assert_not_lin(vec![
        set_unknown(1, 0, "a"),
        get(2, 10, 20, Some("a")),
        set(3, 30, 40, "b"),
        get(2, 50, 60, Some("a")),
    ]);
}

#[test]
fn unknown_write_needed_late_after_others() {
    // "b" (invoked second) must apply before the first read, "a" only after the known write of "c".
    let events = vec![
        set_unknown(1, 0, "a"),
        set_unknown(2, 1, "b"),
        get(3, 10, 20, Some("b")),
        set(3, 30, 40, "c"),
        get(3, 50, 60, Some("a")),
    ];
    assert_lin(events.clone());
    let mut more = events;
    more.push(get(3, 70, 80, Some("b")));
    assert_not_lin(more);
}

#[test]
fn many_unknown_writes_do_not_blow_up_the_search() {
    // Forty unknown writes of distinct values, concurrent with everything after them, then a long run of known
    // writes and reads ending in a read of a value nobody wrote: every placement of the unknown writes must be
    // ruled out.
    let mut events: Vec<Event> = (0..40)
        .map(|i| set_unknown(100 + i, i as u64, &format!("u{i}")))
        .collect();
    let mut t = 1000;
    for i in 0..100 {
        events.push(set(1, t, t + 10, &format!("k{i}")));
        events.push(get(2, t + 20, t + 30, Some(&format!("k{i}"))));
        t += 100;
    }
    let lin = events.clone();
    events.push(get(2, t, t + 10, Some("nobody")));
    let report = check_report(&History::new(lin), &CheckConfig::default()).unwrap();
    assert_eq!(report.verdict, Verdict::Linearizable);
    assert_eq!(report.unknown_writes, 40);
    let report = check_report(&History::new(events), &CheckConfig::default()).unwrap();
    assert!(
        matches!(report.verdict, Verdict::NotLinearizable { .. }),
        "{}",
        report.verdict
    );
    assert!(report.states < 50_000, "visited {} states", report.states);
}

#[test]
fn incr_error_and_integer_syntax() {
    let h =
        |v: &str, outcome: Outcome| History::new(vec![set(1, 0, 1, v), incr(1, 2, 3, 1, outcome)]);
    let strict = CheckConfig::default();
    let lenient = CheckConfig {
        int_syntax: IntSyntax::Lenient,
        ..CheckConfig::default()
    };
    assert!(
        check(&h("007", Outcome::Error), &strict)
            .unwrap()
            .is_linearizable()
    );
    assert!(
        !check(&h("007", Outcome::Int(8)), &strict)
            .unwrap()
            .is_linearizable()
    );
    assert!(
        check(&h("007", Outcome::Int(8)), &lenient)
            .unwrap()
            .is_linearizable()
    );
    assert!(
        !check(&h("007", Outcome::Error), &lenient)
            .unwrap()
            .is_linearizable()
    );
    // Overflow is an error that changes nothing.
    let max = i64::MAX.to_string();
    let events = vec![
        set(1, 0, 1, &max),
        incr(1, 2, 3, 1, Outcome::Error),
        get(1, 4, 5, Some(&max)),
    ];
    assert_lin(events);
    // An error increment leaves the value as it was.
    assert_not_lin(vec![
        set(1, 0, 1, "x"),
        incr(1, 2, 3, 1, Outcome::Error),
        get(1, 4, 5, Some("1")),
    ]);
}

#[test]
fn initial_values() {
    let events = || vec![get(1, 0, 1, Some("init")), incr(1, 2, 3, 1, Outcome::Error)];
    let history = History::new(events()).with_initial(K.to_vec(), b"init".to_vec());
    assert!(
        check(&history, &CheckConfig::default())
            .unwrap()
            .is_linearizable()
    );
    assert!(
        !check(&History::new(events()), &CheckConfig::default())
            .unwrap()
            .is_linearizable()
    );
    let history = History::new(vec![incr(1, 0, 1, 5, Outcome::Int(15))])
        .with_initial(K.to_vec(), b"10".to_vec());
    assert!(
        check(&history, &CheckConfig::default())
            .unwrap()
            .is_linearizable()
    );
    // Initial values of other keys do not leak.
    let history =
        History::new(vec![get(1, 0, 1, None)]).with_initial(b"other".to_vec(), b"x".to_vec());
    assert!(
        check(&history, &CheckConfig::default())
            .unwrap()
            .is_linearizable()
    );
}

#[test]
fn keys_are_independent_and_the_first_bad_key_is_reported() {
    // Each key on its own is fine although the interleaving crosses keys.
    assert_lin(vec![
        set_of("x", 1, 0, 10, "1"),
        set_of("y", 2, 0, 10, "1"),
        get_of("x", 3, 5, 20, Some("1")),
        get_of("y", 3, 25, 30, Some("1")),
    ]);
    let events = vec![
        set_of("b", 1, 0, 10, "1"),
        get_of("b", 1, 20, 30, None),
        set_of("a", 1, 0, 10, "1"),
        get_of("a", 1, 20, 30, Some("1")),
        set_of("c", 1, 0, 10, "1"),
        get_of("c", 1, 20, 30, Some("2")),
    ];
    assert_not_lin_on(b"b", events);
}

#[test]
fn budget_exhaustion_is_inconclusive_but_a_later_violation_wins() {
    let concurrent: Vec<Event> = (0..6)
        .map(|i| set_of("a", i, 0, 100, &i.to_string()))
        .collect();
    let config = CheckConfig {
        max_states_per_key: 2,
        ..CheckConfig::default()
    };
    let mut events = concurrent.clone();
    events.push(get_of("a", 9, 200, 210, Some("0")));
    match check(&History::new(events.clone()), &config).unwrap() {
        Verdict::Inconclusive { key, reason } => {
            assert_eq!(key, b"a");
            assert!(reason.contains("max_states_per_key = 2"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // With the default budget the same history is fine.
    assert!(
        check(&History::new(events.clone()), &CheckConfig::default())
            .unwrap()
            .is_linearizable()
    );
    events.push(set_of("b", 1, 0, 1, "x"));
    events.push(get_of("b", 1, 2, 3, Some("y")));
    assert!(
        matches!(check(&History::new(events), &config).unwrap(), Verdict::NotLinearizable { key, .. } if key == b"b")
    );
}

#[test]
fn malformed_histories_are_errors() {
    let bad = History::new(vec![set(1, 10, 5, "a")]);
    assert!(matches!(
        check(&bad, &CheckConfig::default()),
        Err(HistoryError::ResponseBeforeInvocation { .. })
    ));
    let bad = History::new(vec![ev(1, Op::Delete(K.to_vec()), 0, Some(1), Outcome::Ok)]);
    assert!(matches!(
        check(&bad, &CheckConfig::default()),
        Err(HistoryError::WrongOutcome { .. })
    ));
}

#[test]
fn explanation_shows_the_window_and_the_blocked_operation() {
    let mut events: Vec<Event> = (0..20)
        .map(|i| set(1, i * 10, i * 10 + 5, &format!("v{i}")))
        .collect();
    events.push(set(2, 300, 400, "late"));
    events.push(get(3, 350, 360, Some("v3")));
    events.push(set_unknown(4, 320, "u"));
    let config = CheckConfig {
        explain_ops: 4,
        ..CheckConfig::default()
    };
    let explanation = match check(&History::new(events), &config).unwrap() {
        Verdict::NotLinearizable { explanation, .. } => explanation,
        other => panic!("{other:?}"),
    };
    assert!(
        explanation.contains("at most 21 of its 22 operations"),
        "{explanation}"
    );
    assert!(
        explanation.contains("The last 4 operations"),
        "{explanation}"
    );
    assert!(
        explanation.contains("#19 client 1 [190, 195] set \"v19\" -> ok   => value \"v19\""),
        "{explanation}"
    );
    assert!(
        explanation.contains("#20 client 2 [300, 400] set \"late\" -> ok   => value \"late\""),
        "{explanation}"
    );
    assert!(!explanation.contains("#16 "), "{explanation}");
    assert!(
        explanation.contains("The value after them: \"late\"."),
        "{explanation}"
    );
    assert!(
        explanation
            .contains("* #21 client 3 [350, 360] get -> \"v3\": cannot: it read \"v3\" but the value is \"late\""),
        "{explanation}"
    );
    assert!(
        explanation.contains("  #22 client 4 [320, ?] set \"u\" -> unknown: can (value \"u\")"),
        "{explanation}"
    );
}

#[test]
fn report_counts_work() {
    let events = vec![
        set(1, 0, 10, "a"),
        ev(2, Op::Get(K.to_vec()), 0, None, Outcome::Unknown),
        set_unknown(3, 5, "b"),
        get_of("other", 1, 0, 1, None),
    ];
    let report = check_report(&History::new(events), &CheckConfig::default()).unwrap();
    assert_eq!(report.verdict, Verdict::Linearizable);
    assert_eq!(
        (
            report.keys,
            report.ops,
            report.dropped_reads,
            report.unknown_writes
        ),
        (2, 3, 1, 1)
    );
    assert!(
        report.states >= 2 && report.max_key_states >= 1,
        "{report:?}"
    );
}

fn incr_unknown(c: u32, inv: u64, delta: i64) -> Event {
    ev(c, Op::Incr(K.to_vec(), delta), inv, None, Outcome::Unknown)
}

#[test]
fn unknown_increments_fill_gaps_exactly() {
    // Unknown increments by 2, 3, 4 and 5; the known ones leave gaps of 7, 5 and 2, which only 3 + 4, then 5, then
    // 2 fill (2 + 5 for the first gap leaves nothing for the second).
    let unknown = || (0..4).map(|i| incr_unknown(10 + i, i as u64, i as i64 + 2));
    let mut events: Vec<Event> = unknown().collect();
    events.extend([
        incr(1, 100, 110, 1, Outcome::Int(1)),
        incr(1, 120, 130, 1, Outcome::Int(9)),
        incr(1, 140, 150, 1, Outcome::Int(15)),
        incr(1, 160, 170, 1, Outcome::Int(18)),
    ]);
    assert_lin(events);
    // A gap no subset of the unknown increments makes.
    let mut events: Vec<Event> = unknown().collect();
    events.extend([
        incr(1, 100, 110, 1, Outcome::Int(1)),
        incr(1, 120, 130, 1, Outcome::Int(3)),
    ]);
    assert_not_lin(events);
    // Each unknown increment applies once: 2 + 3 + 4 + 5 = 14 at most.
    let mut events: Vec<Event> = unknown().collect();
    events.extend([
        incr(1, 100, 110, 1, Outcome::Int(15)),
        get(1, 120, 130, Some("15")),
    ]);
    assert_lin(events);
    let mut events: Vec<Event> = unknown().collect();
    events.extend([incr(1, 100, 110, 1, Outcome::Int(17))]);
    assert_not_lin(events);
}

#[test]
fn many_unknown_increments_do_not_blow_up_the_search() {
    // Forty unknown increments, then a hundred known ones that leave no gap for them, then a read of a value the
    // counter has long passed: every subset of the unknown increments must be ruled out.
    let mut events: Vec<Event> = (0..40)
        .map(|i| incr_unknown(100 + i, i as u64, i64::from(i % 4) + 1))
        .collect();
    let mut t = 1000;
    for i in 1..=100 {
        events.push(incr(1, t, t + 10, 1, Outcome::Int(i)));
        t += 100;
    }
    let lin = events.clone();
    events.push(get(2, t, t + 10, Some("50")));
    let report = check_report(&History::new(lin), &CheckConfig::default()).unwrap();
    assert_eq!(report.verdict, Verdict::Linearizable);
    let report = check_report(&History::new(events), &CheckConfig::default()).unwrap();
    assert!(
        matches!(report.verdict, Verdict::NotLinearizable { .. }),
        "{}",
        report.verdict
    );
    assert!(report.states < 10_000, "visited {} states", report.states);
}
