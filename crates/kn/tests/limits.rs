//! Oversized keys and values get a clear error and change nothing; limits that cannot fit in a log segment are
//! refused at start-up.

use dinomo_dpm::ProcessorConfig;
use dinomo_kn::{Embedded, EmbeddedConfig, KnConfig, KnError, KvHandle};

fn config(max_key_len: usize, max_value_len: usize, segment_size: u64) -> EmbeddedConfig {
    EmbeddedConfig {
        pool_size: 64 << 20,
        pool_segment_size: 64 << 10,
        processor: ProcessorConfig {
            segment_size,
            ..ProcessorConfig::default()
        },
        kn: KnConfig {
            threads: 1,
            max_key_len,
            max_value_len,
            ..KnConfig::default()
        },
        ..EmbeddedConfig::default()
    }
}

/// Writes `key(i)` = `value(i)` for i = 0, 1, ... until the store refuses one: how many were written, and the
/// refusal.
fn fill_until_refused(
    h: &KvHandle,
    key: impl Fn(u32) -> String,
    value: impl Fn(u32) -> Vec<u8>,
) -> (u32, KnError) {
    for i in 0..2_000_000 {
        if let Err(e) = h.set(key(i).as_bytes(), &value(i)) {
            return (i, e);
        }
    }
    panic!("the store never filled up");
}

#[test]
fn oversized_keys_and_values_are_refused_and_change_nothing() -> anyhow::Result<()> {
    let store = Embedded::open(&config(16, 100, 64 << 10))?;
    let h = store.handle();
    h.set(b"k", b"v")?;
    let long_key = vec![b'k'; 17];
    assert!(matches!(
        h.set(&long_key, b"v"),
        Err(KnError::KeyTooLarge { len: 17, max: 16 })
    ));
    assert!(matches!(h.get(&long_key), Err(KnError::KeyTooLarge { .. })));
    assert!(matches!(
        h.delete(&long_key),
        Err(KnError::KeyTooLarge { .. })
    ));
    let big = vec![0u8; 101];
    let err = h.set(b"k", &big).unwrap_err();
    assert!(matches!(err, KnError::ValueTooLarge { len: 101, max: 100 }));
    assert_eq!(
        err.to_string(),
        "value of 101 bytes exceeds the limit of 100 bytes"
    );
    assert!(matches!(
        h.insert(b"new", &big),
        Err(KnError::ValueTooLarge { .. })
    ));
    assert_eq!(
        h.get(b"k")?,
        Some(b"v".to_vec()),
        "the refused write changed nothing"
    );
    assert_eq!(h.get(b"new")?, None);
    // The limits themselves are accepted.
    h.set(&[b'k'; 16], &[1u8; 100])?;
    assert_eq!(h.get(&[b'k'; 16])?, Some(vec![1u8; 100]));
    Ok(())
}

#[test]
fn a_value_limit_beyond_the_segment_size_is_refused_at_start_up() {
    let err = Embedded::open(&config(4096, 1 << 20, 64 << 10))
        .err()
        .expect("refused");
    let msg = err.to_string();
    assert!(matches!(err, KnError::Config(_)), "{msg}");
    assert!(
        msg.contains("max_value_len 1048576") && msg.contains("segment"),
        "{msg}"
    );
}

#[test]
fn impossible_limits_are_refused() {
    assert!(matches!(
        Embedded::open(&config(70_000, 10, 64 << 10)),
        Err(KnError::Config(_))
    ));
}

#[test]
fn stopping_a_node_returns_while_handles_are_alive_and_they_get_stopped() -> anyhow::Result<()> {
    let pool = std::sync::Arc::new(dinomo_pool::Pool::anonymous(64 << 20, 64 << 10)?);
    let processor = dinomo_dpm::Processor::start(
        pool.clone(),
        &ProcessorConfig {
            segment_size: 64 << 10,
            ..Default::default()
        },
    )?;
    let node = dinomo_fabric::MemoryNode::new(pool, dinomo_fabric::NodeConfig::default());
    processor.serve(&node);
    let kn = dinomo_kn::KvNode::start(
        KnConfig {
            threads: 2,
            max_value_len: 1024,
            ..KnConfig::default()
        },
        dinomo_fabric::Connector::new(dinomo_fabric::Target::InProcess(node)),
    )?;
    let h = kn.handle();
    h.set(b"k", b"v")?;
    kn.stop();
    assert!(matches!(h.get(b"k"), Err(KnError::Stopped)));
    assert!(matches!(h.set(b"k", b"w"), Err(KnError::Stopped)));
    Ok(())
}

