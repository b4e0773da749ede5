//! CentralDS: round trips against Table 1 of the paper, a model test, concurrent writers whose readers never see
//! a torn or foreign value, and a client that crashes mid-PUT.

mod common;

use std::collections::HashMap;

use anyhow::Result;
use common::{
    Central, Op, apply, change, connector, counter, increment_from_threads, op, serve_coordinator,
    traffic,
};
use dinomo_fabric::NodeConfig;
use dinomo_pdpm::central::{
    self, CentralClient, CentralCrash, CentralLayout, CentralSettings, Coordinator,
    CoordinatorConfig,
};
use dinomo_pdpm::{Change, PdpmError, PdpmStore};
use proptest::prelude::*;

/// `memory_nodes` nodes of `blocks` blocks (keys up to 32 bytes, values up to 256) and a coordinator with four
/// threads.
fn setup(memory_nodes: usize, blocks: u64, config: CoordinatorConfig) -> Central {
    let layout = CentralLayout {
        blocks,
        max_key: 32,
        max_value: 256,
    };
    Central::new(memory_nodes, &layout, config, 4)
}

#[test]
fn uncontended_round_trips_match_table_1() -> Result<()> {
    let s = setup(2, 64, CoordinatorConfig::default());
    let mut c = s.client(false, CentralSettings::default());
    c.refill()?;
    // PUT: WRITE, validating READ, COMMIT.
    let (r, t) = traffic(|| c.put(b"k", b"value"));
    r?;
    assert_eq!((t.round_trips, t.writes, t.reads, t.rpcs), (3, 1, 1, 1));
    // GET: LOOKUP, READ.
    let (r, t) = traffic(|| c.get(b"k"));
    assert_eq!(r?.as_deref(), Some(&b"value"[..]));
    assert_eq!((t.round_trips, t.reads, t.rpcs), (2, 1, 1));
    // A missing key costs the LOOKUP only.
    let (r, t) = traffic(|| c.get(b"missing"));
    assert_eq!(r?, None);
    assert_eq!(t.round_trips, 1);

    let mut fused = s.client(
        false,
        CentralSettings {
            fuse_validation: true,
            ..CentralSettings::default()
        },
    );
    fused.refill()?;
    let (r, t) = traffic(|| fused.put(b"k", b"fused"));
    r?;
    assert_eq!(t.round_trips, 2);
    assert_eq!(c.get(b"k")?.as_deref(), Some(&b"fused"[..]));
    Ok(())
}

#[test]
fn replicated_values_land_on_distinct_nodes_and_old_blocks_are_freed() -> Result<()> {
    let s = setup(
        3,
        16,
        CoordinatorConfig {
            replication: 2,
            ..CoordinatorConfig::default()
        },
    );
    let mut c = s.client(
        false,
        CentralSettings {
            grant_batch: 1,
            ..CentralSettings::default()
        },
    );
    c.refill()?;
    let (r, t) = traffic(|| c.put(b"a", b"one"));
    r?;
    // Two WRITEs, two READs, one COMMIT.
    assert_eq!((t.round_trips, t.writes, t.reads, t.rpcs), (5, 2, 2, 1));
    // Overwrites free the blocks they replace: 16 blocks per node are plenty for many writes of one key.
    for i in 0..40u32 {
        c.put(b"a", &i.to_le_bytes())?;
    }
    assert_eq!(c.get(b"a")?, Some(39u32.to_le_bytes().to_vec()));
    let free: usize = s.coordinator.free_blocks().iter().sum();
    assert_eq!(free, 3 * 16 - 2, "one value's two blocks in use");
    c.delete(b"a")?;
    assert_eq!(c.get(b"a")?, None);
    assert_eq!(s.coordinator.free_blocks().iter().sum::<usize>(), 3 * 16);
    Ok(())
}

#[test]
fn oversized_values_and_a_full_store_are_refused_clearly() {
    let s = setup(1, 4, CoordinatorConfig::default());
    let mut c = s.client(false, CentralSettings::default());
    assert!(matches!(
        c.put(b"k", &[0u8; 257]),
        Err(PdpmError::ValueTooLarge { len: 257, max: 256 })
    ));
    assert!(matches!(
        c.put(&[0u8; 33], b"v"),
        Err(PdpmError::KeyTooLarge { .. })
    ));
    for i in 0..4u8 {
        c.put(&[i], b"v").unwrap();
    }
    let e = c.put(b"fifth", b"v").unwrap_err();
    assert!(
        e.is_out_of_space() && e.to_string().contains("out of"),
        "{e}"
    );
    // Deleting makes room again.
    c.delete(&[0]).unwrap();
    c.put(b"fifth", b"v").unwrap();
    assert_eq!(c.get(b"fifth").unwrap().as_deref(), Some(&b"v"[..]));
}

