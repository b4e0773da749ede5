//! Model-based property test: random operation sequences against a map of the latest value
//! and shortcut of every key (or the record that it has none), for every policy.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

#[derive(Clone, Debug)]
enum Op {
    /// The read path of a KV node: lookup, then fill on a miss (`fill_absent` when the walk
    /// found no value: `none`), or on a shortcut hit either `shortcut_hit` or (when `stale`)
    /// `stale_shortcut` followed by a fill.
    Read {
        key: u8,
        len: usize,
        stale: bool,
        none: bool,
    },
    FillAbsent(u8),
    Lookup(u8),
    Fill(u8, usize),
    ShortcutHit(u8, usize),
    Write(u8, usize),
    Invalidate(u8),
    Stale(u8),
    SetBudget(u64),
    MissRoundTrips(u32),
    Clear,
    /// A worker's batch announced before its lookups: must change nothing a caller can see.
    Prefetch(Vec<u8>),
}

const KEYS: u8 = 12;

/// Distinct keys of lengths 0 to 3.
fn key(i: u8) -> Vec<u8> {
    if i == 0 {
        Vec::new()
    } else {
        vec![i; 1 + usize::from(i) % 3]
    }
}

fn value_len() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), 0..40usize, 0..400usize, 400..1200usize]
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0..KEYS;
    prop_oneof![
        6 => (k.clone(), value_len(), prop::bool::weighted(0.1), prop::bool::weighted(0.2))
            .prop_map(|(key, len, stale, none)| Op::Read { key, len, stale, none }),
        1 => k.clone().prop_map(Op::FillAbsent),
        2 => k.clone().prop_map(Op::Lookup),
        2 => (k.clone(), value_len()).prop_map(|(k, l)| Op::Fill(k, l)),
        1 => (k.clone(), value_len()).prop_map(|(k, l)| Op::ShortcutHit(k, l)),
        3 => (k.clone(), value_len()).prop_map(|(k, l)| Op::Write(k, l)),
        1 => k.clone().prop_map(Op::Invalidate),
        1 => k.clone().prop_map(Op::Stale),
        1 => (0..4000u64).prop_map(Op::SetBudget),
        1 => (0..12u32).prop_map(Op::MissRoundTrips),
        1 => Just(Op::Clear),
        2 => prop::collection::vec(k, 0..20).prop_map(Op::Prefetch),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        3 => Just(Policy::Adaptive),
        2 => (0..=100u8).prop_map(|value_percent| Policy::Static { value_percent }),
        1 => Just(Policy::ValueOnly),
        1 => Just(Policy::ShortcutOnly),
    ]
}

struct Harness {
    dac: Dac,
    /// The latest value and shortcut of each key, `None` for a key recorded as having none.
    model: HashMap<Vec<u8>, Option<(Vec<u8>, Shortcut)>>,
    lookups: u64,
    version: u64,
}

impl Harness {
    /// A fresh value and shortcut, different from every earlier one.
    fn next(&mut self, len: usize) -> (Vec<u8>, Shortcut) {
        self.version += 1;
        let v = self.version;
        let value = (0..len).map(|i| (v as usize + i * 31) as u8).collect();
        (value, Shortcut { ptr: v, seq: !v })
    }

    fn lookup(&mut self, k: &[u8]) -> Option<EntryKind> {
        self.lookups += 1;
        let latest = self.model.get(k);
        let present = || {
            latest
                .expect("a cached key is in the model")
                .as_ref()
                .unwrap_or_else(|| panic!("{k:?} has no value, but the cache has one"))
        };
        match self.dac.lookup(k) {
            Lookup::Value { value, shortcut } => {
                let (v, s) = present();
                assert_eq!(value, &v[..], "stale value for {k:?}");
                assert_eq!(shortcut, *s, "stale shortcut for {k:?}");
                Some(EntryKind::Value)
            }
            Lookup::Shortcut(shortcut) => {
                let (_, s) = present();
                assert_eq!(shortcut, *s, "stale shortcut for {k:?}");
                Some(EntryKind::Shortcut)
            }
            Lookup::Absent => {
                assert_eq!(
                    latest,
                    Some(&None),
                    "{k:?} was written since it had no value"
                );
                Some(EntryKind::Absent)
            }
            Lookup::Miss => None,
        }
    }

    fn fill(&mut self, k: &[u8], len: usize) {
        let (value, shortcut) = self.next(len);
        self.dac.fill(k, &value, shortcut);
        self.model.insert(k.to_vec(), Some((value, shortcut)));
    }

