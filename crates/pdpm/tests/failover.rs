//! A memory node fails (its connections are cut, as when it dies or the fabric loses it): with R = 2 every
//! committed key stays readable with its last committed value, writes behave as each store documents, and with
//! R = 1 the dead node's keys get a clear error, never a wrong value.

mod common;

use std::time::Duration;

use anyhow::Result;
use common::{Central, Clover, Nodes};
use dinomo_fabric::NodeConfig;
use dinomo_pdpm::central::{CentralClient, CentralLayout, CentralSettings, CoordinatorConfig};
use dinomo_pdpm::clover::{
    CloverClient, CloverCrash, CloverLayout, CloverSettings, MetadataConfig,
};
use dinomo_pdpm::direct::{self, DirectClient, DirectLayout, DirectSettings, Flavor};
use dinomo_pdpm::{PdpmError, PdpmStore};

const KEYS: usize = 40;
const FAILED: usize = 1;

fn key(i: usize) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

fn value(i: usize, round: u32) -> Vec<u8> {
    format!("value {i} of round {round}").into_bytes()
}

/// Writes every key's value of `round`.
fn put_all(c: &mut impl PdpmStore, round: u32) -> Result<()> {
    for i in 0..KEYS {
        c.put(&key(i), &value(i, round))?;
    }
    Ok(())
}

/// Checks that every key reads its value of `round`.
fn assert_all(c: &mut impl PdpmStore, round: u32) -> Result<()> {
    for i in 0..KEYS {
        assert_eq!(c.get(&key(i))?, Some(value(i, round)), "key {i}");
    }
    Ok(())
}

/// Tries to write every key's value of `round`; how many writes were refused because a memory node is down.
fn count_refused_writes(c: &mut impl PdpmStore, round: u32) -> usize {
    (0..KEYS)
        .filter(|&i| {
            matches!(
                c.put(&key(i), &value(i, round)),
                Err(PdpmError::NodeDown { .. })
            )
        })
        .count()
}

/// With memory node [`FAILED`] down and no replicas, checks every key of round 0: one whose node (`node_of`) is
/// the failed one is refused as `NodeDown` for both a read and a write, any other reads its value. Returns how many
/// keys were refused.
fn check_keys_after_failure<C: PdpmStore>(
    c: &mut C,
    node_of: impl Fn(&C, &[u8]) -> usize,
) -> Result<usize> {
    let mut lost = 0;
    for i in 0..KEYS {
        let r = c.get(&key(i));
        if node_of(c, &key(i)) == FAILED {
            assert!(
                matches!(r, Err(PdpmError::NodeDown { node: FAILED, .. })),
                "{r:?}"
            );
            let w = c.put(&key(i), b"x");
            assert!(matches!(w, Err(PdpmError::NodeDown { .. })), "{w:?}");
            lost += 1;
        } else {
            assert_eq!(r?, Some(value(i, 0)));
        }
    }
    Ok(lost)
}

fn direct_nodes(flavor: Flavor, replication: u32) -> Nodes {
    let layout = DirectLayout {
        flavor,
        slots: 256,
        max_key: 32,
        max_value: 64,
        replication,
    };
    Nodes::new(3, |pool| direct::format(pool, &layout).unwrap())
}

fn direct_client(nodes: &Nodes, node_retry: Duration) -> DirectClient {
    let settings = DirectSettings {
        node_retry,
        lock_lease: Duration::from_secs(3600),
        lock_wait: Duration::from_secs(2),
        ..DirectSettings::default()
    };
    DirectClient::connect(&nodes.connectors(false), settings).unwrap()
}

/// The memory nodes holding `key` under replication `r` (primary first).
fn direct_holders(c: &DirectClient, key: &[u8], r: usize) -> Vec<usize> {
    let p = c.primary_of(key);
    (0..r).map(|j| (p + j) % 3).collect()
}