#[test]
fn garbage_rpcs_get_errors_and_the_coordinator_keeps_serving() -> Result<()> {
    let s = setup(1, 16, CoordinatorConfig::default());
    let mut ep = s.coordinator_connector(true).connect()?;
    let mut reply = Vec::new();
    for method in [
        central::method::GRANT,
        central::method::COMMIT,
        central::method::RELEASE,
        central::method::LOOKUP,
        0x7777,
    ] {
        assert!(ep.rpc(method, &[0xff; 40], &mut reply).is_err());
    }
    let mut c = s.client(true, CentralSettings::default());
    c.put(b"k", b"v")?;
    assert_eq!(c.get(b"k")?.as_deref(), Some(&b"v"[..]));
    Ok(())
}

#[test]
fn a_commit_naming_a_granted_block_twice_is_refused() -> Result<()> {
    // The coordinator's own request shapes, as a client other than `CentralClient` would send them.
    #[derive(serde::Serialize)]
    struct GrantRequest {
        client: u32,
        count: u32,
    }
    #[derive(serde::Serialize)]
    enum Expect {
        Any,
    }
    #[derive(serde::Serialize)]
    struct CommitRequest {
        client: u32,
        key: Vec<u8>,
        location: central::Location,
        version: u64,
        expect: Expect,
    }
    let s = setup(
        2,
        8,
        CoordinatorConfig {
            replication: 2,
            ..CoordinatorConfig::default()
        },
    );
    let mut ep = s.coordinator_connector(true).connect()?;
    let granted: Vec<central::Location> = ep.call(
        central::method::GRANT,
        &GrantRequest {
            client: 7,
            count: 1,
        },
    )?;
    let first = granted[0].0[0];
    let twice = CommitRequest {
        client: 7,
        key: b"k".to_vec(),
        location: central::Location(vec![first, first]),
        version: 1,
        expect: Expect::Any,
    };
    assert!(
        ep.call::<_, bool>(central::method::COMMIT, &twice).is_err(),
        "a location repeating one block would later be freed twice"
    );
    // The grant is untouched: committing it as granted works, and no block was freed twice.
    let proper = CommitRequest {
        location: granted[0].clone(),
        ..twice
    };
    assert!(ep.call::<_, bool>(central::method::COMMIT, &proper)?);
    let free: usize = s.coordinator.free_blocks().iter().sum();
    assert_eq!(free, 2 * 8 - 2);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn one_client_matches_a_hashmap(ops in proptest::collection::vec(op(), 1..60)) {
        let s = setup(2, 32, CoordinatorConfig { replication: 2, ..CoordinatorConfig::default() });
        let mut c = s.client(false, CentralSettings { grant_batch: 4, ..CentralSettings::default() });
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        for op in ops {
            match op {
                Op::Put(k, v) => {
                    c.put(&[k], &v).unwrap();
                    model.insert(vec![k], v);
                }
                Op::Get(k) => prop_assert_eq!(c.get(&[k]).unwrap(), model.get(&vec![k]).cloned()),
                Op::Delete(k) => {
                    c.delete(&[k]).unwrap();
                    model.remove(&vec![k]);
                }
                Op::Update(k, b) => {
                    c.update(&[k], &mut |old| change(old, b)).unwrap();
                    apply(&mut model, vec![k], b);
                }
            }
        }
        prop_assert_eq!(s.coordinator.key_count(), model.len());
        prop_assert_eq!(c.key_count().unwrap(), model.len() as u64);
        // The coordinator's walk names exactly the keys with a committed value.
        let (named, there) = common::walk(&mut c, 1);
        let keys: std::collections::BTreeSet<Vec<u8>> = model.keys().cloned().collect();
        prop_assert_eq!(&named, &keys);
        prop_assert_eq!(there, keys);
        drop(c);
        // Every block is either a live value's or free again (the dropped client gave its grants back).
        let free: usize = s.coordinator.free_blocks().iter().sum();
        prop_assert_eq!(free, 2 * 32 - 2 * model.len());
    }
}

#[test]
fn concurrent_writers_leave_one_of_their_values_and_readers_never_see_a_torn_one() -> Result<()> {
    const WRITERS: usize = 4;
    const WRITES: usize = 60;
    // Few blocks, so that freed blocks are reused while readers are on their way to them.
    let s = setup(2, 24, CoordinatorConfig::default());
    let value = |w: usize, i: usize| [(w * 1000 + i) as u64; 8].map(u64::to_le_bytes).concat();
    std::thread::scope(|scope| -> Result<()> {
        let mut handles = Vec::new();
        for w in 0..WRITERS {
            let s = &s;
            handles.push(scope.spawn(move || -> Result<()> {
                let mut c = s.client(
                    false,
                    CentralSettings {
                        grant_batch: 2,
                        ..CentralSettings::default()
                    },
                );
                for i in 0..WRITES {
                    c.put(b"shared", &value(w, i))?;
                }
                Ok(())
            }));
        }
        for _ in 0..2 {
            let s = &s;
            handles.push(scope.spawn(move || -> Result<()> {
                let mut c = s.client(false, CentralSettings::default());
                for _ in 0..300 {
                    if let Some(v) = c.get(b"shared")? {
                        let words: Vec<u64> = v
                            .chunks(8)
                            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
                            .collect();
                        assert_eq!(words.len(), 8);
                        assert!(words.iter().all(|x| *x == words[0]), "torn {words:?}");
                        assert!(
                            (words[0] as usize % 1000) < WRITES
                                && (words[0] as usize / 1000) < WRITERS
                        );
                    }
                }
                Ok(())
            }));
        }
        for h in handles {
            h.join().unwrap()?;
        }
        Ok(())
    })?;
    let mut c = s.client(false, CentralSettings::default());
    let last = c.get(b"shared")?.unwrap();
    assert!(
        (0..WRITERS).any(|w| last == value(w, WRITES - 1)),
        "the last write of one writer wins"
    );
    Ok(())
}

