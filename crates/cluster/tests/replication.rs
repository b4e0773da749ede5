//! Selective replication (paper §3.4): a hot key shared by several KV nodes through an indirect cell.

use std::time::{Duration, Instant};

use dinomo_cluster::{Client, ClientConfig, LocalCluster, LocalClusterConfig, ReconfigKind};
use dinomo_kn::WorkerStats;

mod common;

fn client(cluster: &LocalCluster) -> anyhow::Result<Client> {
    Ok(Client::connect(ClientConfig {
        seeds: vec![cluster.rn_addr().to_string()],
        ..ClientConfig::default()
    })?)
}

/// A worker counter summed over each node's workers, node by node.
fn per_node(cluster: &LocalCluster, counter: fn(&WorkerStats) -> u64) -> anyhow::Result<Vec<u64>> {
    cluster
        .nodes()
        .iter()
        .map(|n| Ok(n.worker_stats()?.iter().map(counter).sum()))
        .collect()
}

/// Round trips the workers of every node made so far.
fn worker_round_trips(cluster: &LocalCluster) -> anyhow::Result<u64> {
    Ok(per_node(cluster, |s| s.round_trips)?.iter().sum())
}

#[test]
fn a_shared_key_keeps_its_value_spreads_its_load_and_counts_exactly() -> anyhow::Result<()> {
    let cluster = LocalCluster::start(common::small_cluster(3))?;
    let mut c = client(&cluster)?;
    c.set(b"hot", b"before")?;
    c.set(b"ctr", b"10")?;
    for i in 0..50u32 {
        c.set(format!("cold{i}").as_bytes(), b"x")?;
    }

    assert_eq!(cluster.processor().count_keys()?, 52);
    cluster.mnode().set_replication(b"hot", 3)?;
    cluster.mnode().set_replication(b"ctr", 3)?;
    assert_eq!(cluster.processor().stats().shared_keys, 2);
    // Shared keys are counted by their cells (DBSIZE).
    assert_eq!(cluster.processor().count_keys()?, 52);
    let routing = cluster.nodes()[0].routing();
    assert_eq!(routing.cells.len(), 2);
    assert_eq!(routing.ring.replication(b"hot"), 3);

    // The value written before sharing is served, by every owner.
    let mut readers: Vec<Client> = (0..4).map(|_| client(&cluster)).collect::<Result<_, _>>()?;
    for r in &mut readers {
        for _ in 0..20 {
            assert_eq!(r.get(b"hot")?.as_deref(), Some(&b"before"[..]));
        }
    }
    let spread = per_node(&cluster, |s| s.shared_ops)?;
    assert!(
        spread.iter().filter(|&&n| n > 0).count() >= 2,
        "reads of a shared key reach several owners: {spread:?}"
    );

    // Increments from many clients, landing on different owners, are all counted (CAS on the cell).
    let seeds = vec![cluster.rn_addr().to_string()];
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let seeds = seeds.clone();
            std::thread::spawn(move || -> anyhow::Result<()> {
                let mut c = Client::connect(ClientConfig {
                    seeds,
                    ..ClientConfig::default()
                })?;
                for _ in 0..250 {
                    c.incr(b"ctr", 1)?;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().expect("incr thread")?;
    }
    assert_eq!(c.get(b"ctr")?.as_deref(), Some(&b"1010"[..]));
    // An increment past i64::MAX is refused with Redis's text and changes nothing.
    let overflow = c.incr(b"ctr", i64::MAX);
    assert!(
        matches!(&overflow, Err(dinomo_cluster::ClientError::Invalid(m)) if m == "increment or decrement would overflow"),
        "{overflow:?}"
    );
    assert_eq!(c.get(b"ctr")?.as_deref(), Some(&b"1010"[..]));

    // Conditional writes, probes and deletes through the cell.
    assert!(!c.insert(b"hot", b"no")?);
    assert!(c.update(b"hot", b"after")?);
    assert_eq!(c.get(b"hot")?.as_deref(), Some(&b"after"[..]));
    assert_eq!((c.exists(b"hot")?, c.strlen(b"hot")?), (true, 5));
    // The string commands' read-modify-writes through the cell.
    assert_eq!(c.set_range(b"hot", 5, b"!")?, 6);
    assert_eq!(c.get_range(b"hot", 0, 1)?, b"af");
    assert_eq!(c.get_range(b"hot", -1, -1)?, b"!");
    assert_eq!(c.get_del(b"hot")?.as_deref(), Some(&b"after!"[..]));
    assert_eq!(c.get_del(b"hot")?, None);
    assert_eq!(c.incr_by_float(b"hot", 2.5)?, 2.5);
    assert_eq!(c.incr_by_float(b"hot", -0.25)?, 2.25);
    // "2.25": 0x32 0x2e 0x32 0x35; bit 2 of '2' (0b0011_0010) is set, bit 0 is not.
    assert!(!c.set_bit(b"hot", 0, true)?);
    assert!(c.get_bit(b"hot", 0)?);
    assert!(c.get_bit(b"hot", 2)?);
    assert!(!c.get_bit(b"hot", 1_000)?);
    assert_eq!(c.bit_count(b"hot", Some((0, 7, true)))?, 4);
    assert_eq!(c.bit_count(b"hot", None)?, 4 + 4 + 3 + 4);
    assert!(c.delete(b"hot")?);
    assert_eq!(c.get(b"hot")?, None);
    assert_eq!((c.exists(b"hot")?, c.strlen(b"hot")?), (false, 0));
    assert_eq!(cluster.processor().count_keys()?, 51);
    assert!(c.insert(b"hot", b"again")?);

    // Back to one owner: the cell's value goes back into the index.
    cluster.mnode().set_replication(b"hot", 1)?;
    cluster.mnode().set_replication(b"ctr", 1)?;
    assert_eq!(cluster.processor().stats().shared_keys, 0);
    assert!(cluster.nodes()[0].routing().cells.is_empty());
    assert_eq!(c.get(b"hot")?.as_deref(), Some(&b"again"[..]));
    assert_eq!(c.incr(b"ctr", 5)?, 1015);
    for i in 0..50u32 {
        assert_eq!(
            c.get(format!("cold{i}").as_bytes())?.as_deref(),
            Some(&b"x"[..])
        );
    }
    let kinds: Vec<_> = cluster.mnode().events().iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == ReconfigKind::Replicate)
            .count(),
        2
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == ReconfigKind::Dereplicate)
            .count(),
        2
    );
    cluster.stop();
    Ok(())
}

