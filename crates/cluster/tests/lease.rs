//! A KV node whose heartbeat is starved: its lease lapses at the node although the store still holds it. Requests
//! that arrive meanwhile wait for the late renewal and are served by the same node, with no failover; when the
//! store's lease did run out, the node never serves again and the client finds the keys' new owner.
//!
//! The starvation is simulated deterministically: a metadata store whose keep-alive replies are held back on
//! request (the store itself is renewed or not, as the case needs), instead of loading the machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::{HookedMeta, MetaHooks, small_cluster};
use dinomo_cluster::{
    Client, ClientConfig, ClusterNode, LocalCluster, LocalClusterConfig, NodeConfig,
};
use dinomo_fabric::{FaultHooks, Target};
use dinomo_kn::KnError;
use dinomo_meta::{LeaseId, MetaError, MetaStore};
use dinomo_ring::NodeId;

mod common;

/// How long a test waits for something that must happen.
const PATIENCE: Duration = Duration::from_secs(20);

/// Hooks that hold a metadata store's keep-alive replies back, like those of a heartbeat thread that gets no CPU.
struct Held {
    held: Mutex<bool>,
    released: Condvar,
    /// Whether the store's lease is kept alive while replies are held (the node's thread is slow, the store is
    /// renewed) or left to expire (the node is gone as far as the store knows).
    renew_while_held: AtomicBool,
}

/// The store of the starved node.
type HeldMeta = HookedMeta<Held>;

impl Held {
    fn hold(&self, renew: bool) {
        self.renew_while_held.store(renew, Ordering::Release);
        *self.held.lock().unwrap() = true;
    }

    /// While replies stay held, stops renewing the store's lease too: it runs out, as a node's that died.
    fn stop_renewing(&self) {
        self.renew_while_held.store(false, Ordering::Release);
    }

    fn release(&self) {
        *self.held.lock().unwrap() = false;
        self.released.notify_all();
    }
}

impl MetaHooks for Held {
    fn keep_alive(&self, inner: &dyn MetaStore, lease: LeaseId) -> Result<(), MetaError> {
        let mut held = self.held.lock().unwrap();
        if !*held {
            return inner.keep_alive(lease);
        }
        let start = Instant::now();
        while *held && start.elapsed() < PATIENCE {
            // Looked at on every turn: a test may stop the renewals while replies are held.
            if self.renew_while_held.load(Ordering::Acquire) {
                inner.keep_alive(lease)?;
            }
            held = self
                .released
                .wait_timeout(held, Duration::from_millis(10))
                .unwrap()
                .0;
        }
        drop(held);
        // The reply that finally gets through: the store's answer now.
        inner.keep_alive(lease)
    }
}

const STARVED: NodeId = 50;

/// A one-node cluster joined by node [`STARVED`], whose metadata store is a [`HeldMeta`]; it waits (up to
/// `lease_wait`) for late renewals.
fn start(
    lease_wait: Duration,
) -> anyhow::Result<(LocalCluster, ClusterNode, Arc<HeldMeta>, Client)> {
    start_with(small_cluster(1), lease_wait)
}

/// [`start`] with the cluster `cfg`.
fn start_with(
    cfg: LocalClusterConfig,
    lease_wait: Duration,
) -> anyhow::Result<(LocalCluster, ClusterNode, Arc<HeldMeta>, Client)> {
    let (c, node, meta, client, _) = start_with_hooks(cfg, lease_wait)?;
    Ok((c, node, meta, client))
}

/// What [`start_with_hooks`] starts: [`start`]'s, and the fault hooks of the starved node's round trips.
type WithHooks = (
    LocalCluster,
    ClusterNode,
    Arc<HeldMeta>,
    Client,
    Arc<FaultHooks>,
);

/// [`start_with`], with fault hooks on every round trip the starved node makes to the memory node.
fn start_with_hooks(cfg: LocalClusterConfig, lease_wait: Duration) -> anyhow::Result<WithHooks> {
    let c = LocalCluster::start(cfg.clone())?;
    let mut connector = c.memory_connector();
    let hooks = connector.share_fault_hooks();
    let meta = Arc::new(HookedMeta {
        inner: c.meta_store(),
        hooks: Held {
            held: Mutex::new(false),
            released: Condvar::new(),
            renew_while_held: AtomicBool::new(true),
        },
    });
    let node = ClusterNode::start(
        NodeConfig {
            node_id: STARVED,
            lease_wait,
            ..cfg.node.clone()
        },
        connector,
        meta.clone(),
    )?;
    // The M-node adds the new member; wait until it serves under a table that has it.
    let start = Instant::now();
    while !node.routing().ring.contains(STARVED) {
        anyhow::ensure!(start.elapsed() < PATIENCE, "node {STARVED} never joined");
        std::thread::sleep(Duration::from_millis(5));
    }
    let client = Client::connect(ClientConfig {
        seeds: vec![c.rn_addr().to_string()],
        // Requests may wait at the starved node for as long as the test holds its heartbeat.
        op_timeout: PATIENCE,
        ..ClientConfig::default()
    })?;
    Ok((c, node, meta, client, hooks))
}

