//! Round trips per operation, read from the fabric's per-thread counters of the worker threads: a value hit costs
//! none, a shortcut hit one READ, and group commit brings writes below one round trip each.

use dinomo_cache::{CacheConfig, Policy};
use dinomo_kn::{Embedded, EmbeddedConfig, KnConfig, KvHandle};

fn store(policy: Policy, latency_ns: u64) -> Embedded {
    Embedded::open(&EmbeddedConfig {
        pool_size: 256 << 20,
        kn: KnConfig {
            threads: 1,
            cache: CacheConfig {
                budget_bytes: 1 << 20,
                policy,
                ..CacheConfig::default()
            },
            ..KnConfig::default()
        },
        injected_latency_ns: latency_ns,
        ..EmbeddedConfig::default()
    })
    .expect("open store")
}

fn round_trips(h: &KvHandle) -> u64 {
    h.stats().unwrap().iter().map(|s| s.round_trips).sum()
}

#[test]
fn value_hit_costs_no_round_trip() {
    let s = store(Policy::ValueOnly, 0);
    let h = s.handle();
    h.set(b"k", b"value").unwrap();
    let before = round_trips(&h);
    for _ in 0..100 {
        assert_eq!(h.get(b"k").unwrap().as_deref(), Some(&b"value"[..]));
    }
    assert_eq!(round_trips(&h) - before, 0);
    let st = &h.stats().unwrap()[0];
    assert_eq!(st.value_hits, 100);
}

#[test]
fn shortcut_hit_costs_one_round_trip() {
    let s = store(Policy::ShortcutOnly, 0);
    let h = s.handle();
    h.set(b"k", b"value").unwrap();
    h.merge_all().unwrap();
    let before = round_trips(&h);
    for _ in 0..100 {
        assert_eq!(h.get(b"k").unwrap().as_deref(), Some(&b"value"[..]));
    }
    assert_eq!(round_trips(&h) - before, 100);
    assert_eq!(h.stats().unwrap()[0].shortcut_hits, 100);
}

#[test]
fn uncached_lookup_walks_the_index() {
    uncached_lookup(dinomo_dpm::Partitioning::Shared);
}

/// A KV node of DINOMO-N reads its own partition of the index: the same walk, the same round trips.
#[test]
fn uncached_lookup_walks_the_nodes_own_partition() {
    uncached_lookup(dinomo_dpm::Partitioning::PerNode);
}

fn uncached_lookup(partitioning: dinomo_dpm::Partitioning) {
    // No cache at all: after the log is merged, every lookup walks the index.
    let s = Embedded::open(&EmbeddedConfig {
        kn: KnConfig {
            threads: 1,
            cache: CacheConfig {
                budget_bytes: 0,
                ..CacheConfig::default()
            },
            ..KnConfig::default()
        },
        processor: dinomo_dpm::ProcessorConfig {
            partitioning,
            ..dinomo_dpm::ProcessorConfig::default()
        },
        ..EmbeddedConfig::default()
    })
    .unwrap();
    let h = s.handle();
    h.set(b"k", b"value").unwrap();
    h.merge_all().unwrap();
    let before = round_trips(&h);
    assert_eq!(h.get(b"k").unwrap().as_deref(), Some(&b"value"[..]));
    let rts = round_trips(&h) - before;
    // Bucket (validated against the index header in the same batch), then the entry; the first walk also reads
    // the table geometry.
    assert!(
        (2..=3).contains(&rts),
        "an uncached lookup took {rts} round trips"
    );
    let before = round_trips(&h);
    assert_eq!(h.get(b"k").unwrap().as_deref(), Some(&b"value"[..]));
    assert_eq!(round_trips(&h) - before, 2, "bucket, then entry");
    assert_eq!(h.stats().unwrap()[0].index_walks, 2);
    assert_eq!(h.get(b"missing").unwrap(), None);
    assert_eq!(s.processor().partitioning(), partitioning);
}

