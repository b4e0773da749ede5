//! A worker's batch reads ahead what its lookups will need: the index walks of its uncached keys, side by side, then
//! in one round trip the entries those walks found and the entries cached shortcuts lead to. What was read ahead
//! must answer exactly as the round trips made at the lookup would: checked against a model through random batches
//! that mix reads and writes of the same keys, with tiny caches and segments, and hashes that collide.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use dinomo_cache::{CacheConfig, Policy};
use dinomo_dpm::{Processor, ProcessorConfig};
use dinomo_fabric::{EndpointConfig, FaultHooks};
use dinomo_kn::{DataOp, DirectWorker, KnConfig, Reply};
use dinomo_log::HashMode;
use proptest::prelude::*;

/// A worker on an in-process memory node whose round trips take `latency_ns` (so they are not free, and the
/// worker reads ahead), caching shortcuts only within `cache_bytes`.
fn worker(
    latency_ns: u64,
    policy: Policy,
    cache_bytes: u64,
    read_ahead_bytes: u64,
) -> anyhow::Result<(Arc<Processor>, DirectWorker)> {
    let (processor, w, _) = worker_with_hooks(
        latency_ns,
        policy,
        cache_bytes,
        read_ahead_bytes,
        HashMode::Xxh3,
    )?;
    Ok((processor, w))
}

/// [`worker`], and the fault hooks of its fabric endpoint.
fn worker_with_hooks(
    latency_ns: u64,
    policy: Policy,
    cache_bytes: u64,
    read_ahead_bytes: u64,
    hash_mode: HashMode,
) -> anyhow::Result<(Arc<Processor>, DirectWorker, Arc<FaultHooks>)> {
    let pool = Arc::new(dinomo_pool::Pool::anonymous(32 << 20, 4096)?);
    let (processor, mut connector) = common::serve_pool_with(
        pool,
        &ProcessorConfig {
            segment_size: 4096,
            merge_threads: 1,
            hash_mode,
            ..ProcessorConfig::default()
        },
        EndpointConfig {
            injected_latency_ns: latency_ns,
            ..EndpointConfig::default()
        },
    )?;
    let hooks = connector.share_fault_hooks();
    let w = DirectWorker::start(
        KnConfig {
            threads: 1,
            max_key_len: 64,
            max_value_len: 1024,
            read_ahead_bytes,
            cache: CacheConfig {
                budget_bytes: cache_bytes,
                policy,
                ..CacheConfig::default()
            },
            ..KnConfig::default()
        },
        0,
        connector,
    )?;
    Ok((processor, w, hooks))
}

/// A worker that caches nothing (every read of a merged key walks the index) and whose hashes keep three bits (keys
/// collide), reading ahead over a 1 µs fabric.
fn uncached_colliding_worker() -> anyhow::Result<(Arc<Processor>, DirectWorker)> {
    let (processor, w, _) = worker_with_hooks(
        1000,
        Policy::Adaptive,
        0,
        1 << 20,
        HashMode::Colliding { bits: 3 },
    )?;
    Ok((processor, w))
}

fn key(i: u8) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

fn gets(keys: impl Iterator<Item = u8>) -> Vec<DataOp> {
    keys.map(|i| DataOp::Get(key(i))).collect()
}

/// Sixteen reads through cached shortcuts cost one round trip between them, where they cost one each without
/// reading ahead, and so do the reads of sixteen read-modify-writes; the answers are the same.
#[test]
fn a_batch_follows_its_shortcuts_in_one_round_trip() -> anyhow::Result<()> {
    for read_ahead_bytes in [1 << 20, 0] {
        let (processor, mut w) = worker(1000, Policy::ShortcutOnly, 1 << 20, read_ahead_bytes)?;
        let keys: Vec<Vec<u8>> = (0..16u8).map(key).collect();
        let values: Vec<Vec<u8>> = (0..16u8).map(|i| vec![i; 100 + usize::from(i)]).collect();
        w.set_many(keys.iter().zip(&values).map(|(k, v)| (&k[..], &v[..])))?;
        let before = w.stats();
        let replies = w.serve_batch(gets(0..16));
        let after = w.stats();
        for (i, r) in replies.into_iter().enumerate() {
            assert_eq!(r?, Reply::Value(Some(values[i].clone())), "key {i}");
        }
        let (rts, ahead) = (
            after.round_trips - before.round_trips,
            after.entries_read_ahead - before.entries_read_ahead,
        );
        assert_eq!(after.shortcut_hits - before.shortcut_hits, 16);
        if read_ahead_bytes > 0 {
            assert_eq!((rts, ahead), (1, 16));
        } else {
            assert_eq!((rts, ahead), (16, 0));
        }
        // Read-modify-writes read the values they change the same way: one round trip for their reads; the rest is
        // their group commit (its WRITEs, and the call for a new log segment when they fill one).
        let before = w.stats();
        let appends = (0..16u8)
            .map(|i| DataOp::Append(key(i), b"+".to_vec()))
            .collect();
        for (i, r) in w.serve_batch(appends).into_iter().enumerate() {
            assert_eq!(r?, Reply::Int(values[i].len() as i64 + 1), "key {i}");
        }
        let after = w.stats();
        let rts = after.round_trips - before.round_trips;
        if read_ahead_bytes > 0 {
            assert_eq!(after.entries_read_ahead - before.entries_read_ahead, 16);
            assert!(rts <= 4, "{rts} round trips");
        } else {
            assert!(rts > 16, "{rts} round trips: one READ each, and the commit");
        }
        drop(w);
        processor.shutdown();
    }
    Ok(())
}

