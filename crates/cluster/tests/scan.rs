//! Listing the keys of a cluster with the native clients (`Client::scan`, `Client::keys` and their pipelined
//! forms on `PipelinedClient`): a whole walk returns every
//! key there from its start to its end, even while KV nodes join and leave and writes go on between its steps, and
//! none that was deleted before it started.

use std::collections::BTreeSet;

use common::small_cluster;
use dinomo_cluster::{Client, LocalCluster, PipelinedClient};

mod common;

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:05}").into_bytes()
}

#[test]
fn a_walk_lists_every_key_while_nodes_join_and_leave() -> anyhow::Result<()> {
    let mut c = LocalCluster::start(small_cluster(2))?;
    let mut cl = Client::connect(c.client_config())?;
    for i in 0..1500 {
        cl.set(&key(i), b"v")?;
    }
    for i in (0..1500).step_by(5) {
        assert!(cl.delete(&key(i))?);
    }
    let stays: BTreeSet<Vec<u8>> = (0..1500).filter(|i| i % 5 != 0).map(key).collect();

    // A quiet walk: exactly the keys there.
    let mut named = BTreeSet::new();
    let (mut cursor, mut steps) = (0, 0);
    loop {
        let (next, keys) = cl.scan(cursor, 100)?;
        named.extend(keys);
        steps += 1;
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    assert_eq!(named, stays);
    assert!(steps > 5, "{steps} steps of about 100 keys");

    // A walk during which a node joins, another leaves, and keys are written and deleted.
    let mut named = BTreeSet::new();
    let mut deleted = BTreeSet::new();
    let (mut cursor, mut step) = (0, 0u32);
    loop {
        let (next, keys) = cl.scan(cursor, 50)?;
        named.extend(keys);
        cursor = next;
        if cursor == 0 {
            break;
        }
        match step {
            3 => {
                c.add_node()?;
            }
            9 => {
                let first = c.nodes()[0].id();
                c.remove_node(first)?;
            }
            _ => {}
        }
        cl.set(&key(2000 + step), b"new")?;
        let gone = key(1 + 5 * step);
        cl.delete(&gone)?;
        deleted.insert(gone);
        step += 1;
    }
    for k in stays.difference(&deleted) {
        assert!(
            named.contains(k),
            "{:?} stayed and was not listed",
            String::from_utf8_lossy(k)
        );
    }
    for k in &named {
        assert!(
            stays.contains(k) || k.as_slice() >= key(2000).as_slice(),
            "{:?} listed, deleted before the walk",
            String::from_utf8_lossy(k)
        );
    }

    // KEYS with a pattern, through the new membership.
    let want: Vec<Vec<u8>> = stays
        .iter()
        .filter(|k| k.starts_with(b"key-001") && !deleted.contains(*k))
        .cloned()
        .collect();
    assert_eq!(cl.keys(b"key-001*")?, want);
    assert!(cl.keys(b"nothing*")?.is_empty());

    // The pipelined client lists the same keys, asking about each step's keys at once.
    let mut pipelined = PipelinedClient::connect(c.client_config())?;
    assert_eq!(pipelined.keys(b"key-001*")?, want);
    let mut walked = BTreeSet::new();
    let mut cursor = 0;
    loop {
        let (next, keys) = pipelined.scan(cursor, 100)?;
        walked.extend(keys);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    let everything: BTreeSet<Vec<u8>> = cl.keys(b"*")?.into_iter().collect();
    assert_eq!(walked, everything);
    assert!(everything.len() > 1000, "{} keys", everything.len());
    Ok(())
}