/// A key the starved node owns.
fn owned_key(node: &ClusterNode) -> Vec<u8> {
    let ring = node.routing().ring;
    (0..)
        .map(|i| format!("key-{i}").into_bytes())
        .find(|k| ring.primary(k) == Some(STARVED))
        .expect("the node owns some key")
}

fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "{what} did not happen");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn requests_that_meet_a_lapsed_lease_are_served_after_the_late_renewal() -> anyhow::Result<()> {
    // A wait far beyond the test: only the renewal can end it.
    let (c, node, meta, mut client) = start(Duration::from_secs(60))?;
    let key = owned_key(&node);
    client.set(&key, b"before")?;
    let epoch = node.routing().epoch();

    // The heartbeat's replies stop getting through; the store is still renewed, so nobody fails the node.
    meta.hold(true);
    until("the lease lapsing at the node", || !node.is_serving());
    let (k, waits) = (key.clone(), node.lease_waits());
    let write = std::thread::spawn(move || -> anyhow::Result<Option<Vec<u8>>> {
        client.set(&k, b"after")?;
        Ok(client.get(&k)?)
    });
    until("the write waiting for the lease", || {
        node.lease_waits() > waits
    });
    assert!(!write.is_finished(), "answered while the lease had lapsed");
    meta.release();

    assert_eq!(
        write.join().expect("client thread")?,
        Some(b"after".to_vec())
    );
    assert!(node.is_serving());
    // Served by the same node under the same table: no failover happened.
    assert_eq!(node.routing().epoch(), epoch);
    assert!(
        node.worker_stats()?
            .iter()
            .map(|t| t.lease_waits_served)
            .sum::<u64>()
            >= 1
    );
    node.stop();
    c.stop();
    Ok(())
}

#[test]
fn a_node_whose_lease_expired_never_serves_and_the_client_finds_the_new_owner() -> anyhow::Result<()>
{
    let (c, node, meta, mut client) = start(Duration::from_secs(60))?;
    let key = owned_key(&node);
    client.set(&key, b"before")?;

    // The node is silent long enough for the store's lease to run out: the M-node hands its keys over.
    meta.hold(false);
    until("the lease lapsing at the node", || !node.is_serving());
    let k = key.clone();
    let write = std::thread::spawn(move || -> anyhow::Result<Option<Vec<u8>>> {
        client.set(&k, b"after")?;
        Ok(client.get(&k)?)
    });
    until("the failover", || {
        c.nodes()[0].routing().ring.primary(&key) != Some(STARVED)
    });
    // The late reply says the lease expired: the node is fenced, and what waited there is refused (not applied),
    // so the client retries at the new owner.
    meta.release();
    until("the node being fenced", || {
        node.worker_stats()
            .is_ok_and(|s| s.iter().map(|t| t.lease_refusals).sum::<u64>() >= 1)
    });
    assert_eq!(
        write.join().expect("client thread")?,
        Some(b"after".to_vec())
    );
    assert!(!node.is_serving());
    node.crash();
    c.stop();
    Ok(())
}

#[test]
fn an_install_refused_while_the_lease_lapsed_is_asked_again_until_the_late_renewal()
-> anyhow::Result<()> {
    // No waiting at the node: whatever finds the lease lapsed, an install included, is refused at once.
    let (c, node, meta, mut client) = start(Duration::ZERO)?;
    let key = owned_key(&node);
    client.set(&key, b"v")?;

    meta.hold(true);
    until("the lease lapsing at the node", || !node.is_serving());
    let release = {
        let meta = meta.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let released_at = Instant::now();
            meta.release();
            released_at
        })
    };
    // Sharing the key installs first at its owner, the starved node: refused until the renewal gets through, then
    // done, within the M-node's install timeout.
    c.mnode().set_replication(&key, 2)?;
    let done_at = Instant::now();
    let released_at = release.join().expect("release thread");
    assert!(
        done_at >= released_at,
        "the install was done while the node's lease had lapsed"
    );
    assert!(node.is_serving());
    assert!(node.routing().cells.contains_key(&key));
    assert_eq!(client.get(&key)?, Some(b"v".to_vec()));
    node.stop();
    c.stop();
    Ok(())
}

