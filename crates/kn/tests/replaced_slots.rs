//! A KV node reads a key in two round trips: what names its entry (a slot of the index, or a shared key's cell),
//! then the entry. Between the two the name may move on (the log cleaner moves a slot to a copy; another owner
//! CASes a cell) and the entry left behind be superseded, its segment recycled and written again, so the entry read
//! is another key's. The read must take that for a moved name and look again: taken for "no such key", a GET would
//! answer nil for a key that is there (and a client that reads before it writes would start the key over); taken
//! for damage, it would fail.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dinomo_dpm::{Processor, ProcessorConfig};
use dinomo_fabric::{Connector, EndpointConfig};
use dinomo_index::{Index, IndexConfig};
use dinomo_kn::KvNode;
use dinomo_log::{EntryRef, HashMode, Op, encode_entry};
use dinomo_pool::Pool;

mod common;

/// Tag of the test's own extent, where it keeps the key's entries (no log segment, so nothing else touches it).
const SCRATCH_TAG: u16 = 0x7e;

/// A memory node hashing keys with `hash_mode` and a KV node (one worker, no cache: every read goes to the pool)
/// whose round trips take 200 µs: the window between a read's two READs.
fn slow_node(
    hash_mode: HashMode,
) -> anyhow::Result<(Arc<Pool>, Arc<Processor>, Connector, KvNode)> {
    let pool = Arc::new(Pool::anonymous(64 << 20, 16 << 10)?);
    let (processor, connector) = common::serve_pool_with(
        pool.clone(),
        &ProcessorConfig {
            segment_size: 16 << 10,
            hash_mode,
            ..ProcessorConfig::default()
        },
        EndpointConfig {
            injected_latency_ns: 200_000,
            ..EndpointConfig::default()
        },
    )?;
    let kn = common::cacheless_kv_node(connector.clone(), 4096)?;
    Ok((pool, processor, connector, kn))
}

/// Entries of `key` and of `other` (a key of the same length), holding `value`; two places for them in an extent of
/// the test's own.
fn entries_and_places(
    pool: &Pool,
    key: &[u8],
    other: &[u8],
    value: &[u8],
) -> anyhow::Result<(Vec<u8>, Vec<u8>, [EntryRef; 2])> {
    let entry_of = |k: &[u8]| {
        let mut e = Vec::new();
        encode_entry(&mut e, Op::Put, 0, 1, k, value);
        e
    };
    let (ours, theirs) = (entry_of(key), entry_of(other));
    let extent = pool.alloc_bytes(16 << 10, SCRATCH_TAG)?;
    let places = [extent.offset, extent.offset + 4096].map(|at| {
        EntryRef::new(at, ours.len() as u64).expect("an aligned entry that fits a reference")
    });
    Ok((ours, theirs, places))
}

