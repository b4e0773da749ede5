//! The memory node's walk over every key (what `SCAN` and `KEYS` read): a whole walk names every key written before
//! it started and not deleted before it ended, wherever the key's newest entry is (the open log segment, the merge
//! backlog or the index), while writes, merges and index growth go on between its steps.

use std::collections::{BTreeSet, HashSet};

use common::{small_segments_store as store, walk};
use dinomo_dpm::proto;
use rand::{RngExt, SeedableRng};

mod common;

fn key(i: u32) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

#[test]
fn a_walk_names_keys_in_the_open_segment_the_backlog_and_the_index() -> anyhow::Result<()> {
    let store = store()?;
    let kv = store.handle();
    assert!(walk(store.processor(), 10, 1 << 20, |_| Ok(()))?.is_empty());

    kv.set(b"only-in-the-open-segment", b"1")?;
    assert_eq!(store.processor().indexed_keys(), 0);
    assert_eq!(
        walk(store.processor(), 10, 1 << 20, |_| Ok(()))?,
        vec![b"only-in-the-open-segment".to_vec()]
    );
    assert!(kv.delete(b"only-in-the-open-segment")?);
    assert!(
        walk(store.processor(), 10, 1 << 20, |_| Ok(()))?.is_empty(),
        "a key whose newest entry deletes it is not named"
    );

    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut model = BTreeSet::new();
    for round in 0..12 {
        for _ in 0..200 {
            let k = key(rng.random_range(0..400u32));
            if rng.random_range(0..4u32) == 0 {
                kv.delete(&k)?;
                model.remove(&k);
            } else {
                kv.set(&k, &vec![b'v'; rng.random_range(1..100usize)])?;
                model.insert(k);
            }
        }
        if round == 6 {
            kv.merge_all()?;
        }
        for (count, max_bytes) in [(1, 1 << 20), (10, 1 << 20), (1000, 1 << 20), (10, 64)] {
            let named = walk(store.processor(), count, max_bytes, |_| Ok(()))?;
            let named: BTreeSet<Vec<u8>> = named.into_iter().collect();
            for k in &model {
                assert!(
                    named.contains(k),
                    "round {round}, count {count}: {:?} not named",
                    String::from_utf8_lossy(k)
                );
            }
            // Every key named was written; one not there now is one whose delete is not merged yet (the front
            // door asks its owner).
            for k in named.difference(&model) {
                assert!(!kv.exists(k)?, "{k:?} named, not in the model, yet there");
                assert!(k.starts_with(b"key-"), "{k:?} was never written");
            }
        }
    }
    Ok(())
}

#[test]
fn a_walk_names_every_key_that_stays_while_writes_go_on() -> anyhow::Result<()> {
    let store = store()?;
    let kv = store.handle();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    // Keys 0..500 are there before the walk; the walk deletes some of 0..100 and writes 500.. meanwhile, rewrites
    // 100..500, and merges now and then. The index grows under it.
    for i in 0..500u32 {
        kv.set(&key(i), b"first")?;
    }
    let mut deleted = HashSet::new();
    let mut next_new = 500u32;
    let named = walk(store.processor(), 5, 1 << 20, |step| {
        for _ in 0..20 {
            match rng.random_range(0..4u32) {
                0 => {
                    let k = rng.random_range(0..100u32);
                    kv.delete(&key(k))?;
                    deleted.insert(k);
                }
                1 => {
                    kv.set(&key(next_new), b"new")?;
                    next_new += 1;
                }
                _ => kv.set(&key(rng.random_range(100..500u32)), b"again")?,
            }
        }
        if step % 7 == 0 {
            kv.merge_all()?;
        }
        Ok(())
    })?;
    let named: HashSet<Vec<u8>> = named.into_iter().collect();
    for i in (0..500u32).filter(|i| !deleted.contains(i)) {
        assert!(named.contains(&key(i)), "key-{i} stayed and was not named");
    }
    for k in &named {
        let i: u32 = std::str::from_utf8(&k[4..])?.parse()?;
        assert!(i < next_new, "{k:?} was never written");
    }
    Ok(())
}

#[test]
fn a_cursor_the_memory_node_never_gave_out_is_refused() -> anyhow::Result<()> {
    let store = store()?;
    store.handle().set(b"k", b"v")?;
    let connector = dinomo_fabric::Connector::new(dinomo_fabric::Target::InProcess(
        store.memory_node().clone(),
    ));
    let mut ep = connector.connect()?;
    let scan = |ep: &mut dinomo_fabric::Endpoint, cursor| {
        ep.call::<_, proto::KeysPage>(
            proto::SCAN_KEYS,
            &proto::ScanKeys {
                cursor,
                count: 10,
                max_bytes: 1 << 20,
            },
        )
    };
    let err = scan(&mut ep, 12345).expect_err("not a cursor");
    assert!(err.to_string().contains("not a cursor"), "{err}");
    // Any cursor of either phase is taken, even one naming no log or a slice beyond the index: it walks on from
    // there and ends.
    for cursor in [
        1 << 63 | 0x7f_ffff << 40 | 77,
        u64::MAX,
        1 << 62 | 0xffff_ffff,
    ] {
        let mut c = cursor;
        for _ in 0..10_000 {
            c = scan(&mut ep, c)?.cursor;
            if c == 0 {
                break;
            }
        }
        assert_eq!(c, 0, "a walk from {cursor:#x} ends");
    }
    // The connection still serves.
    let mut c = 0;
    let mut named = Vec::new();
    loop {
        let page = scan(&mut ep, c)?;
        named.extend(page.keys);
        c = page.cursor;
        if c == 0 {
            break;
        }
    }
    assert_eq!(named, vec![b"k".to_vec()]);
    Ok(())
}
