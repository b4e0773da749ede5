//! An in-process cluster over loopback: ownership, refusals, and adding, removing and crashing KV nodes with the
//! data staying where it is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::small_cluster;
use dinomo_cluster::wire::{RequestBody, ResponseBody};
use dinomo_cluster::{Client, ClientConfig, LocalCluster, ReconfigKind, Variant};

mod common;

fn client(c: &LocalCluster) -> Client {
    Client::connect(ClientConfig {
        seeds: vec![c.rn_addr().to_string()],
        ..ClientConfig::default()
    })
    .expect("client")
}

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:05}").into_bytes()
}

fn value(i: u32, version: u32) -> Vec<u8> {
    format!("value-{i}-{version}").into_bytes()
}

fn check_all(cl: &mut Client, n: u32, version: u32) {
    for i in 0..n {
        assert_eq!(cl.get(&key(i)).unwrap(), Some(value(i, version)), "key {i}");
    }
}

#[test]
fn nodes_serve_only_their_keys_and_refuse_the_rest() -> anyhow::Result<()> {
    let c = LocalCluster::start(small_cluster(3))?;
    let mut cl = client(&c);
    for i in 0..300 {
        cl.set(&key(i), &value(i, 0))?;
    }
    check_all(&mut cl, 300, 0);
    let routing = cl.routing().unwrap().clone();
    assert_eq!(routing.ring.len(), 3);
    // Every node holds a fair share, and a node that is not the owner refuses with its epoch.
    for node in c.nodes().iter() {
        let share = routing.ring.share(node.id());
        assert!(
            (0.15..0.55).contains(&share),
            "node {} share {share}",
            node.id()
        );
    }
    let mut refused = 0;
    for i in 0..50 {
        let owner = routing.ring.primary(&key(i)).unwrap();
        for node in c.nodes().iter().filter(|n| n.id() != owner) {
            let mut direct = Client::connect(ClientConfig {
                seeds: vec![node.addr().to_string()],
                ..ClientConfig::default()
            })?;
            // Bypass routing: talk to the wrong node on purpose.
            let r = RequestBody::Data(dinomo_kn::DataOp::Get(key(i)));
            let reply = common::raw_call(node.addr(), "", r)?;
            assert_eq!(
                reply,
                ResponseBody::NotOwner {
                    epoch: routing.epoch()
                }
            );
            refused += 1;
            // The client itself follows the refusal and still gets the value.
            assert_eq!(direct.get(&key(i))?, Some(value(i, 0)));
        }
    }
    assert_eq!(refused, 100);
    c.stop();
    Ok(())
}

/// A client still holding the table and an idle connection of a node that crashed: its next write to that node's key
/// finds the connection closed before sending, so it goes to the new owner and is applied, rather than being written
/// into the dead connection and reported with its outcome unknown.
#[test]
fn a_write_after_its_owner_crashed_is_rerouted_not_left_unknown() -> anyhow::Result<()> {
    let mut c = dinomo_cluster::LocalCluster::start(small_cluster(2))?;
    let mut cl = client(&c);
    let victim = c.nodes()[1].id();
    let k = (0..10_000)
        .map(key)
        .find(|k| cl.owner(k) == Some(victim))
        .expect("some key of the second node");
    cl.set(&k, b"before")?;
    c.crash_node(victim)?;
    c.wait_until_serving(Duration::from_secs(10))?;
    // The client's table still names the crashed node as the owner, and its connection there is pooled.
    assert_eq!(cl.owner(&k), Some(victim));
    cl.set(&k, b"after")?;
    assert_eq!(cl.get(&k)?.as_deref(), Some(&b"after"[..]));
    c.stop();
    Ok(())
}

#[test]
fn adding_removing_and_crashing_nodes_moves_ownership_not_data() -> anyhow::Result<()> {
    let moved = add_remove_and_crash(Variant::Dinomo)?;
    assert!(moved.iter().all(|&(keys, bytes)| keys == 0 && bytes == 0));
    Ok(())
}

/// DINOMO-N, shared-nothing: the same reconfigurations copy the data of every key that changes owner into its new
/// owner's partition, and report it.
#[test]
fn shared_nothing_moves_the_data_of_keys_that_change_owner() -> anyhow::Result<()> {
    let moved = add_remove_and_crash(Variant::DinomoN)?;
    // Add, remove, crash: each hands a share of the 400 keys to other nodes.
    assert_eq!(moved.len(), 3);
    for (keys, bytes) in moved {
        assert!((20..400).contains(&keys), "{keys} keys moved");
        assert!(bytes >= keys * 40, "{bytes} bytes for {keys} keys");
    }
    Ok(())
}

