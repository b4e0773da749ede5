//! What each system of the DINOMO paper's evaluation costs per operation when nothing contends, read from the
//! fabric's per-thread counters of the KV node's worker: DINOMO answers a read of a cached key from its value
//! (no round trip); DINOMO-S caches only the shortcut, so the same read costs one READ; DINOMO-N, whose node reads
//! its own partition of the index, costs what DINOMO costs when nothing moves. A write is one WRITE (its group
//! commit) in every system.

use dinomo_cluster::{Client, ClientConfig, LocalCluster, Variant};
use dinomo_kn::WorkerStats;

mod common;

const OPS: u32 = 100;

fn worker(c: &LocalCluster) -> WorkerStats {
    let nodes = c.nodes();
    let stats = nodes[0].worker_stats().expect("worker stats");
    assert_eq!(stats.len(), 1);
    stats.into_iter().next().expect("one worker")
}

/// Round trips per read and per write of `variant` on one KV node with one worker.
fn round_trips(variant: Variant) -> anyhow::Result<(f64, f64, WorkerStats)> {
    let mut cfg = common::small_cluster(1);
    cfg.node.kn.threads = 1;
    variant.configure(&mut cfg);
    let c = LocalCluster::start(cfg)?;
    let mut cl = Client::connect(ClientConfig {
        seeds: vec![c.rn_addr().to_string()],
        ..ClientConfig::default()
    })?;
    let key = |i: u32| format!("key-{i:04}").into_bytes();
    // The first write claims a log segment (a call to the memory node); the measured ones fit in it.
    cl.set(b"warm-up", b"v")?;
    let before = worker(&c);
    for i in 0..OPS {
        cl.set(&key(i), format!("value-{i}").as_bytes())?;
    }
    let written = worker(&c);
    for i in 0..OPS {
        assert_eq!(cl.get(&key(i))?, Some(format!("value-{i}").into_bytes()));
    }
    let read = worker(&c);
    c.stop();
    let per_write = (written.round_trips - before.round_trips) as f64 / f64::from(OPS);
    let per_read = (read.round_trips - written.round_trips) as f64 / f64::from(OPS);
    assert_eq!(written.writes - before.writes, u64::from(OPS));
    assert_eq!(read.lookups - written.lookups, u64::from(OPS));
    Ok((per_read, per_write, read))
}

#[test]
fn dinomo_reads_cached_values_without_a_round_trip() -> anyhow::Result<()> {
    let (per_read, per_write, s) = round_trips(Variant::Dinomo)?;
    assert_eq!(per_write, 1.0, "one WRITE per uncontended write");
    assert_eq!(per_read, 0.0, "a value hit makes no round trip");
    assert!(s.cache.values > 0);
    Ok(())
}

#[test]
fn dinomo_s_pays_one_read_per_cache_hit() -> anyhow::Result<()> {
    let (per_read, per_write, s) = round_trips(Variant::DinomoS)?;
    assert_eq!(per_write, 1.0, "one WRITE per uncontended write");
    assert_eq!(per_read, 1.0, "a shortcut hit is one READ of the value");
    assert_eq!(s.cache.values, 0, "DINOMO-S never caches a value");
    assert!(s.shortcut_hits >= u64::from(OPS));
    assert_eq!(s.value_hits, 0);
    Ok(())
}

#[test]
fn dinomo_n_costs_what_dinomo_costs_on_its_own_partition() -> anyhow::Result<()> {
    let (per_read, per_write, s) = round_trips(Variant::DinomoN)?;
    assert_eq!(per_write, 1.0, "one WRITE per uncontended write");
    assert_eq!(per_read, 0.0, "a value hit makes no round trip");
    assert!(s.cache.values > 0);
    Ok(())
}

/// DINOMO-N has no selective replication: asking to share a key is refused with a clear error, and the key stays
/// with its one owner.
#[test]
fn dinomo_n_refuses_to_share_a_key() -> anyhow::Result<()> {
    let mut cfg = common::small_cluster(2);
    Variant::DinomoN.configure(&mut cfg);
    let c = LocalCluster::start(cfg)?;
    let mut cl = Client::connect(ClientConfig {
        seeds: vec![c.rn_addr().to_string()],
        ..ClientConfig::default()
    })?;
    cl.set(b"hot", b"v")?;
    let err = c.mnode().set_replication(b"hot", 2).unwrap_err();
    assert!(err.to_string().contains("dinomo-n"), "{err}");
    assert_eq!(cl.get(b"hot")?, Some(b"v".to_vec()));
    assert_eq!(c.processor().stats().shared_keys, 0);
    c.stop();
    Ok(())
}
