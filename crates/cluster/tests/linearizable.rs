//! Concurrent clients record every operation while KV nodes are added, removed and crashed; the recorded history
//! must be linearizable (checked per key, Wing–Gong style), and a final read of every key by a fresh client — part
//! of the history — shows that no acknowledged write was lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dinomo_cluster::{
    Client, ClientConfig, ClientError, LocalCluster, ReconfigEvent, ReconfigKind, Variant,
};
use dinomo_lincheck::{Op, Outcome, Recorder};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

mod common;

const PLAIN_KEYS: u32 = 12;
const COUNTERS: u32 = 3;

fn plain(i: u32) -> Vec<u8> {
    format!("k{i}").into_bytes()
}

fn counter(i: u32) -> Vec<u8> {
    format!("ctr{i}").into_bytes()
}

/// Runs one operation through `cl` and records it.
fn step(cl: &mut Client, rec: &Recorder, client: u32, n: u64, rng: &mut StdRng) {
    let value = format!("c{client}-{n}").into_bytes();
    let op = match rng.random_range(0..10u32) {
        0..=3 => Op::Get(plain(rng.random_range(0..PLAIN_KEYS))),
        4..=5 => Op::Set(plain(rng.random_range(0..PLAIN_KEYS)), value),
        6 => Op::Insert(plain(rng.random_range(0..PLAIN_KEYS)), value),
        7 => match rng.random_range(0..2u32) {
            0 => Op::Delete(plain(rng.random_range(0..PLAIN_KEYS))),
            _ => Op::Take(plain(rng.random_range(0..PLAIN_KEYS))),
        },
        8 => Op::Get(counter(rng.random_range(0..COUNTERS))),
        _ => Op::Incr(
            counter(rng.random_range(0..COUNTERS)),
            rng.random_range(1..5),
        ),
    };
    let ticket = rec.invoke(client, op.clone());
    let result: Result<Outcome, ClientError> = match op {
        Op::Get(k) => cl.get(&k).map(Outcome::Value),
        Op::Set(k, v) => cl.set(&k, &v).map(|_| Outcome::Ok),
        Op::Insert(k, v) => cl.insert(&k, &v).map(Outcome::Applied),
        Op::Update(k, v) => cl.update(&k, &v).map(Outcome::Applied),
        Op::Delete(k) => cl.delete(&k).map(Outcome::Applied),
        Op::Incr(k, d) => cl.incr(&k, d).map(Outcome::Int),
        Op::Take(k) => cl.get_del(&k).map(Outcome::Value),
    };
    match result {
        Ok(outcome) => rec.complete(ticket, outcome),
        // Not applied (no owner reachable before the deadline, no room) or applied unknowably: either way the
        // checker may place it anywhere after its invocation, or nowhere.
        Err(
            ClientError::Unavailable(_)
            | ClientError::Indeterminate(_)
            | ClientError::OutOfSpace(_),
        ) => rec.unknown(ticket),
        Err(ClientError::Invalid(e)) => panic!("invalid request: {e}"),
    }
}

/// Clients running [`step`] against a cluster, recording every operation.
struct Load {
    rec: Arc<Recorder>,
    stop: Arc<AtomicBool>,
    seeds: Vec<String>,
    clients: Vec<std::thread::JoinHandle<u64>>,
}

impl Load {
    /// Starts six clients; each runs until [`Load::finish`] (bounded in count and time).
    fn start(cluster: &LocalCluster) -> Load {
        Load::start_with(cluster, 6)
    }

