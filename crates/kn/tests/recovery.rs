//! Recovery: a KV node that restarts has its unmerged log merged before it serves; a memory node that restarts
//! merges committed-but-unmerged entries and rejects torn ones by their CRC; space stays bounded under a long
//! update-heavy run and a KV node's memory stays within its budget.

use std::sync::Arc;

use dinomo_cache::CacheConfig;
use dinomo_dpm::{Processor, ProcessorConfig};
use dinomo_fabric::{Connector, MemoryNode, NodeConfig, Target};
use dinomo_kn::{DirectWorker, Embedded, EmbeddedConfig, KnConfig};
use dinomo_log::{Op, encode_entry};
use dinomo_pool::{PersistMode, Pool, PoolOptions};

fn kn(cache: u64) -> KnConfig {
    KnConfig {
        threads: 1,
        max_value_len: 2048,
        cache: CacheConfig {
            budget_bytes: cache,
            ..CacheConfig::default()
        },
        ..KnConfig::default()
    }
}

fn small_processor() -> ProcessorConfig {
    ProcessorConfig {
        segment_size: 16 << 10,
        merge_threads: 2,
        ..ProcessorConfig::default()
    }
}

#[test]
fn restarted_kv_node_has_its_log_merged_before_it_serves() -> anyhow::Result<()> {
    let pool = Arc::new(Pool::anonymous(64 << 20, 16 << 10)?);
    let processor = Processor::start(pool.clone(), &small_processor())?;
    let node = MemoryNode::new(pool, NodeConfig::default());
    processor.serve(&node);
    let connector = Connector::new(Target::InProcess(node.clone()));

    let mut w = DirectWorker::start(kn(1 << 20), 0, connector.clone())?;
    for i in 0..100u32 {
        w.set(format!("k{i}").as_bytes(), format!("v{i}").as_bytes())?;
    }
    assert!(
        processor.indexed_keys() == 0,
        "nothing sealed yet, so nothing merged"
    );
    // The KV node dies: its cache and unmerged copies are gone, its head segment is still open.
    drop(w);

    let mut w = DirectWorker::start(kn(0), 0, connector)?;
    assert_eq!(processor.indexed_keys(), 100, "claiming the log merged it");
    for i in 0..100u32 {
        assert_eq!(
            w.get(format!("k{i}").as_bytes())?,
            Some(format!("v{i}").into_bytes())
        );
    }
    let st = w.stats();
    assert_eq!(
        st.index_walks, 100,
        "served from the index, not from local state"
    );
    assert_eq!(processor.stats().backlog_segments, 0);
    Ok(())
}

/// Where log 0's head segment is recorded: the directory's head word for it, and the segment it names.
struct LogHead {
    word: u64,
    segment: u64,
}

/// Creates a pool file at `path`, commits ten keys through one worker of log 0 and stops the memory node, leaving
/// the head segment open; returns the pool (still open) and where its head is.
fn ten_committed_keys(path: &std::path::Path) -> anyhow::Result<(Arc<Pool>, LogHead)> {
    let opts = PoolOptions {
        size: 64 << 20,
        segment_size: 16 << 10,
        persist: PersistMode::Volatile,
    };
    let pool = Arc::new(Pool::create(path, &opts)?);
    let processor = Processor::start(pool.clone(), &small_processor())?;
    let node = MemoryNode::new(pool.clone(), NodeConfig::default());
    processor.serve(&node);
    let mut w = DirectWorker::start(
        kn(1 << 20),
        0,
        Connector::new(Target::InProcess(node.clone())),
    )?;
    for i in 0..10u32 {
        w.set(format!("k{i}").as_bytes(), b"committed")?;
    }
    drop(w);
    processor.shutdown();
    let word = pool.root(dinomo_log::roots::LOG_DIRECTORY)? + 64 + 8;
    let mut head = [0u8; 8];
    pool.read(word, &mut head)?;
    let segment = u64::from_le_bytes(head);
    Ok((pool, LogHead { word, segment }))
}

