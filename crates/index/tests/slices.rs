//! Walking the index slice by slice with a reversed-bits cursor (what `SCAN` does): a whole walk visits every entry
//! that was there from its start to its end, even while the index grows and the walk's resolution changes.

mod common;

use std::collections::{HashMap, HashSet};

use common::*;
use dinomo_index::{EntryRef, Index, IndexConfig, next_slice};
use proptest::prelude::*;

/// Key `k`'s entry stands at `8 * k` so that the walk can tell which key it found.
fn entry(k: u64) -> EntryRef {
    EntryRef::new(8 * (k + 1), 8).unwrap()
}

fn key_of(r: EntryRef) -> u64 {
    r.offset() / 8 - 1
}

/// A well-spread hash of key `k` (never 0).
fn hash(k: u64) -> u64 {
    let mut z = k.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

fn small_index() -> Index {
    let cfg = IndexConfig {
        initial_buckets: 4,
        retire_grace: std::time::Duration::ZERO,
        ..IndexConfig::default()
    };
    Index::create(anon_pool(64 << 20), &cfg).unwrap()
}

fn put(index: &Index, k: u64) {
    index.upsert(hash(k), entry(k), |r| key_of(r) == k).unwrap();
}

fn remove(index: &Index, k: u64) {
    index.remove(hash(k), |r| key_of(r) == k);
}

/// Every key of one slice walk step.
fn visit(index: &Index, slice: u64, bits: u32, seen: &mut HashMap<u64, u32>) {
    index.for_each_in_slice(slice, bits, |h, r| {
        let k = key_of(r);
        assert_eq!(h, hash(k), "entry of key {k} found with another hash");
        *seen.entry(k).or_default() += 1;
    });
}

#[test]
fn a_walk_at_any_resolution_visits_each_entry_once() {
    let index = small_index();
    for k in 0..500 {
        put(&index, k);
    }
    let table_bits = index.bucket_bits();
    for bits in [0, 1, table_bits - 2, table_bits, table_bits + 3] {
        let mut seen = HashMap::new();
        let mut slice = 0;
        let mut steps = 0u64;
        loop {
            visit(&index, slice, bits, &mut seen);
            steps += 1;
            slice = next_slice(slice, bits);
            if slice == 0 {
                break;
            }
        }
        assert_eq!(steps, 1 << bits, "{bits} bits");
        assert_eq!(seen.len(), 500, "{bits} bits");
        assert!(seen.values().all(|&n| n == 1), "{bits} bits: {seen:?}");
    }
}

#[derive(Debug, Clone, Copy)]
enum Between {
    Nothing,
    /// Adds this many new keys (the index grows).
    Insert(u16),
    /// Removes this key of the first set, if it is still there.
    Remove(u16),
}

fn between() -> impl Strategy<Value = Between> {
    prop_oneof![
        2 => Just(Between::Nothing),
        2 => (1..300u16).prop_map(Between::Insert),
        1 => (0..200u16).prop_map(Between::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Between steps the index changes and the walk reads at another resolution (the number of bits a cluster's
    /// largest table has changes as tables grow and partitions come and go). Every key there from the start to
    /// the end is visited; nothing else that never was there is.
    #[test]
    fn a_walk_finds_every_key_that_stays_while_the_index_changes(
        schedule in prop::collection::vec((between(), -3i32..4), 1..80)
    ) {
        let index = small_index();
        let first: u64 = 200;
        for k in 0..first {
            put(&index, k);
        }
        let mut next_key = first;
        let mut removed = HashSet::new();
        let mut seen = HashMap::new();
        let mut slice = 0u64;
        let mut steps = 0usize;
        loop {
            let (change, shift) = schedule[steps % schedule.len()];
            let bits = (index.bucket_bits() as i32 + shift).clamp(0, 30) as u32;
            visit(&index, slice, bits, &mut seen);
            steps += 1;
            slice = next_slice(slice, bits);
            if slice == 0 {
                break;
            }
            prop_assert!(steps < 1 << 16, "the walk does not end");
            match change {
                // Bounded, so that the walk, which slows down as the index grows, ends.
                Between::Insert(n) if next_key < 5_000 => {
                    for _ in 0..n {
                        put(&index, next_key);
                        next_key += 1;
                    }
                }
                Between::Remove(k) => {
                    remove(&index, u64::from(k));
                    removed.insert(u64::from(k));
                }
                Between::Nothing | Between::Insert(_) => {}
            }
        }
        for k in (0..first).filter(|k| !removed.contains(k)) {
            prop_assert!(seen.contains_key(&k), "key {} was there throughout and not visited", k);
        }
        prop_assert!(seen.keys().all(|&k| k < next_key));
    }
}