/// A read-ahead whose round trip is lost is handled as any lost round trip: the log is claimed again, and the
/// batch's reads are answered as without it. So is a lost round trip of the walks made ahead (with a cache of no
/// bytes, every read walks the index).
#[test]
fn a_lost_read_ahead_leaves_the_batch_answered() -> anyhow::Result<()> {
    for (policy, cache_bytes) in [(Policy::ShortcutOnly, 1 << 20), (Policy::Adaptive, 0)] {
        let (processor, mut w, hooks) =
            worker_with_hooks(1000, policy, cache_bytes, 1 << 20, HashMode::Xxh3)?;
        let keys: Vec<Vec<u8>> = (0..16u8).map(key).collect();
        w.set_many(keys.iter().map(|k| (&k[..], &k[..])))?;
        w.merge_all()?;
        hooks.drop_next(1);
        let before = w.stats();
        for (i, r) in w.serve_batch(gets(0..16)).into_iter().enumerate() {
            assert_eq!(r?, Reply::Value(Some(keys[i].clone())), "key {i}");
        }
        let after = w.stats();
        assert_eq!(after.entries_read_ahead, before.entries_read_ahead);
        assert_eq!(after.index_walks_ahead, before.index_walks_ahead);
        // The next batch reads ahead again.
        for (i, r) in w.serve_batch(gets(0..16)).into_iter().enumerate() {
            assert_eq!(r?, Reply::Value(Some(keys[i].clone())), "key {i}");
        }
        let again = w.stats();
        if cache_bytes > 0 {
            assert!(again.entries_read_ahead > after.entries_read_ahead);
        } else {
            assert_eq!(again.index_walks_ahead - after.index_walks_ahead, 16);
        }
        drop(w);
        processor.shutdown();
    }
    Ok(())
}

/// Sixteen reads of keys not cached walk the index side by side: one round trip reads every key's bucket, one
/// every entry found, where each read walks alone (two round trips) without reading ahead; sixteen reads of keys
/// never written cost the one round trip of their buckets. The answers are the same.
#[test]
fn a_batch_walks_the_index_for_its_uncached_keys_side_by_side() -> anyhow::Result<()> {
    for read_ahead_bytes in [1 << 20, 0] {
        // A cache of no bytes: every read of a merged key walks the index.
        let (processor, mut w) = worker(1000, Policy::Adaptive, 0, read_ahead_bytes)?;
        let keys: Vec<Vec<u8>> = (0..16u8).map(key).collect();
        let values: Vec<Vec<u8>> = (0..16u8).map(|i| vec![i; 50 + usize::from(i)]).collect();
        w.set_many(keys.iter().zip(&values).map(|(k, v)| (&k[..], &v[..])))?;
        w.merge_all()?;
        for written in [true, false] {
            let first = if written { 0 } else { 100 };
            let before = w.stats();
            let replies = w.serve_batch(gets(first..first + 16));
            let after = w.stats();
            for (i, r) in replies.into_iter().enumerate() {
                let want = written.then(|| values[i].clone());
                assert_eq!(r?, Reply::Value(want), "key {}", first + i as u8);
            }
            let rts = after.round_trips - before.round_trips;
            let walks = after.index_walks - before.index_walks;
            let ahead = after.index_walks_ahead - before.index_walks_ahead;
            assert_eq!(
                after.index_walk_round_trips - before.index_walk_round_trips,
                rts,
                "every round trip of the batch was its walks'"
            );
            assert_eq!(walks, 16);
            match (read_ahead_bytes > 0, written) {
                (true, true) => assert_eq!((rts, ahead), (2, 16)),
                (true, false) => assert_eq!((rts, ahead), (1, 16)),
                (false, true) => assert_eq!((rts, ahead), (32, 0)),
                (false, false) => assert_eq!((rts, ahead), (16, 0)),
            }
        }
        drop(w);
        processor.shutdown();
    }
    Ok(())
}