/// A full pool: a write that needs a log segment the memory node cannot grant is refused with
/// `KnError::OutOfSpace` (nothing applied), and the values stored before are still read.
#[test]
fn a_full_pool_refuses_writes_as_out_of_space_and_keeps_serving_reads() -> anyhow::Result<()> {
    let mut cfg = config(16, 16 << 10, 1 << 20);
    cfg.pool_size = 16 << 20;
    cfg.pool_segment_size = 1 << 20;
    let store = Embedded::open(&cfg)?;
    let h = store.handle();
    let value = |i: u32| vec![(i % 251) as u8; 15 << 10];
    let (mut stored, mut refused) = (Vec::new(), 0);
    for i in 0..5_000u32 {
        match h.set(format!("k{i}").as_bytes(), &value(i)) {
            Ok(()) => stored.push(i),
            Err(KnError::OutOfSpace(why)) => {
                assert!(why.contains("out of pool space"), "{why}");
                refused += 1;
                if refused == 20 {
                    break;
                }
            }
            Err(e) => panic!("write {i}: {e}"),
        }
    }
    assert_eq!(refused, 20, "the pool never filled up");
    assert!(stored.len() > 100, "only {} writes fit", stored.len());
    for &i in &stored {
        assert_eq!(h.get(format!("k{i}").as_bytes())?, Some(value(i)), "k{i}");
    }
    Ok(())
}

/// A write refused for want of a new log segment must leave the current one open: a smaller write that still fits
/// in it is acknowledged, so it must survive a restart like any other.
#[test]
fn a_small_write_after_a_refused_roll_survives_a_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(16, 16 << 10, 1 << 20);
    cfg.pool_path = Some(dir.path().join("pool"));
    cfg.pool_size = 16 << 20;
    cfg.pool_segment_size = 1 << 20;
    let big = |i: u32| vec![(i % 251) as u8; 15 << 10];
    let key = |i: u32| format!("k{i}");
    let mut stored = Vec::new();
    {
        let store = Embedded::open(&cfg)?;
        let h = store.handle();
        let (written, refusal) = fill_until_refused(&h, key, big);
        assert!(matches!(refusal, KnError::OutOfSpace(_)), "{refusal}");
        stored.extend((0..written).map(|i| (key(i), big(i))));
        // The refused segment had less than 15 KiB left; small writes still fit there.
        for i in 0..8u32 {
            let key = format!("small{i}");
            match h.set(key.as_bytes(), b"tiny") {
                Ok(()) => stored.push((key, b"tiny".to_vec())),
                Err(KnError::OutOfSpace(_)) => {}
                Err(e) => panic!("small write {i}: {e}"),
            }
        }
        assert!(
            stored.iter().any(|(k, _)| k.starts_with("small")),
            "no small write fit after the refusal"
        );
    }
    let store = Embedded::open(&cfg)?;
    let h = store.handle();
    for (key, value) in &stored {
        assert_eq!(
            h.get(key.as_bytes())?.as_deref(),
            Some(&value[..]),
            "{key} was acknowledged before the restart"
        );
    }
    Ok(())
}

/// A full pool still takes deletes (into the memory node's delete reserve), and the space they free is written
/// again, across restarts: a full store is never stuck. The keys are deleted oldest first, so the first deletes
/// free no whole segment and go into the reserve.
#[test]
fn a_full_store_can_be_emptied_and_filled_again() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(16, 16 << 10, 1 << 20);
    cfg.pool_path = Some(dir.path().join("pool"));
    cfg.pool_size = 16 << 20;
    cfg.pool_segment_size = 1 << 20;
    // Two threads delete at once from the reserve's two segments.
    cfg.kn.threads = 2;
    let value = |round: u32, i: u32| vec![(round * 7 + i % 251) as u8; 15 << 10];
    let fill = |h: &KvHandle, round: u32| -> anyhow::Result<Vec<String>> {
        let key = |i: u32| format!("r{round}k{i}");
        let (written, refusal) = fill_until_refused(h, key, |i| value(round, i));
        anyhow::ensure!(
            matches!(refusal, KnError::OutOfSpace(_)),
            "write {}: {refusal}",
            key(written)
        );
        Ok((0..written).map(key).collect())
    };
    let first = {
        let store = Embedded::open(&cfg)?;
        fill(&store.handle(), 0)?
    };
    assert!(first.len() > 100, "only {} writes fit", first.len());
    // A restart on the full pool: the reserve is set aside again.
    let store = Embedded::open(&cfg)?;
    let h = store.handle();
    assert!(matches!(
        h.set(b"one-more", &value(0, 0)),
        Err(KnError::OutOfSpace(_))
    ));
    for key in &first {
        h.delete(key.as_bytes())
            .map_err(|e| anyhow::anyhow!("delete {key} on a full pool: {e}"))?;
    }
    assert!(store.processor_stats().delete_reserve_grants >= 1);
    for key in first.iter().step_by(17) {
        assert_eq!(h.get(key.as_bytes())?, None, "{key} was deleted");
    }
    let second = fill(&h, 1)?;
    assert!(
        second.len() * 10 >= first.len() * 8,
        "after emptying the store only {} of {} writes fit again",
        second.len(),
        first.len()
    );
    drop(h);
    drop(store);
    let store = Embedded::open(&cfg)?;
    let h = store.handle();
    for key in &first {
        assert_eq!(h.get(key.as_bytes())?, None, "{key} stays deleted");
    }
    for (i, key) in second.iter().enumerate() {
        assert_eq!(h.get(key.as_bytes())?, Some(value(1, i as u32)), "{key}");
    }
    Ok(())
}