/// A key an index walk found without a value is remembered where a walk costs a round trip (here an injected
/// microsecond): its next reads cost none, until this node writes it (or deletes it, and a walk finds it absent
/// again). With `remember_absent` off, or over the in-process fabric without injected latency (where a walk is a
/// function call), every read walks.
#[test]
fn a_key_without_a_value_walks_the_index_once_where_walks_cost_a_round_trip() {
    for (remember_absent, latency_ns, remembered) in
        [(true, 1000, true), (false, 1000, false), (true, 0, false)]
    {
        let s = Embedded::open(&EmbeddedConfig {
            pool_size: 256 << 20,
            kn: KnConfig {
                threads: 1,
                cache: CacheConfig {
                    budget_bytes: 1 << 20,
                    remember_absent,
                    ..CacheConfig::default()
                },
                ..KnConfig::default()
            },
            injected_latency_ns: latency_ns,
            ..EmbeddedConfig::default()
        })
        .expect("open store");
        let h = s.handle();
        // A merged log: the key is neither in the cache nor in the unmerged segments.
        h.set(b"other", b"value").unwrap();
        h.merge_all().unwrap();
        assert_eq!(h.get(b"k").unwrap(), None);
        let before = round_trips(&h);
        for _ in 0..50 {
            assert_eq!(h.get(b"k").unwrap(), None);
            assert!(!h.exists(b"k").unwrap());
        }
        let walked = round_trips(&h) - before;
        let st = &h.stats().unwrap()[0];
        if remembered {
            assert_eq!(walked, 0, "reads of a key known to have no value");
            assert_eq!((st.absent_hits, st.index_walks), (100, 1));
        } else {
            assert_eq!(
                walked, 100,
                "one batch per read: the bucket, checked against the index header"
            );
            assert_eq!((st.absent_hits, st.index_walks), (0, 101));
        }
        h.set(b"k", b"v1").unwrap();
        assert_eq!(h.get(b"k").unwrap().as_deref(), Some(&b"v1"[..]));
        assert!(h.delete(b"k").unwrap());
        h.merge_all().unwrap();
        assert_eq!(h.get(b"k").unwrap(), None);
        assert_eq!(h.get(b"k").unwrap(), None);
        h.set(b"k", b"v2").unwrap();
        assert_eq!(h.get(b"k").unwrap().as_deref(), Some(&b"v2"[..]));
        let cache = h.stats().unwrap()[0].cache;
        assert_eq!(cache.absents, 0, "every record of absence was written over");
    }
}

#[test]
fn group_commit_amortises_writes_below_one_round_trip() {
    // A 200 µs round trip gives the concurrent writers time to queue up behind each WRITE even when the test
    // machine is busy with other tests (with 20 µs, starved client threads sometimes could not).
    let s = store(Policy::Adaptive, 200_000);
    let before = round_trips(&s.handle());
    const CLIENTS: usize = 8;
    const WRITES: usize = 50;
    std::thread::scope(|scope| {
        for c in 0..CLIENTS {
            let h = s.handle();
            scope.spawn(move || {
                for i in 0..WRITES {
                    h.set(format!("c{c}-{i}").as_bytes(), &[c as u8; 100])
                        .unwrap();
                }
            });
        }
    });
    let h = s.handle();
    let rts = round_trips(&h) - before;
    let per_write = rts as f64 / (CLIENTS * WRITES) as f64;
    // Commits alternate: the clients acknowledged by one commit wake up while the worker already commits the one
    // or two that arrived first, and the rest queue behind that WRITE. Batches therefore average about half the
    // clients, about 0.5 round trips per write with 8 clients: well below one, which is what group commit owes.
    assert!(
        per_write < 0.75,
        "{rts} round trips for {} writes",
        CLIENTS * WRITES
    );
    let st = &h.stats().unwrap()[0];
    assert_eq!(st.writes, (CLIENTS * WRITES) as u64);
    assert!(
        st.commits * 4 < st.writes * 3,
        "{} commits for {} writes",
        st.commits,
        st.writes
    );
}

#[test]
fn writes_that_arrive_together_share_one_write() {
    use dinomo_fabric::{Connector, MemoryNode, NodeConfig, Target};
    let pool = std::sync::Arc::new(dinomo_pool::Pool::anonymous(64 << 20, 1 << 20).unwrap());
    let processor =
        dinomo_dpm::Processor::start(pool.clone(), &dinomo_dpm::ProcessorConfig::default())
            .unwrap();
    let node = MemoryNode::new(pool, NodeConfig::default());
    processor.serve(&node);
    let mut w = dinomo_kn::DirectWorker::start(
        KnConfig {
            threads: 1,
            ..KnConfig::default()
        },
        0,
        Connector::new(Target::InProcess(node)),
    )
    .unwrap();
    w.set(b"first", b"opens a segment").unwrap();
    let before = w.stats();
    let keys: Vec<Vec<u8>> = (0..1000u32)
        .map(|i| format!("key{i}").into_bytes())
        .collect();
    w.set_many(keys.iter().map(|k| (&k[..], &b"value"[..])))
        .unwrap();
    let after = w.stats();
    assert_eq!(
        after.round_trips - before.round_trips,
        1,
        "1000 writes, one WRITE"
    );
    assert_eq!(after.commits - before.commits, 1);
    assert_eq!(after.writes - before.writes, 1000);
}