#[test]
fn a_client_crashing_mid_put_leaves_the_old_value_and_its_blocks_can_be_reclaimed() -> Result<()> {
    let s = setup(
        2,
        32,
        CoordinatorConfig {
            replication: 2,
            ..CoordinatorConfig::default()
        },
    );
    let mut a = s.client(
        false,
        CentralSettings {
            grant_batch: 2,
            ..CentralSettings::default()
        },
    );
    a.put(b"k", b"old")?;
    for point in [CentralCrash::AfterWrite, CentralCrash::AfterValidate] {
        let mut dying = s.client(
            false,
            CentralSettings {
                grant_batch: 3,
                ..CentralSettings::default()
            },
        );
        dying.put_crashing(b"k", b"new", point)?;
        let id = dying.id();
        std::mem::forget(dying);
        assert_eq!(a.get(b"k")?.as_deref(), Some(&b"old"[..]), "{point:?}");
        assert_eq!(
            s.coordinator.reclaim_grants(id),
            6,
            "three granted locations of two blocks"
        );
        a.put(b"k", b"next")?;
        assert_eq!(a.get(b"k")?.as_deref(), Some(&b"next"[..]));
        a.put(b"k", b"old")?;
    }
    Ok(())
}

#[test]
fn update_increments_from_many_clients_add_up() -> Result<()> {
    const THREADS: usize = 4;
    const INCREMENTS: usize = 50;
    let s = setup(
        2,
        64,
        CoordinatorConfig {
            replication: 2,
            ..CoordinatorConfig::default()
        },
    );
    // Conflicts are expected and retried (within the default 10 s).
    let settings = CentralSettings {
        grant_batch: 2,
        ..CentralSettings::default()
    };
    increment_from_threads(THREADS, INCREMENTS, b"count", || {
        Ok(s.client(false, settings.clone()))
    })?;
    let mut c = s.client(false, CentralSettings::default());
    assert_eq!(counter(c.get(b"count")?), (THREADS * INCREMENTS) as u64);
    c.update(b"count", &mut |_| Change::Keep)?;
    c.update(b"count", &mut |_| Change::Delete)?;
    assert_eq!(c.get(b"count")?, None);
    assert!(matches!(
        c.update(b"count", &mut |_| Change::Put(vec![0; 257])),
        Err(PdpmError::ValueTooLarge { .. })
    ));
    drop(c);
    // Every conflicting attempt's blocks were reused or given back: only the deleted key's are gone.
    assert_eq!(s.coordinator.free_blocks().iter().sum::<usize>(), 2 * 64);
    Ok(())
}

#[test]
fn a_new_coordinator_on_the_same_memory_nodes_serves_the_same_data() -> Result<()> {
    let s = setup(
        3,
        64,
        CoordinatorConfig {
            replication: 2,
            ..CoordinatorConfig::default()
        },
    );
    let mut c = s.client(true, CentralSettings::default());
    let mut model = HashMap::new();
    for i in 0..40u32 {
        let key = format!("key-{}", i % 25).into_bytes();
        let value = format!("value-{i}").into_bytes();
        c.put(&key, &value)?;
        model.insert(key, value);
    }
    for i in (0..25).step_by(5) {
        let key = format!("key-{i}").into_bytes();
        c.delete(&key)?;
        model.remove(&key);
    }
    let first_id = c.id();
    drop(c);
    let memory = s.memory;
    drop(s.coordinator);
    drop(s.host_server);
    drop(s.host);
    let restarted = Coordinator::new(
        &memory.connectors(false),
        CoordinatorConfig {
            replication: 2,
            ..CoordinatorConfig::default()
        },
    )?;
    assert_eq!(restarted.key_count(), model.len());
    assert_eq!(
        restarted.free_blocks().iter().sum::<usize>(),
        3 * 64 - 2 * model.len()
    );
    let (host, server) = serve_coordinator(&restarted, NodeConfig::default().rpc_threads);
    let mut c = CentralClient::connect(
        &connector(&host, &server, true),
        &memory.connectors(true),
        CentralSettings::default(),
    )?;
    // Versions are (client id, sequence): the restarted coordinator names its clients past the one whose
    // versions the blocks hold, so no new write can repeat a version a block still holds.
    assert!(c.id() > first_id, "{} after {first_id}", c.id());
    for i in 0..25 {
        let key = format!("key-{i}").into_bytes();
        assert_eq!(c.get(&key)?, model.get(&key).cloned(), "key-{i}");
    }
    c.put(b"key-0", b"after the restart")?;
    assert_eq!(c.get(b"key-0")?.as_deref(), Some(&b"after the restart"[..]));
    Ok(())
}
