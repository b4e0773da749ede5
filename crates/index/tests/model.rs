//! The index against a `HashMap` model: colliding hashes, tiny tables, many resizes; read locally, remotely in
//! process and over TCP.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::*;
use dinomo_fabric::Endpoint;
use dinomo_index::{EntryRef, Index, RemoteIndex};
use proptest::prelude::*;

#[derive(Debug, Clone, Copy)]
enum Op {
    Upsert(u8),
    Remove(u8),
    Get(u8),
    /// The log cleaner's move of the key's entry to a new place: from its current reference (`false`), or from one
    /// it no longer has (`true`: the key was written since the cleaner read it), which must change nothing.
    Move(u8, bool),
}

const KEYS: u8 = 40;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..KEYS).prop_map(Op::Upsert),
        2 => (0..KEYS).prop_map(Op::Remove),
        1 => (0..KEYS).prop_map(Op::Get),
        2 => (0..KEYS, any::<bool>()).prop_map(|(k, stale)| Op::Move(k, stale)),
    ]
}

/// The index, the model, and the side table that says which key each entry reference stands for (as the log
/// entry would).
struct World {
    index: Index,
    model: HashMap<u8, EntryRef>,
    side: HashMap<EntryRef, Vec<u8>>,
    nhash: u64,
    next: u64,
}

fn key_bytes(k: u8) -> Vec<u8> {
    format!("user-key-{k}").into_bytes()
}

impl World {
    fn new(index: Index, nhash: u64) -> World {
        World {
            index,
            model: HashMap::new(),
            side: HashMap::new(),
            nhash,
            next: 1,
        }
    }

    /// Small hash values: keys collide on purpose.
    fn hash(&self, k: u8) -> u64 {
        1 + u64::from(k) % self.nhash
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Upsert(k) => {
                let r = EntryRef::new(8 * self.next, 8).unwrap();
                self.next += 1;
                let key = key_bytes(k);
                self.side.insert(r, key.clone());
                let side = &self.side;
                let old = self
                    .index
                    .upsert(self.hash(k), r, |e| side[&e] == key)
                    .unwrap();
                assert_eq!(old, self.model.insert(k, r), "upsert {k}");
            }
            Op::Remove(k) => {
                let key = key_bytes(k);
                let side = &self.side;
                let old = self.index.remove(self.hash(k), |e| side[&e] == key);
                assert_eq!(old, self.model.remove(&k), "remove {k}");
            }
            Op::Get(k) => {
                let key = key_bytes(k);
                let got = self.index.get(self.hash(k), |e| self.side[&e] == key);
                assert_eq!(got, self.model.get(&k).copied(), "get {k}");
            }
            Op::Move(k, stale) => {
                let to = EntryRef::new(8 * self.next, 8).unwrap();
                self.next += 1;
                self.side.insert(to, key_bytes(k));
                // A stale source: a reference no slot holds, as when the key was written since the cleaner read it.
                let from = match self.model.get(&k) {
                    Some(&cur) if !stale => cur,
                    _ => EntryRef::new(8 * self.next, 8).unwrap(),
                };
                self.next += 1;
                let moved = self.index.replace(self.hash(k), from, to).unwrap();
                let expect = self.model.get(&k) == Some(&from);
                assert_eq!(moved, expect, "move {k} (stale {stale})");
                if expect {
                    self.model.insert(k, to);
                }
            }
        }
    }

    fn check_local(&self) {
        for k in 0..KEYS {
            let key = key_bytes(k);
            let got = self.index.get(self.hash(k), |e| self.side[&e] == key);
            assert_eq!(got, self.model.get(&k).copied(), "get {k}");
        }
        assert_eq!(self.index.len(), self.model.len() as u64);
    }

    fn check_remote(&self, remote: &mut RemoteIndex, ep: &mut Endpoint) {
        let mut out = Vec::new();
        // The keys' walks side by side give what each walk alone gives, in the same order; hashes may repeat.
        let hashes: Vec<u64> = (0..KEYS).map(|k| self.hash(k)).collect();
        let mut together = Vec::new();
        remote
            .candidates_of_many(ep, &hashes, &mut together)
            .unwrap();
        for (i, &h) in hashes.iter().enumerate() {
            remote.candidates(ep, h, &mut out).unwrap();
            let mine: Vec<EntryRef> = together
                .iter()
                .filter(|&&(j, _)| j == i)
                .map(|&(_, r)| r)
                .collect();
            assert_eq!(mine, out, "walks side by side, hash {h}");
        }
        remote.candidates_of_many(ep, &[], &mut together).unwrap();
        assert!(together.is_empty());
        for k in 0..KEYS {
            let h = self.hash(k);
            remote.candidates(ep, h, &mut out).unwrap();
            // Every candidate carries this hash; exactly the model's reference has this key.
            for c in &out {
                let ck = &self.side[c];
                let ck: u8 = std::str::from_utf8(&ck[9..]).unwrap().parse().unwrap();
                assert_eq!(self.hash(ck), h, "candidate of another hash");
            }
            let key = key_bytes(k);
            let hits: Vec<EntryRef> = out
                .iter()
                .copied()
                .filter(|e| self.side[e] == key)
                .collect();
            let want: Vec<EntryRef> = self.model.get(&k).copied().into_iter().collect();
            assert_eq!(hits, want, "remote lookup of {k}");
        }
    }

    fn check_for_each(&self) {
        let mut got = Vec::new();
        self.index.for_each(|h, e| got.push((h, e)));
        got.sort();
        let mut want: Vec<(u64, EntryRef)> = self
            .model
            .iter()
            .map(|(&k, &e)| (self.hash(k), e))
            .collect();
        want.sort();
        assert_eq!(got, want);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn index_agrees_with_a_hashmap_model(
        ops in proptest::collection::vec(op(), 1..300),
        nhash in 1u64..9,
        overflow in prop_oneof![Just(0.0), Just(0.1), Just(0.25), Just(1.0)],
    ) {
        let pool = anon_pool(64 << 20);
        let node = node(&pool);
        let index = Index::create(pool.clone(), &tiny(overflow)).unwrap();
        let mut ep = in_process(&node);
        let mut remote = RemoteIndex::connect(&mut ep).unwrap();
        let mut w = World::new(index, nhash);
        for (i, op) in ops.iter().enumerate() {
            w.apply(*op);
            w.check_local();
            if i % 16 == 15 {
                w.check_remote(&mut remote, &mut ep);
            }
        }
        w.check_remote(&mut remote, &mut ep);
        w.check_for_each();
        // Everything but the current table was reclaimed (the grace is zero).
        let tables = pool
            .allocated()
            .iter()
            .filter(|e| e.tag == dinomo_log::tags::INDEX_TABLE)
            .count();
        prop_assert_eq!(tables, 1);
    }
}

