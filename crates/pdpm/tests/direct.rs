//! DirectDS and DirectDS-C: round trips against Table 1 of the paper, a model test, concurrent increments under
//! the store's locks, and crashes injected at every step of the write protocol.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Result;
use common::{Nodes, Op, apply, change, counter, increment_from_threads, op, traffic};
use dinomo_pdpm::direct::{self, CrashPoint, DirectClient, DirectLayout, DirectSettings, Flavor};
use dinomo_pdpm::{Change, PdpmError, PdpmStore};
use proptest::prelude::*;

fn layout(flavor: Flavor, replication: u32) -> DirectLayout {
    DirectLayout {
        flavor,
        slots: 256,
        max_key: 32,
        max_value: 256,
        replication,
    }
}

fn nodes(count: usize, layout: &DirectLayout) -> Nodes {
    Nodes::new(count, |pool| direct::format(pool, layout).unwrap())
}

fn client(nodes: &Nodes, settings: DirectSettings) -> DirectClient {
    DirectClient::connect(&nodes.connectors(false), settings).unwrap()
}

#[test]
fn uncontended_round_trips_match_table_1() -> Result<()> {
    for flavor in [Flavor::Markers, Flavor::Crc] {
        let n = nodes(2, &layout(flavor, 1));
        let mut c = client(&n, DirectSettings::default());
        // The first write finds (claims) the slot under the lock: one READ more.
        let (r, t) = traffic(|| c.put(b"k", b"first"));
        r?;
        assert_eq!(t.round_trips, 7, "{flavor:?} first write");
        // Then the paper's write: CAS lock, WRITE redo, READ, WRITE committed, READ, WRITE unlock.
        let (r, t) = traffic(|| c.put(b"k", b"second value"));
        r?;
        assert_eq!(
            (t.round_trips, t.cas, t.writes, t.reads),
            (6, 1, 3, 2),
            "{flavor:?} write"
        );
        // Two of them carry the value: the payload bytes are those of two copies plus an 8-byte unlock.
        let (r, t) = traffic(|| c.get(b"k"));
        assert_eq!(r?.as_deref(), Some(&b"second value"[..]));
        match flavor {
            Flavor::Markers => assert_eq!((t.round_trips, t.cas, t.reads, t.writes), (3, 1, 1, 1)),
            Flavor::Crc => assert_eq!((t.round_trips, t.reads), (1, 1)),
        }
        // A fresh client (no cached metadata) reads with the same count when the key sits in its first slot.
        let mut fresh = client(&n, DirectSettings::default());
        let (r, t) = traffic(|| fresh.get(b"k"));
        assert_eq!(r?.as_deref(), Some(&b"second value"[..]));
        assert_eq!(t.round_trips, if flavor == Flavor::Markers { 3 } else { 1 });
    }
    Ok(())
}

#[test]
fn replicated_writes_take_six_steps_and_fused_validation_saves_two_round_trips() -> Result<()> {
    let n = nodes(3, &layout(Flavor::Markers, 2));
    let mut c = client(&n, DirectSettings::default());
    c.put(b"rk", b"v0")?;
    let steps = c.protocol_steps();
    let (r, t) = traffic(|| c.put(b"rk", b"v1"));
    r?;
    // Each step reaches both replicas one after the other: 2 + 4R round trips, 6 protocol steps.
    assert_eq!(t.round_trips, 10);
    assert_eq!(c.protocol_steps() - steps, 6);
    assert_eq!(c.replica_values(b"rk")?, vec![Some(b"v1".to_vec()); 2]);

    let n = nodes(1, &layout(Flavor::Crc, 1));
    let mut c = client(
        &n,
        DirectSettings {
            fuse_validation: true,
            ..DirectSettings::default()
        },
    );
    c.put(b"f", b"v0")?;
    let (r, t) = traffic(|| c.put(b"f", b"v1"));
    r?;
    assert_eq!(t.round_trips, 4);
    assert_eq!(c.get(b"f")?.as_deref(), Some(&b"v1"[..]));
    Ok(())
}