/// A batch that writes keys and then reads them: each read answers the value written before it in the batch, not
/// what the walk made ahead of the batch found, even once the writes' segments were merged and dropped meanwhile
/// (so that the reads walk the index).
#[test]
fn a_write_in_the_batch_outdates_the_walk_made_ahead_for_its_key() -> anyhow::Result<()> {
    // Three bits of hash: the sixteen keys share eight hashes, so a write also outdates the walks of other keys.
    let (processor, mut w) = uncached_colliding_worker()?;
    let keys: Vec<Vec<u8>> = (0..16u8).map(key).collect();
    w.set_many(keys.iter().map(|k| (&k[..], &b"old"[..])))?;
    w.merge_all()?;
    // Three values fill a 4 KiB segment: the sixteen writes fill several, and a worker keeps at most two unmerged.
    let new = |i: u8| vec![i; 1000];
    let mut ops: Vec<DataOp> = (0..16u8).map(|i| DataOp::Set(key(i), new(i))).collect();
    ops.extend(gets(0..16));
    let before = w.stats();
    let replies = w.serve_batch(ops);
    let after = w.stats();
    for (i, r) in replies[..16].iter().enumerate() {
        assert_eq!(r.as_ref().ok(), Some(&Reply::Applied(true)), "key {i}");
    }
    for (i, r) in replies[16..].iter().enumerate() {
        assert_eq!(
            r.as_ref().ok(),
            Some(&Reply::Value(Some(new(i as u8)))),
            "key {i}"
        );
    }
    assert!(after.index_walks_ahead > before.index_walks_ahead);
    assert!(
        after.index_walks > before.index_walks,
        "some reads walked the index: {} walks",
        after.index_walks - before.index_walks
    );
    drop(w);
    processor.shutdown();
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Get(u8),
    Set(u8, usize),
    Delete(u8),
    Incr(u8),
    Append(u8, usize),
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0..12u8;
    prop_oneof![
        6 => k.clone().prop_map(Op::Get),
        3 => (k.clone(), 0..300usize).prop_map(|(k, l)| Op::Set(k, l)),
        1 => k.clone().prop_map(Op::Delete),
        1 => k.clone().prop_map(Op::Incr),
        1 => (k, 0..40usize).prop_map(|(k, l)| Op::Append(k, l)),
    ]
}

