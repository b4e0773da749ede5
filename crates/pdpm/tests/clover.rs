//! Clover (SepDS): round trips against Table 1 of the paper, a model test, clients whose stale cursors are
//! chased, concurrent read-modify-writes, garbage collection under slot reuse, and a client that crashes mid-write.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use common::{Clover, Nodes, Op, apply, change, connector, op, serve_metadata, traffic};
use dinomo_fabric::NodeConfig;
use dinomo_pdpm::clover::{
    self, CloverClient, CloverCrash, CloverLayout, CloverSettings, MetadataConfig, MetadataServer,
};
use dinomo_pdpm::{Change, PdpmStore};
use proptest::prelude::*;

/// Clover with `slots` slots per memory node.
fn setup(memory_nodes: usize, slots: u64, config: MetadataConfig) -> Clover {
    replicated_setup(memory_nodes, 1, slots, config)
}

fn replicated_setup(
    memory_nodes: usize,
    replication: u32,
    slots: u64,
    config: MetadataConfig,
) -> Clover {
    let layout = CloverLayout {
        cells: 256,
        slots,
        max_key: 32,
        max_value: 256,
        replication,
    };
    Clover::new(memory_nodes, &layout, config)
}

fn short_lease() -> MetadataConfig {
    MetadataConfig {
        reclaim_lease: Duration::from_millis(20),
        ..MetadataConfig::default()
    }
}

/// Where round trips are counted: a READ abandoned after a scheduling stall would add one.
fn patient_ms() -> MetadataConfig {
    MetadataConfig {
        reclaim_lease: Duration::from_secs(60),
        ..MetadataConfig::default()
    }
}

fn patient() -> CloverSettings {
    CloverSettings {
        read_timeout: Duration::from_secs(2),
        ..CloverSettings::default()
    }
}

fn short_reads() -> CloverSettings {
    CloverSettings {
        read_timeout: Duration::from_millis(10),
        ..CloverSettings::default()
    }
}

/// Short reads; one slot per refill, asked for only when a write finds none, and every record sent at once: a
/// tiny area's slots go round as fast as the lease lets them.
fn one_slot_at_a_time() -> CloverSettings {
    CloverSettings {
        grant_batch: 1,
        refill_at: 0,
        record_batch: 1,
        ..short_reads()
    }
}

#[test]
fn uncontended_round_trips_match_table_1() -> Result<()> {
    let s = setup(1, 256, patient_ms());
    let mut a = s.client(false, patient());
    let mut b = s.client(false, patient());
    a.refill()?;
    // A new key: probe (1), CREATE at the MS (1), read the fresh cell (1), WRITE + validating READ (1), CAS (1).
    let (r, t) = traffic(|| a.put(b"k", b"v1"));
    r?;
    assert_eq!((t.round_trips, t.rpcs), (5, 1));
    // With a cursor: WRITE + validating READ, CAS the tail's header.
    let (r, t) = traffic(|| a.put(b"k", b"v2"));
    r?;
    assert_eq!(
        (t.round_trips, t.writes, t.reads, t.cas, t.rpcs),
        (2, 1, 1, 1, 0)
    );
    // A read with a cursor hit: one batch (entry and shortcut; it also carries the pending shortcut CAS).
    let (r, t) = traffic(|| a.get(b"k"));
    assert_eq!(r?.as_deref(), Some(&b"v2"[..]));
    assert_eq!((t.round_trips, t.reads), (1, 2));
    // A cold client: the probe window (which holds the shortcut), then the entry.
    let (r, t) = traffic(|| b.get(b"k"));
    assert_eq!(r?.as_deref(), Some(&b"v2"[..]));
    assert_eq!(t.round_trips, 2);
    let (r, t) = traffic(|| b.get(b"k"));
    assert_eq!(r?.as_deref(), Some(&b"v2"[..]));
    assert_eq!(t.round_trips, 1);
    // Another client's write makes b's cursor stale: its batch sees a next pointer and the shortcut (advanced by
    // a's carried CAS on its read), one more READ reaches the tail.
    a.put(b"k", b"v3")?;
    a.get(b"k")?;
    let (r, t) = traffic(|| b.get(b"k"));
    assert_eq!(r?.as_deref(), Some(&b"v3"[..]));
    assert_eq!(t.round_trips, 2);
    // A missing key costs the probe only.
    let (r, t) = traffic(|| b.get(b"missing"));
    assert_eq!(r?, None);
    assert_eq!(t.round_trips, 1);
    Ok(())
}

