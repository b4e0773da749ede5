//! Restarts: the index survives a reopen of its pool file, open frees stray tables, and a damaged index is
//! refused with a clear error without changing anything.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use dinomo_index::{
    Anchor, EntryRef, Index, IndexConfig, IndexError, RemoteIndex, RemoteIndexError,
    free_unreferenced,
};
use dinomo_log::{roots, tags};
use dinomo_pool::{PersistMode, Pool, PoolOptions};

fn create_pool(path: &Path) -> Arc<Pool> {
    Arc::new(
        Pool::create(
            path,
            &PoolOptions {
                size: 64 << 20,
                segment_size: 64 << 10,
                persist: PersistMode::Dax,
            },
        )
        .unwrap(),
    )
}

fn open_pool(path: &Path) -> Arc<Pool> {
    Arc::new(Pool::open(path, PersistMode::Dax).unwrap().0)
}

fn contents(index: &Index) -> Vec<(u64, EntryRef)> {
    let mut v = Vec::new();
    index.for_each(|h, e| v.push((h, e)));
    v.sort();
    v
}

/// Hashes folded to 512 values so that chains and overflow buckets exist.
fn hash(k: u64) -> u64 {
    hash_of(k) % 512 + 1
}

/// Builds a pool file with an index of 3000 keys (some removed); returns the contents and the header offset.
fn populate(path: &Path, cfg: &IndexConfig) -> (Vec<(u64, EntryRef)>, u64) {
    let pool = create_pool(path);
    let index = Index::create(pool.clone(), cfg).unwrap();
    for k in 0..3000u64 {
        index
            .upsert(hash(k), eref(k, 1), |e| key_of(e) == k)
            .unwrap();
    }
    for k in (0..3000u64).step_by(3) {
        index
            .upsert(hash(k), eref(k, 2), |e| key_of(e) == k)
            .unwrap();
    }
    for k in (0..3000u64).step_by(5) {
        index.remove(hash(k), |e| key_of(e) == k).unwrap();
    }
    let c = contents(&index);
    assert_eq!(c.len() as u64, index.len());
    (c, index.header_offset())
}

/// Everything an open could change: the allocation list, the roots and the bytes of the data area.
fn snapshot(pool: &Pool) -> (Vec<dinomo_pool::Extent>, Vec<u64>, Vec<u8>) {
    let l = pool.layout();
    let mut data = vec![0u8; (l.segment_count * l.segment_size) as usize];
    pool.read(l.data_offset, &mut data).unwrap();
    let roots = (0..dinomo_pool::ROOT_SLOTS)
        .map(|i| pool.root(i).unwrap())
        .collect();
    (pool.allocated(), roots, data)
}

fn flip_byte(path: &Path, offset: u64) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0x40;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&b).unwrap();
}

fn index_tables(pool: &Pool) -> Vec<u64> {
    pool.allocated()
        .iter()
        .filter(|e| e.tag == tags::INDEX_TABLE)
        .map(|e| e.offset)
        .collect()
}

#[test]
fn reopen_keeps_contents() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index.pool");
    let cfg = tiny(0.25);
    let (before, header) = populate(&path, &cfg);
    let pool = open_pool(&path);
    let index = Index::open(pool.clone(), &cfg).unwrap();
    assert_eq!(index.header_offset(), header);
    assert_eq!(contents(&index), before);
    assert_eq!(index.len(), before.len() as u64);
    for k in 0..3000u64 {
        let want = if k % 5 == 0 {
            None
        } else if k % 3 == 0 {
            Some(eref(k, 2))
        } else {
            Some(eref(k, 1))
        };
        assert_eq!(index.get(hash(k), |e| key_of(e) == k), want, "key {k}");
    }
    // It keeps working after the reopen, remote readers included.
    for k in 3000..4000u64 {
        index
            .upsert(hash(k), eref(k, 1), |e| key_of(e) == k)
            .unwrap();
    }
    let node = node(&pool);
    let mut ep = in_process(&node);
    let mut remote = RemoteIndex::connect(&mut ep).unwrap();
    let mut out = Vec::new();
    remote.candidates(&mut ep, hash(3500), &mut out).unwrap();
    assert!(out.contains(&eref(3500, 1)));
    assert_eq!(index_tables(&pool).len(), 1);
}