fn fail(c: &DirectClient, node: usize) {
    c.fault_hooks(node).unwrap().cut();
}

#[test]
fn direct_replicated_keys_survive_a_memory_node_failure() -> Result<()> {
    for flavor in [Flavor::Markers, Flavor::Crc] {
        let n = direct_nodes(flavor, 2);
        let mut writer = direct_client(&n, Duration::from_secs(3600));
        for i in 0..KEYS {
            writer.put(&key(i), &value(i, 0))?;
            writer.put(&key(i), &value(i, 1))?;
        }
        writer.delete(&key(0))?;
        // A client that never met the keys (it probes the replica's section) and the writer lose node 1.
        let mut fresh = direct_client(&n, Duration::from_secs(3600));
        let mut untouched = direct_client(&n, Duration::from_secs(3600));
        fail(&writer, FAILED);
        fail(&fresh, FAILED);

        // The first operation after the failure is a write: it meets the dead node midway (or at once when it is
        // the primary) and reports not-applied; nothing changes and the primary's lock is released.
        let mut refused = Vec::new();
        for i in 1..KEYS {
            let holders = direct_holders(&writer, &key(i), 2);
            let r = writer.put(&key(i), &value(i, 2));
            if holders.contains(&FAILED) {
                assert!(
                    matches!(r, Err(PdpmError::NodeDown { .. })),
                    "{flavor:?} key {i} on {holders:?}: {r:?}"
                );
                refused.push(i);
            } else {
                r?;
            }
        }
        assert!(!refused.is_empty() && refused.len() < KEYS - 1);
        for c in [&mut writer, &mut fresh] {
            assert_eq!(c.get(&key(0))?, None, "{flavor:?}: the delete holds");
            for i in 1..KEYS {
                let round = if refused.contains(&i) { 1 } else { 2 };
                assert_eq!(c.get(&key(i))?, Some(value(i, round)), "{flavor:?} key {i}");
            }
        }
        // The refused writes left no lock behind: a client that still reaches node 1 writes those keys at once
        // (its lock lease is an hour, its wait two seconds).
        for &i in refused.iter().take(3) {
            untouched.put(&key(i), &value(i, 3))?;
            assert_eq!(untouched.get(&key(i))?, Some(value(i, 3)));
            untouched.put(&key(i), &value(i, 1))?;
        }
    }
    Ok(())
}

#[test]
fn direct_node_that_returns_serves_again() -> Result<()> {
    let n = direct_nodes(Flavor::Crc, 2);
    let retry = Duration::from_millis(20);
    let mut c = direct_client(&n, retry);
    put_all(&mut c, 0)?;
    fail(&c, FAILED);
    assert_all(&mut c, 0)?;
    assert!(count_refused_writes(&mut c, 1) > 0);
    // After `node_retry` the client connects again (a fresh connection, no fault) and every write goes through;
    // the node never missed an acknowledged write, so its copies are current.
    std::thread::sleep(retry * 2);
    put_all(&mut c, 2)?;
    let mut other = direct_client(&n, retry);
    for i in 0..KEYS {
        assert_eq!(other.get(&key(i))?, Some(value(i, 2)));
        assert_eq!(c.replica_values(&key(i))?, vec![Some(value(i, 2)); 2]);
    }
    Ok(())
}

#[test]
fn direct_unreplicated_keys_of_a_dead_node_get_a_clear_error() -> Result<()> {
    for flavor in [Flavor::Markers, Flavor::Crc] {
        let n = direct_nodes(flavor, 1);
        let mut c = direct_client(&n, Duration::from_secs(3600));
        put_all(&mut c, 0)?;
        fail(&c, FAILED);
        let lost = check_keys_after_failure(&mut c, |c, k| c.primary_of(k))?;
        assert!(lost > 0);
    }
    Ok(())
}

