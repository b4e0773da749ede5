//! The memory node counts keys exactly (what `DBSIZE` reports): every write that reached the pool counts, whether
//! it is merged into the index, sealed in the merge backlog, or still in a KV node's open log segment.

use std::collections::BTreeSet;

use dinomo_dpm::{ProcessorConfig, proto};
use dinomo_kn::{Embedded, EmbeddedConfig};
use rand::{RngExt, SeedableRng};

mod common;
use common::small_segments_store as store;

/// The count over the fabric, as a KV node asks for it.
fn count_over_rpc(store: &Embedded) -> anyhow::Result<u64> {
    let connector = dinomo_fabric::Connector::new(dinomo_fabric::Target::InProcess(
        store.memory_node().clone(),
    ));
    let mut ep = connector.connect()?;
    let reply: proto::KeyCount = ep.call(proto::COUNT_KEYS, &())?;
    Ok(reply.keys)
}

#[test]
fn counts_merged_backlogged_and_open_entries_exactly() -> anyhow::Result<()> {
    let store = store()?;
    let kv = store.handle();
    assert_eq!(store.processor().count_keys()?, 0);

    kv.set(b"first", b"1")?;
    assert_eq!(
        store.processor().indexed_keys(),
        0,
        "the write is only in the open segment"
    );
    assert_eq!(store.processor().count_keys()?, 1);
    assert!(kv.delete(b"first")?);
    assert_eq!(store.processor().count_keys()?, 0);

    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut model = BTreeSet::new();
    for round in 0..20 {
        for _ in 0..150 {
            let key = format!("key-{}", rng.random_range(0..300u32)).into_bytes();
            match rng.random_range(0..10u32) {
                0..=5 => {
                    kv.set(&key, &vec![b'v'; rng.random_range(1..64usize)])?;
                    model.insert(key);
                }
                6..=7 => {
                    assert_eq!(kv.delete(&key)?, model.remove(&key));
                }
                8 => {
                    if kv.insert(&key, b"new")? {
                        model.insert(key);
                    }
                }
                _ => {
                    // Counters live under their own names: the other keys hold text.
                    let counter = [b"n-".as_slice(), &key].concat();
                    kv.incr(&counter, 1)?;
                    model.insert(counter);
                }
            }
        }
        assert_eq!(
            store.processor().count_keys()?,
            model.len() as u64,
            "round {round}"
        );
        if round == 10 {
            kv.merge_all()?;
            assert_eq!(
                store.processor().indexed_keys(),
                model.len() as u64,
                "merged"
            );
        }
    }
    assert_eq!(count_over_rpc(&store)?, model.len() as u64);
    Ok(())
}

#[test]
fn the_count_survives_a_restart_of_everything() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = |path| -> anyhow::Result<Embedded> {
        let mut s = EmbeddedConfig {
            pool_path: Some(path),
            pool_size: 64 << 20,
            pool_segment_size: 16 << 10,
            processor: ProcessorConfig {
                segment_size: 16 << 10,
                ..ProcessorConfig::default()
            },
            ..EmbeddedConfig::default()
        };
        s.kn.threads = 1;
        s.kn.max_value_len = 2048;
        Ok(Embedded::open(&s)?)
    };
    let path = dir.path().join("pool");
    {
        let store = cfg(path.clone())?;
        let kv = store.handle();
        for i in 0..500u32 {
            kv.set(format!("k{i}").as_bytes(), b"value")?;
        }
        for i in 0..100u32 {
            kv.delete(format!("k{i}").as_bytes())?;
        }
        assert_eq!(store.processor().count_keys()?, 400);
    }
    let store = cfg(path)?;
    assert_eq!(store.processor().count_keys()?, 400);
    assert_eq!(
        store.processor().indexed_keys(),
        400,
        "recovery merged it all"
    );
    Ok(())
}
