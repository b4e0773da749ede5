//! The liveness lease seen from the workers. A lease that *lapsed* (its renewal came late, as when the heartbeat
//! thread is starved of CPU) may still be renewed: a request that finds it so waits for the renewal, up to the
//! gate's wait, and is then served. A lease that was *fenced* (it expired in the store) never serves again, and a
//! request refused for either reason was not applied.
//!
//! The gate is driven by hand here, standing in for the heartbeat, so each case is deterministic.

mod common;

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dinomo_dpm::Processor;
use dinomo_fabric::{Connector, FaultHooks};
use dinomo_kn::{KnConfig, KnError, KvHandle, KvNode, LeaseGate};

/// Far beyond any wait in these tests: a reply that needs it means the request never woke.
const LONG: Duration = Duration::from_secs(600);
/// How long a test waits for something that must happen.
const PATIENCE: Duration = Duration::from_secs(20);

struct Setup {
    _processor: Arc<Processor>,
    connector: Connector,
    kn: KvNode,
}

fn start(gate: Option<Arc<LeaseGate>>, node_id: u16) -> anyhow::Result<Setup> {
    let (processor, connector) = common::small_memory_node()?;
    let kn = start_kn(&connector, gate, node_id)?;
    Ok(Setup {
        _processor: processor,
        connector,
        kn,
    })
}

fn start_kn(
    connector: &Connector,
    gate: Option<Arc<LeaseGate>>,
    node_id: u16,
) -> anyhow::Result<KvNode> {
    Ok(KvNode::start_in_cluster(
        KnConfig {
            node_id: node_id.into(),
            threads: 1,
            max_value_len: 2048,
            ..KnConfig::default()
        },
        connector.clone(),
        None,
        gate,
    )?)
}

/// The value of `key` as another node (id 2, outside any lease) reads it from the pool: what reached the log.
fn read_by_another_node(connector: &Connector, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
    let other = start_kn(connector, None, 2)?;
    let value = other.handle().get(key)?;
    other.stop();
    Ok(value)
}

/// A gate that lapsed a moment ago (and can still be renewed).
fn lapsed(wait: Duration) -> Arc<LeaseGate> {
    let gate = LeaseGate::with_wait(Instant::now(), wait);
    assert!(!gate.is_open());
    gate
}

/// Runs `f` on its own thread; its result arrives on the returned channel.
fn spawn<T: Send + 'static>(
    h: &KvHandle,
    f: impl FnOnce(&KvHandle) -> T + Send + 'static,
) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    let h = h.clone();
    std::thread::spawn(move || {
        let _ = tx.send(f(&h));
    });
    rx
}