#[test]
fn oversized_keys_and_values_are_refused_clearly() {
    let n = nodes(1, &layout(Flavor::Markers, 1));
    let mut c = client(&n, DirectSettings::default());
    assert!(matches!(
        c.put(b"k", &[0u8; 257]),
        Err(PdpmError::ValueTooLarge { len: 257, max: 256 })
    ));
    assert!(matches!(
        c.put(&[1u8; 33], b"v"),
        Err(PdpmError::KeyTooLarge { len: 33, max: 32 })
    ));
    assert!(matches!(
        c.get(&[1u8; 33]),
        Err(PdpmError::KeyTooLarge { .. })
    ));
    // The refused writes left nothing behind and no lock held.
    assert_eq!(c.get(b"k").unwrap(), None);
    c.put(b"k", &[7u8; 256]).unwrap();
    assert_eq!(c.get(b"k").unwrap(), Some(vec![7u8; 256]));
}

#[test]
fn a_full_neighbourhood_is_reported_not_overwritten() {
    let l = DirectLayout {
        slots: 4,
        ..layout(Flavor::Crc, 1)
    };
    let n = nodes(1, &l);
    let mut c = client(&n, DirectSettings::default());
    for i in 0..4u8 {
        c.put(&[i], &[i]).unwrap();
    }
    assert!(matches!(
        c.put(b"fifth", b"x"),
        Err(PdpmError::TableFull { .. })
    ));
    for i in 0..4u8 {
        assert_eq!(c.get(&[i]).unwrap(), Some(vec![i]));
    }
}