/// A fixed pseudo-random sequence with many resizes, read over TCP after every step.
#[test]
fn model_sequence_read_over_tcp() {
    let pool = anon_pool(64 << 20);
    let node = node(&pool);
    let server = tcp_server(&node);
    let index = Index::create(pool.clone(), &tiny(0.25)).unwrap();
    let mut ep = tcp_endpoint(&server);
    assert_eq!(ep.transport_name(), "tcp");
    let mut remote = RemoteIndex::connect(&mut ep).unwrap();
    let mut w = World::new(index, 5);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..600 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = (x % u64::from(KEYS)) as u8;
        let op = if x % 3 == 0 {
            Op::Remove(k)
        } else {
            Op::Upsert(k)
        };
        w.apply(op);
        w.check_remote(&mut remote, &mut ep);
    }
    w.check_local();
    w.check_for_each();
    assert!(w.index.stats().resizes >= 3, "{:?}", w.index.stats());
}

/// Many keys, well-mixed hashes: the table grows through many doublings and every key stays reachable.
#[test]
fn growth_through_many_resizes() {
    let pool = anon_pool(128 << 20);
    let node = node(&pool);
    let index = Arc::new(Index::create(pool.clone(), &tiny(0.25)).unwrap());
    for k in 0..20_000u64 {
        assert_eq!(
            index
                .upsert(hash_of(k), eref(k, 1), |e| key_of(e) == k)
                .unwrap(),
            None
        );
    }
    let s = index.stats();
    assert!(s.resizes >= 12, "{s:?}");
    assert!(s.buckets >= 8192, "{s:?}");
    assert!(s.entries as f64 <= 0.75 * (3 * s.buckets) as f64, "{s:?}");
    let mut ep = in_process(&node);
    let mut remote = RemoteIndex::connect(&mut ep).unwrap();
    let mut out = Vec::new();
    for k in (0..20_000u64).step_by(7) {
        assert_eq!(index.get(hash_of(k), |e| key_of(e) == k), Some(eref(k, 1)));
        remote.candidates(&mut ep, hash_of(k), &mut out).unwrap();
        assert_eq!(out, vec![eref(k, 1)]);
    }
    // Walked side by side, 64 keys (half of them absent) cost the round trips of the longest of their walks alone.
    let keys: Vec<u64> = (0..64u64).map(|i| i * 613 + (i % 2) * 20_000).collect();
    let rts = || dinomo_fabric::counters::thread_snapshot().round_trips;
    let mut longest = 0;
    for &k in &keys {
        let before = rts();
        remote.candidates(&mut ep, hash_of(k), &mut out).unwrap();
        longest = longest.max(rts() - before);
    }
    let hashes: Vec<u64> = keys.iter().map(|&k| hash_of(k)).collect();
    let mut together = Vec::new();
    let before = rts();
    remote
        .candidates_of_many(&mut ep, &hashes, &mut together)
        .unwrap();
    assert_eq!(rts() - before, longest);
    let want: Vec<(usize, EntryRef)> = keys
        .iter()
        .enumerate()
        .filter(|&(_, &k)| k < 20_000)
        .map(|(i, &k)| (i, eref(k, 1)))
        .collect();
    assert_eq!(together, want);
    // Absent keys: no candidate.
    for k in 20_000..20_100u64 {
        remote.candidates(&mut ep, hash_of(k), &mut out).unwrap();
        assert!(out.is_empty());
        assert_eq!(index.get(hash_of(k), |_| true), None);
    }
}