/// Writes 400 keys, adds, removes and crashes a node (every value read back after each), and returns what each of
/// the three reconfigurations moved: (keys, bytes).
fn add_remove_and_crash(variant: Variant) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut cfg = small_cluster(2);
    variant.configure(&mut cfg);
    let mut c = LocalCluster::start(cfg)?;
    let mut cl = client(&c);
    let n = 400;
    for i in 0..n {
        cl.set(&key(i), &value(i, 0))?;
    }
    let used_before = c.pool().space().used_bytes();

    let added = c.add_node()?;
    check_all(&mut cl, n, 0);
    assert!(cl.routing().unwrap().ring.contains(added));
    for i in 0..n {
        cl.set(&key(i), &value(i, 1))?;
    }

    let first = c.nodes()[0].id();
    c.remove_node(first)?;
    c.wait_until_serving(Duration::from_secs(10))?;
    check_all(&mut cl, n, 1);
    for i in 0..n {
        cl.set(&key(i), &value(i, 2))?;
    }

    let victim = c.nodes()[0].id();
    c.crash_node(victim)?;
    // The client waits out the failover by itself (its operation deadline is 5 s).
    check_all(&mut cl, n, 2);
    c.wait_until_serving(Duration::from_secs(10))?;

    let events = c.mnode().events();
    let kinds: Vec<(ReconfigKind, u32)> = events.iter().map(|e| (e.kind, e.node)).collect();
    assert!(kinds.contains(&(ReconfigKind::Add, added)), "{kinds:?}");
    assert!(kinds.contains(&(ReconfigKind::Remove, first)), "{kinds:?}");
    assert!(
        kinds.contains(&(ReconfigKind::Failure, victim)),
        "{kinds:?}"
    );
    if variant != Variant::DinomoN {
        // Ownership moved, data did not: three rounds of 400 small writes and three reconfigurations stay within
        // a few log segments of pool space, nothing like a copy per move.
        let grown = c.pool().space().used_bytes().saturating_sub(used_before);
        assert!(grown < 8 << 20, "pool grew by {grown} bytes");
    }
    let stats = c.processor().stats();
    // After the two initial joins (into an empty cluster): add, remove, crash.
    let moved: Vec<(u64, u64)> = events
        .iter()
        .skip(2)
        .map(|e| (e.moved_keys, e.moved_bytes))
        .collect();
    assert_eq!(
        stats.migrated_keys,
        moved.iter().map(|m| m.0).sum::<u64>(),
        "{stats:?}"
    );
    // The M-node's metrics count what every reconfiguration moved.
    let text = dinomo_cluster::metrics::render(&[Arc::new(c.mnode().metrics())]);
    let counter = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
    };
    assert_eq!(
        counter("dinomo_mnode_moved_keys_total"),
        events.iter().map(|e| e.moved_keys).sum::<u64>()
    );
    assert_eq!(
        counter("dinomo_mnode_moved_bytes_total"),
        events.iter().map(|e| e.moved_bytes).sum::<u64>()
    );
    c.stop();
    Ok(moved)
}

/// Threads that wait out a configured period (a standby M-node's checks, a routing node's refresh) stop as soon as
/// they are told to, however long the period: stopping a process must not wait a day.
#[test]
fn a_day_long_check_or_refresh_period_does_not_hold_up_a_stop() -> anyhow::Result<()> {
    const DAY: Duration = Duration::from_secs(24 * 3600);
    let c = LocalCluster::start(small_cluster(1))?;
    let started = std::time::Instant::now();
    let standby = dinomo_cluster::MNode::start(
        dinomo_cluster::MNodeConfig {
            name: "standby".into(),
            check_interval: DAY,
            ..dinomo_cluster::MNodeConfig::default()
        },
        c.meta_store(),
        c.memory_connector(),
    )?;
    let rn = dinomo_cluster::RoutingNode::start(
        "127.0.0.1:0".parse()?,
        c.meta_store(),
        DAY,
        dinomo_cluster::ServerLimits::default(),
        "",
    )?;
    // The routing node read the table once at its start, so it serves the current one.
    assert_eq!(rn.epoch(), c.nodes()[0].routing().epoch().into());
    // Both are past their first round and waiting out the day now.
    std::thread::sleep(Duration::from_millis(100));
    // Stopped on another thread, so that a stop that waits out the day fails the test instead of hanging it.
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        standby.stop();
        drop(rn);
        let _ = done_tx.send(());
    });
    assert!(
        done.recv_timeout(Duration::from_secs(60)).is_ok(),
        "still stopping after {:?}",
        started.elapsed()
    );
    Ok(())
}

/// A pool with room for the memory node's tables but not for the cluster record: the M-node cannot add the KV
/// nodes and retries. The start gives up after `node_start_timeout` (not a fixed 30 s) and says why.
#[test]
fn a_start_the_pool_has_no_room_for_fails_in_its_timeout_naming_the_cause() {
    let mut cfg = small_cluster(2);
    // 1 MiB segments: the index, the log directory, the cell table and the KV nodes' logs fit, the record does not.
    cfg.pool_size = 6 << 20;
    cfg.node_start_timeout = Duration::from_secs(2);
    let started = std::time::Instant::now();
    let err = match LocalCluster::start(cfg) {
        Ok(_) => panic!("a 6 MiB pool held the whole cluster: the test needs a smaller one"),
        Err(e) => e.to_string(),
    };
    let took = started.elapsed();
    assert!(
        err.contains("did not converge within 2s")
            && err.contains("the M-node's last reconfiguration step failed")
            && err.contains("out of pool space"),
        "{err}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(20),
        "the start gave up after {took:?}, not after its 2 s timeout"
    );
}

