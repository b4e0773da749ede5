//! The embedded store: the shared behaviour, concurrent compare-and-set, and a model-based property test of the
//! record (with reopens, which exercise recovery).

mod common;

use std::sync::Arc;
use std::time::Duration;

use dinomo_meta::{CLUSTER_META_TAG, EmbeddedMeta, MetaConfig, MetaError, MetaStore};
use dinomo_pool::Pool;
use proptest::prelude::*;

const SEGMENT: u64 = 64 << 10;
const MAX_RECORD: usize = 200 << 10;

fn config() -> MetaConfig {
    MetaConfig {
        max_record_len: MAX_RECORD,
        ..MetaConfig::default()
    }
}

fn pool() -> Arc<Pool> {
    Arc::new(Pool::anonymous(16 << 20, SEGMENT).unwrap())
}

#[test]
fn embedded_store_behaves() -> anyhow::Result<()> {
    let meta = EmbeddedMeta::open(pool(), config())?;
    common::conformance(&*meta, &common::Params::embedded(MAX_RECORD))
}

#[test]
fn concurrent_compare_and_set_has_one_winner_per_version() {
    let meta = EmbeddedMeta::open(pool(), config()).unwrap();
    let v0 = meta.store(None, b"0").unwrap();
    let threads = 4;
    let rounds = 50;
    let wins: Vec<Vec<u64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let meta = &meta;
                s.spawn(move || {
                    let mut won = Vec::new();
                    for _ in 0..rounds {
                        let cur = meta.load().unwrap().unwrap();
                        match meta.store(Some(cur.version), format!("{t}").as_bytes()) {
                            Ok(v) => won.push(v),
                            Err(MetaError::Conflict { current }) => {
                                assert!(current.unwrap() > cur.version)
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    won
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<u64> = wins.into_iter().flatten().collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "two stores won the same version");
    assert!(n >= rounds, "at least one store per round wins");
    assert_eq!(meta.load().unwrap().unwrap().version, *all.last().unwrap());
    assert!(all[0] > v0);
    // Header and at most two record blobs remain allocated.
    let tagged = meta
        .pool()
        .allocated()
        .iter()
        .filter(|e| e.tag == CLUSTER_META_TAG)
        .count();
    assert!(tagged <= 3, "{tagged} cluster-metadata allocations");
}

#[test]
fn leases_are_concurrently_safe() {
    let meta = EmbeddedMeta::open(pool(), config()).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let meta = &meta;
            s.spawn(move || {
                for i in 0..100 {
                    let l = meta.grant(Duration::from_secs(10)).unwrap();
                    meta.register(&format!("kn/{t}/{i}"), b"x", l).unwrap();
                    if i % 2 == 0 {
                        meta.revoke(l).unwrap();
                    }
                }
            });
        }
    });
    assert_eq!(meta.members("kn/").unwrap().len(), 200);
    assert_eq!(meta.live_leases(), 200);
}

#[derive(Debug, Clone)]
enum Op {
    /// Store with the current version (`None` if no record), the expected CAS.
    Current(Vec<u8>),
    /// Store with the current version shifted by the offset (a stale or future version).
    Shifted(i8, Vec<u8>),
    /// Store with an arbitrary expected version.
    Any(Option<u64>, Vec<u8>),
    /// Close and reopen the store on the same pool.
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let value = prop::collection::vec(any::<u8>(), 0..300);
    prop_oneof![
        4 => value.clone().prop_map(Op::Current),
        2 => (any::<i8>().prop_filter("non-zero", |d| *d != 0), value.clone())
            .prop_map(|(d, v)| Op::Shifted(d, v)),
        1 => (prop::option::of(0u64..20), value).prop_map(|(e, v)| Op::Any(e, v)),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn record_follows_the_model(ops in prop::collection::vec(op(), 1..40)) {
        let pool = pool();
        let mut meta = EmbeddedMeta::open(pool.clone(), config()).unwrap();
        // The model: the record and its version.
        let mut model: Option<(u64, Vec<u8>)> = None;
        for op in ops {
            let (expected, value) = match op {
                Op::Reopen => {
                    drop(meta);
                    meta = EmbeddedMeta::open(pool.clone(), config()).unwrap();
                    let tagged = pool.allocated().iter().filter(|e| e.tag == CLUSTER_META_TAG).count();
                    prop_assert!(tagged <= 3, "{} cluster-metadata allocations", tagged);
                    prop_assert_eq!(meta.load().unwrap().map(|v| (v.version, v.value)), model.clone());
                    continue;
                }
                Op::Current(v) => (model.as_ref().map(|m| m.0), v),
                Op::Shifted(d, v) => {
                    let base = model.as_ref().map_or(0, |m| m.0) as i64;
                    (u64::try_from(base + d as i64).ok(), v)
                }
                Op::Any(e, v) => (e, v),
            };
            let current = model.as_ref().map(|m| m.0);
            match meta.store(expected, &value) {
                Ok(version) => {
                    prop_assert_eq!(expected, current, "a store with the wrong version succeeded");
                    prop_assert!(current.is_none_or(|c| version > c));
                    model = Some((version, value));
                }
                Err(MetaError::Conflict { current: reported }) => {
                    prop_assert_ne!(expected, current, "a store with the right version failed");
                    prop_assert_eq!(reported, current);
                }
                Err(e) => prop_assert!(false, "unexpected error {}", e),
            }
            prop_assert_eq!(meta.load().unwrap().map(|v| (v.version, v.value)), model.clone());
        }
    }
}