/// Runs `mv(from, to)` every 20 ms (so a read, three tries at most, meets at most one move) while reading `key`
/// as fast as it can for three seconds, each read required to give `value`; returns how many reads there were.
fn read_while_moving(
    kn: &KvNode,
    key: &[u8],
    value: &[u8],
    places: [EntryRef; 2],
    mv: impl Fn(EntryRef, EntryRef) -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<u64> {
    let stop = Arc::new(AtomicBool::new(false));
    let mover = {
        let stop = stop.clone();
        std::thread::spawn(move || -> anyhow::Result<()> {
            let mut at = 0;
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(20));
                mv(places[at], places[1 - at])?;
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
    anyhow::ensure!(
        wrong.is_empty(),
        "{} of {reads} reads: {wrong:?}",
        wrong.len()
    );
    Ok(reads)
}

/// `key`'s slot moved between two places over and over while it is read; each place it leaves is written over by
/// `other`'s entry.
fn slot_moved_while_read(hash_mode: HashMode, key: &[u8], other: &[u8]) -> anyhow::Result<()> {
    let (pool, _processor, _connector, kn) = slow_node(hash_mode)?;
    // The key's entry at one of two places, its slot inserted straight into the index; the other place holds
    // the other key's entry.
    let value = vec![b'v'; 200];
    let (ours, theirs, places) = entries_and_places(&pool, key, other, &value)?;
    let hash = dinomo_dpm::directory::Directory::open(pool.clone())?
        .expect("a started memory node has a log directory")
        .hash_mode()
        .hash(key);
    let index = Index::open(pool.clone(), &IndexConfig::default())?;
    pool.write(places[0].offset(), &ours)?;
    pool.write(places[1].offset(), &theirs)?;
    assert_eq!(index.upsert(hash, places[0], |_| false)?, None);
    assert_eq!(kn.handle().get(key)?.as_deref(), Some(value.as_slice()));

    // The cleaner's move: the key's entry written at the other place, the slot moved there, and the place it left
    // written over by another key.
    let mover_pool = pool.clone();
    let reads = read_while_moving(&kn, key, &value, places, move |from, to| {
        mover_pool.write(to.offset(), &ours)?;
        anyhow::ensure!(index.replace(hash, from, to)?, "the slot left its place");
        mover_pool.write(from.offset(), &theirs)?;
        Ok(())
    })?;
    // The race was met: some walks found the slot's entry replaced, and walked again.
    let rewalks: u64 = kn.handle().stats()?.iter().map(|s| s.index_rewalks).sum();
    assert!(
        rewalks > 0,
        "{reads} reads, and no walk met a replaced slot"
    );
    Ok(())
}

#[test]
fn a_slot_replaced_between_bucket_and_entry_reads_is_walked_again_never_taken_for_a_missing_key()
-> anyhow::Result<()> {
    slot_moved_while_read(HashMode::Xxh3, b"moved-key", b"loved-key")
}

/// The place the key's slot left is written over by a key of the same hash: the walk cannot tell that entry from
/// the other key's own slot, so an answer of "no such key" must wait for a walk that finds the same slots again.
#[test]
fn a_slot_replaced_by_an_entry_of_a_key_of_the_same_hash_is_never_taken_for_a_missing_key()
-> anyhow::Result<()> {
    let mode = HashMode::Colliding { bits: 6 };
    let key = b"moved-key".as_slice();
    let other = (0..100_000)
        .map(|i| format!("oth-{i:05}").into_bytes())
        .find(|o| mode.hash(o) == mode.hash(key))
        .expect("a key of the same 6-bit hash among 100 000");
    slot_moved_while_read(mode, key, &other)
}

#[test]
fn a_cell_moved_on_between_cell_and_entry_reads_is_read_again_never_refused() -> anyhow::Result<()>
{
    let (pool, _processor, connector, kn) = slow_node(HashMode::Xxh3)?;
    let key = b"shared-key".as_slice();
    let value = vec![b's'; 200];
    let cell = common::reserve_cell(&connector, key)?;
    common::install_sharing(&kn, 1, &[(key, cell)])?;
    kn.handle().set(key, &value)?;
    assert_eq!(kn.handle().get(key)?.as_deref(), Some(value.as_slice()));

    // The cell moved by another owner's CAS to its entry, then on and on; each entry it leaves is written over by
    // another key.
    let (ours, theirs, places) = entries_and_places(&pool, key, b"rhared-key", &value)?;
    let word = pool.atomic_u64(cell)?;
    pool.write(places[0].offset(), &ours)?;
    pool.write(places[1].offset(), &theirs)?;
    word.store(places[0].raw(), Ordering::Release);
    let mover_pool = pool.clone();
    let reads = read_while_moving(&kn, key, &value, places, move |from, to| {
        mover_pool.write(to.offset(), &ours)?;
        let word = mover_pool.atomic_u64(cell)?;
        anyhow::ensure!(
            word.compare_exchange(from.raw(), to.raw(), Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
            "the cell left its place"
        );
        mover_pool.write(from.offset(), &theirs)?;
        Ok(())
    })?;
    let rereads: u64 = kn.handle().stats()?.iter().map(|s| s.cell_rereads).sum();
    assert!(rereads > 0, "{reads} reads, and none met a moved cell");
    Ok(())
}
