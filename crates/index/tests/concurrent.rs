//! Concurrent writers with resizes under their feet, and lock-free readers (local and remote) that must never miss
//! a key nor return a wrong reference while tables are replaced and freed.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use dinomo_index::{Index, IndexConfig, RemoteIndex};

#[test]
fn four_writers_with_resizes_keep_every_last_value() {
    let pool = anon_pool(256 << 20);
    let index = Arc::new(Index::create(pool.clone(), &tiny(0.25)).unwrap());
    const PER_THREAD: u64 = 3000;
    // Hashes are folded to 2048 values so that keys of different threads share chains.
    let hash = |k: u64| hash_of(k) % 2048 + 1;
    let writers: Vec<_> = (0..4u64)
        .map(|t| {
            let index = index.clone();
            thread::spawn(move || {
                let keys = (0..PER_THREAD).map(move |i| t * 1_000_000 + i);
                for k in keys.clone() {
                    assert_eq!(
                        index
                            .upsert(hash(k), eref(k, 1), |e| key_of(e) == k)
                            .unwrap(),
                        None
                    );
                }
                for k in keys.clone() {
                    let old = index
                        .upsert(hash(k), eref(k, 2), |e| key_of(e) == k)
                        .unwrap();
                    assert_eq!(old, Some(eref(k, 1)));
                }
                for k in keys.filter(|k| k % 10 == 0) {
                    assert_eq!(index.remove(hash(k), |e| key_of(e) == k), Some(eref(k, 2)));
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let s = index.stats();
    assert!(s.resizes >= 8, "{s:?}");
    let mut expected = 0;
    for t in 0..4u64 {
        for i in 0..PER_THREAD {
            let k = t * 1_000_000 + i;
            let got = index.get(hash(k), |e| key_of(e) == k);
            if k % 10 == 0 {
                assert_eq!(got, None, "key {k}");
            } else {
                expected += 1;
                assert_eq!(got, Some(eref(k, 2)), "key {k}");
            }
        }
    }
    assert_eq!(index.len(), expected);
    let mut seen = 0;
    index.for_each(|h, e| {
        assert_eq!(h, hash(key_of(e)));
        assert_eq!(e, eref(key_of(e), 2));
        seen += 1;
    });
    assert_eq!(seen, expected);
}

#[test]
fn readers_never_miss_fixed_keys_while_tables_are_replaced() {
    let pool = anon_pool(256 << 20);
    let node = node(&pool);
    let server = tcp_server(&node);
    let cfg = IndexConfig {
        initial_buckets: 2,
        retire_grace: Duration::ZERO,
        ..IndexConfig::default()
    };
    let index = Arc::new(Index::create(pool.clone(), &cfg).unwrap());
    const FIXED: u64 = 64;
    for k in 0..FIXED {
        index
            .upsert(hash_of(k), eref(k, 7), |e| key_of(e) == k)
            .unwrap();
    }
    let done = Arc::new(AtomicBool::new(false));
    let lookups = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut readers = Vec::new();
    // Two in-process remote readers, one TCP remote reader, one local reader.
    for kind in 0..4 {
        let (index, node, done, lookups) =
            (index.clone(), node.clone(), done.clone(), lookups.clone());
        let addr_ep = (kind == 2).then(|| tcp_endpoint(&server));
        readers.push(thread::spawn(move || {
            let mut rounds = 0u64;
            let mut out = Vec::new();
            let mut ep = addr_ep.unwrap_or_else(|| in_process(&node));
            let mut remote = RemoteIndex::connect(&mut ep).unwrap();
            while (!done.load(Ordering::Acquire) || rounds < 3) && Instant::now() < deadline {
                for k in 0..FIXED {
                    if kind == 3 {
                        assert_eq!(
                            index.get(hash_of(k), |e| key_of(e) == k),
                            Some(eref(k, 7)),
                            "local get {k}"
                        );
                    } else {
                        remote.candidates(&mut ep, hash_of(k), &mut out).unwrap();
                        assert_eq!(
                            out,
                            vec![eref(k, 7)],
                            "remote lookup of {k} (reader {kind})"
                        );
                    }
                }
                rounds += 1;
            }
            lookups.fetch_add(rounds * FIXED, Ordering::Relaxed);
        }));
    }
    // A scribbler reuses freed memory at once: it fills free segments with buckets full of the fixed keys' hashes
    // paired with wrong references, so that a reader trusting a freed table would be caught.
    let scribbler = {
        let (pool, done) = (pool.clone(), done.clone());
        thread::spawn(move || {
            let mut garbage = Vec::new();
            let mut round = 0u64;
            while !done.load(Ordering::Acquire) && Instant::now() < deadline {
                let Ok(e) = pool.alloc(16, 0x7777) else {
                    thread::yield_now();
                    continue;
                };
                garbage.clear();
                for i in 0..e.len / 16 {
                    let k = (round + i) % FIXED;
                    garbage.extend_from_slice(&hash_of(k).to_le_bytes());
                    garbage.extend_from_slice(&eref(k, 9).raw().to_le_bytes());
                }
                pool.write(e.offset, &garbage).unwrap();
                thread::yield_now();
                pool.free(e.offset).unwrap();
                round += 1;
            }
        })
    };
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let index = index.clone();
            thread::spawn(move || {
                for i in 0..5000u64 {
                    let k = 1000 + t * 100_000 + i;
                    index
                        .upsert(hash_of(k), eref(k, 1), |e| key_of(e) == k)
                        .unwrap();
                    if i % 3 == 0 {
                        index.remove(hash_of(k), |e| key_of(e) == k);
                    }
                    if Instant::now() > deadline {
                        break;
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    done.store(true, Ordering::Release);
    for r in readers {
        r.join().unwrap();
    }
    scribbler.join().unwrap();
    let s = index.stats();
    assert!(s.resizes >= 8, "{s:?}");
    assert!(lookups.load(Ordering::Relaxed) >= 4 * 3 * FIXED);
    // With a zero grace every replaced table was freed.
    index.reclaim_retired();
    assert_eq!(index.stats().retired_tables, 0);
}

/// A reader whose cached table was freed and reused for other data still answers correctly: the bucket it reads
/// from the stale table is discarded because `current` changed.
#[test]
fn stale_reader_discards_freed_and_reused_memory() {
    let pool = anon_pool(64 << 20);
    let node = node(&pool);
    let index = Index::create(pool.clone(), &tiny(0.25)).unwrap();
    for k in 0..8u64 {
        index
            .upsert(hash_of(k), eref(k, 1), |e| key_of(e) == k)
            .unwrap();
    }
    let mut ep = in_process(&node);
    let mut remote = RemoteIndex::connect(&mut ep).unwrap();
    let stale = remote.current();
    for k in 8..2000u64 {
        index
            .upsert(hash_of(k), eref(k, 1), |e| key_of(e) == k)
            .unwrap();
    }
    assert_ne!(index.current(), stale);
    // The stale table is gone; fill every free segment with garbage that looks like matching buckets.
    assert!(!pool.allocated().iter().any(|e| e.offset == stale.table));
    let mut junk = Vec::new();
    while let Ok(e) = pool.alloc(1, 0x7777) {
        let mut garbage = vec![0u8; e.len as usize];
        for (i, chunk) in garbage.chunks_mut(8).enumerate() {
            chunk.copy_from_slice(
                &(if i % 2 == 0 {
                    hash_of(3)
                } else {
                    eref(999, 9).raw()
                })
                .to_le_bytes(),
            );
        }
        pool.write(e.offset, &garbage).unwrap();
        junk.push(e);
    }
    assert!(junk.iter().any(|e| e.offset == stale.table));
    let mut out = Vec::new();
    for k in 0..2000u64 {
        remote.candidates(&mut ep, hash_of(k), &mut out).unwrap();
        assert_eq!(out, vec![eref(k, 1)], "key {k}");
    }
    assert_eq!(remote.current(), index.current());
}
