//! The store against a HashMap model: random inserts, updates, upserts, deletes and gets with random keys and
//! sizes (empty values included), with tiny segments, tiny caches and a hash that collides on purpose, so that
//! merging, recycling, eviction, promotion, demotion and restarts all happen; with the memory node's index shared
//! or partitioned per KV node (DINOMO-N's layout).

use std::collections::HashMap;
use std::path::Path;

use dinomo_cache::{CacheConfig, Policy};
use dinomo_dpm::{Partitioning, ProcessorConfig};
use dinomo_index::IndexConfig;
use dinomo_kn::{DataOp, Embedded, EmbeddedConfig, KnConfig, Reply};
use dinomo_log::HashMode;
use dinomo_pool::PersistMode;
use dinomo_value::RangeWrite;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

fn tiny_config(
    pool: Option<&Path>,
    policy: Policy,
    cache_bytes: u64,
    partitioning: Partitioning,
) -> EmbeddedConfig {
    EmbeddedConfig {
        pool_path: pool.map(Path::to_path_buf),
        pool_size: 16 << 20,
        pool_segment_size: 4096,
        persist: PersistMode::Volatile,
        // A few segments ahead, so that the prefaulter runs beside the writers of every case: faulting in a
        // segment being written must change none of its bytes.
        prefault_ahead: 4 * 4096,
        processor: ProcessorConfig {
            merge_threads: 2,
            directory_capacity: 64,
            segment_size: 4096,
            hash_mode: HashMode::Colliding { bits: 3 },
            index: IndexConfig {
                initial_buckets: 2,
                ..IndexConfig::default()
            },
            partitioning,
            ..ProcessorConfig::default()
        },
        kn: KnConfig {
            threads: 2,
            max_key_len: 64,
            max_value_len: 1500,
            cache: CacheConfig {
                budget_bytes: cache_bytes,
                policy,
                ..CacheConfig::default()
            },
            ..KnConfig::default()
        },
        injected_latency_ns: 0,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Set(u8, usize),
    Insert(u8, usize),
    Update(u8, usize),
    Delete(u8),
    Get(u8),
    Probe(u8),
    GetSet(u8, usize),
    Incr(u8, i64),
    Append(u8, usize),
    Take(u8),
    Range(u8, i64, i64),
    SetRange(u8, u64, usize),
    IncrFloat(u8, i8),
    InsertGet(u8, usize),
    UpdateGet(u8, usize),
    SetBit(u8, u64, bool),
    Bits(u8, u64, i64, i64),
    MergeAll,
    Restart,
}

fn key(k: u8) -> Vec<u8> {
    // Keys of different lengths, the empty key included.
    match k % 4 {
        0 => vec![k; (k as usize) % 3],
        1 => format!("key-{k}").into_bytes(),
        2 => vec![k ^ 0x5a; 40],
        _ => vec![b'x', k],
    }
}

fn value(k: u8, len: usize, version: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 ^ version ^ k as u64) as u8)
        .collect()
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let size = prop_oneof![Just(0usize), 1usize..64, 64usize..400, 1000usize..1500];
    prop_oneof![
        6 => (any::<u8>().prop_map(|k| k % 48), size.clone()).prop_map(|(k, s)| Op::Set(k, s)),
        2 => (any::<u8>().prop_map(|k| k % 48), size.clone()).prop_map(|(k, s)| Op::Insert(k, s)),
        2 => (any::<u8>().prop_map(|k| k % 48), size).prop_map(|(k, s)| Op::Update(k, s)),
        2 => any::<u8>().prop_map(|k| Op::Delete(k % 48)),
        8 => any::<u8>().prop_map(|k| Op::Get(k % 48)),
        2 => any::<u8>().prop_map(|k| Op::Probe(k % 48)),
        1 => (any::<u8>().prop_map(|k| k % 48), 0usize..64).prop_map(|(k, s)| Op::GetSet(k, s)),
        1 => (any::<u8>().prop_map(|k| k % 48), -3i64..4).prop_map(|(k, d)| Op::Incr(k, d)),
        1 => (any::<u8>().prop_map(|k| k % 48), 0usize..64).prop_map(|(k, s)| Op::Append(k, s)),
        1 => any::<u8>().prop_map(|k| Op::Take(k % 48)),
        1 => (any::<u8>().prop_map(|k| k % 48), -70i64..70, -70i64..70).prop_map(|(k, a, b)| Op::Range(k, a, b)),
        1 => (any::<u8>().prop_map(|k| k % 48), 0u64..1600, 0usize..64)
            .prop_map(|(k, o, s)| Op::SetRange(k, o, s)),
        1 => (any::<u8>().prop_map(|k| k % 48), any::<i8>()).prop_map(|(k, d)| Op::IncrFloat(k, d)),
        1 => (any::<u8>().prop_map(|k| k % 48), 0usize..64).prop_map(|(k, s)| Op::InsertGet(k, s)),
        1 => (any::<u8>().prop_map(|k| k % 48), 0usize..64).prop_map(|(k, s)| Op::UpdateGet(k, s)),
        1 => (any::<u8>().prop_map(|k| k % 48), 0u64..13_000, any::<bool>()).prop_map(|(k, i, b)| Op::SetBit(k, i, b)),
        1 => (any::<u8>().prop_map(|k| k % 48), 0u64..13_000, -40i64..40, -40i64..40)
            .prop_map(|(k, i, a, b)| Op::Bits(k, i, a, b)),
        1 => Just(Op::MergeAll),
        1 => Just(Op::Restart),
    ]
}