#[test]
fn unformatted_memory_nodes_are_refused() {
    let n = Nodes::new(1, |_| {});
    let e = DirectClient::connect(&n.connectors(false), DirectSettings::default()).unwrap_err();
    assert!(matches!(e, PdpmError::Layout { .. }), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn one_client_matches_a_hashmap(ops in proptest::collection::vec(op(), 1..60), crc in any::<bool>()) {
        let flavor = if crc { Flavor::Crc } else { Flavor::Markers };
        // Few slots so that keys collide and probe.
        let l = DirectLayout { slots: 16, ..layout(flavor, 2) };
        let n = nodes(3, &l);
        let mut c = client(&n, DirectSettings::default());
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        for op in ops {
            match op {
                Op::Put(k, v) => {
                    let key = format!("key-{k}").into_bytes();
                    c.put(&key, &v).unwrap();
                    model.insert(key, v);
                }
                Op::Get(k) => {
                    let key = format!("key-{k}").into_bytes();
                    prop_assert_eq!(c.get(&key).unwrap(), model.get(&key).cloned());
                }
                Op::Delete(k) => {
                    let key = format!("key-{k}").into_bytes();
                    c.delete(&key).unwrap();
                    model.remove(&key);
                }
                Op::Update(k, b) => {
                    let key = format!("key-{k}").into_bytes();
                    c.update(&key, &mut |old| change(old, b)).unwrap();
                    apply(&mut model, key, b);
                }
            }
        }
        // A second client, with nothing cached, sees the same.
        let mut other = client(&n, DirectSettings::default());
        for k in 0u8..12 {
            let key = format!("key-{k}").into_bytes();
            prop_assert_eq!(other.get(&key).unwrap(), model.get(&key).cloned());
        }
        prop_assert_eq!(other.key_count().unwrap(), model.len() as u64);
        // A walk over the slots names every key with a value, and nothing never written.
        let (named, there) = common::walk(&mut other, 3);
        prop_assert_eq!(there, model.keys().cloned().collect::<std::collections::BTreeSet<_>>());
        prop_assert!(named.iter().all(|k| k.starts_with(b"key-")));
    }
}

#[test]
fn concurrent_increments_are_never_lost_and_reads_are_never_torn() -> Result<()> {
    const THREADS: usize = 4;
    const INCREMENTS: usize = 40;
    for flavor in [Flavor::Markers, Flavor::Crc] {
        let n = nodes(2, &layout(flavor, 2));
        let counters = [b"c0".as_slice(), b"c1".as_slice()];
        std::thread::scope(|s| -> Result<()> {
            // No client crashes here: a lease far above any scheduling stall on a loaded machine.
            let settings = DirectSettings {
                lock_lease: Duration::from_secs(60),
                lock_wait: Duration::from_secs(120),
                ..DirectSettings::default()
            };
            let mut handles = Vec::new();
            for t in 0..THREADS {
                let connectors = n.connectors(false);
                let settings = settings.clone();
                handles.push(s.spawn(move || -> Result<()> {
                    let mut c = DirectClient::connect(&connectors, settings)?;
                    for i in 0..INCREMENTS {
                        let key = counters[(t + i) % 2];
                        c.update(key, &mut |old| {
                            let v =
                                old.map_or(0, |b| u64::from_le_bytes(b[..8].try_into().unwrap()));
                            // A long value, so that a torn read would show.
                            Change::Put([(v + 1).to_le_bytes(); 16].concat())
                        })?;
                    }
                    Ok(())
                }));
            }
            // A reader checks every value it sees is whole: 16 equal words, never decreasing.
            let connectors = n.connectors(false);
            handles.push(s.spawn(move || -> Result<()> {
                let mut c = DirectClient::connect(&connectors, settings)?;
                let mut last = [0u64; 2];
                for _ in 0..200 {
                    for (i, key) in counters.iter().enumerate() {
                        if let Some(v) = c.get(key)? {
                            let words: Vec<u64> = v
                                .chunks(8)
                                .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
                                .collect();
                            assert_eq!(words.len(), 16);
                            assert!(words.iter().all(|w| *w == words[0]), "torn value {words:?}");
                            assert!(words[0] >= last[i]);
                            last[i] = words[0];
                        }
                    }
                }
                Ok(())
            }));
            for h in handles {
                h.join().unwrap()?;
            }
            Ok(())
        })?;
        let mut c = client(&n, DirectSettings::default());
        let total: u64 = counters
            .iter()
            .map(|k| u64::from_le_bytes(c.get(k).unwrap().unwrap()[..8].try_into().unwrap()))
            .sum();
        assert_eq!(total, (THREADS * INCREMENTS) as u64, "{flavor:?}");
        for k in counters {
            let reps = c.replica_values(k)?;
            assert_eq!(reps[0], reps[1], "replicas agree");
        }
    }
    Ok(())
}

#[test]
fn update_increments_from_many_clients_add_up() -> Result<()> {
    const THREADS: usize = 4;
    const INCREMENTS: usize = 50;
    for flavor in [Flavor::Markers, Flavor::Crc] {
        let n = nodes(2, &layout(flavor, 2));
        let settings = DirectSettings {
            lock_lease: Duration::from_secs(60),
            lock_wait: Duration::from_secs(120),
            ..DirectSettings::default()
        };
        increment_from_threads(THREADS, INCREMENTS, b"count", || {
            Ok(DirectClient::connect(
                &n.connectors(false),
                settings.clone(),
            )?)
        })?;
        let mut c = client(&n, settings);
        assert_eq!(
            counter(c.get(b"count")?),
            (THREADS * INCREMENTS) as u64,
            "{flavor:?}"
        );
        // Keep and Delete through update.
        c.update(b"count", &mut |_| Change::Keep)?;
        assert_eq!(counter(c.get(b"count")?), (THREADS * INCREMENTS) as u64);
        c.update(b"count", &mut |_| Change::Delete)?;
        assert_eq!(c.get(b"count")?, None);
        assert!(matches!(
            c.update(b"count", &mut |_| Change::Put(vec![0; 257])),
            Err(PdpmError::ValueTooLarge { .. })
        ));
        c.put(b"count", b"after")?;
    }
    Ok(())
}

/// Every crash point, with the value each must leave: the old one until the committed copy starts to change.
fn crash_points(flavor: Flavor, copy_len: usize) -> Vec<(CrashPoint, bool)> {
    let mut v = vec![
        (CrashPoint::AfterLock, false),
        (CrashPoint::AfterRedo, false),
        (CrashPoint::AfterRedoValidated, false),
        (CrashPoint::AfterCommitted, true),
        (CrashPoint::AfterCommittedValidated, true),
    ];
    // DirectDS tears at aligned words (its failure model); DirectDS-C at any byte.
    let cuts: Vec<usize> = match flavor {
        Flavor::Markers => vec![8, 16, 24, copy_len - 8],
        Flavor::Crc => vec![1, 9, 17, 23, copy_len - 1],
    };
    for bytes in cuts {
        v.push((CrashPoint::RedoTorn { bytes }, false));
        v.push((CrashPoint::CommittedTorn { bytes }, true));
    }
    v
}

#[test]
fn a_crash_at_any_write_step_leaves_the_old_or_the_committed_new_value() -> Result<()> {
    let settings = DirectSettings {
        lock_lease: Duration::from_millis(20),
        ..DirectSettings::default()
    };
    for flavor in [Flavor::Markers, Flavor::Crc] {
        let l = layout(flavor, 2);
        let n = nodes(3, &l);
        let old = vec![b'o'; 40];
        let new = vec![b'n'; 33];
        let new_copy_len = 16 + 3 + new.len() + 8;
        for (i, (point, expect_new)) in crash_points(flavor, new_copy_len).into_iter().enumerate() {
            for with_old in [true, false] {
                let key = format!("k{i}-{with_old}").into_bytes();
                let mut writer = client(&n, settings.clone());
                if with_old {
                    writer.put(&key, &old)?;
                }
                let mut dying = client(&n, settings.clone());
                dying.put_crashing(&key, &new, point)?;
                drop(dying);
                // Another client reads: it waits out the lease, takes the lock over and recovers the slot.
                let mut reader = client(&n, settings.clone());
                let got = reader.get(&key)?;
                let want = if expect_new {
                    Some(new.clone())
                } else if with_old {
                    Some(old.clone())
                } else {
                    None
                };
                assert_eq!(got, want, "{flavor:?} {point:?} old={with_old}");
                // Replicas agree with the primary, and the key is writable again.
                // DirectDS reads lock, so the reader recovered the slot; a DirectDS-C reader that found a whole
                // committed copy leaves the stale lock (and the replicas) to the next writer.
                if want.is_some() && flavor == Flavor::Markers {
                    let reps = reader.replica_values(&key)?;
                    assert!(
                        reps.iter().all(|r| *r == want),
                        "{flavor:?} {point:?} replicas {reps:?}"
                    );
                }
                reader.put(&key, b"after")?;
                assert_eq!(writer.get(&key)?.as_deref(), Some(&b"after"[..]));
                let reps = reader.replica_values(&key)?;
                assert!(reps.iter().all(|r| r.as_deref() == Some(&b"after"[..])));
            }
        }
    }
    Ok(())
}

#[test]
fn a_write_waits_out_a_crashed_lock_and_recovers() -> Result<()> {
    let settings = DirectSettings {
        lock_lease: Duration::from_millis(20),
        ..DirectSettings::default()
    };
    let n = nodes(1, &layout(Flavor::Markers, 1));
    let mut a = client(&n, settings.clone());
    a.put(b"w", b"old")?;
    let mut dying = client(&n, settings.clone());
    dying.put_crashing(b"w", b"new", CrashPoint::CommittedTorn { bytes: 16 })?;
    drop(dying);
    // A writer (not a reader) finds the stale lock: it recovers the new value first, then writes its own.
    a.update(b"w", &mut |v| {
        assert_eq!(v, Some(&b"new"[..]));
        Change::Put(b"newer".to_vec())
    })?;
    assert_eq!(a.get(b"w")?.as_deref(), Some(&b"newer"[..]));
    // A live holder is not taken over: with a long lease the wait times out instead.
    let patient = DirectSettings {
        lock_lease: Duration::from_secs(60),
        lock_wait: Duration::from_millis(50),
        ..DirectSettings::default()
    };
    let mut holder = client(&n, patient.clone());
    holder.put_crashing(b"w", b"x", CrashPoint::AfterLock)?;
    let mut b = client(&n, patient);
    assert!(matches!(
        b.put(b"w", b"y"),
        Err(PdpmError::LockTimeout { .. })
    ));
    Ok(())
}