#[test]
fn an_install_refused_by_a_node_whose_lease_then_expires_fails_without_waiting_out_the_install_timeout()
-> anyhow::Result<()> {
    let mut cfg = small_cluster(1);
    // Far beyond the test: only the node's death may end the asking.
    cfg.mnode.install_timeout = Duration::from_secs(120);
    let (c, node, meta, mut client) = start_with(cfg, Duration::ZERO)?;
    let key = owned_key(&node);
    client.set(&key, b"v")?;

    // The node's lease lapses while the store's is renewed: the node stays a live member (the key's owner) and
    // refuses the install for now, so the M-node asks it again.
    meta.hold(true);
    until("the lease lapsing at the node", || !node.is_serving());
    let refusals = || {
        node.worker_stats()
            .map_or(0, |s| s.iter().map(|t| t.lease_refusals).sum::<u64>())
    };
    let refused_before = refusals();
    let asked = Instant::now();
    let shared = std::thread::scope(|s| {
        let sharing = s.spawn(|| c.mnode().set_replication(&key, 2));
        until("the install refused at the node", || {
            refusals() > refused_before
        });
        // Silent for good: the store's lease runs out too, and the node is gone as far as the cluster knows.
        meta.stop_renewing();
        sharing.join().expect("sharing thread")
    });
    assert!(
        asked.elapsed() < PATIENCE,
        "the M-node kept asking a dead node for {:?}",
        asked.elapsed()
    );
    let e = shared.expect_err("a node whose lease expired installed a table");
    assert!(e.to_string().contains("node 50"), "{e}");
    // Failure handling goes on: the key gets a new owner, which serves it.
    until("the failover", || {
        c.nodes()[0].routing().ring.primary(&key) != Some(STARVED)
    });
    assert_eq!(client.get(&key)?, Some(b"v".to_vec()));
    meta.release();
    node.crash();
    c.stop();
    Ok(())
}

/// Whether `needle` occurs anywhere in the memory node's pool.
fn pool_holds(c: &LocalCluster, needle: &[u8]) -> anyhow::Result<bool> {
    let Target::InProcess(memory) = &c.memory_connector().target else {
        anyhow::bail!("a local cluster's memory node is in this process");
    };
    let pool = memory.pool();
    let mut image = vec![0u8; pool.len() as usize];
    pool.read(0, &mut image)?;
    let mut at = 0;
    while let Some(i) = image[at..].iter().position(|&b| b == needle[0]) {
        let start = at + i;
        if image[start..].starts_with(needle) {
            return Ok(true);
        }
        at = start + 1;
    }
    Ok(false)
}

/// A write that passed the node's lease check and then took longer than the lease on its way to the memory node
/// arrives after the cluster took the node over. The take-over revoked the node at the memory node, so the write
/// lands nowhere (not past the seal of the log the take-over merged, nor in that segment once it is reused), and
/// the node, finding itself revoked, stops serving before its lease's late verdict reaches it.
#[test]
fn a_write_that_reaches_the_memory_node_after_the_take_over_lands_nowhere() -> anyhow::Result<()> {
    let mut cfg = small_cluster(1);
    // Small enough to search whole for the late write's bytes.
    cfg.pool_size = 64 << 20;
    let (c, node, meta, mut client, hooks) = start_with_hooks(cfg, Duration::ZERO)?;
    let key = owned_key(&node);
    client.set(&key, b"before")?;
    let starved = node.submitter().handle();
    const LATE: &[u8] = b"late-write-that-must-land-nowhere";

    // The write passes the lease check and is held on its way out.
    hooks.pause();
    let late_write = {
        let (starved, key) = (starved.clone(), key.clone());
        std::thread::spawn(move || starved.set(&key, LATE))
    };
    until("the write being on its way", || hooks.waiting() > 0);
    // Meanwhile the node falls silent: the store's lease runs out and the cluster takes the node over.
    meta.hold(false);
    until("the failover", || {
        c.nodes()[0].routing().ring.primary(&key) != Some(STARVED)
    });
    hooks.resume();
    let answer = late_write.join().expect("writer thread");
    match &answer {
        Err(e @ KnError::Fabric(_)) if e.to_string().contains("revoked") => {}
        other => panic!("the late write was not refused by the memory node: {other:?}"),
    }
    assert!(!pool_holds(&c, LATE)?, "the late write landed in the pool");
    // The refusal told the node it was revoked: with its heartbeat still held, it is fenced for good.
    assert!(node.is_fenced());
    assert!(matches!(starved.get(&key), Err(KnError::LeaseLapsed)));
    // The new owner serves the last acknowledged value.
    assert_eq!(client.get(&key)?, Some(b"before".to_vec()));
    meta.release();
    node.crash();
    c.stop();
    Ok(())
}