/// CentralDS on three memory nodes; the coordinator and its clients leave a failed node alone for an hour.
fn central_store(replication: u32) -> Central {
    let layout = CentralLayout {
        blocks: 512,
        max_key: 32,
        max_value: 64,
    };
    let config = CoordinatorConfig {
        replication,
        ..CoordinatorConfig::default()
    };
    let s = Central::new(3, &layout, config, NodeConfig::default().rpc_threads);
    s.coordinator.set_node_retry(Duration::from_secs(3600));
    s
}

fn central_client(s: &Central) -> CentralClient {
    let settings = CentralSettings {
        node_retry: Duration::from_secs(3600),
        grant_batch: 8,
        ..CentralSettings::default()
    };
    s.client(false, settings)
}

#[test]
fn central_reads_use_the_next_block_and_writes_avoid_the_dead_node() -> Result<()> {
    let s = central_store(2);
    let mut writer = central_client(&s);
    for i in 0..KEYS {
        writer.put(&key(i), &value(i, 0))?;
        writer.put(&key(i), &value(i, 1))?;
    }
    writer.delete(&key(0))?;
    let mut reader = central_client(&s);
    reader.fault_hooks(FAILED).unwrap().cut();
    assert_eq!(reader.get(&key(0))?, None);
    for i in 1..KEYS {
        assert_eq!(reader.get(&key(i))?, Some(value(i, 1)), "key {i}");
    }
    // The reader met the dead node (two copies on three nodes: some values had a block there) and told the
    // coordinator, which grants no more blocks on it.
    assert_eq!(s.coordinator.down_nodes(), vec![FAILED]);
    // Writes go on: a client that has not noticed the failure meets it while writing a location granted earlier,
    // gives that location back and writes elsewhere.
    writer.fault_hooks(FAILED).unwrap().cut();
    for i in 1..KEYS {
        writer.put(&key(i), &value(i, 2))?;
    }
    for i in 1..KEYS {
        assert_eq!(reader.get(&key(i))?, Some(value(i, 2)), "key {i}");
    }
    Ok(())
}

#[test]
fn central_unreplicated_values_on_a_dead_node_get_a_clear_error() -> Result<()> {
    let s = central_store(1);
    let mut c = central_client(&s);
    put_all(&mut c, 0)?;
    c.fault_hooks(FAILED).unwrap().cut();
    let mut lost = Vec::new();
    for i in 0..KEYS {
        match c.get(&key(i)) {
            Ok(v) => assert_eq!(v, Some(value(i, 0))),
            Err(PdpmError::NodeDown { node: FAILED, .. }) => lost.push(i),
            Err(e) => return Err(e.into()),
        }
    }
    assert!(!lost.is_empty() && lost.len() < KEYS);
    // A new value of such a key is written to a live node and replaces the lost one.
    for &i in &lost {
        c.put(&key(i), &value(i, 1))?;
        assert_eq!(c.get(&key(i))?, Some(value(i, 1)));
    }
    Ok(())
}

/// Clover on three memory nodes and a metadata server on a node of its own; the MS and its clients leave a failed
/// node alone for `node_retry`.
struct CloverStore {
    clover: Clover,
    node_retry: Duration,
}

impl CloverStore {
    fn new(replication: u32, node_retry: Duration) -> CloverStore {
        let layout = CloverLayout {
            cells: 128,
            slots: 1024,
            max_key: 32,
            max_value: 64,
            replication,
        };
        let config = MetadataConfig {
            node_retry,
            ..MetadataConfig::default()
        };
        CloverStore {
            clover: Clover::new(3, &layout, config),
            node_retry,
        }
    }

    fn client(&self) -> CloverClient {
        let settings = CloverSettings {
            node_retry: self.node_retry,
            // Reads here are never abandoned for a slow round trip (a stalled test machine would retry them).
            read_timeout: Duration::from_millis(50),
            ..CloverSettings::default()
        };
        self.clover.client(false, settings)
    }
}