#[test]
fn open_frees_stray_and_retired_tables() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index.pool");
    // A long grace: tables retired before the restart are still allocated when the pool closes.
    let cfg = IndexConfig {
        retire_grace: Duration::from_secs(3600),
        ..tiny(0.25)
    };
    let (before, _) = populate(&path, &cfg);
    let pool = open_pool(&path);
    assert!(
        index_tables(&pool).len() > 2,
        "retired tables are still allocated"
    );
    // A stray table (as an interrupted resize leaves) and a stray header (an interrupted create).
    let stray_table = pool.alloc_bytes(4096, tags::INDEX_TABLE).unwrap();
    let stray_header = pool.alloc_bytes(64, tags::INDEX_HEADER).unwrap();
    let other = pool.alloc_bytes(64, 0x55).unwrap();
    let index = Index::open(pool.clone(), &cfg).unwrap();
    assert_eq!(index_tables(&pool), vec![index.current().table]);
    let all = pool.allocated();
    assert!(!all.contains(&stray_table));
    assert!(!all.contains(&stray_header));
    assert!(
        all.contains(&other),
        "extents of other owners are left alone"
    );
    assert_eq!(contents(&index), before);
}

#[test]
fn corrupt_header_is_refused_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index.pool");
    let cfg = tiny(0.25);
    let (_, header) = populate(&path, &cfg);
    // Flip a byte of the settings (covered by the CRC).
    flip_byte(&path, header + 20);
    let pool = open_pool(&path);
    let _stray = pool.alloc_bytes(4096, tags::INDEX_TABLE).unwrap();
    let before = snapshot(&pool);
    let err = Index::open(pool.clone(), &cfg).unwrap_err();
    assert!(matches!(err, IndexError::CorruptHeader { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("corrupt index header") && msg.contains("checksum"),
        "{msg}"
    );
    assert!(snapshot(&pool) == before, "a refused open changed the pool");
    // open_or_create refuses too (the root slot is set), and a remote reader reports the damage.
    assert!(Index::open_or_create(pool.clone(), &cfg).is_err());
    assert!(snapshot(&pool) == before);
    let node = node(&pool);
    let mut ep = in_process(&node);
    let err = RemoteIndex::connect(&mut ep).unwrap_err();
    assert!(matches!(err, RemoteIndexError::Corrupt { .. }), "{err}");
}

#[test]
fn damaged_table_and_bad_roots_are_refused_untouched() {
    let pool = anon_pool(32 << 20);
    let cfg = tiny(0.25);
    let index = Index::create(pool.clone(), &cfg).unwrap();
    for k in 0..100u64 {
        index
            .upsert(hash_of(k), eref(k, 1), |e| key_of(e) == k)
            .unwrap();
    }
    let header = index.header_offset();
    let table = index.current().table;
    drop(index);

    // A damaged table header.
    let mut b = [0u8; 1];
    pool.read(table + 9, &mut b).unwrap();
    pool.write(table + 9, &[b[0] ^ 1]).unwrap();
    let before = snapshot(&pool);
    let err = Index::open(pool.clone(), &cfg).unwrap_err();
    assert!(matches!(err, IndexError::CorruptTable { .. }), "{err}");
    assert!(snapshot(&pool) == before);
    pool.write(table + 9, &b).unwrap();
    Index::open(pool.clone(), &cfg).unwrap();

    // An unsupported version (with a valid checksum) is named as such.
    let mut hb = [0u8; 64];
    pool.read(header, &mut hb).unwrap();
    let mut v2 = hb;
    v2[8] = 2;
    let crc = crc_of(&v2[..48]);
    v2[48..52].copy_from_slice(&crc.to_le_bytes());
    pool.write(header, &v2).unwrap();
    let err = Index::open(pool.clone(), &cfg).unwrap_err();
    assert!(
        matches!(err, IndexError::UnsupportedVersion { found: 2 }),
        "{err}"
    );
    pool.write(header, &hb).unwrap();

    // A root slot pointing at something that is not an index header.
    let other = pool.alloc_bytes(64, 0x55).unwrap();
    pool.set_root(roots::INDEX, other.offset).unwrap();
    let err = Index::open(pool.clone(), &cfg).unwrap_err();
    assert!(matches!(err, IndexError::CorruptHeader { .. }), "{err}");
    pool.set_root(roots::INDEX, header).unwrap();

    // Creating over an existing index is refused; the index is intact.
    assert!(matches!(
        Index::create(pool.clone(), &cfg),
        Err(IndexError::AlreadyExists(h)) if h == header
    ));
    let index = Index::open_or_create(pool.clone(), &cfg).unwrap();
    assert_eq!(index.len(), 100);
}

#[test]
fn missing_index_is_reported_and_open_or_create_creates() {
    let pool = anon_pool(16 << 20);
    assert!(matches!(
        Index::open(pool.clone(), &IndexConfig::default()),
        Err(IndexError::NotFound)
    ));
    let node = node(&pool);
    let mut ep = in_process(&node);
    assert!(matches!(
        RemoteIndex::connect(&mut ep),
        Err(RemoteIndexError::NotFound)
    ));
    // Leftovers of an interrupted create are freed by the next create.
    let leftover = pool.alloc_bytes(64, tags::INDEX_HEADER).unwrap();
    let index = Index::open_or_create(pool.clone(), &IndexConfig::default()).unwrap();
    assert_eq!(pool.root(roots::INDEX).unwrap(), index.header_offset());
    assert!(!pool.allocated().contains(&leftover) || leftover.offset == index.header_offset());
    assert_eq!(index.stats().buckets, 1024);
    assert!(index.is_empty());
    let remote = RemoteIndex::connect(&mut ep).unwrap();
    assert_eq!(remote.header_offset(), index.header_offset());
    assert!(matches!(
        Index::create(
            pool.clone(),
            &IndexConfig {
                initial_buckets: 3,
                ..IndexConfig::default()
            }
        ),
        Err(IndexError::InvalidConfig(_))
    ));
}

/// A pool can hold several indexes, each named by a word of the pool: they keep their own keys across a reopen,
/// opening one leaves the others' tables alone, and what none of them uses is freed once all are open.
#[test]
fn indexes_anchored_in_pool_words_live_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let cfg = tiny(0.25);
    let anchors = {
        let pool = create_pool(&path);
        let words = pool.alloc_bytes(64, 0x7f).unwrap();
        let anchors = [Anchor::Word(words.offset), Anchor::Word(words.offset + 8)];
        for (n, anchor) in anchors.iter().enumerate() {
            let index = Index::create_at(pool.clone(), &cfg, *anchor).unwrap();
            // Enough keys to resize: the replaced tables must not be mistaken for the other index's.
            for k in 0..400u64 {
                index
                    .upsert(hash(k), eref(k, n as u64 + 1), |e| key_of(e) == k)
                    .unwrap();
            }
            assert!(matches!(
                Index::create_at(pool.clone(), &cfg, *anchor),
                Err(IndexError::AlreadyExists(_))
            ));
        }
        // An interrupted creation leaves a header nothing names.
        pool.alloc_bytes(64, tags::INDEX_HEADER).unwrap();
        pool.close().unwrap();
        anchors
    };
    let pool = open_pool(&path);
    let opened: Vec<Index> = anchors
        .iter()
        .map(|a| Index::open_at(pool.clone(), &cfg, *a).unwrap())
        .collect();
    for (n, index) in opened.iter().enumerate() {
        assert_eq!(index.len(), 400);
        for k in 0..400u64 {
            assert_eq!(
                index.get(hash(k), |e| key_of(e) == k),
                Some(eref(k, n as u64 + 1))
            );
        }
    }
    let live: Vec<&Index> = opened.iter().collect();
    assert!(free_unreferenced(&pool, &live) >= 1, "the stray header");
    let index_extents = pool
        .allocated()
        .into_iter()
        .filter(|e| e.tag == tags::INDEX_HEADER || e.tag == tags::INDEX_TABLE)
        .count();
    assert_eq!(index_extents, 4, "each index keeps its header and table");
    // A KV node reaches either one by its header.
    let node = node(&pool);
    let mut ep = in_process(&node);
    for index in &opened {
        let mut remote = RemoteIndex::connect_at(&mut ep, index.header_offset()).unwrap();
        let mut out = Vec::new();
        remote.candidates(&mut ep, hash(7), &mut out).unwrap();
        assert!(out.contains(&index.get(hash(7), |e| key_of(e) == 7).unwrap()));
    }
    // A header offset from a damaged root or reply: aligned, but so high that the header's end overflows.
    assert!(RemoteIndex::connect_at(&mut ep, u64::MAX - 63).is_err());
}