#[test]
fn memory_node_restart_merges_committed_entries_and_rejects_torn_ones() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("torn.pool");
    let log_id = 0u32;
    let head;
    {
        let (pool, log_head) = ten_committed_keys(&path)?;
        head = log_head.segment;
        // Append a torn entry after the committed ones in the open head segment: what a crash in the middle of a
        // WRITE leaves behind.
        let mut data = vec![0u8; 4096];
        pool.read(head + 64, &mut data)?;
        let (end, _) = dinomo_log::segment::scan(&data, log_id, 1, |_, _| {});
        let mut torn = Vec::new();
        encode_entry(&mut torn, Op::Put, log_id, 11, b"k-torn", &[7u8; 200]);
        torn.truncate(torn.len() - 50);
        pool.write(head + 64 + end as u64, &torn)?;
        pool.close()?;
    }
    let pool = Arc::new(Pool::open(&path, PersistMode::Volatile)?.0);
    let processor = Processor::start(pool.clone(), &small_processor())?;
    let stats = processor.stats();
    assert_eq!(stats.recovered_entries, 10, "{stats:?}");
    let node = MemoryNode::new(pool, NodeConfig::default());
    processor.serve(&node);
    let mut w = DirectWorker::start(kn(0), 0, Connector::new(Target::InProcess(node)))?;
    for i in 0..10u32 {
        assert_eq!(
            w.get(format!("k{i}").as_bytes())?,
            Some(b"committed".to_vec())
        );
    }
    assert_eq!(w.get(b"k-torn")?, None, "a torn entry is never served");
    // New writes continue after the last committed entry and survive another restart.
    w.set(b"after", b"restart")?;
    assert_eq!(w.get(b"after")?, Some(b"restart".to_vec()));
    assert_ne!(head, 0);
    Ok(())
}

#[test]
fn a_segment_chain_forged_through_the_data_region_is_refused_at_start() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("forged.pool");
    let (pool, log_head) = ten_committed_keys(&path)?;
    pool.close()?;
    drop(pool);
    let (head_word, head) = (log_head.word, log_head.segment);
    // Any client may WRITE the data region, the log directory and segments included. A copy of the head's header
    // placed inside the segment, and the directory pointed at it (aligned, then not), is not a segment the
    // processor allocated: starting must fail with a clear error, never panic, and change nothing.
    for forged in [head + 4096, head + 4100] {
        {
            let pool = Pool::open(&path, PersistMode::Volatile)?.0;
            let mut header = [0u8; 64];
            pool.read(head, &mut header)?;
            pool.write(forged, &header)?;
            pool.write(head_word, &forged.to_le_bytes())?;
            pool.close()?;
        }
        let pool = Arc::new(Pool::open(&path, PersistMode::Volatile)?.0);
        let err = match Processor::start(pool.clone(), &small_processor()) {
            Ok(_) => anyhow::bail!("a forged chain at {forged:#x} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("not an allocated log segment"),
            "{forged:#x}: {err}"
        );
        let mut word = [0u8; 8];
        pool.read(head_word, &mut word)?;
        assert_eq!(
            u64::from_le_bytes(word),
            forged,
            "the refused start wrote nothing"
        );
    }
    Ok(())
}

#[test]
fn space_stays_bounded_under_a_long_update_heavy_run() -> anyhow::Result<()> {
    let cfg = EmbeddedConfig {
        pool_size: 64 << 20,
        pool_segment_size: 16 << 10,
        processor: small_processor(),
        kn: KnConfig {
            threads: 2,
            ..kn(64 << 10)
        },
        ..EmbeddedConfig::default()
    };
    let store = Embedded::open(&cfg)?;
    let h = store.handle();
    let value = vec![0xabu8; 300];
    // 200 keys × 300 B = 60 KB live, rewritten 100 times: 6 MB written into a 64 MB pool, ~400 segments' worth.
    let mut peak = 0u64;
    for round in 0..100u32 {
        for k in 0..200u32 {
            h.set(format!("key{k}").as_bytes(), &value)?;
        }
        if round % 10 == 9 {
            h.merge_all()?;
            let s = store.processor_stats();
            peak = peak.max(s.pool_used_bytes);
        }
    }
    let s = store.processor_stats();
    assert!(s.recycled_segments > 300, "segments were recycled: {s:?}");
    let first_round_estimate = 4 << 20;
    assert!(
        peak < first_round_estimate,
        "pool use peaked at {peak} bytes: {s:?}"
    );
    for w in h.stats()? {
        assert!(w.cache.used_bytes <= w.cache.budget_bytes, "{w:?}");
        // Local copies of unmerged segments (at most max_unmerged_segments sealed plus the active one), each with
        // its bloom filter and key locator.
        assert!(w.unmerged_bytes <= 3 * (16 << 10) + 3 * (4 << 10), "{w:?}");
    }
    for k in 0..200u32 {
        assert_eq!(h.get(format!("key{k}").as_bytes())?, Some(value.clone()));
    }
    Ok(())
}