    /// A walk that found no value for `k`: recorded as such when nothing is cached for it.
    fn fill_absent(&mut self, k: &[u8]) {
        let before = self.dac.stats();
        let was = self.dac.contains(k);
        self.dac.fill_absent(k);
        let after = self.dac.stats();
        if was.is_some() {
            assert_eq!(
                self.dac.contains(k),
                was,
                "a cached key's entry was replaced"
            );
            return;
        }
        // Only free space is used: nothing else is demoted or evicted.
        assert_eq!(
            (
                after.values,
                after.shortcuts,
                after.demotions,
                after.evictions
            ),
            (
                before.values,
                before.shortcuts,
                before.demotions,
                before.evictions
            ),
        );
        if self.dac.contains(k).is_some() {
            assert_eq!(self.dac.contains(k), Some(EntryKind::Absent));
            self.model.insert(k.to_vec(), None);
        } else {
            // Not recorded (no room): the model's entry for it, if any, is left as it was, and it is a miss.
            assert_eq!(after.absents, before.absents);
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Prefetch(ref keys) => {
                let seen = |dac: &Dac| {
                    let entries: Vec<_> = (0..KEYS).map(|i| dac.contains(&key(i))).collect();
                    (dac.stats(), entries)
                };
                let before = seen(&self.dac);
                let keys: Vec<Vec<u8>> = keys.iter().map(|&i| key(i)).collect();
                self.dac.prefetch(keys.iter().map(Vec::as_slice));
                assert_eq!(seen(&self.dac), before, "a prefetch changed the cache");
            }
            Op::Read {
                key: i,
                len,
                stale,
                none,
            } => {
                let k = key(i);
                match self.lookup(&k) {
                    None if none => self.fill_absent(&k),
                    None => self.fill(&k, len),
                    Some(EntryKind::Shortcut) if stale => {
                        self.dac.stale_shortcut(&k);
                        assert_eq!(self.dac.contains(&k), None);
                        self.fill(&k, len);
                    }
                    Some(EntryKind::Shortcut) => {
                        // The value may have been rewritten remotely: read a new version.
                        let (value, shortcut) = self.next(len);
                        self.dac.shortcut_hit(&k, &value, shortcut);
                        self.model.insert(k, Some((value, shortcut)));
                    }
                    Some(EntryKind::Value | EntryKind::Absent) => {}
                }
            }
            Op::Lookup(i) => {
                self.lookup(&key(i));
            }
            Op::Fill(i, len) => self.fill(&key(i), len),
            Op::FillAbsent(i) => self.fill_absent(&key(i)),
            Op::ShortcutHit(i, len) => {
                let k = key(i);
                let (value, shortcut) = self.next(len);
                self.dac.shortcut_hit(&k, &value, shortcut);
                self.model.insert(k, Some((value, shortcut)));
            }
            Op::Write(i, len) => {
                let k = key(i);
                let (value, shortcut) = self.next(len);
                self.dac.write(&k, &value, shortcut);
                self.model.insert(k, Some((value, shortcut)));
            }
            Op::Invalidate(i) => {
                let k = key(i);
                self.dac.invalidate(&k);
                self.model.remove(&k);
                assert_eq!(self.dac.contains(&k), None);
            }
            Op::Stale(i) => {
                let k = key(i);
                let was = self.dac.contains(&k);
                self.dac.stale_shortcut(&k);
                let now = self.dac.contains(&k);
                match was {
                    Some(EntryKind::Shortcut) => assert_eq!(now, None),
                    other => assert_eq!(now, other),
                }
            }
            Op::SetBudget(b) => self.dac.set_budget(b),
            Op::MissRoundTrips(rts) => {
                let before = self.dac.miss_cost();
                self.dac.record_miss_round_trips(rts);
                let after = self.dac.miss_cost();
                let target = f64::from(rts);
                assert!((after - target).abs() <= (before - target).abs() + 1e-9);
            }
            Op::Clear => {
                self.dac.clear();
                assert!(self.dac.is_empty());
            }
        }
    }

    fn check(&self) {
        self.dac.check_invariants();
        let st = self.dac.stats();
        assert!(st.used_bytes <= st.budget_bytes, "{st:?}");
        assert_eq!(
            st.value_hits + st.shortcut_hits + st.misses + st.absent_hits,
            self.lookups
        );
        let (mut values, mut shortcuts, mut absents) = (0, 0, 0);
        for i in 0..KEYS {
            let k = key(i);
            match self.dac.contains(&k) {
                Some(EntryKind::Value) => values += 1,
                Some(EntryKind::Shortcut) => shortcuts += 1,
                Some(EntryKind::Absent) => {
                    assert_eq!(self.model.get(&k), Some(&None), "{k:?} has a value");
                    absents += 1;
                }
                None => continue,
            }
            assert!(
                self.model.contains_key(&k),
                "{k:?} is cached but was invalidated"
            );
        }
        assert_eq!(
            (st.values, st.shortcuts, st.absents),
            (values, shortcuts, absents)
        );
        match self.dac.policy().value_percent() {
            Some(0) => assert_eq!(st.values + st.absents, 0),
            Some(100) => assert_eq!(st.shortcuts, 0),
            Some(percent) => {
                assert!(st.value_bytes <= st.budget_bytes * u64::from(percent) / 100);
            }
            None => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn cache_agrees_with_model(
        policy in policy(),
        budget in 0..4000u64,
        remember_absent in prop::bool::weighted(0.8),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let mut h = Harness {
            dac: Dac::new(CacheConfig {
                budget_bytes: budget,
                policy,
                initial_miss_cost: 2.0,
                miss_cost_weight: 0.25,
                remember_absent,
            }),
            model: HashMap::new(),
            lookups: 0,
            version: 0,
        };
        for op in &ops {
            h.apply(op);
            h.check();
        }
    }
}