    /// [`Load::start`] with `clients` clients.
    fn start_with(cluster: &LocalCluster, clients: u32) -> Load {
        let rec = Arc::new(Recorder::new());
        let stop = Arc::new(AtomicBool::new(false));
        let seeds = vec![cluster.rn_addr().to_string()];
        let clients = (0..clients)
            .map(|c| {
                let (rec, stop, seeds) = (rec.clone(), stop.clone(), seeds.clone());
                std::thread::spawn(move || {
                    let mut cl = Client::connect(ClientConfig {
                        seeds,
                        op_timeout: Duration::from_secs(3),
                        ..ClientConfig::default()
                    })
                    .expect("client");
                    let mut rng = StdRng::seed_from_u64(0xd1 + u64::from(c));
                    let start = Instant::now();
                    let mut n = 0;
                    while !stop.load(Ordering::Acquire)
                        && n < 20_000
                        && start.elapsed() < Duration::from_secs(30)
                    {
                        step(&mut cl, &rec, c, n, &mut rng);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        Load {
            rec,
            stop,
            seeds,
            clients,
        }
    }

    /// Stops the clients, reads every key once more (recorded), and checks the history.
    fn finish(self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Release);
        let ops: u64 = self
            .clients
            .into_iter()
            .map(|t| t.join().expect("client thread"))
            .sum();
        eprintln!("{ops} operations recorded");
        let mut reader = Client::connect(ClientConfig {
            seeds: self.seeds,
            ..ClientConfig::default()
        })?;
        for k in (0..PLAIN_KEYS).map(plain).chain((0..COUNTERS).map(counter)) {
            let t = self.rec.invoke(99, Op::Get(k.clone()));
            let v = reader.get(&k)?;
            self.rec.complete(t, Outcome::Value(v));
        }
        assert!(ops > 500, "only {ops} operations ran");
        common::assert_linearizable(&self.rec.history(), "dinomo-nonlinearizable-history.json")
    }
}

/// A cluster of `kns` nodes of `variant`.
fn start(variant: Variant, kns: usize) -> anyhow::Result<LocalCluster> {
    start_with_latency(variant, kns, 0, false)
}

/// [`start`], every fabric round trip taking `latency_ns` more: then the KV nodes read the entries their batches'
/// shortcuts lead to ahead, and remember keys found without a value (neither is done where round trips are free).
fn start_with_latency(
    variant: Variant,
    kns: usize,
    latency_ns: u64,
    uncached: bool,
) -> anyhow::Result<LocalCluster> {
    let mut cfg = common::small_cluster(kns);
    variant.configure(&mut cfg);
    cfg.injected_latency_ns = latency_ns;
    if uncached {
        // Caches of one byte, and log segments of 64 KiB, so that the workers' copies of their unmerged segments
        // are merged and dropped: reads walk the index.
        cfg.node.kn.cache.budget_bytes = 1;
        cfg.processor.segment_size = 64 << 10;
        cfg.node.kn.max_value_len = 16 << 10;
    }
    Ok(LocalCluster::start(cfg)?)
}

#[test]
fn dinomo_histories_across_adds_removes_and_crashes_are_linearizable() -> anyhow::Result<()> {
    adds_removes_and_crashes(Variant::Dinomo)
}

#[test]
fn dinomo_s_histories_across_adds_removes_and_crashes_are_linearizable() -> anyhow::Result<()> {
    adds_removes_and_crashes(Variant::DinomoS)
}

#[test]
fn dinomo_n_histories_across_adds_removes_and_crashes_are_linearizable() -> anyhow::Result<()> {
    adds_removes_and_crashes(Variant::DinomoN)
}

/// Over a fabric whose round trips take 2 µs, the KV nodes read their batches' shortcut entries ahead; DINOMO-S
/// caches shortcuts only, so most of its reads go through what was read ahead.
#[test]
fn dinomo_s_histories_over_a_microsecond_fabric_are_linearizable() -> anyhow::Result<()> {
    let read = over_a_microsecond_fabric(Variant::DinomoS, false)?;
    assert!(read.entries_ahead > 0, "nothing was read ahead");
    Ok(())
}

/// Over a fabric whose round trips take 2 µs, with caches of one byte and small log segments: reads of keys not in
/// the worker's unmerged log walk the index, and twice as many clients make batches whose walks are made side by
/// side before they are served.
#[test]
fn uncached_dinomo_histories_over_a_microsecond_fabric_are_linearizable() -> anyhow::Result<()> {
    let read = over_a_microsecond_fabric(Variant::Dinomo, true)?;
    assert!(read.walks_ahead > 0, "no walk was made ahead");
    Ok(())
}

/// Over a fabric whose round trips take 2 µs, DINOMO's KV nodes keep records of keys found without a value (in
/// their value share, which DINOMO-S does not have) while the clients delete and read keys again and again; keys
/// never written, read twice afterwards, are answered by such records the second time.
#[test]
fn dinomo_histories_over_a_microsecond_fabric_are_linearizable() -> anyhow::Result<()> {
    over_a_microsecond_fabric(Variant::Dinomo, false)?;
    Ok(())
}

/// What the KV nodes still running read ahead, and answered from records of absence.
#[derive(Debug, Default)]
struct ReadAhead {
    entries_ahead: u64,
    walks_ahead: u64,
    absent_hits: u64,
}

/// Records a history across an add, a removal and a crash on a 2 µs fabric (`uncached`: see
/// [`start_with_latency`], with twelve clients rather than six).
fn over_a_microsecond_fabric(variant: Variant, uncached: bool) -> anyhow::Result<ReadAhead> {
    let mut cluster = start_with_latency(variant, 3, 2_000, uncached)?;
    let load = Load::start_with(&cluster, if uncached { 12 } else { 6 });
    let pause = Duration::from_millis(300);
    std::thread::sleep(pause);
    cluster.add_node()?;
    std::thread::sleep(pause);
    let first = cluster.nodes()[0].id();
    cluster.remove_node(first)?;
    std::thread::sleep(pause);
    let victim = cluster.nodes()[0].id();
    cluster.crash_node(victim)?;
    cluster.wait_until_serving(Duration::from_secs(10))?;
    std::thread::sleep(pause);
    load.finish()?;
    let counts = |cluster: &LocalCluster| -> anyhow::Result<ReadAhead> {
        let mut read = ReadAhead::default();
        for node in cluster.nodes().iter() {
            for t in node.worker_stats()? {
                read.entries_ahead += t.entries_read_ahead;
                read.walks_ahead += t.index_walks_ahead;
                read.absent_hits += t.absent_hits;
            }
        }
        Ok(read)
    };
    let read = counts(&cluster)?;
    eprintln!("{read:?}");
    let absent = read.absent_hits;
    if variant == Variant::Dinomo && !uncached {
        let mut cl = Client::connect(cluster.client_config())?;
        for _ in 0..2 {
            for i in 0..16 {
                assert_eq!(cl.get(format!("never-{i}").as_bytes())?, None);
            }
        }
        let after = counts(&cluster)?.absent_hits;
        assert!(
            after >= absent + 16,
            "{} second reads answered by records",
            after - absent
        );
    }
    cluster.stop();
    Ok(read)
}

fn adds_removes_and_crashes(variant: Variant) -> anyhow::Result<()> {
    let mut cluster = start(variant, 3)?;
    let load = Load::start(&cluster);

    let pause = Duration::from_millis(300);
    std::thread::sleep(pause);
    let added = cluster.add_node()?;
    std::thread::sleep(pause);
    let first = cluster.nodes()[0].id();
    cluster.remove_node(first)?;
    std::thread::sleep(pause);
    let victim = cluster
        .nodes()
        .iter()
        .map(|n| n.id())
        .find(|&id| id != added)
        .expect("a node");
    cluster.crash_node(victim)?;
    cluster.wait_until_serving(Duration::from_secs(10))?;
    std::thread::sleep(pause);
    let second = cluster.add_node()?;
    std::thread::sleep(pause);
    cluster.crash_node(second)?;
    cluster.wait_until_serving(Duration::from_secs(10))?;
    std::thread::sleep(pause);
    let events = cluster.mnode().events();
    use ReconfigKind::{Add, Failure, Remove};
    // Three initial joins, then add, remove, crash, add, crash.
    assert_eq!(
        planned(&events, &cluster.restarted_nodes()),
        [Add, Add, Add, Add, Remove, Failure, Add, Failure],
        "reconfigurations: {events:?}"
    );
    // Shared-nothing: the keys' data moved with their ownership; otherwise nothing moved.
    let moved: u64 = events.iter().map(|e| e.moved_keys).sum();
    assert_eq!(moved > 0, variant == Variant::DinomoN, "{moved} keys moved");
    load.finish()?;
    cluster.stop();
    Ok(())
}

/// The reconfigurations a test asked for, in order: every event except the failure and return of a node that was
/// restarted because its lease expired while it ran (a machine starving the test's threads for longer than the
/// lease), which the cluster's supervisor caused, not the test.
fn planned(events: &[ReconfigEvent], restarted: &[u32]) -> Vec<ReconfigKind> {
    let mut keep = vec![true; events.len()];
    for &node in restarted {
        let failure = (0..events.len()).find(|&i| {
            keep[i] && events[i].node == node && events[i].kind == ReconfigKind::Failure
        });
        if let Some(f) = failure
            && let Some(back) = (f + 1..events.len())
                .find(|&i| keep[i] && events[i].node == node && events[i].kind == ReconfigKind::Add)
        {
            keep[f] = false;
            keep[back] = false;
        }
    }
    events
        .iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(e, _)| e.kind)
        .collect()
}

/// A KV node whose lease expires while it runs (its heartbeat thread starved of CPU for longer than the lease,
/// simulated by holding its renewals back) stops serving, is failed by the M-node, restarts with its id, takes its
/// logs back and serves its keys again; clients never see a lost or stale value.
#[test]
fn dinomo_histories_across_an_expired_lease_are_linearizable() -> anyhow::Result<()> {
    let cluster = start(Variant::Dinomo, 3)?;
    let load = Load::start(&cluster);
    let pause = Duration::from_millis(300);
    std::thread::sleep(pause);
    let (victim, lease) = {
        let nodes = cluster.nodes();
        nodes[0].hold_heartbeats(true);
        (nodes[0].id(), nodes[0].lease())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let events = || cluster.mnode().events();
    while !events()
        .iter()
        .any(|e| e.node == victim && e.kind == ReconfigKind::Failure)
    {
        assert!(Instant::now() < deadline, "node {victim} was never failed");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Woken, the heartbeat finds the lease expired: the node is fenced and restarted.
    if let Some(n) = cluster.nodes().iter().find(|n| n.id() == victim) {
        n.hold_heartbeats(false);
    }
    while !cluster.restarted_nodes().contains(&victim) {
        assert!(Instant::now() < deadline, "node {victim} was not restarted");
        std::thread::sleep(Duration::from_millis(5));
    }
    cluster.wait_until_serving(Duration::from_secs(10))?;
    {
        let nodes = cluster.nodes();
        let mut ids: Vec<u32> = nodes.iter().map(|n| n.id()).collect();
        ids.sort_unstable();
        assert_eq!(ids, [1, 2, 3], "the same three nodes serve");
        let back = nodes.iter().find(|n| n.id() == victim).expect("restarted");
        assert_ne!(back.lease(), lease, "a new incarnation with a new lease");
    }
    std::thread::sleep(pause);
    load.finish()?;
    use ReconfigKind::{Add, Failure};
    let kinds: Vec<(ReconfigKind, u32)> = events().iter().map(|e| (e.kind, e.node)).collect();
    assert!(
        kinds.ends_with(&[(Failure, victim), (Add, victim)]),
        "reconfigurations: {kinds:?}"
    );
    cluster.stop();
    Ok(())
}

/// Hot keys become shared by several nodes (their values move into indirect cells that every owner CASes), stay
/// shared across a join and a crash, and go back to one owner, all under load.
#[test]
fn dinomo_histories_with_keys_shared_and_unshared_under_load_are_linearizable() -> anyhow::Result<()>
{
    shared_and_unshared(Variant::Dinomo)
}

#[test]
fn dinomo_s_histories_with_keys_shared_and_unshared_under_load_are_linearizable()
-> anyhow::Result<()> {
    shared_and_unshared(Variant::DinomoS)
}

fn shared_and_unshared(variant: Variant) -> anyhow::Result<()> {
    let mut cluster = start(variant, 3)?;
    let load = Load::start(&cluster);

    let pause = Duration::from_millis(250);
    let m = |c: &LocalCluster, key: Vec<u8>, r: u32| c.mnode().set_replication(&key, r);
    std::thread::sleep(pause);
    m(&cluster, counter(0), 3)?;
    m(&cluster, plain(0), 3)?;
    m(&cluster, plain(1), 2)?;
    std::thread::sleep(pause);
    cluster.add_node()?;
    std::thread::sleep(pause);
    m(&cluster, plain(0), 1)?;
    m(&cluster, counter(1), 2)?;
    m(&cluster, plain(1), 4)?;
    std::thread::sleep(pause);
    let victim = cluster.nodes()[0].id();
    cluster.crash_node(victim)?;
    cluster.wait_until_serving(Duration::from_secs(10))?;
    std::thread::sleep(pause);
    m(&cluster, plain(2), 2)?;
    std::thread::sleep(pause);
    for key in [counter(0), counter(1), plain(1), plain(2)] {
        m(&cluster, key, 1)?;
    }
    std::thread::sleep(pause);
    let shared: u64 = cluster
        .nodes()
        .iter()
        .map(|n| {
            n.worker_stats()
                .map(|s| s.iter().map(|w| w.shared_ops).sum::<u64>())
        })
        .sum::<Result<u64, _>>()?;
    assert!(shared > 100, "only {shared} operations went through cells");
    assert_eq!(cluster.processor().stats().shared_keys, 0);
    load.finish()?;
    cluster.stop();
    Ok(())
}

/// The log cleaner works all the time on every merged segment (a copy of each live entry, its index slot moved to
/// the copy) while clients read and write, a key is shared and unshared, a node joins and a node crashes: shortcuts
/// to moved entries, a key written while its entry is copied, and a shared key's entry that must stay where its
/// cell points all keep the history linearizable.
#[test]
fn dinomo_histories_while_the_cleaner_moves_every_live_entry_are_linearizable() -> anyhow::Result<()>
{
    let mut cfg = common::small_cluster(3);
    cfg.processor.clean_below_free_percent = 100;
    cfg.processor.clean_max_live_percent = 100;
    // Small segments, sealed and merged every hundred or so writes: many for the cleaner to move.
    cfg.processor.segment_size = 4096;
    cfg.node.kn.max_value_len = 1024;
    cfg.node.kn.max_key_len = 256;
    let mut cluster = LocalCluster::start(cfg)?;
    let load = Load::start(&cluster);
    let pause = Duration::from_millis(300);
    std::thread::sleep(pause);
    cluster.mnode().set_replication(&plain(0), 2)?;
    std::thread::sleep(pause);
    cluster.add_node()?;
    std::thread::sleep(pause);
    let victim = cluster.nodes()[0].id();
    cluster.crash_node(victim)?;
    cluster.wait_until_serving(Duration::from_secs(10))?;
    std::thread::sleep(pause);
    cluster.mnode().set_replication(&plain(0), 1)?;
    std::thread::sleep(pause);
    let stats = cluster.processor().stats();
    eprintln!(
        "the cleaner emptied {} segments, moving {} entries",
        stats.cleaned_segments, stats.relocated_entries
    );
    assert!(
        stats.relocated_entries > 0 && stats.cleaned_segments > 0,
        "the cleaner moved nothing: {stats:?}"
    );
    load.finish()?;
    cluster.stop();
    Ok(())
}