/// Applies `op` to the model and returns the reply the store must give, with the operation to send.
fn expect(model: &mut HashMap<u8, Vec<u8>>, op: &Op, version: u64) -> (DataOp, Result<Reply, ()>) {
    match *op {
        Op::Get(k) => (
            DataOp::Get(key(k)),
            Ok(Reply::Value(model.get(&k).cloned())),
        ),
        Op::Set(k, len) => {
            let v: Vec<u8> = (0..len).map(|i| (version as usize + i) as u8).collect();
            model.insert(k, v.clone());
            (DataOp::Set(key(k), v), Ok(Reply::Applied(true)))
        }
        Op::Delete(k) => (
            DataOp::Delete(key(k)),
            Ok(Reply::Applied(model.remove(&k).is_some())),
        ),
        Op::Incr(k) => {
            let current = model.get(&k).map(|v| {
                std::str::from_utf8(v)
                    .ok()
                    // INCR takes the canonical spelling only ("01" is no integer), as Redis does.
                    .and_then(|s| s.parse::<i64>().ok().filter(|n| n.to_string() == s))
            });
            match current {
                Some(None) => (DataOp::Incr(key(k), 1), Err(())),
                Some(Some(n)) => {
                    model.insert(k, (n + 1).to_string().into_bytes());
                    (DataOp::Incr(key(k), 1), Ok(Reply::Int(n + 1)))
                }
                None => {
                    model.insert(k, b"1".to_vec());
                    (DataOp::Incr(key(k), 1), Ok(Reply::Int(1)))
                }
            }
        }
        Op::Append(k, len) => {
            let suffix = vec![b'a' + (version % 26) as u8; len];
            let v = model.entry(k).or_default();
            v.extend_from_slice(&suffix);
            let n = v.len() as i64;
            (DataOp::Append(key(k), suffix), Ok(Reply::Int(n)))
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Batches of reads and writes of a few keys, served as the worker serves a batch from its queue, answer as
    /// the same operations one after another on a map; merges in between move entries the shortcuts lead to.
    #[test]
    fn batches_that_read_ahead_agree_with_a_model(
        policy in prop_oneof![Just(Policy::ShortcutOnly), Just(Policy::Adaptive)],
        cache_bytes in prop_oneof![Just(0u64), Just(600u64), Just(4000u64), Just(1u64 << 20)],
        colliding in any::<bool>(),
        batches in proptest::collection::vec(
            (proptest::collection::vec(op(), 1..24), any::<bool>()),
            1..12,
        ),
    ) {
        let hash_mode = if colliding { HashMode::Colliding { bits: 3 } } else { HashMode::Xxh3 };
        let (processor, mut w, _) =
            worker_with_hooks(1, policy, cache_bytes, 1 << 20, hash_mode).unwrap();
        let mut model = HashMap::new();
        let mut version = 0;
        for (ops, merge_after) in batches {
            let (sent, expected): (Vec<DataOp>, Vec<Result<Reply, ()>>) = ops
                .iter()
                .map(|op| {
                    version += 1;
                    expect(&mut model, op, version)
                })
                .unzip();
            let replies = w.serve_batch(sent.clone());
            for ((op, want), got) in sent.iter().zip(expected).zip(replies) {
                match want {
                    Ok(want) => prop_assert_eq!(got.as_ref().ok(), Some(&want), "{:?}", op),
                    Err(()) => prop_assert!(got.is_err(), "{:?}: {:?}", op, got),
                }
            }
            if merge_after {
                w.merge_all().unwrap();
            }
        }
        drop(w);
        processor.shutdown();
    }
}

/// Keys of `HashMode::Colliding { bits: 3 }` hash `hash`, and keys of other hashes.
fn keys_by_hash(hash: u64) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mode = HashMode::Colliding { bits: 3 };
    (0..200u8)
        .map(|i| format!("k{i}").into_bytes())
        .partition(|k| mode.hash(k) == hash)
}

/// A walk made ahead for one key answers for that key only. Another key of the same hash, whose newest write was in
/// the worker's unmerged log when the batch began (so it was not walked), and is merged and dropped from there
/// during the batch, must not be answered from the walk made before its write reached the index.
#[test]
fn a_walk_made_ahead_answers_for_its_own_key_only() -> anyhow::Result<()> {
    let (processor, mut w) = uncached_colliding_worker()?;
    let (same, others) = keys_by_hash(1);
    let (walked, unmerged) = (&same[0], &same[1]);
    // A third key, of another hash, so that the batch has two walks to make side by side.
    let third = &others[16];
    w.set_many([
        (&walked[..], &b"walked"[..]),
        (&unmerged[..], &b"old"[..]),
        (&third[..], &b"third"[..]),
    ])?;
    w.merge_all()?;
    // The newer value stays in the worker's open segment: not in the index when the next batch begins.
    w.set(unmerged, b"new")?;
    // Writes of other hashes fill segments, so the one holding "new" is sealed, merged and dropped from the worker.
    let mut ops: Vec<DataOp> = others[..16]
        .iter()
        .map(|k| DataOp::Set(k.clone(), vec![7; 1000]))
        .collect();
    ops.push(DataOp::Get(unmerged.clone()));
    ops.push(DataOp::Get(walked.clone()));
    ops.push(DataOp::Get(third.clone()));
    let before = w.stats();
    let replies = w.serve_batch(ops);
    let after = w.stats();
    assert_eq!(
        after.index_walks_ahead - before.index_walks_ahead,
        2,
        "the batch walked two keys ahead"
    );
    assert_eq!(
        replies[16].as_ref().ok(),
        Some(&Reply::Value(Some(b"new".to_vec())))
    );
    assert_eq!(
        replies[17].as_ref().ok(),
        Some(&Reply::Value(Some(b"walked".to_vec())))
    );
    assert_eq!(
        replies[18].as_ref().ok(),
        Some(&Reply::Value(Some(b"third".to_vec())))
    );
    assert!(
        after.index_walks - before.index_walks >= 2,
        "both reads walked the index"
    );
    drop(w);
    processor.shutdown();
    Ok(())
}

/// A budget smaller than the batch needs walks ahead only the keys that fit (a bucket and the key's copy each), and
/// the others walk at their lookup; the answers are the same.
#[test]
fn walks_made_ahead_stay_within_the_budget() -> anyhow::Result<()> {
    // Room for two walks of keys "key-N" (64 bytes of bucket and 5 or 6 of key each), not three.
    let (processor, mut w) = worker(1000, Policy::Adaptive, 0, 2 * (64 + 6) + 10)?;
    let keys: Vec<Vec<u8>> = (0..16u8).map(key).collect();
    w.set_many(keys.iter().map(|k| (&k[..], &k[..])))?;
    w.merge_all()?;
    let before = w.stats();
    for (i, r) in w.serve_batch(gets(0..16)).into_iter().enumerate() {
        assert_eq!(r?, Reply::Value(Some(keys[i].clone())), "key {i}");
    }
    let after = w.stats();
    assert_eq!(after.index_walks_ahead - before.index_walks_ahead, 2);
    assert_eq!(after.index_walks - before.index_walks, 16);
    drop(w);
    processor.shutdown();
    Ok(())
}