/// Waits until `gate` has seen `n` waits begin.
fn until_waits(gate: &LeaseGate, n: u64) {
    let start = Instant::now();
    while gate.waits() < n {
        assert!(
            start.elapsed() < PATIENCE,
            "no request waited for the lease"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn without_a_wait_a_lapsed_lease_refuses_at_once_and_nothing_is_applied() -> anyhow::Result<()> {
    let gate = LeaseGate::with_wait(Instant::now() + LONG, Duration::ZERO);
    let s = start(Some(gate.clone()), 1)?;
    let h = s.kn.handle();
    h.set(b"k", b"before")?;
    // The heartbeat is late: the lease lapses although nobody fenced the node.
    let lapsed_gate = lapsed(Duration::ZERO);
    drop(gate);
    s.kn.stop();
    let kn = start_kn(&s.connector, Some(lapsed_gate.clone()), 1)?;
    let h = kn.handle();
    assert!(matches!(h.set(b"k", b"after"), Err(KnError::LeaseLapsed)));
    assert!(matches!(h.get(b"k"), Err(KnError::LeaseLapsed)));
    assert_eq!(lapsed_gate.waits(), 0, "a zero wait never parks");
    // A refused request is not in doubt, whether it read or wrote.
    assert!(!KnError::LeaseLapsed.is_indeterminate());
    kn.stop();
    // Another node reading the pool sees the value from before: the refused write never reached the log.
    assert_eq!(
        read_by_another_node(&s.connector, b"k")?,
        Some(b"before".to_vec())
    );
    Ok(())
}

#[test]
fn requests_that_meet_a_lapsed_lease_are_served_once_it_is_renewed() -> anyhow::Result<()> {
    let gate = lapsed(LONG);
    let s = start(Some(gate.clone()), 1)?;
    let h = s.kn.handle();
    let write = spawn(&h, |h| h.set(b"k", b"v"));
    until_waits(&gate, 1);
    // Still lapsed, so still waiting: nothing may be answered yet.
    assert!(write.recv_timeout(Duration::from_millis(20)).is_err());
    // The late renewal arrives.
    gate.extend_to(Instant::now() + LONG);
    write.recv_timeout(PATIENCE)??;
    assert_eq!(h.get(b"k")?, Some(b"v".to_vec()));
    // And again, for a read this time.
    let gate = lapsed(LONG);
    s.kn.stop();
    let kn = start_kn(&s.connector, Some(gate.clone()), 1)?;
    let h = kn.handle();
    let read = spawn(&h, |h| h.get(b"k"));
    until_waits(&gate, 1);
    gate.extend_to(Instant::now() + LONG);
    assert_eq!(read.recv_timeout(PATIENCE)??, Some(b"v".to_vec()));
    let stats = h.stats()?;
    assert_eq!(stats[0].lease_waits_served, 1);
    assert_eq!(stats[0].lease_refusals, 0);
    kn.stop();
    Ok(())
}

#[test]
fn a_fenced_lease_refuses_waiting_requests_and_never_serves_again() -> anyhow::Result<()> {
    let gate = lapsed(LONG);
    let s = start(Some(gate.clone()), 1)?;
    let h = s.kn.handle();
    let write = spawn(&h, |h| h.set(b"k", b"v"));
    until_waits(&gate, 1);
    // The store reports the lease expired: the waiting write is refused now, not after the (long) wait.
    gate.close();
    assert!(matches!(
        write.recv_timeout(PATIENCE)?,
        Err(KnError::LeaseLapsed)
    ));
    // A renewal that raced with the expiry cannot reopen a fenced gate.
    gate.extend_to(Instant::now() + LONG);
    assert!(!gate.is_open());
    assert!(matches!(h.get(b"k"), Err(KnError::LeaseLapsed)));
    // Counters are still answered.
    assert_eq!(h.stats()?[0].lease_refusals, 2);
    s.kn.stop();
    assert_eq!(read_by_another_node(&s.connector, b"k")?, None);
    Ok(())
}

#[test]
fn a_lease_not_renewed_within_the_wait_refuses() -> anyhow::Result<()> {
    let gate = lapsed(Duration::from_millis(30));
    let s = start(Some(gate.clone()), 1)?;
    let h = s.kn.handle();
    assert!(matches!(h.set(b"k", b"v"), Err(KnError::LeaseLapsed)));
    assert_eq!(gate.waits(), 1);
    // With no heartbeat left, nothing is waited for.
    gate.stop_renewals();
    assert!(matches!(h.get(b"k"), Err(KnError::LeaseLapsed)));
    assert_eq!(gate.waits(), 1);
    assert_eq!(h.stats()?[0].lease_refusals, 2);
    s.kn.stop();
    Ok(())
}

/// Node 1 on `connector` under a lease open for [`LONG`], and the fault hooks all its endpoints share.
fn kn_under_lease_with_hooks(
    connector: &Connector,
) -> anyhow::Result<(KvNode, Arc<LeaseGate>, Arc<FaultHooks>)> {
    let gate = LeaseGate::open_until(Instant::now() + LONG);
    let mut hooked = connector.clone();
    let hooks = hooked.share_fault_hooks();
    Ok((start_kn(&hooked, Some(gate.clone()), 1)?, gate, hooks))
}

/// Runs `op` on `h` with every round trip slowed to 400 ms, fences `gate` once `n` of the op's round trips have
/// begun (failing with `what` if they never do), and returns the op's answer.
fn fenced_after_round_trips<T: Send + 'static>(
    h: &KvHandle,
    (gate, hooks): (&LeaseGate, &FaultHooks),
    n: u64,
    what: &str,
    op: impl FnOnce(&KvHandle) -> T + Send + 'static,
) -> anyhow::Result<T> {
    hooks.set_delay(Duration::from_millis(400));
    let begun = hooks.round_trips_begun();
    let answer = spawn(h, op);
    let start = Instant::now();
    while hooks.round_trips_begun() < begun + n {
        assert!(start.elapsed() < PATIENCE, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
    gate.close();
    let answer = answer.recv_timeout(PATIENCE)?;
    hooks.set_delay(Duration::ZERO);
    Ok(answer)
}

/// A read whose round trips outlive the lease is refused when it ends, not answered: meanwhile its key may have
/// gone to a new owner, which may have written it. The read walks the index (nothing of the key is cached or in
/// the node's own log), each round trip slowed to 400 ms, and the lease is fenced once the walk has gone out.
#[test]
fn a_read_that_outlives_the_lease_is_refused_at_its_end() -> anyhow::Result<()> {
    let (_processor, connector) = common::small_memory_node()?;
    // The value, written by a node outside any lease and merged into the index when that node stops.
    let writer = start_kn(&connector, None, 2)?;
    writer.handle().set(b"k", b"v")?;
    writer.stop();
    let (kn, gate, hooks) = kn_under_lease_with_hooks(&connector)?;
    let h = kn.handle();
    // Fenced once the walk is on its way, past the lease check at its start.
    let read = fenced_after_round_trips(&h, (&gate, &hooks), 1, "the read never went out", |h| {
        h.get(b"k")
    })?;
    assert!(matches!(read, Err(KnError::LeaseLapsed)));
    let stats = &h.stats()?[0];
    assert_eq!(
        (stats.index_walks, stats.lease_refusals),
        (1, 1),
        "the read walked the index and was refused at its end"
    );
    kn.stop();
    Ok(())
}

/// A shared key's write whose cell CAS lands after the lease was fenced answers `Fenced` (outcome unknown), not
/// success: meanwhile the node may have been taken over and its log merged, with the cell not yet naming the entry.
#[test]
fn a_shared_write_whose_cas_outlives_the_lease_is_not_acknowledged() -> anyhow::Result<()> {
    let (pool, _processor, connector) = common::small_memory_node_with_pool()?;
    let key = b"shared-key".as_slice();
    let cell = common::reserve_cell(&connector, key)?;
    let (kn, gate, hooks) = kn_under_lease_with_hooks(&connector)?;
    common::install_sharing(&kn, 1, &[(key, cell)])?;
    let h = kn.handle();
    h.set(key, b"before")?;
    let word = pool.atomic_u64(cell)?;
    let before = word.load(std::sync::atomic::Ordering::Acquire);
    // The write READs the cell, WRITEs its entry through, checks the lease, and CASes the cell: once its third
    // round trip has begun, it is past that check.
    let write = fenced_after_round_trips(
        &h,
        (&gate, &hooks),
        3,
        "the write never reached its CAS",
        |h| h.set(b"shared-key", b"after"),
    )?;
    assert!(matches!(write, Err(KnError::Fenced)));
    assert_ne!(
        word.load(std::sync::atomic::Ordering::Acquire),
        before,
        "the CAS landed, after the lease was fenced"
    );
    kn.stop();
    Ok(())
}