/// CRC32C (Castagnoli), bitwise: the index header's checksum.
fn crc_of(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// An emptied index of a pool that holds several gives every extent back (its header, its table and the tables it
/// replaced), and only its own; the others keep working. A remote reader still holding its header gets an error,
/// never an entry, once the space is reused.
#[test]
fn an_emptied_index_gives_its_extents_back() {
    let dir = tempfile::tempdir().unwrap();
    let pool = create_pool(&dir.path().join("pool"));
    let cfg = IndexConfig {
        // Replaced tables wait: the free must take them too.
        retire_grace: Duration::from_secs(3600),
        ..tiny(0.25)
    };
    let words = pool.alloc_bytes(64, 0x7f).unwrap();
    let index_extents = |pool: &Pool| -> Vec<u64> {
        pool.allocated()
            .into_iter()
            .filter(|e| e.tag == tags::INDEX_HEADER || e.tag == tags::INDEX_TABLE)
            .map(|e| e.offset)
            .collect()
    };
    let kept = Index::create_at(pool.clone(), &cfg, Anchor::Word(words.offset)).unwrap();
    kept.upsert(hash(1), eref(1, 1), |e| key_of(e) == 1)
        .unwrap();
    let kept_extents = index_extents(&pool);
    let free_before = pool.space().free_bytes();
    let anchor = Anchor::Word(words.offset + 8);
    let goes = Index::create_at(pool.clone(), &cfg, anchor).unwrap();
    for k in 0..400u64 {
        goes.upsert(hash(k), eref(k, 1), |e| key_of(e) == k)
            .unwrap();
    }
    assert!(goes.stats().retired_tables > 0, "{:?}", goes.stats());
    let node = node(&pool);
    let mut ep = in_process(&node);
    let mut remote = RemoteIndex::connect_at(&mut ep, goes.header_offset()).unwrap();

    assert!(matches!(goes.free(), Err(IndexError::NotEmpty(400))));
    assert_eq!(goes.get(hash(5), |e| key_of(e) == 5), Some(eref(5, 1)));
    for k in 0..400u64 {
        assert_eq!(goes.remove(hash(k), |e| key_of(e) == k), Some(eref(k, 1)));
    }
    // The caller unlinks the index first.
    pool.atomic_u64(words.offset + 8)
        .unwrap()
        .store(0, std::sync::atomic::Ordering::Release);
    goes.free().unwrap();
    assert_eq!(index_extents(&pool), kept_extents);
    assert_eq!(pool.space().free_bytes(), free_before);
    assert_eq!(goes.stats(), dinomo_index::IndexStats::default());
    goes.free().unwrap();
    drop(goes);
    assert_eq!(pool.space().free_bytes(), free_before, "no double free");

    // The space is reused, filled with bytes that are no index.
    let mut reused = Vec::new();
    while let Ok(e) = pool.alloc(1, 0x7e) {
        pool.write(e.offset, &vec![0xab; e.len as usize]).unwrap();
        reused.push(e.offset);
    }
    assert_eq!(pool.space().free_bytes(), 0);
    let mut out = Vec::new();
    for k in 0..20u64 {
        let found = remote.candidates(&mut ep, hash(k), &mut out);
        assert!(
            matches!(found, Err(RemoteIndexError::Corrupt { .. })),
            "key {k}: {found:?} {out:?}"
        );
    }
    // The other index is untouched, and a new one can take the word.
    assert_eq!(kept.get(hash(1), |e| key_of(e) == 1), Some(eref(1, 1)));
    for offset in reused {
        pool.free(offset).unwrap();
    }
    let again = Index::create_at(pool.clone(), &cfg, anchor).unwrap();
    again
        .upsert(hash(2), eref(2, 1), |e| key_of(e) == 2)
        .unwrap();
    assert_eq!(again.len(), 1);
}