#[test]
fn shared_keys_survive_joins_failures_and_unsharing_after_them() -> anyhow::Result<()> {
    let mut cluster = LocalCluster::start(common::small_cluster(3))?;
    let mut c = client(&cluster)?;
    for i in 0..8u32 {
        c.set(format!("hot{i}").as_bytes(), format!("v{i}").as_bytes())?;
        cluster
            .mnode()
            .set_replication(format!("hot{i}").as_bytes(), 2)?;
    }
    cluster.add_node()?;
    for i in 0..8u32 {
        c.set(format!("hot{i}").as_bytes(), format!("w{i}").as_bytes())?;
    }
    // Every node but the newest fails in turn... one of them is an owner of most shared keys.
    let victim = cluster.nodes()[0].id();
    cluster.crash_node(victim)?;
    cluster.wait_until_serving(Duration::from_secs(10))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    for i in 0..8u32 {
        let key = format!("hot{i}");
        loop {
            match c.get(key.as_bytes()) {
                Ok(v) => {
                    assert_eq!(v.as_deref(), Some(format!("w{i}").as_bytes()));
                    break;
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("{key}: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        }
        c.set(key.as_bytes(), format!("z{i}").as_bytes())?;
    }
    for i in 0..8u32 {
        cluster
            .mnode()
            .set_replication(format!("hot{i}").as_bytes(), 1)?;
    }
    for i in 0..8u32 {
        assert_eq!(
            c.get(format!("hot{i}").as_bytes())?.as_deref(),
            Some(format!("z{i}").as_bytes())
        );
    }
    assert_eq!(cluster.processor().stats().shared_keys, 0);
    cluster.stop();
    Ok(())
}

#[test]
fn a_shared_key_survives_a_restart_of_the_whole_cluster() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = || LocalClusterConfig {
        pool_path: Some(dir.path().join("pool")),
        ..common::small_cluster(2)
    };
    {
        let cluster = LocalCluster::start(cfg())?;
        let mut c = client(&cluster)?;
        c.set(b"hot", b"one")?;
        cluster.mnode().set_replication(b"hot", 2)?;
        for n in 0..100u32 {
            c.set(b"hot", format!("n{n}").as_bytes())?;
        }
        cluster.stop();
    }
    let cluster = LocalCluster::start(cfg())?;
    cluster.wait_until_serving(Duration::from_secs(10))?;
    let mut c = client(&cluster)?;
    assert_eq!(c.get(b"hot")?.as_deref(), Some(&b"n99"[..]));
    assert_eq!(cluster.processor().stats().shared_keys, 1);
    cluster.mnode().set_replication(b"hot", 1)?;
    assert_eq!(c.get(b"hot")?.as_deref(), Some(&b"n99"[..]));
    cluster.stop();
    Ok(())
}

#[test]
fn overwritten_values_of_a_shared_key_are_recycled_and_the_live_one_is_kept() -> anyhow::Result<()>
{
    let cluster = LocalCluster::start(common::small_cluster(2))?;
    let mut c = client(&cluster)?;
    cluster.mnode().set_replication(b"big", 2)?;
    let value = |n: u32| {
        let mut v = format!("{n:08}").into_bytes();
        v.resize(4096, b'.');
        v
    };
    // About 8 MiB of overwrites of one key through 1 MiB segments.
    for n in 0..2000u32 {
        c.set(b"big", &value(n))?;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.processor().stats().recycled_segments < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = cluster.processor().stats();
    assert!(
        stats.recycled_segments >= 3,
        "dead values of a shared key are reclaimed: {stats:?}"
    );
    assert_eq!(c.get(b"big")?, Some(value(1999)));
    cluster.mnode().set_replication(b"big", 1)?;
    assert_eq!(c.get(b"big")?, Some(value(1999)));
    cluster.stop();
    Ok(())
}

#[test]
fn a_shared_read_is_two_round_trips_and_a_blind_write_three() -> anyhow::Result<()> {
    let cluster = LocalCluster::start(common::small_cluster(2))?;
    let mut c = client(&cluster)?;
    c.set(b"hot", b"v")?;
    cluster.mnode().set_replication(b"hot", 2)?;
    c.get(b"hot")?;
    let before = worker_round_trips(&cluster)?;
    for _ in 0..100 {
        c.get(b"hot")?;
    }
    let reads = worker_round_trips(&cluster)? - before;
    assert_eq!(reads, 200, "READ of the cell, READ of the entry");
    // Every owner's thread gets its first log segment (one more call) before the count starts.
    for _ in 0..1000 {
        let writes = per_node(&cluster, |s| s.writes)?;
        if writes.iter().all(|&w| w > 0) {
            break;
        }
        c.set(b"hot", b"warm")?;
    }
    let before = worker_round_trips(&cluster)?;
    for _ in 0..100 {
        c.set(b"hot", b"w")?;
    }
    let writes = worker_round_trips(&cluster)? - before;
    assert_eq!(writes, 300, "READ of the cell, WRITE of the entry, CAS");
    cluster.stop();
    Ok(())
}