/// A local cluster of no KV node could never form: the start refuses it at once, saying why, instead of waiting
/// out its timeout.
#[test]
fn a_start_without_kv_nodes_is_refused_at_once() {
    let mut cfg = small_cluster(0);
    cfg.node_start_timeout = Duration::from_secs(30);
    let started = std::time::Instant::now();
    let err = match LocalCluster::start(cfg) {
        Ok(_) => panic!("a cluster of no KV node started"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("at least one KV node"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused only after {:?}",
        started.elapsed()
    );
}

/// An autoscaler adds and removes nodes for ever (and some fail), with ids never reused: every departed node's logs
/// go back to the memory node's directory, which stays far smaller than the logs all those nodes claimed, and with
/// DINOMO-N its index partition goes back to the partition table. Keys that departed nodes wrote once and nobody
/// wrote again read back at the end.
#[test]
fn nodes_that_come_and_go_give_their_logs_back() -> anyhow::Result<()> {
    for variant in [Variant::Dinomo, Variant::DinomoN] {
        let mut cfg = small_cluster(2);
        variant.configure(&mut cfg);
        // Three nodes of two threads, and the memory node's relocation log: 7 logs at a time, 24 in the directory.
        cfg.processor.directory_capacity = 24;
        if variant == Variant::DinomoN {
            // The cleaner runs all the time: it writes each node's relocation log, which the node's departure
            // seals and lets go. (With the shared index it is left to its default, so that departed logs keep
            // their cold entries until a claim finds the directory full.)
            cfg.processor.clean_below_free_percent = 100;
            // Four nodes at a time during a round: the departed nodes' partitions must be given back.
            cfg.processor.partition_capacity = 6;
        }
        let mut c = LocalCluster::start(cfg)?;
        let mut cl = client(&c);
        let rounds = 16;
        for round in 0..rounds {
            for i in 0..100 {
                cl.set(&key(i), &value(i, round))?;
                cl.set(format!("cold-{round}-{i}").as_bytes(), &value(i, round))?;
            }
            c.add_node()
                .map_err(|e| anyhow::anyhow!("{variant}, round {round}: {e}"))?;
            // Every other node leaves by failing: the M-node takes its logs over before the data moves.
            let first = c.nodes()[0].id();
            if round % 2 == 1 {
                c.crash_node(first)?;
            } else {
                c.remove_node(first)?;
            }
            c.wait_until_serving(Duration::from_secs(10))?;
        }
        check_all(&mut cl, 100, rounds - 1);
        for round in 0..rounds {
            for i in 0..100 {
                let k = format!("cold-{round}-{i}");
                assert_eq!(
                    cl.get(k.as_bytes())?,
                    Some(value(i, round)),
                    "{variant}: {k}"
                );
            }
        }
        let stats = c.processor().stats();
        assert!(
            stats.logs <= 24 && stats.retired_logs > 0,
            "{variant}: {stats:?}"
        );
        if variant == Variant::DinomoN {
            assert!(stats.cleaned_segments > 0, "{stats:?}");
            // Every departed node's partition goes, once its logs retired: one partition per node left.
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut stats = stats;
            while stats.partitions != c.nodes().len() as u64 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
                stats = c.processor().stats();
            }
            assert_eq!(stats.partitions, c.nodes().len() as u64, "{stats:?}");
            assert!(stats.freed_partitions >= rounds as u64, "{stats:?}");
        } else {
            // The cold keys kept departed logs' segments, until claims that found the directory full had them moved.
            assert!(stats.emptied_logs > 0, "{stats:?}");
        }
        c.stop();
    }
    Ok(())
}

/// A removal the M-node completes without its caller stopping the node (the caller was told a step failed, and the
/// M-node carried the removal through later; here the M-node is asked directly): the cluster stops that node once
/// it has drained, instead of leaving it running outside the ring, and the cluster serves on.
#[test]
fn a_node_removed_behind_its_callers_back_is_stopped() -> anyhow::Result<()> {
    let c = LocalCluster::start(small_cluster(3))?;
    let mut cl = client(&c);
    for i in 0..100 {
        cl.set(&key(i), &value(i, 0))?;
    }
    let leaving = c.nodes().iter().map(|n| n.id()).max().expect("three nodes");
    let addr = c
        .nodes()
        .iter()
        .find(|n| n.id() == leaving)
        .map(|n| n.addr().to_string())
        .expect("the leaving node");
    c.mnode().remove_node(leaving)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.nodes().iter().any(|n| n.id() == leaving) {
        assert!(
            Instant::now() < deadline,
            "node {leaving} still runs after its removal"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Stopped once drained: its server no longer takes connections.
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&addr).is_ok() {
        assert!(
            Instant::now() < deadline,
            "node {leaving} still listens on {addr}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    c.wait_until_serving(Duration::from_secs(20))?;
    cl.refresh_routing();
    check_all(&mut cl, 100, 0);
    c.stop();
    Ok(())
}