fn run(
    ops: &[Op],
    policy: Policy,
    cache_bytes: u64,
    partitioning: Partitioning,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("model.pool");
    let cfg = tiny_config(Some(&path), policy, cache_bytes, partitioning);
    let mut store = Embedded::open(&cfg)?;
    let mut h = store.handle();
    let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        let v = i as u64;
        match *op {
            Op::Set(k, len) => {
                let val = value(k, len, v);
                h.set(&key(k), &val)?;
                model.insert(key(k), val);
            }
            Op::Insert(k, len) => {
                let val = value(k, len, v);
                let did = h.insert(&key(k), &val)?;
                assert_eq!(
                    did,
                    !model.contains_key(&key(k)),
                    "insert of {:?} at op {i}",
                    key(k)
                );
                model.entry(key(k)).or_insert(val);
            }
            Op::Update(k, len) => {
                let val = value(k, len, v);
                let did = h.update(&key(k), &val)?;
                assert_eq!(
                    did,
                    model.contains_key(&key(k)),
                    "update of {:?} at op {i}",
                    key(k)
                );
                if did {
                    model.insert(key(k), val);
                }
            }
            Op::Delete(k) => {
                let did = h.delete(&key(k))?;
                assert_eq!(
                    did,
                    model.remove(&key(k)).is_some(),
                    "delete of {:?} at op {i}",
                    key(k)
                );
            }
            Op::GetSet(k, len) => {
                let val = value(k, len, v);
                assert_eq!(
                    h.get_set(&key(k), &val)?,
                    model.insert(key(k), val),
                    "getset at op {i}"
                );
            }
            Op::Incr(k, delta) => {
                let old = model.get(&key(k)).cloned();
                let current = match &old {
                    None => Some(0),
                    Some(b) => std::str::from_utf8(b)
                        .ok()
                        .and_then(|s| s.parse::<i64>().ok().filter(|n| n.to_string() == s)),
                };
                // `Some(None)`: an integer, but the sum overflows.
                let expected = current.map(|n| n.checked_add(delta));
                match (h.incr(&key(k), delta), expected) {
                    (Ok(n), Some(Some(e))) => {
                        assert_eq!(n, e, "incr at op {i}");
                        model.insert(key(k), n.to_string().into_bytes());
                    }
                    (Err(dinomo_kn::KnError::NotAnInteger), None) => {}
                    (Err(dinomo_kn::KnError::IncrOverflow), Some(None)) => {}
                    (got, e) => panic!("incr of {old:?} at op {i}: got {got:?}, expected {e:?}"),
                }
            }
            Op::Append(k, len) => {
                let suffix = value(k, len, v);
                let mut expected = model.get(&key(k)).cloned().unwrap_or_default();
                expected.extend_from_slice(&suffix);
                if expected.len() <= 1500 {
                    assert_eq!(
                        h.append(&key(k), &suffix)?,
                        expected.len() as u64,
                        "append at op {i}"
                    );
                    model.insert(key(k), expected);
                } else {
                    assert!(
                        matches!(
                            h.append(&key(k), &suffix),
                            Err(dinomo_kn::KnError::ValueTooLarge { .. })
                        ),
                        "append past the value limit at op {i}"
                    );
                }
            }
            Op::Take(k) => {
                let got = h.data(DataOp::Take(key(k)))?;
                assert_eq!(got, Reply::Value(model.remove(&key(k))), "getdel at op {i}");
            }
            Op::Range(k, start, end) => {
                let v = model.get(&key(k)).cloned().unwrap_or_default();
                let want = dinomo_value::range(&v, start, end).to_vec();
                let got = h.data(DataOp::GetRange(key(k), start, end))?;
                assert_eq!(got, Reply::Value(Some(want)), "getrange at op {i}");
            }
            Op::SetRange(k, offset, len) => {
                let bytes = value(k, len, v);
                let old = model.get(&key(k)).cloned();
                let got = h.data(DataOp::SetRange(key(k), offset, bytes.clone()));
                match (got, dinomo_value::set_range(old, offset, &bytes, 1500)) {
                    (Ok(Reply::Int(n)), Ok(RangeWrite::Unchanged(len))) => {
                        assert_eq!(n, len as i64, "setrange at op {i}")
                    }
                    (Ok(Reply::Int(n)), Ok(RangeWrite::Write(new))) => {
                        assert_eq!(n, new.len() as i64, "setrange at op {i}");
                        model.insert(key(k), new);
                    }
                    (Err(dinomo_kn::KnError::ValueTooLarge { .. }), Err(_)) => {}
                    (got, want) => panic!("setrange at op {i}: got {got:?}, expected {want:?}"),
                }
            }
            Op::IncrFloat(k, delta) => {
                // Halves, so that sums are exact and the model's text is the store's.
                let delta = format!("{}", f64::from(delta) / 2.0);
                let old = model.get(&key(k)).cloned();
                let got = h.data(DataOp::IncrFloat(key(k), delta.clone().into_bytes()));
                match (
                    got,
                    dinomo_value::increment_float(old.as_deref(), delta.as_bytes()),
                ) {
                    (Ok(Reply::Value(Some(n))), Ok(want)) => {
                        assert_eq!(n, want, "incrbyfloat at op {i}");
                        model.insert(key(k), n);
                    }
                    (
                        Err(dinomo_kn::KnError::NotAFloat),
                        Err(dinomo_value::ValueError::NotAFloat),
                    ) => {}
                    (got, want) => {
                        panic!("incrbyfloat of {old:?} at op {i}: got {got:?}, expected {want:?}")
                    }
                }
            }
            Op::InsertGet(k, len) => {
                let val = value(k, len, v);
                let got = h.data(DataOp::InsertGet(key(k), val.clone()))?;
                let had = model.get(&key(k)).cloned();
                assert_eq!(got, Reply::Value(had.clone()), "set nx get at op {i}");
                if had.is_none() {
                    model.insert(key(k), val);
                }
            }
            Op::UpdateGet(k, len) => {
                let val = value(k, len, v);
                let got = h.data(DataOp::UpdateGet(key(k), val.clone()))?;
                let had = model.get(&key(k)).cloned();
                assert_eq!(got, Reply::Value(had.clone()), "set xx get at op {i}");
                if had.is_some() {
                    model.insert(key(k), val);
                }
            }
            Op::SetBit(k, i, bit) => {
                let old = model.get(&key(k)).cloned();
                let got = h.data(DataOp::SetBit(key(k), i, bit));
                match (got, dinomo_value::set_bit(old, i, bit, 1500)) {
                    (Ok(Reply::Int(n)), Ok(w)) => {
                        assert_eq!(n, i64::from(w.previous), "setbit at op {i}");
                        if let Some(v) = w.value {
                            model.insert(key(k), v);
                        }
                    }
                    (Err(dinomo_kn::KnError::ValueTooLarge { .. }), Err(_)) => {}
                    (got, want) => panic!("setbit at op {i}: got {got:?}, expected {want:?}"),
                }
            }
            Op::Bits(k, at, start, end) => {
                let v = model.get(&key(k)).cloned();
                let bytes = v.as_deref().unwrap_or_default();
                let bit = dinomo_value::get_bit(bytes, at);
                let count = dinomo_value::bit_count(bytes, Some((start, end, true)));
                let pos = dinomo_value::bit_pos(v.as_deref(), true, Some((start, None, false)));
                assert_eq!(
                    (
                        h.data(DataOp::GetBit(key(k), at))?,
                        h.data(DataOp::BitCount(key(k), Some((start, end, true))))?,
                        h.data(DataOp::BitPos(key(k), true, Some((start, None, false))))?,
                    ),
                    (
                        Reply::Int(i64::from(bit)),
                        Reply::Int(count as i64),
                        Reply::Int(pos)
                    ),
                    "getbit, bitcount and bitpos of {:?} at op {i}",
                    key(k)
                );
            }
            Op::Get(k) => {
                assert_eq!(
                    h.get(&key(k))?,
                    model.get(&key(k)).cloned(),
                    "get of {:?} at op {i}",
                    key(k)
                );
            }
            Op::Probe(k) => {
                let want = model.get(&key(k));
                assert_eq!(
                    (h.exists(&key(k))?, h.strlen(&key(k))?),
                    (want.is_some(), want.map_or(0, |v| v.len() as u64)),
                    "exists and strlen of {:?} at op {i}",
                    key(k)
                );
            }
            Op::MergeAll => h.merge_all()?,
            Op::Restart => {
                drop(h);
                drop(store);
                store = Embedded::open(&cfg)?;
                h = store.handle();
            }
        }
    }
    for k in 0..48u8 {
        assert_eq!(
            h.get(&key(k))?,
            model.get(&key(k)).cloned(),
            "final get of {:?}",
            key(k)
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn agrees_with_a_hashmap(ops in proptest::collection::vec(op_strategy(), 1..400),
                             policy in prop_oneof![Just(Policy::Adaptive), Just(Policy::ValueOnly),
                                                   Just(Policy::ShortcutOnly), Just(Policy::Static { value_percent: 50 })],
                             cache in prop_oneof![Just(0u64), Just(1024u64), Just(8192u64)],
                             partitioning in prop_oneof![Just(Partitioning::Shared), Just(Partitioning::PerNode)]) {
        run(&ops, policy, cache, partitioning).unwrap();
    }
}

/// One long seeded run that must exercise every mechanism, checked through the counters.
#[test]
fn long_run_merges_recycles_and_moves_cache_entries() -> anyhow::Result<()> {
    let cfg = tiny_config(None, Policy::Adaptive, 6000, Partitioning::Shared);
    let store = Embedded::open(&cfg)?;
    let h = store.handle();
    let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut rng = StdRng::seed_from_u64(7);
    for i in 0..20_000u64 {
        // A hot set of 16 keys and a cold set of 200, so that shortcuts earn promotion and values get demoted.
        let k: u16 = if rng.random_bool(0.7) {
            rng.random_range(0..16)
        } else {
            rng.random_range(16..216)
        };
        let kb = format!("k{k}").into_bytes();
        match rng.random_range(0..10) {
            0..=2 => {
                let len = if rng.random_bool(0.1) {
                    0
                } else {
                    rng.random_range(1..200)
                };
                let val: Vec<u8> = (0..len).map(|j| (j as u64 ^ i) as u8).collect();
                h.set(&kb, &val)?;
                model.insert(kb, val);
            }
            3 => {
                assert_eq!(h.delete(&kb)?, model.remove(&kb).is_some());
            }
            _ => assert_eq!(h.get(&kb)?, model.get(&kb).cloned(), "get k{k} at op {i}"),
        }
        if i % 5000 == 4999 {
            h.merge_all()?;
        }
    }
    let ps = store.processor_stats();
    let ws = h.stats()?;
    let sum = |f: fn(&dinomo_kn::WorkerStats) -> u64| ws.iter().map(f).sum::<u64>();
    assert!(ps.merged_entries > 1000, "{ps:?}");
    assert!(ps.recycled_segments > 10, "{ps:?}");
    assert!(sum(|w| w.segments_sealed) > 10);
    assert!(
        sum(|w| w.value_hits) > 0 && sum(|w| w.shortcut_hits) > 0 && sum(|w| w.index_walks) > 0
    );
    assert!(sum(|w| w.log_hits) > 0);
    assert!(sum(|w| w.cache.promotions) > 0, "{ws:?}");
    assert!(sum(|w| w.cache.demotions) > 0, "{ws:?}");
    assert!(sum(|w| w.cache.evictions) > 0, "{ws:?}");
    for w in &ws {
        assert!(w.cache.used_bytes <= w.cache.budget_bytes);
    }
    Ok(())
}