/// The memory nodes holding `key`'s versions and cells under replication `r` (its home first).
fn clover_holders(c: &CloverClient, key: &[u8], r: usize) -> Vec<usize> {
    let home = c.home_of(key);
    (0..r).map(|j| (home + j) % 3).collect()
}

#[test]
fn clover_replicated_keys_survive_a_memory_node_failure() -> Result<()> {
    let s = CloverStore::new(2, Duration::from_secs(3600));
    let mut writer = s.client();
    for i in 0..KEYS {
        writer.put(&key(i), &value(i, 0))?;
        writer.put(&key(i), &value(i, 1))?;
    }
    writer.delete(&key(0))?;
    // A client that never met the keys reads the replica cells' probe windows; the writer knows their cells.
    let mut fresh = s.client();
    writer.fault_hooks(FAILED).unwrap().cut();
    fresh.fault_hooks(FAILED).unwrap().cut();
    for c in [&mut fresh, &mut writer] {
        assert_eq!(c.get(&key(0))?, None, "the delete holds");
        for i in 1..KEYS {
            assert_eq!(c.get(&key(i))?, Some(value(i, 1)), "key {i}");
        }
    }
    // Some keys had their home on the dead node: the readers met it and told the MS.
    assert_eq!(s.clover.ms.down_nodes(), vec![FAILED]);

    // Writes of keys with a copy on the dead node are refused, nothing applied; the others go on.
    let mut refused = Vec::new();
    for i in 1..KEYS {
        let holders = clover_holders(&writer, &key(i), 2);
        let r = writer.put(&key(i), &value(i, 2));
        if holders.contains(&FAILED) {
            match r {
                Err(e @ PdpmError::NodeDown { .. }) => {
                    assert_eq!(e.kind(true), dinomo_pdpm::FailureKind::NotApplied);
                    refused.push(i);
                }
                other => panic!("key {i} on {holders:?}: {other:?}"),
            }
        } else {
            r?;
        }
    }
    assert!(!refused.is_empty() && refused.len() < KEYS - 1);
    for c in [&mut writer, &mut fresh] {
        for i in 1..KEYS {
            let round = if refused.contains(&i) { 1 } else { 2 };
            assert_eq!(c.get(&key(i))?, Some(value(i, round)), "key {i}");
        }
    }
    // A client that still reaches the node is refused space for those keys by the MS (clearly, nothing applied).
    let mut untouched = s.client();
    let r = untouched.put(&key(refused[0]), &value(refused[0], 3));
    match r {
        Err(PdpmError::Coordinator(why)) => assert!(why.contains("is down"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(untouched.get(&key(refused[0]))?, Some(value(refused[0], 1)));
    Ok(())
}

/// A background refill that fails for one home (the MS knows a copy node of it is down) is reported to that
/// home's writes only: a write whose copies are all up goes on.
#[test]
fn clover_refill_failure_for_one_home_does_not_fail_writes_of_another() -> Result<()> {
    let s = CloverStore::new(2, Duration::from_secs(3600));
    // One version per refill, asked for as soon as the last one is taken: every write of a home starts a
    // background refill for that home.
    let mut c = s.clover.client(
        false,
        CloverSettings {
            node_retry: s.node_retry,
            grant_batch: 1,
            refill_at: 1,
            ..CloverSettings::default()
        },
    );
    let of_home = |c: &CloverClient, home: usize, skip: usize| {
        (0..1000)
            .map(key)
            .filter(|k| c.home_of(k) == home)
            .nth(skip)
            .expect("keys of every home")
    };
    let (zero, two) = ((FAILED + 2) % 3, (FAILED + 1) % 3);
    assert_eq!(
        clover_holders(&c, &of_home(&c, zero, 0), 2),
        vec![zero, FAILED]
    );
    assert!(!clover_holders(&c, &of_home(&c, two, 0), 2).contains(&FAILED));
    // A version in hand for every home, so each write below takes one and asks for the next in the background.
    c.refill()?;
    c.put(&of_home(&c, zero, 0), b"before")?;
    c.put(&of_home(&c, two, 0), b"before")?;
    std::thread::sleep(Duration::from_millis(100));
    // The MS learns that the node is down; this client still reaches it, so its next write of the (existing)
    // home-0 key uses the version it holds, and the refill that write starts is refused.
    s.clover.ms.mark_down(FAILED);
    c.put(&of_home(&c, zero, 0), b"during")?;
    std::thread::sleep(Duration::from_millis(100));
    c.put(&of_home(&c, two, 0), b"after")?;
    assert_eq!(c.get(&of_home(&c, two, 0))?, Some(b"after".to_vec()));
    // The home whose refill failed is told why when it needs space.
    match c.put(&of_home(&c, zero, 0), b"after") {
        Err(PdpmError::Coordinator(why)) => assert!(why.contains("is down"), "{why}"),
        other => panic!("{other:?}"),
    }
    Ok(())
}

#[test]
fn clover_node_that_returns_serves_again() -> Result<()> {
    let retry = Duration::from_millis(20);
    let s = CloverStore::new(2, retry);
    let mut c = s.client();
    put_all(&mut c, 0)?;
    c.fault_hooks(FAILED).unwrap().cut();
    assert_all(&mut c, 0)?;
    assert!(count_refused_writes(&mut c, 1) > 0);
    // After `node_retry` the client (and the MS, told by the client) connect again and every write goes
    // through; the node missed no acknowledged write, so its chains are current.
    std::thread::sleep(retry * 2);
    put_all(&mut c, 2)?;
    assert!(s.clover.ms.down_nodes().is_empty());
    let mut other = s.client();
    for i in 0..KEYS {
        assert_eq!(other.get(&key(i))?, Some(value(i, 2)));
        for j in 0..2 {
            let chain = other.replica_chain(&key(i), j)?;
            assert_eq!(chain.last(), Some(&Some(value(i, 2))), "key {i} chain {j}");
        }
    }
    Ok(())
}

#[test]
fn clover_replica_chain_left_short_by_a_stopped_writer_is_completed_by_the_next() -> Result<()> {
    let s = CloverStore::new(2, Duration::from_secs(3600));
    let mut survivor = s.client();
    // A key whose home is the node that fails later: its reads then need replica chain 1.
    let i = (0..KEYS)
        .find(|&i| survivor.home_of(&key(i)) == FAILED)
        .unwrap();
    survivor.put(&key(i), &value(i, 0))?;
    // This writer commits (links on the primary) and stops before chaining the replica and its cell.
    let mut stopped = s.client();
    stopped.get(&key(i))?;
    stopped.put_crashing(&key(i), &value(i, 1), CloverCrash::AfterLink)?;
    std::mem::forget(stopped);
    // The next write finds the replica cell behind, completes the missing link and moves the cell.
    survivor.put(&key(i), &value(i, 2))?;
    let mut fresh = s.client();
    fresh.fault_hooks(FAILED).unwrap().cut();
    assert_eq!(fresh.get(&key(i))?, Some(value(i, 2)));
    assert_eq!(
        survivor.replica_chain(&key(i), 1)?.last(),
        Some(&Some(value(i, 2)))
    );
    Ok(())
}

#[test]
fn clover_unreplicated_keys_of_a_dead_node_get_a_clear_error() -> Result<()> {
    let s = CloverStore::new(1, Duration::from_secs(3600));
    let mut c = s.client();
    put_all(&mut c, 0)?;
    let mut fresh = s.client();
    c.fault_hooks(FAILED).unwrap().cut();
    fresh.fault_hooks(FAILED).unwrap().cut();
    let mut lost = 0;
    for cl in [&mut c, &mut fresh] {
        lost += check_keys_after_failure(cl, |c, k| c.home_of(k))?;
    }
    assert!(lost > 0);
    Ok(())
}