#[test]
fn keys_spread_over_memory_nodes_and_deletes_leave_tombstones() -> Result<()> {
    let s = setup(3, 256, MetadataConfig::default());
    let mut a = s.client(false, CloverSettings::default());
    let mut b = s.client(false, CloverSettings::default());
    for i in 0..60u32 {
        a.put(format!("key{i}").as_bytes(), &i.to_le_bytes())?;
    }
    for i in 0..60u32 {
        assert_eq!(
            b.get(format!("key{i}").as_bytes())?,
            Some(i.to_le_bytes().to_vec())
        );
    }
    for i in (0..60u32).step_by(2) {
        b.delete(format!("key{i}").as_bytes())?;
    }
    for i in 0..60u32 {
        let want = (i % 2 == 1).then(|| i.to_le_bytes().to_vec());
        assert_eq!(a.get(format!("key{i}").as_bytes())?, want, "key{i}");
    }
    a.delete(b"never-written")?;
    assert_eq!(a.get(b"never-written")?, None);
    a.put(b"key0", b"again")?;
    assert_eq!(b.get(b"key0")?.as_deref(), Some(&b"again"[..]));
    Ok(())
}

#[test]
fn oversized_keys_and_values_are_refused() {
    let s = setup(1, 16, MetadataConfig::default());
    let mut c = s.client(false, CloverSettings::default());
    assert!(c.put(&[1u8; 33], b"v").is_err());
    assert!(c.put(b"k", &[1u8; 257]).is_err());
    assert!(c.update(b"k", &mut |_| Change::Put(vec![0; 300])).is_err());
    assert_eq!(c.get(b"k").unwrap(), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn behaves_like_a_map(ops in proptest::collection::vec(op(), 1..60)) {
        let s = setup(2, 512, short_lease());
        let mut c = s.client(false, short_reads());
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        for op in ops {
            match op {
                Op::Put(k, v) => {
                    c.put(&[k], &v).unwrap();
                    model.insert(vec![k], v);
                }
                Op::Get(k) => prop_assert_eq!(c.get(&[k]).unwrap(), model.get(&[k][..]).cloned()),
                Op::Delete(k) => {
                    c.delete(&[k]).unwrap();
                    model.remove(&[k][..]);
                }
                Op::Update(k, b) => {
                    c.update(&[k], &mut |old| change(old, b)).unwrap();
                    apply(&mut model, vec![k], b);
                }
            }
        }
        // A second client starts cold and must agree.
        let mut other = s.client(false, short_reads());
        for k in 0u8..12 {
            prop_assert_eq!(other.get(&[k]).unwrap(), model.get(&[k][..]).cloned());
        }
    }

    #[test]
    fn two_clients_interleaving_see_each_others_writes(
        ops in proptest::collection::vec((any::<bool>(), op()), 1..60),
    ) {
        let s = setup(2, 512, short_lease());
        let mut clients = [s.client(false, short_reads()), s.client(false, short_reads())];
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        for (which, op) in ops {
            let c = &mut clients[which as usize];
            match op {
                Op::Put(k, v) => {
                    c.update(&[k], &mut |_| Change::Put(v.clone())).unwrap();
                    model.insert(vec![k], v);
                }
                Op::Get(k) => prop_assert_eq!(c.get(&[k]).unwrap(), model.get(&[k][..]).cloned()),
                Op::Delete(k) => {
                    c.delete(&[k]).unwrap();
                    model.remove(&[k][..]);
                }
                Op::Update(k, b) => {
                    c.update(&[k], &mut |old| change(old, b)).unwrap();
                    apply(&mut model, vec![k], b);
                }
            }
        }
    }
}

#[test]
fn concurrent_updates_are_atomic() -> Result<()> {
    const THREADS: u64 = 4;
    const EACH: u64 = 60;
    // Replicated too, on few slots: the counter's versions are retired and their slots reused while clients that
    // lost a race help the shortcut along, and every replica cell must stay on a live version.
    for replication in [2, 1] {
        let s = replicated_setup(2, replication, 96, short_lease());
        let settings = CloverSettings {
            grant_batch: 4,
            refill_at: 2,
            ..short_reads()
        };
        let mut seed = s.client(false, settings.clone());
        seed.put(b"counter", &0u64.to_le_bytes())?;
        std::thread::scope(|scope| {
            for _ in 0..THREADS {
                let mut c = s.client(false, settings.clone());
                scope.spawn(move || {
                    for _ in 0..EACH {
                        c.update(b"counter", &mut |v| {
                            let n = u64::from_le_bytes(v.unwrap().try_into().unwrap());
                            Change::Put((n + 1).to_le_bytes().to_vec())
                        })
                        .unwrap();
                    }
                });
            }
        });
        let want = (THREADS * EACH).to_le_bytes().to_vec();
        assert_eq!(
            seed.get(b"counter")?,
            Some(want.clone()),
            "R = {replication}"
        );
        if replication == 2 {
            // With the home cut off, the value comes from replica cell 1 and its chain.
            let mut failover = s.client(false, settings.clone());
            let home = failover.home_of(b"counter");
            failover.fault_hooks(home).unwrap().cut();
            assert_eq!(failover.get(b"counter")?, Some(want));
        }
    }
    let s = setup(2, 1024, short_lease());
    let mut seed = s.client(false, short_reads());
    seed.put(b"counter", &0u64.to_le_bytes())?;
    // Keep and Delete outcomes.
    seed.update(b"counter", &mut |_| Change::Keep)?;
    assert!(seed.get(b"counter")?.is_some());
    seed.update(b"counter", &mut |_| Change::Delete)?;
    assert_eq!(seed.get(b"counter")?, None);
    seed.update(b"fresh", &mut |v| {
        assert_eq!(v, None);
        Change::Put(b"made".to_vec())
    })?;
    assert_eq!(seed.get(b"fresh")?.as_deref(), Some(&b"made"[..]));
    Ok(())
}

#[test]
fn old_versions_are_reclaimed_and_a_bounded_overwrite_loop_never_runs_out() -> Result<()> {
    // 24 slots for 4 keys overwritten 600 times: only reclamation keeps the writer going.
    let s = setup(1, 24, short_lease());
    let mut c = s.client(
        false,
        CloverSettings {
            grant_batch: 4,
            refill_at: 0,
            record_batch: 4,
            ..short_reads()
        },
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0..600u32 {
        assert!(Instant::now() < deadline);
        c.put(format!("k{}", i % 4).as_bytes(), &i.to_le_bytes())?;
    }
    for k in 0..4u32 {
        let want = (596 + k).to_le_bytes().to_vec();
        assert_eq!(c.get(format!("k{k}").as_bytes())?, Some(want));
    }
    c.flush()?;
    drop(c);
    std::thread::sleep(Duration::from_millis(40));
    let space = s.ms.space();
    assert_eq!(space.live, 4, "{space:?}");
    assert_eq!(space.free, 20, "{space:?}");
    Ok(())
}

#[test]
fn a_stale_cursor_to_a_recycled_slot_is_not_fooled() -> Result<()> {
    // Tiny area, short lease: the slot under the reader's cursor is reused by another key.
    let s = setup(1, 6, short_lease());
    let settings = one_slot_at_a_time();
    let mut reader = s.client(false, settings.clone());
    let mut writer = s.client(false, settings);
    writer.put(b"a", b"a0")?;
    assert_eq!(reader.get(b"a")?.as_deref(), Some(&b"a0"[..]));
    // Overwrite `a` and churn `b` until every slot has been reused several times.
    writer.put(b"a", b"a1")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    for i in 0..60u32 {
        assert!(Instant::now() < deadline);
        writer.put(b"b", &i.to_le_bytes())?;
        std::thread::sleep(Duration::from_millis(1));
    }
    writer.flush()?;
    // The reader's cursor names a slot that now holds another version of another key.
    assert_eq!(reader.get(b"a")?.as_deref(), Some(&b"a1"[..]));
    assert_eq!(reader.get(b"b")?, Some(59u32.to_le_bytes().to_vec()));
    Ok(())
}

#[test]
fn a_stale_cursor_never_returns_an_unlinked_entry_written_into_its_recycled_slot() -> Result<()> {
    // The reader's cursor slot is retired, reclaimed and granted again; a client writes an entry there and dies
    // before linking it. Only the GC version in the slot tells the reader the entry is not the one it knew.
    // Two slots: the one the tail is in, and the reader's cursor slot, which is the only one left to grant.
    let s = setup(1, 2, short_lease());
    let settings = one_slot_at_a_time();
    let mut reader = s.client(false, settings.clone());
    let mut writer = s.client(false, settings.clone());
    writer.put(b"a", &0u32.to_le_bytes())?;
    for round in 1..=10u32 {
        reader.get(b"a")?;
        writer.put(b"a", &round.to_le_bytes())?;
        // Carries the shortcut CAS that retires the reader's cursor slot, and sends the record.
        writer.get(b"a")?;
        writer.flush()?;
        std::thread::sleep(Duration::from_millis(25));
        let mut ghost = s.client(false, settings.clone());
        ghost.put_crashing(b"a", b"ghost", CloverCrash::AfterWrite)?;
        let id = ghost.id();
        std::mem::forget(ghost);
        assert_eq!(
            reader.get(b"a")?,
            Some(round.to_le_bytes().to_vec()),
            "round {round}"
        );
        s.ms.reclaim_grants(id)?;
    }
    Ok(())
}

#[test]
fn wrapped_versions_are_parked() -> Result<()> {
    let s = setup(
        1,
        3,
        MetadataConfig {
            reclaim_lease: Duration::from_millis(2),
            wrap_park: Duration::from_millis(300),
            ..MetadataConfig::default()
        },
    );
    let settings = CloverSettings {
        grant_batch: 1,
        refill_at: 0,
        record_batch: 1,
        read_timeout: Duration::from_millis(1),
        cursor_idle: Duration::from_millis(100),
        ..CloverSettings::default()
    };
    let mut c = s.client(false, settings.clone());
    c.refill()?;
    // Each overwrite retires one slot; 3 slots reach version 255 after ~760 reuses.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut parked_seen = false;
    let mut i = 0u32;
    while Instant::now() < deadline && !parked_seen {
        c.put(b"k", &i.to_le_bytes())?;
        i += 1;
        // Counted, not sampled: the client's next write waits out the park, so a sample taken after a write
        // would rarely find a slot parked.
        parked_seen = s.ms.space().wrapped > 0;
    }
    assert!(parked_seen, "a wrapped slot was parked after {i} writes");
    // Parked, not free: a write waits for the park to pass (space_wait), then succeeds.
    c.put(b"k", b"after")?;
    assert_eq!(c.get(b"k")?.as_deref(), Some(&b"after"[..]));
    Ok(())
}

#[test]
fn idle_cursors_are_dropped() -> Result<()> {
    let s = setup(1, 16, patient_ms());
    // Long enough that no scheduling stall between the put and the first read outlasts it (the first read must
    // find the cursor fresh), below the MS's wrap park.
    let idle = Duration::from_secs(2);
    let mut c = s.client(
        false,
        CloverSettings {
            cursor_idle: idle,
            ..patient()
        },
    );
    c.put(b"k", b"v")?;
    let (r, t) = traffic(|| c.get(b"k"));
    assert_eq!(r?.as_deref(), Some(&b"v"[..]));
    assert_eq!(t.round_trips, 1);
    // Unused for longer than cursor_idle: the read starts from the shortcut (cell, then entry).
    std::thread::sleep(idle + Duration::from_millis(20));
    let (r, t) = traffic(|| c.get(b"k"));
    assert_eq!(r?.as_deref(), Some(&b"v"[..]));
    assert_eq!(t.round_trips, 2);
    Ok(())
}

#[test]
fn a_client_that_crashes_mid_write_leaves_old_or_new() -> Result<()> {
    for point in [
        CloverCrash::AfterWrite,
        CloverCrash::AfterLink,
        CloverCrash::AfterShortcut,
    ] {
        let s = setup(2, 64, short_lease());
        let mut survivor = s.client(false, short_reads());
        survivor.put(b"k", b"old")?;
        survivor.put(b"other", b"x")?;
        let mut crashing = s.client(false, short_reads());
        crashing.get(b"k")?;
        crashing.put_crashing(b"k", b"new", point)?;
        let id = crashing.id();
        std::mem::forget(crashing);
        let linked = point != CloverCrash::AfterWrite;
        let want: &[u8] = if linked { b"new" } else { b"old" };
        assert_eq!(survivor.get(b"k")?.as_deref(), Some(want), "{point:?}");
        let freed = s.ms.reclaim_grants(id)?;
        assert!(freed >= 1, "{point:?}: the unused grants come back");
        // Writes go on from the survivor and a fresh client; the chain stays whole.
        survivor.put(b"k", b"later")?;
        let mut fresh = s.client(false, short_reads());
        assert_eq!(
            fresh.get(b"k")?.as_deref(),
            Some(&b"later"[..]),
            "{point:?}"
        );
        assert_eq!(fresh.get(b"other")?.as_deref(), Some(&b"x"[..]));
        // Nothing linked was reclaimed: every live slot still holds a reachable version.
        survivor.flush()?;
        fresh.flush()?;
        drop(survivor);
        drop(fresh);
        std::thread::sleep(Duration::from_millis(40));
        let space = s.ms.space();
        // A crash after the shortcut CAS loses the record retiring the version it passed: that slot stays
        // allocated (there is no scan that finds it).
        let leaked = usize::from(point == CloverCrash::AfterShortcut);
        assert_eq!(space.live, 2 + leaked, "{point:?}: {space:?}");
        assert_eq!(space.granted, 0, "{point:?}: {space:?}");
    }
    Ok(())
}

#[test]
fn replicated_versions_are_all_way_chained_in_three_steps() -> Result<()> {
    let s = replicated_setup(3, 2, 512, patient_ms());
    let mut a = s.client(false, patient());
    let mut b = s.client(false, patient());
    a.refill()?;
    a.put(b"k", b"v0")?;
    for i in 1..=4u8 {
        let steps = a.protocol_steps();
        let (r, t) = traffic(|| a.put(b"k", &[i; 100]));
        r?;
        // Steps: WRITE both copies (+ validation), CAS the primary's header, CAS the old copies' other header
        // words and the key's cells (1 + 2). The fabric counts each memory node's post: 2 + 1 + 2. CASes: the
        // link, both header words of the old replica copy and its cell, the primary's other word and the shortcut.
        assert_eq!(a.protocol_steps() - steps, 3, "put {i}");
        assert_eq!((t.round_trips, t.writes, t.cas), (5, 2, 6), "put {i}");
    }
    assert_eq!(b.get(b"k")?, Some(vec![4u8; 100]));
    // Reads stay one round trip on a cursor hit.
    let (r, t) = traffic(|| b.get(b"k"));
    assert_eq!(r?, Some(vec![4u8; 100]));
    assert_eq!(t.round_trips, 1);
    // Each replica chain, followed through its own header words only, ends at the newest value.
    a.flush()?;
    for j in 0..2 {
        let chain = b.replica_chain(b"k", j)?;
        assert_eq!(
            chain.last(),
            Some(&Some(vec![4u8; 100])),
            "chain {j}: {chain:?}"
        );
    }
    // Concurrent read-modify-writes on replicated versions stay atomic.
    b.put(b"n", &0u32.to_le_bytes())?;
    std::thread::scope(|scope| {
        for _ in 0..3 {
            let mut c = s.client(false, patient());
            scope.spawn(move || {
                for _ in 0..30 {
                    c.update(b"n", &mut |v| {
                        let n = u32::from_le_bytes(v.unwrap().try_into().unwrap());
                        Change::Put((n + 1).to_le_bytes().to_vec())
                    })
                    .unwrap();
                }
            });
        }
    });
    assert_eq!(b.get(b"n")?, Some(90u32.to_le_bytes().to_vec()));
    for j in 0..2 {
        let chain = b.replica_chain(b"n", j)?;
        assert_eq!(
            chain.last(),
            Some(&Some(90u32.to_le_bytes().to_vec())),
            "chain {j}"
        );
    }
    // Every copy of every old version is retired (waiting out the lease), none leaked or still granted.
    drop(a);
    drop(b);
    let space = s.ms.space();
    assert_eq!(
        (space.live, space.granted),
        (4, 0),
        "two keys, two copies each: {space:?}"
    );
    // k: 5 versions, 4 retired; n: 91 versions, 90 retired.
    assert_eq!(space.waiting, 2 * (4 + 90), "{space:?}");
    Ok(())
}

#[test]
fn replication_needs_as_many_memory_nodes() {
    let layout = CloverLayout {
        cells: 16,
        slots: 16,
        replication: 3,
        ..CloverLayout::default()
    };
    let memory = Nodes::new(2, |pool| clover::format(pool, &layout).unwrap());
    assert!(MetadataServer::new(&memory.connectors(false), MetadataConfig::default()).is_err());
}

#[test]
fn a_restarted_metadata_server_rebuilds_its_space_from_the_memory_nodes() -> Result<()> {
    // A lease no run outlasts: every slot written before the restart is still distinct. A key's versions stay on
    // its home node: room for the busier home's share of the 63 versions and the client's grants.
    let s = setup(2, 96, patient_ms());
    let mut model: HashMap<Vec<u8>, Option<Vec<u8>>> = HashMap::new();
    let mut c = s.client(false, patient());
    for round in 0..3u8 {
        for i in 0..20 {
            let (k, v) = (format!("k{i}").into_bytes(), vec![round; 8 + i]);
            c.put(&k, &v)?;
            model.insert(k, Some(v));
        }
    }
    c.delete(b"k0")?;
    model.insert(b"k0".to_vec(), None);
    // A writer that died after linking (its shortcut CAS never sent: the shortcut lags one version) and one that
    // died before linking (its entry is written, unreachable).
    for (key, point) in [
        (&b"k1"[..], CloverCrash::AfterLink),
        (&b"k2"[..], CloverCrash::AfterWrite),
    ] {
        let mut crashing = s.client(false, patient());
        crashing.get(key)?;
        crashing.put_crashing(key, b"crashed", point)?;
        std::mem::forget(crashing);
    }
    model.insert(b"k1".to_vec(), Some(b"crashed".to_vec()));
    drop(c);

    // A new MS over the same memory nodes, as after a restart.
    let ms = MetadataServer::new(&s.memory.connectors(false), short_lease())?;
    let (host, host_server) = serve_metadata(&ms, NodeConfig::default().rpc_threads);
    let r = ms.recovered();
    // 20 keys; the tails (k0's tombstone included) and k1's extra version behind its lagging shortcut are live;
    // the 60 + 1 + 2 written versions less those wait out a lease.
    assert_eq!((r.keys, r.live, r.broken_chains), (20, 21, 0), "{r:?}");
    assert_eq!(r.waiting, 63 - 21, "{r:?}");
    let space = ms.space();
    assert_eq!(
        (space.live, space.granted, space.free + space.waiting),
        (21, 0, 192 - 21)
    );
    let mut fresh = CloverClient::connect(
        &connector(&host, &host_server, false),
        &s.memory.connectors(false),
        short_reads(),
    )?;
    for (k, v) in &model {
        assert_eq!(&fresh.get(k)?, v, "{}", String::from_utf8_lossy(k));
    }
    assert_eq!(fresh.key_count()?, 19);
    // A walk over the cells names all 20 keys (k0's tail is a tombstone); 19 have a value.
    let (named, there) = common::walk(&mut fresh, 7);
    assert_eq!(named.len(), 20);
    let with_value: std::collections::BTreeSet<Vec<u8>> = model
        .iter()
        .filter(|(_, v)| v.is_some())
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(there, with_value);
    // Many more writes than free slots, on half the keys: they reuse every non-live slot, never a live one, so
    // the other keys' versions survive.
    let deadline = Instant::now() + Duration::from_secs(20);
    for n in 0..400u32 {
        assert!(Instant::now() < deadline, "writes stalled at {n}");
        let k = format!("k{}", 10 + n % 10).into_bytes();
        let v = n.to_le_bytes().to_vec();
        fresh.put(&k, &v)?;
        model.insert(k, Some(v));
    }
    for (k, v) in &model {
        assert_eq!(&fresh.get(k)?, v, "{}", String::from_utf8_lossy(k));
    }
    let mut other = CloverClient::connect(
        &connector(&host, &host_server, false),
        &s.memory.connectors(false),
        short_reads(),
    )?;
    for (k, v) in &model {
        assert_eq!(&other.get(k)?, v, "{}", String::from_utf8_lossy(k));
    }
    Ok(())
}
