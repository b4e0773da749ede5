//! A KV node walks the memory node's index in two round trips: the bucket, then the entry a slot of the key's
//! hash names. Between the two the log cleaner may move the slot to a copy, recycle the segment it emptied, and
//! let a log write over it, so the entry read is another key's. The walk must take that for a replaced slot and
//! walk again: taken for "no such key", a GET would answer nil for a key that is there (and a client that reads
//! before it writes would start the key over).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dinomo_cache::CacheConfig;
use dinomo_dpm::{Processor, ProcessorConfig};
use dinomo_fabric::{Connector, EndpointConfig, MemoryNode, NodeConfig, Target};
use dinomo_index::{Index, IndexConfig};
use dinomo_kn::{KnConfig, KvNode};
use dinomo_log::{EntryRef, Op, encode_entry};
use dinomo_pool::Pool;

/// Tag of the test's own extent, where it keeps the key's entries (no log segment, so nothing else touches it).
const SCRATCH_TAG: u16 = 0x7e;

#[test]
fn a_slot_replaced_between_bucket_and_entry_reads_is_walked_again_never_taken_for_a_missing_key()
-> anyhow::Result<()> {
    let pool = Arc::new(Pool::anonymous(64 << 20, 16 << 10)?);
    let processor = Processor::start(
        pool.clone(),
        &ProcessorConfig {
            segment_size: 16 << 10,
            ..ProcessorConfig::default()
        },
    )?;
    let node = MemoryNode::new(pool.clone(), NodeConfig::default());
    processor.serve(&node);
    // Each round trip takes 200 µs: the window between a walk's bucket READ and its entry READ.
    let connector = Connector::with_config(
        Target::InProcess(node),
        EndpointConfig {
            injected_latency_ns: 200_000,
            ..EndpointConfig::default()
        },
    );
    // No cache: every GET walks the index.
    let kn = KvNode::start(
        KnConfig {
            threads: 1,
            max_value_len: 4096,
            cache: CacheConfig {
                budget_bytes: 0,
                ..CacheConfig::default()
            },
            ..KnConfig::default()
        },
        connector,
    )?;

    // The key's entry at one of two places of the test's extent, its slot inserted straight into the index; the
    // other place holds another key's entry of the same length.
    let key = b"moved-key".as_slice();
    let value = vec![b'v'; 200];
    let entry_of = |k: &[u8]| {
        let mut e = Vec::new();
        encode_entry(&mut e, Op::Put, 0, 1, k, &value);
        e
    };
    let (ours, theirs) = (entry_of(key), entry_of(b"other-key"));
    assert_eq!(ours.len(), theirs.len());
    let extent = pool.alloc_bytes(16 << 10, SCRATCH_TAG)?;
    let places = [extent.offset, extent.offset + 4096].map(|at| {
        EntryRef::new(at, ours.len() as u64).expect("an aligned entry that fits a reference")
    });
    let hash = dinomo_dpm::directory::Directory::open(pool.clone())?
        .expect("a started memory node has a log directory")
        .hash_mode()
        .hash(key);
    let index = Index::open(pool.clone(), &IndexConfig::default())?;
    pool.write(places[0].offset(), &ours)?;
    pool.write(places[1].offset(), &theirs)?;
    assert_eq!(index.upsert(hash, places[0], |_| false)?, None);
    assert_eq!(kn.handle().get(key)?.as_deref(), Some(value.as_slice()));

    // The cleaner's move, over and over: the key's entry written at the other place, the slot moved there, and the
    // place it left written over by another key. Moves come 20 ms apart, so a GET (three walks at most, each two
    // round trips) meets at most one of them.
    let stop = Arc::new(AtomicBool::new(false));
    let moves = Arc::new(AtomicU64::new(0));
    let mover = {
        let (pool, stop, moves) = (pool.clone(), stop.clone(), moves.clone());
        std::thread::spawn(move || -> anyhow::Result<()> {
            let mut at = 0;
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(20));
                let (from, to) = (places[at], places[1 - at]);
                pool.write(to.offset(), &ours)?;
                anyhow::ensure!(index.replace(hash, from, to)?, "the slot left its place");
                pool.write(from.offset(), &theirs)?;
                moves.fetch_add(1, Ordering::Relaxed);
                at = 1 - at;
            }
            Ok(())
        })
    };
    let h = kn.handle();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut reads = 0u64;
    let mut wrong = Vec::new();
    while Instant::now() < deadline && reads < 20_000 {
        match h.get(key) {
            Ok(Some(v)) if v == value => {}
            other => wrong.push(format!("{other:?}")),
        }
        reads += 1;
    }
    stop.store(true, Ordering::Release);
    mover.join().expect("the mover thread")?;
    let rewalks: u64 = h.stats()?.iter().map(|s| s.index_rewalks).sum();
    assert!(
        wrong.is_empty(),
        "{} of {reads} reads: {wrong:?}",
        wrong.len()
    );
    // The race was met: some walks found the slot's entry replaced, and walked again.
    assert!(
        rewalks > 0,
        "{reads} reads, {} moves, and no walk met a replaced slot",
        moves.load(Ordering::Relaxed)
    );
    Ok(())
}