/// An index reference naming an entry longer than a log segment can only be damage: the read is refused as
/// corrupt, without a buffer of that size, and the node goes on serving other keys.
#[test]
fn an_index_reference_longer_than_a_segment_is_refused_as_corrupt() -> anyhow::Result<()> {
    use dinomo_log::{ENTRY_HEADER_LEN, EntryRef, entry_len};

    let mut cfg = config(32, 1024, 1 << 20);
    cfg.kn.cache.budget_bytes = 0;
    let store = Embedded::open(&cfg)?;
    let h = store.handle();
    let key = b"forged-reference-key";
    let value = vec![7u8; 100];
    h.set(key, &value)?;
    h.set(b"other", b"fine")?;
    h.merge_all()?;
    assert_eq!(h.get(key)?, Some(value.clone()));

    // Find the entry (its key follows the header), then every word in the pool that references it.
    let pool = store.pool();
    let mut bytes = vec![0u8; pool.len() as usize];
    pool.read(0, &mut bytes)?;
    let key_at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("the entry is in the pool");
    let entry_at = (key_at - ENTRY_HEADER_LEN) as u64;
    let real = EntryRef::new(entry_at, entry_len(key.len(), value.len()) as u64)
        .expect("aligned")
        .raw();
    let forged = EntryRef::new(entry_at, 64 << 20).expect("aligned").raw();
    let mut replaced = 0;
    for at in (0..bytes.len() - 8).step_by(8) {
        if u64::from_le_bytes(bytes[at..at + 8].try_into()?) == real {
            pool.write(at as u64, &forged.to_le_bytes())?;
            replaced += 1;
        }
    }
    assert!(replaced >= 1, "no index word references the entry");

    match h.get(key) {
        Err(KnError::Corrupt(why)) => assert!(why.contains("longer than a log segment"), "{why}"),
        other => panic!("a forged reference was followed: {other:?}"),
    }
    assert_eq!(h.get(b"other")?, Some(b"fine".to_vec()));
    Ok(())
}

/// Many small keys: the index runs out of room before the log does (doubling its table needs a contiguous run the
/// pool no longer has). Writes are refused as out of space at once and every acknowledged write is merged;
/// deleting every other key (which frees no whole log segment) makes room for new ones; a restart serves
/// everything.
#[test]
fn an_index_that_cannot_grow_refuses_new_keys_and_recovers_after_deletes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(32, 1024, 32 << 10);
    cfg.pool_path = Some(dir.path().join("pool"));
    cfg.pool_size = 2 << 20;
    cfg.pool_segment_size = 32 << 10;
    cfg.kn.threads = 2;
    let key = |i: u32| format!("key-{i:09}");
    let value = |i: u32| i.to_le_bytes().to_vec();
    let store = Embedded::open(&cfg)?;
    let h = store.handle();
    let (stored, refusal) = fill_until_refused(&h, key, value);
    match &refusal {
        KnError::OutOfSpace(why) => assert!(why.contains("index"), "{why}"),
        other => panic!("a full index answered {other:?}"),
    }
    // Nothing acknowledged is left unmerged: the index kept room for it.
    h.merge_all()?;
    let stats = store.processor_stats();
    assert_eq!(stats.backlog_segments, 0, "{stats:?}");
    assert_eq!(stats.index_entries, u64::from(stored), "{stats:?}");

    // Deleting half the keys makes room for as many new ones.
    for i in (0..stored).step_by(2) {
        h.delete(key(i).as_bytes())
            .map_err(|e| anyhow::anyhow!("delete {}: {e}", key(i)))?;
    }
    let fresh = stored / 4;
    for i in stored..stored + fresh {
        h.set(key(i).as_bytes(), &value(i))
            .map_err(|e| anyhow::anyhow!("write {} after deletes: {e}", key(i)))?;
    }
    drop(h);
    drop(store);

    let store = Embedded::open(&cfg)?;
    let h = store.handle();
    for i in (0..stored + fresh).step_by(5) {
        let expect = (i >= stored || i % 2 == 1).then(|| value(i));
        assert_eq!(h.get(key(i).as_bytes())?, expect, "{}", key(i));
    }
    Ok(())
}

/// Log segments large next to the index: more writes are on their way when the index stops growing than it has
/// slots left, so some acknowledged writes cannot be merged yet. They are still served, before and after a
/// restart (the memory node starts with them unmerged, and the KV node reads them from the log).
#[test]
fn acknowledged_writes_the_index_has_no_room_for_are_served_across_a_restart() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let mut cfg = config(32, 1024, 512 << 10);
    cfg.pool_path = Some(dir.path().join("pool"));
    cfg.pool_size = 5 << 20;
    cfg.pool_segment_size = 64 << 10;
    cfg.processor.delete_reserve_segments = 0;
    cfg.kn.threads = 2;
    cfg.kn.max_unmerged_segments = 3;
    let key = |i: u32| format!("key-{i:09}");
    let value = |i: u32| i.to_le_bytes().to_vec();
    let (stored, backlog) = {
        let store = Embedded::open(&cfg)?;
        let h = store.handle();
        let (stored, refusal) = fill_until_refused(&h, key, value);
        assert!(
            matches!(refusal, KnError::OutOfSpace(_)),
            "write {}: {refusal}",
            key(stored)
        );
        for i in (0..stored).step_by(3) {
            assert_eq!(h.get(key(i).as_bytes())?, Some(value(i)), "{}", key(i));
        }
        // Each write is a new key: an entry counts as merged once, however often a merge that ran out of room
        // was retried. (A merge that succeeds counts its entries when it ends: wait for the ones under way.)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let stats = loop {
            let stats = store.processor_stats();
            if stats.merged_entries == stats.index_entries || std::time::Instant::now() > deadline {
                break stats;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(stats.merged_entries, stats.index_entries, "{stats:?}");
        (stored, stats.backlog_segments)
    };
    assert!(
        backlog > 0,
        "every write was merged: the test needs some that cannot be"
    );
    let store = Embedded::open(&cfg)?;
    let h = store.handle();
    for i in (0..stored).step_by(3) {
        assert_eq!(
            h.get(key(i).as_bytes())?,
            Some(value(i)),
            "{} after the restart",
            key(i)
        );
    }
    assert!(matches!(
        h.set(b"one-more", b"v"),
        Err(KnError::OutOfSpace(_))
    ));
    Ok(())
}

/// Index tables replaced while the store fills stay allocated for a grace period (lookups under way may still
/// read them). A pool that runs out of room frees them before refusing a write: a long grace costs no capacity.
#[test]
fn replaced_index_tables_are_freed_before_a_write_is_refused() -> anyhow::Result<()> {
    let fill = |grace: std::time::Duration| -> anyhow::Result<(u32, u64)> {
        // Tables small next to a segment, as with the default 8 MiB segments: each takes one segment.
        let mut cfg = config(32, 4096, 256 << 10);
        cfg.pool_size = 8 << 20;
        cfg.pool_segment_size = 256 << 10;
        cfg.processor.index.initial_buckets = 16;
        cfg.processor.index.retire_grace = grace;
        cfg.processor.clean_max_live_percent = 0;
        let store = Embedded::open(&cfg)?;
        let h = store.handle();
        let (stored, refusal) =
            fill_until_refused(&h, |i| format!("key-{i:09}"), |i| vec![i as u8; 2000]);
        assert!(matches!(refusal, KnError::OutOfSpace(_)), "{refusal}");
        for i in (0..stored).step_by(97) {
            assert_eq!(
                h.get(format!("key-{i:09}").as_bytes())?,
                Some(vec![i as u8; 2000])
            );
        }
        Ok((stored, store.processor_stats().index_table_bytes))
    };
    let (without_grace, _) = fill(std::time::Duration::ZERO)?;
    let (with_grace, table_bytes) = fill(std::time::Duration::from_secs(3600))?;
    // Tables grew from 16 buckets to thousands, so several were replaced within the grace. Where writes stop may
    // differ by the entries of one segment (when the merges ran); keeping the replaced tables would cost several.
    assert!(
        table_bytes > 64 << 10,
        "the index hardly grew: {table_bytes} bytes"
    );
    let per_segment = (256 << 10) / 2000;
    assert!(
        with_grace + per_segment >= without_grace,
        "a long grace cost capacity: {with_grace} writes, {without_grace} without it"
    );
    Ok(())
}
